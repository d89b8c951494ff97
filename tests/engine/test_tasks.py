"""The shard-task wrapper every kind of shard task runs through (engine/tasks.py): each shard
counted as a running task of its write, refused once the write stopped, and the task's own fork
(when the store forks) written into and handed back in the report; the threads a numpy
source's tasks run on (engine/inprocess.py), kept from one write to the next."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zarr.storage import MemoryStore

import shardwise
from shardwise.engine.inprocess import _shard_pool
from shardwise.engine.report import WriteReport
from shardwise.engine.tasks import shard_task
from shardwise.errors import ShardwiseError
from shardwise.runtime import pool as _pool
from shardwise.storage.store import ShardStore


@dataclass(frozen=True)
class ForkingStore:
    """A store standing for an icechunk fork's: each task gets a store of its own fork."""

    name: str
    forks: list[str] = field(default_factory=list)

    def task_fork(self) -> tuple[ForkingStore, str]:
        fork = f"{self.name}-fork{len(self.forks)}"
        self.forks.append(fork)
        return ForkingStore(fork), fork


@dataclass(frozen=True)
class Kind:
    """A task kind's configuration: what travels to the workers."""

    store: Any
    tag: str = "kind"


def counted(write_id: str) -> int:
    return _pool._running.get(write_id, 0)


def test_a_shard_counts_as_running_while_it_runs() -> None:
    wid = uuid.uuid4().hex
    seen: list[int] = []

    def body(kind: Kind) -> WriteReport:
        seen.append(counted(wid))
        return WriteReport(shards_written=1)

    rep = shard_task(Kind(ShardStore(MemoryStore())), wid).run(body)
    assert seen == [1] and counted(wid) == 0
    assert rep.shards_written == 1 and rep.forks == []


def test_without_a_write_id_nothing_is_counted() -> None:
    task = shard_task(Kind(ShardStore(MemoryStore())), None)
    with task.running():
        assert not _pool.busy()
    assert task.fork is None


def test_a_stopped_write_starts_no_further_shard() -> None:
    wid = uuid.uuid4().hex
    task = shard_task(Kind(ShardStore(MemoryStore())), wid)
    ran: list[int] = []
    with task.running():
        ran.append(1)
    assert _pool.stop_write(wid, timeout=0)
    try:
        with pytest.raises(ShardwiseError, match="failed already"), task.running():
            ran.append(2)
    finally:
        _pool.start_write(wid)
    assert ran == [1] and counted(wid) == 0


def test_the_task_writes_into_its_own_fork_and_hands_it_back() -> None:
    store = ForkingStore("session")
    owner = Kind(store, tag="mine")
    wid = uuid.uuid4().hex
    used: list[Any] = []

    def body(kind: Kind) -> WriteReport:
        used.append(kind)
        return WriteReport(shards_written=1)

    rep = shard_task(owner, wid).run(body)
    assert used == [Kind(ForkingStore("session-fork0"), tag="mine")]
    assert rep.forks == ["session-fork0"]
    # a second task forks again: no two tasks share one fork
    assert shard_task(owner, wid).fork == "session-fork1"
    assert owner.store is store  # the configuration itself is left alone


def test_a_task_of_many_shards_forks_once_and_counts_each_shard() -> None:
    wid = uuid.uuid4().hex
    store = ForkingStore("s")
    task = shard_task(Kind(store), wid)
    total = WriteReport()
    for _ in range(3):
        with task.running():
            assert counted(wid) == 1
            total += WriteReport(shards_written=1)
    assert task.done(total).forks == ["s-fork0"] and total.shards_written == 3
    assert store.forks == ["s-fork0"]


# -- the threads a numpy source's shard tasks run on (engine/inprocess.py) ------------------------


def _shard_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("shardwise-shard")}


def test_numpy_writes_keep_their_shard_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The threads a numpy source's shard tasks run on start once a process, as dask's
    threaded scheduler keeps its pool (a stream flushes many times); a failed write leaves
    them to the next one; each write reads back."""
    from shardwise.engine.runs import ShardRuns

    x = np.arange(64 * 48, dtype="int32").reshape(64, 48)
    kw: dict[str, Any] = dict(chunks=(8, 8), shards=(16, 16))
    shardwise.write_array(x, tmp_path / "a.zarr", **kw)
    first = _shard_threads()
    assert first
    real = ShardRuns.run

    def fails(self: ShardRuns, run: Any) -> Any:
        raise OSError("a shard task fails")

    monkeypatch.setattr(ShardRuns, "run", fails)
    with pytest.raises(OSError, match="a shard task fails"):
        shardwise.write_array(x, tmp_path / "b.zarr", **kw)
    monkeypatch.setattr(ShardRuns, "run", real)
    shardwise.write_array(x + 1, tmp_path / "c.zarr", **kw)
    assert _shard_threads() == first
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "c.zarr"), x + 1)


def test_a_numpy_write_from_a_shard_thread_runs_on_threads_of_its_own(tmp_path: Path) -> None:
    """A write started from one of those threads (with one thread, it is all of them) does
    not wait on itself: its tasks run on a pool of their own, its values read back."""
    import dask

    x = np.arange(32 * 32, dtype="uint16").reshape(32, 32)
    kw: dict[str, Any] = dict(chunks=(8, 8), shards=(16, 16))
    with dask.config.set(num_workers=1):
        pool, kept = _shard_pool(1)
        assert kept
        inner = pool.submit(shardwise.write_array, x, tmp_path / "in.zarr", **kw)
        assert inner.result(timeout=120).shards_written == 4
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "in.zarr"), x)
