"""``write_array(..., append_dim=)``: numpy, dask and DataArray appends by the one append rule
(``write/appends.py``), with to_zarr's guarantees.

Appends land at the end, their last shard merged; every refusal (other dimensions, no array, a
mode or region with it, an axis the array lacks) comes before any byte; ``plan_write`` plans one
without writing. Independent processes appending at once all land, each writer's rows once and
contiguous: every writer is held after it read the length and before its reservation commit
until all have read it, so all but one lose that commit and reserve again (the redone commits
and the notes prove the race ran), on local files and S3 (moto). A writer SIGKILLed mid-data (a
source block held until the kill) or between its reservation and its markers (stopped there by
the rule's hook) is reported by ``verify`` with the call that finishes it; that call, with
``resume=True``, writes the rows once where they were reserved, and again finds them written.
An append that fails after a later one reserved leaves a hole that ``verify`` reports and the
resume fills; one that fails while still the last gives its rows back. No timing: events, the
stopped state of a process, and shard records are waited for.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import shardwise
from faultkit import MotoS3, forkserver, hold_block, moto_s3, snapshot, unique, wait_until
from shardwise.durability.records import read_records
from shardwise.errors import ArrayNotFoundError, InvalidTypeError, InvalidValueError, PlanError
from shardwise.storage.store import ShardStore, resolve_store

START, N, SHARD, CHUNK, WIDTH = 10, 40, 4, 2, 3
HELD = 3  # the source block (rows 12:16 of the append) a killed writer never gets
LAYOUT: dict[str, Any] = dict(chunks=(CHUNK, WIDTH), shards=(SHARD, WIDTH), fill_value=-1)


def block(ids: np.ndarray) -> np.ndarray:
    """The rows of ``ids``: every value follows from its row's id (a row torn or filled shows)."""
    return ids[:, None] * 4 + np.arange(WIDTH, dtype="int64")


def rows(lo: int, hi: int) -> np.ndarray:
    return block(np.arange(lo, hi, dtype="int64"))


def base(root: Any, **kw: Any) -> None:
    shardwise.write_array(rows(0, START), root, **LAYOUT, **kw)


def assert_holds(root: Any, want: np.ndarray) -> None:
    np.testing.assert_array_equal(shardwise.read_array(root), want)
    rep = shardwise.verify(root)
    assert rep.ok, rep


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


def open_store(kind: str, where: str, endpoint: str = "") -> Any:
    return where if kind == "local" else MotoS3(endpoint, None).obstore(where)


# -- one caller ------------------------------------------------------------------------------------


def test_numpy_and_dask_appends_land_at_the_end(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    base(root)
    first = shardwise.write_array(rows(START, 15), root, append_dim=0)
    assert "append along 'axis 0': rows 10:15 reserved" in first.notes, first.notes
    lazy = da.from_array(rows(15, 29), chunks=(5, WIDTH))  # chunks that are not the shards
    second = shardwise.write_array(lazy, root, append_dim=-2)
    assert "append along 'axis 0': rows 15:29 reserved" in second.notes, second.notes
    assert_holds(root, rows(0, 29))
    # the shard across the old end (rows 8:12) merged, its rows 8:10 kept; the array's
    # metadata says 29 rows, not the padded 32 the writes were planned in
    assert shardwise.open_array(root).shape == (29, WIDTH)


def test_a_dataarray_appends_along_a_dimension_name(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    base(root, dimension_names=("t", "x"))
    more = xr.DataArray(rows(START, 17), dims=("t", "x"))
    rep = shardwise.write_array(more, root, append_dim="t")
    assert "append along 't': rows 10:17 reserved" in rep.notes, rep.notes
    assert_holds(root, rows(0, 17))
    before = snapshot(root)
    with pytest.raises(PlanError, match=r"dimensions \('x', 't'\) are not those"):
        shardwise.write_array(more.T, root, append_dim="t")
    assert snapshot(root) == before


@pytest.mark.parametrize(
    "data,kw,error,words",
    [
        (rows(0, 3)[:, :2], dict(append_dim=0), PlanError, "every other dimension"),
        (rows(0, 3)[None], dict(append_dim=0), PlanError, "every other dimension"),
        (rows(0, 3), dict(append_dim=2), InvalidValueError, "not an axis"),
        (rows(0, 3), dict(append_dim="t"), InvalidValueError, "pass an axis"),
        (rows(0, 3), dict(append_dim=0, mode="w"), InvalidValueError, "needs mode='a'"),
        (rows(0, 3), dict(append_dim=0, mode="r+"), InvalidValueError, "needs mode='a'"),
        (rows(0, 3), dict(append_dim=True), InvalidTypeError, "axis \\(int\\)"),
        (rows(0, 3), dict(append_dim=1.0), InvalidTypeError, "axis \\(int\\)"),
        (
            rows(0, 3),
            dict(append_dim=0, region=(slice(0, 3), ...)),
            InvalidValueError,
            "cannot be given together",
        ),
    ],
)
def test_an_append_that_does_not_fit_is_refused_before_any_byte(
    tmp_path: Path, data: np.ndarray, kw: dict[str, Any], error: type, words: str
) -> None:
    root = tmp_path / "a.zarr"
    base(root)
    before = snapshot(root)
    with pytest.raises(error, match=words):
        shardwise.write_array(data, root, **kw)
    assert snapshot(root) == before


def test_an_append_needs_an_array(tmp_path: Path) -> None:
    with pytest.raises(ArrayNotFoundError, match="appends to an existing array"):
        shardwise.write_array(rows(0, 3), tmp_path / "none.zarr", append_dim=0)
    assert not (tmp_path / "none.zarr").exists()


def test_plan_write_plans_an_append_at_the_end_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    base(root)
    before = snapshot(root)
    plan = shardwise.plan_write(rows(START, 17), root, append_dim=0)
    assert plan.plan.region[0] == slice(10, 17), plan
    # the shard across the old end (rows 8:12) and the new last one (16:20, padded) merge
    assert plan.plan.npartial == 2, plan
    assert snapshot(root) == before


def test_a_failed_append_that_is_still_the_last_gives_its_rows_back(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    base(root)

    def lost(b: np.ndarray, block_info: Any = None) -> np.ndarray:
        if block_info is not None and block_info[0]["chunk-location"][0] == HELD:
            raise RuntimeError("source lost")
        return b

    src = da.from_array(rows(START, START + N), chunks=(SHARD, WIDTH)).map_blocks(lost)
    with (
        dask.config.set(scheduler="threads", num_workers=2),
        pytest.raises(RuntimeError, match="source lost"),
    ):
        shardwise.write_array(src, root, append_dim=0)
    assert_holds(root, rows(0, START))  # rows given back, nothing for verify to report


def test_an_append_given_up_after_a_later_one_leaves_a_hole_verify_reports(
    tmp_path: Path,
) -> None:
    """A (another process) reserves rows 10:50 and fails mid-data after B reserved 50:55 and
    finished: A cannot give its rows back (B's follow), so they read as the fill value and
    verify reports them, advising the call that finishes them; that call fills the hole, adding
    no rows."""
    root = tmp_path / "a.zarr"
    base(root)
    ctx = forkserver()
    writing, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    a = ctx.Process(target=failing_append, args=(str(root), writing, go, out))
    a.start()
    assert writing.wait(300), "A never reached its data"
    later = block(np.arange(1000, 1005))
    rep = shardwise.write_array(later, root, append_dim=0)
    go.set()
    assert out.get(timeout=300) == "RuntimeError: source lost"
    a.join(60)
    assert f"rows {START + N}:{START + N + 5} reserved" in " ".join(rep.notes), rep.notes
    got = shardwise.read_array(root)
    np.testing.assert_array_equal(got[START + N :], later)
    assert (got[START + 12 : START + 16] == -1).all()  # A's held rows: never written
    report = shardwise.verify(root)
    advice = [p.message for p in report.problems if p.kind == "incomplete"]
    assert len(advice) == 1 and f"rows {START}:{START + N} along 'axis 0'" in advice[0], report
    assert "write_array(<the same data, store and path>, append_dim=0, resume=True)" in advice[0]
    done = shardwise.write_array(rows(START, START + N), root, append_dim=0, resume=True)
    assert f"rows {START}:{START + N} of an unfinished append finished" in " ".join(done.notes)
    assert_holds(root, np.concatenate([rows(0, START + N), later]))


def failing_append(root: str, writing: Any, go: Any, out: Any) -> None:
    """Append rows START:START+N whose source block HELD waits for ``go``, then raises."""

    def held(b: np.ndarray, block_info: Any = None) -> np.ndarray:
        if block_info is not None and block_info[0]["chunk-location"][0] == HELD:
            writing.set()  # the rows are reserved and the data tasks run
            assert go.wait(300)
            raise RuntimeError("source lost")
        return b

    src = da.from_array(rows(START, START + N), chunks=(SHARD, WIDTH)).map_blocks(held)
    try:
        with dask.config.set(scheduler="threads", num_workers=4):
            shardwise.write_array(src, root, append_dim=0)
        out.put("appended")
    except Exception as e:
        out.put(f"{type(e).__name__}: {e}")


# -- independent processes appending at once -------------------------------------------------------

TRIALS, S3_TRIALS = 4, 2


def ids(trial: int, writer: int) -> np.ndarray:
    """The row ids writer ``writer`` appends in ``trial`` (-1: the first rows)."""
    n = START if writer < 0 else 3 + writer
    return trial * 100_000 + (writer + 1) * 1000 + np.arange(n, dtype="int64")


def trial_store(kind: str, base: str, trial: int, endpoint: str) -> Any:
    return open_store(
        kind,
        str(Path(base) / f"t{trial}.zarr") if kind == "local" else f"{base}/t{trial}",
        endpoint,
    )


def append_worker(
    idx: int, kind: str, base: str, endpoint: str, trials: int, barrier: Any, align: Any, out: Any
) -> None:
    """One independent appender: every trial, wait for the others, then append its rows (numpy
    for even writers, dask for odd ones), held at its first metadata commit until every writer
    read the length. Reports (trial, writer, commits redone, notes, error)."""
    import shardwise.storage.conditional as cond

    state = {"armed": False, "redone": 0}
    cond.before_commit = partial(_before_commit, align, state)
    dask.config.set(scheduler="synchronous")  # the concurrency under test is between processes
    for t in range(trials):
        data: Any = block(ids(t, idx))
        if idx % 2:
            data = da.from_array(data, chunks=(2, WIDTH))
        store = trial_store(kind, base, t, endpoint)
        barrier.wait(timeout=300)
        state["armed"], state["redone"] = True, 0
        try:
            rep = shardwise.write_array(data, store, append_dim=0)
            out.put((t, idx, state["redone"], " ".join(rep.notes), ""))
        except Exception as e:  # reported, and fails the test
            out.put((t, idx, -1, "", f"{type(e).__name__}: {e}"))


def _before_commit(align: Any, state: dict[str, Any], name: str, attempt: int) -> None:
    if not name.endswith("zarr.json"):
        return
    if attempt > 0:
        state["redone"] += 1  # another appender committed the document first
    if state["armed"]:
        state["armed"] = False
        align.wait(timeout=300)


def run_appends(kind: str, base: str, writers: int, trials: int, endpoint: str = "") -> list[Any]:
    for t in range(trials):
        shardwise.write_array(block(ids(t, -1)), trial_store(kind, base, t, endpoint), **LAYOUT)
    ctx = forkserver()
    barrier, align, out = ctx.Barrier(writers), ctx.Barrier(writers), ctx.Queue()
    args = (kind, base, endpoint, trials, barrier, align, out)
    jobs = [ctx.Process(target=append_worker, args=(i, *args)) for i in range(writers)]
    for j in jobs:
        j.start()
    results = [out.get(timeout=600) for _ in range(writers * trials)]
    for j in jobs:
        j.join(timeout=60)
    return results


def assert_every_row_landed_once(store: Any, trial: int, writers: int) -> None:
    """Every writer's rows once, contiguous, whole; the first rows first; verify clean."""
    got = shardwise.read_array(store)
    t = got[:, 0] // 4
    np.testing.assert_array_equal(got, block(t))  # no row torn or left as fill
    assert len(set(t.tolist())) == len(t), "a row stored twice"
    np.testing.assert_array_equal(t[:START], ids(trial, -1))
    where = {int(v): i for i, v in enumerate(t)}
    for w in range(writers):
        at = [where.get(int(v), -1) for v in ids(trial, w)]
        assert -1 not in at and at == list(range(at[0], at[0] + len(at))), (trial, w, at)
    assert len(t) == START + sum(3 + w for w in range(writers)), len(t)
    assert shardwise.verify(store).ok


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_concurrent_array_appends_from_processes_all_land(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    writers, trials = (3, TRIALS) if kind == "local" else (2, S3_TRIALS)
    base_, endpoint = str(tmp_path), ""
    if kind == "s3":
        base_, endpoint = f"array-appends-{unique()}", request.getfixturevalue("s3").endpoint
    results = run_appends(kind, base_, writers, trials, endpoint)
    assert [r[4] for r in results if r[4]] == []
    for t in range(trials):
        assert_every_row_landed_once(trial_store(kind, base_, t, endpoint), t, writers)
        mine = [r for r in results if r[0] == t]
        # the race ran: all read one length, all but one lost their reservation commit and
        # found the rows taken (their notes say so)
        assert sum(r[2] for r in mine) >= writers - 1, mine
        assert sum("others appended first" in r[3] for r in mine) == writers - 1, mine


# -- killed appends, resumed once ------------------------------------------------------------------


def writes_recorded(store: Any) -> dict[str, str]:
    found = read_records(ShardStore(resolve_store(store, mode="r"), ""))
    return {k: r.write for k, r in found.items() if r is not None}


def killed_append(kind: str, where_: str, endpoint: str, where: str, started: Any) -> None:
    """The append of rows START:START+N that gets SIGKILLed: ``where`` "data" holds one source
    block (the other shards are stored); "window" stops after the reservation commit, before
    the markers that name its rows (the rule's hook)."""
    import shardwise.write.appends as appends

    src = da.from_array(rows(START, START + N), chunks=(SHARD, WIDTH))
    if where == "data":
        src = src.map_blocks(hold_block, (HELD, 0), dtype=src.dtype)
        started.set()
    else:

        def stop(path: str) -> None:
            started.set()
            os.kill(os.getpid(), signal.SIGSTOP)

        appends.after_claim = stop
    with dask.config.set(scheduler="threads", num_workers=4):
        shardwise.write_array(src, open_store(kind, where_, endpoint), append_dim=0)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def kill(kind: str, where_: str, where: str, endpoint: str = "") -> None:
    ctx = forkserver()
    started = ctx.Event()
    store = open_store(kind, where_, endpoint)
    before = writes_recorded(store)
    proc = ctx.Process(target=killed_append, args=(kind, where_, endpoint, where, started))
    proc.start()
    assert started.wait(300)
    if where == "data":
        # rows 8:52 are 11 shards; the held block feeds two (rows 20:28): 9 recorded by the
        # append (the first, rows 8:12, merged, replaces an earlier record)
        def nine() -> bool:
            return sum(before.get(k) != w for k, w in writes_recorded(store).items()) >= 9

        wait_until(nine, "9 shards recorded by the append")
    else:
        wait_until(lambda: _stopped(proc.pid), "the writer stopped after its reservation")
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("kind,where", [("local", "data"), ("local", "window"), ("s3", "data")])
def test_a_killed_array_append_is_resumed_once(
    tmp_path: Path, kind: str, where: str, request: pytest.FixtureRequest
) -> None:
    path, endpoint = str(tmp_path / "a.zarr"), ""
    if kind == "s3":
        path, endpoint = f"killed-{unique()}", request.getfixturevalue("s3").endpoint
    root = open_store(kind, path, endpoint)
    base(root)
    kill(kind, path, where, endpoint)
    rep = shardwise.verify(root)
    advice = [p.message for p in rep.problems if p.kind == "incomplete"]
    assert advice and all(
        f"rows {START}:{START + N} along 'axis 0'" in m
        and "write_array(<the same data, store and path>, append_dim=0, resume=True)" in m
        for m in advice
    ), rep
    with dask.config.set(scheduler="threads", num_workers=4):
        data = da.from_array(rows(START, START + N), chunks=(SHARD, WIDTH))
        done = shardwise.write_array(data, root, append_dim=0, resume=True)
    assert f"rows {START}:{START + N} of an unfinished append finished" in " ".join(done.notes)
    if where == "data":
        assert done.shards_skipped >= 9, done  # the shards stored before the kill
    assert_holds(root, rows(0, START + N))  # 50 rows, not 90; none left as fill
    # and it stays finished: the same call again adds nothing
    again = shardwise.write_array(rows(START, START + N), root, append_dim=0, resume=True)
    assert again.shards_written == 0 and "appended before" in " ".join(again.notes), again
    assert_holds(root, rows(0, START + N))


def test_an_append_given_up_in_this_process_is_finished_by_a_resume_from_it(
    tmp_path: Path,
) -> None:
    """As above, with A failing in a thread of this very process (which lives on): its markers
    are no running write's, so the resume from here fills A's hole rather than appending its
    rows again."""
    import threading

    root = tmp_path / "a.zarr"
    base(root)
    writing, go, failed = threading.Event(), threading.Event(), []

    def held(b: np.ndarray, block_info: Any = None) -> np.ndarray:
        if block_info is not None and block_info[0]["chunk-location"][0] == HELD:
            writing.set()
            assert go.wait(300)
            raise RuntimeError("source lost")
        return b

    def a() -> None:
        src = da.from_array(rows(START, START + N), chunks=(SHARD, WIDTH)).map_blocks(held)
        try:
            with dask.config.set(scheduler="threads", num_workers=4):
                shardwise.write_array(src, root, append_dim=0)
        except RuntimeError as e:
            failed.append(str(e))

    t = threading.Thread(target=a)
    t.start()
    assert writing.wait(300), "A never reached its data"
    later = block(np.arange(1000, 1005))
    shardwise.write_array(later, root, append_dim=0)
    go.set()
    t.join(300)
    assert failed == ["source lost"]
    done = shardwise.write_array(rows(START, START + N), root, append_dim=0, resume=True)
    assert f"rows {START}:{START + N} of an unfinished append finished" in " ".join(done.notes)
    assert_holds(root, np.concatenate([rows(0, START + N), later]))
    assert shardwise.verify(root).ok
