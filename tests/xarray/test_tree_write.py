"""``shardwise.to_zarr(tree, ...)`` writes every group of an ``xarray.DataTree`` in one write: one
dask graph (one task per shard across all groups), every group's metadata once after the data,
read back identical by ``engine="zarr"`` and ``engine="shardwise"``; modes, region and append on a
subtree; refusals that leave the store byte-identical; resume after a failure mid-write."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from dask.callbacks import Callback
from dask.delayed import Delayed
from zarr.storage import MemoryStore

import shardwise
from faultkit import settle, snapshot
from shardwise.errors import InvalidValueError, LeaseHeldError

NT, NY, NX, SHARD_T = 24, 10, 6, 4  # 6 shards along time
GROUPS = ["/", "/a", "/a/b", "/c", "/empty"]


def sample_tree(seed: int = 0) -> xr.DataTree:
    """Nested and empty groups, attributes, root coordinates the groups below inherit, strings,
    datetimes, a 0-d (unsharded) variable; /a backed by dask in chunks that split shards."""
    rng = np.random.default_rng(seed)
    time = pd.date_range("2000-01-01", periods=NT, freq="D")
    root = xr.Dataset(
        coords={"time": time, "y": np.arange(NY) * 0.5, "x": np.arange(NX)},
        attrs={"title": "sample", "levels": [1, 2]},
    )
    a = xr.Dataset(
        {
            "u": (("time", "y", "x"), rng.random((NT, NY, NX)).astype("float32"), {"units": "K"}),
            "v": ("time", rng.integers(0, 100, NT).astype("int32")),
        },
        attrs={"source": "a"},
    ).chunk({"time": 3})
    b = xr.Dataset(
        {
            "name": ("x", np.array([f"s{i}" for i in range(NX)])),
            "w": (("y", "x"), np.arange(NY * NX, dtype="int16").reshape(NY, NX) + seed),
        },
        coords={"t": 3},
    )
    c = xr.Dataset({"s": 7, "when": ("time", time + pd.Timedelta(hours=6))})
    return xr.DataTree.from_dict(
        {"/": root, "/a": a, "/a/b": b, "/c": c, "/empty": xr.Dataset(attrs={"note": "empty"})}
    )


ENCODING = {"/a": {"v": {"chunks": (2,), "shards": (8,)}}}  # per variable: v in 8-long shards


def open_tree(path: Any, engine: str) -> xr.DataTree:
    opts = {"consolidated": False} if engine == "zarr" else {}
    return xr.open_datatree(path, engine=engine, **opts).load()


def zarr_arrays(path: Any) -> dict[str, Any]:
    """Every array of the store by its path, as zarr-python opens it."""
    root = zarr.open_group(path, mode="r")
    return {p: a for p, a in root.members(max_depth=None) if isinstance(a, zarr.Array)}


def shard_count(path: Any) -> int:
    """Shards of the sharded arrays, from the metadata zarr-python reads."""
    arrays = zarr_arrays(path).values()
    return sum(
        math.prod(math.ceil(n / s) for n, s in zip(a.shape, a.shards, strict=True))
        for a in arrays
        if a.shards is not None
    )


def test_a_tree_reads_back_identical_with_both_engines(tmp_path: Path) -> None:
    """Every group (the empty one too) gets its zarr.json with its attributes; coordinates are
    written once at the root and read back inherited; shards= by name reaches every group and
    encoding per group and variable sets v's own shards; consolidated metadata of every group
    by default (as DataTree.to_zarr: xr.open_datatree opens it without a warning);
    zarr-python reads every array with the tree's values."""
    path = tmp_path / "t.zarr"
    tree = sample_tree()
    rep = shardwise.to_zarr(tree, path, shards={"time": SHARD_T}, encoding=ENCODING)
    for engine in ("zarr", "shardwise"):
        xr.testing.assert_identical(open_tree(path, engine), tree.load())
    for g in GROUPS:
        assert (path / g.strip("/") / "zarr.json").is_file(), g
    assert zarr.open_group(path / "empty", mode="r").attrs["note"] == "empty"
    assert not (path / "a" / "time").exists()  # inherited, not written again
    meta = zarr.open_group(path, mode="r").metadata.to_dict()["consolidated_metadata"]
    assert {"a", "a/b", "a/u", "c/s", "empty"} <= set(meta["metadata"])
    xr.testing.assert_identical(xr.open_datatree(path, engine="zarr").load(), tree.load())
    arrays = zarr_arrays(path)
    assert arrays["a/u"].shards == (SHARD_T, NY, NX) and arrays["a/v"].shards == (8,)
    assert arrays["c/s"].shards is None  # 0-d: not sharded
    np.testing.assert_array_equal(arrays["a/u"][...], tree["a/u"].values)
    np.testing.assert_array_equal(arrays["a/b/w"][...], tree["a/b/w"].values)
    assert list(arrays["a/b/name"][...]) == list(tree["a/b/name"].values)
    for name, arr in arrays.items():  # every array reads through zarr-python
        assert arr[...].shape == arr.shape, name
    assert rep.shards_written == shard_count(path) > 0
    assert shardwise.verify(path).ok


def test_write_inherited_coords_writes_them_into_every_group(tmp_path: Path) -> None:
    path = tmp_path / "t.zarr"
    tree = sample_tree()
    shardwise.to_zarr(tree, path, write_inherited_coords=True, shards={"time": SHARD_T})
    assert (path / "a" / "time" / "zarr.json").is_file()
    assert (path / "a" / "b" / "y" / "zarr.json").is_file()
    xr.testing.assert_identical(open_tree(path, "shardwise"), tree.load())
    with pytest.raises(InvalidValueError, match="DataTree only"):
        shardwise.to_zarr(tree["a"].to_dataset(), tmp_path / "d.zarr", write_inherited_coords=True)


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_consolidated_true_consolidates_the_whole_tree(tmp_path: Path) -> None:
    path = tmp_path / "t.zarr"
    tree = sample_tree()
    shardwise.to_zarr(tree, path, consolidated=True, shards={"time": SHARD_T})
    meta = zarr.open_group(path, mode="r").metadata.to_dict()["consolidated_metadata"]
    assert {"a", "a/b", "a/u", "c/s", "empty"} <= set(meta["metadata"])
    xr.testing.assert_identical(xr.open_datatree(path, engine="zarr").load(), tree.load())
    shardwise.to_zarr(tree, tmp_path / "n.zarr", consolidated=False, shards={"time": SHARD_T})
    assert (
        "consolidated_metadata"
        not in zarr.open_group(tmp_path / "n.zarr", mode="r").metadata.to_dict()
    )


class Computes(Callback):
    """Counts dask computes: each starts once."""

    def __init__(self) -> None:
        super().__init__()
        self.computes = 0

    def _start(self, dsk: Any) -> None:
        self.computes += 1


def shard_tasks(graph: Any) -> int:
    """Tasks of a graph that write a shard (the engine's layers, one key per shard task)."""
    return sum(len(layer) for n, layer in graph.layers.items() if n.startswith("shardwise-write-"))


def test_one_graph_one_task_per_shard_across_all_groups(tmp_path: Path) -> None:
    """compute=True: one dask compute writes every group. compute=False: one Delayed, whose graph
    holds one task per shard of every dask-backed variable of every group (the indexes, numpy,
    are written by the call, as xarray writes them), and whose one compute writes them."""
    tree = sample_tree().chunk()  # every variable but the indexes backed by dask
    path = tmp_path / "t.zarr"
    with Computes() as seen:
        rep = shardwise.to_zarr(tree, path, shards={"time": SHARD_T}, encoding=ENCODING)
    assert seen.computes == 1
    assert rep.shards_written == shard_count(path) == 25
    lazy = tmp_path / "lazy.zarr"
    out = shardwise.to_zarr(tree, lazy, shards={"time": SHARD_T}, encoding=ENCODING, compute=False)
    assert isinstance(out, Delayed)
    indexes = NT // SHARD_T + 2  # time in 6 shards, y and x in one each
    # u 6, v 3, when 6, name 1, w 1: the variables of /a, /a/b and /c in one graph
    assert shard_tasks(out.dask) == shard_count(path) - indexes == 17
    assert not (lazy / "a" / "u" / "c").exists()  # no shard of a dask-backed variable yet
    with Computes() as seen:
        lazy_rep = out.compute()
    assert seen.computes == 1
    assert lazy_rep.shards_written == shard_count(lazy) == 25
    xr.testing.assert_identical(open_tree(lazy, "shardwise"), tree.load())


def test_modes_w_replaces_and_a_adds_groups(tmp_path: Path) -> None:
    path = tmp_path / "t.zarr"
    old = xr.DataTree.from_dict({"/old": xr.Dataset({"z": ("k", np.arange(5))})})
    shardwise.to_zarr(old, path)
    tree = sample_tree(1)
    shardwise.to_zarr(tree, path, mode="w", shards={"time": SHARD_T})
    assert not (path / "old").exists()
    xr.testing.assert_identical(open_tree(path, "zarr"), tree.load())
    extra = xr.DataTree.from_dict({"/": tree.to_dataset(), "/d/e": xr.Dataset({"k": 1.5})})
    shardwise.to_zarr(extra, path, mode="a")
    back = open_tree(path, "shardwise")
    assert back["d/e/k"].item() == 1.5
    xr.testing.assert_identical(back["a"], tree["a"].load())  # the groups not written stay


def series_tree(seed: int, start: int, stop: int) -> xr.DataTree:
    """A tree whose group /a holds its own time axis (so that a subtree can grow alone), with a
    static group below it."""
    rng = np.random.default_rng(seed)
    ds = xr.Dataset(
        {"u": (("time", "x"), rng.random((NT, NX)).astype("float32"))},
        coords={"time": np.arange(NT)},
    ).isel(time=slice(start, stop))
    static = xr.Dataset({"m": ("x", np.arange(NX, dtype="float64"))}, attrs={"kind": "static"})
    return xr.DataTree.from_dict(
        {"/": xr.Dataset(attrs={"title": "series"}), "/a": ds.chunk({"time": 5}), "/a/s": static}
    )


def test_region_and_append_on_a_subtree(tmp_path: Path) -> None:
    """group="a" writes a subtree into the tree: a region of the time axis (the static group,
    without that dimension, stays as stored), then an append along it."""
    path = tmp_path / "t.zarr"
    shardwise.to_zarr(series_tree(0, 0, 16), path, shards={"time": SHARD_T})
    part = series_tree(1, 4, 12)["a"].copy()  # a subtree: /a and /a/s
    static_before = snapshot(path / "a" / "s")
    shardwise.to_zarr(part, path, group="a", region={"time": slice(4, 12)})
    assert snapshot(path / "a" / "s") == static_before
    shardwise.to_zarr(series_tree(2, 16, NT)["a"].copy(), path, group="a", append_dim="time")
    want = np.concatenate(
        [
            series_tree(0, 0, 4)["a/u"].values,
            series_tree(1, 4, 12)["a/u"].values,
            series_tree(0, 12, 16)["a/u"].values,
            series_tree(2, 16, NT)["a/u"].values,
        ]
    )
    back = open_tree(path, "zarr")
    np.testing.assert_array_equal(back["a/u"].values, want)
    np.testing.assert_array_equal(back["a/time"].values, np.arange(NT))
    assert back["a/s"].attrs == {"kind": "static"} and back.attrs == {"title": "series"}
    assert shardwise.verify(path).ok


def inheriting_tree(seed: int) -> xr.DataTree:
    """Groups without a coordinate of their own: /a and /a/b inherit ``time`` from the root."""
    rng = np.random.default_rng(seed)
    time = pd.date_range("2000-01-01", periods=NT, freq="D")
    return xr.DataTree.from_dict(
        {
            "/": xr.Dataset(coords={"time": time}),
            "/a": xr.Dataset({"u": (("time", "x"), rng.random((NT, NX)).astype("float32"))}),
            "/a/b": xr.Dataset({"w": ("time", rng.integers(0, 99, NT).astype("int16"))}),
        }
    )


def test_region_auto_finds_inherited_coordinates_where_they_are_stored(tmp_path: Path) -> None:
    """region="auto" of a tree whose groups inherit ``time`` from the root: each group's rows
    are found in the root's stored coordinate (rows 5..10 here), not taken from row 0, as an
    explicit region and a Dataset's "auto" find them."""
    path = tmp_path / "t.zarr"
    tree = inheriting_tree(0)
    shardwise.to_zarr(tree, path, shards={"time": SHARD_T})
    new = inheriting_tree(1).isel(time=slice(5, 11))
    shardwise.to_zarr(new, path, region="auto", mode="r+")
    want = {n: tree[n].values.copy() for n in ("a/u", "a/b/w")}
    for name, values in want.items():
        values[5:11] = new[name].values
    for back in (
        xr.open_datatree(path, engine="zarr").load(),  # from the root, consolidated
        open_tree(path, "zarr"),
        open_tree(path, "shardwise"),
    ):
        for name, values in want.items():
            np.testing.assert_array_equal(back[name].values, values, err_msg=name)
        np.testing.assert_array_equal(back["time"].values, tree["time"].values)
    np.testing.assert_array_equal(xr.open_zarr(path, group="a/b")["w"].values, want["a/b/w"])
    assert shardwise.verify(path).ok


REFUSED: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("unknown group in encoding", {"encoding": {"/nope": {}}}, InvalidValueError, "'/nope'"),
    ("unknown variable", {"encoding": {"/a": {"q": {}}}}, InvalidValueError, r"\['q'\]"),
    ("bad encoding key", {"encoding": {"/a": {"u": {"foo": 1}}}}, ValueError, "unexpected"),
    ("mode w- over a store", {"mode": "w-"}, FileExistsError, "already exists"),
    ("shards of 0", {"shards": {"time": 0}}, InvalidValueError, "positive"),
    ("shards of no dimension", {"shards": {"lat": 4}}, InvalidValueError, "'lat'"),
    (
        "misfit shards",
        {"encoding": {"/a": {"v": {"shards": (5,), "chunks": (2,)}}}},
        ValueError,
        "divide",
    ),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_tree_writes_leave_the_store_byte_identical(tmp_path: Path, case: Any) -> None:
    _, kwargs, kind, message = case
    path = tmp_path / "t.zarr"
    shardwise.to_zarr(sample_tree(), path, shards={"time": SHARD_T})
    before = snapshot(path)
    with pytest.raises(kind, match=message):
        shardwise.to_zarr(sample_tree(3), path, **{"mode": "w", **kwargs})
    assert snapshot(path) == before


def failing(tree: xr.DataTree, root: Path, want: int) -> xr.DataTree:
    """``tree`` whose /a/u raises in its last time block once ``want`` shards of it are
    recorded: a tree write interrupted with a known amount of finished work."""

    def f(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        assert block_info is not None
        if block_info[0]["chunk-location"][0] == NT // SHARD_T - 1:
            settle(root / "a" / "u", want)
            raise RuntimeError("interrupted")
        return block

    out = tree.copy()
    u = tree["a/u"]
    out["a/u"] = u.copy(data=u.data.rechunk({0: SHARD_T}).map_blocks(f, dtype="float32"))
    return out


def test_an_interrupted_tree_write_resumes_without_rewriting_done_shards(tmp_path: Path) -> None:
    path = tmp_path / "t.zarr"
    tree = sample_tree(4)
    with (
        dask.config.set(scheduler="threads", num_workers=2),
        pytest.raises(RuntimeError, match="interrupted"),
    ):
        shardwise.to_zarr(failing(tree, path, 3), path, shards={"time": SHARD_T})
    assert not (path / "zarr.json").exists()  # the metadata comes last
    assert not shardwise.verify(path, path="a/u").ok
    rep = shardwise.to_zarr(tree, path, shards={"time": SHARD_T}, resume=True)
    assert rep.shards_skipped >= 3, rep
    assert rep.shards_written + rep.shards_skipped == shard_count(path)
    xr.testing.assert_identical(open_tree(path, "zarr"), tree.load())
    v = shardwise.verify(path)
    assert v.ok and not v.changes, v


def test_a_tree_into_a_zarr_memory_store() -> None:
    store = MemoryStore()
    tree = sample_tree(5)
    shardwise.to_zarr(tree, store, shards={"time": SHARD_T})
    xr.testing.assert_identical(open_tree(store, "zarr"), tree.load())


def test_a_second_writer_is_refused_while_a_tree_write_holds_its_leases(tmp_path: Path) -> None:
    """Each variable of every group is written under its lease, as a Dataset's: while a tree
    write runs (held at a block of /a/u), another tree write over the store is refused and
    changes nothing; the first then finishes."""
    path = tmp_path / "t.zarr"
    shardwise.to_zarr(sample_tree(1), path, shards={"time": SHARD_T})
    entered, release = threading.Event(), threading.Event()

    def gate(block: np.ndarray) -> np.ndarray:
        if block.size:  # not dask's probe for the output type
            entered.set()
            assert release.wait(300), "the gate was never opened"
        return block

    tree = sample_tree(2)
    held = tree.copy()
    held["a/u"] = tree["a/u"].copy(data=tree["a/u"].data.map_blocks(gate, dtype="float32"))
    errors: list[BaseException] = []

    def first() -> None:
        try:
            shardwise.to_zarr(held, path, mode="w", shards={"time": SHARD_T})
        except BaseException as e:  # reported by the test thread below
            errors.append(e)

    with dask.config.set(scheduler="threads", num_workers=1):
        t = threading.Thread(target=first)
        t.start()
        try:
            assert entered.wait(300)
            before = snapshot(path)
            with pytest.raises(LeaseHeldError):
                shardwise.to_zarr(sample_tree(3), path, mode="w", shards={"time": SHARD_T})
            assert snapshot(path) == before
        finally:
            release.set()
            t.join(300)
    assert not errors, errors
    xr.testing.assert_identical(open_tree(path, "zarr"), tree.load())
