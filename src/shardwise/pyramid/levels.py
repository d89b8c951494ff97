"""The levels of a pyramid in one dask graph.

:func:`level_arrays`: every level as a dask array, level k+1 a ``map_blocks`` over the blocks of
level k, so every level derives from blocks already in memory and the source is read once,
whatever the number of levels. What a level's job is planned from, and what the levels written
staged (or whose shards do not nest, :func:`~shardwise.core.pyramid.nests`) are written from.
The levels written direct from the first whose shards nest on are one tree of shard tasks
instead (plan.py links them, :class:`~shardwise.engine.tree.TreeLink`; the one graph builder,
``write/pipeline.py:build_part``, builds it), where a shard's task hands its reduced block to
the next level's.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.pyramid import Level, aligned_chunks, reduced_chunks
from .reduce import reduce_block

__all__ = ["level_arrays"]


def level_arrays(source: Any, levels: Sequence[Level], method: str) -> list[Any]:
    """A dask array per level, level 0 being ``source`` (a dask array)."""
    out = [source]
    token = uuid.uuid4().hex[:12]
    for k in range(1, len(levels)):
        prev, level = levels[k - 1], levels[k]
        step = tuple(b // a for a, b in zip(prev.factors, level.factors, strict=True))
        x = out[-1]
        # block boundaries on multiples of the factor: no block of the reduction spans two
        # dask blocks (a boundary moved costs a slice of its neighbours, not a second read)
        chunks = tuple(aligned_chunks(c, f) for c, f in zip(x.chunks, step, strict=True))
        if chunks != x.chunks:
            x = x.rechunk(chunks)
        y = x.map_blocks(
            reduce_block,
            step,
            method,
            chunks=tuple(reduced_chunks(c, f) for c, f in zip(chunks, step, strict=True)),
            dtype=x.dtype,
            # the reductions return numpy blocks
            meta=np.empty((0,) * x.ndim, dtype=x.dtype),
            # named, not tokenized: tokenizing would hash the graph's source arrays again
            name=f"shardwise-pyramid-{token}-{k}",
        )
        assert y.shape == level.shape, (y.shape, level.shape)
        out.append(y)
    return out
