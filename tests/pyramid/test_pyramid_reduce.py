"""The reductions and the pyramid geometry against independent references, drawn by
hypothesis: exact integer means (Python integers) at every value a dtype holds, float means
bit for bit as float64 sums axis by axis, the same means slab by slab as at once, the
temporaries of a block's mean bounded by the slab and not the block, the mode by counting,
nearest by slicing, and the chunk arithmetic the levels' graph relies on; data a method cannot
reduce refused."""

from __future__ import annotations

import collections
import functools
import itertools
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import shardwise
from shardwise.core.pyramid import aligned_chunks, pyramid_levels, reduced_chunks
from shardwise.errors import InvalidValueError
from shardwise.pyramid.reduce import SLAB_BYTES, mean, mode, nearest

INTS = st.sampled_from(["uint8", "int8", "uint16", "int16", "int32", "uint32", "int64", "uint64"])


@st.composite
def cases(draw: st.DrawFn, dtypes: st.SearchStrategy[str]) -> tuple[np.ndarray, tuple[int, ...]]:
    """An array of 1 to 3 axes (sizes 1 to 9) of any value of its dtype, and a factor per
    axis (1 to 4)."""
    dtype = np.dtype(draw(dtypes))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9))
    info = np.iinfo(dtype)
    # mostly the extremes: where sums overflow
    values = st.one_of(
        st.sampled_from([info.min, info.max, info.min + 1, info.max - 1]),
        st.integers(info.min, info.max),
    )
    x = draw(hnp.arrays(dtype, shape, elements=values))
    factors = tuple(draw(st.integers(1, 4)) for _ in shape)
    return x, factors


def blocks(x: np.ndarray, factors: tuple[int, ...]) -> dict[tuple[int, ...], np.ndarray]:
    """Every block of the ceil rule, by its output index."""
    shape = tuple(-(-n // f) for n, f in zip(x.shape, factors, strict=True))
    return {
        idx: x[tuple(slice(i * f, (i + 1) * f) for i, f in zip(idx, factors, strict=True))]
        for idx in np.ndindex(*shape)
    }


LOWEST = np.iinfo("int64").min


@settings(max_examples=300, deadline=None)
@given(cases(INTS))
# floored quotients by 3 of the int64 minimum sum past it: the quotients round toward zero
@example((np.full(3, LOWEST, dtype="int64"), (3,)))
@example((np.array([LOWEST, LOWEST, LOWEST, 5], dtype="int64"), (3,)))
def test_integer_mean_is_the_exact_mean_rounded_half_to_even(
    case: tuple[np.ndarray, tuple[int, ...]],
) -> None:
    x, factors = case
    got = mean(x, factors)
    assert got.dtype == x.dtype
    for idx, block in blocks(x, factors).items():
        q, r = divmod(sum(int(v) for v in block.ravel()), block.size)
        want = q + (2 * r > block.size or (2 * r == block.size and q % 2 == 1))
        assert int(got[idx]) == want, (idx, block)


FLOATS = st.sampled_from(["float16", "float32", "float64", "complex64"])


@st.composite
def float_cases(draw: st.DrawFn) -> tuple[np.ndarray, tuple[int, ...]]:
    """A float array of 1 to 3 axes (sizes 1 to 9), any finite value, a factor per axis."""
    dtype = np.dtype(draw(FLOATS))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9))
    width = 32 if dtype.kind == "c" else dtype.itemsize * 8
    # float64 sums of float64 data near its largest value overflow (to inf, warning), as any
    # float64 sum does: values up to 1e300 keep four samples' sums finite
    bound = 1e300 if width == 64 else None
    elements = st.floats(
        -bound if bound else None, bound, allow_nan=False, allow_infinity=False, width=width
    )
    real = hnp.arrays(np.dtype(f"float{width}"), shape, elements=elements)
    x = draw(real).astype(dtype)
    if dtype.kind == "c":
        x.imag = draw(real)
    return x, tuple(draw(st.integers(1, 4)) for _ in shape)


@settings(max_examples=300, deadline=None)
@given(float_cases())
def test_float_mean_is_the_float64_sum_axis_by_axis_cast_back(
    case: tuple[np.ndarray, tuple[int, ...]],
) -> None:
    """The documented rule, bit for bit: each axis in order, a block's samples added left to
    right in float64 (complex128), divided by the block's count, cast to the dtype."""
    x, factors = case
    wide = np.result_type(x.dtype, np.float64)
    sums, counts = x.astype(wide), np.ones((1,) * x.ndim)
    for axis, f in enumerate(factors):
        moved = np.moveaxis(sums, axis, 0)
        blocks = [moved[i : i + f] for i in range(0, moved.shape[0], f)]
        # np.add.reduceat does not add left to right: each block's rows one after the other
        sums = np.moveaxis(np.stack([functools.reduce(np.add, list(b)) for b in blocks]), 0, axis)
        sizes = np.array([len(b) for b in blocks])
        counts = counts * sizes.reshape([-1 if i == axis else 1 for i in range(x.ndim)])
    want = (sums / counts).astype(x.dtype)
    got = mean(x, factors)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(st.one_of(cases(INTS), float_cases()))
def test_the_mean_by_slabs_is_the_mean_at_once(case: tuple[np.ndarray, tuple[int, ...]]) -> None:
    """Slabs of one block row along the first axis (the smallest there is) give every sample
    the whole array at once gives, partial last blocks included."""
    x, factors = case
    at_once = mean(x, factors, slab=x.nbytes + 1)
    np.testing.assert_array_equal(mean(x, factors, slab=1), at_once)


@pytest.mark.parametrize("dtype", ["uint16", "float32", "int8"])
def test_a_block_mean_holds_temporaries_of_its_slab_not_of_its_block(dtype: str) -> None:
    """What a reduction allocates besides its output (numpy reports its buffers to
    tracemalloc) stays within a few slabs for blocks of 4 and 16 MiB alike: a pyramid task's
    memory does not grow with the shard. Sums in a float64 or int64 copy of the block took
    2x to 8x the block."""
    extra = []
    for z in (64, 256):
        x = np.arange(z * 128 * 256 // np.dtype(dtype).itemsize, dtype=np.int64)
        x = (x % 1000).astype(dtype).reshape(z, 128, -1)
        tracemalloc.start()
        try:
            out = mean(x, (2, 2, 2))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert x.nbytes == z << 15 and out.shape == tuple(-(-n // 2) for n in x.shape)
        extra.append(peak - out.nbytes)
    assert max(extra) <= 4 * SLAB_BYTES, extra


@settings(max_examples=200, deadline=None)
@given(cases(st.sampled_from(["uint8", "int16", "int64"])))
def test_mode_is_the_most_frequent_value_the_smallest_on_ties(
    case: tuple[np.ndarray, tuple[int, ...]],
) -> None:
    x, factors = case
    x = x % 4  # labels: few values, many ties
    got = mode(x, factors)
    for idx, block in blocks(x, factors).items():
        counts = collections.Counter(block.ravel().tolist())
        assert got[idx] == min(counts, key=lambda v: (-counts[v], v))


LABELS = [np.nan, 0.0, -0.0, 1.5, 5.0, -2.0, np.inf, -np.inf]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["float16", "float32", "float64"]).flatmap(
        lambda dt: st.tuples(
            hnp.arrays(
                dt,
                hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9),
                elements=st.sampled_from(LABELS),
            ),
            st.lists(st.integers(1, 4), min_size=3, max_size=3),
        )
    )
)
@example((np.array([np.nan, np.nan, np.nan, 5.0]), [4, 1, 1]))
@example((np.array([np.nan, np.nan, 5.0, 5.0]), [4, 1, 1]))
def test_mode_counts_nan_as_a_value(case: tuple[np.ndarray, list[int]]) -> None:
    """Against numpy's own count of a block's values (``np.unique`` with ``equal_nan``: NaN
    one value, sorted after every number): the first of the most frequent."""
    x, drawn = case
    factors = tuple(drawn[: x.ndim])
    got = mode(x, factors)
    assert got.dtype == x.dtype
    for idx, block in blocks(x, factors).items():
        values, counts = np.unique(block.ravel(), return_counts=True, equal_nan=True)
        np.testing.assert_array_equal(got[idx], values[np.argmax(counts)], err_msg=f"{block}")


@settings(max_examples=100, deadline=None)
@given(cases(st.sampled_from(["int32"])))
def test_nearest_is_each_blocks_first_sample(case: tuple[np.ndarray, tuple[int, ...]]) -> None:
    x, factors = case
    got = nearest(x, factors)
    for idx, block in blocks(x, factors).items():
        assert got[idx] == block.flat[0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=8),
    st.integers(1, 5),
)
def test_aligned_chunks_cut_only_at_multiples_and_keep_the_length(
    chunks: list[int], factor: int
) -> None:
    out = aligned_chunks(chunks, factor)
    assert sum(out) == sum(chunks) and all(c > 0 for c in out)
    assert all(e % factor == 0 for e in list(itertools.accumulate(out))[:-1])
    # the reduced chunks add up to the ceil of the length: the next level's shape
    assert sum(reduced_chunks(out, factor)) == -(-sum(chunks) // factor)


@given(st.lists(st.integers(1, 300), min_size=2, max_size=3), st.integers(1, 6))
def test_level_shapes_follow_the_ceil_rule(shape: list[int], n: int) -> None:
    levels = pyramid_levels(tuple(shape), (2,) * len(shape), n, centered=True)
    for a, b in itertools.pairwise(levels):
        for na, nb, fa, fb in zip(a.shape, b.shape, a.factors, b.factors, strict=True):
            step = fb // fa
            assert nb == -(-na // step) and step == (2 if na > 1 else 1)
    for lv in levels:
        assert lv.scale == tuple(float(f) for f in lv.factors)
        assert lv.translation == tuple((f - 1) / 2 for f in lv.factors)


def test_data_the_method_cannot_reduce_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match="'nearest' or 'mode'"):
        shardwise.write_pyramid(np.zeros((8, 8), bool), tmp_path / "b")
    with pytest.raises(InvalidValueError, match="2-D to 5-D"):
        shardwise.write_pyramid(np.zeros((2,) * 6), tmp_path / "b")
    assert not (tmp_path / "b").exists()
    # labels as bools reduce by mode
    shardwise.write_pyramid(np.eye(8, dtype=bool), tmp_path / "b", levels=2, method="mode")
    level = zarr.open_array(tmp_path / "b", path="1", mode="r")[...]
    np.testing.assert_array_equal(level, mode(np.eye(8, dtype=bool), (2, 2)))
    assert level.dtype == bool and level.shape == (4, 4)
