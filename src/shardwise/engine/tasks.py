"""What every shard task of a write does around its shards, whatever its kind (the direct
:class:`~shardwise.engine.write.ShardWriter`, the staged write's
:class:`~shardwise.engine.staged_assembly.ShardAssembly`, convert's
:class:`~shardwise.conversion.copy.ShardCopier`):

- each shard counts as a running task of its write (:func:`~shardwise.runtime.pool.running`):
  a write stopped meanwhile starts no further shard of it, and a failed write waits for the
  shards still running before it releases its lease;
- into an icechunk session, the task writes into a fork of its own
  (:meth:`~shardwise.storage.store.ShardStore.task_fork`) and hands it back in its report
  (``WriteReport.forks``), merged by :mod:`.forks` and the session's write.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from ..runtime import pool as _pool
from ..storage.meter import metered
from ..storage.store import ShardStore
from .report import WriteReport

__all__ = ["ShardTask", "shard_task"]


class Writes(Protocol):
    """A task kind's configuration: a dataclass with the store its shards go to."""

    @property
    def store(self) -> ShardStore: ...


@dataclass(frozen=True)
class ShardTask[W: Writes]:
    """One shard task: ``owner`` is the task kind's configuration over the task's own fork
    (when the store forks), ``write_id`` the write its shards count for (None: uncounted,
    a write without records)."""

    owner: W
    write_id: str | None = None
    fork: Any = None

    def running(self) -> AbstractContextManager[None]:
        """Around each shard of the task: counted as a running task of its write."""
        return nullcontext() if self.write_id is None else _pool.running(self.write_id)

    def done(self, report: WriteReport) -> WriteReport:
        """The task's ``report``, holding its fork (if any) for the merge."""
        if self.fork is not None:
            report.forks = [self.fork]
        return report

    def run(self, body: Callable[[W], WriteReport]) -> WriteReport:
        """A task of one shard: ``body(owner)`` counted as running; its report with the fork."""
        with self.running(), metered() as io:
            report = body(self.owner)
        report.add_io(io)  # what the task read and wrote, merges and records included
        return self.done(report)


def shard_task[W: Writes](owner: W, write_id: str | None) -> ShardTask[W]:
    """The shard task of ``owner`` (forked first when its store forks) for write ``write_id``."""
    own = owner.store.task_fork()
    if own is None:
        return ShardTask(owner, write_id)
    forked: W = replace(cast(Any, owner), store=own[0])
    return ShardTask(forked, write_id, own[1])
