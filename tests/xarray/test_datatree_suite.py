"""xarray's own DataTree Zarr tests, with their writes and reads going through shardwise.

``TestZarrDatatreeIO`` ships with xarray in ``xarray/tests/test_backends_datatree.py``. The
``_route`` fixture below sends its writes in Zarr format 3 (``DataTree.to_zarr``, and the
``Dataset.to_zarr`` of the fixture that builds an unaligned tree group by group) to
:func:`shardwise.to_zarr`, and its reads (``xr.open_datatree``, ``xr.open_groups``,
``xr.load_datatree`` and ``xr.open_dataset``, with ``engine="zarr"`` spelled out in each call) to
``engine="shardwise"``. Reads stay xarray's where a test checks xarray's reader itself
(``XARRAY_READS``): an independent reader of what shardwise wrote. Writes in format 2 stay
xarray's (shardwise writes format 3 only): those items test the engine's reads of format 2
(through zarr-python, as the zarr engine reads them).

Every item must reach shardwise: ``tests/xarray/conftest.py`` fails an item that passes without
calling ``shardwise.to_zarr`` or opening anything with the shardwise engine, and prints how many
items wrote and read with shardwise. Tests that do not run are listed by name with the reason in
``tests/skips.py`` (``XARRAY_DATATREE_SKIPPED``): format-2 items in which nothing of shardwise
runs, and a format-2 store that shardwise refuses to write into.
"""

from __future__ import annotations

import functools
import re
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr
from xarray.tests import test_backends_datatree as upstream
from xarray.tests.conftest import create_test_datatree, simple_datatree  # noqa: F401 (fixtures)
from xarray.tests.test_backends_datatree import unaligned_datatree_zarr_factory  # noqa: F401
from zarr.storage import ZipStore

import shardwise
from faultkit import snapshot
from shardwise.errors import InvalidValueError
from skips import XARRAY_DATATREE_SKIPPED

# xarray's test trees include nothing zarr warns about in format 3; format 2 has no such warnings
pytestmark = [
    pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning"),
]


def _engine_shardwise(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with ``engine="zarr"`` replaced by the shardwise engine."""

    @functools.wraps(func)
    def routed(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("engine") == "zarr":
            kwargs["engine"] = "shardwise"
        return func(*args, **kwargs)

    return routed


@pytest.fixture(autouse=True)
def _route(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, shardwise_calls: Any
) -> None:
    for name in (request.node.name, getattr(request.node, "originalname", None)):
        if name in XARRAY_DATATREE_SKIPPED:
            pytest.skip(XARRAY_DATATREE_SKIPPED[name])
    if request.node.originalname in SPLITS_SHARDS:
        # pytest's own filters for the item are in place already (and restored after it)
        warnings.filterwarnings("ignore", SPLITS_SHARDS[request.node.originalname], UserWarning)
    monkeypatch.setattr(xr.DataTree, "to_zarr", _write_with_shardwise(xr.DataTree.to_zarr))
    monkeypatch.setattr(xr.Dataset, "to_zarr", _write_with_shardwise(xr.Dataset.to_zarr))
    if request.node.originalname in XARRAY_READS:
        return  # the test checks xarray's own reader of what shardwise wrote
    # the upstream module imported these three by name; xr.open_dataset it calls through xr
    for opener in ("open_datatree", "open_groups", "load_datatree"):
        monkeypatch.setattr(upstream, opener, _engine_shardwise(getattr(xr, opener)))
    monkeypatch.setattr(xr, "open_dataset", _engine_shardwise(xr.open_dataset))


# tests whose reads stay xarray's zarr engine: what they check is that reader's own behaviour,
# here an independent reader of what shardwise wrote
XARRAY_READS: dict[str, str] = {
    "test_to_zarr_not_consolidated": "the zarr engine's RuntimeWarning for a store without "
    "consolidated metadata (shardwise's engine opens such a store without one)",
    "test_zarr_engine_recognised": "xarray's choice of engine for a .zarr path (always its own)",
}

# tests that open with dask chunks splitting the shards shardwise wrote around the source's small
# dask chunks: the shardwise engine's preferred chunks are its shards (one read task per shard),
# and xarray warns, rightly, that such chunks degrade performance (xarray's writer stores no
# shards, so its chunks are the small ones); the chunks and the values are checked as upstream
SPLITS_SHARDS: dict[str, str] = dict.fromkeys(
    ("test_open_datatree_chunks", "test_open_groups_chunks"),
    "The specified chunks separate the stored chunks",
)

# positional parameters after ``store``: DataTree.to_zarr's, Dataset.to_zarr's
_POSITIONAL = {
    xr.DataTree: ("mode", "encoding", "consolidated", "group", "write_inherited_coords", "compute"),
    xr.Dataset: ("chunk_store", "mode", "synchronizer", "group", "encoding"),
}


def _write_with_shardwise(xarrays: Callable[..., Any]) -> Callable[..., Any]:
    """``DataTree.to_zarr`` / ``Dataset.to_zarr`` as :func:`shardwise.to_zarr`, for Zarr
    format 3 (given or by default). Format 2 stays xarray's writer (shardwise writes format 3
    only): those items test shardwise's reader of xarray's format-2 trees. Dropped:
    ``safe_chunks`` and ``align_chunks`` (shardwise writes any dask chunking, one task per
    shard) and ``None`` values (xarray's "not given"); anything else goes through as it is."""

    def to_zarr(obj: Any, store: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("zarr_format") == 2:
            return xarrays(obj, store, *args, **kwargs)
        given = {**dict(zip(_POSITIONAL[type(obj)], args, strict=False)), **kwargs}
        for name in ("zarr_format", "safe_chunks", "align_chunks"):
            given.pop(name, None)
        # looked up at each call: shardwise_calls counts the calls of shardwise.to_zarr
        return shardwise.to_zarr(obj, store, **{k: v for k, v in given.items() if v is not None})

    return to_zarr


class TestShardwiseDatatreeIO(upstream.TestZarrDatatreeIO):
    engine = "shardwise"

    def test_reads_are_routed_to_shardwise(
        self,
        tmpdir: Any,
        simple_datatree: xr.DataTree,  # noqa: F811 (the fixture imported above)
        zarr_format: int,
        shardwise_calls: Any,
    ) -> None:
        """The upstream tests' ``engine="zarr"`` reads reach the shardwise engine: one
        ``open_groups_as_dict`` per tree opened, the tree the same as was written."""
        path = str(tmpdir / "routed.zarr")
        simple_datatree.to_zarr(path, zarr_format=zarr_format)
        with upstream.open_datatree(path, engine="zarr") as tree:
            xr.testing.assert_identical(tree, simple_datatree)
        assert shardwise_calls["open_groups_as_dict"] == 1
        with xr.open_dataset(path, group="set2", engine="zarr") as ds:
            xr.testing.assert_identical(ds, simple_datatree["set2"].to_dataset())
        assert shardwise_calls["open_dataset"] == 1

    def test_writes_are_routed_to_shardwise(
        self,
        tmp_path: Path,
        simple_datatree: xr.DataTree,  # noqa: F811 (the fixture imported above)
        zarr_format: int,
        shardwise_calls: Any,
    ) -> None:
        """The upstream tests' ``DataTree.to_zarr`` writes with ``shardwise.to_zarr`` in format
        3 (every array of every group sharded, which xarray's writer never does), and xarray's
        own reader reads it identical; format 2 stays xarray's writer (no shards), read by the
        shardwise engine."""
        path = tmp_path / "routed.zarr"
        simple_datatree.to_zarr(str(path), zarr_format=zarr_format)
        assert shardwise_calls["to_zarr"] == (zarr_format == 3)
        root = zarr.open_group(path, mode="r")
        assert root.metadata.zarr_format == zarr_format
        arrays = [a for _, a in root.members(max_depth=None) if isinstance(a, zarr.Array)]
        assert len(arrays) > 5
        shards = {a.path: a.shards for a in arrays if a.ndim}
        assert all(s is not None for s in shards.values()) == (zarr_format == 3), shards
        with xr.open_datatree(path, engine="zarr") as tree:  # xarray's own reader
            xr.testing.assert_identical(tree, simple_datatree)
        with upstream.open_datatree(path, engine="zarr") as tree:  # routed: shardwise's
            xr.testing.assert_identical(tree, simple_datatree)
        assert shardwise_calls["open_groups_as_dict"] == 1


# -- differences of shardwise's tree writer from DataTree.to_zarr that the routed suite found -----


def test_an_unknown_encoding_group_is_refused_in_xarrays_words_too(tmp_path: Path) -> None:
    """An ``encoding`` group the tree does not have: an InvalidValueError (a ValueError) that
    names it with the groups there are and carries xarray's own message (which its test and
    users' code match on), before anything is written."""
    tree = xr.DataTree.from_dict(
        {"/": xr.Dataset({"a": ("x", np.arange(3.0))}), "/g": xr.Dataset({"b": ("x", [1, 2, 3])})}
    )
    path = tmp_path / "t.zarr"
    shardwise.to_zarr(tree, path)
    before = snapshot(path)
    encoding = {"/g": {"b": {}}, "/not/a/group": {"foo": {}}, "h": {}}
    with pytest.raises(InvalidValueError, match="encoding names group '/not/a/group'") as refused:
        shardwise.to_zarr(tree, path, mode="w", encoding=encoding)
    assert isinstance(refused.value, ValueError)
    message = str(refused.value)
    assert "(groups: ['/', '/g'])" in message
    assert re.search(
        r"unexpected encoding group name\(s\) provided: \{'(/not/a/group|h)', ", message
    )
    assert "'/not/a/group'" in message.rsplit(":", 1)[1] and "'h'" in message.rsplit(":", 1)[1]
    assert snapshot(path) == before


# zipfile warns when an entry is written again (the write markers: "open", then "done"); a
# ZipStore reads the last one, as the assertions below check
@pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")
def test_a_tree_into_a_zip_store_is_written_without_leases(tmp_path: Path) -> None:
    """A ``ZipStore`` (append only: nothing can be deleted) takes a tree as ``DataTree.to_zarr``
    writes it: by default without leases, which would have to be deleted at the end (the write
    failed there with a bare NotImplementedError, leaving lease objects in the archive); xarray
    reads the archive back identical. ``lease=True`` is refused before anything is written."""
    tree = xr.DataTree.from_dict(
        {
            "/": xr.Dataset({"a": ("x", np.arange(5.0))}, coords={"x": np.arange(5)}),
            "/g": xr.Dataset({"b": ("x", np.arange(5) * 2)}, attrs={"note": "zip"}),
        }
    )
    refused_path = tmp_path / "refused.zip"
    store = ZipStore(refused_path, mode="w")
    with pytest.raises(InvalidValueError, match="lease=True needs a store that can delete"):
        shardwise.to_zarr(tree, store, lease=True)
    store.close()
    assert zipfile.ZipFile(refused_path).namelist() == []

    path = tmp_path / "tree.zip"
    store = ZipStore(path, mode="w")
    report = shardwise.to_zarr(tree, store)
    store.close()
    assert report.shards_written == 3  # a, b and the index x, one shard each
    names = zipfile.ZipFile(path).namelist()
    assert not [n for n in names if "lease" in n], names
    with xr.open_datatree(ZipStore(path, mode="r", read_only=True), engine="zarr") as back:
        xr.testing.assert_identical(back, tree)
    assert shardwise.verify(ZipStore(path, mode="r", read_only=True), path="g/b").ok
