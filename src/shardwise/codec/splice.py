"""A merge as byte ranges: the new shard given as ranges of the stored one and new bytes.

Where a store can build an object from byte ranges of another without the bytes passing
through the writer (``storage/splice.py``: the kernel's ``copy_file_range`` on local files,
``UploadPartCopy`` on S3), a merge needs only the shard's index and the inner chunks its updates
cover in part (:func:`needed`); :func:`splice_shard` then gives the new shard as *segments*, in
order: ``(offset, nbytes)`` ranges of the stored shard (untouched inner chunks, neighbours
joined into one range) and bytes-like new parts (the changed chunks, the new index). Inner
chunks stay in C order, as :func:`~.shard.encode_shard` writes them.

>>> import numpy as np
>>> from shardwise.codec.chunks import ChunkCodec
>>> from shardwise.codec.shard import encode_shard
>>> codec = ShardCodec((4,), ChunkCodec((2,), np.dtype("u1"), 0))
>>> old = encode_shard(codec, np.arange(1, 5, dtype="u1"))
>>> index = ShardIndex.of_shard(codec, old.data, "k")
>>> updates = [((slice(3, 4),), np.array([9], "u1"))]
>>> needed(codec, index, (4,), updates)  # chunk 1 is covered in part: its stored bytes
[(2, 2)]
>>> s = splice_shard(codec, index, {(2, 2): old.data[2:4]}, updates, (4,), "k")
>>> s.segments[0], bytes(s.segments[1])  # chunk 0 copied, chunk 1 new, then the index
((0, 2), b'\\x03\\t')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CorruptShardError
from .index import ShardIndex
from .shard import ShardCodec, encode_chunks

__all__ = ["Splice", "needed", "splice_shard", "untouched"]

Update = tuple[tuple[slice, ...], np.ndarray]
Range = tuple[int, int]  # (offset, nbytes) of the stored shard


@dataclass(frozen=True)
class Splice:
    """The new shard: ``segments`` in order (a :data:`Range` of the stored shard, or new
    bytes), its size and its inner chunks stored and empty."""

    segments: list[Any]
    nbytes: int
    chunks_stored: int
    chunks_empty: int

    @property
    def new_nbytes(self) -> int:
        """The bytes the writer sends (changed chunks and index)."""
        return sum(len(s) for s in self.segments if not isinstance(s, tuple))

    @property
    def copied_nbytes(self) -> int:
        """The bytes the store copies from the stored shard."""
        return sum(s[1] for s in self.segments if isinstance(s, tuple))


@dataclass(frozen=True)
class _Grid:
    """The inner chunks of one shard inside the array, in C order: their first and last
    elements (``lo``, ``hi``) and their positions in the shard's full grid (``flat``)."""

    lo: np.ndarray
    hi: np.ndarray
    flat: np.ndarray

    @classmethod
    def of(cls, codec: ShardCodec, valid: Sequence[int]) -> _Grid:
        cs = codec.chunk_shape
        used = tuple(-(-n // c) for n, c in zip(valid, cs, strict=True))
        coords = np.stack(np.unravel_index(np.arange(math.prod(used)), used), -1)
        lo = coords * np.asarray(cs, dtype=np.int64)
        hi = np.minimum(lo + np.asarray(cs), np.asarray(valid, dtype=np.int64))
        flat = np.ravel_multi_index(tuple(coords.T), codec.grid) if used else np.zeros(1, int)
        return cls(lo.reshape(len(flat), len(cs)), hi.reshape(len(flat), len(cs)), flat)

    def touched(self, updates: Sequence[Update]) -> tuple[np.ndarray, np.ndarray]:
        """Chunks any update touches, and those some one update covers whole."""
        touched = np.zeros(len(self.flat), bool)
        covered = np.zeros(len(self.flat), bool)
        for piece, _ in updates:
            plo = np.asarray([p.start for p in piece], dtype=np.int64)
            phi = np.asarray([p.stop for p in piece], dtype=np.int64)
            touched |= ((self.lo < phi) & (self.hi > plo)).all(axis=1)
            covered |= ((self.lo >= plo) & (self.hi <= phi)).all(axis=1)
        return touched, covered


def needed(
    codec: ShardCodec, index: ShardIndex, valid: Sequence[int], updates: Sequence[Update]
) -> list[Range]:
    """The stored ranges a merge of ``updates`` reads: the stored inner chunks the updates
    touch and no one update covers whole (a later update wins where two overlap)."""
    grid = _Grid.of(codec, valid)
    touched, covered = grid.touched(updates)
    out = []
    for k in np.flatnonzero(touched & ~covered).tolist():
        f = int(grid.flat[k])
        if not index.is_empty(f):
            o, n = (int(x) for x in index.entries[f])
            out.append((o, n))
    return out


def untouched(
    codec: ShardCodec, index: ShardIndex, valid: Sequence[int], updates: Sequence[Update]
) -> list[Range]:
    """The stored ranges of the chunks no update touches (neighbours joined): what a splice
    can copy."""
    grid = _Grid.of(codec, valid)
    touched, _ = grid.touched(updates)
    out: list[Range] = []
    for k in np.flatnonzero(~touched).tolist():
        f = int(grid.flat[k])
        if index.is_empty(f):
            continue
        o, n = (int(x) for x in index.entries[f])
        if out and out[-1][0] + out[-1][1] == o:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((o, n))
    return out


def splice_shard(
    codec: ShardCodec,
    index: ShardIndex,
    stored: Mapping[Range, Any],
    updates: Sequence[Update],
    valid: Sequence[int],
    key: str,
    *,
    write_empty_chunks: bool = False,
    threads: int | None = None,
) -> Splice | None:
    """The shard with ``updates`` (pieces relative to the shard's origin and their values,
    applied in order) merged in, as segments; ``stored``: the bytes of the ranges
    :func:`needed` named. None when no inner chunk is left (all fill)."""
    grid = _Grid.of(codec, valid)
    touched, _ = grid.touched(updates)
    new = {k: _chunk(codec, index, stored, updates, grid, k, key, write_empty_chunks, threads)
           for k in np.flatnonzero(touched).tolist()}  # fmt: skip
    ids: list[int] = []
    sizes: list[int] = []
    body: list[Any] = []  # segments of the data region, in order
    for k, f in enumerate(grid.flat.tolist()):
        if k in new:
            part = new[k]
            if part is None:
                continue
            body.append(part)
            n = len(part)
        elif index.is_empty(f):
            continue
        else:
            o, n = (int(x) for x in index.entries[f])
            last = body[-1] if body else None
            if isinstance(last, tuple) and last[0] + last[1] == o:
                body[-1] = (last[0], last[1] + n)  # neighbours in the stored shard: one range
            else:
                body.append((o, n))
        ids.append(f)
        sizes.append(n)
    if not ids:
        return None
    start = codec.index_nbytes if codec.index_location == "start" else 0
    size = np.asarray(sizes, dtype=np.uint64)
    offsets = np.uint64(start) + np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.uint64)
    idx = ShardIndex.build(codec.nchunks, np.asarray(ids), offsets, size).to_bytes(codec)
    segments = [idx, *body] if codec.index_location == "start" else [*body, idx]
    total = start + int(size.sum()) + (0 if start else codec.index_nbytes)
    return Splice(segments, total, len(ids), len(grid.flat) - len(ids))


def _chunk(
    codec: ShardCodec,
    index: ShardIndex,
    stored: Mapping[Range, Any],
    updates: Sequence[Update],
    grid: _Grid,
    k: int,
    key: str,
    write_empty_chunks: bool,
    threads: int | None,
) -> Any:
    """Inner chunk ``k`` (of the grid inside the array) with the updates applied: encoded, or
    None when it is all fill (and empty chunks are not stored)."""
    inner, cs = codec.inner, codec.chunk_shape
    lo, hi = grid.lo[k], grid.hi[k]
    buf = np.full(cs, inner.fill_value, dtype=inner.dtype)
    f = int(grid.flat[k])
    o, n = (int(x) for x in index.entries[f])
    rng = (o, n)
    if not index.is_empty(f) and rng in stored:
        try:
            got = inner.decode(memoryview(stored[rng]))
        except (ValueError, CorruptShardError) as e:
            raise CorruptShardError(key, f"cannot decode: {e}", chunk=_coord(grid, k, cs)) from None
        buf[...] = inner.unstack(got[None], (1,) * len(cs))
    for piece, block in updates:
        a = np.maximum(lo, [p.start for p in piece])
        b = np.minimum(hi, [p.stop for p in piece])
        if (a >= b).any():
            continue
        dst = tuple(slice(int(x - y), int(z - y)) for x, y, z in zip(a, lo, b, strict=True))
        src = tuple(
            slice(int(x - p.start), int(z - p.start)) for x, z, p in zip(a, b, piece, strict=True)
        )
        buf[dst] = block[src]
    part = tuple(slice(0, int(h - low)) for low, h in zip(lo, hi, strict=True))
    (out,) = encode_chunks(codec, buf[part], write_empty_chunks=write_empty_chunks, threads=threads)
    return None if out is None else bytes(out)


def _coord(grid: _Grid, k: int, cs: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(a) // c for a, c in zip(grid.lo[k], cs, strict=True))
