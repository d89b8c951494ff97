"""Concurrent appends from independent processes never lose rows; overlapping region writes
resolve shard by shard.

Every trial, N processes (forked once from a server that imported shardwise, then released
together by a barrier) each append a Dataset of their own rows -- a 2-d variable, a 1-d variable
and the dimension coordinate, distinct values per writer -- to the same store with
``to_zarr(append_dim="t")``. Appends of 3 + i rows into shards of 4 and inner chunks of 2 split
shards and chunks at every boundary. In the even trials every writer is also held, after it
read the length and before its first metadata commit, until all have read it: all find the same
length, so all but one must lose that commit and reserve again (the conflict count proves the
race ran). The control turns conditional commits off and loses rows in every trial. One append
is also made to run xarray's pass exactly between another's reservations (the arrays then
disagree on the length), held there by events.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
from zarr.storage import LocalStore

import shardwise
from faultkit import MotoS3, files, forkserver, moto_s3, record_figures, unique
from shardwise.durability.lease import Lease
from shardwise.errors import LeaseHeldError
from shardwise.storage.store import ShardStore

START, SHARD, CHUNK, WIDTH = 5, 4, 2, 3
TRIALS = 20
# on S3 every request goes through one moto server in the test process: the writers wait on it
# (measured: 2.5 s of CPU in 40 s of wall time per writer), so a trial costs 5-10x a local one.
# Each aligned trial proves the race on its own (assert_all_landed counts the redone commits).
S3_TRIALS = 6


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


def ids(trial: int, writer: int) -> np.ndarray:
    """The coordinate values writer ``writer`` appends in ``trial`` (-1: the initial rows)."""
    n = START if writer < 0 else 3 + writer
    return trial * 100_000 + (writer + 1) * 1000 + np.arange(n, dtype="int64")


def rows(t: np.ndarray) -> xr.Dataset:
    """A Dataset whose every value follows from its coordinate (a row torn or filled shows)."""
    v = t[:, None] * 4 + np.arange(WIDTH)
    return xr.Dataset(
        {"v": (("t", "x"), v), "w": (("t",), t + 0.5)},
        coords={"t": t, "x": np.arange(WIDTH)},
    )


def trial_store(kind: str, base: str, trial: int, endpoint: str) -> Any:
    if kind == "local":
        return str(Path(base) / f"t{trial}.zarr")
    return MotoS3(endpoint, None).obstore(f"{base}/t{trial}")


def append_worker(
    idx: int,
    kind: str,
    base: str,
    endpoint: str,
    trials: int,
    barrier: Any,
    align: Any,
    out: Any,
    conditional: bool,
) -> None:
    """One independent appender: every trial, wait for the others, then append its rows.
    ``align``: in even trials, hold the first metadata commit until every writer read the
    length. Reports (trial, writer, metadata commits redone, error)."""
    import dask

    import shardwise.storage.conditional as cond

    cond.ENABLED = conditional
    state = {"armed": False, "redone": 0}
    cond.before_commit = partial(_before_commit, align, state)
    dask.config.set(scheduler="synchronous")  # the concurrency under test is between processes
    for t in range(trials):
        ds = rows(ids(t, idx))
        store = trial_store(kind, base, t, endpoint)
        state["redone"] = 0
        barrier.wait(timeout=300)
        state["armed"] = t % 2 == 0
        try:
            rep = shardwise.to_zarr(ds, store, append_dim="t")
            assert any("reserved" in n for n in rep.notes), rep.notes
            out.put((t, idx, state["redone"], ""))
        except Exception as e:  # reported, and fails the test
            out.put((t, idx, -1, f"{type(e).__name__}: {e}"))


def _before_commit(align: Any, state: dict[str, Any], name: str, attempt: int) -> None:
    if not name.endswith("zarr.json"):
        return
    if attempt > 0:
        state["redone"] += 1  # another appender committed the document first
    if state["armed"]:
        state["armed"] = False
        align.wait(timeout=300)


def run_appends(
    kind: str, base: str, writers: int, trials: int, endpoint: str = "", conditional: bool = True
) -> dict[str, Any]:
    for t in range(trials):
        enc = {"v": {"chunks": (CHUNK, WIDTH), "shards": (SHARD, WIDTH)}}
        enc |= {k: {"chunks": (CHUNK,), "shards": (SHARD,)} for k in ("w", "t")}
        shardwise.to_zarr(rows(ids(t, -1)), trial_store(kind, base, t, endpoint), encoding=enc)
    ctx = forkserver()
    barrier, align, out = ctx.Barrier(writers), ctx.Barrier(writers), ctx.Queue()
    args = (kind, base, endpoint, trials, barrier, align, out, conditional)
    jobs = [ctx.Process(target=append_worker, args=(i, *args)) for i in range(writers)]
    for j in jobs:
        j.start()
    results = [out.get(timeout=600) for _ in range(writers * trials)]
    for j in jobs:
        j.join(timeout=60)
    lost, misplaced, problems = 0, 0, []
    for t in range(trials):
        store = trial_store(kind, base, t, endpoint)
        if not conditional:  # the arrays may disagree on the length: count coordinates only
            lost += missing_ids(store, t, writers)
            continue
        lost_t, misplaced_t = check_trial(store, t, writers)
        lost, misplaced = lost + lost_t, misplaced + misplaced_t
        problems += [str(p) for p in shardwise.verify(store).problems]
    return dict(
        writers=writers,
        trials=trials,
        rows_lost=lost,
        writers_not_contiguous=misplaced,
        redone=sum(r[2] for r in results if r[2] > 0),
        errors=[r[3] for r in results if r[3]][:3],
        verify_problems=problems[:3],
    )


def check_trial(store: Any, trial: int, writers: int) -> tuple[int, int]:
    """(rows lost, writers whose rows are not one contiguous run), after checking that every
    stored row is whole and consistent, and that the consolidated metadata says the same."""
    want = [ids(trial, w) for w in range(-1, writers)]
    with xr.open_zarr(store, consolidated=False) as plain:
        ds = plain.load()
    with xr.open_zarr(store) as consolidated:
        assert consolidated.sizes == ds.sizes
    t = ds["t"].values
    np.testing.assert_array_equal(ds["v"].values, t[:, None] * 4 + np.arange(WIDTH))
    np.testing.assert_array_equal(ds["w"].values, t + 0.5)
    assert len(set(t.tolist())) == len(t), "a row stored twice"
    lost = sum(len(w) for w in want) - len(t)
    np.testing.assert_array_equal(t[:START], want[0])
    where = {int(v): i for i, v in enumerate(t)}
    misplaced = 0
    for w in want[1:]:
        at = [where.get(int(v), -1) for v in w]
        if -1 in at or at != list(range(at[0], at[0] + len(w))):
            misplaced += 1
    return lost, misplaced


def missing_ids(store: Any, trial: int, writers: int) -> int:
    """The appended coordinate values the stored ``t`` lacks."""
    stored = set(shardwise.read_array(store, path="t").tolist())
    return sum(int(v) not in stored for w in range(writers) for v in ids(trial, w))


def assert_all_landed(res: dict[str, Any]) -> None:
    assert res["errors"] == [] and res["verify_problems"] == [], res
    assert res["rows_lost"] == 0 and res["writers_not_contiguous"] == 0, res
    # the aligned (even) trials: all read one length, so all but one redo their reservation
    aligned = (res["trials"] + 1) // 2
    assert res["redone"] >= (res["writers"] - 1) * aligned, res


# 4 and 8 writers take 15-30 s on a loaded 2-core machine: the slow lane (CI runs it); the S3
# cases are slow by name (conftest.py)
@pytest.mark.parametrize(
    "writers", [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)]
)
def test_concurrent_appends_on_local_files_all_land(tmp_path: Path, writers: int) -> None:
    res = run_appends("local", str(tmp_path), writers, TRIALS)
    record_figures(f"appends-local-{writers}", res)
    assert_all_landed(res)


@pytest.mark.parametrize("writers", [2, 4, 8])
def test_concurrent_appends_on_s3_all_land(s3: MotoS3, writers: int) -> None:
    res = run_appends("s3", f"appends-{unique()}", writers, S3_TRIALS, s3.endpoint)
    record_figures(f"appends-s3-{writers}", res)
    assert_all_landed(res)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_concurrent_appends_without_conditional_commits_lose_rows(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """The control: the same aligned race with conditional commits off (every writer finds the
    same length and keeps it) loses rows in every aligned trial, and nothing conflicts."""
    if kind == "s3":
        s3: MotoS3 = request.getfixturevalue("s3")
        res = run_appends(kind, f"appends-{unique()}", 2, 4, s3.endpoint, conditional=False)
    else:
        res = run_appends(kind, str(tmp_path), 2, 4, conditional=False)
    record_figures(f"appends-unchecked-{kind}", res)
    assert res["errors"] == [] and res["redone"] == 0, res
    assert res["rows_lost"] >= 2 * 3, res  # each aligned trial loses at least the 3 rows of one


# -- an append whose xarray pass runs between another's reservations ------------------------------


def between_worker(
    role: str, kind: str, base: str, endpoint: str, mid: Any, passed: Any, out: Any
) -> None:
    """Writer "a" appends and stops after its lead array's commit, before the next array's,
    until writer "b" (started then) has run xarray's pass and reached its own first commit; it
    reports the stored lengths it left b to read. Both report their reserved rows or error."""
    import dask

    import shardwise.storage.conditional as cond

    dask.config.set(scheduler="synchronous")
    store = trial_store(kind, base, 0, endpoint)
    seen: list[str] = []
    lengths: dict[str, int] = {}

    def hook(name: str, attempt: int) -> None:
        seen.append(name)
        if role == "a" and len(seen) == 2:  # the lead (v) grew; w has not yet
            lengths.update({k: len(shardwise.read_array(store, path=k)) for k in "vw"})
            mid.set()
            assert passed.wait(300), "b never reached its commit"
        if role == "b" and len(seen) == 1:  # xarray's pass is behind b: it read the lengths
            passed.set()

    cond.before_commit = hook
    if role == "b":
        assert mid.wait(300)
    writer = 0 if role == "a" else 1
    try:
        rep = shardwise.to_zarr(two(ids(0, writer)), store, append_dim="t")
        out.put((role, " ".join(rep.notes), lengths))
    except Exception as e:  # reported, and fails the test
        out.put((role, f"error: {type(e).__name__}: {e}", lengths))


def two(t: np.ndarray) -> xr.Dataset:
    """Two variables along t without a coordinate t: xarray then checks every array's length
    along t against the others (its get_dimensions)."""
    return rows(t).drop_vars("t")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_an_append_whose_pass_runs_between_anothers_reservations_lands(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Writer b runs xarray's pass while writer a has grown its lead array (v) but not yet the
    other (w): the arrays disagree on the length, which xarray refuses ("found conflicting
    lengths for dimension t"). Held there by events, not by timing, so the interleaving is the
    one under test every run (a's report of the lengths b read shows it); both land."""
    base, endpoint = str(tmp_path), ""
    if kind == "s3":
        base, endpoint = f"between-{unique()}", request.getfixturevalue("s3").endpoint
    root = trial_store(kind, base, 0, endpoint)
    shardwise.to_zarr(two(ids(0, -1)), root, encoding={k: ENC[k] for k in "vw"})
    ctx = forkserver()
    mid, passed, out = ctx.Event(), ctx.Event(), ctx.Queue()
    args = (kind, base, endpoint, mid, passed, out)
    jobs = [ctx.Process(target=between_worker, args=(r, *args)) for r in ("a", "b")]
    for j in jobs:
        j.start()
    got = {role: (note, lengths) for role, note, lengths in (out.get(timeout=600) for _ in "ab")}
    for j in jobs:
        j.join(timeout=60)
    # what b's pass found: the lead grown by a's 3 rows, the other not
    assert got["a"][1] == {"v": START + 3, "w": START}, got
    assert f"rows {START}:{START + 3} reserved" in got["a"][0], got
    assert f"rows {START + 3}:{START + 7} reserved" in got["b"][0], got
    for consolidated in (None, False):
        with xr.open_zarr(root, consolidated=consolidated) as ds:
            xr.testing.assert_identical(
                ds.load(), two(np.concatenate([ids(0, w) for w in (-1, 0, 1)]))
            )
    assert shardwise.verify(root).ok


# -- one process: reservations given back, or kept after a later one ------------------------------

ENC = {
    "v": {"chunks": (CHUNK, WIDTH), "shards": (SHARD, WIDTH)},
    "w": {"chunks": (CHUNK,), "shards": (SHARD,)},
    "t": {"chunks": (CHUNK,), "shards": (SHARD,)},
}


def test_a_refused_append_leaves_the_store_byte_identical(tmp_path: Path) -> None:
    """Refused after its reservation (another writer holds an array's exclusive lease): the
    reservation is given back, byte for byte."""
    root = tmp_path / "a.zarr"
    shardwise.to_zarr(rows(ids(0, -1)), root, encoding=ENC)
    before = files(root, journal=True)
    with Lease.acquire(ShardStore(LocalStore(root), "w"), purpose="a replacing job"):
        with pytest.raises(LeaseHeldError, match="a replacing job"):
            shardwise.to_zarr(rows(ids(0, 0)), root, append_dim="t")
        assert {k: v for k, v in files(root, journal=True).items() if "lease" not in k} == before
    assert files(root, journal=True) == before


def test_a_failed_append_keeps_the_rows_of_a_later_one(tmp_path: Path) -> None:
    """Append A reserves rows and fails after append B reserved the next ones and finished: B's
    rows stay where B wrote them, A's rows read as the fill value (the array never shrinks
    under B), and verify reports A's unfinished write."""
    import dask
    import dask.array as da

    root = tmp_path / "a.zarr"
    shardwise.to_zarr(rows(ids(0, -1)), root, encoding=ENC)
    go, writing, failed = threading.Event(), threading.Event(), []

    def held(block: np.ndarray) -> np.ndarray:
        if block.size == 0:  # dask's probe of the output type, while building the graph
            return block
        writing.set()  # A's rows are reserved in every array: its data tasks run
        assert go.wait(300)
        raise RuntimeError("source lost")

    a = rows(ids(0, 0))
    a["w"] = a["w"].copy(
        data=da.from_array(a["w"].values, chunks=-1).map_blocks(held, dtype="float64")
    )

    def append_a() -> None:
        with pytest.raises(RuntimeError, match="source lost"):
            shardwise.to_zarr(a, root, append_dim="t")
        failed.append(True)

    with dask.config.set(scheduler="threads", num_workers=4):
        thread = threading.Thread(target=append_a)
        thread.start()
        # (not a poll of xr.open_zarr: between A's reservations of its arrays xarray refuses
        # the lengths it reads)
        assert writing.wait(120), "A never reached its data"
        assert xr.open_zarr(root, consolidated=False).sizes["t"] == START + 3
        rep = shardwise.to_zarr(rows(ids(0, 1)), root, append_dim="t")
        go.set()
        thread.join(60)
    assert failed == [True]
    assert f"rows {START + 3}:{START + 7} reserved" in " ".join(rep.notes)
    ds = xr.open_zarr(root).load()
    assert ds.sizes["t"] == START + 3 + 4
    np.testing.assert_array_equal(ds["t"].values[START + 3 :], ids(0, 1))
    np.testing.assert_array_equal(ds["v"].values[START + 3 :, 0], ids(0, 1) * 4)
    assert np.isnan(ds["w"].values[START : START + 3]).all()  # A's rows: never written
    assert not shardwise.verify(root).ok


# -- overlapping region writes: per shard, the last commit wins -----------------------------------

REGION_ROWS, REGION_SHARD, REGION_CHUNK = 64, 8, 2
# writer i writes rows OVERLAPS[i] (every edge inside a shard, every row written twice or more)
OVERLAPS = [(0, 37), (3, 50), (21, 64), (30, 61)]


def region_worker(idx: int, base: str, trials: int, barrier: Any, out: Any) -> None:
    import dask

    dask.config.set(scheduler="synchronous")
    lo, hi = OVERLAPS[idx]
    for t in range(trials):
        ds = xr.Dataset({"v": (("t", "x"), np.full((hi - lo, WIDTH), idx + 1, "int32"))})
        barrier.wait(timeout=300)
        try:
            shardwise.to_zarr(ds, str(Path(base) / f"r{t}.zarr"), region={"t": slice(lo, hi)})
            out.put((t, idx, ""))
        except Exception as e:
            out.put((t, idx, f"{type(e).__name__}: {e}"))


def test_overlapping_region_writes_resolve_shard_by_shard(tmp_path: Path) -> None:
    """Four processes write overlapping regions (edges inside shards) at once, 20 times. Every
    shard then holds exactly what the writes touching it give when applied one after another in
    some order (its commit order): a row never mixes writers, nothing is lost outside the
    overlaps, and no inner chunk is torn."""
    trials, writers = TRIALS, len(OVERLAPS)
    init = xr.Dataset({"v": (("t", "x"), np.zeros((REGION_ROWS, WIDTH), "int32"))})
    enc = {"v": {"chunks": (REGION_CHUNK, WIDTH), "shards": (REGION_SHARD, WIDTH)}}
    for t in range(trials):
        shardwise.to_zarr(init, tmp_path / f"r{t}.zarr", encoding=enc)
    ctx = forkserver()
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    jobs = [
        ctx.Process(target=region_worker, args=(i, str(tmp_path), trials, barrier, out))
        for i in range(writers)
    ]
    for j in jobs:
        j.start()
    errors = [e for _, _, e in (out.get(timeout=600) for _ in range(writers * trials)) if e]
    for j in jobs:
        j.join(timeout=60)
    assert errors == []
    for t in range(trials):
        got = shardwise.read_array(tmp_path / f"r{t}.zarr", path="v")
        assert (got == got[:, :1]).all(), "a row mixes writers"
        for s in range(0, REGION_ROWS, REGION_SHARD):
            order = shard_order(got[s : s + REGION_SHARD, 0], s)
            assert order is not None, f"trial {t}: shard at row {s} is no commit order"


def shard_order(column: np.ndarray, start: int) -> tuple[int, ...] | None:
    """An order of the writers touching the shard at ``start`` that, applied one after another
    over zeros, gives ``column`` (None: no order does)."""
    rows_ = np.arange(start, start + len(column))
    touching = [i for i, (lo, hi) in enumerate(OVERLAPS) if lo < rows_[-1] + 1 and hi > start]
    for order in itertools.permutations(touching):
        want = np.zeros(len(column), "int32")
        for i in order:
            lo, hi = OVERLAPS[i]
            want[(rows_ >= lo) & (rows_ < hi)] = i + 1
        if (want == column).all():
            return order
    return None


def test_a_whole_shard_write_never_lands_inside_another_writers_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer A merges rows 0:3 into a shard; writer B covers the whole shard. B is started
    exactly while A holds the shard's lock between its generation check and its rename (the
    window the process race above hits by chance). B must wait for that lock and commit after
    A; a plain put of B's shard would land in the window and A's rename, made from the zeros it
    read, would then drop B's rows 3:8."""
    import dask

    from shardwise.storage import conditional as cond

    root = str(tmp_path / "a.zarr")
    shardwise.write_array(np.zeros(8, "int32"), root, chunks=(2,), shards=(8,))
    stat, lock = cond._stat_generation, cond.file_lock
    a_thread: list[threading.Thread] = []
    b_waits_or_done = threading.Event()
    b_thread = threading.Thread(target=lambda: write_b(root, b_waits_or_done))

    def hook(name: str, attempt: int) -> None:  # in A's thread, just before its commit
        if not a_thread:
            a_thread.append(threading.current_thread())

    def checked(path: Path) -> Any:
        here = threading.current_thread()
        if a_thread and here is a_thread[0] and b_thread.ident is None:
            seen = stat(path)  # A holds the lock: its check is this very call
            b_thread.start()
            b_waits_or_done.wait()
            return seen
        return stat(path)

    def locking(path: Path) -> Any:
        if threading.current_thread() is b_thread:
            b_waits_or_done.set()  # B is at the lock A holds
        return lock(path)

    monkeypatch.setattr(cond, "before_commit", hook)
    monkeypatch.setattr(cond, "_stat_generation", checked)
    monkeypatch.setattr(cond, "file_lock", locking)
    with dask.config.set(scheduler="synchronous"):
        shardwise.write_array(np.ones(3, "int32"), root, region=(slice(0, 3),), mode="r+")
    b_thread.join()  # B waited for A's lock, or (old code) finished inside A's window
    assert b_thread.ident is not None
    # B committed after A: its whole shard, nothing of A's stale merge
    np.testing.assert_array_equal(shardwise.read_array(root), np.full(8, 2, "int32"))
    assert shardwise.verify(root).ok


def write_b(root: str, done: threading.Event) -> None:
    try:
        shardwise.write_array(np.full(8, 2, "int32"), root, region=(slice(0, 8),), mode="r+")
    finally:
        done.set()
