"""Selections of a sharded array that decode only the inner chunks they touch.

Orthogonal (``array[np.ix_(...)]``) and point-wise (numpy advanced indexing) selections on top
of :class:`~shardwise.engine.read.ShardReader`: per shard, one cached index request, then the needed
inner chunks as coalesced byte ranges, decoded in parallel. Rectangular selections with step 1
go straight to :meth:`ShardReader.read`. No xarray here: the backend adapts xarray's indexers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.layout import Layout
from ..errors import SelectionError
from .read import ShardReader

__all__ = ["gather_outer", "gather_points", "read_outer", "read_vectorized"]


def _positions(key: Any, size: int) -> np.ndarray:
    """The (non-negative, in-bounds) positions one indexer element selects along a dimension."""
    if isinstance(key, slice):
        return np.arange(*key.indices(size), dtype=np.int64)
    pos = np.asarray(key, dtype=np.int64)
    if isinstance(key, int | np.integer):
        pos = pos.reshape(1)
    pos = np.where(pos < 0, pos + size, pos)
    if pos.size and (pos.min() < 0 or pos.max() >= size):
        raise SelectionError(f"index out of bounds for a dimension of size {size}")
    return pos


def _by_shard(chunks: np.ndarray, lay: Layout, d: int) -> list[tuple[int, int, np.ndarray]]:
    """Group sorted chunk indices of dimension ``d`` by shard: (shard, first position, local
    ids)."""
    shards, local = lay.chunk_shards(d, chunks)
    cuts = [0, *(np.flatnonzero(np.diff(shards)) + 1).tolist(), len(chunks)]
    return [(int(shards[a]), a, local[a:b]) for a, b in itertools.pairwise(cuts)]


def read_outer(reader: ShardReader, key: tuple[Any, ...]) -> np.ndarray:
    """Orthogonal selection: ints, slices (positive steps) and 1-d integer arrays per dimension."""
    shape = reader.shape
    if all(
        isinstance(k, int | np.integer) or (isinstance(k, slice) and k.step in (None, 1))
        for k in key
    ):
        region = tuple(
            slice(*k.indices(n)[:2]) if isinstance(k, slice) else slice(int(k) % n, int(k) % n + 1)
            for k, n in zip(key, shape, strict=True)
        )
        region = tuple(slice(s.start, max(s.start, s.stop)) for s in region)
        out = reader.read(region)
        return out[tuple(0 if not isinstance(k, slice) else slice(None) for k in key)]
    pos = [_positions(k, n) for k, n in zip(key, shape, strict=True)]
    result = gather_outer(reader, pos)
    return result[tuple(0 if isinstance(k, int | np.integer) else slice(None) for k in key)]


def gather_outer(reader: ShardReader, pos: Sequence[np.ndarray]) -> np.ndarray:
    """``array[np.ix_(*pos)]``, decoding only the inner chunks the positions fall in."""
    lay, inner = reader.info.layout, reader.info.codec.inner
    cs = lay.chunk_shape
    if any(p.size == 0 for p in pos):
        return np.empty(tuple(p.size for p in pos), dtype=reader.dtype)
    needed = [np.unique(p // c) for p, c in zip(pos, cs, strict=True)]
    compact = np.empty(tuple(len(u) * c for u, c in zip(needed, cs, strict=True)), reader.dtype)
    groups = [_by_shard(u, lay, d) for d, u in enumerate(needed)]
    for combo in itertools.product(*groups):
        shard = tuple(g[0] for g in combo)
        lists = [g[2] for g in combo]
        grid = tuple(len(x) for x in lists)
        coords = np.stack(np.meshgrid(*lists, indexing="ij"), -1).reshape(-1, len(lists))
        block = inner.unstack(reader.decode_chunks(shard, coords), grid)
        dest = tuple(
            slice(g[1] * c, (g[1] + n) * c) for g, n, c in zip(combo, grid, cs, strict=True)
        )
        compact[dest] = block
    mapped = [
        np.searchsorted(u, p // c) * c + p % c for u, p, c in zip(needed, pos, cs, strict=True)
    ]
    return compact[np.ix_(*mapped)]


def read_vectorized(reader: ShardReader, key: tuple[Any, ...]) -> np.ndarray:
    """Vectorized (point-wise) selection with numpy broadcasting; sliced axes go last."""
    shape = reader.shape
    arrays = [k for k in key if not isinstance(k, slice)]
    nslices = len(key) - len(arrays)
    ndim_arr = np.ndim(arrays[0]) if arrays else 0
    full, j = [], 0
    for k, n in zip(key, shape, strict=True):
        if isinstance(k, slice):
            lead = (1,) * (ndim_arr + j)
            full.append(_positions(k, n).reshape(*lead, -1, *(1,) * (nslices - j - 1)))
            j += 1
        else:
            p = _positions(k, n)
            full.append(p.reshape(p.shape + (1,) * nslices))
    pts = np.broadcast_arrays(*full)
    out_shape = pts[0].shape if pts else ()
    flat = [p.reshape(-1) for p in pts]
    return gather_points(reader, flat).reshape(out_shape)


def gather_points(reader: ShardReader, pos: Sequence[np.ndarray]) -> np.ndarray:
    """``array[pos0[i], pos1[i], ...]`` for every i, decoding only the chunks holding the points."""
    lay, inner = reader.info.layout, reader.info.codec.inner
    cs = np.asarray(lay.chunk_shape, dtype=np.int64)
    n = len(pos[0]) if pos else 1
    if n == 0:
        return np.empty(0, dtype=reader.dtype)
    points = np.stack(pos, -1) if pos else np.zeros((1, 0), dtype=np.int64)
    chunks, inverse = np.unique(points // cs, axis=0, return_inverse=True)
    split = [lay.chunk_shards(d, chunks[:, d]) for d in range(lay.ndim)]
    shards = np.stack([s for s, _ in split], -1) if split else np.zeros_like(chunks)
    within = np.stack([w for _, w in split], -1) if split else np.zeros_like(chunks)
    compact = np.empty((len(chunks), *lay.chunk_shape), dtype=reader.dtype)
    # np.unique sorted the chunk rows lexicographically, so each shard's chunks are contiguous
    cuts = np.flatnonzero((np.diff(shards, axis=0) != 0).any(axis=1)) + 1
    for a, b in itertools.pairwise([0, *cuts.tolist(), len(chunks)]):
        shard = tuple(int(x) for x in shards[a])
        stack = reader.decode_chunks(shard, within[a:b])
        grid = (b - a,) + (1,) * (lay.ndim - 1) if lay.ndim else ()
        compact[a:b] = inner.unstack(stack, grid).reshape(b - a, *lay.chunk_shape)
    local = points % cs
    out: np.ndarray = compact[(inverse.reshape(-1), *local.T)]
    return out
