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

import itertools
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..runtime.pool import cpu_count
from .report import WriteReport, sum_reports
from .runs import ShardRuns
from .write import ShardWriter


@dataclass(frozen=True)
class LocalShards:
    """The shard tasks of one direct write of a numpy ``source`` (the write region's values):
    one per task of ``writer.plan``, those ``keep`` marks (a boolean grid over the tasks; None:
    all)."""

    writer: ShardWriter
    source: np.ndarray
    keep: np.ndarray | None = None
    per_task: int = 1  # shards a task of its dask graph writes (engine/runs.py)

    def locations(self) -> Iterator[tuple[int, ...]]:
        """The task grid's locations to run, in C order."""
        grid = itertools.product(*(range(len(c)) for c in self.writer.plan.task_chunks))
        if self.keep is None:
            return grid
        return (loc for loc in grid if self.keep[loc])

    @classmethod
    def of(
        cls,
        writer: ShardWriter,
        source: Any,
        copy: bool,
        keep: np.ndarray | None,
        per_task: int = 1,
    ) -> LocalShards | None:
        """The tasks of a direct write of ``source`` when it is a numpy array read in place
        (not ``copy``: a write computed later copies it into its graph), else None."""
        if isinstance(source, np.ndarray) and not copy:
            return cls(writer, source, keep, per_task)
        return None

    @cached_property
    def _edges(self) -> list[list[int]]:
        return [[0, *itertools.accumulate(c)] for c in self.writer.plan.task_chunks]

    def block(self, loc: Sequence[int]) -> np.ndarray:
        """The source piece of task ``loc``: a view, never a copy."""
        return self.source[
            tuple(slice(e[i], e[i + 1]) for e, i in zip(self._edges, loc, strict=True))
        ]

    def run(self, loc: tuple[int, ...]) -> WriteReport:
        return self.writer.run_task(loc, self.block(loc))

    def graph(self) -> Any:
        """The same shards as dask work: one ``Delayed`` report per run of shards
        (:class:`~.runs.ShardRuns`, what the pipeline's ``build_part`` makes of a source without
        a dask graph)."""
        return ShardRuns(self.writer, self.source, self.per_task, self.keep).graph()


def run_shards(parts: Sequence[LocalShards], workers: int | None = None) -> list[WriteReport]:
    """Run every task of ``parts`` on ``workers`` threads (default: the cores, as dask's threaded
    scheduler); one report per part. At most two tasks per thread are queued at a time (a
    write of millions of shards holds no future per shard). The first failure (or a signal's
    ``Interrupted``) stops the queue: tasks not started never start, and it is raised at once,
    as dask's threaded scheduler raises it; the pipeline around the write then waits for the
    running ones, at most as long as it waits for dask's (``runtime.pool.stop_write``)."""
    n = max(1, workers or cpu_count())
    got: list[list[WriteReport]] = [[] for _ in parts]
    todo = ((i, loc) for i, p in enumerate(parts) for loc in p.locations())
    pending: dict[Future[WriteReport], int] = {}
    pool = ThreadPoolExecutor(n, thread_name_prefix="shardwise-shard")
    try:
        for i, loc in todo:
            if len(pending) >= 2 * n:
                _collect(pending, got)
            pending[pool.submit(parts[i].run, loc)] = i
        while pending:
            _collect(pending, got)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [sum_reports(reports) for reports in got]


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
