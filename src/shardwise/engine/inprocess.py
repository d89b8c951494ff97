"""The direct write of a numpy source run on this process's threads, without dask.

A numpy array already in memory needs no graph: its shard pieces are views of it, and each
shard task is :meth:`.write.ShardWriter.run_task`, the function the dask graph runs. So a write
computed now on the threaded scheduler (``compat.threads_run_here``) runs the tasks on a
``concurrent.futures`` thread pool of as many threads as dask's threaded scheduler would use,
and never imports dask (a fresh process's first ``write_array`` spent about a second importing
it, and each task passed through dask's graph machinery). The pipeline around it is the same:
sessions, leases, markers, journal records, resume's shards left out, running tasks counted and
stopped on failure. Anything else (a ``Delayed`` for ``compute=False``, a progress bar, a
distributed client, dask callbacks, a synchronous scheduler) asks for :meth:`LocalShards.graph`,
the dask graph of the same tasks.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime.pool import cpu_count, on_fork
from .report import WriteReport, sum_reports
from .runs import ShardRuns


@dataclass(frozen=True)
class LocalShards:
    """The shard tasks of one direct write of a numpy ``source`` (the write region's values),
    run here: the runs of :class:`~.runs.ShardRuns` (one shard each but for writes of many
    shards), those with a shard ``keep`` marks (a boolean grid over the plan's tasks; None:
    all)."""

    runs: ShardRuns

    @classmethod
    def of(cls, runs: ShardRuns, copy: bool) -> LocalShards | None:
        """The tasks of ``runs`` when their source is a numpy array read in place (not
        ``copy``: a write computed later copies it into its graph), else None."""
        if isinstance(runs.source, np.ndarray) and not copy:
            return cls(runs)
        return None

    def graph(self) -> Any:
        """The same runs as dask work: one ``Delayed`` report per run (what the pipeline's
        ``build_part`` makes of a source without a dask graph)."""
        return self.runs.graph()


def run_shards(parts: Sequence[LocalShards], workers: int | None = None) -> list[WriteReport]:
    """Run every run of ``parts`` on ``workers`` threads (default: the cores, as dask's threaded
    scheduler); one report per part. At most two runs per thread are queued at a time (a
    write of millions of shards holds no future per shard). The first failure (or a signal's
    ``Interrupted``) stops the queue: runs not started never start, and it is raised at once,
    as dask's threaded scheduler raises it; the pipeline around the write then waits for the
    running ones, at most as long as it waits for dask's (``runtime.pool.stop_write``)."""
    n = max(1, workers or cpu_count())
    got: list[list[WriteReport]] = [[] for _ in parts]
    todo = ((i, run) for i, p in enumerate(parts) for run in p.runs.runs())
    pending: dict[Future[WriteReport], int] = {}
    pool, kept = _shard_pool(n)
    try:
        for i, run in todo:
            if len(pending) >= 2 * n:
                _collect(pending, got)
            pending[pool.submit(parts[i].runs.run, run)] = i
        while pending:
            _collect(pending, got)
    except BaseException:
        for f in pending:  # not started: never started (the running ones end on their own)
            f.cancel()
        if not kept:
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    if not kept:
        pool.shutdown()
    return [sum_reports(reports) for reports in got]


_PREFIX = "shardwise-shard"
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _shard_pool(n: int) -> tuple[ThreadPoolExecutor, bool]:
    """The process's kept pool of ``n`` threads (started once, as dask's threaded scheduler
    keeps its own: a stream flushes many times), and True; a new one (False: the caller
    shuts it down) for a write run from one of its threads, which must not wait on itself."""
    if threading.current_thread().name.startswith(_PREFIX):
        return ThreadPoolExecutor(n, thread_name_prefix=f"{_PREFIX}-inner"), False
    with _pools_lock:
        pool = _pools.get(n)
        if pool is None:
            pool = _pools[n] = ThreadPoolExecutor(n, thread_name_prefix=_PREFIX)
        return pool, True


def _forget_pools() -> None:
    global _pools_lock
    _pools.clear()  # the parent's: their threads do not exist in a forked child
    _pools_lock = threading.Lock()


on_fork(_forget_pools)


def _collect(pending: dict[Future[WriteReport], int], got: list[list[WriteReport]]) -> None:
    """Wait for a task of ``pending`` to finish; move the finished tasks' reports into ``got``
    (the first error raised)."""
    done, _ = wait(pending, return_when=FIRST_COMPLETED)
    for f in done:
        got[pending.pop(f)].append(f.result())


def run_here(parts: Sequence[tuple[str, Any]], progress: bool) -> list[WriteReport] | None:
    """The reports of ``parts`` (a key prefix and its work each) run on this process's threads
    when every part is :class:`LocalShards`, no progress bar is asked for and the write would
    run on dask's threaded scheduler here (``compat.threads_run_here``); else None (the caller
    runs :func:`dask_parts` through dask)."""
    from ..compat import threads_run_here

    if progress or not all(isinstance(p, LocalShards) for _, p in parts):
        return None
    if not threads_run_here():
        return None
    workers = None
    if "dask" in sys.modules:  # dask's num_workers, as its threaded scheduler takes it
        import dask

        workers = dask.config.get("num_workers", None)
    return run_shards([p for _, p in parts], workers)


def dask_parts(parts: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``parts`` with every :class:`LocalShards` as its dask work (:meth:`LocalShards.graph`)."""
    return [(pre, p.graph() if isinstance(p, LocalShards) else p) for pre, p in parts]
