"""Rectilinear shard grids in the layout: every answer against a brute-force numpy oracle.

A grid is drawn per axis: regular (a shard length) or rectilinear (shard extents, each a whole
number of inner chunks, summing to at least the axis). The oracle labels every element with
the shard that holds it (``np.repeat`` of the extents) and reads the answers off the labels.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardwise.core.layout import Layout, Region, is_aligned
from shardwise.core.plan import ShardPlan
from shardwise.errors import InvalidValueError
from strategies import examples


@st.composite
def axes(draw: st.DrawFn) -> tuple[int, int | list[int], int]:
    """(extent, shard sizes (an int: regular), inner chunk) of one axis."""
    c = draw(st.integers(1, 4))
    if draw(st.booleans()):
        s = c * draw(st.integers(1, 4))
        return draw(st.integers(0, 30)), s, c
    sizes = [c * k for k in draw(st.lists(st.integers(1, 5), min_size=1, max_size=7))]
    total = sum(sizes)
    # the extent may stop short of the last edges (the spec allows edges beyond the array)
    return draw(st.integers(max(0, total - 2 * max(sizes)), total)), sizes, c


@st.composite
def grids(draw: st.DrawFn) -> tuple[Layout, list[np.ndarray]]:
    """A layout and, per axis, the shard index of every element (the oracle)."""
    drawn = draw(st.lists(axes(), min_size=1, max_size=3))
    lay = Layout.rectilinear(
        [n for n, _, _ in drawn], [s for _, s, _ in drawn], [c for *_, c in drawn]
    )
    owners = []
    for n, s, _ in drawn:
        sizes = [s] * (n // s + 1) if isinstance(s, int) else s
        owners.append(np.repeat(np.arange(len(sizes)), sizes)[:n])
        EDGES[id(owners[-1])] = set(itertools.accumulate(sizes, initial=0))
    return lay, owners


@st.composite
def grids_and_regions(draw: st.DrawFn) -> tuple[Layout, list[np.ndarray], Region]:
    lay, owners = draw(grids())
    region = []
    for n in lay.shape:
        a = draw(st.integers(0, n))
        region.append(slice(a, draw(st.integers(a, n))))
    return lay, owners, tuple(region)


# per oracle axis (by the id of its labels): every shard boundary of the grid drawn
EDGES: dict[int, set[int]] = {}


@examples(80)
@given(case=grids())
def test_shards_and_their_regions_match_the_oracle(case: tuple[Layout, list[np.ndarray]]) -> None:
    lay, owners = case
    assert lay.shard_grid == tuple(len(np.unique(o)) if len(o) else 0 for o in owners)
    assert lay.dask_chunks() == tuple(tuple(np.bincount(o).tolist()) or (0,) for o in owners)
    for coord in lay.shards():
        region = lay.shard_region(coord)
        for sl, o, i in zip(region, owners, coord, strict=True):
            where = np.flatnonzero(o == i)
            assert (sl.start, sl.stop) == (where[0], where[-1] + 1)
        extent = lay.shard_extent(coord)
        assert all(e >= sl.stop - sl.start for e, sl in zip(extent, region, strict=True))
        assert all(e % c == 0 for e, c in zip(extent, lay.chunk_shape, strict=True))
        assert lay.parse_shard_key(lay.shard_key(coord)) == coord
        assert lay.shard_origin(coord) == tuple(sl.start for sl in region)


@examples(80)
@given(case=grids_and_regions())
def test_covering_shards_and_alignment_match_the_oracle(
    case: tuple[Layout, list[np.ndarray], Region],
) -> None:
    lay, owners, region = case
    want = set(
        itertools.product(
            *(np.unique(o[sl]).tolist() for o, sl in zip(owners, region, strict=True))
        )
    )
    assert set(lay.shards_touching(region)) == want
    aligned = all(
        sl.start in EDGES[id(o)] and (sl.stop in EDGES[id(o)] or sl.stop == len(o))
        for o, sl in zip(owners, region, strict=True)
    )
    assert is_aligned(region, lay) == aligned
    for d, (o, sl) in enumerate(zip(owners, region, strict=True)):
        cuts = lay.axis_cuts(d, sl.start, sl.stop)
        assert cuts == tuple(np.bincount(o[sl] - o[sl][0]).tolist() if sl.stop > sl.start else ())
        for pos in range(len(o)):
            assert lay.axis_index(d, pos) == o[pos]


@examples(60)
@given(case=grids_and_regions())
def test_a_plan_cuts_the_region_at_the_oracles_edges(
    case: tuple[Layout, list[np.ndarray], Region],
) -> None:
    lay, owners, region = case
    plan = ShardPlan(lay, region)
    for chunks, o, sl in zip(plan.task_chunks, owners, region, strict=True):
        assert sum(chunks) == sl.stop - sl.start
        assert chunks == (tuple(np.bincount(o[sl] - o[sl][0]).tolist()) if len(o[sl]) else ())
    for task in itertools.product(*(range(len(c)) for c in plan.task_chunks)):
        shard = plan.shard_of_task(task)
        piece = plan.piece_in_shard(shard)
        origin = lay.shard_origin(shard)
        for p, o, sl, d in zip(piece, origin, region, range(lay.ndim), strict=True):
            elems = np.arange(p.start + o, p.stop + o)
            assert (owners[d][elems] == shard[d]).all()
            assert sl.start <= elems[0] and elems[-1] < sl.stop


@examples(60)
@given(case=grids(), data=st.data())
def test_inner_chunks_map_to_their_shard(case: tuple[Layout, list[np.ndarray]], data: Any) -> None:
    lay, owners = case
    for d, (o, c) in enumerate(zip(owners, lay.chunk_shape, strict=True)):
        if not len(o):
            continue
        chunks = np.arange(0, -(-len(o) // c))
        shards, local = lay.chunk_shards(d, chunks)
        assert (shards == o[chunks * c]).all()
        starts = np.array([lay.axis_bound(d, int(s)) for s in shards])
        assert (local == (chunks * c - starts) // c).all()


def test_regular_axes_stay_arithmetic() -> None:
    """A million-shard regular grid holds no edges; an all-regular rectilinear call is regular."""
    lay = Layout((10**9, 10), (1000, 10), (100, 10))
    assert lay.shard_grid == (10**6, 1) and lay.is_regular and lay.axis_edges(0) is None
    assert lay.shard_region((999_999, 0)) == (slice(999_999_000, 10**9), slice(0, 10))
    assert Layout.rectilinear((10, 10), (4, 5), (2, 5)) == Layout((10, 10), (4, 5), (2, 5))
    mixed = Layout.rectilinear((10**9, 9), (1000, [4, 5]), (100, 1))
    assert mixed.axis_edges(0) is None and mixed.axis_edges(1) == (0, 4, 9)
    assert mixed.grid_json()["configuration"]["chunk_shapes"] == [1000, [4, 5]]


def test_inner_chunks_must_divide_every_shard() -> None:
    with pytest.raises(InvalidValueError, match=r"\[60, 45\].*inner chunk size 10"):
        Layout.rectilinear((105,), ([60, 45],), (10,))
    with pytest.raises(InvalidValueError, match="sum to 90, less than the array's 100"):
        Layout.rectilinear((100,), ([60, 30],), (10,))


def test_grid_json_is_run_length_encoded_as_zarr_writes_it() -> None:
    from zarr.core.metadata.v3 import RectilinearChunkGridMetadata

    lay = Layout.rectilinear(
        (365, 7), ([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], 7), (1, 7)
    )
    want = RectilinearChunkGridMetadata(chunk_shapes=(tuple(lay.axis_sizes(0)), 7)).to_dict()
    assert lay.grid_json() == json.loads(json.dumps(want))
    assert lay.grid_json()["configuration"]["chunk_shapes"][0][-5:] == [[31, 2], 30, 31, 30, 31]
