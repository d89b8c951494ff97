"""One shard <-> bytes: the ``sharding_indexed`` v1.0 format.

A shard is the encoded inner chunks followed (or preceded) by an index of ``(offset, nbytes)``
uint64 pairs, one per inner chunk in C order, ``2**64 - 1`` twice for an empty chunk, encoded
with ``bytes`` (little or big endian) and optionally ``crc32c``. This module holds the codec and
the encoding (whole shards, merges); the index is in :mod:`.index`, the decoding in :mod:`.decode`.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..core.layout import Layout
from ..errors import CorruptShardError
from ..runtime import pool as _pool
from ..runtime.units import SMALL_CHUNK, UNIT_BYTES
from .chunks import ChunkCodec, Endian

# the index and the decoding live in their own modules (the decoders: .decode)
from .decode import decode_shard_bytes, reused_array
from .frames import FrameArena
from .index import MISSING, IndexLocation, ShardIndex, encode_index, index_slice, parse_index
from .mosaic import Box, Mosaic
from .single import NOT_ONE, encode_one

__all__ = [
    "MISSING",
    "EncodedShard",
    "IndexLocation",
    "ShardCodec",
    "ShardIndex",
    "decode_shard_bytes",
    "empty_shard",
    "encode_chunks",
    "encode_index",
    "encode_shard",
    "index_slice",
    "merge_shard",
    "parse_index",
    "reused_array",
    "units",
]

# each thread's depth of nested encode_shard calls (its buffers are decode.reused_array's)
_local = threading.local()


@dataclass(frozen=True)
class ShardCodec:
    """Configuration of one ``sharding_indexed`` codec, for shards of ``shard_shape``."""

    shard_shape: tuple[int, ...]
    inner: ChunkCodec
    index_location: IndexLocation = "end"
    index_endian: Endian = "little"
    index_crc: bool = True
    # a 0-d array's one chunk stored as is, without the sharding codec (zarr's plain v3 chunk,
    # what every Zarr reader takes): the object is the chunk, an index of one entry implied
    plain: bool = False

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        return self.inner.chunk_shape

    @cached_property
    def geometry(self) -> Layout:
        """One shard's grid of inner chunks, by the array layout's own rules (computed once)."""
        return Layout(self.shard_shape, self.shard_shape, self.chunk_shape)

    @property
    def grid(self) -> tuple[int, ...]:
        return self.geometry.chunks_per_shard

    @cached_property
    def nchunks(self) -> int:  # kept: asked once a shard written
        return self.geometry.nchunks_per_shard

    @property
    def index_nbytes(self) -> int:
        if self.plain:
            return 0
        return 16 * self.nchunks + (4 if self.index_crc else 0)

    # -- as the serializer of an outer chain (nested sharding: chunks.Serializer) ----------------

    def encode_chunk(self, item: np.ndarray) -> bytes:
        """One outer chunk as a whole shard of this codec (every inner chunk stored)."""
        encoded = encode_shard(self, item, write_empty_chunks=True, threads=1)
        return b"" if encoded is None else encoded.data

    def decode_chunk(self, data: bytes) -> np.ndarray:
        return decode_shard_bytes(self, data, key="<nested>")

    def max_encoded_nbytes(self, raw_nbytes: int) -> int:
        # incompressible inner chunks may grow a little, plus the index
        return 2 * raw_nbytes + self.index_nbytes + 4096

    def to_dict(self) -> dict[str, Any]:
        """The codec's zarr.json entry (the inner chain must be native)."""
        inner = self.inner
        codecs: list[dict[str, Any]] = []
        if inner.order is not None:
            codecs.append({"name": "transpose", "configuration": {"order": list(inner.order)}})
        if inner.nested is not None:
            codecs.append(inner.nested.to_dict())
        else:
            cfg = {} if inner.endian is None else {"endian": inner.endian}
            codecs.append({"name": "bytes", "configuration": cfg})
        codecs.extend(c.to_dict() for c in inner.bytes_codecs)
        index = [{"name": "bytes", "configuration": {"endian": self.index_endian}}]
        if self.index_crc:
            index.append({"name": "crc32c"})
        return {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": list(self.chunk_shape),
                "codecs": codecs,
                "index_codecs": index,
                "index_location": self.index_location,
            },
        }


# -- encode ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodedShard:
    """An encoded shard as its parts (chunks and index, in order): no joined copy until asked."""

    parts: list[Any]
    chunks_stored: int
    chunks_empty: int
    raw_nbytes: int

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.parts))

    @property
    def data(self) -> bytes:
        return b"".join(self.parts)


def units(used: Sequence[int], raw_nbytes: int) -> list[tuple[tuple[int, int], ...]]:
    """Boxes of the inner-chunk grid ``used`` (``(start, stop)`` per axis), in C order, each
    one pool task's share of a shard: one chunk when chunks are large (each is compressed on its
    own), else about :data:`UNIT_BYTES` of small chunks spanning the trailing grid axes, so the
    chunks of a box are consecutive in C order and compressed in one batch.

    >>> units((2, 4), 4096)[:2]  # 64 small chunks per unit: whole rows, all of them here
    [((0, 2), (0, 4))]
    >>> units((2, 2), 2**20)[:2]  # one large chunk per unit
    [((0, 1), (0, 1)), ((0, 1), (1, 2))]
    """
    nd = len(used)
    if nd == 0:
        return [()]
    k, span = nd - 1, raw_nbytes  # the axis the boxes split, and the bytes of one step along it
    if raw_nbytes < SMALL_CHUNK:
        while k > 0 and span * used[k] <= UNIT_BYTES:
            span *= used[k]
            k -= 1
    step = max(1, UNIT_BYTES // span) if raw_nbytes < SMALL_CHUNK else 1
    out = []
    for head in itertools.product(*(range(n) for n in used[:k])):
        for a in range(0, used[k], step):
            out.append(
                (
                    *((i, i + 1) for i in head),
                    (a, min(a + step, used[k])),
                    *((0, n) for n in used[k + 1 :]),
                )
            )
    return out


# one unit's encoded chunks: the encoded size of each chunk of the unit in C order (-1: not
# stored), and bytes-like parts whose concatenation is the stored chunks' bytes, in that order
Run = tuple[np.ndarray, list[Any]]


def encode_chunks(
    codec: ShardCodec,
    block: np.ndarray | Mosaic,
    *,
    write_empty_chunks: bool = False,
    threads: int | None = None,
    wanted: np.ndarray | None = None,
    frames: FrameArena | None = None,
) -> list[Any]:
    """The encoded inner chunks of ``block`` (a shard's region, clipped at the array's edge),
    one per chunk of its grid in C order: None for a chunk equal to the fill value (unless
    ``write_empty_chunks``) or not ``wanted`` (a flat boolean mask over that grid).

    The pool tasks take :func:`units` of the chunks: each copies its unit out of ``block`` into a
    buffer its thread reuses (padded with the fill value at the array's edges, cast to the stored
    dtype), checks it for fill and compresses it. Memory beyond ``block`` and the encoded chunks:
    one small buffer per pool thread, whatever the shard size; no fresh pages. ``frames``: an
    arena the compressed chunks are kept in (:mod:`.frames`), lent by a caller that stores them.
    A :class:`~.mosaic.Mosaic` block is encoded piece by piece (no ``wanted`` then).
    """
    used = tuple(-(-n // c) for n, c in zip(block.shape, codec.chunk_shape, strict=True))
    runs, ids = _encode_runs(codec, block, write_empty_chunks, threads, wanted, frames)
    return _in_order(runs, ids, math.prod(used))


def _in_order(runs: list[Run], ids: list[np.ndarray] | None, n: int) -> list[Any]:
    """The chunks of ``runs`` one by one, in C order of the grid of ``n`` chunks (see
    :func:`_encode_runs`)."""
    if ids is None:
        return [p for run in runs for p in _split(run)]
    out: list[Any] = [None] * n
    for run, at in zip(runs, ids, strict=True):
        for i, p in zip(at.tolist(), _split(run), strict=True):
            out[i] = p
    return out


def _split(run: Run) -> list[Any]:
    """A run as one bytes-like per chunk of its unit (None where none is stored)."""
    sizes, parts = run
    stored = sizes >= 0
    if len(parts) == int(np.count_nonzero(stored)):  # one part per stored chunk
        pieces = iter(parts)
    else:  # the stored chunks joined into one part
        mv = memoryview(parts[0])
        ends = np.cumsum(sizes[stored]).tolist()
        pieces = iter([mv[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)])
    return [next(pieces) if s else None for s in stored.tolist()]


def _encode_runs(
    codec: ShardCodec,
    block: np.ndarray | Mosaic,
    write_empty_chunks: bool,
    threads: int | None,
    wanted: np.ndarray | None,
    frames: FrameArena | None,
) -> tuple[list[Run], list[np.ndarray] | None]:
    """The runs of :func:`encode_chunks`, one per unit; for a ``Mosaic``, also the C-order
    positions in the block's grid of each run's chunks (None: the runs are in C order)."""
    assert wanted is None or not isinstance(block, Mosaic)
    inner = codec.inner
    cs = codec.chunk_shape
    used = tuple(-(-n // c) for n, c in zip(block.shape, cs, strict=True))
    mosaic = block if isinstance(block, Mosaic) else None

    def encode_unit(src: np.ndarray, box: Box, want: np.ndarray | None, name: str) -> Run:
        # ``box``: chunks of ``src``'s grid (the block's, or a mosaic piece's)
        ugrid = tuple(b - a for a, b in box)
        sizes = np.full(math.prod(ugrid), -1, dtype=np.int64)
        if want is not None and not want.any():
            return sizes, []
        region: tuple[Any, ...] = tuple(
            slice(a * c, min(b * c, n)) for (a, b), c, n in zip(box, cs, src.shape, strict=True)
        )
        part = src[(*region, Ellipsis)]  # a view, also of a 0-d block
        full = tuple(g * c for g, c in zip(ugrid, cs, strict=True))
        if part.shape != full:  # at the array's edge: grow to whole chunks with the fill value
            grown = np.full(full, inner.fill_value, dtype=inner.dtype)
            grown[tuple(slice(0, n) for n in part.shape)] = part
            part = grown
        if inner.stack_is_view(part, ugrid):
            stack = inner.stack(part, ugrid)
        else:
            shape = (math.prod(ugrid), *inner.stored_shape)
            stack = inner.stack(part, ugrid, out=reused_array(shape, inner.stored_dtype, name))
        # which chunks to store, as numpy masks over the unit: no Python per chunk
        keep = np.ones(len(sizes), dtype=bool) if write_empty_chunks else ~inner.fill_mask(stack)
        if want is not None:
            keep &= want
        rows = np.flatnonzero(keep)
        if not rows.size:
            return sizes, []
        # a mosaic's chunks go to the shard one by one, in C order: not joined per unit
        sizes[rows], parts = inner.encode_run(stack, rows, frames, join=mosaic is None)
        return sizes, parts

    def wanted_of(box: Box) -> np.ndarray | None:
        if wanted is None:
            return None
        first = int(np.ravel_multi_index(tuple(a for a, _ in box), used)) if box else 0
        return wanted[first : first + math.prod(b - a for a, b in box)]

    def run(batch: Sequence[Any]) -> list[Run]:
        # a nested shard codec encodes its chunks with encode_shard again, inline in this
        # thread: each level stacks into its own reused buffer
        depth = getattr(_local, "encode_depth", 0)
        _local.encode_depth = depth + 1
        name = f"encode-stack-{depth}"
        try:
            if isinstance(block, Mosaic):
                return [encode_unit(arr, box, None, name) for arr, box, _ids in batch]
            return [encode_unit(block, box, wanted_of(box), name) for box in batch]
        finally:
            _local.encode_depth = depth

    if isinstance(block, Mosaic):
        # each piece's chunks are gathered from the piece; results go to their C-order places
        work = block.work(cs, lambda grid: units(grid, inner.raw_nbytes))
        return _pool.map_batches(run, work, threads), [ids for _arr, _box, ids in work]
    return _pool.map_batches(run, units(used, inner.raw_nbytes), threads), None


def encode_shard(
    codec: ShardCodec,
    block: np.ndarray | Mosaic,
    *,
    write_empty_chunks: bool = False,
    threads: int | None = None,
    frames: FrameArena | None = None,
    views: bool = False,
) -> EncodedShard | None:
    """Encode one shard from ``block``, the shard's region of the array (clipped at the edges).

    Inner chunks equal to the fill value bit for bit are not stored unless ``write_empty_chunks``.
    Returns None when no inner chunk is stored. The same input always gives the same bytes.
    The chunks are encoded as :func:`encode_chunks` does (into ``frames`` when given: parts are
    then views of that arena, valid while the caller holds it), kept as their units' runs: the
    index is built from the runs' sizes with numpy, the parts are the runs' (no Python per chunk).
    ``views``: a shard of one raw chunk may be a view of ``block`` (the caller stores it before
    ``block`` changes).
    """
    one = encode_one(codec, block, write_empty_chunks, frames, views)  # one whole chunk
    if one is not NOT_ONE:
        return None if one is None else EncodedShard(one, 1, 0, block.nbytes)
    # only inner chunks holding array elements are encoded; the rest of the grid stays empty
    used = tuple(-(-n // c) for n, c in zip(block.shape, codec.chunk_shape, strict=True))
    runs, ids = _encode_runs(codec, block, write_empty_chunks, threads, None, frames)
    if ids is None:
        sizes = np.concatenate([s for s, _ in runs]) if runs else np.zeros(0, np.int64)
        pieces = [p for _, parts in runs for p in parts]
    else:  # a mosaic's runs are in the pieces' order: to C order, chunk by chunk
        got = _in_order(runs, ids, math.prod(used))
        sizes = np.fromiter((-1 if p is None else len(p) for p in got), np.int64, len(got))
        pieces = [p for p in got if p is not None]
    done = np.flatnonzero(sizes >= 0)
    if not done.size:
        return None
    # positions in the grid of used chunks -> positions in the shard's full chunk grid
    flat_ids = np.ravel_multi_index(np.unravel_index(done, used), codec.grid) if used else done
    return EncodedShard(
        parts=_assemble(codec, flat_ids, sizes[done].astype(np.uint64), pieces),
        chunks_stored=int(done.size),
        chunks_empty=int(math.prod(used) - done.size),
        raw_nbytes=block.nbytes,
    )


def _assemble(
    codec: ShardCodec, flat_ids: np.ndarray, sizes: np.ndarray, pieces: Sequence[Any]
) -> list[Any]:
    """Shard parts from the encoded chunks at C-order positions ``flat_ids`` (ascending), of
    ``sizes`` bytes (uint64), held in order by ``pieces`` (one or more chunks per piece)."""
    start = codec.index_nbytes if codec.index_location == "start" else 0
    offsets = np.empty_like(sizes)
    offsets[0] = start
    np.cumsum(sizes[:-1], out=offsets[1:])
    offsets[1:] += np.uint64(start)
    index_bytes = ShardIndex.build(codec.nchunks, flat_ids, offsets, sizes).to_bytes(codec)
    if codec.index_location == "start":
        return [index_bytes, *pieces]
    return [*pieces, index_bytes]


def merge_shard(
    codec: ShardCodec,
    old: bytes | None,
    block: np.ndarray,
    piece: Sequence[slice],
    valid_shape: Sequence[int],
    key: str,
    *,
    write_empty_chunks: bool = False,
    threads: int | None = None,
) -> EncodedShard | None:
    """Write ``block`` into the ``piece`` (relative to the shard origin) of a stored shard.

    Inner chunks the piece does not touch keep their encoded bytes as stored; chunks it covers in
    part are decoded, overlaid and re-encoded; chunks it covers fully are encoded from ``block``.
    ``valid_shape`` is the shard's extent inside the array.
    """
    inner = codec.inner
    cs = codec.chunk_shape
    used = tuple(-(-n // c) for n, c in zip(valid_shape, cs, strict=True))
    mv = memoryview(old) if old is not None else None
    index = ShardIndex.empty(codec.nchunks) if mv is None else ShardIndex.of_shard(codec, mv, key)
    grid_ids = np.arange(math.prod(used))
    coords = np.stack(np.unravel_index(grid_ids, used), -1)
    lo = coords * np.asarray(cs)
    hi = np.minimum(lo + np.asarray(cs), np.asarray(valid_shape))
    plo = np.asarray([p.start for p in piece])
    phi = np.asarray([p.stop for p in piece])
    touched = ((lo < phi) & (hi > plo)).all(axis=1)
    covered = ((lo >= plo) & (hi <= phi)).all(axis=1)
    flat_ids = np.ravel_multi_index(tuple(coords.T), codec.grid)

    shape = tuple(u * c for u, c in zip(used, cs, strict=True))
    buf = np.full(shape, inner.fill_value, dtype=inner.dtype)
    for g in np.flatnonzero(touched & ~covered):
        o, n = index.entries[flat_ids[g]]
        if o == MISSING or mv is None:
            continue
        chunk = tuple(int(x) for x in coords[g])
        try:
            stored = inner.decode(mv[int(o) : int(o) + int(n)])
        except (ValueError, CorruptShardError) as e:
            raise CorruptShardError(key, f"cannot decode: {e}", chunk=chunk) from None
        region = tuple(slice(int(a), int(a) + c) for a, c in zip(lo[g], cs, strict=True))
        buf[region] = inner.unstack(stored[None], (1,) * len(cs))
    buf[tuple(piece)] = block
    got = encode_chunks(
        codec, buf, write_empty_chunks=write_empty_chunks, threads=threads, wanted=touched
    )
    encoded = {k: p for k, p in enumerate(got) if p is not None}
    ids, pieces = [], []
    for k in range(len(grid_ids)):
        if k in encoded:
            ids.append(flat_ids[k])
            pieces.append(encoded[k])
        elif not touched[k] and mv is not None and not index.is_empty(flat_ids[k]):
            start, size = (int(x) for x in index.entries[flat_ids[k]])
            ids.append(flat_ids[k])
            pieces.append(mv[start : start + size])
    if not pieces:
        return None
    order = np.argsort(np.asarray(ids), kind="stable")
    sizes = np.fromiter((len(pieces[i]) for i in order), dtype=np.uint64, count=len(order))
    return EncodedShard(
        parts=_assemble(codec, np.asarray(ids)[order], sizes, [pieces[i] for i in order]),
        chunks_stored=len(pieces),
        chunks_empty=int(len(grid_ids) - len(pieces)),
        raw_nbytes=block.nbytes,
    )


def empty_shard(codec: ShardCodec) -> list[bytes]:
    """A shard without inner chunks (its index only): every element reads as the fill value."""
    return [ShardIndex.empty(codec.nchunks).to_bytes(codec)]
