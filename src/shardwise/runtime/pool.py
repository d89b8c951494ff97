"""One bounded thread pool per process for inner-chunk encode/decode.

Every dask task in a process shares it, so however many dask threads run shard tasks at once, at
most ``pool_size()`` threads compress at a time: no oversubscription of the cores. The codecs
(zstd, blosc, zlib, crc32c) release the GIL, so the threads run in parallel.

A child started with ``fork`` inherits the pool without its threads (and maybe a lock some other
thread held): :func:`after_fork` gives the child a fresh, empty state, and other modules register
their own per-process state with :func:`on_fork`.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from ..compat import reset_dask_threaded_pools

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_in_pool = threading.local()
_fork_hooks: list[Callable[[], None]] = []
# shard and block tasks of each write running in this process (by write id), and the writes
# that failed: see running() and stop_write()
_tasks = threading.Condition()
_running: Counter[str] = Counter()
_stopped: set[str] = set()
# set by stop_all (a signal, see signals.py): every write in this process stops, waiting for
# its running tasks at most this many seconds
_stopping_all: float | None = None


def on_fork(hook: Callable[[], None]) -> None:
    """Run ``hook`` in every child started with ``fork`` (after the pool's own reset)."""
    _fork_hooks.append(hook)


def after_fork() -> None:
    """Reset this module's state in a forked child: the inherited pool has no threads."""
    global _lock, _pool, _pool_size, _in_pool
    _lock = threading.Lock()
    _pool = None  # the parent's executor: never shut down here (its threads do not exist)
    _pool_size = 0
    _in_pool = threading.local()
    _reset_tasks()
    reset_dask_threaded_pools()
    for hook in _fork_hooks:
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=after_fork)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def pool_size() -> int:
    """Threads for inner chunks in this process: the dask worker's thread count, else the cores."""
    # a process that has not imported distributed is no dask worker: do not import it (slow)
    dist = sys.modules.get("distributed")
    if dist is None:
        return cpu_count()
    try:
        return max(1, int(dist.get_worker().state.nthreads))
    except (ValueError, AttributeError):
        return cpu_count()


def _executor(size: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < size:
            _pool = ThreadPoolExecutor(size, thread_name_prefix="shardwise")
            _pool_size = size
        return _pool


def _run_batch[T, R](fn: Callable[[Sequence[T]], list[R]], batch: Sequence[T]) -> list[R]:
    _in_pool.active = True
    try:
        return fn(batch)
    finally:
        _in_pool.active = False


def map_batches[T, R](
    fn: Callable[[Sequence[T]], list[R]],
    items: Sequence[T],
    threads: int | None = None,
    *,
    batches: int | None = None,
) -> list[R]:
    """``fn`` over contiguous batches of ``items`` on the shared pool; results in input order.

    ``fn`` takes a batch and returns one result per item. Calls from inside the pool (nested
    shards) and ``threads=1`` run inline in the calling thread. ``batches``: how many batches
    (default four per thread; more balance uneven items better).
    """
    n = len(items)
    if n == 0:
        return []
    if n == 1 or getattr(_in_pool, "active", False):  # one item (a shard of one chunk): inline
        return fn(items)
    size = pool_size() if threads is None else max(1, threads)
    if size == 1:
        return fn(items)
    nbatch = min(n, batches or size * 4)
    bounds = [n * i // nbatch for i in range(nbatch + 1)]
    pool = _executor(size)
    futures = [pool.submit(_run_batch, fn, items[a:b]) for a, b in itertools.pairwise(bounds)]
    out: list[R] = []
    try:
        for f in futures:
            out.extend(f.result())
    except BaseException:
        # let the other batches finish (or never start) before the caller unwinds: they may use
        # what it holds open, e.g. a file descriptor closed (and its number reused) on the way out
        for f in futures:
            f.cancel()
        wait(futures)
        raise
    return out


# -- the tasks of a write in this process -------------------------------------------------------
# A local dask scheduler raises the first error of a graph while other tasks of it still run in
# its threads; they would go on writing after the write has failed and its lease is released.


class running:  # lower case: used as a function, ``with running(write_id):``
    """Around a task of write ``write_id``: counted while it runs; refused once the write has
    failed in this process (a task started after the failure writes nothing). A class, not a
    generator: entered once per shard written."""

    __slots__ = ("write_id",)

    def __init__(self, write_id: str) -> None:
        self.write_id = write_id

    def __enter__(self) -> None:
        from ..errors import ShardwiseError

        write_id = self.write_id
        with _tasks:
            if _stopping_all is not None:
                raise ShardwiseError(f"write {write_id} is stopping: this task does nothing")
            if write_id in _stopped:
                raise ShardwiseError(f"write {write_id} failed already: this task does nothing")
            _running[write_id] += 1

    def __exit__(self, *exc: object) -> None:
        with _tasks:
            _running[self.write_id] -= 1
            if _running[self.write_id] <= 0:  # what stop_write and busy wait for
                del _running[self.write_id]
                _tasks.notify_all()


def stop_write(write_id: str, timeout: float = 600.0) -> bool:
    """After write ``write_id`` failed: refuse its tasks not started yet and wait (at most
    ``timeout`` seconds) for those still running in this process. True when none is left."""
    with _tasks:
        _stopped.add(write_id)
        if _stopping_all is not None:
            timeout = min(timeout, _stopping_all)
        return _tasks.wait_for(lambda: not _running.get(write_id), timeout)


def stop_all(grace: float | None) -> None:
    """Stop every write of this process (a signal): their tasks not started yet never start,
    and a stopping write waits at most ``grace`` seconds for those running. None: writes may
    run again."""
    global _stopping_all
    with _tasks:
        _stopping_all = grace


def busy() -> bool:
    """Whether shard tasks of any write still run in this process."""
    with _tasks:
        return bool(_running)


def start_write(write_id: str) -> None:
    """Write ``write_id`` runs (again: a resumed write keeps its id): its tasks may run."""
    with _tasks:
        _stopped.discard(write_id)


def _reset_tasks() -> None:
    global _tasks, _running, _stopped, _stopping_all
    _tasks = threading.Condition()
    _running = Counter()
    _stopped = set()
    _stopping_all = None
