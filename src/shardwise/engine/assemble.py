"""The dask array :func:`shardwise.open_array` returns: dask's own, but computed into one output.

dask assembles a computed array with one single-threaded copy of every block into a new array
(numpy's, advised into huge pages), and copies even a lone block. ``ShardArray`` differs in that
step only: the output is allocated in ordinary pages (see
:func:`shardwise.engine.memory.new_array`), the blocks are copied into it on the shared pool, and a
lone block (which the read task allocated for this result alone) is returned as it is. Every other
operation gives plain dask arrays.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np

from . import _pool
from .memory import new_array


class ShardArray(da.Array):  # type: ignore[misc]
    __slots__ = ()

    def __dask_postcompute__(self) -> tuple[Any, tuple[Any, ...]]:
        return assemble, (self.chunks,)


def as_shard_array(arr: da.Array) -> ShardArray:
    return ShardArray(arr.dask, arr.name, arr.chunks, meta=arr._meta)


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
