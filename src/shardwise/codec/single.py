"""A shard of one inner chunk, encoded without the machinery of many (``codec/shard.py``).

A stream of one frame a shard (``shards == chunks``) encodes one such shard per frame: the
general path's units, pool hand-off, index arrays and masks cost more than the chunk itself.
Here the chunk is checked for fill, encoded, and its index of one entry written directly;
the bytes are those the general path gives (``tests/codec/test_single.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .frames import FrameArena
from .index import encode_index

__all__ = ["NOT_ONE", "encode_one"]

NOT_ONE: Any = object()  # the shard is not one whole chunk: the general path encodes it
_ROW0 = np.zeros(1, dtype=np.intp)


def encode_one(
    codec: Any, block: Any, write_empty_chunks: bool, frames: FrameArena | None
) -> list[Any] | None:
    """The parts of ``codec``'s shard from ``block`` (index and chunk, in stored order) when
    the shard is one inner chunk that ``block`` (a numpy array) fills whole; None when that
    chunk equals the fill value (and ``write_empty_chunks`` is off); else :data:`NOT_ONE`."""
    inner = codec.inner
    if (
        not isinstance(block, np.ndarray)
        or inner.nested is not None
        or block.shape != inner.chunk_shape
        or codec.nchunks != 1
    ):
        return NOT_ONE  # type: ignore[no-any-return]
    grid = (1,) * block.ndim
    if not inner.stack_is_view(block, grid):
        return NOT_ONE  # type: ignore[no-any-return]
    stack = inner.stack(block, grid)
    if not write_empty_chunks and inner.fill_mask(stack)[0]:
        return None
    sizes, parts = inner.encode_run(stack, _ROW0, frames, join=True)
    start = codec.index_nbytes if codec.index_location == "start" else 0
    index = encode_index(codec, np.array([[start, int(sizes[0])]], dtype=np.uint64))
    return [index, *parts] if codec.index_location == "start" else [*parts, index]
