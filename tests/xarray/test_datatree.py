"""DataTree reads through the shardwise engine: ``xr.open_datatree`` and ``xr.open_groups``.

Three kinds of tree, each compared with xarray's own ``engine="zarr"``: written by xarray
(``DataTree.to_zarr``), by shardwise (one ``shardwise.to_zarr(..., group=...)`` per node), and a
multiscale pyramid (groups "0", "1", "2" of downsampled levels, written with xarray and zarr as
OME-Zarr / GeoZarr lay them out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import MemoryStore, WrapperStore

import shardwise
from faultkit import moto_s3, snapshot
from shardwise.compat import datatree_from_groups
from shardwise.errors import (
    ArrayNotFoundError,
    InvalidTypeError,
    NotAGroupError,
    ReadOnlyError,
)
from shardwise.xarray.backend import ShardwiseBackendArray

# zarr warns that consolidated metadata (which the pyramid writer below adds, as xarray does) is
# not in the Zarr v3 specification yet
pytestmark = pytest.mark.filterwarnings(
    "ignore:Consolidated metadata is currently not part:UserWarning"
)

SHARDS = {"y": 16, "x": 24}  # the shard shape of /a/u in every kind of tree below


def sample_tree() -> xr.DataTree:
    """Nested groups, an empty group, attributes, a root coordinate the children inherit."""
    rng = np.random.default_rng(0)
    root = xr.Dataset(
        coords={"y": np.arange(40.0), "x": np.arange(48) * 0.5},
        attrs={"title": "sample", "levels": [1, 2]},
    )
    a = xr.Dataset(
        {"u": (("y", "x"), rng.random((40, 48)).astype("float32"), {"units": "K"})},
        attrs={"source": "a"},
    )
    b = xr.Dataset({"w": ("x", np.arange(48, dtype="int16"))}, coords={"t": 3})
    return xr.DataTree.from_dict(
        {"/": root, "/a": a, "/a/b": b, "/empty": xr.Dataset(), "/c": xr.Dataset({"s": 7})}
    )


def write_with_xarray(path: Any) -> xr.DataTree:
    tree = sample_tree()
    layout = {"chunks": (8, 12), "shards": (SHARDS["y"], SHARDS["x"])}
    tree.to_zarr(path, zarr_format=3, encoding={"/a": {"u": layout}})
    return tree


def write_with_shardwise(path: Any) -> xr.DataTree:
    """The per-group write ``shardwise.to_zarr`` points at when it refuses a DataTree."""
    tree = sample_tree()
    for node in tree.subtree:
        shards = SHARDS if node.path == "/a" else None
        ds = node.to_dataset(inherit=False)
        shardwise.to_zarr(ds, path, group=node.path, mode="a", shards=shards)
    return tree


def write_pyramid(path: Any) -> xr.DataTree:
    """Levels "0", "1", "2" (each half the size of the one before) under a root whose
    ``multiscales`` attribute lists them, as OME-Zarr and GeoZarr store a pyramid."""
    base = np.arange(64 * 96, dtype="float32").reshape(64, 96)
    multiscales = [{"version": "0.5", "datasets": [{"path": str(i)} for i in range(3)]}]
    zarr.open_group(path, mode="w", zarr_format=3, attributes={"multiscales": multiscales})
    levels: dict[str, xr.Dataset] = {"/": xr.Dataset(attrs={"multiscales": multiscales})}
    for i in range(3):
        step = 2**i
        level = xr.Dataset(
            {"v": (("y", "x"), base[::step, ::step])},
            coords={"y": np.arange(0, 64, step), "x": np.arange(0, 96, step)},
        )
        layout = {"chunks": (8, 8), "shards": (16, 16)}
        level.to_zarr(path, group=str(i), mode="a", zarr_format=3, encoding={"v": layout})
        levels[f"/{i}"] = level
    zarr.consolidate_metadata(path)  # as pyramid writers finish: one read opens every level
    return xr.DataTree.from_dict(levels)


WRITERS: dict[str, Callable[[Any], xr.DataTree]] = {
    "xarray": write_with_xarray,
    "shardwise": write_with_shardwise,
    "pyramid": write_pyramid,
}


@pytest.fixture(params=sorted(WRITERS))
def written(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, xr.DataTree]:
    path = tmp_path / f"{request.param}.zarr"
    return path, WRITERS[request.param](path)


def _backend_array(var: xr.DataArray) -> Any:
    data: Any = var.variable._data
    while hasattr(data, "array") and not isinstance(data, ShardwiseBackendArray):
        data = data.array
    return data


# -- the same tree as xarray's zarr engine -------------------------------------------------------


def test_open_datatree_is_identical_to_the_zarr_engine(written: tuple[Path, xr.DataTree]) -> None:
    """Every kind of tree opens identical to engine="zarr" (values, coordinates, attributes,
    encodings aside) and to the tree that was written; the store is left byte-identical."""
    path, original = written
    before = snapshot(path)
    with (
        xr.open_datatree(path, engine="shardwise") as ours,
        xr.open_datatree(path, engine="zarr") as theirs,
    ):
        assert [n.path for n in ours.subtree] == [n.path for n in theirs.subtree]
        xr.testing.assert_identical(ours, theirs)
        xr.testing.assert_identical(ours, original)
        assert ours.attrs == original.attrs
        ours.load()
    assert snapshot(path) == before


def test_open_groups_is_identical_to_the_zarr_engine(written: tuple[Path, xr.DataTree]) -> None:
    """open_groups: the same group names, each group's own dataset identical to engine="zarr"."""
    path, original = written
    ours = xr.open_groups(path, engine="shardwise")
    theirs = xr.open_groups(path, engine="zarr")
    assert list(ours) == list(theirs)  # zarr's order of groups, depth first
    assert set(ours) == {n.path for n in original.subtree}
    for name, ds in ours.items():
        xr.testing.assert_identical(ds, theirs[name])
        ds.close()
        theirs[name].close()


def test_children_inherit_the_root_coordinates_as_xarray(tmp_path: Path) -> None:
    """/a/u uses the root's y and x: the child sees them, but they are the root's, not
    stored again in the child (xarray's inheritance, whichever writer)."""
    for write in (write_with_xarray, write_with_shardwise):
        path = tmp_path / f"{write.__name__}.zarr"
        write(path)
        with xr.open_datatree(path, engine="shardwise") as tree:
            child = tree["a"]
            assert isinstance(child, xr.DataTree)
            assert {"y", "x"} <= set(child.coords)
            assert not {"y", "x"} & set(child.to_dataset(inherit=False).coords)
            assert "t" in tree["a/b"].to_dataset(inherit=False).coords
            assert tree["empty"].to_dataset().data_vars == {}
            assert tree["a"].attrs == {"source": "a"}


# -- lazy, shard-aligned arrays ------------------------------------------------------------------


def test_chunks_are_the_shards_and_reads_go_through_shardwise(
    written: tuple[Path, xr.DataTree],
) -> None:
    """chunks={}: every sharded variable of every group is a dask array of one chunk per shard
    (preferred_chunks is the shard shape), served by shardwise's reader, with the right values."""
    path, original = written
    with xr.open_datatree(path, engine="shardwise", chunks={}) as tree:
        sharded = [
            (node.path, name, var)
            for node in tree.subtree
            for name, var in node.to_dataset(inherit=False).data_vars.items()
            if var.encoding.get("shards")
        ]
        assert sharded, "each kind of tree has sharded variables"
        for _, _, var in sharded:
            shards = var.encoding["shards"]
            assert var.encoding["preferred_chunks"] == dict(zip(var.dims, shards, strict=True))
            clipped = tuple(min(s, n) for s, n in zip(shards, var.shape, strict=True))
            assert var.data.chunksize == clipped
        for group, name, _ in sharded:
            with xr.open_datatree(path, engine="shardwise") as lazy:
                assert isinstance(_backend_array(lazy[group][name]), ShardwiseBackendArray)
            np.testing.assert_array_equal(
                tree[group][name].compute().values, original[group][name].values
            )


def test_pyramid_levels_have_their_own_shard_aligned_chunks(tmp_path: Path) -> None:
    """Each level of a pyramid opens with one dask chunk per 16 x 16 shard of that level."""
    path = tmp_path / "pyramid.zarr"
    write_pyramid(path)
    with xr.open_datatree(path, engine="shardwise", chunks={}) as tree:
        assert list(tree.children) == ["0", "1", "2"]
        for i, (ny, nx) in enumerate([(64, 96), (32, 48), (16, 24)]):
            v = tree[str(i)]["v"]
            assert v.shape == (ny, nx)
            assert v.data.chunks == (
                (16,) * (ny // 16),
                (16,) * (nx // 16) + ((nx % 16,) if nx % 16 else ()),
            )
        assert tree.attrs["multiscales"][0]["datasets"][2] == {"path": "2"}


class Reads(WrapperStore[Any]):
    """Records the key of every read that reaches the wrapped store."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.keys: list[str] = []

    def _with_store(self, store: Any) -> Reads:
        return self  # one log, also when zarr asks for a read-only view

    def with_read_only(self, read_only: bool = False) -> Reads:
        return self

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        self.keys.append(key)
        return await self._store.get(key, prototype, byte_range)

    def get_sync(self, key: str, **kwargs: Any) -> Buffer | None:
        self.keys.append(key)
        return super().get_sync(key, **kwargs)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        self.keys.extend(key for key, _ in key_ranges)
        return await self._store.get_partial_values(prototype, key_ranges)


def test_opening_a_tree_reads_no_data_variable() -> None:
    """Opening a tree (a zarr MemoryStore) reads metadata, and the dimension coordinates
    xarray indexes (as the zarr engine does), but no data variable of any group; a value then
    reads the shards of that one variable only."""
    store = MemoryStore()
    write_with_shardwise(store)
    reads = Reads(store)
    with xr.open_datatree(reads, engine="shardwise", chunks={}) as tree:
        data = [k for k in reads.keys if k.startswith(("a/u/", "a/b/w/", "c/s/"))]
        assert "zarr.json" in reads.keys and data == []
        assert {k.split("/")[0] for k in reads.keys if "/c/" in k} == {"x", "y"}
        reads.keys.clear()
        tree["a"]["u"][:16, :24].compute()
        assert reads.keys and all(k.startswith("a/u/c/") for k in reads.keys)


def test_a_tree_on_s3_reads_identical_to_the_zarr_engine() -> None:
    """The same on S3 (moto on 127.0.0.1, through obstore): a shardwise-written tree."""
    with moto_s3() as s3:
        store = s3.obstore("tree")
        original = write_with_shardwise(store)
        with (
            xr.open_datatree(store, engine="shardwise", chunks={}) as ours,
            xr.open_datatree(store, engine="zarr") as theirs,
        ):
            assert ours["a"]["u"].data.chunksize == (SHARDS["y"], SHARDS["x"])
            xr.testing.assert_identical(ours, theirs)
            xr.testing.assert_identical(ours.compute(), original)


# -- group= ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("group", ["a", "/a", "a/b", "/", "empty"])
def test_group_opens_the_subtree_as_the_zarr_engine(tmp_path: Path, group: str) -> None:
    """group= opens that group as the root of its own tree (no parent), with the same nodes,
    names and (not inherited from above it) coordinates as engine="zarr"; open_groups names
    the groups relative to it, as xarray does."""
    path = tmp_path / "s.zarr"
    write_with_shardwise(path)
    with (
        xr.open_datatree(path, engine="shardwise", group=group) as ours,
        xr.open_datatree(path, engine="zarr", group=group) as theirs,
    ):
        assert ours.parent is None
        xr.testing.assert_identical(ours, theirs)
    ours_groups = xr.open_groups(path, engine="shardwise", group=group)
    theirs_groups = xr.open_groups(path, engine="zarr", group=group)
    assert list(ours_groups) == list(theirs_groups)
    for name, ds in ours_groups.items():
        xr.testing.assert_identical(ds, theirs_groups[name])


@pytest.mark.parametrize(
    ("group", "error", "builtin"),
    [
        ("nope", ArrayNotFoundError, FileNotFoundError),
        ("a/nope", ArrayNotFoundError, FileNotFoundError),
        ("a/u", NotAGroupError, ValueError),
    ],
)
@pytest.mark.parametrize("opener", [xr.open_datatree, xr.open_groups])
def test_a_group_that_is_not_one_is_refused_naming_it(
    tmp_path: Path, opener: Any, group: str, error: type[Exception], builtin: type[Exception]
) -> None:
    """Nothing at group= is an ArrayNotFoundError (a FileNotFoundError), an array there a
    NotAGroupError (a ValueError); both name the path and the store, which stays as it was."""
    path = tmp_path / "s.zarr"
    write_with_shardwise(path)
    before = snapshot(path)
    with pytest.raises(error, match=f"'{group}' in {path}") as refused:
        opener(path, engine="shardwise", group=group)
    assert isinstance(refused.value, builtin)
    assert snapshot(path) == before


def test_keywords_are_checked_before_the_store_is_opened(tmp_path: Path) -> None:
    """An unknown keyword, a mode other than "r" and a bad threads= are refused first (the
    store does not even exist), naming the keyword."""
    missing = tmp_path / "missing.zarr"
    with pytest.raises(InvalidTypeError, match="'colour'"):
        xr.open_datatree(missing, engine="shardwise", colour="red")
    with pytest.raises(ReadOnlyError, match="read-only"):
        xr.open_groups(missing, engine="shardwise", mode="w")
    with pytest.raises(ValueError, match="threads"):
        xr.open_datatree(missing, engine="shardwise", threads=0)
    assert not missing.exists()


# -- writing a tree -------------------------------------------------------------------------------


def test_to_zarr_of_a_tree_matches_the_per_group_write(tmp_path: Path) -> None:
    """to_zarr(tree) writes the tree in one call (shards= by name for every group); it reads
    back through the engine as the per-group write (write_with_shardwise) does."""
    whole, per_group = tmp_path / "t.zarr", tmp_path / "g.zarr"
    tree = sample_tree()
    shardwise.to_zarr(tree, whole, shards=SHARDS)
    original = write_with_shardwise(per_group)
    with (
        xr.open_datatree(whole, engine="shardwise") as back,
        xr.open_datatree(per_group, engine="shardwise") as other,
    ):
        xr.testing.assert_identical(back, original)
        xr.testing.assert_identical(back, other)


# -- compat: the tree from its groups ------------------------------------------------------------


@pytest.mark.parametrize("helper", ["xarray's", "fallback"])
def test_the_tree_closes_every_group(monkeypatch: pytest.MonkeyPatch, helper: str) -> None:
    """datatree_from_groups (xarray's helper, or the public-API fallback without it): closing
    the tree closes every group's dataset; a tree that cannot be built closes them all too."""
    if helper == "fallback":
        import xarray.backends.common

        monkeypatch.delattr(xarray.backends.common, "datatree_from_dict_with_io_cleanup")
    closed: list[str] = []

    def group(name: str, ds: xr.Dataset) -> xr.Dataset:
        ds.set_close(lambda: closed.append(name))
        return ds

    groups = {
        "/": group("/", xr.Dataset({"a": ("x", [1, 2])})),
        "/g": group("/g", xr.Dataset({"b": 1})),
    }
    tree = datatree_from_groups(groups)
    xr.testing.assert_identical(tree, xr.DataTree.from_dict(groups))
    tree.close()
    assert sorted(closed) == ["/", "/g"]
    closed.clear()
    unaligned = {
        "/": group("/", xr.Dataset({"a": ("x", [1, 2])})),
        "/g": group("/g", xr.Dataset({"b": ("x", [1, 2, 3])})),
    }
    with pytest.raises(ValueError, match="not aligned"):
        datatree_from_groups(unaligned)
    assert sorted(closed) == ["/", "/g"]
