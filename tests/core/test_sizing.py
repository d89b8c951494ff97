"""Default layouts: ``write_array`` and ``to_zarr`` pick shards and inner chunks by one rule,
and default inner chunks always divide the shards (given or picked).

Oracle: zarr-python reads every array written here back.
"""

from __future__ import annotations

import math
from typing import Any

import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import given
from hypothesis import strategies as st
from zarr.storage import MemoryStore

import shardwise
from shardwise.core.sizing import DEFAULT_CHUNK_BYTES, DEFAULT_SHARD_BYTES, default_layout
from strategies import examples

DTYPES = ("bool", "uint8", "int16", "float32", "int64", "complex128")
shapes = st.lists(st.integers(0, 5000), min_size=1, max_size=4).map(tuple)


@st.composite
def given_shards(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """None (let the default pick) or any shard shape, dividing the array or not."""
    if draw(st.booleans()):
        return None
    return tuple(draw(st.integers(1, max(1, n) + 7)) for n in shape)


def _stored_layout(store: Any, path: str = "") -> tuple[tuple[int, ...], tuple[int, ...]]:
    arr = zarr.open_array(store, path=path, mode="r")
    assert arr.shards is not None
    return tuple(arr.chunks), tuple(arr.shards)


@given(data=st.data(), shape=shapes, dtype=st.sampled_from(DTYPES))
@examples(200)
def test_default_chunks_divide_shards_and_shards_stay_in_bounds(
    data: st.DataObject, shape: tuple[int, ...], dtype: str
) -> None:
    itemsize = np.dtype(dtype).itemsize
    shards = data.draw(given_shards(shape))
    chunks, out = default_layout(shape, itemsize, None, shards)
    assert all(s % c == 0 for s, c in zip(out, chunks, strict=True))
    assert math.prod(chunks) * itemsize <= DEFAULT_CHUNK_BYTES or max(chunks) == 1
    if shards is None:
        assert math.prod(out) * itemsize <= DEFAULT_SHARD_BYTES
        # no shard reaches more than one inner chunk beyond the array
        assert all(s < max(n, 1) + c for s, c, n in zip(out, chunks, shape, strict=True))
    else:
        assert out == shards


@pytest.mark.slow  # 15 writes and reads: about 12 s, the slowest test of the fast lane
@given(
    shape=st.lists(st.integers(1, 70), min_size=1, max_size=3).map(tuple),
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
)
@examples(15)
def test_write_array_default_layout_reads_back(
    shape: tuple[int, ...], dtype: str, data: st.DataObject
) -> None:
    shards = data.draw(given_shards(shape))
    x = (np.arange(math.prod(shape)) % 7).astype(dtype).reshape(shape)
    store = MemoryStore()
    # small byte targets are not reachable through write_array: the defaults hold as is
    shardwise.write_array(x, store, **({} if shards is None else {"shards": shards}))
    chunks, stored_shards = _stored_layout(store)
    assert (chunks, stored_shards) == default_layout(shape, x.itemsize, None, shards)
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[...], x)


def test_write_array_without_shards_picks_what_to_zarr_picks() -> None:
    # 96 MB of fill values: more than one shard, and nothing to store
    x = da.zeros((6000, 4000), dtype="float32", chunks=(1000, 4000))
    a, b = MemoryStore(), MemoryStore()
    shardwise.write_array(x, a)
    shardwise.to_zarr(xr.Dataset({"v": (("t", "y"), x)}), b)
    assert _stored_layout(a) == _stored_layout(b, "v") == default_layout(x.shape, 4)
    assert _stored_layout(a)[1] != x.shape  # a real sharding, not one object
    small = np.arange(3000 * 70, dtype="float32").reshape(3000, 70)
    shardwise.write_array(small, a, mode="w")
    assert _stored_layout(a) == default_layout(small.shape, 4)
    np.testing.assert_array_equal(zarr.open_array(a, mode="r")[...], small)


@pytest.mark.parametrize(
    ("shape", "shards"), [((1000, 1000), (300, 300)), ((4096, 4096), (2048, 3000))]
)
def test_auto_chunks_divide_given_shards(shape: tuple[int, int], shards: tuple[int, int]) -> None:
    x = np.arange(math.prod(shape), dtype="float32").reshape(shape)
    store = MemoryStore()
    shardwise.write_array(x, store, chunks="auto", shards=shards)
    chunks, stored_shards = _stored_layout(store)
    assert stored_shards == shards
    assert all(s % c == 0 for s, c in zip(shards, chunks, strict=True))
    assert math.prod(chunks) * 4 <= DEFAULT_CHUNK_BYTES
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[...], x)
