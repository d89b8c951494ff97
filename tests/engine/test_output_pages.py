"""A reader's new output array is faulted in ahead, on the pool (``engine/memory.py:populate``)."""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardwise
import shardwise.engine.memory as M


def _huge_pages_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


def _faults() -> int:
    """This thread's page faults (another thread of the process faulting meanwhile is not
    counted: the writes measured run on the calling thread)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def test_a_new_output_is_faulted_in_before_the_readers_touch_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """64 MiB of output: 16,384 pages; writing every byte afterwards takes (almost) no fault,
    where the same array left to first touch takes one per page."""
    n = 64 * 2**20 // 8
    with monkeypatch.context() as m:
        m.setattr(M, "POPULATE_MIN", 2**62)
        plain = M.new_array((n,), np.dtype(np.float64))
    before = _faults()
    plain[...] = 1.0
    first_touch = _faults() - before
    out = M.new_array((n,), np.dtype(np.float64))
    assert out.shape == (n,) and out.dtype == np.float64 and out.flags.writeable
    before = _faults()
    out[...] = 1.0
    ahead = _faults() - before
    # the kernel really faults ordinary pages one by one on first touch (unless it backs all
    # memory with huge pages, whatever the advice)
    assert first_touch > 16_000 or _huge_pages_always(), first_touch
    assert ahead < 64, ahead
    assert M._madvise not in (None, False)


def test_small_outputs_are_left_to_first_touch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(M, "populate", lambda out: calls.append(out.nbytes))
    M.new_array((M.POPULATE_MIN // 8 - 1,), np.dtype(np.float64))
    assert calls == []
    M.new_array((M.POPULATE_MIN // 8,), np.dtype(np.float64))
    assert calls == [M.POPULATE_MIN]


def test_a_refused_populate_leaves_pages_to_first_touch_and_is_never_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel that refuses the advice (older than 5.14, another system): the read is the
    same, its pages faulted on first touch; the call is not made again in this process."""
    asked: list[tuple[Any, ...]] = []

    def refuse(*args: Any) -> int:
        asked.append(args)
        return -1

    monkeypatch.setattr(M, "_madvise", refuse)
    x = np.arange(2**22, dtype=np.float64).reshape(2048, 2048)
    p = str(tmp_path / "a.zarr")
    shardwise.write_array(x, p, chunks=(256, 256), shards=(1024, 1024), mode="w")
    got = shardwise.read_array(p)
    np.testing.assert_array_equal(got, x)
    assert asked and M._madvise is False
    n = len(asked)
    np.testing.assert_array_equal(shardwise.read_array(p), x)
    assert len(asked) == n
