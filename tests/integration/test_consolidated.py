"""Consolidated metadata is true after every write: what the root shows is what is stored.

A store written by shardwise (or xarray) carries consolidated metadata at its root. Every write
below it (a subtree with ``group=``, a variable added, rows appended, a subtree replaced, an
array, a pyramid or a conversion at a path, a batch) must leave the root's consolidated
metadata showing exactly the nodes stored, as seen from the root by xarray's own engine
(which reads the consolidated metadata), ``xr.open_zarr`` and the shardwise engine. Writers
adding different subtrees at once must all stay visible: the re-consolidation commits
conditionally, and a writer that lost the commit walks the store again.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr

import shardwise
from faultkit import MotoS3, forkserver, moto_s3
from shardwise.storage import conditional

ENGINES = ("zarr", "shardwise")


def consolidated_root(path: Any) -> Any:
    """A tree with a root variable and the subtree /g/old, consolidated (the default)."""
    tree = xr.DataTree.from_dict(
        {
            "/": xr.Dataset({"r": ("x", np.arange(3.0))}, attrs={"title": "root"}),
            "/g/old": xr.Dataset({"o": ("x", np.ones(3))}),
        }
    )
    shardwise.to_zarr(tree, path)
    assert zarr.open_group(path, mode="r").metadata.consolidated_metadata is not None
    return path


def groups_seen(path: Any) -> dict[str, list[str]]:
    """The groups each engine finds opening the store at its root (consolidated if present)."""
    return {e: sorted(xr.open_datatree(path, engine=e).groups) for e in ENGINES}


def nodes_in_root(path: Any) -> set[str]:
    """The nodes the root's consolidated metadata lists."""
    meta = zarr.open_group(path, mode="r", use_consolidated=True).metadata
    assert meta.consolidated_metadata is not None
    return set(meta.consolidated_metadata.flattened_metadata)


def nodes_stored(path: Any) -> set[str]:
    """The nodes stored, found by listing the store (no consolidated metadata read)."""
    root = zarr.open_group(path, mode="r", use_consolidated=False)
    return {p for p, _ in root.members(max_depth=None, use_consolidated_for_children=False)}


def test_a_subtree_written_with_group_is_seen_from_the_root(tmp_path: Path) -> None:
    path = consolidated_root(tmp_path / "t.zarr")
    sub = xr.DataTree.from_dict(
        {"/": xr.Dataset({"n": ("y", np.arange(4.0))}), "/k": xr.Dataset({"m": 2.5})}
    )
    shardwise.to_zarr(sub, path, group="h")
    want = ["/", "/g", "/g/old", "/h", "/h/k"]
    assert groups_seen(path) == {e: want for e in ENGINES}
    back = xr.open_datatree(path, engine="zarr", group="h")
    np.testing.assert_array_equal(back["n"].values, np.arange(4.0))
    assert back["k/m"].item() == 2.5
    np.testing.assert_array_equal(xr.open_zarr(path, group="h")["n"].values, np.arange(4.0))
    assert nodes_in_root(path) == nodes_stored(path)


def test_a_subtree_replaced_with_mode_w_shows_the_new_nodes_only(tmp_path: Path) -> None:
    path = consolidated_root(tmp_path / "t.zarr")
    new = xr.DataTree.from_dict({"/new": xr.Dataset({"z": ("x", np.full(3, 7.0))})})
    shardwise.to_zarr(new, path, group="g", mode="w")
    want = ["/", "/g", "/g/new"]
    assert groups_seen(path) == {e: want for e in ENGINES}
    for e in ENGINES:
        np.testing.assert_array_equal(
            xr.open_datatree(path, engine=e)["g/new/z"].values, np.full(3, 7.0)
        )
    assert nodes_in_root(path) == nodes_stored(path)


def test_a_variable_added_with_mode_a_is_seen_from_the_root(tmp_path: Path) -> None:
    path = consolidated_root(tmp_path / "t.zarr")
    added = xr.DataTree.from_dict({"/old": xr.Dataset({"p": ("x", np.arange(3) * 2.0)})})
    shardwise.to_zarr(added, path, group="g", mode="a")
    for e in ENGINES:
        back = xr.open_datatree(path, engine=e)["g/old"]
        assert set(back.data_vars) == {"o", "p"}, e
        np.testing.assert_array_equal(back["p"].values, np.arange(3) * 2.0)
    assert set(xr.open_zarr(path, group="g/old").data_vars) == {"o", "p"}
    assert nodes_in_root(path) == nodes_stored(path)


def test_rows_appended_to_a_subtree_are_seen_from_the_root(tmp_path: Path) -> None:
    path = tmp_path / "t.zarr"
    series = xr.Dataset({"v": ("t", np.arange(20.0))}, coords={"t": np.arange(20)})
    tree = xr.DataTree.from_dict(
        {"/": xr.Dataset(attrs={"title": "root"}), "/s": series.isel(t=slice(0, 12))}
    )
    shardwise.to_zarr(tree, path, shards={"t": 4})
    more = xr.DataTree(series.isel(t=slice(12, 20)))
    shardwise.to_zarr(more, path, group="s", append_dim="t")
    for e in ENGINES:
        back = xr.open_datatree(path, engine=e)["s"]
        assert back.sizes["t"] == 20, e
        np.testing.assert_array_equal(back["v"].values, np.arange(20.0))
    assert xr.open_zarr(path, group="s").sizes["t"] == 20
    assert nodes_in_root(path) == nodes_stored(path)
    assert shardwise.verify(path).ok


def test_write_array_pyramid_convert_and_batch_at_a_path_are_seen_from_the_root(
    tmp_path: Path,
) -> None:
    path = consolidated_root(tmp_path / "t.zarr")
    image = np.arange(32 * 32, dtype="float32").reshape(32, 32)
    shardwise.write_array(image, path, path="g/arr", chunks=(8, 8), shards=(16, 16))
    shardwise.write_pyramid(image, path, path="pyr", levels=2, chunks=8, shards=16)
    src = zarr.open_group(tmp_path / "src.zarr", mode="w", zarr_format=3)
    src.create_array("a", shape=(8,), dtype="int32", chunks=(4,))[:] = np.arange(8)
    shardwise.convert(tmp_path / "src.zarr", path, dst_path="conv")
    shardwise.batch.init(
        path, path="b", shape=(8,), dtype="int16", chunks=(4,), shards=(4,), parts=2
    )
    root = zarr.open_group(path, mode="r")  # consolidated: what the root lists
    for node in ("g/arr", "pyr", "pyr/0", "pyr/1", "conv", "conv/a", "b"):
        assert node in root, node
    np.testing.assert_array_equal(root["g/arr"][:], image)
    np.testing.assert_array_equal(root["conv/a"][:], np.arange(8))
    assert nodes_in_root(path) == nodes_stored(path)
    # the pyramid's own group carries its consolidated metadata
    assert zarr.open_group(path, path="pyr", mode="r").metadata.consolidated_metadata is not None


def test_pyramids_carry_consolidated_metadata(tmp_path: Path) -> None:
    """xr.open_datatree of a GeoZarr pyramid and zarr of an OME one read consolidated metadata:
    no warning (warnings are errors in this suite) and every level listed."""
    image = xr.DataArray(
        np.arange(64 * 48, dtype="float32").reshape(64, 48),
        dims=("y", "x"),
        coords={"y": np.arange(64.0), "x": np.arange(48.0)},
        name="v",
    )
    geo = tmp_path / "geo.zarr"
    shardwise.write_pyramid(image, geo, levels=3, chunks=16, shards=32, layout="geozarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree = xr.open_datatree(geo, engine="zarr")
    assert sorted(tree.groups) == ["/", "/0", "/1", "/2"]
    np.testing.assert_array_equal(tree["0/v"].values, image.values)
    ome = tmp_path / "ome.zarr"
    shardwise.write_pyramid(image.values, ome, levels=3, chunks=16, shards=32)
    assert nodes_in_root(ome) == nodes_stored(ome) == {"0", "1", "2"}


def small_subtree(i: int) -> xr.DataTree:
    return xr.DataTree.from_dict(
        {"/": xr.Dataset({"v": ("y", np.full(4, float(i)))}), "/k": xr.Dataset({"m": float(i)})}
    )


@pytest.mark.parametrize("checked", [True, False], ids=["conditional", "unchecked-control"])
def test_writers_adding_subtrees_at_once_all_stay_visible(tmp_path: Path, checked: bool) -> None:
    """Writer A has walked the store (before B's subtree exists) and is about to commit the
    root's consolidated metadata when writer B writes its whole subtree and commits; A's commit
    then finds the root changed and walks again (finding both: nothing left to change), so
    neither subtree is lost. The control commits without the check: A's stale walk hides B."""
    path = consolidated_root(tmp_path / "t.zarr")
    a_paused, b_done = threading.Event(), threading.Event()
    a_thread: list[threading.Thread] = []
    errors: list[BaseException] = []

    def hold_a(name: str, attempt: int) -> None:
        if threading.current_thread() in a_thread and attempt == 0 and not a_paused.is_set():
            a_paused.set()
            assert b_done.wait(300), "writer B did not finish"

    def write_a() -> None:
        try:
            shardwise.to_zarr(small_subtree(1), path, group="a", lease=False)
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            a_paused.set()  # also when A ends without a commit to hold

    saved = conditional.before_commit, conditional.ENABLED
    conditional.before_commit, conditional.ENABLED = hold_a, checked
    try:
        t = threading.Thread(target=write_a)
        a_thread.append(t)
        t.start()
        assert a_paused.wait(300), "writer A never reached its commit"
        shardwise.to_zarr(small_subtree(2), path, group="b", lease=False)
        b_done.set()
        t.join(300)
    finally:
        conditional.before_commit, conditional.ENABLED = saved
    assert not errors
    want = ["/", "/a", "/a/k", "/b", "/b/k", "/g", "/g/old"]
    if not checked:  # B's subtree stored, but hidden by A's stale consolidated metadata
        assert "b" in nodes_stored(path) and "b" not in nodes_in_root(path)
        assert "a/k" in nodes_in_root(path)  # A did re-consolidate, from its stale walk
        return
    assert groups_seen(path) == {e: want for e in ENGINES}
    assert nodes_in_root(path) == nodes_stored(path)


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


def store_of(kind: str, where: str, endpoint: str) -> Any:
    """A local path, or an S3 store (moto, through obstore) at the prefix ``where``."""
    return where if kind == "local" else MotoS3(endpoint, None).obstore(where)


def add_subtree(kind: str, where: str, endpoint: str, i: int, barrier: Any, out: Any) -> None:
    """One process: wait for the others, then write subtree ``s{i}`` into the store."""
    try:
        store = store_of(kind, where, endpoint)
        barrier.wait(300)
        shardwise.to_zarr(small_subtree(i), store, group=f"s{i}")
        out.put((i, ""))
    except BaseException as e:  # reported to the parent
        out.put((i, repr(e)))


@pytest.mark.parametrize(("kind", "writers"), [("local", 2), ("local", 4), ("s3", 2), ("s3", 4)])
def test_processes_adding_subtrees_at_once_all_stay_visible(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str, writers: int
) -> None:
    endpoint = request.getfixturevalue("s3").endpoint if kind == "s3" else ""
    where = str(tmp_path / "t.zarr") if kind == "local" else f"consolidated/{kind}{writers}"
    path = consolidated_root(store_of(kind, where, endpoint))
    ctx = forkserver()
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    jobs = [
        ctx.Process(target=add_subtree, args=(kind, where, endpoint, i, barrier, out))
        for i in range(writers)
    ]
    for j in jobs:
        j.start()
    results = [out.get(timeout=600) for _ in range(writers)]
    for j in jobs:
        j.join(timeout=60)
    assert [e for _, e in results if e] == []
    path = store_of(kind, where, endpoint)
    subtrees = [f"/s{i}" for i in range(writers)] + [f"/s{i}/k" for i in range(writers)]
    want = sorted(["/", "/g", "/g/old", *subtrees])
    assert groups_seen(path) == {e: want for e in ENGINES}
    for i in range(writers):
        np.testing.assert_array_equal(
            xr.open_zarr(path, group=f"s{i}")["v"].values, np.full(4, float(i))
        )
    assert nodes_in_root(path) == nodes_stored(path)


@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
@pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")  # the write's marker, as ever
def test_a_store_that_cannot_replace_says_the_root_is_stale(tmp_path: Path) -> None:
    """A zarr ZipStore only appends: the root's consolidated metadata cannot be rewritten, and
    the write's report says so (nothing in the note when it is still true)."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    mem = zarr.storage.MemoryStore()  # a consolidated root group, stored once into the zip
    zarr.open_group(mem, mode="w", zarr_format=3)
    zarr.consolidate_metadata(mem)
    with zarr.storage.ZipStore(tmp_path / "t.zip", mode="w") as z:
        sync(z.set("zarr.json", sync(mem.get("zarr.json", default_buffer_prototype()))))
        report = shardwise.write_array(np.ones((4, 4)), z, path="a", chunks=(2, 2), shards=(4, 4))
        assert report.notes == [
            "consolidated metadata of group '/' not updated: the store cannot replace an object "
            "(ZipStore); open it with consolidated=False to see every node"
        ]
    with zarr.storage.ZipStore(tmp_path / "t.zip", mode="r") as z:
        assert "a" in nodes_stored(z) and "a" not in nodes_in_root(z)
