"""A shard of one inner chunk, encoded without the machinery of many (``codec/shard.py``).

A stream of one frame a shard (``shards == chunks``) encodes one such shard per frame: the
general path's units, pool hand-off, index arrays and masks cost more than the chunk itself.
Here the chunk is checked for fill, encoded, and its index of one entry written directly;
the bytes are those the general path gives (``tests/codec/test_single.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .chunks import raw_view
from .frames import FrameArena
from .index import encode_index

__all__ = ["NOT_ONE", "encode_one"]

NOT_ONE: Any = object()  # the shard is not one whole chunk: the general path encodes it
_ROW0 = np.zeros(1, dtype=np.intp)


def encode_one(
    codec: Any,
    block: Any,
    write_empty_chunks: bool,
    frames: FrameArena | None,
    views: bool = False,
) -> list[Any] | None:
    """The parts of ``codec``'s shard from ``block`` (index and chunk, in stored order) when
    the shard is one inner chunk that ``block`` (a numpy array) fills whole; None when that
    chunk equals the fill value (and ``write_empty_chunks`` is off); else :data:`NOT_ONE`.
    With ``views``, a chain without bytes codecs gives the block's own memory as the chunk
    (the caller stores it before the block changes)."""
    inner = codec.inner
    if (
        not isinstance(block, np.ndarray)
        or inner.nested is not None
        or block.shape != inner.chunk_shape
        or codec.nchunks != 1
    ):
        return NOT_ONE  # type: ignore[no-any-return]
    # the chunk is the block's memory as it is (inner.stack_is_view of a grid of one)
    if inner.order is not None or block.dtype != inner.stored_dtype or not block.flags.c_contiguous:
        return NOT_ONE  # type: ignore[no-any-return]
    stack = block.reshape((1, *inner.chunk_shape))
    if not write_empty_chunks and _maybe_fill(inner, block) and inner.fill_mask(stack)[0]:
        return None
    if views and inner.zarr_chain is None and not inner.bytes_codecs:
        # no bytes codec: the chunk is the block's own bytes, stored before the caller lets
        # the block go; no copy of it
        parts: list[Any] = [raw_view(block)]
        size = inner.raw_nbytes
    else:
        sizes, parts = inner.encode_run(stack, _ROW0, frames, join=True)
        size = int(sizes[0])
    start = codec.index_nbytes if codec.index_location == "start" else 0
    index = encode_index(codec, np.array([[start, size]], dtype=np.uint64))
    return [index, *parts] if codec.index_location == "start" else [*parts, index]


def _maybe_fill(inner: Any, block: np.ndarray) -> bool:
    """False when the chunk's first element differs from the fill value bit for bit (most
    data: no pass over the chunk); True when it may be all fill."""
    if block.dtype.hasobject or block.size == 0:
        return True
    fill = np.array(inner.fill_value, dtype=block.dtype).tobytes()
    return bool(raw_view(block)[: len(fill)] == fill)
