"""The one write call (``write/execute.py``): a write held open across flushes pays the
lifecycle once (one lease, one marker, one finish), stops cleanly when a flush fails and is
finished by a resume; the same calls into an icechunk session fork, merge and commit once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import icechunk
import numpy as np
import pytest
import zarr

import shardwise
from shardwise.core.plan import ShardPlan
from shardwise.durability.journal import read_markers
from shardwise.durability.lease import LEASE, read_lease
from shardwise.errors import PlanError
from shardwise.storage.store import ShardStore
from shardwise.write.execute import Execution, Target, WriteCall, execute
from shardwise.write.options import WriteOptions
from shardwise.write.pipeline import ArrayWrite
from shardwise.write.target import prepare_write

ROWS, COLS, SHARD, CHUNK = 64, 16, 8, 4


def frames(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, COLS)).astype("f4")


def opened(
    store: Any, data: np.ndarray, *, commit: str | None = None, **keywords: Any
) -> tuple[Target, WriteCall, ArrayWrite]:
    """What a front end that receives its rows over time plans: the whole array, written by
    flushes of row blocks (each a region of it with its own source)."""
    o = WriteOptions.checked(path="a", chunks=(CHUNK, CHUNK), shards=(SHARD, COLS), **keywords)
    target, o = Target.open(store, commit, o)
    prepared = prepare_write(data, target.store, o)
    lease = target.lease(o.lease, o.compute, prepared.write.store.store)
    return target, WriteCall([prepared.write], lease=lease), prepared.write


def rows(write: ArrayWrite, data: np.ndarray, start: int, stop: int) -> ArrayWrite:
    """The write of rows ``start:stop`` of ``write``'s array, from ``data``'s."""
    stop = min(stop, ROWS)
    region = (slice(start, stop), slice(0, COLS))
    plan = ShardPlan(write.info.layout, region)
    return replace(write, plan=plan, source=data[start:stop], job=None)


def test_flushes_write_under_one_lease_and_one_marker_and_finish_once(tmp_path: Path) -> None:
    data = frames()
    store = zarr.storage.LocalStore(tmp_path / "s.zarr")
    target, call, write = opened(store, data)
    array = ShardStore(store, "a")
    holders, reports = [], []
    with Execution(target, call) as ex:
        for start in range(0, ROWS, 3 * SHARD):  # flushes of 3 shards (the last of 2)
            reports.append(ex.flush(ex.parts([rows(write, data, start, start + 3 * SHARD)])))
            lease = read_lease(array, LEASE)
            assert lease is not None
            holders.append(lease.token)
            markers = read_markers(array)
            assert [m.status for m in markers.values() if m is not None] == ["open"]
        report = ex.run([])
    # one lease held through every flush, released at the one finish; one marker, done
    assert len(set(holders)) == 1 and len(holders) == 3
    assert read_lease(array, LEASE) is None
    assert [m.status for m in read_markers(array).values() if m is not None] == ["done"]
    assert [r.shards_written for r in reports] == [3, 3, 2]
    assert report.shards_written == ROWS // SHARD
    np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[:], data)
    assert shardwise.verify(store, path="a").ok


def test_a_flush_outside_the_write_is_refused_before_any_shard(tmp_path: Path) -> None:
    data = frames()
    store = zarr.storage.LocalStore(tmp_path / "s.zarr")
    target, call, write = opened(store, data)
    with Execution(target, call) as ex:
        other = ArrayWrite(**{**write.__dict__, "store": ShardStore(store, "b")})
        with pytest.raises(PlanError, match="not an array of this write"):
            ex.flush(ex.parts([other]))
        bad = rows(write, np.zeros((ROWS + SHARD, COLS), "f4"), 0, ROWS)
        with pytest.raises(PlanError, match="source's shape"):
            ex.flush(ex.parts([replace(bad, source=np.zeros((1, COLS), "f4"))]))
        ex.run([])
    assert not list((tmp_path / "s.zarr" / "a" / "c").glob("*/*"))  # no shard stored


class Failing:
    """A source whose rows from ``bad`` on cannot be read (a camera that stopped)."""

    def __init__(self, data: np.ndarray, bad: int) -> None:
        self.data, self.bad = data, bad
        self.shape, self.dtype, self.ndim = data.shape, data.dtype, data.ndim

    def __getitem__(self, key: Any) -> np.ndarray:
        if key[0].start >= self.bad:
            raise OSError("the source is gone")
        return self.data[key]


def test_a_failed_flush_leaves_what_it_stored_and_a_resume_finishes_the_rest(
    tmp_path: Path,
) -> None:
    data = frames(1)
    store = zarr.storage.LocalStore(tmp_path / "s.zarr")
    target, call, write = opened(store, data)
    with pytest.raises(OSError, match="the source is gone"), Execution(target, call) as ex:
        ex.flush(ex.parts([rows(write, data, 0, 2 * SHARD)]))
        failing = Failing(data[2 * SHARD :], bad=SHARD)  # rows 24: of the array fail
        ex.flush(ex.parts([replace(rows(write, data, 2 * SHARD, ROWS), source=failing)]))
    array = ShardStore(store, "a")
    assert read_lease(array, LEASE) is None  # released on the failure
    assert [m.status for m in read_markers(array).values() if m is not None] == ["open"]
    assert not shardwise.verify(store, path="a").ok  # the open write is reported
    # the rerun verify advises: the shards stored by the flushes are kept, the rest written
    report = shardwise.write_array(
        data, store, path="a", mode="w-", resume=True, chunks=(CHUNK, CHUNK), shards=(SHARD, COLS)
    )
    assert report.shards_skipped >= 2
    assert report.shards_skipped + report.shards_written == ROWS // SHARD
    np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[:], data)
    assert shardwise.verify(store, path="a").ok


def test_flushes_into_an_icechunk_session_merge_and_commit_once(tmp_path: Path) -> None:
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "r")))
    data = frames(2)
    session = repo.writable_session("main")
    target, call, write = opened(session, data, commit="two flushes")
    assert target.forks and call.lease is False
    tip = repo.lookup_branch("main")
    with Execution(target, call) as ex:
        ex.flush(ex.parts([rows(write, data, 0, 5 * SHARD)]))
        ex.flush(ex.parts([rows(write, data, 5 * SHARD, ROWS)]))
        # nothing of the data in the branch until the one commit
        assert repo.lookup_branch("main") == tip
        report = ex.run([])
    assert any(n.startswith("committed snapshot") for n in report.notes)
    assert report.shards_written == ROWS // SHARD
    history = [s.message for s in repo.ancestry(branch="main")]
    assert history[0] == "two flushes" and history.count("two flushes") == 1
    got = zarr.open_array(repo.readonly_session("main").store, path="a", mode="r")[:]
    np.testing.assert_array_equal(got, data)


def test_the_recipe_of_a_new_front_end_writes_a_store_and_a_session_alike(tmp_path: Path) -> None:
    """docs/design.md's recipe (target, plan, execute) through both kinds of target."""
    data = frames(3)
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "r")))
    targets = {
        "store": (zarr.storage.LocalStore(tmp_path / "s.zarr"), None),
        "session": (repo.writable_session("main"), "recipe"),
    }
    for name, (store, commit) in targets.items():
        target, call, _ = opened(store, data, commit=commit)
        report = execute(target, call)
        assert report.shards_written == ROWS // SHARD, name
    got = zarr.open_array(repo.readonly_session("main").store, path="a", mode="r")[:]
    np.testing.assert_array_equal(got, data)
    local = zarr.open_array(targets["store"][0], path="a", mode="r")[:]
    np.testing.assert_array_equal(local, data)


def test_the_job_decides_how_a_sessions_tasks_write(tmp_path: Path) -> None:
    """The strategy of a write into an icechunk session is the job's (job_for, the session
    its input): "auto" writes direct, saying why; on a store the same call keeps its own rule."""
    import dask.array as da

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "r")))
    source = da.from_array(frames(), chunks=(6, COLS))  # blocks that split shards
    kw: dict[str, Any] = dict(path="a", chunks=(CHUNK, CHUNK), shards=(SHARD, COLS))
    into = shardwise.plan_write(source, repo.writable_session("main"), **kw)
    assert (into.strategy, into.requested) == ("direct", "auto")
    assert "icechunk session" in into.reason and "icechunk session" in str(into)
    plain = shardwise.plan_write(source, tmp_path / "s.zarr", **kw)
    assert "icechunk" not in plain.reason
    assert not repo.writable_session("main").has_uncommitted_changes


def test_resize_grows_an_open_write_and_moves_its_marker(tmp_path: Path) -> None:
    """``Execution.resize``: the write of rows 0:16 of a 16-row array grown, flush by flush,
    to the 64 rows (a stream's shard-rows); its one open marker follows its region (the old
    one removed), flushes past the old region are accepted, the finish marks the last done."""
    data = frames(4)
    store = zarr.storage.LocalStore(tmp_path / "s.zarr")
    target, call, write = opened(store, data[: 2 * SHARD])
    array = ShardStore(store, "a")
    with Execution(target, call) as ex:
        for end in range(2 * SHARD, ROWS + 1, 2 * SHARD):
            region = (slice(0, end), slice(0, COLS))
            info = replace(write.info, layout=replace(write.info.layout, shape=(end, COLS)))
            grown = replace(write, info=info, plan=ShardPlan(info.layout, region), job=None,
                            source=None)  # fmt: skip
            ex.resize(grown)
            markers = [m for m in read_markers(array).values() if m is not None]
            assert [(m.status, m.region, m.shape) for m in markers] == [
                ("open", [[0, end], [0, COLS]], [end, COLS])
            ]
            part = replace(grown, plan=ShardPlan(info.layout, (slice(end - 2 * SHARD, end),
                           slice(0, COLS))), source=data[end - 2 * SHARD : end])  # fmt: skip
            ex.flush(ex.parts([part]))
        with pytest.raises(PlanError, match="not an array of this write"):
            ex.resize(replace(grown, store=ShardStore(store, "b")))
        report = ex.run([])
    assert report.shards_written == ROWS // SHARD
    assert [(m.status, m.region) for m in read_markers(array).values() if m is not None] == [
        ("done", [[0, ROWS], [0, COLS]])
    ]
    zarr.open_array(store, path="a", mode="r+").resize((ROWS, COLS))
    np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[:], data)
