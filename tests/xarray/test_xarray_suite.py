"""xarray's own Zarr round-trip suite, with its writes and reads going through shardwise.

``ZarrBase`` (with the ``CFEncodedBase`` and ``DatasetIOBase`` tests it inherits) ships with xarray
in ``xarray/tests/test_backends.py``. Subclassed here, every ``save`` writes with
:func:`shardwise.to_zarr` and every ``open`` reads with ``engine="shardwise"``; the tests' own
``Dataset.to_zarr`` / ``DataArray.to_zarr`` calls are routed to the class's ``save`` as well (the
``_route`` fixture), while ``xr.open_zarr`` stays xarray's: an independent reader of what
shardwise wrote.

* ``TestShardwiseZarrSuite``: a local directory store and shardwise's default layout;
* ``TestShardwiseZarrSuiteSmallShards``: a zarr ``MemoryStore`` (the reader's non-local path) and
  every variable written with several shards of several inner chunks each, so that reads cross
  shard and inner-chunk boundaries.

Every item must reach shardwise: ``tests/xarray/conftest.py`` counts the calls of
``shardwise.to_zarr`` and of the shardwise engine's ``open_dataset`` per item, fails an item that
passes without any, and prints how many passing items reached shardwise.

Selection (the run takes well under a minute): only these two classes and only
``zarr_format=3`` (xarray also runs format 2; shardwise writes format 3 only). Not included
(yet): xarray's other Zarr classes (``TestZarrDictStore``, ``TestZarrWriteEmpty``,
``TestZarrRegionAuto``, NCZarr, rectilinear chunks); xarray's DataTree Zarr tests run in
``test_datatree_suite.py``.

Tests that do not run, by name, with the reason (kept in ``tests/skips.py``, the allowlist of
skips): ``SKIPPED`` (tests of xarray's own ``ZarrStore``, tests that cannot reach shardwise or
assert nothing, intended differences), ``SKIPPED_SMALL_SHARDS`` and ``KNOWN_FAILURES`` (strict
xfails: differences of ``shardwise.to_zarr`` from ``Dataset.to_zarr`` still to be resolved).
xarray's own skip and xfail marks of the inherited tests are listed there too.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr
from xarray.tests.conftest import time_unit, use_dask  # noqa: F401 (fixtures the suite uses)
from xarray.tests.test_backends import ZarrBase, create_tmp_file
from zarr.storage import MemoryStore

import shardwise
from faultkit import snapshot
from shardwise.core.planner import default_layout
from shardwise.core.sizing import DEFAULT_CHUNK_BYTES
from shardwise.errors import InvalidValueError
from skips import XARRAY_KNOWN_FAILURES, XARRAY_SKIPPED, XARRAY_SKIPPED_SMALL_SHARDS

# xarray's test data includes fixed-width bytes and strings, which zarr-python writes with a warning
# that their Zarr v3 representation is not specified yet (xarray's own configuration ignores it);
# its tests ask for consolidated metadata (consolidated=True, and xarray's own to_zarr as their
# reference), which zarr warns is not in the v3 specification
pytestmark = [
    pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning"),
    pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning"),
]

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


# items of this module that do not count calls into shardwise, with the reason
NOT_COUNTED: dict[str, str] = {
    "test_an_item_passing_without_reaching_shardwise_fails": "tests the accounting itself, in "
    "a pytest run of its own",
}


@pytest.fixture(autouse=True)
def _route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Route the upstream tests' own ``Dataset.to_zarr`` / ``DataArray.to_zarr`` calls through
    the class's ``save`` hook, so that they write with shardwise too (and the small-shards class
    imposes its layout on them); ``xr.open_zarr`` stays xarray's, an independent reader of what
    shardwise wrote. ``shardwise_calls`` (tests/xarray/conftest.py) fails an item that passes
    without reaching shardwise."""
    if request.node.name not in NOT_COUNTED:
        request.getfixturevalue("shardwise_calls")
    if request.instance is None:
        return  # this module's own tests call shardwise themselves
    save = request.instance.save

    def to_zarr(obj: Any, store: Any = None, *args: Any, **kwargs: Any) -> Any:
        return save(obj, store, **_shardwise_kwargs(args, kwargs))

    monkeypatch.setattr(xr.Dataset, "to_zarr", to_zarr)
    monkeypatch.setattr(xr.DataArray, "to_zarr", to_zarr)


# Dataset.to_zarr's positional parameters after ``store``
_POSITIONAL = ("chunk_store", "mode", "synchronizer", "group", "encoding")


def _shardwise_kwargs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``Dataset.to_zarr``'s arguments as ``shardwise.to_zarr``'s.

    Dropped: ``safe_chunks`` and ``align_chunks`` (shardwise writes any dask chunking, one task
    per shard) and a ``zarr_format`` of 3; ``None`` values of keywords ``shardwise.to_zarr``
    does not have (``chunk_store``, ``synchronizer``: xarray takes them as "not given"). A
    ``None`` of a keyword both share goes through, as every other value (shardwise accepts it
    with xarray's meaning, or refuses what it does not have).
    """
    kwargs = {**dict(zip(_POSITIONAL, args, strict=False)), **kwargs}
    for name in ("safe_chunks", "align_chunks"):
        kwargs.pop(name, None)
    fmt = kwargs.pop("zarr_format", None) or kwargs.pop("zarr_version", None)
    if fmt not in (None, 3):
        pytest.skip(f"writes Zarr format {fmt}; shardwise writes format 3 only")
    shared = inspect.signature(shardwise.to_zarr).parameters
    return {k: v for k, v in kwargs.items() if v is not None or k in shared}


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

    def routed_layout(self) -> dict[str, tuple[Any, Any]]:
        """(inner chunks, shards) that a routed write of ``u`` (10 values in dask chunks of 2,
        on an index ``x``) stores: shardwise's default, the small dask chunks in one shard."""
        return {"u": ((2,), (10,)), "x": ((10,), (10,))}

    def test_dataset_to_zarr_is_routed_to_shardwise(self, shardwise_calls: Any) -> None:
        """``Dataset.to_zarr`` itself, as the upstream tests call it, writes with shardwise in
        this class's layout (xarray's own would write no shards), and xarray reads it back."""
        original = xr.Dataset({"u": ("x", np.arange(10.0))}, coords={"x": np.arange(10)})
        original = original.chunk(x=2)
        with self.create_zarr_target() as store:
            original.to_zarr(store)
            assert shardwise_calls["to_zarr"] == 1
            assert _layouts(store) == self.routed_layout()
            with xr.open_zarr(store) as back:
                # xarray's engine reads with the stored inner chunks
                inner = self.routed_layout()["u"][0]
                assert back["u"].encoding["preferred_chunks"] == {"x": inner[0]}
                xr.testing.assert_identical(back.compute(), original.compute())

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

    def routed_layout(self) -> dict[str, tuple[Any, Any]]:
        small = small_layout((10,))
        return dict.fromkeys("ux", (small["chunks"], small["shards"]))

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


def _layouts(store: Any) -> dict[str, tuple[Any, Any]]:
    """(inner chunks, shards) of every array in the group at ``store``, read with zarr."""
    group = zarr.open_group(store, mode="r")
    return {name: (arr.chunks, arr.shards) for name, arr in group.arrays()}


# -- shardwise's own choices that the suite runs into ---------------------------------------------


@pytest.mark.parametrize(
    ("dask_chunks", "expected"),
    [
        # uniform and small: the dask chunks are the inner chunks (as xarray), shards around them
        ({"x": 2}, ((2, 6), (10, 6))),
        ({"x": 3, "y": 2}, ((3, 2), (12, 6))),  # shards of whole inner chunks
        # irregular dask chunks, and none: shardwise's default rule
        ({"x": (4, 6)}, None),
        (None, None),
    ],
)
def test_default_inner_chunks_are_small_uniform_dask_chunks(
    tmp_path: Path, dask_chunks: dict[str, Any] | None, expected: Any
) -> None:
    """Uniform dask chunks of at most a default inner chunk are the inner chunks, as xarray
    stores them, in shards of the default rule: xr.open_zarr reads those chunks back."""
    original = xr.Dataset({"u": (("x", "y"), np.arange(60.0).reshape(10, 6))})
    if dask_chunks is not None:
        original = original.chunk(dask_chunks)
    shardwise.to_zarr(original, tmp_path / "s.zarr")
    want = expected or default_layout((10, 6), 8)
    assert _layouts(tmp_path / "s.zarr")["u"] == want
    with xr.open_zarr(tmp_path / "s.zarr") as back:
        assert back["u"].encoding["preferred_chunks"] == dict(zip("xy", want[0], strict=True))
        xr.testing.assert_identical(back.compute(), original.compute())


def test_dask_chunks_over_a_default_inner_chunk_are_not_the_inner_chunks(tmp_path: Path) -> None:
    """Uniform dask chunks of 2 MiB: inner chunks of the default rule (about 1 MiB) instead."""
    n = 2 * DEFAULT_CHUNK_BYTES // 8
    original = xr.Dataset({"u": ("x", np.zeros(2 * n))}).chunk(x=n)
    shardwise.to_zarr(original, tmp_path / "s.zarr")
    chunks, shards = _layouts(tmp_path / "s.zarr")["u"]
    assert (chunks, shards) == default_layout((2 * n,), 8)
    assert chunks[0] * 8 <= DEFAULT_CHUNK_BYTES


def test_too_many_tiny_dask_chunks_for_a_shard_are_not_the_inner_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One-value dask chunks: the inner chunks up to MAX_DASK_CHUNKS_PER_SHARD per shard (as
    xarray), beyond that the default rule's (no shard index of millions of entries). The cap is
    lowered to 8 here: the rule is the same, and thousands of one-value tasks take seconds."""
    import shardwise.xarray.prepare as prepare

    monkeypatch.setattr(prepare, "MAX_DASK_CHUNKS_PER_SHARD", 8)
    for n, want in [(8, ((1,), (8,))), (9, default_layout((9,), 8))]:
        original = xr.Dataset({"u": ("x", np.arange(float(n)))}).chunk(x=1)
        shardwise.to_zarr(original, tmp_path / f"{n}.zarr")
        assert _layouts(tmp_path / f"{n}.zarr")["u"] == want
        with xr.open_zarr(tmp_path / f"{n}.zarr") as back:
            xr.testing.assert_identical(back.compute(), original.compute())


@pytest.mark.parametrize(
    ("kwargs", "ours", "xarrays"),
    [
        (
            {"append_dim": "nope"},
            "append_dim='nope' is not a dimension of the data to write",
            "does not match any existing dataset dimensions",
        ),
        (
            {"append_dim": "t"},  # a dimension of the data, not of the store
            "cannot append along 't': the store has no such dimension",
            "append_dim='t' does not match any existing dataset dimensions ['x']",
        ),
        (
            {"append_dim": "x", "mode": "w"},
            "append_dim needs mode='a' (or None), got mode='w'",
            "cannot set append_dim unless mode='a' or mode=None",
        ),
        (
            {"region": {"x": slice(0, 2)}, "mode": "w"},
            "region needs mode='r+' or 'a' (or None), got mode='w'",
            "cannot set region unless mode='a', mode='a-', mode='r+' or mode=None",
        ),
    ],
)
def test_refusals_carry_xarray_wording_and_leave_the_store(
    tmp_path: Path, kwargs: dict[str, Any], ours: str, xarrays: str
) -> None:
    """Each refusal says it in shardwise's words and in xarray's (callers match on either), is a
    InvalidValueError and a ValueError, and leaves the store byte-identical."""
    store = tmp_path / "s.zarr"
    shardwise.to_zarr(xr.Dataset({"u": ("x", np.arange(4.0))}), store)
    before = snapshot(store)
    more = xr.Dataset({"u": (("t", "x"), np.ones((1, 4)))})
    with pytest.raises(InvalidValueError, match=re.escape(ours)) as refused:
        shardwise.to_zarr(
            more if kwargs.get("append_dim") == "t" else more.isel(t=0), store, **kwargs
        )
    assert isinstance(refused.value, ValueError)
    assert xarrays in str(refused.value)
    assert snapshot(store) == before


# -- the accounting (tests/xarray/conftest.py) ----------------------------------------------------

_ITEMS = """
import pytest
import shardwise
import xarray as xr

def test_xarray_only(shardwise_calls, tmp_path):
    xr.Dataset({"u": ("x", [1.0])}).to_zarr(tmp_path / "x.zarr", zarr_format=3)

def test_refused_before_shardwise_runs(shardwise_calls):
    with pytest.raises(TypeError):
        shardwise.to_zarr(xr.Dataset(), "unused", chunk_store={})

def test_shardwise(shardwise_calls, tmp_path):
    shardwise.to_zarr(xr.Dataset({"u": ("x", [1.0])}), tmp_path / "s.zarr")
    xr.open_dataset(tmp_path / "s.zarr", engine="shardwise").close()

def test_not_counted():
    pass
"""


def test_an_item_passing_without_reaching_shardwise_fails(pytester: pytest.Pytester) -> None:
    """Items that ask for ``shardwise_calls`` and pass with no call of ``shardwise.to_zarr``
    (one whose arguments do not bind is none) nor of the shardwise engine fail; the summary
    counts the others, and items that do not ask are left alone."""

    tests = Path(__file__).parents[1]  # tests/reached.py sums the counts
    pytester.makeconftest(
        Path(__file__).with_name("conftest.py").read_text()
        + f"\nimport sys\nsys.path.insert(0, {str(tests)!r})\n"
        + "from reached import pytest_configure  # noqa: E402\n"
    )
    pytester.makepyfile(test_items=_ITEMS)
    # no:randomly: the failures are listed in run order, and the inner run reads no addopts
    # (pytest-randomly, when installed, would shuffle it whatever the outer run's order)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-o",
        "asyncio_default_fixture_loop_scope=function",
    )
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_xarray_only passed without reaching shardwise*",
            "*test_refused_before_shardwise_runs passed without reaching shardwise*",
            "xarray suite: 1 passed items reached shardwise (1 calls of shardwise.to_zarr, "
            "1 opens with the shardwise engine)",
        ]
    )
