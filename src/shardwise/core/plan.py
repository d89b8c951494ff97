"""The write plan: a pure, frozen value saying which task owns which shard.

The source (a region of the target array) is cut at shard boundaries; every piece becomes exactly
one task, and no two pieces share a shard. A shard the region covers only in part is merged with
what is stored (see :func:`shardwise.codec.shard.merge_shard`) by its one owning task.

>>> from shardwise.core.layout import Layout
>>> plan = ShardPlan(Layout((10, 10), (4, 4), (2, 2)), (slice(2, 10), slice(0, 10)))
>>> plan.task_chunks
((2, 4, 2), (4, 4, 2))
>>> plan.ntasks, plan.npartial
(9, 3)
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import PlanError
from .layout import Coord, Layout, Region, is_aligned

# the most shard tasks one write may plan: every shard of a write has its own task, key and
# record, listed in memory by the client before anything runs (and a dask graph of millions of
# tasks is already beyond what a scheduler handles well); a larger write is refused with the
# count instead of failing with MemoryError while listing them
MAX_TASKS = 2**22


# per piece along one axis: (source chunk index, slice of that chunk, offset in the piece)
Overlap = tuple[int, slice, int]


def overlaps(pieces: Sequence[int], source: Sequence[int]) -> list[list[Overlap]]:
    """Per piece along one axis (lengths ``pieces``), the source chunks (lengths ``source``) it
    overlaps.

    >>> first, second = overlaps((4, 4), (3, 3, 2))
    >>> first
    [(0, slice(0, 3, None), 0), (1, slice(0, 1, None), 3)]
    >>> second
    [(1, slice(1, 3, None), 0), (2, slice(0, 2, None), 2)]
    """
    src = list(itertools.accumulate(source, initial=0))
    out = []
    for a, b in itertools.pairwise(itertools.accumulate(pieces, initial=0)):
        row = []
        j = bisect.bisect_right(src, a) - 1
        while j < len(source) and src[j] < b:
            lo, hi = max(a, src[j]), min(b, src[j + 1])
            if hi > lo:
                row.append((j, slice(lo - src[j], hi - src[j]), lo - a))
            j += 1
        out.append(row)
    return out


@dataclass(frozen=True)
class ShardPlan:
    """Which task owns which shard; refuses (``PlanError``) a plan of more than
    :data:`MAX_TASKS` tasks, before anything lists them."""

    layout: Layout
    region: Region

    def __post_init__(self) -> None:
        lay = self.layout
        counts = [len(lay.axis_span(d, sl.start, sl.stop)) for d, sl in enumerate(self.region)]
        n = math.prod(counts)
        if n > MAX_TASKS:
            raise PlanError(
                f"this write would have {n:,} shard tasks ({' x '.join(map(str, counts))} "
                f"shards of {self.layout.shard_shape}), more than the {MAX_TASKS:,} one write "
                "can list: use larger shards, or write the array in regions (one call each, "
                "or shardwise.batch parts)"
            )

    @property
    def task_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Chunks of the source after cutting it at shard boundaries (one chunk per task)."""
        lay = self.layout
        return tuple(lay.axis_cuts(d, sl.start, sl.stop) for d, sl in enumerate(self.region))

    @property
    def ntasks(self) -> int:
        return math.prod(len(c) for c in self.task_chunks)

    @cached_property
    def first_shard(self) -> Coord:
        return tuple(self.layout.axis_index(d, sl.start) for d, sl in enumerate(self.region))

    def shard_of_task(self, task: Sequence[int]) -> Coord:
        return tuple(map(operator.add, self.first_shard, task))

    def keep_mask(self, skipped: Collection[Coord]) -> np.ndarray | None:
        """The tasks to run when the shards ``skipped`` are done already (resume): a boolean
        grid over the tasks, or None when every task runs."""
        if not skipped:
            return None
        grid = itertools.product(*(range(len(c)) for c in self.task_chunks))
        keep = [self.shard_of_task(t) not in skipped for t in grid]
        return np.array(keep, dtype=bool).reshape([len(c) for c in self.task_chunks])

    def piece_in_shard(self, shard: Sequence[int]) -> Region:
        """The part of ``shard`` this write covers, relative to the shard's origin."""
        out = []
        lay = self.layout
        for d, (i, sl) in enumerate(zip(shard, self.region, strict=True)):
            a = lay.axis_bound(d, i)
            lo, hi = max(sl.start, a), min(sl.stop, lay.axis_bound(d, i + 1))
            out.append(slice(lo - a, hi - a))
        return tuple(out)

    def covers(self, shard: Sequence[int], full: Region | None = None) -> bool:
        """True when the write replaces all of ``shard`` (clipped to the array; ``full``: its
        region, when the caller has it)."""
        if full is None:
            full = self.layout.shard_region(shard)
        for r, f in zip(self.region, full, strict=True):
            if f.start < r.start or r.stop < f.stop:
                return False
        return True

    @property
    def aligned(self) -> bool:
        return is_aligned(self.region, self.layout)

    def on_inner_edges(self, source_chunks: Sequence[Sequence[int]]) -> bool:
        """Whether every edge between the region's ``source_chunks`` lies on an inner-chunk
        boundary of the array: each inner chunk of a shard then lies in one source chunk."""
        for sl, chunks, c in zip(self.region, source_chunks, self.layout.chunk_shape, strict=True):
            inner = list(itertools.accumulate(chunks, initial=sl.start))[1:-1]
            if any(e % c for e in inner):
                return False
        return True

    @property
    def npartial(self) -> int:
        """Tasks whose shard is covered only in part (these merge with the stored shard)."""
        # a shard is covered when it is covered along every axis: count per axis, O(shards
        # per axis) rather than O(tasks) (a plan of 10^5 shards prints at once)
        whole, lay = 1, self.layout
        for d, (sl, n) in enumerate(zip(self.region, lay.shape, strict=True)):
            first = self.first_shard[d]
            whole *= sum(
                sl.start <= lay.axis_bound(d, k) and sl.stop >= min(lay.axis_bound(d, k + 1), n)
                for k in range(first, first + len(self.task_chunks[d]))
            )
        return self.ntasks - whole

    @property
    def touched_elements(self) -> int:
        """Elements of the shards the region touches, each clipped to the array: what the
        write stores (a shard covered in part is stored whole)."""
        total, lay = 1, self.layout
        for d, n in enumerate(lay.shape):
            first = self.first_shard[d]
            last = lay.axis_bound(d, first + len(self.task_chunks[d]))
            total *= min(last, n) - lay.axis_bound(d, first)
        return total

    def __str__(self) -> str:
        lay = self.layout
        return (
            f"ShardPlan: array {lay.shape}, {lay.grid_text()}, inner chunks "
            f"{lay.chunk_shape}; region {[(s.start, s.stop) for s in self.region]}; "
            f"{self.ntasks} shard tasks ({self.npartial} merge with stored data)"
        )
