"""New output arrays for readers."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from ..compat import hugepage_switch
from ..runtime import pool as _pool

_advice_lock = threading.Lock()


def new_array(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """``np.empty(shape, dtype)`` in ordinary pages.

    numpy advises the kernel to back large arrays with transparent huge pages. A huge page must be
    found (and zeroed) on first touch, and on virtual machines whose memory is backed lazily that
    often costs far more than the 4 KiB pages it saves faults for: filling a fresh 1 GiB array
    took 0.15-2.5 s of system time with the advice and a steady 0.5 s without, and a 256 MiB read
    0.5-0.8 s against 0.25-0.28 s. Readers fill every byte of the output once, so they skip it.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    switch = hugepage_switch() if nbytes >= 4 * 2**20 else None
    if switch is None:
        return np.empty(shape, dtype)
    with _advice_lock:
        before = _advice_saved[0] = switch(False)
        try:
            return np.empty(shape, dtype)
        finally:
            switch(before)
            _advice_saved[0] = None


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
