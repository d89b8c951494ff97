"""xarray's own Zarr round-trip suite, with its save and open hooks going through shardwise.

``ZarrBase`` (with the ``CFEncodedBase`` and ``DatasetIOBase`` tests it inherits) ships with xarray
in ``xarray/tests/test_backends.py``. Subclassed here, every ``save`` writes with
:func:`shardwise.to_zarr` and every ``open`` reads with ``engine="shardwise"``:

* ``TestShardwiseZarrSuite``: a local directory store and shardwise's default layout;
* ``TestShardwiseZarrSuiteSmallShards``: a zarr ``MemoryStore`` (the reader's non-local path) and
  every variable written with several shards of several inner chunks each, so that reads cross
  shard and inner-chunk boundaries.

Selection (the run takes well under a minute): only these two classes and only
``zarr_format=3`` (xarray also runs format 2; shardwise writes format 3 only). Not included:
xarray's other Zarr classes (``TestZarrDictStore``, ``TestZarrWriteEmpty``,
``TestZarrRegionAuto``, NCZarr, rectilinear chunks, DataTree), whose tests call ``to_zarr`` and
``open_zarr`` directly rather than through the hooks.

Tests that do not run, by name, with the reason (kept in ``tests/skips.py``, the allowlist of
skips): ``SKIPPED`` (tests of xarray's own ``ZarrStore``, intended differences),
``SKIPPED_SMALL_SHARDS`` and ``KNOWN_FAILURES`` (strict xfails: differences of
``shardwise.to_zarr`` from ``Dataset.to_zarr`` still to be resolved). xarray's own skip and
xfail marks of the inherited tests are listed there too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import xarray as xr
import zarr
from xarray.tests.conftest import time_unit, use_dask  # noqa: F401 (fixtures the suite uses)
from xarray.tests.test_backends import ZarrBase, create_tmp_file
from zarr.storage import MemoryStore

import shardwise
from skips import XARRAY_KNOWN_FAILURES, XARRAY_SKIPPED, XARRAY_SKIPPED_SMALL_SHARDS

# xarray's test data includes fixed-width bytes and strings, which zarr-python writes with a warning
# that their Zarr v3 representation is not specified yet (xarray's own configuration ignores it)
pytestmark = pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning")

# the tests that do not run, and why: tests/skips.py keeps them with the suite's other skips
SKIPPED = XARRAY_SKIPPED
SKIPPED_SMALL_SHARDS = XARRAY_SKIPPED_SMALL_SHARDS
KNOWN_FAILURES = XARRAY_KNOWN_FAILURES


@pytest.fixture(params=[3])
def default_zarr_format(request: pytest.FixtureRequest) -> Iterator[None]:
    """xarray runs its Zarr tests for formats 2 and 3; shardwise writes format 3."""
    with zarr.config.set(default_zarr_format=request.param):
        yield


@pytest.fixture(autouse=True)
def _select(request: pytest.FixtureRequest) -> None:
    name = getattr(request.node, "originalname", request.node.name)
    if name in SKIPPED:
        pytest.skip(SKIPPED[name])
    if request.cls is TestShardwiseZarrSuiteSmallShards and name in SKIPPED_SMALL_SHARDS:
        pytest.skip(SKIPPED_SMALL_SHARDS[name])
    if name in KNOWN_FAILURES:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_FAILURES[name], strict=True))
    # xarray's skip_if_param marker (its handler lives in xarray's repository conftest)
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    for mark in request.node.iter_markers("skip_if_param"):
        kwargs = dict(mark.kwargs)
        reason = kwargs.pop("reason", "")
        if kwargs.pop("condition", True) and all(
            key in params and params[key] == value for key, value in kwargs.items()
        ):
            pytest.skip(reason)


class TestShardwiseZarrSuite(ZarrBase):
    @contextlib.contextmanager
    def create_zarr_target(self) -> Iterator[Any]:
        with create_tmp_file(suffix=".zarr") as tmp:
            yield tmp

    def save(self, dataset: Any, store_target: Any, **kwargs: Any) -> Any:
        return shardwise.to_zarr(dataset, store_target, **kwargs)

    @contextlib.contextmanager
    def open(self, path: Any, **kwargs: Any) -> Iterator[xr.Dataset]:
        with xr.open_dataset(path, engine="shardwise", **kwargs) as ds:
            yield ds

    def test_hooks_write_shards_and_read_them_with_shardwise(self) -> None:
        from xarray.tests.test_dataset import create_test_data

        from shardwise.xarray.backend import ShardwiseBackendArray

        original = create_test_data()
        with self.roundtrip(original) as actual:
            for name in ("var1", "var2", "var3"):
                data: Any = actual[name].variable._data
                while not isinstance(data, ShardwiseBackendArray):
                    data = data.array
                assert data.reader.info.layout.shape == original[name].shape
                assert actual[name].encoding["shards"] is not None
            xr.testing.assert_identical(actual, original)


def small_layout(shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Inner chunks of about a quarter of each dimension, shards of two inner chunks."""
    chunks = tuple(max(1, -(-n // 4)) for n in shape)
    return {"chunks": chunks, "shards": tuple(2 * c for c in chunks)}


class TestShardwiseZarrSuiteSmallShards(TestShardwiseZarrSuite):
    @contextlib.contextmanager
    def create_zarr_target(self) -> Iterator[Any]:
        yield MemoryStore()

    def save(self, dataset: Any, store_target: Any, **kwargs: Any) -> Any:
        creates = kwargs.get("mode") not in ("a", "a-", "r+") and not (
            kwargs.get("append_dim") or kwargs.get("region")
        )
        if creates and isinstance(dataset, xr.Dataset):
            # the layout goes into the variables' own encoding (the encoding= argument would
            # replace their CF encoding); copies, so the caller's dataset is left as it was
            given = kwargs.get("encoding") or {}
            dataset = dataset.copy(deep=False)
            for name, var in dataset.variables.items():
                keys = {*var.encoding, *given.get(name, {})}
                if var.ndim and not keys & {"chunks", "shards"}:
                    var.encoding = {**var.encoding, **small_layout(var.shape)}
        return super().save(dataset, store_target, **kwargs)
