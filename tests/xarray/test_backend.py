"""The xarray engine: xr.open_dataset(..., engine="shardwise") and shardwise.open_dataset."""

from __future__ import annotations

import pickle
import shutil
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import xarray.testing.strategies as xrst
import zarr
from hypothesis import given
from hypothesis import strategies as st
from xarray.backends.zarr import ZarrArrayWrapper
from xarray.core import indexing
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.codecs import TransposeCodec
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, MemoryStore, WrapperStore

import shardwise
from faultkit import cluster_workers
from shardwise.errors import CorruptShardError
from shardwise.xarray.backend import (
    ShardwiseBackendArray,
    ShardwiseBackendEntrypoint,
    ShardwiseDataStore,
)

# -- helpers --------------------------------------------------------------------------------------


class CountingStore(WrapperStore[Any]):
    """Records every read (key, byte range) that reaches the wrapped store."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.reads: list[tuple[str, ByteRequest | None]] = []
        self._lock = threading.Lock()

    def _record(self, key: str, byte_range: ByteRequest | None) -> None:
        with self._lock:
            self.reads.append((key, byte_range))

    def _with_store(self, store: Any) -> CountingStore:
        return self  # keep one log when zarr asks for a read-only view

    def with_read_only(self, read_only: bool = False) -> CountingStore:
        return self

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        self._record(key, byte_range)
        return await self._store.get(key, prototype, byte_range)

    def get_sync(
        self,
        key: str,
        *,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        self._record(key, byte_range)
        return super().get_sync(key, prototype=prototype, byte_range=byte_range)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        for key, byte_range in key_ranges:
            self._record(key, byte_range)
        return await self._store.get_partial_values(prototype, key_ranges)

    async def get_ranges(  # type: ignore[override]
        self, key: str, byte_ranges: Sequence[ByteRequest | None], **kwargs: Any
    ) -> AsyncIterator[Any]:
        for byte_range in byte_ranges:
            self._record(key, byte_range)
        async for group in self._store.get_ranges(key, byte_ranges, **kwargs):
            yield group

    async def getsize(self, key: str) -> int:
        # a size query (a HEAD request on object stores), not a read: forward it as one
        size: int = await self._store.getsize(key)
        return size

    def keys_read(self) -> set[str]:
        return {k for k, _ in self.reads}

    def chunk_reads(self, array: str) -> list[tuple[str, ByteRequest | None]]:
        return [(k, r) for k, r in self.reads if k.startswith(f"{array}/c")]


def make_dataset() -> xr.Dataset:
    """CF-rich data: NaNs, packed ints, bools, datetimes, timedeltas, strings, attributes."""
    rng = np.random.default_rng(0)
    nt, ny, nx = 24, 18, 20
    temp = rng.standard_normal((nt, ny, nx)).astype("f4")
    temp[3, 2:9, :] = np.nan
    packed = rng.uniform(0, 100, (nt, ny, nx))
    packed[0, 0, :5] = np.nan
    ds = xr.Dataset(
        {
            "temp": (("time", "y", "x"), temp, {"units": "K", "long_name": "temperature"}),
            "packed": (("time", "y", "x"), packed, {"units": "mm"}),
            "mask": (("y", "x"), rng.uniform(size=(ny, nx)) > 0.5),
            "lag": ("time", (np.arange(nt) * 3600).astype("timedelta64[s]").astype("m8[ns]")),
            "count": (("time", "x"), rng.integers(0, 1000, (nt, nx)).astype("i4")),
            "label": ("y", np.array([f"row {i}" for i in range(ny)], dtype=object)),
        },
        coords={
            "time": pd.date_range("2000-01-01", periods=nt, freq="6h"),
            "y": np.linspace(-40, 40, ny),
            "x": np.arange(nx, dtype="i8"),
        },
        attrs={"title": "engine test", "history": "made for a test"},
    )
    ds["temp"].encoding = {"chunks": (4, 6, 5), "shards": (8, 12, 10)}
    ds["packed"].encoding = {
        "chunks": (6, 9, 10),
        "shards": (12, 18, 20),
        "dtype": "i2",
        "scale_factor": 0.01,
        "add_offset": 50.0,
        "_FillValue": -32768,
    }
    ds["mask"].encoding = {"chunks": (6, 5), "shards": (12, 10)}
    ds["count"].encoding = {"chunks": (5, 4), "shards": (10, 8)}
    return ds


SHARDED = ("temp", "packed", "mask", "count")


def write_dataset(store: Any, ds: xr.Dataset | None = None, **kwargs: Any) -> xr.Dataset:
    ds = make_dataset() if ds is None else ds
    kwargs.setdefault("consolidated", False)
    ds.to_zarr(store, zarr_format=3, **kwargs)
    return ds


def assert_matches_source(actual: xr.Dataset, source: xr.Dataset | None = None) -> None:
    """``actual`` is ``source`` (default: make_dataset()) up to the packing of "packed"."""
    source = make_dataset() if source is None else source
    if "packed" in source:
        xr.testing.assert_allclose(actual["packed"], source["packed"], atol=0.006)
        assert actual["packed"].attrs == source["packed"].attrs
    xr.testing.assert_identical(
        actual.drop_vars("packed", errors="ignore"), source.drop_vars("packed", errors="ignore")
    )


def _same(a: Any, b: Any) -> bool:
    """Equality in which NaN equals NaN (fill values)."""
    if isinstance(a, float | np.floating) and isinstance(b, float | np.floating):
        return bool(a == b or (np.isnan(a) and np.isnan(b)))
    return bool(a == b)


def assert_same_encoding(mine: dict[str, Any], ref: dict[str, Any]) -> None:
    assert mine.keys() == ref.keys()
    for key, value in mine.items():
        assert _same(value, ref[key]), (key, value, ref[key])


def backend_array(var: xr.Variable) -> Any:
    """The backend array under xarray's lazy wrappers."""
    data: Any = var._data
    while not isinstance(data, ShardwiseBackendArray | ZarrArrayWrapper):
        data = data.array
    return data


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "data.zarr"
    write_dataset(str(path))
    return path


# -- opening --------------------------------------------------------------------------------------


def test_engine_is_registered() -> None:
    engines = xr.backends.list_engines()
    assert isinstance(engines["shardwise"], ShardwiseBackendEntrypoint)


def test_guess_can_open_leaves_zarr_paths_to_the_zarr_engine(store_path: Path) -> None:
    entry = ShardwiseBackendEntrypoint()
    for candidate in (str(store_path), store_path, "s3://bucket/x.zarr", "x.zarr/", "x"):
        assert entry.guess_can_open(candidate) is False
    assert xr.backends.plugins.guess_engine(str(store_path)) == "zarr"
    with ShardwiseDataStore.open(str(store_path)) as store:
        assert entry.guess_can_open(store) is True


def test_open_matches_the_zarr_engine(store_path: Path) -> None:
    ours = xr.open_dataset(store_path, engine="shardwise")
    theirs = xr.open_dataset(store_path, engine="zarr", consolidated=False)
    for name in SHARDED:
        assert isinstance(backend_array(ours[name].variable), ShardwiseBackendArray)
    # coordinates and the string variable are unsharded: read through zarr-python
    for name in ("lag", "label"):
        assert isinstance(backend_array(ours[name].variable), ZarrArrayWrapper)
    xr.testing.assert_identical(ours.load(), theirs.load())
    assert_matches_source(ours)
    for name in ours.variables:
        mine, ref = dict(ours[name].encoding), dict(theirs[name].encoding)
        if name in SHARDED:
            # the one documented difference: dask chunks default to the shard, not the inner chunk
            shards = dict(zip(ours[name].dims, mine["shards"], strict=True))
            assert mine.pop("preferred_chunks") == shards
            ref.pop("preferred_chunks")
        assert_same_encoding(mine, ref)
    assert ours["packed"].encoding["scale_factor"] == 0.01
    assert ours["packed"].encoding["dtype"] == np.dtype("i2")


def test_public_open_dataset_and_chunks(store_path: Path) -> None:
    ds = shardwise.open_dataset(store_path)
    assert ds["temp"].chunks == ((8, 8, 8), (12, 6), (10, 10))  # one dask chunk per shard
    assert ds["packed"].chunks == ((12, 12), (18,), (20,))
    reference = xr.open_zarr(store_path, consolidated=False)
    assert reference["temp"].chunks[0] == (4,) * 6  # xarray's default: the inner chunks
    assert_matches_source(ds.compute())
    lazy = shardwise.open_dataset(store_path, chunks=None)
    assert lazy["temp"].chunks is None
    assert_matches_source(lazy.load())


def test_chunks_that_split_shards(store_path: Path) -> None:
    with pytest.warns(UserWarning, match="separate the stored chunks"):
        ds = xr.open_dataset(store_path, engine="shardwise", chunks={"time": 3, "y": 5, "x": 7})
    assert ds["temp"].chunks is not None and ds["temp"].chunks[0] == (3,) * 8
    assert_matches_source(ds.compute())


def test_group_and_drop_variables(tmp_path: Path) -> None:
    path = tmp_path / "groups.zarr"
    ds = make_dataset()
    write_dataset(str(path), ds.isel(time=slice(0, 8)))
    write_dataset(str(path), ds, group="nested/deeper", mode="w")
    opened = shardwise.open_dataset(path, group="nested/deeper", drop_variables=["packed", "lag"])
    assert "packed" not in opened and "lag" not in opened
    assert_matches_source(opened.compute(), ds.drop_vars(["packed", "lag"]))
    root = xr.open_dataset(path, engine="shardwise", group="/")
    assert root.sizes["time"] == 8
    with pytest.raises(FileNotFoundError):
        xr.open_dataset(path, engine="shardwise", group="missing")


# the test asks for consolidated metadata, which zarr warns about
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_consolidated_metadata_used_when_present(tmp_path: Path) -> None:
    path = tmp_path / "consolidated.zarr"
    write_dataset(str(path), consolidated=True)
    ds = xr.open_dataset(path, engine="shardwise", consolidated=True)
    assert_matches_source(ds.load())
    plain = tmp_path / "plain.zarr"
    write_dataset(str(plain), consolidated=False)
    with pytest.raises(ValueError):
        xr.open_dataset(plain, engine="shardwise", consolidated=True)
    # no consolidated metadata: opens without it, and without a warning (warnings are errors)
    assert_matches_source(xr.open_dataset(plain, engine="shardwise").load())


def _is_metadata(key: str) -> bool:
    return key.rsplit("/", 1)[-1] in ("zarr.json", ".zgroup", ".zattrs", ".zarray", ".zmetadata")


# the test asks for consolidated metadata, which zarr warns about
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_open_reads_metadata_only() -> None:
    counting = CountingStore(MemoryStore())
    write_dataset(counting, consolidated=True)
    counting.reads.clear()
    ds = xr.open_dataset(counting, engine="shardwise", chunks={})
    for name in SHARDED:
        assert counting.chunk_reads(name) == [], name
    # metadata (zarr probes for format 2 documents too) and the index coordinates xarray loads
    assert all(_is_metadata(k) or k.split("/")[0] in ds.indexes for k in counting.keys_read())
    # without default indexes (and CF time decoding, which peeks at the first and last time)
    # nothing but metadata is read at all
    counting.reads.clear()
    ds = xr.open_dataset(
        counting,
        engine="shardwise",
        create_default_indexes=False,
        decode_times=False,
        decode_timedelta=False,
    )
    assert counting.keys_read() and all(_is_metadata(k) for k in counting.keys_read())
    counting.reads.clear()
    ds.temp[5, 7, 3].values  # noqa: B018
    assert {k for k, _ in counting.chunk_reads("temp")} == {"temp/c/0/0/0"}


def test_open_succeeds_without_any_shard(store_path: Path) -> None:
    for name in SHARDED:
        shutil.rmtree(store_path / name / "c")
    ds = xr.open_dataset(store_path, engine="shardwise")
    assert ds.sizes == {"time": 24, "y": 18, "x": 20}
    # missing shards read as zarr's fill value, exactly as through zarr-python
    assert np.isnan(ds["temp"].values).all()
    assert not ds["mask"].values.any()
    assert (ds["count"].values == 0).all()
    theirs = xr.open_dataset(store_path, engine="zarr", consolidated=False)
    xr.testing.assert_identical(ds.load(), theirs.load())


def test_mode_must_be_read_only(store_path: Path) -> None:
    with pytest.raises(ValueError, match="read-only"):
        xr.open_dataset(store_path, engine="shardwise", mode="a")


def test_corrupt_shard_is_reported(store_path: Path) -> None:
    shard = store_path / "temp" / "c" / "0" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0xFF  # the index checksum no longer matches
    shard.write_bytes(bytes(raw))
    ds = xr.open_dataset(store_path, engine="shardwise")
    with pytest.raises(CorruptShardError, match="checksum"):
        ds["temp"][0, 0, :3].values  # noqa: B018
    np.testing.assert_array_equal(ds["temp"][20].values, make_dataset()["temp"][20].values)


# -- stores written by others ---------------------------------------------------------------------


def test_opens_stores_written_by_zarr_python(tmp_path: Path) -> None:
    root = zarr.open_group(LocalStore(tmp_path / "zp.zarr"), mode="w", zarr_format=3)
    sub = root.create_group("sub", attributes={"source": "zarr-python"})
    data = np.arange(30 * 12, dtype="u2").reshape(30, 12)
    a = sub.create_array(
        "sharded",
        shape=data.shape,
        dtype=data.dtype,
        chunks=(5, 4),
        shards=(10, 12),
        dimension_names=("row", "col"),
        attributes={"units": "counts"},
    )
    a[...] = data
    b = sub.create_array("plain", shape=(30,), dtype="f8", chunks=(7,), dimension_names=("row",))
    b[...] = np.linspace(0, 1, 30)
    t = sub.create_array(
        "transposed",
        shape=(30, 12),
        dtype="i4",
        chunks=(10, 3),
        shards=(30, 6),
        filters=[TransposeCodec(order=(1, 0))],
        dimension_names=("row", "col"),
    )
    t[...] = data.astype("i4") * -3
    ds = xr.open_dataset(tmp_path / "zp.zarr", engine="shardwise", group="sub")
    assert ds.attrs == {"source": "zarr-python"}
    assert isinstance(backend_array(ds["sharded"].variable), ShardwiseBackendArray)
    assert isinstance(backend_array(ds["plain"].variable), ZarrArrayWrapper)
    assert ds["sharded"].attrs == {"units": "counts"}
    np.testing.assert_array_equal(ds["sharded"].values, data)
    np.testing.assert_array_equal(ds["transposed"].values, data.astype("i4") * -3)
    np.testing.assert_array_equal(ds["plain"].values, np.linspace(0, 1, 30))
    sel = {"row": xr.DataArray([29, 0, 13], dims="p"), "col": xr.DataArray([1, 11, 6], dims="p")}
    want = data.astype("i4")[[29, 0, 13], [1, 11, 6]] * -3
    np.testing.assert_array_equal(ds["transposed"].isel(sel).values, want)


def test_opens_unsharded_and_zarr_v2_stores_written_by_xarray(tmp_path: Path) -> None:
    ds = make_dataset()
    for var in ds.variables.values():
        var.encoding = {k: v for k, v in var.encoding.items() if k not in ("shards", "chunks")}
    for fmt in (2, 3):
        path = tmp_path / f"v{fmt}.zarr"
        ds.to_zarr(path, zarr_format=fmt, consolidated=False)
        ours = xr.open_dataset(path, engine="shardwise")
        theirs = xr.open_dataset(path, engine="zarr", consolidated=False)
        xr.testing.assert_identical(ours.load(), theirs.load())
        for name in ours.variables:
            assert_same_encoding(ours[name].encoding, theirs[name].encoding)


# -- reading only what a selection needs ----------------------------------------------------------


@pytest.fixture
def ranged() -> tuple[CountingStore, np.ndarray]:
    """One 256x256 shard of 4x4 uncompressed 64x64 inner chunks (32 KiB each), fully written."""
    store = CountingStore(MemoryStore())
    data = np.arange(256 * 256, dtype="f8").reshape(256, 256)
    arr = zarr.create_array(
        store,
        name="v",
        shape=data.shape,
        dtype="f8",
        chunks=(64, 64),
        shards=(256, 256),
        compressors=None,
        dimension_names=("y", "x"),
    )
    arr[...] = data
    store.reads.clear()
    return store, data


def _data_bytes(reads: list[tuple[str, ByteRequest | None]]) -> list[int]:
    """Sizes of the ranged reads that are not the shard index (a suffix request)."""
    out = []
    for _, r in reads:
        assert r is not None, "a selection of a few chunks must not fetch whole shards"
        if isinstance(r, RangeByteRequest):
            out.append(r.end - r.start)
        else:
            assert isinstance(r, SuffixByteRequest)
    return out


def test_vectorized_selection_reads_only_needed_chunks(
    ranged: tuple[CountingStore, np.ndarray],
) -> None:
    store, data = ranged
    ds = xr.open_dataset(store, engine="shardwise", consolidated=False, cache_indexes=True)
    store.reads.clear()
    pts = {"y": xr.DataArray([1, 250, 3], dims="p"), "x": xr.DataArray([2, 255, 0], dims="p")}
    np.testing.assert_array_equal(ds["v"].isel(pts).values, data[[1, 250, 3], [2, 255, 0]])
    # two inner chunks ((0, 0) and (3, 3)), far apart: two ranges of exactly one chunk each
    assert sorted(_data_bytes(store.chunk_reads("v"))) == [64 * 64 * 8] * 2
    store.reads.clear()
    np.testing.assert_array_equal(ds["v"].isel(y=[200, 5], x=[7]).values, data[[200, 5]][:, [7]])
    assert sorted(_data_bytes(store.chunk_reads("v"))) == [64 * 64 * 8] * 2  # index is cached
    assert not [r for _, r in store.chunk_reads("v") if isinstance(r, SuffixByteRequest)]


def test_basic_selection_reads_only_needed_chunks(ranged: tuple[CountingStore, np.ndarray]) -> None:
    store, data = ranged
    ds = xr.open_dataset(store, engine="shardwise", consolidated=False)
    store.reads.clear()
    np.testing.assert_array_equal(ds["v"][10:20, 130:140].values, data[10:20, 130:140])
    assert _data_bytes(store.chunk_reads("v")) == [64 * 64 * 8]  # chunk (0, 2) only
    store.reads.clear()
    np.testing.assert_array_equal(ds["v"][70, ::100].values, data[70, ::100])  # chunks (1, 0..3)
    assert sum(_data_bytes(store.chunk_reads("v"))) == 4 * 64 * 64 * 8


# -- indexing agrees with numpy -------------------------------------------------------------------


@st.composite
def sharded_arrays(draw: st.DrawFn) -> tuple[Any, np.ndarray]:
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 14), min_size=ndim, max_size=ndim)))
    chunks = tuple(draw(st.integers(1, 4)) for _ in range(ndim))
    shards = tuple(c * draw(st.integers(1, 3)) for c in chunks)
    dtype = draw(st.sampled_from(["f4", "i2", "u1", ">f8", "bool"]))
    data = np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)
    data[: draw(st.integers(0, shape[0]))] = 0  # some all-fill chunks (then not stored)
    order = draw(st.sampled_from([None, tuple(range(ndim))[::-1]]))
    store = MemoryStore()
    arr = zarr.create_array(
        store,
        name="v",
        shape=shape,
        dtype=dtype,
        chunks=chunks,
        shards=shards,
        filters=[] if order is None else [TransposeCodec(order=order)],
        dimension_names=[f"d{i}" for i in range(ndim)],
        fill_value=0,
    )
    arr[...] = data
    return store, data


@given(case=sharded_arrays(), data=st.data())
def test_indexing_matches_numpy(case: tuple[Any, np.ndarray], data: st.DataObject) -> None:
    store, values = case
    dims = [f"d{i}" for i in range(values.ndim)]
    sizes = dict(zip(dims, values.shape, strict=True))
    expected = xr.DataArray(values, dims=dims)
    opened = xr.open_dataset(store, engine="shardwise", consolidated=False)["v"]
    assert isinstance(backend_array(opened.variable), ShardwiseBackendArray)
    kind = data.draw(st.sampled_from(["basic", "outer", "vectorized"]))
    if kind == "basic":
        idx: Any = data.draw(xrst.basic_indexers(sizes=sizes))
    elif kind == "outer":
        idx = data.draw(xrst.outer_array_indexers(sizes=sizes, min_dims=1))
    else:
        idx = data.draw(xrst.vectorized_indexers(sizes=sizes, min_dims=1))
    got = opened.isel(idx)
    xr.testing.assert_identical(got.load(), expected.isel(idx).rename("v"))


def test_explicit_indexers_match_numpy(store_path: Path) -> None:
    ds = xr.open_dataset(store_path, engine="shardwise")
    arr = backend_array(ds["count"].variable)
    values = make_dataset()["count"].values
    ref = indexing.NumpyIndexingAdapter(values)
    keys: list[Any] = [
        indexing.BasicIndexer((slice(None, None, -3), -1)),
        indexing.BasicIndexer((5, 7)),
        indexing.BasicIndexer((slice(4, 4), slice(None))),
        indexing.BasicIndexer((slice(0, 0, -1), slice(None))),  # xarray alone fails on this one
        indexing.OuterIndexer((np.array([3, 1, 3, -1]), slice(2, 19, 5))),
        indexing.OuterIndexer((np.array([], dtype=int), 3)),
        indexing.VectorizedIndexer((np.array([[0, 23], [9, 9]]), np.array([[19, 0], [3, 4]]))),
        indexing.VectorizedIndexer((slice(None, None, 5), np.array([-1, 2, 0]))),
    ]
    for key in keys:
        want = (
            ref.vindex[key]
            if isinstance(key, indexing.VectorizedIndexer)
            else (ref.oindex[key] if isinstance(key, indexing.OuterIndexer) else ref[key])
        )
        np.testing.assert_array_equal(arr[key], want)
    with pytest.raises(IndexError):
        arr[indexing.OuterIndexer((np.array([24]), slice(None)))]


def test_load_async(store_path: Path) -> None:
    import asyncio

    ds = xr.open_dataset(store_path, engine="shardwise")
    pts = {"time": xr.DataArray([2, 20], dims="p"), "x": xr.DataArray([19, 1], dims="p")}

    async def load() -> tuple[xr.Dataset, xr.DataArray]:
        return await ds.load_async(), await ds["temp"].isel(pts).load_async()

    loaded, selected = asyncio.run(load())
    assert_matches_source(loaded)
    np.testing.assert_array_equal(selected.values, make_dataset()["temp"].isel(pts).values)


def test_open_change_write_reopen(store_path: Path, tmp_path: Path) -> None:
    """Opened shard-aligned, changed, written back with shardwise: no alignment flags needed."""
    with pytest.warns(UserWarning, match="separate the stored chunks"):
        ds = shardwise.open_dataset(store_path, chunks={"time": 5, "y": 7})
    # copy(data=...) keeps the attributes and the encoding (the stored layout) of the variable
    changed = ds.assign(temp=ds["temp"].copy(data=ds["temp"].data * 2 + 1))
    out = tmp_path / "changed.zarr"
    shardwise.to_zarr(changed, out)
    again = shardwise.open_dataset(out)
    assert again["temp"].encoding["shards"] == (8, 12, 10)  # the layout travels in the encoding
    assert again["temp"].chunks == ((8, 8, 8), (12, 6), (10, 10))
    assert_matches_source(again.compute(), changed.compute())


# -- threads, pickling, a cluster -----------------------------------------------------------------


def test_backend_array_is_thread_safe(store_path: Path) -> None:
    ds = xr.open_dataset(store_path, engine="shardwise")
    arr = backend_array(ds["temp"].variable)
    values = make_dataset()["temp"].values

    def work(seed: int) -> int:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            lo = rng.integers(0, [24, 18, 20])
            hi = lo + rng.integers(1, 9, size=3)
            key = tuple(slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True))
            np.testing.assert_array_equal(arr[indexing.BasicIndexer(key)], values[key])
            pts = tuple(rng.integers(0, n, size=5) for n in values.shape)
            np.testing.assert_array_equal(arr[indexing.VectorizedIndexer(pts)], values[pts])
        return seed

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(work, range(16))) == list(range(16))


def test_backend_array_pickles_without_its_cache(store_path: Path) -> None:
    ds = xr.open_dataset(store_path, engine="shardwise")
    arr = backend_array(ds["temp"].variable)
    arr[indexing.BasicIndexer((0, 0, slice(0, 2)))]
    assert len(arr.reader._cache) > 0
    clone = pickle.loads(pickle.dumps(arr))
    assert len(clone.reader._cache) == 0
    assert clone.shape == arr.shape and clone.dtype == arr.dtype
    key = indexing.VectorizedIndexer((np.array([1, 22]), np.array([0, 17]), np.array([19, 2])))
    np.testing.assert_array_equal(clone[key], arr[key])
    assert len(pickle.dumps(arr)) < 20_000  # configuration only, no data
    # whole lazily indexed datasets pickle too
    again = pickle.loads(pickle.dumps(ds))
    assert_matches_source(again.load())


@pytest.mark.slow
def test_reads_on_a_local_cluster(client: Any, store_path: Path) -> None:
    from distributed import get_task_stream

    ds = shardwise.open_dataset(store_path)
    expected = make_dataset()
    with dask.config.set(scheduler=client), get_task_stream(client) as ts:
        loaded = ds.compute()
        pts = (
            ds["temp"]
            .isel(time=xr.DataArray([0, 23, 11], dims="p"), x=xr.DataArray([19, 0, 4], dims="p"))
            .compute()
        )
    assert_matches_source(loaded, expected)
    np.testing.assert_array_equal(pts.values, expected["temp"].values[[0, 23, 11], :, [19, 0, 4]])
    workers = {t["worker"] for t in ts.data}
    assert workers <= cluster_workers(client) and workers
