"""New output arrays for readers."""

from __future__ import annotations

import ctypes
import math
import mmap
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..compat import hugepage_switch
from ..runtime import pool as _pool

_advice_lock = threading.Lock()


def new_array(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """``np.empty(shape, dtype)`` in ordinary pages, faulted in ahead (:func:`populate`).

    numpy advises the kernel to back large arrays with transparent huge pages. A huge page must be
    found (and zeroed) on first touch, and on virtual machines whose memory is backed lazily that
    often costs far more than the 4 KiB pages it saves faults for: filling a fresh 1 GiB array
    took 0.15-2.5 s of system time with the advice and a steady 0.5 s without, and a 256 MiB read
    0.5-0.8 s against 0.25-0.28 s. Readers fill every byte of the output once, so they skip it.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    switch = hugepage_switch() if nbytes >= 4 * 2**20 else None
    if switch is None:
        out = np.empty(shape, dtype)
    else:
        with _advice_lock:
            before = _advice_saved[0] = switch(False)
            try:
                out = np.empty(shape, dtype)
            finally:
                switch(before)
                _advice_saved[0] = None
    if nbytes >= POPULATE_MIN:
        populate(out)
    return out


POPULATE_MIN = 16 * 2**20  # outputs at least this large are faulted in ahead, on the pool
POPULATE_PIECE = 32 * 2**20  # bytes per call
_MADV_POPULATE_WRITE = 23  # linux/mman.h, Linux 5.14 and later


def populate(out: np.ndarray) -> None:
    """Fault the pages of a new ``out`` in ahead, ``POPULATE_PIECE`` bytes per call on the pool.

    A reader's threads fill the output chunk by chunk, and chunks side by side share pages: left
    to first touch, every 4 KiB page is one page fault, and two threads touching a fresh page at
    once fault on it together and wait on each other's page-table lock. A whole W1 read (2 GiB
    out) took 680,000-990,000 faults and 2-5 s of system time; faulted in ahead by the pool,
    each thread its own pieces in one call each, 527,000 and 1.1-1.5 s, and the read 4% faster
    (medians of 6 interleaved pairs; ``benchmarks/README.md``). The call is Linux's
    ``madvise(MADV_POPULATE_WRITE)``, through ctypes because no library offers it for memory
    numpy allocated (``mmap.madvise`` wants an ``mmap`` object, and holds the GIL). Anywhere it
    is refused (another system, an older kernel) pages are faulted on first touch, as before.
    """
    global _madvise
    if _madvise is None:
        _madvise = _libc_madvise()
    call = _madvise
    if call is False or not out.flags.c_contiguous:
        return
    page = mmap.PAGESIZE
    start = -(-out.ctypes.data // page) * page
    end = (out.ctypes.data + out.nbytes) // page * page
    pieces = list(range(start, end, POPULATE_PIECE))

    def run(batch: Sequence[int]) -> list[bool]:
        return [call(a, min(POPULATE_PIECE, end - a), _MADV_POPULATE_WRITE) == 0 for a in batch]

    done: list[bool] = _pool.map_batches(run, pieces) if pieces else []
    if not all(done):
        _madvise = False  # refused here: never asked again


def _libc_madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_madvise: Any = None


# a fork while another thread held the switch: the child gets a free lock and numpy's setting back
_advice_saved: list[bool | None] = [None]


def _after_fork_in_child() -> None:
    global _advice_lock
    _advice_lock = threading.Lock()
    switch = hugepage_switch()
    if _advice_saved[0] is not None and switch is not None:
        switch(_advice_saved[0])
    _advice_saved[0] = None


_pool.on_fork(_after_fork_in_child)
