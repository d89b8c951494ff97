"""The staged strategy's blocks: the source cut on inner-chunk edges into blocks of a byte
target, and the pieces they stage (one per block and shard it touches). Pure: no store, no dask.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from .plan import ShardPlan
from .sizing import shrink_to_fit

Chunks = tuple[tuple[int, ...], ...]


def edges_of(chunks: Sequence[int], start: int) -> list[int]:
    return list(itertools.accumulate(chunks, initial=start))


def inner_aligned(
    plan: ShardPlan, source: Chunks | None, target_bytes: int, itemsize: int
) -> Chunks:
    """Block chunks for the staged strategy.

    With dask ``source`` chunks: each chunk boundary falling inside an inner chunk moves to the
    nearest inner-chunk boundary (in array coordinates), so every inner chunk belongs to exactly one
    block; blocks larger than ``target_bytes`` are then split at inner-chunk boundaries (a source
    chunk that is a view, e.g. of a numpy array, then never exists whole in one task). Without
    (numpy data): the shard pieces, halved along their longest side (in inner chunks) until a
    block holds at most ``target_bytes``.

    >>> from shardwise.core.layout import Layout
    >>> from shardwise.core.plan import ShardPlan
    >>> plan = ShardPlan(Layout((100,), (40,), (10,)), (slice(0, 100),))
    >>> inner_aligned(plan, ((33, 33, 34),), 10**6, 1)  # 33 -> 30, 66 -> 70
    ((30, 40, 30),)
    >>> inner_aligned(plan, ((100,),), 40, 1)  # one 100-byte chunk, 40 bytes per block
    ((30, 30, 30, 10),)
    """
    lay, region = plan.layout, plan.region
    out = []
    if source is not None:
        per = _blocks_per_side(lay.chunk_shape, _spans(source), target_bytes, itemsize)
        for chunks, sl, c, p in zip(source, region, lay.chunk_shape, per, strict=True):
            cuts = {sl.start, sl.stop}
            for e in edges_of(chunks, sl.start)[1:-1]:
                snapped = (e + c // 2) // c * c
                if sl.start < snapped < sl.stop:
                    cuts.add(snapped)
            edges = sorted(cuts)
            # split blocks longer than p inner chunks, at inner-chunk boundaries
            for a, b in itertools.pairwise(list(edges)):
                first = (a // c + p) * c
                cuts.update(range(first, b, p * c))
            edges = sorted(cuts)
            out.append(tuple(b - a for a, b in itertools.pairwise(edges) if b > a))
        return tuple(out)
    # numpy: blocks of whole inner chunks inside each shard
    per = shrink_to_fit(lay.chunks_per_shard, math.prod(lay.chunk_shape) * itemsize, target_bytes)
    for d, (sl, c, p) in enumerate(zip(region, lay.chunk_shape, per, strict=True)):
        step = c * p
        cuts = {sl.start, sl.stop}
        for k in lay.axis_span(d, sl.start, sl.stop):
            shard0, shard1 = lay.axis_bound(d, k), lay.axis_bound(d, k + 1)
            cuts.update(e for e in range(shard0, shard1, step) if sl.start < e < sl.stop)
        edges = sorted(cuts)
        out.append(tuple(b - a for a, b in itertools.pairwise(edges) if b > a))
    return tuple(out)


def _spans(chunks: Chunks) -> tuple[int, ...]:
    """The longest chunk along each dimension."""
    return tuple(max(c, default=0) for c in chunks)


def _blocks_per_side(
    chunk_shape: tuple[int, ...], spans: tuple[int, ...], target_bytes: int, itemsize: int
) -> list[int]:
    """Inner chunks per block side so that a block of ``spans`` (cut to them) fits the target."""
    per = [max(1, -(-n // c)) for n, c in zip(spans, chunk_shape, strict=True)]
    return shrink_to_fit(per, math.prod(chunk_shape) * itemsize, target_bytes)


def staged_pieces(plan: ShardPlan, blocks: Chunks) -> int:
    """Staged pieces: one per block and shard it touches (per axis, the intervals between
    the union of block and shard edges)."""
    total = 1
    lay = plan.layout
    for d, (sl, b) in enumerate(zip(plan.region, blocks, strict=True)):
        inside = lay.axis_span(d, sl.start, sl.stop)[1:]
        edges = set(edges_of(b, sl.start)) | {lay.axis_bound(d, k) for k in inside}
        total *= max(0, len(edges) - 1)
    return total
