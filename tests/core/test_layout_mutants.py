"""Edges of the shard-grid math that test_layout.py's properties do not reach: a region, a
coordinate or an origin of the wrong rank is refused (never cut to the shorter one), regions
that only touch do not intersect, and the refusals' messages say what is accepted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardwise import InvalidValueError
from shardwise.core.layout import Layout, intersect, is_aligned, normalize_region, shift

LAY = Layout(shape=(10, 7), shard_shape=(4, 4), chunk_shape=(2, 2))
R2 = (slice(0, 4), slice(0, 4))
R1 = (slice(0, 4),)
R3 = (slice(0, 4), slice(0, 4), slice(0, 1))

RANK_MISMATCHES: dict[str, Callable[[], Any]] = {
    "intersect, shorter second": lambda: intersect(R2, R1),
    "intersect, longer second": lambda: intersect(R2, R3),
    "shift, short origin": lambda: shift(R2, (1,)),
    "shift, long origin": lambda: shift(R2, (1, 1, 1)),
    "shard_region, short coordinate": lambda: LAY.shard_region((1,)),
    "shard_region, long coordinate": lambda: LAY.shard_region((1, 1, 1)),
    "chunks_in_array, short shard": lambda: LAY.chunks_in_array((1,)),
    "chunks_in_array, long shard": lambda: LAY.chunks_in_array((1, 1, 1)),
    "shards_touching, short region": lambda: list(LAY.shards_touching(R1)),
    "shards_touching, long region": lambda: list(LAY.shards_touching(R3)),
    "is_aligned, short region": lambda: is_aligned(R1, LAY),
    "is_aligned, long region": lambda: is_aligned(R3, LAY),
}


@pytest.mark.parametrize("call", RANK_MISMATCHES.values(), ids=RANK_MISMATCHES.keys())
def test_a_rank_mismatch_is_refused_not_truncated(call: Callable[[], Any]) -> None:
    with pytest.raises(ValueError, match="zip"):
        call()


def test_regions_that_only_touch_do_not_intersect() -> None:
    assert intersect((slice(0, 4), slice(0, 7)), (slice(4, 8), slice(0, 7))) is None
    assert intersect((slice(0, 4), slice(0, 3)), (slice(0, 4), slice(3, 7))) is None
    assert intersect((slice(0, 5), slice(0, 4)), (slice(4, 8), slice(3, 7))) == (
        slice(4, 5),
        slice(3, 4),
    )


def test_refusals_say_what_is_accepted() -> None:
    with pytest.raises(InvalidValueError, match=r"must have the same number of dimensions$"):
        Layout(shape=(10, 7), shard_shape=(4,), chunk_shape=(2, 2))
    with pytest.raises(InvalidValueError) as err:
        normalize_region((slice(0, 2), 3), (10, 7))
    assert str(err.value) == (
        "region dimension 1: 3 is not a slice; a region takes slices with step 1 and one "
        "Ellipsis (for one index i, give slice(i, i + 1))"
    )
