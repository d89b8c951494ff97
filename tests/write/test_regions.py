"""Many small updates, one merge per shard (``shardwise.RegionWriter``): random update sequences
equal numpy's, each touched shard read and written once however many updates touch it, writers
in several processes sharing shards lose nothing (their commits made to collide), refusals
before any byte, an icechunk session alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import icechunk
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardwise
from faultkit import forkserver

SHAPE, CHUNKS, SHARDS = (48, 40), (4, 5), (16, 20)


def created(store: Any, values: np.ndarray | None = None) -> np.ndarray:
    base = np.arange(np.prod(SHAPE), dtype="i4").reshape(SHAPE) if values is None else values
    shardwise.write_array(base, store, path="a", chunks=CHUNKS, shards=SHARDS)
    return base.copy()


@st.composite
def updates(draw: Any) -> list[tuple[tuple[slice, ...], int]]:
    out = []
    for _ in range(draw(st.integers(1, 12))):
        region = []
        for n in SHAPE:
            a = draw(st.integers(0, n - 1))
            region.append(slice(a, draw(st.integers(a + 1, min(n, a + 12)))))
        out.append((tuple(region), draw(st.integers(-5, 5))))
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ups=updates())
def test_random_updates_equal_numpys_and_touch_each_shard_once(ups: list[Any]) -> None:
    store = zarr.storage.MemoryStore()
    want = created(store)
    with shardwise.RegionWriter(store, path="a") as w:
        for region, value in ups:
            w.write(region, value)
            want[region] = value
    got = shardwise.read_array(store, path="a")
    np.testing.assert_array_equal(got, want)
    touched = {
        (i, j)
        for region, _ in ups
        for i in range(region[0].start // SHARDS[0], (region[0].stop - 1) // SHARDS[0] + 1)
        for j in range(region[1].start // SHARDS[1], (region[1].stop - 1) // SHARDS[1] + 1)
    }
    assert w.report is not None and w.report.shards_written == len(touched)
    assert shardwise.verify(store, path="a").ok


def test_a_shard_many_updates_touch_is_moved_once(tmp_path: Path) -> None:
    """Ten 2 x 2 updates of one shard: one merge of it, by ranges (its index and the chunks
    merged read once, the rest copied by the kernel); write_array's region writes merge it
    ten times."""
    root = tmp_path / "s.zarr"
    created(root)
    shard = root / "a" / "c" / "0" / "0"
    size = shard.stat().st_size
    with shardwise.RegionWriter(root, path="a") as w:
        for k in range(10):
            w.write((slice(k, k + 2), slice(k, k + 2)), -k)
    report = w.report
    assert report is not None and report.shards_written == 1
    assert report.merges == ["local ranges"] and report.bytes_copied > 0
    assert report.bytes_read <= size + 2048  # at most the shard once, the journal's small objects
    assert report.bytes_written <= shard.stat().st_size + 2048
    each = tmp_path / "each.zarr"
    created(each)
    moved = 0
    for k in range(10):
        r = shardwise.write_array(np.full((2, 2), -k, "i4"), each, path="a", mode="r+",
                                  region=(slice(k, k + 2), slice(k, k + 2)))  # fmt: skip
        moved += r.bytes_read + r.bytes_written
    assert moved > 8 * (report.bytes_read + report.bytes_written)
    np.testing.assert_array_equal(
        shardwise.read_array(root, path="a"), shardwise.read_array(each, path="a")
    )


def _updater(root: str, k: int, meet: Any, out: Any) -> None:
    """Writer ``k`` of several: its own cells of one shard (two updates), all writers held
    between their merge and their first commit until every one has merged."""
    from shardwise.storage import conditional as cond

    redone = []

    def hold(name: str, attempt: int) -> None:
        if attempt == 0:
            meet.wait(timeout=300)  # every writer merged what it read: their commits collide
        else:
            redone.append(name)

    cond.before_commit = hold
    try:
        with shardwise.RegionWriter(root, path="a") as w:
            for r in (0, SHARDS[0] - 1):
                w.write((slice(r, r + 1), slice(k, k + 1)), 1000 + k)
        assert w.report is not None
        out.put((k, len(redone), w.report.conflicts_retried, ""))
    except Exception as e:  # reported, and fails the test
        out.put((k, -1, -1, f"{type(e).__name__}: {e}"))


def test_writers_in_processes_sharing_shards_lose_nothing(tmp_path: Path) -> None:
    root = tmp_path / "s.zarr"
    want = created(root)
    ctx = forkserver()
    n = 3
    meet, out = ctx.Barrier(n), ctx.Queue()
    jobs = [ctx.Process(target=_updater, args=(str(root), k, meet, out)) for k in range(n)]
    for j in jobs:
        j.start()
    results = sorted(out.get(timeout=600) for _ in range(n))
    for j in jobs:
        j.join(timeout=60)
    assert all(err == "" for *_, err in results), results
    # the race happened: all but one writer found the shard committed by another, merged again
    assert sum(redone for _, redone, _, _ in results) >= n - 1, results
    assert sum(retried for _, _, retried, _ in results) >= n - 1, results
    for k in range(n):
        for r in (0, SHARDS[0] - 1):
            want[r, k] = 1000 + k
    np.testing.assert_array_equal(shardwise.read_array(root, path="a"), want)
    assert shardwise.verify(root, path="a").ok


def test_refusals_leave_the_store_as_it_was(tmp_path: Path) -> None:
    root = tmp_path / "s.zarr"
    created(root)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(shardwise.ArrayNotFoundError):
        shardwise.RegionWriter(root, path="nothing")
    with pytest.raises(TypeError, match="chunks"):
        shardwise.RegionWriter(root, path="a", chunks=(2, 2))  # type: ignore[call-arg]
    with pytest.raises(shardwise.InvalidTypeError, match="threads"):
        shardwise.RegionWriter(root, path="a", threads="2")  # type: ignore[arg-type]
    w = shardwise.RegionWriter(root, path="a")
    with pytest.raises(shardwise.PlanError, match="without loss"):
        w.write((slice(0, 2), slice(0, 2)), np.ones((2, 2), "f8"))
    with pytest.raises(shardwise.PlanError, match="do not fit"):
        w.write((slice(0, 2), slice(0, 2)), np.ones((3, 3), "i4"))
    with pytest.raises(shardwise.InvalidValueError):
        w.write((slice(0, 60), slice(0, 2)), 1)  # outside the array
    with pytest.raises(RuntimeError, match="inside"), w:
        w.write((slice(0, 2), slice(0, 2)), 7)
        raise RuntimeError("inside the block")
    assert w.pending == {} and w.commit().shards_written == 0
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_updates_into_an_icechunk_session_commit_once(tmp_path: Path) -> None:
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "r")))
    session = repo.writable_session("main")
    want = created(session.store)
    session.commit("created")
    session = repo.writable_session("main")
    with shardwise.RegionWriter(session, path="a", commit="updated") as w:
        w.write((slice(0, 20), slice(18, 22)), -1)  # four shards
        w.write((slice(30, 31), ...), -2)  # two of those four shards again
    want[0:20, 18:22] = -1
    want[30, :] = -2
    assert w.report is not None and w.report.shards_written == 4
    assert next(s.message for s in repo.ancestry(branch="main")) == "updated"
    got = zarr.open_array(repo.readonly_session("main").store, path="a", mode="r")[:]
    np.testing.assert_array_equal(got, want)
