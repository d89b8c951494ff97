"""region= takes one Ellipsis wherever a selection does (core.layout.normalize_region, the one
normalizer behind write_array, plan_write and batch.init's parts): it writes exactly what the
expanded region writes, and a region it cannot take is refused before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardwise
from faultkit import files, snapshot
from shardwise import batch
from shardwise.core.layout import normalize_region
from shardwise.errors import InvalidValueError
from strategies import Geometry, examples, geometries, regions


@st.composite
def with_ellipsis(
    draw: st.DrawFn, shape: tuple[int, ...]
) -> tuple[tuple[Any, ...], tuple[slice, ...]]:
    """A region with a run of its dimensions (possibly none) given by one Ellipsis, and the same
    region spelled out: whole-dimension slices where the Ellipsis stands."""
    region = draw(regions(shape))
    n = len(shape)
    i = draw(st.integers(0, n))
    j = draw(st.integers(i, n))
    spelled = (*region[:i], *(slice(0, k) for k in shape[i:j]), *region[j:])
    return (*region[:i], ..., *region[j:]), spelled


@examples(80)
@given(data=st.data(), g=geometries())
def test_an_ellipsis_normalizes_as_the_slices_it_stands_for(
    data: st.DataObject, g: Geometry
) -> None:
    items, spelled = data.draw(with_ellipsis(g.shape))
    assert normalize_region(items, g.shape) == spelled


def test_regions_it_cannot_take_are_refused_naming_what_it_takes() -> None:
    with pytest.raises(InvalidValueError, match=r"one Ellipsis \(\.\.\.\), got 2"):
        normalize_region((..., slice(0, 2), ...), (4, 4, 4))
    with pytest.raises(InvalidValueError, match=r"2 dimensions, the array has 3 \(an Ellipsis"):
        normalize_region((slice(0, 2), slice(0, 2)), (4, 4, 4))
    with pytest.raises(InvalidValueError, match=r"4 dimensions, the array has 3$"):
        normalize_region((slice(0, 2),) * 4 + (...,), (4, 4, 4))
    with pytest.raises(
        InvalidValueError, match=r"dimension 1: 3 is not a slice.*slice\(i, i \+ 1\)"
    ):
        normalize_region((slice(0, 2), 3, ...), (4, 4, 4))
    with pytest.raises(InvalidValueError, match="integer bounds"):
        normalize_region((slice(0.5, 2), ...), (4, 4))
    # a lone slice or Ellipsis is a region of one item
    assert normalize_region(..., (3, 2)) == (slice(0, 3), slice(0, 2))
    assert normalize_region(slice(1, 2), (3,)) == (slice(1, 2),)


@examples(15)
@given(data=st.data(), g=geometries(max_ndim=3))
def test_a_region_with_an_ellipsis_writes_what_the_expanded_region_writes(
    data: st.DataObject, g: Geometry, tmp_path_factory: pytest.TempPathFactory
) -> None:
    items, region = data.draw(with_ellipsis(g.shape))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    base = rng.integers(1, 100, g.shape).astype("int32")
    slab = rng.integers(100, 200, [s.stop - s.start for s in region]).astype("int32")
    stored = []
    for given_region in (items, region):
        out = tmp_path_factory.mktemp("region") / "a.zarr"
        kw = dict(chunks=g.chunk_shape, shards=g.shard_shape, compressors=None)
        shardwise.write_array(base, out, **kw)
        shardwise.write_array(slab, out, region=given_region, mode="r+")
        stored.append(files(out))
        want = base.copy()
        want[region] = slab
        np.testing.assert_array_equal(shardwise.read_array(out), want)
    assert stored[0] == stored[1]  # every shard and zarr.json byte-identical


def test_a_refused_region_leaves_the_store_byte_identical(tmp_path: Path) -> None:
    out = tmp_path / "a.zarr"
    shardwise.write_array(np.ones((8, 6, 4), "int16"), out, chunks=(2, 2, 2), shards=(4, 6, 4))
    before = snapshot(out)
    with pytest.raises(InvalidValueError, match="one Ellipsis"):
        shardwise.write_array(
            np.zeros((2, 6, 4), "int16"), out, region=(..., slice(0, 2), ...), mode="r+"
        )
    with pytest.raises(InvalidValueError, match=r"2 dimensions, the array has 3 \(an Ellipsis"):
        shardwise.write_array(
            np.zeros((2, 6, 4), "int16"), out, region=(slice(0, 2), slice(None)), mode="r+"
        )
    assert snapshot(out) == before
    job = shardwise.plan_write(
        np.zeros((4, 6, 4), "int16"), out, region=(slice(4, 8), ...), mode="r+"
    )
    assert job.plan.region == (slice(4, 8), slice(0, 6), slice(0, 4))
    assert snapshot(out) == before


def test_batch_parts_take_an_ellipsis(tmp_path: Path) -> None:
    out = tmp_path / "b.zarr"
    plan = batch.init(
        out, shape=(8, 6), dtype="int16", chunks=(2, 3), shards=(4, 6),
        parts=[(slice(0, 4), ...), (..., slice(4, 8), slice(None))],
    )  # fmt: skip
    assert plan.regions == ((slice(0, 4), slice(0, 6)), (slice(4, 8), slice(0, 6)))
    for i in range(plan.nparts):
        region = batch.open_batch(out).region(i)
        batch.write_part(np.full((4, 6), i + 1, "int16"), out, i)
        assert region[0] == slice(4 * i, 4 * i + 4)
    batch.finalize(out)
    np.testing.assert_array_equal(
        shardwise.read_array(out), np.repeat([[1], [2]], 4, axis=0) * np.ones((1, 6))
    )
