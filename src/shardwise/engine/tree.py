"""A tree of direct writes in one graph: arrays written from one source, each array reduced
into the next (a pyramid's levels, from the first whose shards nest on), built by the one graph
builder (``write/pipeline.py:build_part``) when its writes are linked (:class:`TreeLink`).

The task of a shard writes it and returns its reduced block with its receipt; the next array's
shard is assembled from the reduced blocks of the shards it covers. Each block has one consumer,
so dask's order runs the tree depth first: a shard's block is dropped once its task ran, and what
waits is at most the reduced blocks of one shard's siblings per level, whatever the source's
size. (Level k+1 as ``map_blocks`` of level k gives each block two consumers, its write and its
reduction; dask's order then ran the reductions far ahead of the writes, and the reduced blocks
waiting for their shard grew with the image: 1/8 of level 0 and more on one thread.)
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.layout import Layout
from ..core.pyramid import child_shards
from .report import WriteReport
from .write import ShardWriter, as_dask

__all__ = ["TreeLevel", "TreeLink", "tree_graph"]


@dataclasses.dataclass(frozen=True)
class TreeLink:
    """An array written in a tree of shard tasks: which tree, its index, the factors to the
    next array and the reduction into it (``step`` and ``reduce`` None at the top: nothing is
    reduced)."""

    tree: str
    level: int
    step: tuple[int, ...] | None
    reduce: Callable[[np.ndarray], np.ndarray] | None


@dataclasses.dataclass(frozen=True)
class TreeLevel:
    """One array of a tree as the builder gets it: its link, writer (direct), the shards
    stored before (resume), its key prefix; the first's ``source`` is the tree's."""

    link: TreeLink
    writer: ShardWriter
    done: frozenset[Any]
    prefix: str
    source: Any = None
    copy: bool = False


@dataclasses.dataclass(frozen=True)
class _ShardTask:
    """The task of one shard of a level in the tree: write it (``writer`` None: stored by a
    resumed write before, only reduced) and reduce it for the next level (``reduce`` None: the
    top). Returns the receipt and the reduced block."""

    writer: ShardWriter | None
    shard: tuple[int, ...]
    reduce: Callable[[np.ndarray], np.ndarray] | None

    def __call__(self, block: np.ndarray) -> tuple[WriteReport, np.ndarray | None]:
        rep = WriteReport()
        if self.writer is not None:
            # the plan covers the whole level: its task at ``shard`` writes that shard
            rep = self.writer.task(block, {0: {"chunk-location": self.shard}}).flat[0]
        return rep, None if self.reduce is None else self.reduce(block)


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
    out[0] = dataclasses.replace(rep, keys=rep.keys.with_prefix(prefix.strip("/")))
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
    return child_shards(shard, lay.shape, lay.regular_shards, up.regular_shards, step)


def tree_graph(levels: Sequence[TreeLevel]) -> Any:
    """The receipts (one per shard to write) of the tree of ``levels`` (in order; the first's
    source a dask array of its values) as a 1-D dask array, every receipt's keys under its
    level's prefix: one part of the pipeline (an array, as the other parts: dask optimizes the
    arrays of one compute together, and a graph optimized apart would compute the source's
    blocks again). None when no shard is left to write."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    first = levels[0]
    layouts = [lv.writer.info.layout for lv in levels]
    steps = [lv.link.step for lv in levels]
    dones = [lv.done for lv in levels]
    need = _needed(layouts, dones, steps)
    # the first level's shard pieces, as the direct path cuts them
    x = as_dask(first.source, first.writer.plan.task_chunks, copy=first.copy)
    tok = uuid.uuid4().hex[:12]
    name = f"shardwise-receipt-{tok}"
    layer: dict[Any, Any] = {}
    receipts: list[Any] = []
    below = ""
    for k, lv in enumerate(levels):
        task = f"shardwise-write-{tok}-{k}"
        for s in need[k]:
            block: Any = (x.name, *s)
            if k:  # assembled from the reduced blocks of the shards below
                block = (f"shardwise-pyramid-{tok}-{k}", *s)
                kids = _children(s, layouts[k - 1], layouts[k], steps[k - 1])
                shape = tuple(r.stop - r.start for r in layouts[k].shard_region(s))
                # the literals in a partial: dask reads tuples in a task as keys or tasks
                dtype = lv.writer.info.dtype
                make = functools.partial(_assemble, shape, dtype, [at for _, at in kids])
                layer[block] = (make, *[(below, *c) for c, _ in kids])
            mine = None if s in dones[k] else lv.writer
            layer[(task, *s)] = (_ShardTask(mine, s, lv.link.reduce), block)
            if mine is not None:
                layer[(name, len(receipts))] = (_receipt, lv.prefix, (task, *s))
                receipts.append(s)
        below = task
    if not receipts:
        return None
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    return da.Array(graph, name, chunks=((1,) * len(receipts),), meta=np.empty(0, dtype=object))
