"""Library state survives ``fork``: a child forked after the parent used shardwise reads and writes.

A forked child inherits the process-wide encode/decode pool without its threads, and any lock
another thread held at the fork. Each test uses shardwise in the parent first (so the pool and the
caches exist), forks a child that writes and reads, and waits for it with a generous deadline: a
hang fails the test, the machine's speed never does.

Python warns (``DeprecationWarning``) when a process with threads forks. That is exactly the
user's situation here (``multiprocessing.Pool``, data loader workers), so each test asserts the
warning: it proves the parent had threads running when it forked.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
from zarr.storage import MemoryStore

import shardwise
from shardwise.engine.read import open_reader
from shardwise.runtime import pool as _pool

DEADLINE = 120  # seconds; a healthy child needs well under one
KW: dict[str, Any] = dict(chunks=(8, 8), shards=(16, 16), fill_value=0)


def data(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 1000, (48, 40)).astype("int32")


def _child(work: Callable[[], None], out: Any) -> None:
    try:
        work()
    except BaseException:
        out.put(traceback.format_exc())
    else:
        out.put("ok")


def run_forked(work: Callable[[], None]) -> None:
    """Run ``work`` in a forked child; fail if it raises or does not finish by the deadline."""
    ctx = mp.get_context("fork")
    out = ctx.SimpleQueue()
    with pytest.warns(DeprecationWarning, match="multi-threaded"):
        child = ctx.Process(target=_child, args=(work, out))
        child.start()
    child.join(timeout=DEADLINE)
    if child.is_alive():
        child.kill()
        child.join(30)
        pytest.fail(f"the forked child hung (still running after {DEADLINE} s)")
    assert child.exitcode == 0
    assert out.get() == "ok"


def use_shardwise(store: Any, seed: int) -> None:
    """A threaded write and read in the parent: the pool exists afterwards."""
    with dask.config.set(scheduler="threads"):
        shardwise.write_array(data(seed), store, **KW)
        np.testing.assert_array_equal(shardwise.open_array(store).compute(), data(seed))


def write_and_read(store: Any, seed: int, mode: str = "w-") -> None:
    with dask.config.set(scheduler="threads"):
        shardwise.write_array(data(seed), store, mode=mode, **KW)
        np.testing.assert_array_equal(shardwise.open_array(store).compute(), data(seed))


def test_a_forked_child_writes_and_reads_local_files(tmp_path: Path) -> None:
    use_shardwise(tmp_path / "parent.zarr", 0)
    assert _pool._pool is not None and _pool.pool_size() > 1  # the state a fork inherits

    def work() -> None:
        write_and_read(tmp_path / "child.zarr", 1)
        np.testing.assert_array_equal(
            shardwise.open_array(tmp_path / "parent.zarr").compute(), data(0)
        )

    run_forked(work)
    # and the child's array is whole when the parent reads it
    np.testing.assert_array_equal(shardwise.open_array(tmp_path / "child.zarr").compute(), data(1))
    assert shardwise.verify(tmp_path / "child.zarr").ok


def test_a_forked_child_writes_and_reads_a_memory_store() -> None:
    store = MemoryStore()
    use_shardwise(store, 2)

    def work() -> None:
        # the child's copy of the parent's store: read it, then overwrite it
        np.testing.assert_array_equal(shardwise.open_array(store).compute(), data(2))
        write_and_read(store, 3, mode="w")

    run_forked(work)
    # the child's writes went to its own copy of the memory
    np.testing.assert_array_equal(shardwise.open_array(store).compute(), data(2))


def test_a_reader_and_its_index_cache_survive_a_fork_with_its_lock_held(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    use_shardwise(root, 4)
    reader = open_reader(root, cache_indexes=True)
    window = (slice(1, 3), slice(17, 20))  # one inner chunk: ranged read, index cached
    np.testing.assert_array_equal(reader[window], data(4)[window])  # indexes cached
    assert reader._cache
    # another thread is inside the reader at the moment of the fork (holds its lock)
    inside, leave = threading.Event(), threading.Event()

    def busy() -> None:
        with reader._lock:
            inside.set()
            leave.wait()

    t = threading.Thread(target=busy)
    t.start()
    assert inside.wait(DEADLINE)

    def work() -> None:
        np.testing.assert_array_equal(reader[window], data(4)[window])  # cached index
        np.testing.assert_array_equal(reader[:, :], data(4))
        write_and_read(tmp_path / "child.zarr", 5)

    try:
        run_forked(work)
    finally:
        leave.set()
        t.join(DEADLINE)
    np.testing.assert_array_equal(reader[window], data(4)[window])  # the parent's reader too
