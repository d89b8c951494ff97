"""The write graph of a dask source whose chunks do not line up with the shards, when every
source chunk edge falls on an inner-chunk boundary (:meth:`ShardPlan.on_inner_edges`; the
overlaps are :func:`~shardwise.core.plan.overlaps`): each shard task takes the source blocks
that overlap its shard and encodes the overlaps in place (:class:`~shardwise.codec.mosaic.Mosaic`).

``source.rechunk(task_chunks)`` would join those overlaps into one fresh array per shard first:
a copy of every byte written and fresh pages for it (0.6 CPU-s per 2 GB on this machine's
tests), only for the encoder to copy each inner chunk out again. The graph here has one task
per shard, like the rechunked one, and no join tasks; a shard the write covers only in part is
joined in its task and merged as before.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.plan import ShardPlan, overlaps


@dataclass(frozen=True)
class PieceSpec:
    """What one shard task needs besides the source blocks (travels with the task)."""

    loc: tuple[int, ...]
    shape: tuple[int, ...]
    origins: tuple[tuple[int, ...], ...]
    slices: tuple[tuple[slice, ...], ...]


def pieces_graph(task: Any, plan: ShardPlan, source: Any) -> Any:
    """The dask array of receipts (one element per shard task): ``task(spec, blocks)`` per
    shard piece, ``blocks`` the source blocks it overlaps, in ``spec``'s order."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    name = f"shardwise-write-{uuid.uuid4().hex}"  # unique per call, as build_graph's
    per_axis = [overlaps(t, s) for t, s in zip(plan.task_chunks, source.chunks, strict=True)]
    layer: dict[Any, Any] = {}
    for loc in itertools.product(*(range(len(c)) for c in plan.task_chunks)):
        combos = list(itertools.product(*(per_axis[d][i] for d, i in enumerate(loc))))
        spec = PieceSpec(
            loc=loc,
            shape=tuple(plan.task_chunks[d][i] for d, i in enumerate(loc)),
            origins=tuple(tuple(o for _j, _s, o in combo) for combo in combos),
            slices=tuple(tuple(s for _j, s, _o in combo) for combo in combos),
        )
        keys = [(source.name, *(j for j, _s, _o in combo)) for combo in combos]
        layer[(name, *loc)] = (task, spec, keys)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[source])
    chunks = tuple((1,) * len(c) for c in plan.task_chunks)
    return da.Array(graph, name, chunks=chunks, meta=np.empty((0,) * source.ndim, dtype=object))
