"""Round trips through shardwise.to_zarr: whatever xarray can put in a Dataset comes back
``identical`` through ``xr.open_zarr`` (and the ``shardwise`` engine), and equal to what
xarray's own ``to_zarr`` writes with the same layout. Appends and region writes at random
places give what one write of the whole would.
"""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import xarray.testing.strategies as xrst
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import MemoryStore

import shardwise

# -- strategies ------------------------------------------------------------------------------------

DIMS = ("t", "y", "x")

simple_attrs = st.dictionaries(
    st.sampled_from(["units", "long_name", "n", "scale", "flag_values"]),
    st.integers(-1000, 1000) | st.text(max_size=6) | st.floats(allow_nan=False, width=32),
    max_size=2,
)


@st.composite
def datasets(draw: st.DrawFn) -> xr.Dataset:
    """1-3 variables of xarray's supported dtypes over up to three small dimensions, some with
    an index coordinate."""
    sizes = draw(
        xrst.dimension_sizes(dim_names=st.sampled_from(DIMS), min_dims=1, max_dims=3, max_side=7)
    )
    data_vars = {}
    for i in range(draw(st.integers(1, 3))):
        dims = draw(xrst.unique_subset_of(sizes, min_size=0))
        data_vars[f"v{i}"] = draw(
            xrst.variables(dims=st.just(dims), dtype=xrst.supported_dtypes(), attrs=simple_attrs)
        )
    coords = {
        d: (d, np.arange(n) * 1.5 + draw(st.integers(-5, 5)))
        for d, n in sizes.items()
        if draw(st.booleans())
    }
    return xr.Dataset(data_vars, coords=coords, attrs=draw(simple_attrs))


def chunkings(ds: xr.Dataset) -> st.SearchStrategy[dict[str, int]]:
    return st.fixed_dictionaries({d: st.integers(1, max(1, n)) for d, n in ds.sizes.items()})


def shard_choices(ds: xr.Dataset) -> st.SearchStrategy[dict[str, int] | None]:
    per_dim = st.fixed_dictionaries(
        {}, optional={d: st.integers(1, max(1, n) + 2) for d, n in ds.sizes.items()}
    )
    return st.none() | per_dim


# -- helpers ---------------------------------------------------------------------------------------


def docs(store: MemoryStore) -> dict[str, Any]:
    """Every zarr.json of a memory store, parsed."""

    async def go() -> dict[str, Any]:
        out = {}
        async for k in store.list_prefix(""):
            if k.endswith("zarr.json"):
                buf = await store.get(k, default_buffer_prototype())
                assert buf is not None
                out[k] = json.loads(buf.to_bytes())
        return out

    return sync(go())


def layout_encoding(store: Any, ds: xr.Dataset) -> dict[str, dict[str, Any]]:
    """Each variable's own encoding plus the inner chunks, shards and compressors it has in
    ``store``: the ``encoding=`` that makes xarray's ``to_zarr`` write the same layout and codecs
    (shardwise's default compressors carry zstd's checksum; xarray's do not)."""
    g = zarr.open_group(store, mode="r")
    out = {}
    for name, var in ds.variables.items():
        arr = g[name]
        if arr.ndim and arr.shards is not None:
            out[name] = {
                **var.encoding,
                "chunks": arr.chunks,
                "shards": arr.shards,
                "compressors": arr.compressors,
            }
    return out


def quiet_open(store: Any, **kwargs: Any) -> xr.Dataset:
    return xr.open_zarr(store, **kwargs).load()


# -- anything xarray can hold ----------------------------------------------------------------------


# xarray's own to_zarr writes consolidated metadata (its default), and zarr warns about it
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
@settings(max_examples=30)
@given(data=st.data(), ds=datasets())
def test_roundtrip_identical_and_equal_to_xarray(data: st.DataObject, ds: xr.Dataset) -> None:
    chunks = data.draw(chunkings(ds), label="dask chunks")
    shards = data.draw(shard_choices(ds), label="shards")
    source = ds.chunk(chunks) if data.draw(st.booleans(), label="dask") else ds
    ours = MemoryStore()
    shard_bytes = data.draw(st.sampled_from([64, 2**20]), label="shard_bytes")
    shardwise.to_zarr(source, ours, shards=shards, shard_bytes=shard_bytes)
    got = quiet_open(ours)
    xr.testing.assert_identical(got, ds)

    theirs = MemoryStore()
    ds.to_zarr(theirs, zarr_format=3, encoding=layout_encoding(ours, ds))
    assert docs(ours) == docs(theirs)
    xr.testing.assert_identical(got, quiet_open(theirs))


# -- CF encoding -----------------------------------------------------------------------------------


def cf_dataset() -> xr.Dataset:
    rng = np.random.default_rng(0)
    times = pd.date_range("1999-12-30", periods=9, freq="7h").values.copy()
    times[3] = np.datetime64("NaT", "ns")
    deltas = pd.to_timedelta(np.arange(9) * 90, "min").values.copy()
    deltas[5] = np.timedelta64("NaT", "ns")
    floats = rng.normal(size=(9, 4))
    floats[2, 1] = np.nan
    ds = xr.Dataset(
        {
            "when": ("t", times),
            "dt": ("t", deltas),
            "nan_filled": (("t", "x"), floats, {"units": "m"}),
            "masked_int": ("t", np.where(np.arange(9) == 4, np.nan, np.arange(9.0)).astype("f4")),
            "flag": (("t", "x"), rng.random((9, 4)) > 0.5),
            "label": ("x", np.array(["ab", "", "ccc", "d"])),
            "words": ("x", np.array(["é", "two", "", "four"], dtype=object)),
            "packed": (("t", "x"), np.round(rng.random((9, 4)), 2)),
        },
        coords={"t": pd.date_range("2020-01-01", periods=9), "x": [10, 20, 30, 40]},
        attrs={"history": "made for a test", "version": 3},
    )
    ds["when"].encoding = {
        "units": "hours since 1999-01-01",
        "calendar": "proleptic_gregorian",
        "dtype": "int64",
    }
    ds["dt"].encoding = {"units": "minutes", "dtype": "int32", "_FillValue": np.int32(-1)}
    ds["packed"].encoding = {
        "dtype": "int16",
        "scale_factor": 0.01,
        "add_offset": 1.0,
        "_FillValue": -32768,
    }
    ds["nan_filled"].encoding = {"_FillValue": -9999.0}
    ds["masked_int"].encoding = {"dtype": "int16", "_FillValue": np.int16(-99)}
    return ds


# xarray's own to_zarr writes consolidated metadata (its default), and zarr warns about it
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
@pytest.mark.parametrize("dask", [False, True], ids=["numpy", "dask"])
def test_cf_encoding_exactly_as_xarray(tmp_path: Path, dask: bool) -> None:
    ds = cf_dataset()
    source = ds.chunk({"t": 4, "x": 3}) if dask else ds
    with warnings.catch_warnings():
        # xarray loads dask object (string) arrays to find their type, and says so
        warnings.filterwarnings("ignore", "variable .* dask array with dtype=object")
        shardwise.to_zarr(source, tmp_path / "ours", shards={"t": 4})
        enc = layout_encoding(tmp_path / "ours", ds)
        ds.to_zarr(tmp_path / "theirs", zarr_format=3, encoding=enc)
    got = quiet_open(tmp_path / "ours")
    xr.testing.assert_identical(got, quiet_open(tmp_path / "theirs"))
    # the packed variable is quantised to 0.01; everything else comes back exactly
    exact = ["packed", "words"]
    xr.testing.assert_identical(got.drop_vars(exact), ds.drop_vars(exact))
    np.testing.assert_allclose(got.packed.values, ds.packed.values, atol=0.005)
    assert list(got.words.values) == list(ds.words.values)
    for name in ("when", "dt", "packed", "nan_filled", "masked_int"):
        assert {k: v for k, v in got[name].encoding.items() if k in ds[name].encoding} == {
            k: v for k, v in ds[name].encoding.items() if k != "calendar"
        } | ({"calendar": "proleptic_gregorian"} if name == "when" else {})
    for name in ds.variables:
        a = json.loads((tmp_path / "ours" / name / "zarr.json").read_text())
        b = json.loads((tmp_path / "theirs" / name / "zarr.json").read_text())
        assert a == b, name


# -- appends and region writes at random places ----------------------------------------------------


def series(nt: int, ny: int, seed: int) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(nt, ny)).astype("float32")
    v[rng.random((nt, ny)) < 0.2] = np.nan
    ds = xr.Dataset(
        {
            "v": (("t", "y"), v),
            "k": (("t",), rng.integers(-5, 5, nt).astype("int8")),
            "s": (("y",), np.array([f"s{i}" for i in range(ny)])),
        },
        coords={"t": pd.date_range("2001-01-01", periods=nt, freq="h")},
    )
    # fixed units: a first write of one step would otherwise pick days, too coarse to append hours
    ds["t"].encoding = {"units": "hours since 2001-01-01", "dtype": "int64"}
    return ds


@settings(max_examples=25)
@given(
    nt=st.integers(2, 24),
    ny=st.integers(1, 5),
    shard=st.integers(1, 9),
    per_shard=st.integers(1, 3),
    cuts=st.lists(st.floats(0, 1), min_size=1, max_size=4),
    dask_t=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_appends_at_random_places_equal_one_write(
    nt: int, ny: int, shard: int, per_shard: int, cuts: list[float], dask_t: int, seed: int
) -> None:
    whole = series(nt, ny, seed)
    inner = max(1, shard // per_shard)
    shard_len = inner * per_shard
    edges = sorted({0, nt, *(int(c * nt) for c in cuts)})
    store = MemoryStore()
    enc = {"v": {"chunks": (inner, ny), "shards": (shard_len, ny)}}
    shardwise.to_zarr(
        whole.isel(t=slice(edges[0], edges[1])), store, encoding=enc, shards={"t": shard_len}
    )
    for lo, hi in itertools.pairwise(edges[1:]):
        part = whole.isel(t=slice(lo, hi)).chunk({"t": dask_t})
        shardwise.to_zarr(part, store, append_dim="t")
    xr.testing.assert_identical(quiet_open(store), whole)


@settings(max_examples=25)
@given(
    data=st.data(),
    nt=st.integers(1, 20),
    ny=st.integers(1, 6),
    shard_t=st.integers(1, 8),
    shard_y=st.integers(1, 4),
)
def test_region_writes_through_shards_equal_numpy_assignment(
    data: st.DataObject, nt: int, ny: int, shard_t: int, shard_y: int
) -> None:
    base = series(nt, ny, 1)
    store = MemoryStore()
    shardwise.to_zarr(base, store, encoding={"v": {"chunks": (1, 1), "shards": (shard_t, shard_y)}})
    want = base.v.values.copy()
    for _ in range(data.draw(st.integers(1, 3), label="writes")):
        t0 = data.draw(st.integers(0, nt - 1))
        t1 = data.draw(st.integers(t0 + 1, nt))
        y0 = data.draw(st.integers(0, ny - 1))
        y1 = data.draw(st.integers(y0 + 1, ny))
        values = np.full((t1 - t0, y1 - y0), float(data.draw(st.integers(-9, 9))), "float32")
        values[0, 0] = np.nan
        part = xr.Dataset({"v": (("t", "y"), values)}).chunk({"t": data.draw(st.integers(1, 5))})
        shardwise.to_zarr(
            part, store, region={"t": slice(t0, t1), "y": slice(y0, y1)}, safe_shards=False
        )
        want[t0:t1, y0:y1] = values
    got = quiet_open(store)
    np.testing.assert_array_equal(got.v.values, want)
    xr.testing.assert_identical(got.drop_vars("v"), base.drop_vars("v"))


# -- open, change, write back (no alignment errors, no flags) --------------------------------------


# xarray's own to_zarr writes consolidated metadata (its default), and zarr warns about it
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
@pytest.mark.parametrize("engine", ["shardwise", "zarr"])
def test_open_change_and_write_back(tmp_path: Path, engine: str) -> None:
    src = tmp_path / "src.zarr"
    ds = series(40, 6, 7)
    # a sharded store written by xarray; reopened, its dask chunks need not line up with shards
    ds.to_zarr(src, zarr_format=3, encoding={"v": {"chunks": (2, 3), "shards": (8, 6)}})
    opened = xr.open_dataset(src, engine=engine, chunks={})
    if engine == "zarr":
        assert opened.v.chunks == ((2,) * 20, (3, 3))  # inner-chunk sized: unaligned to shards
    else:
        assert opened.v.chunks == ((8,) * 5, (6,))
    changed = opened.isel(t=slice(3, 37), y=slice(1, None))
    # copy(data=...) keeps the encoding read from the store (arithmetic would drop it)
    changed = changed.assign(
        v=changed.v.copy(data=changed.v.data * 2 + 1), w=changed.v.rolling(t=3).mean()
    )
    dst = tmp_path / "dst.zarr"
    shardwise.to_zarr(changed, dst)  # carried encoding: same shards and inner chunks
    expected = changed.load()
    xr.testing.assert_identical(quiet_open(dst), expected)
    reopened = xr.open_dataset(dst, engine=engine, chunks={})
    assert reopened.v.encoding["shards"] == (8, 6) and reopened.v.encoding["chunks"] == (2, 3)
    assert reopened.w.encoding["shards"] == (34, 5)  # new variable: default layout

    # write back into the store it came from (a pointwise change: each shard task reads only
    # the shard it rewrites), then append
    back = xr.open_dataset(src, engine=engine, chunks={})
    back["v"] = back.v * 3
    shardwise.to_zarr(back[["v"]], src, mode="a")
    more = series(45, 6, 7).isel(t=slice(40, 45))
    shardwise.to_zarr(more, src, append_dim="t")
    final = xr.open_dataset(src, engine=engine, chunks={}).load()
    want = xr.concat([ds.assign(v=ds.v * 3), more], "t", data_vars="minimal")
    xr.testing.assert_identical(final, want)
