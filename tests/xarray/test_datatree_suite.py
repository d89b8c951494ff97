"""xarray's own DataTree Zarr tests, with every read going through the shardwise engine.

``TestZarrDatatreeIO`` ships with xarray in ``xarray/tests/test_backends_datatree.py``. Its tests
write trees with xarray's ``DataTree.to_zarr`` (shardwise's own tree writes are tested in
``test_tree_write.py``) and read them
with ``engine="zarr"`` spelled out in each call; the ``_route`` fixture below sends those reads
(``xr.open_datatree``, ``xr.open_groups``, ``xr.load_datatree`` and ``xr.open_dataset``) to
``engine="shardwise"`` instead. Both Zarr formats run: the engine reads format 2 (and unsharded
format 3) arrays through zarr-python, as the zarr engine does.

Every item must reach shardwise: ``tests/xarray/conftest.py`` fails an item that passes without
opening anything with the shardwise engine. Tests that do not run are listed by name with the
reason in ``tests/skips.py`` (``XARRAY_DATATREE_SKIPPED``): tests of xarray's writer alone, of
its engine guessing, and of the zarr engine's warning for unconsolidated stores.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import xarray as xr
from xarray.tests import test_backends_datatree as upstream
from xarray.tests.conftest import create_test_datatree, simple_datatree  # noqa: F401 (fixtures)
from xarray.tests.test_backends_datatree import unaligned_datatree_zarr_factory  # noqa: F401

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
    name = getattr(request.node, "originalname", request.node.name)
    if name in XARRAY_DATATREE_SKIPPED:
        pytest.skip(XARRAY_DATATREE_SKIPPED[name])
    # the upstream module imported these three by name; xr.open_dataset it calls through xr
    for opener in ("open_datatree", "open_groups", "load_datatree"):
        monkeypatch.setattr(upstream, opener, _engine_shardwise(getattr(xr, opener)))
    monkeypatch.setattr(xr, "open_dataset", _engine_shardwise(xr.open_dataset))


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
        ``open_groups_as_dict`` per tree opened, the tree the same as xarray wrote."""
        path = str(tmpdir / "routed.zarr")
        simple_datatree.to_zarr(path, zarr_format=zarr_format)
        with upstream.open_datatree(path, engine="zarr") as tree:
            xr.testing.assert_identical(tree, simple_datatree)
        assert shardwise_calls["open_groups_as_dict"] == 1
        with xr.open_dataset(path, group="set2", engine="zarr") as ds:
            xr.testing.assert_identical(ds, simple_datatree["set2"].to_dataset())
        assert shardwise_calls["open_dataset"] == 1
