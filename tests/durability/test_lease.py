"""The write lease: one writer job per array, refused before it writes anything.

Races of many processes are in test_faults.py; here the rules one at a time, on local files and
zarr's MemoryStore.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

import dask
import dask.array as da
import numpy as np
import pytest
from zarr.storage import LocalStore, MemoryStore

import shardwise
from faultkit import HeldPut, SeenWaiting, files
from shardwise import LeaseHeldError
from shardwise.durability.lease import LEASE, Lease, LeaseInfo, break_lease, part_lease, read_lease
from shardwise.durability.verify import verify
from shardwise.storage.store import ShardStore

KW = dict(chunks=(4, 4), shards=(8, 8))


def data(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 1000, (24, 20)).astype("int32")


def sstore(root: Path) -> ShardStore:
    return ShardStore(LocalStore(root))


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_exclusive_then_free_again(tmp_path: Path, kind: str) -> None:
    st = sstore(tmp_path) if kind == "local" else ShardStore(MemoryStore(), "a/b")
    first = Lease.acquire(st, purpose="job one")
    with pytest.raises(LeaseHeldError) as e:
        Lease.acquire(st, purpose="job two")
    assert "job one" in str(e.value) and str(os.getpid()) in str(e.value)
    assert "break_lease=True" in str(e.value)
    held = read_lease(st)
    assert held is not None and held.token == first.info.token
    first.release()
    assert read_lease(st) is None
    with Lease.acquire(st, purpose="job three") as third:
        assert read_lease(st) == third.info
    assert read_lease(st) is None


def test_part_leases_are_independent(tmp_path: Path) -> None:
    st = sstore(tmp_path)
    a = Lease.acquire(st, name=part_lease(0, 2))
    b = Lease.acquire(st, name=part_lease(1, 2))
    with pytest.raises(LeaseHeldError):
        Lease.acquire(st, name=part_lease(0, 2))
    a.release()
    b.release()
    assert st.list(".shardwise") == []


def test_release_leaves_a_broken_and_retaken_lease_alone(tmp_path: Path) -> None:
    st = sstore(tmp_path)
    mine = Lease.acquire(st)
    assert break_lease(st) == mine.info
    theirs = Lease.acquire(st)
    mine.release()  # no longer ours: must not remove theirs
    assert read_lease(st) == theirs.info
    theirs.release()


def test_unreadable_lease_object_still_blocks(tmp_path: Path) -> None:
    st = sstore(tmp_path)
    st.put(LEASE, b"\x00garbage")
    with pytest.raises(LeaseHeldError, match="unreadable lease object"):
        Lease.acquire(st)
    Lease.acquire(st, break_stale=True).release()


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)


def test_a_dead_writers_lease_is_broken_on_purpose_or_taken_over_on_resume(
    tmp_path: Path,
) -> None:
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **KW)
    st = sstore(root)
    info = LeaseInfo.new("write")
    stale = LeaseInfo(info.token, "write", info.host, _dead_pid(), info.user, info.since)
    st.put(LEASE, stale.to_bytes())
    with pytest.raises(LeaseHeldError, match="that process is gone"):
        shardwise.write_array(data(1), root, mode="w", **KW)
    np.testing.assert_array_equal(shardwise.open_array(root).compute(), data())
    shardwise.write_array(data(1), root, mode="w", break_lease=True, **KW)
    np.testing.assert_array_equal(shardwise.open_array(root).compute(), data(1))
    assert read_lease(st) is None
    # a resumed write decides for itself that the holder is gone (test_lease_takeover.py)
    st.put(LEASE, stale.to_bytes())
    shardwise.write_array(data(2), root, mode="w", resume=True, **KW)
    np.testing.assert_array_equal(shardwise.open_array(root).compute(), data(2))
    assert read_lease(st) is None


@pytest.mark.parametrize("mode", ["w", "r+", "a"])
def test_refused_before_any_byte_is_written(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **KW)
    before = files(root, journal=True)
    with Lease.acquire(sstore(root), purpose="the other job"):
        kw = dict(KW) if mode == "w" else {}
        with pytest.raises(LeaseHeldError, match="the other job"):
            shardwise.write_array(data(2), root, mode=mode, **kw)
        after = files(root, journal=True)
    del after[LEASE]
    assert after == before


def test_new_array_refused_while_its_path_is_leased(tmp_path: Path) -> None:
    root = tmp_path / "new.zarr"
    with Lease.acquire(sstore(root)):
        with pytest.raises(LeaseHeldError):
            shardwise.write_array(data(), root, **KW)
        assert sorted(files(root, journal=True)) == [LEASE]


def test_lease_false_writes_anyway(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    with Lease.acquire(sstore(root)):
        shardwise.write_array(data(), root, lease=False, **KW)
        assert read_lease(sstore(root)) is not None  # still there: mode 'w-' kept it
    np.testing.assert_array_equal(shardwise.open_array(root).compute(), data())


def test_mode_w_keeps_the_lease_while_it_replaces_the_array(tmp_path: Path) -> None:
    """zarr's overwrite deletes the whole node; shardwise must keep its own lease meanwhile."""
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **KW)
    seen: list[object] = []

    def probe(block: np.ndarray) -> np.ndarray:
        seen.append(read_lease(sstore(root)))
        return block

    src = da.from_array(data(3), chunks=(8, 8)).map_blocks(
        probe, dtype="int32", meta=np.empty((0, 0), "int32")
    )
    shardwise.write_array(src, root, mode="w", **KW)
    assert seen and all(s is not None for s in seen)
    assert read_lease(sstore(root)) is None
    np.testing.assert_array_equal(shardwise.open_array(root).compute(), data(3))


def test_a_failed_write_releases_the_lease_and_stays_incomplete(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"

    def boom(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
        assert block_info is not None
        if block_info[0]["chunk-location"] == (2, 1):
            raise RuntimeError("source failed")
        return block

    src = da.from_array(data(), chunks=(8, 8)).map_blocks(boom, dtype="int32")
    with pytest.raises(RuntimeError, match="source failed"):
        shardwise.write_array(src, root, **KW)
    assert read_lease(sstore(root)) is None
    report = verify(root)
    assert [p.kind for p in report.problems] == ["incomplete"]


@pytest.mark.parametrize("strategy", ["direct", "staged"])
def test_a_failed_write_returns_after_its_running_tasks(
    tmp_path: Path, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local dask scheduler raises the first error while other tasks still run; the write
    waits for them, so nothing of it lands after the call returned and the lease is gone.

    No time window: the put of shard c/0/0 is held until the write, after the failure, waits
    for its running tasks (or, if it does not wait, until the call has returned), so a write
    that returns early always returns before that put has landed."""
    from shardwise.runtime import pool as _pool

    root = tmp_path / "a.zarr"
    held, go, resumed = threading.Event(), threading.Event(), threading.Event()
    monkeypatch.setattr(_pool, "_tasks", SeenWaiting(go))
    store = HeldPut(LocalStore(root), "c/0/0", held, go, resumed)

    def boom(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
        assert block_info is not None
        if block_info[0]["chunk-location"] == (2, 1):
            assert held.wait(300), "the put of c/0/0 never started"
            raise RuntimeError("source failed")
        return block

    src = da.from_array(data(), chunks=(8, 8)).map_blocks(boom, dtype="int32")
    try:
        with (
            dask.config.set(scheduler="threads", num_workers=2),
            pytest.raises(RuntimeError, match="source failed"),
        ):
            shardwise.write_array(src, store, strategy=strategy, **KW)
        landed_before_return = resumed.is_set()
    finally:
        go.set()  # a write that did not wait: its put lands now (the test has seen enough)
    assert landed_before_return, "the call returned before its running put had landed"
    assert (root / "c" / "0" / "0").exists()
    assert read_lease(sstore(root)) is None
    report = verify(root)
    assert [p.kind for p in report.problems] == ["incomplete"] and not report.changes, report


class _FailsOnceHeld(HeldPut):
    """:class:`HeldPut` whose put of ``c/2/1`` fails once the held put has started, noting the
    threads alive then (the failing shard task's among them)."""

    threads: ClassVar[set[str]] = set()

    def _with_store(self, store: Any) -> _FailsOnceHeld:
        return _FailsOnceHeld(store, self.key, self.held, self.go, self.resumed, self.landed)

    async def set(self, key: str, value: Any) -> None:
        if key == "c/2/1":
            assert await asyncio.to_thread(self.held.wait, 300), "the held put never started"
            _FailsOnceHeld.threads = {t.name for t in threading.enumerate()}
            raise OSError("the put of c/2/1 failed")
        await super().set(key, value)


def test_a_failed_numpy_write_returns_after_its_running_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same of a numpy source, whose shard tasks run on this process's threads without a
    dask graph (engine/inprocess.py): the put of c/0/0 is held, that of c/2/1 fails; the write
    raises only once the held put has landed, its lease is gone and verify finds it
    incomplete. The failing task ran on the in-process pool's threads."""
    from shardwise.runtime import pool as _pool

    root = tmp_path / "a.zarr"
    held, go, resumed = threading.Event(), threading.Event(), threading.Event()
    monkeypatch.setattr(_pool, "_tasks", SeenWaiting(go))
    store = _FailsOnceHeld(LocalStore(root), "c/0/0", held, go, resumed)
    try:
        with (
            dask.config.set(scheduler="threads", num_workers=2),
            pytest.raises(OSError, match="c/2/1 failed"),
        ):
            shardwise.write_array(data(), store, **KW)
        landed_before_return = resumed.is_set()
    finally:
        go.set()
    assert landed_before_return, "the call returned before its running put had landed"
    assert any(name.startswith("shardwise-shard") for name in _FailsOnceHeld.threads)
    assert (root / "c" / "0" / "0").exists() and not (root / "c" / "2" / "1").exists()
    assert read_lease(sstore(root)) is None
    report = verify(root)
    assert [p.kind for p in report.problems] == ["incomplete"] and not report.changes, report


def test_compute_false_takes_no_lease_unless_asked(tmp_path: Path) -> None:
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    shardwise.write_array(np.zeros((24, 20), "int32"), a, **KW)
    # two deferred region writes into one array, computed together (xarray's pattern)
    d1 = shardwise.write_array(
        data()[:8], a, mode="r+", region=(slice(0, 8), slice(None)), compute=False
    )
    d2 = shardwise.write_array(
        data()[8:], a, mode="r+", region=(slice(8, 24), slice(None)), compute=False
    )
    dask.compute(d1, d2)
    np.testing.assert_array_equal(shardwise.open_array(a).compute(), data())
    # lease=True: held from the call until the Delayed has run
    d3 = shardwise.write_array(data(), b, lease=True, compute=False, **KW)
    assert read_lease(sstore(b)) is not None
    with pytest.raises(LeaseHeldError):
        shardwise.write_array(data(), b, mode="w", **KW)
    d3.compute()
    assert read_lease(sstore(b)) is None
    assert verify(b).ok


def test_lease_object_is_small_json(tmp_path: Path) -> None:
    st = sstore(tmp_path)
    with Lease.acquire(st, purpose="check"):
        raw = (tmp_path / LEASE).read_bytes()
    d = json.loads(raw)
    assert set(d) == {"token", "purpose", "host", "pid", "user", "since"} | {
        "boot_id",  # with the start time: whether the holder still runs (holder.py)
        "started",
        "renewed",  # the heartbeat, and how long it may pause
        "expiry",
    }
    assert len(raw) < 400
    assert d["pid"] == os.getpid() and d["purpose"] == "check"
