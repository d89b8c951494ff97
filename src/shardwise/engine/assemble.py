"""The dask array :func:`shardwise.open_array` returns: dask's own, but computed into one output.

Three steps differ from dask's, and every other operation gives plain dask arrays:

- A basic selection of it (integers, slices, one Ellipsis, ``None``) is again such an array, over
  a view of the stored array (``shardwise.engine.lazy``): its tasks read only what it selects.
- ``compute()`` of such an array (as opened or a selection of it), on a local scheduler (threads
  or sync) with no dask callbacks active (progress bars, profilers), reads it with
  :func:`read_selection`: every inner chunk decoded straight into one output, no block ever
  allocated. The graph's blocks would cost a second array of fresh memory and a copy.
  Distributed and multiprocessing schedulers, and anything else derived from the array (a
  reduction, arithmetic), run the graph.
- ``dask.compute`` of it whole on a local scheduler (alone or with other arrays) runs one read
  of it instead of its blocks (``shardwise.engine.whole``, dask's array optimization).
- When the graph runs, dask assembles the blocks with one single-threaded copy of every block into
  a new array (numpy's, advised into huge pages), and copies even a lone block. Here the output is
  allocated in ordinary pages (see :func:`shardwise.engine.memory.new_array`), the blocks are
  copied into it on the shared pool, and a lone block (which the read task allocated for this
  result alone) is returned as it is.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import dask.array as da
import numpy as np

from ..compat import runs_locally
from ..runtime import pool as _pool
from .memory import new_array


class ShardArray(da.Array):  # type: ignore[misc]
    __slots__ = ("_view",)
    _view: Any

    def __dask_postcompute__(self) -> tuple[Any, tuple[Any, ...]]:
        return assemble, (self.chunks,)

    def compute(self, **kwargs: Any) -> Any:
        """As dask's ``compute()``; on a local scheduler, one direct read (see the module)."""
        view = getattr(self, "_view", None)
        if view is not None and _local_scheduler(self, kwargs):
            reader = view.reader
            threads = kwargs.get("num_workers")
            if threads is not None and threads != reader.threads:
                reader = replace(reader, threads=threads)
            return view.read(reader)
        return super().compute(**kwargs)


# compute() keywords the direct read honours; any other goes to dask
_DIRECT_KWARGS = {"scheduler", "num_workers", "optimize_graph", "traverse"}


def _local_scheduler(arr: ShardArray, kwargs: dict[str, Any]) -> bool:
    """True when ``compute(**kwargs)`` would run ``arr`` in this process, on dask's threaded or
    synchronous scheduler, with no callbacks to notify."""
    return not set(kwargs) - _DIRECT_KWARGS and runs_locally(arr, kwargs.get("scheduler"))


def assemble(results: Any, chunks: tuple[tuple[int, ...], ...]) -> Any:
    """The computed blocks (nested lists, one level per axis) as one array."""
    if not chunks:
        return da.core.finalize(results)
    blocks: list[tuple[tuple[int, ...], Any]] = []

    def walk(node: Any, at: tuple[int, ...]) -> None:
        if len(at) == len(chunks):
            blocks.append((at, node))
            return
        for i, child in enumerate(node):
            walk(child, (*at, i))

    walk(results, ())
    if len(blocks) == 1:
        return blocks[0][1]
    first = blocks[0][1]
    if not isinstance(first, np.ndarray) or any(type(b) is not type(first) for _, b in blocks):
        return da.core.finalize(results)
    shape = tuple(sum(c) for c in chunks)
    out = new_array(shape, np.result_type(*(b.dtype for _, b in blocks)))
    starts = [[0, *itertools.accumulate(c)] for c in chunks]

    def copy(batch: Sequence[tuple[tuple[int, ...], np.ndarray]]) -> list[None]:
        for at, block in batch:
            where = tuple(slice(s[i], s[i + 1]) for s, i in zip(starts, at, strict=True))
            out[where] = block
        return [None] * len(batch)

    _pool.map_batches(copy, blocks)
    return out
