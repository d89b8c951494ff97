"""Default layouts: ``write_array`` and ``to_zarr`` pick shards and inner chunks by one rule,
and default inner chunks always divide the shards (given or picked); shard sizes given with
inner chunks are rounded up to whole chunks (``whole_chunks``), and ``shards=`` is parsed and
checked once (``core/shardspec.py``).

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
from shardwise.core.planner import COMPACT_CHUNK_BYTES, default_layout
from shardwise.core.shardspec import check_names, check_shards, parse_shards, shards_for
from shardwise.core.sizing import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_SHARD_BYTES,
    shrink_to_fit,
    whole_chunks,
)
from shardwise.errors import InvalidTypeError, InvalidValueError
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
    limit = DEFAULT_CHUNK_BYTES if shards is None else COMPACT_CHUNK_BYTES
    assert math.prod(chunks) * itemsize <= limit or max(chunks) == 1
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
    assert math.prod(chunks) * 4 <= COMPACT_CHUNK_BYTES  # the planner's compact chunks
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[...], x)


# -- shard sizes that are not whole chunks: one rule (rounded up) -------------------------------


@given(pairs=st.lists(st.tuples(st.integers(1, 500), st.integers(1, 60)), min_size=1, max_size=4))
@examples(200)
def test_whole_chunks_is_the_smallest_multiple_at_least_the_size(
    pairs: list[tuple[int, int]],
) -> None:
    shards, chunks = (tuple(p) for p in zip(*pairs, strict=True))
    out = whole_chunks(shards, chunks)
    for s, c, o in zip(shards, chunks, out, strict=True):
        assert o % c == 0 and s <= o < s + c
    assert whole_chunks(out, chunks) == out  # shapes of whole chunks are kept
    # both given: default_layout (write_array, to_zarr) applies the same rule
    assert default_layout((1000,) * len(chunks), 4, chunks, shards) == (chunks, out)


def test_whole_chunks_leaves_what_cannot_be_rounded_to_the_callers_checks() -> None:
    assert whole_chunks((10, 0), (4, 4)) == (10, 0)
    assert whole_chunks((10,), (4, 4)) == (10,)


def test_write_array_rounds_shards_up_to_whole_chunks() -> None:
    x = np.arange(37 * 50, dtype="i2").reshape(37, 50)
    store = MemoryStore()
    shardwise.write_array(x, store, chunks=(8, 10), shards=(12, 25))
    assert _stored_layout(store) == ((8, 10), (16, 30))
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[...], x)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("256,256,64", (256, 256, 64)),
        ("16x20", (16, 20)),
        (" 4 , 5 ", (4, 5)),
        ("4,0", (4, 0)),  # parsed; check_shards refuses the size
        ("time=365", {"time": 365}),
        ("time=365, lat = 90", {"time": 365, "lat": 90}),
        ("x=4", {"x": 4}),
        ("time=-1", {"time": -1}),
    ],
)
def test_parse_shards(text: str, parsed: Any) -> None:
    assert parse_shards(text) == parsed


@pytest.mark.parametrize("text", ["", "4,,4", "a,b", "time=a", "=4", "time=4,time=5", "4,x=4"])
def test_parse_shards_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(InvalidValueError, match="shards must be sizes like 256,256,64"):
        parse_shards(text)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ((4, 0), InvalidValueError),
        ((4, -1), InvalidValueError),
        ((), InvalidValueError),
        ((4.5, 2), InvalidValueError),
        ((True, 2), InvalidValueError),
        ({"time": 0}, InvalidValueError),
        ({"time": "365"}, InvalidValueError),
        ({1: 365}, InvalidTypeError),
        ("4,4", InvalidValueError),  # strings are targets ("2GB", "XY"): this is none
        (4, InvalidTypeError),
    ],
)
def test_check_shards_refuses_bad_sizes(value: Any, error: type) -> None:
    with pytest.raises(error, match="shards must be"):
        check_shards(value)


def test_check_shards_accepts_shapes_and_names() -> None:
    assert check_shards(None) is None
    assert check_shards([np.int64(4), 5]) == (4, 5)
    assert check_shards({"time": np.int32(365)}) == {"time": 365}


def test_shards_for_applies_or_refuses() -> None:
    assert shards_for((12, 25), (37, 50), (8, 10), 2, None, None, name="a") == (16, 30)
    # named dimensions rounded, the others sized to the byte target (here: one chunk of x)
    assert shards_for({"t": 9}, (37, 50), (8, 10), 2, ("t", "x"), 320, name="a") == (16, 10)
    with pytest.raises(InvalidValueError, match=r"array 'a' has 2 dimension\(s\)"):
        shards_for((12,), (37, 50), (8, 10), 2, None, None, name="a")
    with pytest.raises(InvalidValueError, match="array 'a' has no dimension names"):
        shards_for({"t": 9}, (37, 50), (8, 10), 2, None, None, name="a")
    with pytest.raises(InvalidValueError, match=r"\['tme'\] that the group does not have"):
        check_names({"tme": 9}, [("a", ("t", "x")), ("b", None)], "the group")
    check_names({"t": 9}, [("a", ("t", "x")), ("b", ("x",))], "the group")  # b: not named


def test_shardspec_doctests() -> None:
    import doctest

    import shardwise.core.shardspec

    result = doctest.testmod(shardwise.core.shardspec)
    assert result.attempted == 4 and result.failed == 0


def _halvings(n: int) -> set[int]:
    out = {n}
    while n > 1:
        n = -(-n // 2)
        out.add(n)
    return out


@given(
    st.lists(st.integers(1, 5000), min_size=1, max_size=4),
    st.integers(1, 16),
    st.integers(1, 2**24),
    st.data(),
)
def test_shrink_to_fit_halves_the_largest_free_axis_until_it_fits(
    counts: list[int], unit: int, target: int, data: Any
) -> None:
    """The one shrink rule: the result fits the target unless every free axis is down to 1;
    fixed axes keep their count; a free axis is only ever halved (rounded up), and never below
    half of the largest free count it leaves (the largest axis is the one cut)."""
    free = data.draw(st.lists(st.sampled_from(range(len(counts))), unique=True))
    got = shrink_to_fit(counts, unit, target, axes=free)
    assert math.prod(got) * unit <= target or all(got[i] == 1 for i in free)
    assert all(got[i] == counts[i] for i in range(len(counts)) if i not in free)
    assert all(got[i] in _halvings(counts[i]) for i in free)
    cut = [i for i in free if got[i] < counts[i]]
    assert all(2 * got[i] >= max(got[j] for j in free) for i in cut)


def test_shrink_to_fit_takes_the_next_step_it_is_given() -> None:
    divisors = {0: [1, 2, 3, 4, 6, 12], 1: [1, 5]}

    def next_divisor(i: int, n: int) -> int:
        return max(d for d in divisors[i] if d <= n // 2)

    # 12 -> 6 (the largest) -> 3, then 5 is the largest -> 1: 3 units fit 10
    assert shrink_to_fit([12, 5], 1, 10, step=next_divisor) == [3, 1]
    assert shrink_to_fit([12, 5], 1, 1000, step=next_divisor) == [12, 5]
