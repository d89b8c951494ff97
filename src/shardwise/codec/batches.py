"""Per-process counts of the batched zstd path of :mod:`.chunks`.

Small zstd chunks are compressed and decompressed many to one call (python-zstandard's
``multi_compress_to_buffer`` / ``multi_decompress_to_buffer``, the GIL released). A batch
decode that fails falls back to decoding its chunks one by one, which finds and names a bad
chunk and gives the same values for good ones: a change that broke the batch call on every
chunk would change no result, only the speed. These counts make the path seen: how many batch
calls compressed and decompressed chunks in this process, and how many batch decodes fell back.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["BatchCounts", "batch_counts", "count"]


@dataclass(frozen=True)
class BatchCounts:
    """The batch calls of this process so far (:func:`batch_counts`)."""

    encodes: int = 0  # batch calls that compressed several chunks in one call
    decodes: int = 0  # batch calls that decompressed several chunks in one call
    fallbacks: int = 0  # batch decodes that failed: their chunks then decoded one by one


_lock = threading.Lock()
_counts = BatchCounts()


def count(what: Literal["encodes", "decodes", "fallbacks"]) -> None:
    """Count one batch call (``encodes``, ``decodes``) or one fallback."""
    global _counts
    with _lock:
        _counts = replace(_counts, **{what: getattr(_counts, what) + 1})


def batch_counts() -> BatchCounts:
    """The counts of this process so far (a snapshot: subtract two to count an operation)."""
    with _lock:
        return _counts
