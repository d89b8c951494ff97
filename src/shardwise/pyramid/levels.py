"""The levels of a pyramid in one dask graph.

:func:`level_arrays`: every level as a dask array, level k+1 a ``map_blocks`` over the blocks of
level k, so every level derives from blocks already in memory and the source is read once,
whatever the number of levels. What a level's job is planned from, and what the levels written
staged (or whose shards do not nest, :func:`~shardwise.core.pyramid.nests`) are written from.

:func:`tree_part`: the levels written direct from the first whose shards nest on, as a tree of
shard tasks. The task of a shard writes it and returns its reduced block with its receipt; the
next level's shard is assembled from the reduced blocks of the shards it covers. Each block has
one consumer, so dask's order runs the tree depth first: a shard's block is dropped once its
task ran, and what waits is at most the reduced blocks of one shard's siblings per level,
whatever the image's size. (Level k+1 as ``map_blocks`` of level k gives each block two
consumers, its write and its reduction; dask's order then ran the reductions far ahead of the
writes, and the reduced blocks waiting for their shard grew with the image: 1/8 of level 0 and
more on one thread.)
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.layout import Layout
from ..core.pyramid import Level, aligned_chunks, child_shards, reduced_chunks
from ..engine.report import WriteReport
from ..engine.write import ShardWriter, as_dask
from ..write.pipeline import ArrayWrite
from ..write.session import WriteSession
from .reduce import reduce_block

__all__ = ["TreeLink", "level_arrays", "tree_part"]


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


@dataclasses.dataclass(frozen=True)
class TreeLink:
    """A level written in its image's tree of shard tasks: which tree (one per image), its
    index, and the factors to the next level (None at the top: nothing is reduced)."""

    tree: str
    level: int
    step: tuple[int, ...] | None
    method: str


@dataclasses.dataclass(frozen=True)
class _ShardTask:
    """The task of one shard of a level in the tree: write it (``writer`` None: stored by a
    resumed write before, only reduced) and reduce it for the next level (``step`` None: the
    top). Returns the receipt and the reduced block."""

    writer: ShardWriter | None
    shard: tuple[int, ...]
    step: tuple[int, ...] | None
    method: str

    def __call__(self, block: np.ndarray) -> tuple[WriteReport, np.ndarray | None]:
        rep = WriteReport()
        if self.writer is not None:
            # the plan covers the whole level: its task at ``shard`` writes that shard
            rep = self.writer.task(block, {0: {"chunk-location": self.shard}}).flat[0]
        low = None if self.step is None else reduce_block(block, self.step, self.method)
        return rep, low


def _assemble(
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    starts: list[tuple[int, ...]],
    *done: tuple[WriteReport, np.ndarray],
) -> np.ndarray:
    """One shard's block from the reduced blocks of the shards it covers (a task of its own:
    the pieces are dropped before the shard's task encodes)."""
    out = np.empty(shape, dtype=dtype)
    for at, (_, piece) in zip(starts, done, strict=True):
        out[tuple(slice(a, a + n) for a, n in zip(at, piece.shape, strict=True))] = piece
    return out


def _receipt(prefix: str, done: tuple[WriteReport, Any]) -> np.ndarray:
    """A shard task's receipt (a block of the tree's receipts), its key under its level's
    path (the tree is one part)."""
    rep = done[0]
    out = np.empty(1, dtype=object)
    out[0] = dataclasses.replace(rep, keys=[f"{prefix}/{k}".lstrip("/") for k in rep.keys])
    return out


def _needed(layouts: Sequence[Layout], done: Sequence[frozenset[Any]], steps: Any) -> list[Any]:
    """Per level, the shards whose task runs: not stored yet, or covered by a shard of the
    next level whose task runs (it needs their reduced blocks)."""
    need: list[list[tuple[int, ...]]] = [[] for _ in layouts]
    need[-1] = [s for s in layouts[-1].shards() if s not in done[-1]]
    for k in range(len(layouts) - 2, -1, -1):
        wanted = {s for s in layouts[k].shards() if s not in done[k]}
        for t in need[k + 1]:
            wanted.update(c for c, _ in _children(t, layouts[k], layouts[k + 1], steps[k]))
        need[k] = sorted(wanted)
    return need


def _children(
    shard: tuple[int, ...], lay: Layout, up: Layout, step: tuple[int, ...] | None
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The shards of ``lay`` whose reduced blocks make ``shard`` of the next level, ``up``."""
    assert step is not None  # a level below another in the tree reduces into it
    return child_shards(shard, lay.shape, lay.shard_shape, up.shard_shape, step)


def _writer(w: ArrayWrite, session: WriteSession) -> ShardWriter:
    """The direct writer of a level, as the pipeline's direct parts make it."""
    return ShardWriter(
        info=w.info,
        store=session.store,  # tagged with this write's id
        plan=w.plan,
        options=w.options,
        journal=session.journal(w.info.codec),
        shared=w.shared,
    )


def tree_part(levels: Sequence[tuple[TreeLink, ArrayWrite, WriteSession]]) -> Any:
    """The receipts (one per shard to write) of the tree of ``levels`` (in order, each with its
    pipeline write and session, started; the first's source a dask array of its values) as a
    1-D dask array, every receipt's keys under its level's path: the work of one pipeline
    part (an array, as the other levels' parts: dask optimizes the arrays of one compute
    together, and a graph optimized apart would compute the source's blocks again). None
    when no shard is left to write."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    first = levels[0][1]
    layouts = [w.info.layout for _, w, _ in levels]
    steps = [link.step for link, _, _ in levels]
    dones = [s.done for _, _, s in levels]
    need = _needed(layouts, dones, steps)
    # the first level's shard pieces, as the direct path cuts them
    x = as_dask(first.source, first.plan.task_chunks, copy=first.copy_source)
    tok = uuid.uuid4().hex[:12]
    name = f"shardwise-receipt-{tok}"
    layer: dict[Any, Any] = {}
    receipts: list[Any] = []
    below = ""
    for k, (link, w, session) in enumerate(levels):
        task, writer = f"shardwise-write-{tok}-{k}", _writer(w, session)
        for s in need[k]:
            block: Any = (x.name, *s)
            if k:  # assembled from the reduced blocks of the shards below
                block = (f"shardwise-pyramid-{tok}-{k}", *s)
                kids = _children(s, layouts[k - 1], layouts[k], steps[k - 1])
                shape = tuple(r.stop - r.start for r in layouts[k].shard_region(s))
                # the literals in a partial: dask reads tuples in a task as keys or tasks
                make = functools.partial(_assemble, shape, w.info.dtype, [at for _, at in kids])
                layer[block] = (make, *[(below, *c) for c, _ in kids])
            mine = None if s in dones[k] else writer
            layer[(task, *s)] = (_ShardTask(mine, s, link.step, link.method), block)
            if mine is not None:
                layer[(name, len(receipts))] = (_receipt, w.prefix, (task, *s))
                receipts.append(s)
        below = task
    if not receipts:
        return None
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    return da.Array(graph, name, chunks=((1,) * len(receipts),), meta=np.empty(0, dtype=object))
