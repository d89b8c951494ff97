"""Properties of the pure parts: shard-grid math (layout), the write plan, range coalescing.

Everything is checked against brute force on small grids; no store, dask or zarr involved.
"""

from __future__ import annotations

import itertools
import math
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardwise.core.layout import (
    Layout,
    Region,
    intersect,
    is_aligned,
    normalize_region,
    shift,
)
from shardwise.core.plan import ShardPlan
from shardwise.engine.read import coalesce
from shardwise.errors import InvalidValueError
from strategies import Geometry, examples, geometries, regions


def layout_of(g: Geometry, **kwargs: Any) -> Layout:
    return Layout(shape=g.shape, shard_shape=g.shard_shape, chunk_shape=g.chunk_shape, **kwargs)


@st.composite
def layouts_and_regions(draw: st.DrawFn, allow_empty: bool = True) -> tuple[Layout, Region]:
    g = draw(geometries())
    return layout_of(g), draw(regions(g.shape, allow_empty))


def cells(region: Region) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(s.start, s.stop) for s in region)))


def overlaps(a: Region, b: Region) -> bool:
    return all(max(x.start, y.start) < min(x.stop, y.stop) for x, y in zip(a, b, strict=True))


# -- layout --------------------------------------------------------------------------------------


@examples(60)
@given(g=geometries())
def test_shards_partition_the_array(g: Geometry) -> None:
    lay = layout_of(g)
    count = np.zeros(g.shape, dtype=np.int32)
    coords = list(lay.shards())
    assert coords == sorted(coords)  # C order
    assert len(coords) == lay.nshards == math.prod(lay.shard_grid)
    for coord in coords:
        region = lay.shard_region(coord)
        assert all(0 <= s.start < s.stop <= n for s, n in zip(region, g.shape, strict=True))
        assert all(s.stop - s.start <= e for s, e in zip(region, g.shard_shape, strict=True)), (
            "a shard region is larger than the shard"
        )
        count[region] += 1
    assert (count == 1).all()
    assert lay.chunks_per_shard == g.chunks_per_shard
    assert lay.nchunks_per_shard == math.prod(g.chunks_per_shard)


@examples(40)
@given(g=geometries(), sep=st.sampled_from(["/", "."]))
def test_shard_keys_are_unique_and_formatted(g: Geometry, sep: Any) -> None:
    default = layout_of(g, separator=sep)
    v2 = layout_of(g, separator=sep, key_encoding="v2")
    keys = [default.shard_key(c) for c in default.shards()]
    assert len(set(keys)) == len(keys)
    for coord, key in zip(default.shards(), keys, strict=True):
        assert key == sep.join(["c", *map(str, coord)])
        assert v2.shard_key(coord) == sep.join(map(str, coord))


def test_zero_dimensional_keys() -> None:
    assert Layout((), (), ()).shard_key(()) == "c"
    assert Layout((), (), (), key_encoding="v2").shard_key(()) == "0"
    assert list(Layout((), (), ()).shards()) == [()]


def test_zero_length_dimension_has_no_shards() -> None:
    lay = Layout((0, 5), (4, 4), (2, 2))
    assert lay.shard_grid == (0, 2) and lay.nshards == 0 and list(lay.shards()) == []


@examples(60)
@given(case=layouts_and_regions())
def test_shards_touching_matches_brute_force(case: tuple[Layout, Region]) -> None:
    lay, region = case
    want = {c for c in lay.shards() if overlaps(lay.shard_region(c), region)}
    got = list(lay.shards_touching(region))
    assert len(got) == len(set(got))
    assert set(got) == want


@examples(40)
@given(g=geometries())
def test_chunks_in_array(g: Geometry) -> None:
    lay = layout_of(g)
    for shard in lay.shards():
        region = lay.shard_region(shard)
        extents = [s.stop - s.start for s in region]
        want = tuple(-(-e // c) for e, c in zip(extents, g.chunk_shape, strict=True))
        assert lay.chunks_in_array(shard) == want


@examples(60)
@given(data=st.data())
def test_intersect_and_shift(data: st.DataObject) -> None:
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    a, b = data.draw(regions(shape)), data.draw(regions(shape))
    got = intersect(a, b)
    want = cells(a) & cells(b)
    if got is None:
        assert not want
    else:
        assert cells(got) == want and got == intersect(b, a)
    origin = tuple(data.draw(st.integers(0, 5)) for _ in shape)
    moved = shift(a, origin)
    back = shift(moved, tuple(-o for o in origin))
    assert back == a


slices = st.builds(
    slice,
    st.none() | st.integers(-8, 8),
    st.none() | st.integers(-8, 8),
    st.none() | st.just(1),
)


@examples(60)
@given(n=st.integers(0, 8), sl=slices)
def test_normalize_region_follows_python_slicing(n: int, sl: slice) -> None:
    if sl.stop is not None and sl.stop > n:
        with pytest.raises(InvalidValueError, match="outside the array extent"):
            normalize_region((sl,), (n,))
        return
    (got,) = normalize_region((sl,), (n,))
    assert got.step is None and 0 <= got.start <= got.stop <= n
    assert list(range(got.start, got.stop)) == list(range(n))[sl]


def test_normalize_region_refuses_steps_and_wrong_ndim() -> None:
    with pytest.raises(InvalidValueError, match="step 1"):
        normalize_region((slice(0, 4, 2),), (8,))
    with pytest.raises(InvalidValueError, match="2 dimensions"):
        normalize_region((slice(None), slice(None)), (8,))


@examples(60)
@given(case=layouts_and_regions())
def test_is_aligned_matches_brute_force(case: tuple[Layout, Region]) -> None:
    lay, region = case

    def edge_ok(x: int, s: int, n: int) -> bool:
        return x % s == 0 or x == n

    want = all(
        sl.start % s == 0 and edge_ok(sl.stop, s, n)
        for sl, s, n in zip(region, lay.shard_shape, lay.shape, strict=True)
    )
    assert is_aligned(region, lay) == want


@pytest.mark.parametrize(
    ("shape", "shards", "chunks", "match"),
    [
        ((8, 8), (4, 4), (3, 2), "whole multiple"),
        ((8, 8), (4, 4), (0, 2), "whole multiple"),
        ((8, 8), (4,), (2, 2), "same number of dimensions"),
        ((8,), (4,), (2, 2), "same number of dimensions"),
    ],
)
def test_invalid_layouts_are_refused(
    shape: tuple[int, ...], shards: tuple[int, ...], chunks: tuple[int, ...], match: str
) -> None:
    with pytest.raises(InvalidValueError, match=match):
        Layout(shape, shards, chunks)


# -- write plan ----------------------------------------------------------------------------------


@examples(60)
@given(case=layouts_and_regions(allow_empty=False))
def test_plan_gives_each_touched_shard_exactly_one_task(case: tuple[Layout, Region]) -> None:
    lay, region = case
    plan = ShardPlan(lay, region)
    chunks = plan.task_chunks
    for sl, c, s in zip(region, chunks, lay.shard_shape, strict=True):
        assert sum(c) == sl.stop - sl.start and all(x > 0 for x in c)
        cuts = np.cumsum((sl.start, *c))
        # every inner cut is a shard boundary, so no task piece straddles two shards
        assert all(x % s == 0 for x in cuts[1:-1])
    tasks = list(itertools.product(*(range(len(c)) for c in chunks)))
    assert plan.ntasks == len(tasks)
    shards = [plan.shard_of_task(t) for t in tasks]
    assert len(set(shards)) == len(shards), "two tasks own the same shard"
    assert set(shards) == set(lay.shards_touching(region))

    partial = 0
    for task, shard in zip(tasks, shards, strict=True):
        sreg = lay.shard_region(shard)
        overlap = intersect(sreg, region)
        assert overlap is not None
        piece = plan.piece_in_shard(shard)
        assert piece == shift(overlap, [s.start for s in sreg])
        # the piece has the extent of the task's block
        assert tuple(p.stop - p.start for p in piece) == tuple(
            c[i] for c, i in zip(chunks, task, strict=True)
        )
        covers = overlap == sreg
        assert plan.covers(shard) == covers
        partial += not covers
    assert plan.npartial == partial
    assert plan.aligned == is_aligned(region, lay)
    if plan.aligned:
        assert plan.npartial == 0
    assert f"{plan.ntasks} shard tasks" in str(plan)
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_plan_of_the_zep2_example_is_small() -> None:
    """uint8 25000x18000x6000, 64^3 inner chunks, 2048^3 shards: one task per shard."""
    lay = Layout((25000, 18000, 6000), (2048,) * 3, (64,) * 3)
    plan = ShardPlan(lay, tuple(slice(0, n) for n in lay.shape))
    assert plan.ntasks == lay.nshards == 13 * 9 * 3
    assert plan.npartial == 0 and plan.aligned
    inner = ShardPlan(lay, (slice(100, 5000), slice(0, 18000), slice(2048, 4096)))
    assert inner.ntasks == 3 * 9 * 1 and inner.npartial == 2 * 9


# -- coalescing byte ranges ----------------------------------------------------------------------


@st.composite
def disjoint_ranges(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Non-overlapping (offset, nbytes) ranges in random order, as a valid shard index has."""
    pairs = draw(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 300)), max_size=30))
    out, pos = [], 0
    for gap, n in pairs:
        out.append((pos + gap, n))
        pos += gap + n
    return draw(st.permutations(out))


@examples(60)
@given(ranges=disjoint_ranges(), max_gap=st.integers(0, 200), max_len=st.integers(1, 2000))
def test_coalesce_covers_every_range(
    ranges: list[tuple[int, int]], max_gap: int, max_len: int
) -> None:
    merged, where = coalesce(ranges, max_gap=max_gap, max_len=max_len)
    assert len(where) == len(ranges)
    for (o, n), (m, a, b) in zip(ranges, where, strict=True):
        mo, mn = merged[m]
        assert mo + a == o and b - a == n and a >= 0 and b <= mn
    for (o1, n1), (o2, _) in itertools.pairwise(merged):
        assert o1 + n1 <= o2, "merged ranges overlap"
    # a merged range only grows past max_len by a single input range
    longest = max((n for _, n in ranges), default=0)
    assert all(n <= max(max_len, longest) for _, n in merged)
    # each merge reads at most max_gap bytes nobody asked for
    asked = sum(n for _, n in ranges)
    assert sum(n for _, n in merged) <= asked + max_gap * (len(ranges) - len(merged))


def test_parse_shard_key_refuses_what_is_not_a_key_of_the_grid() -> None:
    lay = Layout((10, 10), (4, 4), (2, 2))
    assert lay.parse_shard_key("c/2/1") == (2, 1)
    for bad in ("c/3/0", "c/1", "c/1/x", "d/1/1", "c/01/1", "zarr.json"):
        assert lay.parse_shard_key(bad) is None
    v2 = Layout((10, 10), (4, 4), (2, 2), separator=".", key_encoding="v2")
    assert v2.parse_shard_key("2.1") == (2, 1) and v2.parse_shard_key("c.2.1") is None


@pytest.mark.parametrize(
    ("separator", "encoding"), [("/", "default"), (".", "default"), (".", "v2"), ("/", "v2")]
)
@pytest.mark.parametrize("shape", [(), (7,), (10, 9), (5, 1, 6)])
def test_shard_keys_read_back_to_their_shards(
    shape: tuple[int, ...], separator: str, encoding: Any
) -> None:
    """``parse_shard_key`` inverts ``shard_key`` over every shard of the grid, 0-d included."""
    lay = Layout(
        shape,
        tuple(max(1, n // 2) for n in shape),
        tuple(1 for _ in shape),
        separator=separator,
        key_encoding=encoding,
    )
    coords = list(lay.shards())
    assert coords and all(lay.parse_shard_key(lay.shard_key(c)) == c for c in coords)
