"""Resume means finish, never repeat: an append killed or failed part-way, rerun as ``verify``
advises, leaves the rows once, where they were reserved, and ``verify`` clean.

Each append records where its rows go (its write markers, at the reserved rows, before any data;
before its lead commit, a record of itself that names them until the markers do). A writer
SIGKILLed mid-data (a source block held until the kill), between its reservations (the lead
array grown, the others not yet) or between the lead's commit and its markers leaves rows
reserved; ``verify`` names them and advises ``resume=True``, and that call writes them there
(the shards stored before skipped). One killed before its commit reserved nothing: the resume
appends once. A writer is stopped at a named point by a hook it calls there
(``conditional.before_commit``, ``write.appends.after_claim``), then killed: no timing. An append
whose source raised gives its rows back and closes its markers: ``verify`` is clean at once.
``resume=True`` with nothing unfinished appends once, and finds an append it already finished.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import shardwise
from faultkit import (
    MotoS3,
    exe,
    forkserver,
    hold_block,
    moto_s3,
    settle,
    snapshot,
    unique,
    wait_until,
)
from shardwise.durability.records import read_records
from shardwise.storage.store import ShardStore, resolve_store

START, N, SHARD, CHUNK, WIDTH = 10, 40, 4, 2, 3
ENC = {
    "v": {"chunks": (CHUNK, WIDTH), "shards": (SHARD, WIDTH)},
    "w": {"chunks": (CHUNK,), "shards": (SHARD,)},
    "t": {"chunks": (CHUNK,), "shards": (SHARD,)},
}
HELD = 3  # the source block of v (rows 12:16 of the append) a killed writer never gets


def rows(lo: int, hi: int) -> xr.Dataset:
    """Rows ``lo:hi``: every value follows from its coordinate (a row torn or filled shows)."""
    t = np.arange(lo, hi, dtype="int64")
    return xr.Dataset(
        {"v": (("t", "x"), t[:, None] * 4 + np.arange(WIDTH)), "w": (("t",), t + 0.5)},
        coords={"t": t, "x": np.arange(WIDTH)},
    )


def held_rows(lo: int, hi: int, go: Any, *, then_fail: bool = False) -> xr.Dataset:
    """``rows(lo, hi)`` whose source block ``HELD`` of ``v`` waits until ``go`` is set (and then
    raises, with ``then_fail``): an append held mid-data for as long as a test needs."""

    def held(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        if block_info is not None and block_info[0]["chunk-location"][0] == HELD:
            assert go.wait(300), "never let go"
            if then_fail:
                raise RuntimeError("source lost")
        return block

    ds = rows(lo, hi)
    src = da.from_array(ds["v"].values, chunks=(SHARD, WIDTH))
    ds["v"] = ds["v"].copy(data=src.map_blocks(held, dtype=src.dtype))
    return ds


def base(root: Any) -> None:
    shardwise.to_zarr(rows(0, START), root, encoding=ENC)


def assert_holds(root: Any, n: int) -> None:
    """The store read from the root (consolidated or not) is rows 0:n, and verify is clean."""
    want = rows(0, n)
    for consolidated in (None, False):
        with xr.open_zarr(root, consolidated=consolidated) as ds:
            xr.testing.assert_identical(ds.load(), want)
    rep = shardwise.verify(root)
    assert rep.ok and not rep.changes, rep


def open_store(kind: str, where: str, endpoint: str = "") -> Any:
    """A local path, or a moto S3 store under prefix ``where``."""
    return where if kind == "local" else MotoS3(endpoint, None).obstore(where)


def writes_recorded(store: Any, path: str) -> dict[str, str]:
    """The write that recorded each shard of the array at ``path``, by shard key."""
    found = read_records(ShardStore(resolve_store(store, mode="r"), path))
    return {k: r.write for k, r in found.items() if r is not None}


def killed_append(
    kind: str, where_: str, endpoint: str, where: str, started: Any, lo: int = START
) -> None:
    """The append of rows lo:lo+N that gets SIGKILLed: ``where`` "data" holds one source
    block of v (the other shards are stored); "reservation" holds the commit that grows the
    second array, after the lead's (the arrays then disagree on the length); "window" stops
    after the lead's commit, before the markers that name its rows; "claim" stops before the
    lead's commit (its record put: durability/appending.py)."""
    import shardwise.storage.conditional as cond
    import shardwise.write.appends as appends

    def stop(*_: Any) -> None:
        if not started.is_set():
            started.set()
            os.kill(os.getpid(), signal.SIGSTOP)

    ds = rows(lo, lo + N)
    if where == "data":
        src = da.from_array(ds["v"].values, chunks=(SHARD, WIDTH))
        ds["v"] = ds["v"].copy(data=src.map_blocks(hold_block, (HELD, 0), dtype=src.dtype))
    elif where == "window":
        appends.after_claim = stop
    elif where == "claim":
        cond.before_commit = stop  # the first commit: the lead's
    else:
        seen: list[str] = []

        def hold(name: str, attempt: int) -> None:
            seen.append(name)
            if len(seen) == 2:  # the lead grew: the next array's growth never comes
                started.set()
                os.kill(os.getpid(), signal.SIGSTOP)

        cond.before_commit = hold
    if where == "data":
        started.set()
    with dask.config.set(scheduler="threads", num_workers=4):
        shardwise.to_zarr(ds, open_store(kind, where_, endpoint), append_dim="t")


def stopped_append(kind: str, root: str, where: str, endpoint: str = "", lo: int = START) -> Any:
    """The appending process, stopped at ``where`` (not "data"): alive, until killed or
    continued."""
    ctx = forkserver()
    started = ctx.Event()
    proc = ctx.Process(target=killed_append, args=(kind, root, endpoint, where, started, lo))
    proc.start()
    assert started.wait(300)
    wait_until(lambda: _stopped(proc.pid), f"the writer stopped at {where!r}")
    return proc


def kill(kind: str, root: str, where: str, endpoint: str = "") -> None:
    if where != "data":
        proc = stopped_append(kind, root, where, endpoint)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(60)
        assert proc.exitcode == -signal.SIGKILL
        return
    ctx = forkserver()
    started = ctx.Event()
    before = writes_recorded(open_store(kind, root, endpoint), "v")
    proc = ctx.Process(target=killed_append, args=(kind, root, endpoint, where, started))
    proc.start()
    assert started.wait(300)
    # v's 11 shards (rows 8:52) but the two the held block feeds (rows 20:28), all 9
    # recorded by this append (the first, rows 8:12, merged, replaces an earlier record)
    store = open_store(kind, root, endpoint)

    def nine_done() -> bool:
        now = writes_recorded(store, "v")
        return sum(before.get(k) != w for k, w in now.items()) >= 9

    wait_until(nine_done, "9 shards of v recorded by the append")
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


@pytest.mark.parametrize(
    "kind,where",
    [
        ("local", "data"),
        ("local", "reservation"),
        ("local", "window"),  # its rows in the lead's length, named by its record alone
        ("s3", "data"),
        ("s3", "window"),
    ],
)
def test_a_killed_append_rerun_as_verify_advises_finishes_its_rows(
    tmp_path: Path, kind: str, where: str, request: pytest.FixtureRequest
) -> None:
    path, endpoint = str(tmp_path / "a.zarr"), ""
    if kind == "s3":
        path, endpoint = f"killed-{unique()}", request.getfixturevalue("s3").endpoint
    root = open_store(kind, path, endpoint)
    base(root)
    kill(kind, path, where, endpoint)
    if kind == "local":  # the command verify is: exit 1, then 0 after the advised call
        assert subprocess.run([*exe(), "verify", path], capture_output=True).returncode == 1
    rep = shardwise.verify(root)
    advice = [p.message for p in rep.problems if p.kind == "incomplete" and "append" in p.message]
    assert advice and all(
        f"rows {START}:{START + N} along 't'" in m and "append_dim='t', resume=True" in m
        for m in advice
    ), rep
    # the advised call
    with dask.config.set(scheduler="threads", num_workers=4):
        done = shardwise.to_zarr(rows(START, START + N), root, append_dim="t", resume=True)
    assert f"rows {START}:{START + N} of an unfinished append finished" in " ".join(done.notes)
    if where == "data":
        assert done.shards_skipped >= 9, done  # v's shards stored before the kill
    assert_holds(root, START + N)  # 50 rows, not 90; none left as fill
    if kind == "local":
        assert subprocess.run([*exe(), "verify", path], capture_output=True).returncode == 0
    # and it stays finished: the same call again adds nothing
    again = shardwise.to_zarr(rows(START, START + N), root, append_dim="t", resume=True)
    assert again.shards_written == 0 and "appended before" in " ".join(again.notes), again
    assert_holds(root, START + N)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_failed_append_gives_its_rows_back_and_leaves_verify_clean(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """On S3 (no conditional delete) the shards it stored past the old end are deleted after a
    check that they are still its own, as a local store deletes them conditionally."""
    endpoint = request.getfixturevalue("s3").endpoint if kind == "s3" else ""
    root = open_store(kind, str(tmp_path / "a.zarr") if kind == "local" else unique(), endpoint)
    base(root)

    def lost(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        if block_info is not None and block_info[0]["chunk-location"][0] == HELD:
            raise RuntimeError("source lost")
        return block

    ds = rows(START, START + N)
    src = da.from_array(ds["v"].values, chunks=(SHARD, WIDTH))
    ds["v"] = ds["v"].copy(data=src.map_blocks(lost, dtype=src.dtype))
    with (
        dask.config.set(scheduler="threads", num_workers=2),
        pytest.raises(RuntimeError, match="source lost"),
    ):
        shardwise.to_zarr(ds, root, append_dim="t")
    assert_holds(root, START)  # rows given back, nothing left for verify to report
    # rerun (resume=True as well: nothing to finish) appends them once, where they were
    rep = shardwise.to_zarr(rows(START, START + N), root, append_dim="t", resume=True)
    assert f"rows {START}:{START + N} reserved" in " ".join(rep.notes), rep.notes
    assert_holds(root, START + N)


def test_resume_with_nothing_unfinished_appends_once(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    base(root)
    first = shardwise.to_zarr(rows(START, 20), root, append_dim="t", resume=True)
    assert f"rows {START}:20 reserved" in " ".join(first.notes)
    assert_holds(root, 20)
    # the same rows again: found appended, nothing written
    again = shardwise.to_zarr(rows(START, 20), root, append_dim="t", resume=True)
    assert again.shards_written == 0 and "rows 10:20 appended before" in " ".join(again.notes)
    assert_holds(root, 20)
    # other rows of the same shape: appended
    shardwise.to_zarr(rows(20, 30), root, append_dim="t", resume=True)
    assert_holds(root, 30)


def test_resume_does_not_finish_an_append_that_is_still_running(tmp_path: Path) -> None:
    """Append A of 40 rows is held mid-data (its source block waits); B appends 40 other rows
    with resume=True meanwhile. A's writer is alive, so its open markers are not B's to finish:
    B reserves its own rows, and once A goes on both land, each where it reserved."""
    import threading

    root = tmp_path / "a.zarr"
    base(root)
    go, errors = threading.Event(), []
    a = held_rows(START, START + N, go)

    def append_a() -> None:
        try:
            shardwise.to_zarr(a, root, append_dim="t")
        except BaseException as e:  # reported below
            errors.append(e)

    with dask.config.set(scheduler="threads", num_workers=4):
        thread = threading.Thread(target=append_a)
        thread.start()
        settle(root / "v", 9)  # A's shards but the held ones: A is mid-data
        rep = shardwise.to_zarr(rows(START + N, START + 2 * N), root, append_dim="t", resume=True)
        go.set()
        thread.join(300)
    assert errors == []
    assert f"rows {START + N}:{START + 2 * N} reserved" in " ".join(rep.notes), rep.notes
    assert_holds(root, START + 2 * N)


def test_an_append_killed_before_its_reservation_is_appended_once(tmp_path: Path) -> None:
    """Killed with its record put but before the lead's commit: nothing of it is stored. verify
    says the append did not finish; resume=True appends its rows once (no rows were reserved to
    finish) and removes the record: verify clean."""
    root = tmp_path / "a.zarr"
    base(root)
    kill("local", str(root), "claim")
    with xr.open_zarr(root) as ds:
        assert ds.sizes["t"] == START  # nothing reserved
    rep = shardwise.verify(root)
    advice = [p.message for p in rep.problems if p.kind == "incomplete"]
    assert len(advice) == 1 and "stopped before it reserved them" in advice[0], rep
    assert "append_dim='t', resume=True" in advice[0]
    done = shardwise.to_zarr(rows(START, START + N), root, append_dim="t", resume=True)
    assert f"rows {START}:{START + N} reserved" in " ".join(done.notes), done.notes
    assert_holds(root, START + N)


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_rows_another_tool_appended_after_a_kill_are_never_taken_for_the_killed_appends(
    tmp_path: Path,
) -> None:
    """K (rows for t 10..49) is killed before its commit; then xarray's own engine appends 40
    other rows (t 50..89, no marker, no record): rows 10:50 are named by no write, as many as
    K's, as the rows of an append killed in its window would be. They hold values, so they are
    not K's: verify says K reserved nothing, and the resume appends K's rows once after them
    (rows 50:90), every value of the other tool's rows kept; verify finds no problem."""
    root = tmp_path / "a.zarr"
    base(root)
    kill("local", str(root), "claim")
    other = rows(START + N, START + 2 * N)
    other.to_zarr(root, append_dim="t", mode="a")  # xarray's own zarr engine: no markers
    rep = shardwise.verify(root)
    advice = [p.message for p in rep.problems if p.kind == "incomplete"]
    assert len(advice) == 1 and "stopped before it reserved them" in advice[0], rep
    done = shardwise.to_zarr(rows(START, START + N), root, append_dim="t", resume=True)
    assert f"rows {START + N}:{START + 2 * N} reserved" in " ".join(done.notes), done.notes
    want = xr.concat([rows(0, START), other, rows(START, START + N)], dim="t")
    for consolidated in (None, False):
        with xr.open_zarr(root, consolidated=consolidated) as ds:
            xr.testing.assert_identical(ds.load(), want)
    # the other tool's shards (new ones, and the one it rewrote at rows 8:12) are changes
    # verify reports, no problem
    rep = shardwise.verify(root)
    assert rep.ok and {c.kind for c in rep.changes} == {"unrecorded", "mismatch"}, rep


def test_resume_never_finishes_rows_an_append_still_reserving_holds(tmp_path: Path) -> None:
    """K is killed before its commit (its record stays); A, alive, stops between its commit
    (rows 10:50) and its markers. A resume of K's shape then sees 40 rows no marker names after
    the length K saw: A's, or K's had K committed first. It refuses (nothing written) rather
    than take A's rows or append K's again; verify notes A reserving and is otherwise only
    K's. Once A goes on and names its rows, the resume appends K's once (rows 50:90)."""
    from shardwise.errors import LeaseHeldError

    root = tmp_path / "a.zarr"
    base(root)
    kill("local", str(root), "claim")
    a = stopped_append("local", str(root), "window", lo=START)
    try:
        rep = shardwise.verify(root)
        assert any("reserving its rows now" in n for n in rep.notes), rep
        assert [p.kind for p in rep.problems] == ["incomplete"], rep  # K's, not A's
        before = snapshot(root)
        k = rows(START + N, START + 2 * N)
        with pytest.raises(LeaseHeldError, match="another append is reserving rows now"):
            shardwise.to_zarr(k, root, append_dim="t", resume=True)
        assert snapshot(root) == before  # refused: nothing changed
    finally:
        os.kill(a.pid, signal.SIGCONT)
        a.join(300)
    assert a.exitcode == 0
    done = shardwise.to_zarr(k, root, append_dim="t", resume=True)
    assert f"rows {START + N}:{START + 2 * N} reserved" in " ".join(done.notes), done.notes
    assert_holds(root, START + 2 * N)


def shrunk_append(root: str, read: Any, claimed: Any) -> None:
    """Rows START:START+N appended; stopped at its lead commit's first try (the length read),
    and again between that commit and its markers."""
    import shardwise.storage.conditional as cond
    import shardwise.write.appends as appends

    def at_commit(name: str, attempt: int) -> None:
        if not read.is_set():
            read.set()
            os.kill(os.getpid(), signal.SIGSTOP)

    def at_claim(path: str) -> None:
        claimed.set()
        os.kill(os.getpid(), signal.SIGSTOP)

    cond.before_commit, appends.after_claim = at_commit, at_claim
    shardwise.to_zarr(rows(START, START + N), root, append_dim="t")


def test_rows_reserved_below_the_length_seen_after_a_give_back_are_finished(
    tmp_path: Path,
) -> None:
    """B reserves rows 10:50 and is held mid-data; A reads length 50 and is held at its commit;
    B fails and gives its rows back (length 10); A's commit, lost, is redone at rows 10:50, below
    the length it first saw, and A is killed before its markers. Its record says the length its
    commit grew from, so the resume finds rows 10:50 unnamed and finishes them there."""
    import json
    import threading

    root = tmp_path / "a.zarr"
    base(root)
    go, errors = threading.Event(), []
    b = held_rows(START, START + N, go, then_fail=True)

    def append_b() -> None:
        try:
            shardwise.to_zarr(b, root, append_dim="t")
        except BaseException as e:  # checked below
            errors.append(e)

    def lead_length() -> int:
        return int(json.loads((root / "t" / "zarr.json").read_bytes())["shape"][0])

    ctx = forkserver()
    read, claimed = ctx.Event(), ctx.Event()
    with dask.config.set(scheduler="threads", num_workers=4):
        thread = threading.Thread(target=append_b)
        thread.start()
        wait_until(lambda: lead_length() == START + N, "B reserved its rows")
        a = ctx.Process(target=shrunk_append, args=(str(root), read, claimed))
        a.start()
        assert read.wait(300)
        wait_until(lambda: _stopped(a.pid), "A stopped at its commit")
        go.set()
        thread.join(300)
    assert [str(e) for e in errors] == ["source lost"]
    assert lead_length() == START  # B's rows given back
    os.kill(a.pid, signal.SIGCONT)
    assert claimed.wait(300)
    wait_until(lambda: _stopped(a.pid), "A stopped before its markers")
    os.kill(a.pid, signal.SIGKILL)
    a.join(60)
    assert lead_length() == START + N  # A's rows, named by its record alone
    done = shardwise.to_zarr(rows(START, START + N), root, append_dim="t", resume=True)
    assert f"rows {START}:{START + N} of an unfinished append finished" in " ".join(done.notes)
    assert_holds(root, START + N)


def test_two_appends_killed_in_their_window_are_finished_first_rows_first(tmp_path: Path) -> None:
    """Two appends of one shape, each killed between its commit and its markers (rows 10:50 and
    50:90, named by their records alone). verify reports both; the first resume finishes rows
    10:50, the second 50:90: the calls rerun in their order land where they were reserved."""
    root = tmp_path / "a.zarr"
    base(root)
    kill("local", str(root), "window")
    proc = stopped_append("local", str(root), "window", lo=START + N)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    rep = shardwise.verify(root)
    advice = [p.message for p in rep.problems if p.kind == "incomplete"]
    assert len(advice) == 2 and all("resume=True" in m for m in advice), rep
    for lo in (START, START + N):
        done = shardwise.to_zarr(rows(lo, lo + N), root, append_dim="t", resume=True)
        assert f"rows {lo}:{lo + N} of an unfinished append finished" in " ".join(done.notes)
    assert_holds(root, START + 2 * N)


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_rows_reserved_after_another_tools_append_in_the_window_are_finished_there(
    tmp_path: Path,
) -> None:
    """K puts its record (length 10 seen) and is held at its commit's first try; xarray's own
    engine appends 40 other rows meanwhile (t 50..89 at rows 10:50, no marker). K's commit, lost,
    is redone at rows 50:90, its record put again first with the length it grows from, and K is
    killed before its markers. The rows after the length K first saw start with the other tool's
    values, and K's own come after them: verify names rows 50:90 and the resume finishes them
    there (before, those values were taken for "K reserved nothing": the resume appended at
    rows 90:130 and left rows 50:90 fill values that nothing reported)."""
    root = tmp_path / "a.zarr"
    base(root)
    ctx = forkserver()
    read, claimed = ctx.Event(), ctx.Event()
    k = ctx.Process(target=shrunk_append, args=(str(root), read, claimed))
    k.start()
    assert read.wait(300)
    wait_until(lambda: _stopped(k.pid), "K stopped at its commit")
    other = rows(START + N, START + 2 * N)
    other.to_zarr(root, append_dim="t", mode="a")  # xarray's own zarr engine: no markers
    os.kill(k.pid, signal.SIGCONT)
    assert claimed.wait(300)
    wait_until(lambda: _stopped(k.pid), "K stopped before its markers")
    os.kill(k.pid, signal.SIGKILL)
    k.join(60)
    rep = shardwise.verify(root)
    advice = [p.message for p in rep.problems if p.kind == "incomplete"]
    assert len(advice) == 1 and f"rows {START + N}:{START + 2 * N} along 't'" in advice[0], rep
    done = shardwise.to_zarr(rows(START, START + N), root, append_dim="t", resume=True)
    finished = f"rows {START + N}:{START + 2 * N} of an unfinished append finished"
    assert finished in " ".join(done.notes), done.notes
    want = xr.concat([rows(0, START), other, rows(START, START + N)], dim="t")
    for consolidated in (None, False):
        with xr.open_zarr(root, consolidated=consolidated) as ds:
            xr.testing.assert_identical(ds.load(), want)
    rep = shardwise.verify(root)
    assert rep.ok, rep
