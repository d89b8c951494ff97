"""Decoding shards: inner chunks fetched through a validated index, decoded into a stack or
straight into place in an output array, on the pool.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import CorruptShardError
from ..runtime import pool as _pool
from ..runtime.units import SMALL_CHUNK
from .chunks import ChunkCodec, ChunkDecodeError, raw_view
from .index import MISSING, ShardFormat, ShardIndex

Fetch = Callable[[np.ndarray], tuple[Any, np.ndarray]]


def box_coords(box: Sequence[range]) -> np.ndarray:
    """``(n, ndim)`` C-ordered coordinates of the inner chunks in a box of ranges."""
    if not box:  # 0-d array: one chunk
        return np.zeros((1, 0), dtype=np.intp)
    grids = np.meshgrid(*[np.asarray(r) for r in box], indexing="ij")
    return np.stack(grids, -1).reshape(-1, len(box))


def decode_chunks(
    codec: ShardFormat,
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
    codec: ShardFormat,
    index: ShardIndex,
    box: Sequence[range],
    local: Sequence[slice],
    fetch: Fetch,
    out: np.ndarray,
    threads: int | None = None,
    fetch_bytes: int | None = None,
) -> None:
    """Decode the chunks of ``box`` and copy their part ``local`` (relative to the shard origin)
    into ``out``.

    The box is cut into slabs of chunk rows handled in parallel, each decoded and copied into
    ``out`` by the same pool thread: no stack of the whole box, and the copies run in parallel.
    ``fetch_bytes``: large chunks are fetched at most this many raw bytes of them at a time
    (default: all of a pool task's chunks in one fetch).
    """
    if each_chunk(codec, box):
        _decode_each_into(codec, index, box, local, fetch, out, threads, fetch_bytes)
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


def each_chunk(codec: ShardFormat, box: Sequence[range]) -> bool:
    """True when :func:`decode_into` decodes the chunks of ``box`` one by one straight into
    place (large inner chunks of a chain shardwise runs itself), not through a stack."""
    inner = codec.inner
    return (
        bool(box)
        and inner.raw_nbytes >= SMALL_CHUNK
        and inner.nested is None
        and inner.zarr_chain is None
    )


def _places(
    coords: np.ndarray, cs: Sequence[int], local: Sequence[slice]
) -> tuple[list[tuple[slice, ...]], list[tuple[slice, ...] | None]]:
    """Where each chunk of ``coords`` lands in the output of ``local``, and which part of the
    chunk lands there (None: all of it); computed for all chunks at once, with numpy."""
    c = np.asarray(cs, dtype=np.int64)
    lo = coords * c
    starts = np.asarray([sl.start for sl in local], dtype=np.int64)
    stops = np.asarray([sl.stop for sl in local], dtype=np.int64)
    a = np.maximum(lo, starts)
    b = np.minimum(lo + c, stops)
    whole = ((a == lo) & (b == lo + c)).all(axis=1).tolist()
    d0, d1 = (a - starts).tolist(), (b - starts).tolist()
    s0, s1 = (a - lo).tolist(), (b - lo).tolist()
    dst = [tuple(map(slice, x, y)) for x, y in zip(d0, d1, strict=True)]
    src: list[tuple[slice, ...] | None] = [
        None if w else tuple(map(slice, x, y)) for w, x, y in zip(whole, s0, s1, strict=True)
    ]
    return dst, src


def _decode_each_into(
    codec: ShardFormat,
    index: ShardIndex,
    box: Sequence[range],
    local: Sequence[slice],
    fetch: Fetch,
    out: np.ndarray,
    threads: int | None,
    fetch_bytes: int | None = None,
) -> None:
    """:func:`decode_into` for large chunks: each chunk is decoded and copied straight into
    ``out`` by a pool thread (no stack: one pass over the output's memory).

    The places of the chunks in ``out`` are computed once for the whole box, with numpy; a
    chunk that is a contiguous run of ``out`` is decoded into it, any other into the thread's
    reused chunk buffer and copied from there (the one copy left): little Python per chunk."""
    inner, key = codec.inner, index.key
    coords = box_coords(box)
    entries = index.ranges(np.ravel_multi_index(tuple(coords.T), codec.grid))
    inv = None if inner.order is None else [int(i) for i in np.argsort(inner.order)]
    dst, src = _places(coords, codec.chunk_shape, local)
    present = entries[:, 0] != MISSING
    for i in np.flatnonzero(~present).tolist():
        out[dst[i]] = inner.fill_value
    todo = np.flatnonzero(present)
    if not todo.size:
        return
    into = inner.decoder_into(out.dtype)
    per_fetch = len(todo) if fetch_bytes is None else max(1, fetch_bytes // inner.raw_nbytes)

    def run(js: Sequence[int]) -> list[None]:
        chunk = reused_array(inner.stored_shape, inner.stored_dtype, "chunk")
        chunk_raw = raw_view(chunk) if into is not None else None
        for a in range(0, len(js), per_fetch):
            sub = todo[js[a] : js[min(a + per_fetch, len(js)) - 1] + 1]
            # each batch fetches its own chunks: range reads run on the pool, next to decoding
            buf, segs = fetch(entries[sub])
            mv = memoryview(buf)
            for i, (o, n) in zip(sub.tolist(), segs.tolist(), strict=True):
                try:
                    _decode_one(
                        inner, into, mv[o : o + n], out, dst[i], src[i], chunk, chunk_raw, inv
                    )
                except ValueError as e:
                    c = tuple(int(x) for x in coords[i])
                    raise CorruptShardError(key, f"cannot decode: {e}", chunk=c) from None
        return [None] * len(js)

    _pool.map_batches(run, list(range(len(todo))), threads)


def _decode_one(
    inner: ChunkCodec,
    into: Callable[[Any, memoryview], bool] | None,
    data: memoryview,
    out: np.ndarray,
    dst: tuple[slice, ...],
    src: tuple[slice, ...] | None,
    chunk: np.ndarray,
    chunk_raw: memoryview | None,
    inv: list[int] | None,
) -> None:
    """Decode one chunk's ``data`` and copy its part ``src`` to ``out[dst]``."""
    target = out[dst]
    if into is not None and src is None and target.flags.c_contiguous:  # noqa: SIM102
        if into(data, raw_view(target)):
            return  # decoded in place: a whole chunk, contiguous in the output
    value = chunk
    if into is None or chunk_raw is None or not into(data, chunk_raw):
        value = inner.decode(data)
    if inv is not None:
        value = value.transpose(inv)
    target[...] = value if src is None else value[src]


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
    codec: ShardFormat,
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
    codec: ShardFormat, data: bytes, key: str, threads: int | None = 1
) -> np.ndarray:
    """Decode a whole shard held in memory into an array of ``codec.shard_shape``."""
    mv = memoryview(data)
    index = ShardIndex.of_shard(codec, mv, key)
    coords = box_coords([range(g) for g in codec.grid])
    stack = decode_chunks(codec, index, coords, lambda entries: (mv, entries), threads)
    return codec.inner.unstack(stack, codec.grid)
