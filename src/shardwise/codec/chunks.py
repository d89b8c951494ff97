"""The inner codec chain of a shard: how one inner chunk becomes bytes and back.

Chunks are handled in *stacks*: an array of shape ``(n, *stored_chunk_shape)`` holding n inner
chunks in the layout the ``bytes`` serializer writes (transpose codecs applied, byte order set).
Building a stack from a shard block, or a block from a stack, is one vectorized copy; each stacked
chunk is contiguous, so the codecs read and write it without further copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from ..compat import decode_sync, encode_sync
from ..runtime.units import SMALL_CHUNK
from .batches import count
from .codecs import Buffer, BytesCodec, Zstd
from .frames import FrameArena

Endian = Literal["little", "big"]


def _copy_into(data: Buffer, out: memoryview) -> bool:
    """The ``bytes``-only chain's decode into ``out``: the chunk's bytes copied."""
    if len(data) != len(out):
        raise ValueError(f"chunk holds {len(data)} bytes, expected {len(out)}")
    out[:] = data
    return True


def raw_view(a: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array as a flat memoryview (writable when ``a`` is).

    Through a uint8 view: the buffer protocol refuses some dtypes (datetime64, timedelta64).
    """
    return memoryview(a.reshape(-1).view(np.uint8))


class Serializer(Protocol):
    """A serializer given from outside the chain (a nested ``sharding_indexed`` codec): it turns
    one stored chunk into bytes and back. The chain runs its bytes codecs around it."""

    def encode_chunk(self, item: np.ndarray) -> bytes:
        """The bytes of one stored chunk."""
        ...

    def decode_chunk(self, data: bytes) -> np.ndarray:
        """One stored chunk from its bytes; raises ``ValueError`` when they are bad."""
        ...

    def max_encoded_nbytes(self, raw_nbytes: int) -> int:
        """The most bytes :meth:`encode_chunk` gives for a chunk of ``raw_nbytes`` raw bytes."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The serializer's entry in the chain's zarr.json codecs."""
        ...


class ChunkDecodeError(ValueError):
    """An inner chunk failed to decode; ``pos`` is its position in the batch."""

    def __init__(self, pos: int, problem: str) -> None:
        super().__init__(problem)
        self.pos = pos


@dataclass(frozen=True)
class ZarrChain:
    """A chain shardwise does not implement natively, run through zarr-python's codec objects."""

    codecs: tuple[Any, ...]
    zdtype: Any

    def _specs(self, shape: tuple[int, ...], fill_value: Any) -> list[Any]:
        from zarr.core.array_spec import ArrayConfig, ArraySpec
        from zarr.core.buffer import default_buffer_prototype

        spec = ArraySpec(
            shape=shape,
            dtype=self.zdtype,
            fill_value=fill_value,
            config=ArrayConfig(order="C", write_empty_chunks=True),
            prototype=default_buffer_prototype(),
        )
        specs = []
        for c in self.codecs:
            specs.append(spec)
            spec = c.resolve_metadata(spec)
        return specs

    def encode(self, chunk: np.ndarray, fill_value: Any) -> bytes:
        from zarr.core.buffer import default_buffer_prototype

        specs = self._specs(chunk.shape, fill_value)
        data: Any = default_buffer_prototype().nd_buffer.from_numpy_array(chunk)
        for c, spec in zip(self.codecs, specs, strict=True):
            data = encode_sync(c, data, spec)
        return bytes(data.to_bytes())

    def decode(self, data: bytes, shape: tuple[int, ...], fill_value: Any) -> np.ndarray:
        from zarr.core.buffer import default_buffer_prototype

        specs = self._specs(shape, fill_value)
        buf: Any = default_buffer_prototype().buffer.from_bytes(data)
        for c, spec in zip(reversed(self.codecs), reversed(specs), strict=True):
            buf = decode_sync(c, buf, spec)
        out: np.ndarray = np.asarray(buf.as_numpy_array()).reshape(shape)
        return out


@dataclass(frozen=True)
class ChunkCodec:
    """Inner chunk shape, dtype, fill value and the codec chain applied to every inner chunk.

    ``order`` is the composed permutation of the ``transpose`` codecs (None: identity); the
    serializer is ``bytes`` with ``endian`` (None for 1-byte types), or one given from outside
    (``nested``: a nested sharding codec, see :class:`Serializer`), or, when ``zarr_chain`` is
    set, the whole chain is zarr-python's.
    """

    chunk_shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fill_value: Any
    order: tuple[int, ...] | None = None
    endian: Endian | None = "little"
    bytes_codecs: tuple[BytesCodec, ...] = ()
    nested: Serializer | None = None
    zarr_chain: ZarrChain | None = None

    @property
    def stored_shape(self) -> tuple[int, ...]:
        if self.order is None:
            return self.chunk_shape
        return tuple(self.chunk_shape[i] for i in self.order)

    @property
    def stored_dtype(self) -> np.dtype[Any]:
        if self.nested is not None or self.zarr_chain is not None or self.dtype.itemsize == 1:
            return self.dtype
        return self.dtype.newbyteorder("<" if self.endian == "little" else ">")

    @property
    def raw_nbytes(self) -> int:
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    # -- stacks ---------------------------------------------------------------------------------

    def stack_is_view(self, block: np.ndarray, grid: Sequence[int]) -> bool:
        """True when :meth:`stack` of ``block`` is a view, not a copy: each chunk spans the
        trailing axes whole, so it already is a contiguous run of ``block``."""
        return (
            len(grid) > 0
            and all(g == 1 for g in grid[1:])
            and block.shape == tuple(g * c for g, c in zip(grid, self.chunk_shape, strict=True))
            and self.order is None
            and block.dtype == self.stored_dtype
            and block.flags.c_contiguous
        )

    def stack(
        self, block: np.ndarray, grid: Sequence[int], out: np.ndarray | None = None
    ) -> np.ndarray:
        """Cut ``block`` (shape ``grid * chunk_shape``) into a C-ordered stack of stored chunks:
        a view when :meth:`stack_is_view`, else a copy into ``out`` (of the stack's shape and
        stored dtype; a new array when None), cast to the stored dtype on the way."""
        nd = len(grid)
        if self.stack_is_view(block, grid):
            return block.reshape((grid[0], *self.chunk_shape))
        split = [x for g, c in zip(grid, self.chunk_shape, strict=True) for x in (g, c)]
        chunk_axes = [2 * i + 1 for i in range(nd)]
        if self.order is not None:
            chunk_axes = [chunk_axes[i] for i in self.order]
        axes = [2 * i for i in range(nd)] + chunk_axes
        view = block.reshape(split).transpose(axes)
        if out is None:
            out = np.empty((math.prod(grid), *self.stored_shape), dtype=self.stored_dtype)
        out.reshape(view.shape)[...] = view
        return out

    def unstack(self, stack: np.ndarray, grid: Sequence[int]) -> np.ndarray:
        """A view of ``stack`` as the block it came from (the inverse of :meth:`stack`)."""
        nd = len(grid)
        view = stack.reshape((*grid, *self.stored_shape))
        chunk_axes = list(range(nd, 2 * nd))
        if self.order is not None:
            inv = [0] * nd
            for pos, i in enumerate(self.order):
                inv[i] = pos
            chunk_axes = [nd + inv[i] for i in range(nd)]
        axes = [x for i in range(nd) for x in (i, chunk_axes[i])]
        shape = [g * c for g, c in zip(grid, self.chunk_shape, strict=True)]
        return view.transpose(axes).reshape(shape)

    def fill_mask(self, stack: np.ndarray) -> np.ndarray:
        """Boolean mask of the stacked chunks that equal the fill value bit for bit."""
        n = stack.shape[0]
        if n == 0:
            return np.zeros(0, dtype=bool)
        fill = np.array(self.fill_value, dtype=stack.dtype)
        size = stack.dtype.itemsize
        word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(size)
        if word is None or stack.dtype.hasobject:
            if stack.dtype.hasobject:
                flat = stack.reshape(n, -1)
                return np.array([bool(np.all(row == fill)) for row in flat])
            word, fill_words = np.uint8, fill.reshape(1).view(np.uint8)
        else:
            fill_words = fill.reshape(1).view(word)
        words = stack.reshape(n, -1).view(word)
        mask = words[:, 0] == fill_words[0]
        cand = np.flatnonzero(mask)
        if cand.size:  # the whole pattern only for chunks whose first word is the fill's
            pattern = np.tile(fill_words, words.shape[1] // fill_words.size)
            mask[cand] = (words[cand] == pattern).all(axis=1)
        result: np.ndarray = mask
        return result

    # -- many chunks ----------------------------------------------------------------------------

    @property
    def _zstd_first(self) -> Zstd | None:
        """The zstd codec when it is the first bytes codec of a plain ``bytes`` chain."""
        if self.nested is None and self.zarr_chain is None and self.bytes_codecs:
            first = self.bytes_codecs[0]
            if isinstance(first, Zstd):
                return first
        return None

    def encode_rows(
        self, stack: np.ndarray, rows: Sequence[int], frames: FrameArena | None = None
    ) -> list[Any]:
        """Encode the stacked chunks ``rows``; returns one bytes-like object per row.

        With zstd first in the chain, a whole batch is compressed in one call that releases the
        GIL (no Python per chunk), then the remaining codecs run per chunk. Large chunks are
        compressed one call each, into ``frames`` when given (see :meth:`encode`).
        """
        coll = self._multi_encode(stack, rows)
        if coll is None:
            return [self.encode(stack[i], frames) for i in rows]
        out: list[Any] = list(coll)
        for codec in self.bytes_codecs[1:]:
            out = [codec.encode(p) for p in out]
        return out

    def encode_run(
        self,
        stack: np.ndarray,
        rows: np.ndarray,
        frames: FrameArena | None = None,
        join: bool = True,
    ) -> tuple[np.ndarray, list[Any]]:
        """Encode the stacked chunks ``rows`` (ascending) as a *run*: their encoded sizes (int64)
        and bytes-like parts whose concatenation is the encoded chunks, in order.

        Small chunks of a zstd-only chain: one batch call, whose frames are joined into one
        bytes object by ``bytes.join`` over python-zstandard's collection. Both the sizes
        (``np.fromiter`` over ``map(len, ...)``) and the join are loops in C: no Python runs per
        chunk, no object per chunk survives the call, and the shard's parts are one per batch (a
        hand-written loop over the frames would cost an interpreted step per 4 KiB chunk, and
        one part per chunk makes the store join them again before its write). ``join=False``:
        one part per chunk (python-zstandard's own buffers, for a caller that reorders them).
        """
        coll = self._multi_encode(stack, rows) if len(self.bytes_codecs) == 1 else None
        if coll is None:
            parts = self.encode_rows(stack, rows.tolist(), frames)
            return np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)), parts
        sizes = np.fromiter(map(len, coll), dtype=np.int64, count=len(rows))
        return sizes, [b"".join(coll)] if join else list(coll)

    def _multi_encode(self, stack: np.ndarray, rows: Sequence[int] | np.ndarray) -> Any:
        """python-zstandard's collection of the zstd frames of ``stack[rows]``, compressed in one
        GIL-free call; None when the chain or the chunk size asks for one call per chunk."""
        zstd = self._zstd_first
        if zstd is None or len(rows) < 2 or self.raw_nbytes >= SMALL_CHUNK:
            return None
        raw = self.raw_nbytes
        segs = np.empty((len(rows), 2), dtype=np.uint64)
        segs[:, 0] = np.asarray(rows, dtype=np.uint64) * np.uint64(raw)
        segs[:, 1] = raw
        coll = zstd.multi_encode(raw_view(stack), segs)
        count("encodes")
        return coll

    def decode_rows(self, buf: Any, segs: np.ndarray, stack: np.ndarray, rows: np.ndarray) -> None:
        """Decode the chunks at ``segs`` ((offset, nbytes) pairs in ``buf``) into ``stack[rows]``.

        Raises :class:`ChunkDecodeError` naming the position (in ``rows``) of a bad chunk.
        """
        zstd = self._zstd_first
        if zstd is not None and len(rows) > 1:
            try:
                frames, fsegs = buf, segs
                if len(self.bytes_codecs) > 1:  # e.g. zstd + crc32c: checksums first, per chunk
                    frames, fsegs = self._outer_decode(buf, segs)
                values = zstd.multi_decode(frames, fsegs, self.raw_nbytes)
            except ValueError:
                count("fallbacks")  # decoded one by one below, which names a bad chunk
            else:
                count("decodes")
                self._fill_rows(stack, rows, values)
                return
        mv = memoryview(buf)
        for j, (o, n) in enumerate(segs.tolist()):
            try:
                stack[rows[j]] = self.decode(mv[o : o + n])
            except ValueError as e:
                raise ChunkDecodeError(j, str(e)) from None

    def decode_batch(self, buf: Any, segs: np.ndarray) -> np.ndarray | None:
        """Small zstd chunks at ``segs`` of ``buf`` decoded in one GIL-free call, as a new
        read-only stack; None when the chain or the sizes do not allow it, or a chunk is bad
        (then :meth:`decode_rows` finds and names it)."""
        zstd = self._zstd_first
        if zstd is None or len(segs) < 2 or self.raw_nbytes >= SMALL_CHUNK:
            return None
        try:
            frames, fsegs = buf, segs
            if len(self.bytes_codecs) > 1:
                frames, fsegs = self._outer_decode(buf, segs)
            values = zstd.multi_decode(frames, fsegs, self.raw_nbytes)
        except ValueError:
            return None
        count("decodes")
        joined = b"".join(values)
        if len(joined) != len(segs) * self.raw_nbytes:
            return None
        flat = np.frombuffer(joined, dtype=self.stored_dtype)
        return flat.reshape(len(segs), *self.stored_shape)

    def _outer_decode(self, buf: Any, segs: np.ndarray) -> tuple[bytes, np.ndarray]:
        """Undo the codecs after zstd for each chunk; the zstd frames joined, and their segments."""
        mv = memoryview(buf)
        frames = []
        for o, n in segs.tolist():
            data: Any = mv[o : o + n]
            for codec in reversed(self.bytes_codecs[1:]):
                data = codec.decode(data, 2 * self.raw_nbytes + 4096)
            frames.append(data)
        sizes = np.fromiter((len(f) for f in frames), dtype=np.uint64, count=len(frames))
        out = np.empty((len(frames), 2), dtype=np.uint64)
        out[:, 1] = sizes
        out[0, 0] = 0
        np.cumsum(sizes[:-1], out=out[1:, 0])
        return b"".join(frames), out

    def _fill_rows(self, stack: np.ndarray, rows: np.ndarray, values: Sequence[Any]) -> None:
        """Copy decoded chunks (bytes-like, ``raw_nbytes`` each) into ``stack[rows]``."""
        raw = self.raw_nbytes
        if raw < SMALL_CHUNK:  # many small chunks: one join beats a Python copy per chunk
            flat = np.frombuffer(b"".join(values), dtype=self.stored_dtype)
            shaped = flat.reshape(len(rows), *self.stored_shape)
            lo, hi = int(rows[0]), int(rows[-1]) + 1
            if hi - lo == len(rows):
                stack[lo:hi] = shaped
            else:
                stack[rows] = shaped
            return
        for row, value in zip(rows.tolist(), values, strict=True):
            if len(value) != raw:
                raise ValueError(f"decoded to {len(value)} bytes, expected {raw}")
            raw_view(stack[row])[:] = value

    # -- one chunk ------------------------------------------------------------------------------

    def encode(self, item: np.ndarray, frames: FrameArena | None = None) -> bytes | memoryview:
        """Encode one stacked chunk (an element of :meth:`stack`).

        With ``frames``, a chain of zstd alone keeps the frame in that arena (one copy out of
        python-zstandard's bound-sized bytes, into reused memory) rather than in fresh bytes.
        """
        if self.zarr_chain is not None:
            return self.zarr_chain.encode(item, self.fill_value)
        data: bytes | memoryview = (
            raw_view(item) if self.nested is None else self.nested.encode_chunk(item)
        )
        zstd = self._zstd_first
        if frames is not None and zstd is not None and len(self.bytes_codecs) == 1:
            kept: bytes | memoryview = frames.keep(zstd.compress(data), len(data))
            return kept
        for codec in self.bytes_codecs:
            data = codec.encode(data)
        return bytes(data)

    def decoder_into(self, dtype: np.dtype[Any]) -> Callable[[Buffer, memoryview], bool] | None:
        """A function decoding one chunk straight into a writable raw view of a chunk of the
        stored shape (``dest`` of :meth:`decode_to`), when the chain allows it: no transpose, a
        plain or zstd-only chain, ``dtype`` the stored dtype. The function returns False, with
        nothing written, when it cannot (a zstd frame without its size); None otherwise. The
        chain is checked once here, not per chunk."""
        if (
            self.zarr_chain is not None
            or self.nested is not None
            or self.order is not None
            or dtype != self.stored_dtype
            or len(self.bytes_codecs) > 1
        ):
            return None
        if not self.bytes_codecs:
            return _copy_into
        codec = self.bytes_codecs[0]
        return codec.decode_into if isinstance(codec, Zstd) else None

    def decode_to(self, data: bytes | memoryview, dest: np.ndarray) -> bool:
        """Decode one chunk straight into ``dest`` (the chunk's place in the output) when the
        chain and ``dest`` allow it: no transpose, a plain or zstd-only chain, ``dest``
        C-contiguous in the stored dtype. False, with nothing written, otherwise."""
        if dest.shape != self.chunk_shape or not dest.flags.c_contiguous:
            return False
        into = self.decoder_into(dest.dtype)
        return into is not None and into(data, raw_view(dest))

    def decode(self, data: bytes | memoryview) -> np.ndarray:
        """Decode one inner chunk into a stored chunk (shape :attr:`stored_shape`).

        Raises ``ValueError`` describing what is wrong; the caller names the key and chunk.
        """
        if self.zarr_chain is not None:
            try:
                return self.zarr_chain.decode(bytes(data), self.chunk_shape, self.fill_value)
            except Exception as e:  # zarr raises many types for bad bytes
                raise ValueError(f"{type(e).__name__}: {e}") from None
        raw = self.raw_nbytes
        # the most bytes any stage may produce: exactly ``raw`` for the serializer's input; a
        # nested serializer's output may be larger than raw, and intermediate stages of a chain
        # may expand a little
        size = raw if self.nested is None else self.nested.max_encoded_nbytes(raw)
        bound = 2 * size + 4096
        buf: bytes | bytearray | memoryview = data
        for i, codec in enumerate(reversed(self.bytes_codecs)):
            last = i == len(self.bytes_codecs) - 1
            buf = codec.decode(buf, size if last else bound)
        if self.nested is not None:
            return self.nested.decode_chunk(bytes(buf))
        if len(buf) != raw:
            raise ValueError(f"decoded to {len(buf)} bytes, expected {raw}")
        return np.frombuffer(buf, dtype=self.stored_dtype).reshape(self.stored_shape)
