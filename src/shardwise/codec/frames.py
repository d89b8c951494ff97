"""Reused memory for the compressed inner chunks of a shard being stored.

python-zstandard's ``compress`` returns bytes holding the whole compression bound (a little over
the raw chunk) whatever the compressed size. Trimming them was a copy into fresh bytes, and a
shard's compressed chunks were fresh pages (page faults, zeroing) freed once it was stored: about
the compressed size of every shard, each time. A shard task that stores its shard itself borrows
a :class:`FrameArena` instead: each frame is copied into the arena (the one copy the trim made)
and its bound-sized allocation is freed at once, for the thread's next ``compress`` to reuse.

Arenas go back to a process-wide free list, which keeps at most :data:`KEEP_BYTES` of them; a
child forked while arenas were lent starts with an empty list (``runtime.pool.on_fork``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..runtime import pool as _pool

ARENA_MAX = 32 * 2**20  # an arena's bytes at most; frames beyond them go to fresh bytes
ARENA_MIN = 1 * 2**20  # smaller shards are not worth an arena
KEEP_BYTES = 64 * 2**20  # arenas kept for reuse between shard tasks, at most, per process


class FrameArena:
    """Bytes handed out one frame after another, until :meth:`reset`.

    :meth:`keep` is called by the pool threads at once: each frame gets its own range (taken
    under a lock) and is copied there outside it.
    """

    def __init__(self, nbytes: int) -> None:
        # np.empty: pages are touched (and faulted in) only as far as frames reach, once
        self._buf = np.empty(nbytes, dtype=np.uint8)
        self._used = 0
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return int(self._buf.nbytes)

    @property
    def used(self) -> int:
        return self._used

    def reset(self) -> None:
        """Forget every frame kept: the views :meth:`keep` returned must be dead by now."""
        self._used = 0

    def keep(self, frame: Any, raw_nbytes: int) -> Any:
        """``frame`` (python-zstandard's bytes of a chunk of ``raw_nbytes``) as a view of the
        arena; once it is full, as :meth:`~shardwise.codec.codecs.Zstd.encode` gives it (exact
        bytes, or the frame itself when it wastes little)."""
        src = np.frombuffer(frame, dtype=np.uint8)
        n = src.size
        with self._lock:
            start = self._used
            full = start + n > self.capacity
            if not full:
                self._used = start + n
        if full:
            return bytes(memoryview(frame)) if raw_nbytes - n > 4096 else frame
        dst = self._buf[start : start + n]
        np.copyto(dst, src)  # numpy copies without the GIL
        return memoryview(dst)


_lock = threading.Lock()
_free: list[FrameArena] = []


def _after_fork() -> None:
    global _lock, _free
    _lock = threading.Lock()  # another thread may have held it at the fork
    _free = []


_pool.on_fork(_after_fork)


@contextmanager
def borrowed(raw_nbytes: int) -> Iterator[FrameArena | None]:
    """An empty arena for the frames of a shard of ``raw_nbytes`` raw bytes (None when the shard
    is too small to need one), lent for the ``with`` block: whatever holds its frames must be
    done with them (stored, joined) when the block ends."""
    want = min(raw_nbytes, ARENA_MAX)
    if want < ARENA_MIN:
        yield None
        return
    with _lock:
        fits = [a for a in _free if a.capacity >= want]
        arena = min(fits, key=lambda a: a.capacity) if fits else None
        if arena is not None:
            _free.remove(arena)
    if arena is None:
        arena = FrameArena(want)
    arena.reset()
    try:
        yield arena
    finally:
        arena.reset()
        with _lock:
            if sum(a.capacity for a in _free) + arena.capacity <= KEEP_BYTES:
                _free.append(arena)


def kept() -> int:
    """Bytes of the arenas kept for reuse in this process (at most :data:`KEEP_BYTES`)."""
    with _lock:
        return sum(a.capacity for a in _free)
