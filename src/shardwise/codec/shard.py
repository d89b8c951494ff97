"""One shard <-> bytes: the ``sharding_indexed`` v1.0 format.

A shard is the encoded inner chunks followed (or preceded) by an index of ``(offset, nbytes)``
uint64 pairs, one per inner chunk in C order, ``2**64 - 1`` twice for an empty chunk, encoded
with ``bytes`` (little or big endian) and optionally ``crc32c``.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from ..core.layout import Layout
from ..errors import CorruptShardError
from ..runtime import pool as _pool
from ..runtime.units import SMALL_CHUNK, UNIT_BYTES
from .chunks import ChunkCodec, ChunkDecodeError, Endian
from .codecs import crc32c

MISSING = np.uint64(2**64 - 1)
IndexLocation = Literal["start", "end"]


@dataclass(frozen=True)
class ShardCodec:
    """Configuration of one ``sharding_indexed`` codec, for shards of ``shard_shape``."""

    shard_shape: tuple[int, ...]
    inner: ChunkCodec
    index_location: IndexLocation = "end"
    index_endian: Endian = "little"
    index_crc: bool = True

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

    @property
    def nchunks(self) -> int:
        return self.geometry.nchunks_per_shard

    @property
    def index_nbytes(self) -> int:
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
        return sum(len(p) for p in self.parts)

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


def encode_chunks(
    codec: ShardCodec,
    block: np.ndarray,
    *,
    write_empty_chunks: bool = False,
    threads: int | None = None,
    wanted: np.ndarray | None = None,
) -> list[Any]:
    """The encoded inner chunks of ``block`` (a shard's region, clipped at the array's edge),
    one per chunk of its grid in C order: None for a chunk equal to the fill value (unless
    ``write_empty_chunks``) or not ``wanted`` (a flat boolean mask over that grid).

    The pool tasks take :func:`units` of the chunks: each copies its unit out of ``block`` into a
    buffer its thread reuses (padded with the fill value at the array's edges, cast to the stored
    dtype), checks it for fill and compresses it. Memory beyond ``block`` and the encoded chunks:
    one small buffer per pool thread, whatever the shard size; no fresh pages.
    """
    inner = codec.inner
    cs = codec.chunk_shape
    used = tuple(-(-n // c) for n, c in zip(block.shape, cs, strict=True))

    def encode_unit(box: tuple[tuple[int, int], ...], name: str) -> list[Any]:
        ugrid = tuple(b - a for a, b in box)
        first = int(np.ravel_multi_index(tuple(a for a, _ in box), used)) if box else 0
        want = None if wanted is None else wanted[first : first + math.prod(ugrid)]
        if want is not None and not want.any():
            return [None] * len(want)
        region: tuple[Any, ...] = tuple(
            slice(a * c, min(b * c, n)) for (a, b), c, n in zip(box, cs, block.shape, strict=True)
        )
        part = block[(*region, Ellipsis)]  # a view, also of a 0-d block
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
        rows = range(stack.shape[0])
        skip = [False] * len(rows) if write_empty_chunks else inner.fill_mask(stack).tolist()
        if want is not None:
            skip = [s or not w for s, w in zip(skip, want.tolist(), strict=True)]
        keep = [i for i in rows if not skip[i]]
        done = iter(inner.encode_rows(stack, keep) if keep else [])
        return [None if e else next(done) for e in skip]

    def run(batch: Sequence[tuple[tuple[int, int], ...]]) -> list[list[Any]]:
        # a nested shard codec encodes its chunks with encode_shard again, inline in this
        # thread: each level stacks into its own reused buffer
        depth = getattr(_local, "encode_depth", 0)
        _local.encode_depth = depth + 1
        try:
            return [encode_unit(box, f"encode-stack-{depth}") for box in batch]
        finally:
            _local.encode_depth = depth

    return [
        p for unit in _pool.map_batches(run, units(used, inner.raw_nbytes), threads) for p in unit
    ]


def encode_shard(
    codec: ShardCodec,
    block: np.ndarray,
    *,
    write_empty_chunks: bool = False,
    threads: int | None = None,
) -> EncodedShard | None:
    """Encode one shard from ``block``, the shard's region of the array (clipped at the edges).

    Inner chunks equal to the fill value bit for bit are not stored unless ``write_empty_chunks``.
    Returns None when no inner chunk is stored. The same input always gives the same bytes.
    The chunks are encoded by :func:`encode_chunks`.
    """
    # only inner chunks holding array elements are encoded; the rest of the grid stays empty
    used = tuple(-(-n // c) for n, c in zip(block.shape, codec.chunk_shape, strict=True))
    got = encode_chunks(codec, block, write_empty_chunks=write_empty_chunks, threads=threads)
    keep = np.fromiter((p is not None for p in got), dtype=bool, count=len(got))
    pieces = [p for p in got if p is not None]
    if not pieces:
        return None
    done = np.flatnonzero(keep)
    # positions in the grid of used chunks -> positions in the shard's full chunk grid
    flat_ids = np.ravel_multi_index(np.unravel_index(done, used), codec.grid) if used else done
    return EncodedShard(
        parts=_assemble(codec, flat_ids, pieces),
        chunks_stored=len(pieces),
        chunks_empty=int(math.prod(used) - len(pieces)),
        raw_nbytes=block.nbytes,
    )


def _assemble(codec: ShardCodec, flat_ids: np.ndarray, pieces: Sequence[Any]) -> list[Any]:
    """Shard parts from encoded chunks ``pieces`` at C-order positions ``flat_ids`` (ascending)."""
    sizes = np.fromiter((len(p) for p in pieces), dtype=np.uint64, count=len(pieces))
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
    return EncodedShard(
        parts=_assemble(codec, np.asarray(ids)[order], [pieces[i] for i in order]),
        chunks_stored=len(pieces),
        chunks_empty=int(len(grid_ids) - len(pieces)),
        raw_nbytes=block.nbytes,
    )


def empty_shard(codec: ShardCodec) -> list[bytes]:
    """A shard without inner chunks (its index only): every element reads as the fill value."""
    return [ShardIndex.empty(codec.nchunks).to_bytes(codec)]


def encode_index(codec: ShardCodec, index: np.ndarray) -> bytes:
    dt = "<u8" if codec.index_endian == "little" else ">u8"
    raw = index.astype(dt, copy=False).tobytes()
    if codec.index_crc:
        raw += crc32c(raw).to_bytes(4, "little")
    return raw


# -- the index ------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ShardIndex:
    """The validated index of one shard: an ``(nchunks, 2)`` read-only uint64 array of
    ``(offset, nbytes)`` pairs in C order of the inner-chunk grid, ``MISSING`` in both fields for
    an empty chunk; ``key`` names the shard it was read from (in errors), "" for a new one."""

    entries: np.ndarray
    key: str = ""

    def __post_init__(self) -> None:
        entries = np.asarray(self.entries, dtype=np.uint64)
        if entries.ndim != 2 or entries.shape[1] != 2:
            raise ValueError(f"index entries have shape {entries.shape}, expected (n, 2)")
        view = entries.view()
        view.flags.writeable = False
        object.__setattr__(self, "entries", view)

    @classmethod
    def empty(cls, nchunks: int) -> ShardIndex:
        """An index of ``nchunks`` empty chunks."""
        return cls(np.full((nchunks, 2), MISSING, dtype=np.uint64))

    @classmethod
    def build(
        cls, nchunks: int, flat_ids: Any, offsets: Any, lengths: Any, key: str = ""
    ) -> ShardIndex:
        """``nchunks`` entries: the chunks at ``flat_ids`` stored at ``(offsets, lengths)``."""
        entries = np.full((nchunks, 2), MISSING, dtype=np.uint64)
        entries[flat_ids, 0] = offsets
        entries[flat_ids, 1] = lengths
        return cls(entries, key)

    @classmethod
    def from_bytes(
        cls, codec: ShardCodec, raw: bytes | memoryview, object_size: int, key: str
    ) -> ShardIndex:
        """Validate and decode a stored index of ``codec.index_nbytes`` bytes; ``object_size``
        is the size of the whole stored shard. Raises :class:`CorruptShardError` naming ``key``."""
        return cls(_parse(codec, raw, object_size, key), key)

    @classmethod
    def of_shard(cls, codec: ShardCodec, data: bytes | memoryview, key: str) -> ShardIndex:
        """The validated index of a whole shard held in memory."""
        mv = memoryview(data)
        return cls.from_bytes(codec, mv[index_slice(codec, len(mv))], len(mv), key)

    def to_bytes(self, codec: ShardCodec) -> bytes:
        """The stored form: ``bytes`` in the codec's byte order, then its crc32c if it has one."""
        return encode_index(codec, self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardIndex):
            return NotImplemented
        return bool(np.array_equal(self.entries, other.entries))

    __hash__ = None  # type: ignore[assignment]

    @property
    def offsets(self) -> np.ndarray:
        return self.entries[:, 0]

    @property
    def lengths(self) -> np.ndarray:
        return self.entries[:, 1]

    @property
    def stored(self) -> np.ndarray:
        """Boolean mask of the stored (non-empty) chunks."""
        result: np.ndarray = self.entries[:, 0] != MISSING
        return result

    def is_empty(self, flat: int) -> bool:
        return bool(self.entries[flat, 0] == MISSING)

    def ranges(self, chunks: Any) -> np.ndarray:
        """The ``(offset, nbytes)`` entries of the chunks at flat positions ``chunks``."""
        result: np.ndarray = self.entries[chunks]
        return result

    @property
    def nbytes_total(self) -> int:
        """The bytes of all stored chunks (the index itself not counted)."""
        return int(self.lengths[self.stored].sum())


def parse_index(
    codec: ShardCodec, raw: bytes | memoryview, object_size: int, key: str
) -> np.ndarray:
    """The entries of :meth:`ShardIndex.from_bytes` as a plain array."""
    return ShardIndex.from_bytes(codec, raw, object_size, key).entries


def _parse(codec: ShardCodec, raw: bytes | memoryview, object_size: int, key: str) -> np.ndarray:
    """Validate and decode a shard index of ``codec.index_nbytes`` bytes.

    ``object_size`` is the size of the whole stored shard. Returns an ``(nchunks, 2)`` uint64
    array in C order of the inner-chunk grid; empty entries are ``MISSING`` in both fields.
    """
    need = codec.index_nbytes
    if object_size < need:
        raise CorruptShardError(
            key, f"object is {object_size} bytes, smaller than its {need}-byte shard index"
        )
    if len(raw) != need:
        raise CorruptShardError(key, f"shard index is {len(raw)} bytes, expected {need}")
    body = memoryview(raw)
    if codec.index_crc:
        body, stored = body[:-4], int.from_bytes(body[-4:], "little")
        actual = crc32c(body)
        if actual != stored:
            raise CorruptShardError(
                key,
                f"shard index checksum mismatch (stored {stored:#010x}, computed {actual:#010x}); "
                f"index_location is {codec.index_location!r}",
            )
    dt = "<u8" if codec.index_endian == "little" else ">u8"
    index = np.frombuffer(body, dtype=dt).astype(np.uint64).reshape(-1, 2)
    offsets, sizes = index[:, 0], index[:, 1]
    miss_o, miss_n = offsets == MISSING, sizes == MISSING
    half = np.flatnonzero(miss_o != miss_n)
    if half.size:
        i = int(half[0])
        raise CorruptShardError(
            key,
            f"index entry (offset={int(offsets[i])}, nbytes={int(sizes[i])}): only one field is "
            "the empty marker 2**64-1",
            chunk=_coord(codec, i),
        )
    if codec.index_location == "start":
        lo, hi = need, object_size
    else:
        lo, hi = 0, object_size - need
    present = ~miss_o
    o, s = offsets[present], sizes[present]
    # compare without overflow: nbytes <= hi and offset <= hi - nbytes
    bad = (o < lo) | (s > hi) | (o > np.uint64(hi) - np.minimum(s, np.uint64(hi)))
    if bad.any():
        i = int(np.flatnonzero(present)[np.flatnonzero(bad)[0]])
        raise CorruptShardError(
            key,
            f"index entry (offset={int(offsets[i])}, nbytes={int(sizes[i])}) points outside the "
            f"data region [{lo}, {hi}) of a {object_size}-byte object",
            chunk=_coord(codec, i),
        )
    return index


def _coord(codec: ShardCodec, flat: int) -> tuple[int, ...]:
    return tuple(int(x) for x in np.unravel_index(flat, codec.grid))


def index_slice(codec: ShardCodec, object_size: int) -> slice:
    if codec.index_location == "start":
        return slice(0, codec.index_nbytes)
    return slice(object_size - codec.index_nbytes, object_size)


Fetch = Callable[[np.ndarray], tuple[Any, np.ndarray]]


def box_coords(box: Sequence[range]) -> np.ndarray:
    """``(n, ndim)`` C-ordered coordinates of the inner chunks in a box of ranges."""
    if not box:  # 0-d array: one chunk
        return np.zeros((1, 0), dtype=np.intp)
    grids = np.meshgrid(*[np.asarray(r) for r in box], indexing="ij")
    return np.stack(grids, -1).reshape(-1, len(box))


def decode_chunks(
    codec: ShardCodec,
    index: ShardIndex,
    coords: np.ndarray,
    fetch: Fetch,
    threads: int | None = None,
    reuse: bool = False,
) -> np.ndarray:
    """Decode the inner chunks at ``coords`` (an ``(n, ndim)`` array of chunk coordinates).

    ``fetch`` takes validated ``(offset, nbytes)`` index entries and returns ``(buffer,
    segments)``: a bytes-like object holding them and their ``(offset, nbytes)`` within it.
    Returns a stack of the chunks (see :meth:`ChunkCodec.stack`); empty chunks hold the fill
    value. ``reuse=True``: the stack is the calling thread's reused buffer (or a new read-only
    one), valid until its next such call (for callers that copy it out at once). Errors name
    ``index.key``.
    """
    inner, key = codec.inner, index.key
    if coords.shape[1]:
        flat = np.ravel_multi_index(tuple(coords.T), codec.grid)
    else:
        flat = np.zeros(len(coords), dtype=np.intp)
    entries = index.ranges(flat)
    present = np.flatnonzero(entries[:, 0] != MISSING)
    shape = (len(flat), *inner.stored_shape)
    if reuse and present.size == len(flat) and (threads == 1 or len(flat) < 2):
        # every chunk stored: a small-chunk batch decodes into one new buffer used as the stack
        buf, segs = fetch(entries)
        stacked = inner.decode_batch(buf, segs)
        if stacked is not None:
            return stacked
        fetch = _fetched(buf, segs)
    stack = (
        reused_array(shape, inner.stored_dtype, "stack")
        if reuse
        else np.empty(shape, inner.stored_dtype)
    )
    if present.size < len(flat):
        stack[np.flatnonzero(entries[:, 0] == MISSING)] = inner.fill_value
    if present.size:
        buf, segs = fetch(entries[present])

        def run(js: Sequence[int]) -> list[None]:
            sel = np.asarray(js)
            try:
                inner.decode_rows(buf, segs[sel], stack, present[sel])
            except ChunkDecodeError as e:
                chunk = tuple(int(x) for x in coords[present[sel[e.pos]]])
                raise CorruptShardError(key, f"cannot decode: {e}", chunk=chunk) from None
            return [None] * len(js)

        _pool.map_batches(run, list(range(len(present))), threads)
    return stack


def decode_into(
    codec: ShardCodec,
    index: ShardIndex,
    box: Sequence[range],
    local: Sequence[slice],
    fetch: Fetch,
    out: np.ndarray,
    threads: int | None = None,
) -> None:
    """Decode the chunks of ``box`` and copy their part ``local`` (relative to the shard origin)
    into ``out``.

    The box is cut into slabs of chunk rows handled in parallel, each decoded and copied into
    ``out`` by the same pool thread: no stack of the whole box, and the copies run in parallel.
    """
    inner = codec.inner
    if box and inner.raw_nbytes >= SMALL_CHUNK and inner.nested is None and not inner.zarr_chain:
        _decode_each_into(codec, index, box, local, fetch, out, threads)
        return
    size = _pool.pool_size() if threads is None else threads
    if not box or len(box[0]) < 2 or size < 2:
        stack = decode_chunks(codec, index, box_coords(box), fetch, threads, reuse=True)
        scatter(codec, stack, box, local, out)
        return
    c0 = codec.chunk_shape[0]
    rows = box[0]
    nslab = min(len(rows), 4 * size)
    cuts = [rows.start + len(rows) * i // nslab for i in range(nslab + 1)]

    def run(slabs: Sequence[tuple[int, int]]) -> list[None]:
        for a, b in slabs:
            lo, hi = max(local[0].start, a * c0), min(local[0].stop, b * c0)
            sub_box = [range(a, b), *box[1:]]
            stack = decode_chunks(codec, index, box_coords(sub_box), fetch, threads=1, reuse=True)
            sub_local = (slice(lo, hi), *local[1:])
            o = local[0].start
            scatter(codec, stack, sub_box, sub_local, out[lo - o : hi - o])
        return [None] * len(slabs)

    _pool.map_batches(run, list(itertools.pairwise(cuts)), threads)


def _decode_each_into(
    codec: ShardCodec,
    index: ShardIndex,
    box: Sequence[range],
    local: Sequence[slice],
    fetch: Fetch,
    out: np.ndarray,
    threads: int | None,
) -> None:
    """:func:`decode_into` for large chunks: each chunk is decoded and copied straight into
    ``out`` by a pool thread (no stack: one pass over the output's memory)."""
    inner, cs, key = codec.inner, codec.chunk_shape, index.key
    coords = box_coords(box)
    entries = index.ranges(np.ravel_multi_index(tuple(coords.T), codec.grid))
    inv = None if inner.order is None else [int(i) for i in np.argsort(inner.order)]

    def place(c: Sequence[int]) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
        """Where chunk ``c`` lands in ``out``, and which part of the chunk lands there."""
        dst, src = [], []
        for ci, n, sl in zip(c, cs, local, strict=True):
            lo, hi = max(ci * n, sl.start), min(ci * n + n, sl.stop)
            dst.append(slice(lo - sl.start, hi - sl.start))
            src.append(slice(lo - ci * n, hi - ci * n))
        return tuple(dst), tuple(src)

    present = entries[:, 0] != MISSING
    for c in coords[~present].tolist():
        out[place(c)[0]] = inner.fill_value
    todo = np.flatnonzero(present)
    if not todo.size:
        return

    def run(js: Sequence[int]) -> list[None]:
        # each batch fetches its own chunks: range reads run on the pool, next to the decoding
        buf, segs = fetch(entries[todo[js[0] : js[-1] + 1]])
        mv = memoryview(buf)
        seg_list = segs.tolist()
        for k, j in enumerate(js):
            c = coords[todo[j]].tolist()
            o, n = seg_list[k]
            dst, src = place(c)
            try:
                if inner.decode_to(mv[o : o + n], out[dst]):
                    continue  # decoded in place: a whole chunk, contiguous in the output
                value = reused_array(inner.stored_shape, inner.stored_dtype, "chunk")
                if not inner.decode_to(mv[o : o + n], value):
                    value = inner.decode(mv[o : o + n])
            except ValueError as e:
                raise CorruptShardError(key, f"cannot decode: {e}", chunk=tuple(c)) from None
            if inv is not None:
                value = value.transpose(inv)
            out[dst] = value[src]
        return [None] * len(js)

    _pool.map_batches(run, list(range(len(todo))), threads)


def _fetched(buf: Any, segs: np.ndarray) -> Fetch:
    """A fetch answering with what was fetched already."""
    return lambda entries: (buf, segs)


_local = threading.local()
REUSED_MAX = 32 * 2**20  # larger buffers are allocated afresh (and freed) each time


def reused_array(shape: tuple[int, ...], dtype: np.dtype[Any], name: str) -> np.ndarray:
    """A per-thread buffer ``name`` as an array of ``shape`` (valid until the thread's next
    call for ``name``): decoding shard after shard into it costs no fresh pages."""
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes > REUSED_MAX or dtype.hasobject or dtype.kind not in "biufcmMSUV" or not nbytes:
        return np.empty(shape, dtype)
    buf: bytearray | None = getattr(_local, name, None)
    if buf is None or len(buf) < nbytes:
        buf = bytearray(nbytes)
        setattr(_local, name, buf)
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def scatter(
    codec: ShardCodec,
    stack: np.ndarray,
    box: Sequence[range],
    local: Sequence[slice],
    out: np.ndarray,
) -> None:
    """Copy the part ``local`` (relative to the shard origin) of a decoded box into ``out``."""
    inner = codec.inner
    bgrid = tuple(len(r) for r in box)
    cs = codec.chunk_shape
    aligned = all(
        sl.start == r.start * c and sl.stop == r.stop * c
        for sl, r, c in zip(local, box, cs, strict=True)
    )
    if aligned and out.shape == tuple(g * c for g, c in zip(bgrid, cs, strict=True)):
        # split out's axes (always a view) and copy once from the transposed stack
        split = [x for g, c in zip(bgrid, cs, strict=True) for x in (g, c)]
        nd = len(cs)
        axes = [x for i in range(nd) for x in (i, nd + i)]
        view = stack.reshape((*bgrid, *inner.stored_shape))
        if inner.order is not None:
            inv = np.argsort(inner.order)
            view = view.transpose([*range(nd), *(nd + int(i) for i in inv)])
        out.reshape(split)[...] = view.transpose(axes)
        return
    values = inner.unstack(stack, bgrid)
    origin = [r.start * c for r, c in zip(box, cs, strict=True)]
    out[...] = values[
        tuple(slice(s.start - o, s.stop - o) for s, o in zip(local, origin, strict=True))
    ]


def decode_shard_bytes(
    codec: ShardCodec, data: bytes, key: str, threads: int | None = 1
) -> np.ndarray:
    """Decode a whole shard held in memory into an array of ``codec.shard_shape``."""
    mv = memoryview(data)
    index = ShardIndex.of_shard(codec, mv, key)
    coords = box_coords([range(g) for g in codec.grid])
    stack = decode_chunks(codec, index, coords, lambda entries: (mv, entries), threads)
    return codec.inner.unstack(stack, codec.grid)
