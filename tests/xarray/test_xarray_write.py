"""shardwise.to_zarr: layout choices, appends and region writes through shards, refusals that
leave the store untouched, compute=False, DataArrays, groups, the dry-run overlay.

Oracles: xarray's own ``to_zarr``/``open_zarr`` (metadata and decoded values), zarr-python and
tensorstore (raw array values).
"""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from dask.delayed import Delayed
from hypothesis import given
from hypothesis import strategies as st
from zarr.storage import LocalStore, MemoryStore

import shardwise
from faultkit import snapshot
from shardwise.codec.metadata import default_compressors
from shardwise.codec.shard import MISSING, index_slice, parse_index
from shardwise.core.sizing import default_chunks, default_shards, dividing_chunks
from shardwise.errors import InvalidValueError, PlanError
from shardwise.storage.nodes import open_info
from shardwise.storage.overlay import Overlay

# -- helpers ---------------------------------------------------------------------------------------


def metadata_docs(root: Path) -> dict[str, Any]:
    return {
        str(p.relative_to(root)): json.loads(p.read_text()) for p in sorted(root.rglob("zarr.json"))
    }


def sample(nt: int = 20, nx: int = 6, start: str = "2000-01-01") -> xr.Dataset:
    rng = np.random.default_rng(nt * 100 + nx)
    temp = rng.normal(size=(nt, nx)).astype("float32")
    temp[min(1, nt - 1), min(2, nx - 1)] = np.nan
    return xr.Dataset(
        {
            "temp": (("time", "x"), temp, {"units": "K"}),
            "count": (("time",), np.arange(nt, dtype="int32")),
            "flag": (("time",), np.arange(nt) % 3 == 0),
        },
        coords={"time": pd.date_range(start, periods=nt, freq="D"), "x": np.arange(nx) * 0.5},
        attrs={"title": "sample"},
    )


def chunk_bytes_of(path: Path, var: str, shard_key: str) -> dict[int, bytes]:
    """Encoded bytes of every stored inner chunk of one shard, by C-order position."""
    info = open_info(LocalStore(path), var)
    data = (path / var / shard_key).read_bytes()
    codec = info.codec
    index = parse_index(codec, data[index_slice(codec, len(data))], len(data), shard_key)
    return {i: data[int(o) : int(o) + int(n)] for i, (o, n) in enumerate(index) if o != MISSING}


# -- layout ----------------------------------------------------------------------------------------


@given(
    shape=st.lists(st.integers(0, 3000), min_size=1, max_size=4).map(tuple),
    itemsize=st.sampled_from([1, 2, 4, 8, 16]),
    target=st.integers(1, 2**22),
)
def test_default_shapes_fit_their_targets(
    shape: tuple[int, ...], itemsize: int, target: int
) -> None:
    chunks = default_chunks(shape, itemsize, target)
    assert all(c >= 1 for c in chunks)
    assert np.prod(chunks) * itemsize <= target or all(c == 1 for c in chunks)
    shards = default_shards(shape, chunks, itemsize, 64 * target)
    assert all(s % c == 0 for s, c in zip(shards, chunks, strict=True))
    # a shard never reaches more than one inner chunk beyond the array
    assert all(s < max(n, 1) + c for s, c, n in zip(shards, chunks, shape, strict=True))
    assert np.prod(shards) * itemsize <= 64 * target or shards == chunks
    inner = dividing_chunks(shards, itemsize, target)
    assert all(s % c == 0 for s, c in zip(shards, inner, strict=True))


def test_layout_rules_in_order(tmp_path: Path) -> None:
    ds = sample(40, 6)
    ds["temp"].encoding = {"chunks": (4, 3), "shards": (8, 6)}  # carried over, e.g. from a store
    shardwise.to_zarr(
        ds,
        tmp_path / "a.zarr",
        shards={"time": 10},
        encoding={"count": {"chunks": (5,), "shards": (20,)}},
    )
    meta = metadata_docs(tmp_path / "a.zarr")

    def layout(var: str) -> tuple[list[int], list[int]]:
        m = meta[f"{var}/zarr.json"]
        shard = m["chunk_grid"]["configuration"]["chunk_shape"]
        codec = m["codecs"][0]
        assert codec["name"] == "sharding_indexed"
        return codec["configuration"]["chunk_shape"], shard

    assert layout("count") == ([5], [20])  # explicit encoding wins
    assert layout("temp") == ([10, 6], [10, 6])  # shards= by name; kept chunks do not divide
    assert layout("flag") == ([10], [10])  # shards= by name; dims not named are whole
    assert layout("x") == ([6], [6])

    shardwise.to_zarr(ds, tmp_path / "b.zarr")  # no shards=: carried encoding, then defaults
    meta = metadata_docs(tmp_path / "b.zarr")
    assert layout("temp") == ([4, 3], [8, 6])
    assert layout("count") == ([40], [40])


def test_default_shard_size_splits_large_variables(tmp_path: Path) -> None:
    ds = xr.Dataset({"v": (("t", "y"), np.ones((400, 300), dtype="float64"))})
    rep = shardwise.to_zarr(ds, tmp_path / "a.zarr", shard_bytes=200_000)
    info = open_info(LocalStore(tmp_path / "a.zarr"), "v")
    lay = info.layout
    assert np.prod(lay.shard_shape) * 8 <= 200_000
    assert np.prod(lay.chunk_shape) * 8 <= shardwise.xarray.writer.DEFAULT_CHUNK_BYTES
    assert rep.shards_written == lay.nshards > 1


def test_explicit_chunks_that_do_not_divide_shards_are_refused(tmp_path: Path) -> None:
    with pytest.raises(
        InvalidValueError, match=r"inner chunks \(3,\) must divide the shard shape \(8,\)"
    ):
        shardwise.to_zarr(
            sample(), tmp_path / "a.zarr", encoding={"count": {"chunks": (3,), "shards": (8,)}}
        )
    assert not (tmp_path / "a.zarr").exists()


def _with_encoding(**enc: Any) -> xr.Dataset:
    ds = sample(10, 4)
    ds["temp"].encoding = enc
    return ds


@pytest.mark.parametrize(
    ("ds", "kwargs", "error", "message"),
    [
        (xr.Dataset({0: ("x", [1])}), {}, TypeError, "string or None"),
        (xr.Dataset({"": ("x", [1])}), {}, ValueError, "length 1 or greater"),
        (sample(), {"encoding": {"temp": "foo"}}, ValueError, "castable to a dictionary"),
        (sample(), {"encoding": {"nothere": {}}}, KeyError, "nothere"),
        (sample(), {"encoding": {"temp": {"foo": 1}}}, ValueError, "unexpected encoding"),
        (_with_encoding(chunks=(5, 4.5)), {}, TypeError, "tuple of ints"),
        (
            _with_encoding(chunks=(2, 2), shards=(5, 4)),
            {},
            InvalidValueError,
            r"\(2, 2\) must divide",
        ),
    ],
    ids=[
        "int-name",
        "empty-name",
        "not-a-dict",
        "unknown-variable",
        "unknown-key",
        "float-chunks",
        "chunks-split-shards",
    ],
)
def test_encoding_and_name_errors_as_xarray(
    tmp_path: Path, ds: xr.Dataset, kwargs: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        shardwise.to_zarr(ds, tmp_path / "a.zarr", **kwargs)
    assert not (tmp_path / "a.zarr").exists()


def test_kept_encodings_that_no_longer_fit(tmp_path: Path) -> None:
    path = tmp_path / "src.zarr"
    ds = sample(12, 6)
    shardwise.to_zarr(ds, path, encoding={"temp": {"chunks": (2, 3), "shards": (4, 6)}})
    # chunks changed after reading: the stored shards are replaced by shards around them
    opened = xr.open_dataset(
        path,
        engine="shardwise",
        chunks={"time": 12, "x": 6},
        backend_kwargs={"overwrite_encoded_chunks": True},
    )
    assert opened.temp.encoding["chunks"] == (12, 6) and opened.temp.encoding["shards"] == (4, 6)
    shardwise.to_zarr(opened, tmp_path / "a.zarr")
    info = open_info(LocalStore(tmp_path / "a.zarr"), "temp")
    assert info.layout.chunk_shape == (12, 6) and info.layout.shard_shape == (12, 6)
    # a coordinate that became 0-d drops its chunks and shards
    shardwise.to_zarr(opened.isel(time=0), tmp_path / "b.zarr")
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "b.zarr").load(), ds.isel(time=0))


def test_variable_named_none_as_xarray(tmp_path: Path) -> None:
    ds = xr.Dataset({None: (("x", "y"), [[0, 1], [2, 3]])})
    shardwise.to_zarr(ds, tmp_path / "a.zarr")
    assert (tmp_path / "a.zarr" / "__values__" / "zarr.json").exists()  # xarray's own name
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "a.zarr").load(), ds)


# -- metadata exactly as xarray writes it ----------------------------------------------------------


# xarray's own to_zarr writes consolidated metadata (its default), and zarr warns about it
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_metadata_is_xarray_metadata_byte_for_byte(tmp_path: Path) -> None:
    ds = sample()
    ds["name"] = ("x", np.array(["a", "bb", "", "dddd", "e", "ff"]))
    ds["dt"] = ("time", pd.to_timedelta(np.arange(20), "h").values)
    ds["packed"] = ("time", np.linspace(0, 1, 20))
    ds["packed"].encoding = {"dtype": "int16", "scale_factor": 0.01, "_FillValue": -1}
    ds["scalar"] = ((), 3.5, {"note": "0-d"})
    enc = {k: {"chunks": (2,) * v.ndim, "shards": (4,) * v.ndim} for k, v in ds.variables.items()}
    del enc["scalar"]
    for group in (None, "g/h"):
        ours, theirs = tmp_path / f"ours{group is None}", tmp_path / f"xr{group is None}"
        shardwise.to_zarr(ds, ours, group=group, encoding=enc)
        # the same codecs: shardwise's default inner chain is zstd with its frame checksum
        same = {k: {**v, "compressors": default_compressors()} for k, v in enc.items()}
        ds.to_zarr(theirs, group=group, zarr_format=3, encoding=same)
        assert (mine := metadata_docs(ours)) == metadata_docs(theirs)
        assert {k.rsplit("/", 1)[0] for k in mine} >= {f"{group}/temp" if group else "temp"}
        docs = zip(sorted(ours.rglob("zarr.json")), sorted(theirs.rglob("zarr.json")), strict=True)
        for a, b in docs:
            assert a.read_bytes() == b.read_bytes(), a
        got = xr.open_zarr(ours, group=group).load()
        xr.testing.assert_identical(got, xr.open_zarr(theirs, group=group).load())
        xr.testing.assert_identical(got.drop_vars("packed"), ds.drop_vars("packed"))


CONSOLIDATED_WARNING = "Consolidated metadata is currently not part"


@pytest.mark.parametrize("consolidated", [None, True, False])
def test_consolidated_as_xarray(tmp_path: Path, consolidated: bool | None) -> None:
    """Consolidated metadata as xarray writes it (by default too), and zarr's warning that v3
    does not specify it only when the call asks for it (consolidated=True)."""
    ds = sample(6, 2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        shardwise.to_zarr(ds, tmp_path / "a", consolidated=consolidated)
    texts = [str(w.message) for w in seen if not issubclass(w.category, ResourceWarning)]
    if consolidated:
        assert texts and all(CONSOLIDATED_WARNING in t for t in texts), texts
    else:
        assert texts == []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", CONSOLIDATED_WARNING, UserWarning)  # xarray's own
        ds.to_zarr(tmp_path / "b", consolidated=consolidated, zarr_format=3)
    root_a = json.loads((tmp_path / "a/zarr.json").read_text())
    root_b = json.loads((tmp_path / "b/zarr.json").read_text())
    assert ("consolidated_metadata" in root_a) == ("consolidated_metadata" in root_b)
    assert ("consolidated_metadata" in root_a) == (consolidated is not False)
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "a", consolidated=consolidated).load(), ds)


# -- dask chunks do not matter ---------------------------------------------------------------------


def test_one_task_per_shard_whatever_the_dask_chunks(tmp_path: Path, read_tensorstore: Any) -> None:
    """The tasks that ran are counted (a dask callback): one shard-write task per shard and
    variable, whatever the dask chunks (temp has 8 dask blocks, its rows cutting its shards)."""
    from collections import Counter

    from dask.callbacks import Callback

    ds = sample(50, 7).chunk({"time": (3, 17, 1, 29), "x": (2, 5)})
    assert ds.temp.data.npartitions == 8
    enc = {"temp": {"chunks": (5, 7), "shards": (10, 7)}}
    ran: list[Any] = []
    with Callback(pretask=lambda key, dsk, state: ran.append(key)):
        rep = shardwise.to_zarr(ds, tmp_path / "a.zarr", encoding=enc)

    # a shard task's key names the write graph (dask may fuse a one-block variable's source and
    # finalize tasks into it, or temp's rechunk into its shard tasks, which keeps the name in the
    # fused key and leaves the original key as an alias of it); the numpy variables' shards run
    # in runs of one shard (engine/runs.py, "shardwise-runs-")
    def graph_of(key: Any) -> str | None:
        name = key[0] if isinstance(key, tuple) else key
        for kind in ("shardwise-write-", "shardwise-runs-"):
            if kind in name and "shardwise-runs-of-" not in name:
                return str(name.split(kind)[1])
        return None

    writes = [k for k in ran if graph_of(k) is not None]
    assert len(set(writes)) == len(writes)  # no task ran twice
    # (the write graph's token, the shard task's index): a fused key and its alias are one
    shards = {(graph_of(k), k[1:] if isinstance(k, tuple) else ()) for k in writes}
    per_variable = Counter(graph for graph, _ in shards)
    # temp: 5 shards; count, flag, time: one shard each (whole); x: one shard
    assert sorted(per_variable.values()) == [1, 1, 1, 1, 5]
    assert rep.shards_written == 5 + 4
    got = read_tensorstore(tmp_path / "a.zarr" / "temp")
    np.testing.assert_array_equal(got, ds.temp.values)
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "a.zarr").load(), ds.load())


def _shards(path: Path) -> dict[str, str]:
    """Digests of the variable's metadata and shards (the journal holds per-write ids)."""
    return {k: v for k, v in snapshot(path / "temp").items() if not k.startswith(".shardwise")}


@pytest.mark.parametrize("strategy", ["direct", "staged"])
def test_staged_and_direct_variables_store_the_same_bytes(tmp_path: Path, strategy: str) -> None:
    ds = sample(50, 7).chunk({"time": (3, 17, 1, 29), "x": (2, 5)})
    enc = {"temp": {"chunks": (5, 7), "shards": (10, 7)}}
    ref = tmp_path / "ref.zarr"
    shardwise.to_zarr(ds.load(), ref, encoding=enc)  # numpy: direct
    path = tmp_path / "a.zarr"
    rep = shardwise.to_zarr(ds, path, encoding=enc, strategy=strategy)
    assert rep.shards_written == 5 + 4
    assert _shards(path) == _shards(ref)
    # and an append that cuts a shard: the staged shard task copies the stored chunks it keeps
    more = sample(56, 7).isel(time=slice(50, None)).chunk({"time": 4})
    shardwise.to_zarr(more, path, append_dim="time", strategy=strategy)
    shardwise.to_zarr(more.load(), ref, append_dim="time")
    assert _shards(path) == _shards(ref)
    assert not (path / "temp" / ".shardwise" / "staged").exists()
    xr.testing.assert_identical(xr.open_zarr(path).load(), xr.open_zarr(ref).load())


# -- appends ---------------------------------------------------------------------------------------


def test_append_merges_the_shard_it_cuts_and_keeps_untouched_chunk_bytes(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    whole = sample(30, 4)
    first, rest = whole.isel(time=slice(0, 13)), whole.isel(time=slice(13, None))
    enc = {"temp": {"chunks": (2, 4), "shards": (8, 4)}}
    shardwise.to_zarr(first.chunk({"time": 5}), path, encoding=enc)
    before = chunk_bytes_of(path, "temp", "c/1/0")  # rows 8..12: chunks 0, 1 full, 2 half
    assert sorted(before) == [0, 1, 2]
    rep = shardwise.to_zarr(rest.chunk({"time": 7}), path, append_dim="time")
    after = chunk_bytes_of(path, "temp", "c/1/0")
    assert after[0] == before[0] and after[1] == before[1]  # kept as encoded bytes
    assert sorted(after) == [0, 1, 2, 3]
    assert "temp/c/1/0" in rep.keys
    xr.testing.assert_identical(xr.open_zarr(path).load(), whole)


def test_many_small_appends_equal_one_write(tmp_path: Path, read_zarr: Any) -> None:
    whole = sample(23, 3)
    path = tmp_path / "a.zarr"
    shardwise.to_zarr(whole.isel(time=slice(0, 1)), path, shards={"time": 4})
    for lo, hi in [(1, 2), (2, 7), (7, 8), (8, 20), (20, 23)]:
        part = whole.isel(time=slice(lo, hi)).chunk({"time": 3})
        shardwise.to_zarr(part, path, append_dim="time")
    xr.testing.assert_identical(xr.open_zarr(path).load(), whole)
    np.testing.assert_array_equal(read_zarr(LocalStore(path), "temp"), whole.temp.values)


# xarray's own to_zarr writes consolidated metadata (its default), and zarr warns about it
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_append_to_a_store_xarray_wrote_without_shards(tmp_path: Path) -> None:
    """Arrays some other writer created unsharded are written through zarr-python, from dask
    blocks cut at chunk boundaries."""
    whole = sample(30, 4)
    path = tmp_path / "a.zarr"
    enc = {"temp": {"chunks": (4, 4)}}
    whole.isel(time=slice(0, 11)).to_zarr(path, zarr_format=3, encoding=enc)
    shardwise.to_zarr(whole.isel(time=slice(11, None)).chunk({"time": 3}), path, append_dim="time")
    xr.testing.assert_identical(xr.open_zarr(path).load(), whole)


# xarray's own to_zarr writes consolidated metadata (its default), and zarr warns about it
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_append_adds_new_variables_with_shards(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    ds = sample(10, 3)
    shardwise.to_zarr(ds, path)
    extra = xr.Dataset({"new": (("time",), np.arange(10.0))}, coords={"time": ds.time})
    shardwise.to_zarr(extra, path, mode="a", shards={"time": 4})
    ds.to_zarr(tmp_path / "xr.zarr", zarr_format=3)
    extra.to_zarr(tmp_path / "xr.zarr", mode="a")
    got = xr.open_zarr(path).load()
    xr.testing.assert_identical(got, xr.open_zarr(tmp_path / "xr.zarr").load())
    # as xarray does, mode='a' replaces the group attributes
    xr.testing.assert_identical(got, ds.merge(extra).drop_attrs(deep=False))
    assert open_info(LocalStore(path), "new").layout.shard_shape == (4,)


def _region_part(ds: xr.Dataset, lo: int, hi: int) -> xr.Dataset:
    return ds.isel(time=slice(lo, hi)).drop_vars(["time", "x", "name"])


APPEND = {"append_dim": "time"}


def test_append_that_fails_part_way_keeps_the_old_length_and_can_be_rerun(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.zarr"
    whole = sample(30, 4)
    shardwise.to_zarr(whole.isel(time=slice(0, 13)), path, shards={"time": 8})
    meta = {k: v for k, v in snapshot(path).items() if k.endswith("zarr.json")}

    def lose_last_block(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        if block_info is not None and block_info[0]["chunk-location"][0] == 3:
            raise RuntimeError("worker lost")
        return block

    rest = whole.isel(time=slice(13, 30)).chunk({"time": 5})
    failing = rest.assign(temp=rest.temp.copy(data=rest.temp.data.map_blocks(lose_last_block)))
    with pytest.raises(RuntimeError, match="worker lost"):
        shardwise.to_zarr(failing, path, append_dim="time")
    assert {k: v for k, v in snapshot(path).items() if k.endswith("zarr.json")} == meta
    xr.testing.assert_identical(xr.open_zarr(path).load(), whole.isel(time=slice(0, 13)))
    shardwise.to_zarr(rest, path, append_dim="time")  # run again: no gap, no duplicate
    xr.testing.assert_identical(xr.open_zarr(path).load(), whole)


REFUSED: list[tuple[str, Any, dict[str, Any], str]] = [
    (
        "dimension the store lacks",
        lambda ds: ds.rename(time="t"),
        {"append_dim": "t"},
        "no such dimension",
    ),
    (
        "append_dim not in the data",
        lambda ds: ds,
        {"append_dim": "y"},
        "not a dimension of the data",
    ),
    ("other sizes differ", lambda ds: ds.isel(x=slice(0, 2)), APPEND, "different dimension sizes"),
    ("bad variable name", lambda ds: ds.rename(count="a/b"), APPEND, "contains '/'"),
    ("reserved name", lambda ds: ds.rename(count="__c"), APPEND, "reserves for internal use"),
    (
        "dtype mismatch",
        lambda ds: ds.assign(name=("x", np.array(["long string"] * 4))),
        APPEND,
        "Mismatched dtypes",
    ),
    (
        "region and append on one dim",
        lambda ds: ds.drop_vars(["x", "name"]),
        {**APPEND, "region": {"time": slice(0, 4)}},
        "both",
    ),
    (
        "misaligned region",
        lambda ds: _region_part(ds, 3, 9),
        {"region": {"time": slice(3, 9)}, "safe_shards": True},
        "nearest shard-aligned region",
    ),
    (
        "new variable in r+",
        lambda ds: _region_part(ds, 0, 8).assign(z=("time", np.ones(8))),
        {"region": {"time": slice(0, 8)}},
        "non-pre-existing",
    ),
    ("mode w- on an existing store", lambda ds: ds, {"mode": "w-"}, "already exists"),
    (
        "task over the memory limit",
        lambda ds: ds,
        {**APPEND, "strategy": "direct", "memory_limit": 64},
        r"variable '\w+': a shard task .* memory_limit is 64 B",
    ),
    (
        "encoding for an existing variable",
        lambda ds: ds,
        {**APPEND, "encoding": {"temp": {"chunks": (1, 1)}}},
        "already exists",
    ),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_writes_leave_the_store_byte_identical(tmp_path: Path, case: Any) -> None:
    _, change, kwargs, message = case
    path = tmp_path / "a.zarr"
    ds = sample(13, 4).assign(name=("x", np.array(["a", "b", "c", "d"])))
    shardwise.to_zarr(ds, path, shards={"time": 8})
    before = snapshot(path)
    with pytest.raises((ValueError, KeyError, FileExistsError), match=message):
        shardwise.to_zarr(change(ds.chunk({"time": 4})), path, **kwargs)
    assert snapshot(path) == before


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda ds: ds.rename(temp="a/b"), "contains '/'"),
        (lambda ds: ds.rename(temp="__temp"), "reserves for internal use"),
        (lambda ds: ds.assign(sq=(("x", "x"), np.zeros((6, 6)))), "duplicate dimension names"),
    ],
    ids=["slash", "reserved", "duplicate-dims"],
)
def test_bad_names_are_refused_before_any_io(tmp_path: Path, make: Any, message: str) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # xarray warns about duplicate dimension names
        ds = make(sample())
    with pytest.raises(InvalidValueError, match=message):
        shardwise.to_zarr(ds, tmp_path / "a.zarr")
    assert not (tmp_path / "a.zarr").exists()


# -- region writes ---------------------------------------------------------------------------------


def test_region_write_refused_when_it_splits_shards_names_nearest_region(tmp_path: Path) -> None:
    """The strict check (opt-in): region edges must fall on shard boundaries."""
    path = tmp_path / "a.zarr"
    ds = sample(40, 6)
    enc = {"temp": {"chunks": (2, 3), "shards": (8, 6)}}
    shardwise.to_zarr(ds, path, encoding=enc, shards={"time": 10})
    part = ds.isel(time=slice(5, 17), x=slice(0, 3)).drop_vars(["time", "x"])
    before = snapshot(path)
    with pytest.raises(PlanError) as err:
        shardwise.to_zarr(
            part, path, region={"time": slice(5, 17), "x": slice(0, 3)}, safe_shards=True
        )
    msg = str(err.value)
    assert "variable 'temp' along 'time': 5:17 splits its shards of 8" in msg
    assert "variable 'count' along 'time': 5:17 splits its shards of 10" in msg
    # aligned for both shard sizes (8 and 10) on time, whole on x
    assert "{'time': slice(0, 40, None), 'x': slice(0, 6, None)}" in msg
    assert "safe_shards=False" in msg
    assert snapshot(path) == before


def test_region_write_through_shards_with_safe_shards_false(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    ds = sample(40, 6)
    shardwise.to_zarr(ds, path, encoding={"temp": {"chunks": (2, 3), "shards": (8, 6)}})
    untouched = chunk_bytes_of(path, "temp", "c/0/0")
    part = (ds.isel(time=slice(5, 17), x=slice(1, 4)) * 2).drop_vars("x")
    part = part.drop_vars("time").chunk({"time": 5})
    rep = shardwise.to_zarr(
        part[["temp"]], path, region={"time": slice(5, 17), "x": slice(1, 4)}, safe_shards=False
    )
    assert rep.keys == ["temp/c/0/0", "temp/c/1/0", "temp/c/2/0"]
    after = chunk_bytes_of(path, "temp", "c/0/0")
    assert all(after[i] == untouched[i] for i in (0, 1, 2, 3))  # rows 0..3 untouched
    want = ds.copy(deep=True)
    want["temp"][5:17, 1:4] = part.temp.values
    xr.testing.assert_identical(xr.open_zarr(path).load(), want)


def test_region_auto_and_independent_aligned_writers(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    full = sample(48, 5)
    template = full.copy()
    template["temp"] = full.temp.chunk({"time": 16}) * np.nan
    shardwise.to_zarr(template, path, shards={"time": 8}, compute=False)  # coords written now
    xr.testing.assert_identical(xr.open_zarr(path).time.load(), full.time)

    errors: list[BaseException] = []

    def write(lo: int, hi: int) -> None:
        try:
            piece = full.isel(time=slice(lo, hi))[["temp"]]
            shardwise.to_zarr(piece.chunk({"time": 3}), path, region="auto")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i, i + 16)) for i in range(0, 48, 16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got = xr.open_zarr(path).load()
    xr.testing.assert_identical(got.temp, full.temp)


def test_region_auto_refuses_unknown_coordinates(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    ds = sample(10, 2)
    shardwise.to_zarr(ds, path)
    before = snapshot(path)
    other = sample(4, 2, start="1990-01-01")
    with pytest.raises(KeyError, match="Not all values"):
        shardwise.to_zarr(other[["temp"]], path, region="auto")
    assert snapshot(path) == before


# -- modes, compute=False, DataArrays, stores ------------------------------------------------------


def test_mode_w_replaces_everything(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    shardwise.to_zarr(sample(40, 6), path, shards={"time": 4})
    small = sample(3, 2)
    shardwise.to_zarr(small, path, mode="w")
    assert sorted(p.name for p in (path / "temp" / "c").iterdir()) == ["0"]
    assert sorted(p.name for p in (path / "temp" / "c" / "0").iterdir()) == ["0"]
    xr.testing.assert_identical(xr.open_zarr(path).load(), small)


def test_compute_false_returns_a_delayed(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    ds = sample(16, 4).chunk({"time": 5})
    ds["count"] = ds["count"].load()  # numpy-backed: written at once, as xarray does
    delayed = shardwise.to_zarr(ds, path, compute=False, shards={"time": 8})
    assert isinstance(delayed, Delayed)
    early = xr.open_zarr(path).load()
    np.testing.assert_array_equal(early["count"].values, ds["count"].values)
    assert np.isnan(early.temp.values).all()  # dask-backed data not written yet
    report = delayed.compute()
    assert report.shards_written == 2 * 4 + 1  # temp, flag, count, time: 2 shards each; x
    xr.testing.assert_identical(xr.open_zarr(path).load(), ds.load())


def test_two_delayed_writes_computed_together(tmp_path: Path) -> None:
    a = sample(9, 2).chunk({"time": 2})
    b = sample(7, 3).chunk({"time": 3})
    da_, db = (shardwise.to_zarr(x, tmp_path / n, compute=False) for x, n in ((a, "a"), (b, "b")))
    ra, rb = dask.compute(da_, db)
    assert ra.shards_written >= 3 and rb.shards_written >= 3
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "a").load(), a.load())
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "b").load(), b.load())


# xarray's own to_zarr writes consolidated metadata (its default), and zarr warns about it
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
@pytest.mark.parametrize("name", [None, "temp", "x"], ids=["unnamed", "named", "named-as-coord"])
def test_dataarray_as_xarray_writes_it(tmp_path: Path, name: str | None) -> None:
    arr = sample(8, 3).temp.rename(name)
    shardwise.to_zarr(arr.chunk({"time": 3}), tmp_path / "a.zarr")
    arr.to_zarr(tmp_path / "b.zarr", zarr_format=3)
    got = xr.open_dataarray(tmp_path / "a.zarr", engine="zarr").load()
    xr.testing.assert_identical(got, arr)
    want = xr.open_dataarray(tmp_path / "b.zarr", engine="zarr").load()
    xr.testing.assert_identical(got, want)


def test_memory_store_and_nested_group() -> None:
    store = MemoryStore()
    ds = sample(12, 3)
    shardwise.to_zarr(ds.chunk({"time": 5}), store, group="a/b", consolidated=False)
    shardwise.to_zarr(ds.isel(time=slice(0, 2)), store, group="c", consolidated=False)
    got = xr.open_zarr(store, group="a/b", consolidated=False).load()
    xr.testing.assert_identical(got, ds)
    assert set(zarr.open_group(store, mode="r").group_keys()) == {"a", "c"}


@pytest.mark.slow
def test_write_on_a_local_cluster_with_worker_processes(tmp_path: Path) -> None:
    from distributed import Client, LocalCluster

    whole = sample(70, 8)
    path = tmp_path / "a.zarr"
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as c,
        Client(c),
    ):
        rep = shardwise.to_zarr(
            whole.isel(time=slice(0, 64)).chunk({"time": 7}), path, shards={"time": 16}
        )
        more = whole.isel(time=slice(64, 70)).chunk({"time": 2})
        shardwise.to_zarr(more, path, append_dim="time")
    assert rep.shards_written == 4 * 4 + 1  # temp, count, flag, time: 4 shards each; x
    xr.testing.assert_identical(xr.open_zarr(path).load(), whole)


def test_region_writes_touch_no_metadata(tmp_path: Path) -> None:
    """Independent region writers share no object: not even zarr.json is rewritten."""
    path = tmp_path / "a.zarr"
    ds = sample(16, 3)
    shardwise.to_zarr(ds, path, shards={"time": 8})
    meta = {k: v for k, v in snapshot(path).items() if k.endswith("zarr.json")}
    rep = shardwise.to_zarr((ds.isel(time=slice(8, 16)) + 1)[["temp"]], path, region="auto")
    assert rep.keys == ["temp/c/1/0"]
    assert {k: v for k, v in snapshot(path).items() if k.endswith("zarr.json")} == meta


@pytest.mark.slow
def test_s3_write_append_and_refusal(tmp_path: Path) -> None:
    """Through moto's S3 server: obstore (a zarr Store) and fsspec (a URL + storage_options)."""
    from faultkit import BUCKET, CREDS, moto_s3

    whole = sample(20, 3)
    with moto_s3() as s3:
        opts = {
            "endpoint_url": s3.endpoint,
            "key": CREDS["key"],
            "secret": CREDS["secret"],
            "client_kwargs": {"region_name": CREDS["region"]},
        }
        url = f"s3://{BUCKET}/xr"
        shardwise.to_zarr(
            whole.isel(time=slice(0, 11)).chunk({"time": 4}),
            url,
            storage_options=opts,
            shards={"time": 8},
        )
        store = s3.obstore("xr")
        shardwise.to_zarr(whole.isel(time=slice(11, 20)), store, append_dim="time")
        before = s3.keys("xr")
        with pytest.raises(InvalidValueError, match="no such dimension"):
            shardwise.to_zarr(whole.rename(time="t"), store, append_dim="t")
        assert s3.keys("xr") == before
        got = xr.open_zarr(url, storage_options=opts).load()
    xr.testing.assert_identical(got, whole)


# -- the dry-run overlay ---------------------------------------------------------------------------


def test_overlay_keeps_writes_until_commit(tmp_path: Path) -> None:
    base = LocalStore(tmp_path / "s")
    zarr.create_array(base, name="old", shape=(4,), dtype="i4", chunks=(2,))[:] = [1, 2, 3, 4]
    before = snapshot(tmp_path / "s")
    over = Overlay(base.with_read_only(True))
    g = zarr.open_group(over, mode="a")
    np.testing.assert_array_equal(g["old"][:], [1, 2, 3, 4])  # reads fall through
    zarr.create_array(over, name="new", shape=(3,), dtype="f8", chunks=(3,), shards=(3,))
    zarr.open_group(over, path="grp", mode="w")
    g["old"].resize((6,))
    assert sorted(zarr.open_group(over, mode="r").array_keys()) == ["new", "old"]
    assert snapshot(tmp_path / "s") == before
    written = over.changes[2]
    assert written == ["grp/zarr.json", "new/zarr.json", "old/zarr.json"]
    over.commit(base)
    g = zarr.open_group(base, mode="r")
    assert sorted(g.array_keys()) == ["new", "old"] and "grp" in g.group_keys()
    assert g["old"].shape == (6,)
    np.testing.assert_array_equal(g["old"][:4], [1, 2, 3, 4])


def test_overlay_delete_dir_hides_and_commits(tmp_path: Path) -> None:
    base = LocalStore(tmp_path / "s")
    zarr.create_array(base, name="a/x", shape=(2,), dtype="i1", chunks=(1,))[:] = [1, 2]
    over = Overlay(base.with_read_only(True))
    zarr.open_group(over, path="a", mode="w")  # deletes a/ and recreates the group
    assert list(zarr.open_group(over, path="a", mode="r").array_keys()) == []
    assert (tmp_path / "s/a/x/c/0").exists()
    over.commit(base)
    assert not (tmp_path / "s/a/x").exists()
    assert (tmp_path / "s/a/zarr.json").exists()


def test_sizing_doctests() -> None:
    import doctest

    import shardwise.core.sizing

    result = doctest.testmod(shardwise.core.sizing)
    assert result.attempted == 10 and result.failed == 0
