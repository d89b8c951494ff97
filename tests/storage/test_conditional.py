"""Writes that split shards, from independent writers at once: conditional shard replace.

* the store edge: a commit lands only on the generation read (local files, memory, S3 through
  obstore and through s3fs on moto's server, which enforces If-Match / If-None-Match);
* a forced race (events, no timing): the writer whose read is overtaken by another writer's
  commit merges again and both updates survive; the same race without the check loses one;
* a shard that keeps changing: a clear error after the bounded retries;
* six processes writing 85-row slabs into 64-row shards, several trials, local files and S3: the
  two writers of each shared shard meet at a barrier between read and commit, so every trial
  races (one conflict per shared shard); the same races without the check lose rows;
* leases, write markers, resume and verify with writers side by side.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
from zarr.abc.store import Store
from zarr.storage import FsspecStore, LocalStore, MemoryStore

import shardwise
import shardwise.storage.conditional as cond
from faultkit import (
    BUCKET,
    CREDS,
    SLAB_ROWS,
    SLAB_SHARD,
    SLAB_WIDTH,
    FaultProxy,
    MotoS3,
    NoSpaceStore,
    atomic_conditional_writes,
    files,
    forkserver,
    moto_s3,
    race_region,
    record_figures,
    slab_array,
    slab_store,
    unique,
)
from shardwise import LeaseHeldError, PlanError, ShardConflictError
from shardwise.cli import main
from shardwise.durability.lease import Lease, shared_leases
from shardwise.storage.conditional import CONFLICT, versions
from shardwise.storage.store import ShardStore

KINDS = ["local", "memory", "obstore", "s3fs"]
KW = dict(chunks=(16, 6), shards=(64, 6), fill_value=0)


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


def s3fs_store(s3: MotoS3, prefix: str) -> FsspecStore:
    opts = {
        "endpoint_url": s3.endpoint,
        "key": CREDS["key"],
        "secret": CREDS["secret"],
        "client_kwargs": {"region_name": CREDS["region"]},
    }
    return FsspecStore.from_url(f"s3://{BUCKET}/{prefix}", storage_options=opts)


@pytest.fixture
def make_store(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[str], Store]:
    def make(kind: str) -> Store:
        if kind == "local":
            return LocalStore(tmp_path / f"{unique()}.zarr")
        if kind == "memory":
            return MemoryStore()
        s3: MotoS3 = request.getfixturevalue("s3")
        return s3.obstore(f"c-{unique()}") if kind == "obstore" else s3fs_store(s3, f"c-{unique()}")

    return make


# -- the store edge -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_commit_lands_only_on_the_generation_it_read(
    make_store: Callable[[str], Store], kind: str
) -> None:
    v = versions(ShardStore(make_store(kind), "arr"))
    assert v is not None
    assert v.get("c/0") == (None, None) and v.head("c/0") is None
    g1 = v.commit("c/0", [b"one"], None)  # a new object: If-None-Match: *
    assert g1 is not CONFLICT and g1 is not None
    assert v.commit("c/0", [b"other"], None) is CONFLICT  # it exists now
    data, g = v.get("c/0")
    assert data == b"one" and g == g1 and v.head("c/0") == g1
    g2 = v.commit("c/0", [b"t", b"wo"], g1)  # If-Match on what was read
    assert g2 is not CONFLICT and g2 != g1
    assert v.commit("c/0", [b"three"], g1) is CONFLICT  # stale: refused, nothing stored
    assert v.get("c/0") == (b"two", g2)
    if v.can_delete:
        assert v.commit("c/0", None, g1) is CONFLICT
        assert v.commit("c/0", None, g2) is None
        assert v.get("c/0") == (None, None)


def test_moto_enforces_if_match_and_if_none_match(s3: MotoS3) -> None:
    """The S3 tests below prove something only because this server refuses stale commits."""
    import obstore
    from botocore.exceptions import ClientError
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    key = f"m-{unique()}/k"
    first = s3.client.put_object(Bucket=BUCKET, Key=key, Body=b"one")["ETag"]
    s3.client.put_object(Bucket=BUCKET, Key=key, Body=b"two", IfMatch=first)
    for cond_kw in ({"IfMatch": first}, {"IfNoneMatch": "*"}):
        with pytest.raises(ClientError, match="PreconditionFailed"):
            s3.client.put_object(Bucket=BUCKET, Key=key, Body=b"three", **cond_kw)
    inner = s3.obstore("").store
    with pytest.raises(PreconditionError):
        obstore.put(inner, key, b"three", mode={"e_tag": first})
    with pytest.raises(AlreadyExistsError):
        obstore.put(inner, key, b"three", mode="create")
    assert s3.client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"two"


def test_moto_hashes_an_etag_before_a_read_can_move_its_buffer() -> None:
    """A read of an object's value (another request's GET) in the middle of the hashing of its
    ETag (its PUT's answer) leaves the right ETag: moto hashes on first use, sharing the buffer's
    position with value reads; faultkit.atomic_conditional_writes hashes as the object is made.
    The read is forced into the hashing here, in one thread."""
    from moto.s3.models import FakeKey

    atomic_conditional_writes()
    data = b"shard bytes " * 1000
    key = FakeKey("k", data, account_id="123456789012", region_name="us-east-1")
    buf = key._value_buffer

    class ReadMeanwhile:
        def __getattr__(self, name: str) -> Any:
            return getattr(buf, name)

        def read(self, *args: Any) -> bytes:
            key._value_buffer = buf
            assert key.value == data  # the other request's read: leaves the position at the end
            return bytes(buf.read(*args))

    key._value_buffer = ReadMeanwhile()
    assert key.etag == f'"{hashlib.md5(data).hexdigest()}"'


@pytest.mark.parametrize("racers", [8])
def test_moto_refuses_all_but_one_of_racing_conditional_puts(s3: MotoS3, racers: int) -> None:
    """Racing conditional puts of one key, each on what it read (the same ETag, or nothing):
    exactly one lands per round, as on S3. The racers start together (a barrier), after all
    of them read, so every round is a race. (moto checks a condition and stores in two steps;
    faultkit.atomic_conditional_writes makes the two one, as on S3.)"""
    from concurrent.futures import ThreadPoolExecutor

    import boto3
    from botocore.exceptions import ClientError

    clients = [
        boto3.client(
            "s3",
            endpoint_url=s3.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        for _ in range(racers)
    ]
    key = f"race-{unique()}/k"
    barrier = threading.Barrier(racers)

    def put(i: int, cond: dict[str, str], body: bytes) -> bool:
        barrier.wait()
        try:
            clients[i].put_object(Bucket=BUCKET, Key=key, Body=body, **cond)
            return True
        except ClientError as e:
            assert "PreconditionFailed" in str(e) or "ConditionalRequestConflict" in str(e)
            return False

    with ThreadPoolExecutor(racers) as pool:
        for round_ in range(20):
            etag = None if round_ == 0 else s3.client.head_object(Bucket=BUCKET, Key=key)["ETag"]
            cond = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
            # bodies differ from every earlier one (a put of the stored bytes keeps the ETag);
            # large, so the server spends a while between its check and its store (hashing)
            bodies = [b"%d-%d" % (round_, i) + bytes(4 << 20) for i in range(racers)]
            landed = list(pool.map(put, range(racers), [cond] * racers, bodies))
            assert sum(landed) == 1, (round_, landed)
            winner = bodies[landed.index(True)]
            assert s3.client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == winner


def test_conditional_commits_through_s3_faults(s3: MotoS3) -> None:
    """A lost answer to a conditional put: the retry is refused (412, the put had landed), the
    writer reads its own commit back and merges again onto it, which changes nothing."""
    import datetime

    port = int(s3.endpoint.rsplit(":", 1)[1])
    proxy = FaultProxy(("127.0.0.1", port), p=0.2, p_ack=0.5, seed=5).start()
    try:
        prefix = unique()
        shardwise.write_array(np.full((192, 6), 9, "int32"), s3.obstore(prefix), **KW)
        ms = datetime.timedelta(milliseconds=1)
        flaky = s3.obstore(
            prefix,
            endpoint=proxy.endpoint,
            max_retries=25,
            backoff={"init_backoff": 5 * ms, "max_backoff": 200 * ms, "base": 2},
            retry_timeout=datetime.timedelta(seconds=120),
        )
        conflicts = 0
        for i in range(4):  # slabs of 40 rows: every one shares shards with the one before
            rows = slice(40 * i, 40 * (i + 1))
            conflicts += _write_rows(flaky, rows, i + 1).conflicts_retried
    finally:
        proxy.stop()
    got = shardwise.open_array(s3.obstore(prefix)).compute()
    for i in range(4):
        assert (got[40 * i : 40 * (i + 1)] == i + 1).all()
    assert (got[160:] == 9).all()
    assert shardwise.verify(s3.obstore(prefix)).ok
    assert proxy.counts["lost_ack"] > 0
    record_figures("conditional-s3-faults", {**dict(proxy.counts), "conflicts_retried": conflicts})


# -- a forced race --------------------------------------------------------------------------------


def _write_rows(store: Store, rows: slice, value: int) -> Any:
    data = np.full((rows.stop - rows.start, 6), value, "int32")
    return shardwise.write_array(data, store, region=(rows, slice(None)), mode="r+")


def _race(
    store: Store, monkeypatch: pytest.MonkeyPatch, write: Callable[..., Any] = _write_rows
) -> dict[str, Any]:
    """Writer A reads shard 1 and then waits until writer B (rows of the same shard) has read,
    merged and committed it; then A commits. Forced with events on the commit hook."""
    a_read, b_done = threading.Event(), threading.Event()
    out: dict[str, Any] = {}

    def hook(name: str, attempt: int) -> None:
        if threading.current_thread().name == "A" and attempt == 0:
            a_read.set()
            assert b_done.wait(120)

    def write_a() -> None:
        try:
            out["A"] = write(store, slice(64, 100), 1)
        except BaseException as e:
            out["A"] = e

    monkeypatch.setattr(cond, "before_commit", hook)
    with dask.config.set(scheduler="synchronous"):
        a = threading.Thread(target=write_a, name="A")
        a.start()
        assert a_read.wait(120)
        out["B"] = write(store, slice(100, 128), 2)
        b_done.set()
        a.join(120)
    if isinstance(out["A"], BaseException):
        raise out["A"]
    out["got"] = shardwise.open_array(store, path=getattr(write, "path", None)).compute()
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_the_writer_that_loses_the_race_merges_again(
    make_store: Callable[[str], Store], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(kind)
    shardwise.write_array(np.full((128, 6), 9, "int32"), store, **KW)
    out = _race(store, monkeypatch)
    got = out["got"]
    assert (got[:64] == 9).all() and (got[64:100] == 1).all() and (got[100:] == 2).all()
    assert out["A"].conflicts_retried == 1 and out["B"].conflicts_retried == 0
    assert "1 shard merge redone" in str(out["A"])
    assert shardwise.verify(store).ok  # the record of shard 1 is the last commit's


@pytest.mark.parametrize("kind", ["local", "memory", "obstore"])
def test_without_the_check_the_same_race_loses_an_update(
    make_store: Callable[[str], Store], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race above is real: committing unconditionally, A overwrites B's rows."""
    store = make_store(kind)
    shardwise.write_array(np.full((128, 6), 9, "int32"), store, **KW)
    monkeypatch.setattr(cond, "ENABLED", False)
    got = _race(store, monkeypatch)["got"]
    assert (got[64:100] == 1).all()
    assert (got[100:] == 9).all()  # B's update is lost


def test_to_zarr_region_writers_race_and_both_updates_survive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import xarray as xr

    def write(store: Store, rows: slice, value: int) -> Any:
        part = xr.Dataset({"v": (("t", "x"), np.full((rows.stop - rows.start, 6), value, "int32"))})
        return shardwise.to_zarr(part, store, region={"t": rows})

    write.path = "v"  # type: ignore[attr-defined]
    store = LocalStore(tmp_path / "a.zarr")
    ds = xr.Dataset({"v": (("t", "x"), np.full((128, 6), 9, "int32"))})
    shardwise.to_zarr(ds, store, encoding={"v": {"chunks": (16, 6), "shards": (64, 6)}})
    out = _race(store, monkeypatch, write)
    got = out["got"]
    assert (got[:64] == 9).all() and (got[64:100] == 1).all() and (got[100:] == 2).all()
    assert out["A"].conflicts_retried == 1
    assert shardwise.verify(store, path="v").ok


def test_a_new_shard_created_by_two_writers_at_once(
    make_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both writers find shard 1 absent; the second create fails (If-None-Match) and merges."""
    store = make_store("obstore")
    shardwise.write_array(np.zeros((128, 6), "int32"), store, **KW)
    assert [k for k in ShardStore(store).list("c")] == []
    out = _race(store, monkeypatch)
    assert (out["got"][64:100] == 1).all() and (out["got"][100:] == 2).all()
    assert out["A"].conflicts_retried == 1


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_a_shard_that_keeps_changing_gives_a_clear_error(
    make_store: Callable[[str], Store], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(kind)
    shardwise.write_array(np.full((128, 6), 9, "int32"), store, **KW)
    sstore = ShardStore(store)
    before = sstore.get("c/1/0")
    assert before is not None

    def other_writer_commits(name: str, attempt: int) -> None:
        sstore.put(name, before)  # a new generation of the same shard every time

    monkeypatch.setattr(cond, "before_commit", other_writer_commits)
    monkeypatch.setattr(cond, "TRIES", 3)
    monkeypatch.setattr(cond, "BACKOFF", 0.0)
    with pytest.raises(ShardConflictError) as err:
        shardwise.write_array(
            np.full((36, 6), 1, "int32"), store, region=(slice(64, 100), slice(None)), mode="r+"
        )
    assert err.value.key == "c/1/0" and err.value.tries == 3
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)  # travels from workers
    assert "'c/1/0'" in str(err.value) and "3 times" in str(err.value)
    assert sstore.get("c/1/0") == before  # never half-written, never overwritten


# -- many independent processes -------------------------------------------------------------------

WRITERS, TRIALS = 6, 6
# the shard rows two neighbouring slabs share (slab i starts inside shard row (i * 85) // 64)
SHARED = sorted({(i * SLAB_ROWS) // SLAB_SHARD for i in range(1, WRITERS)})


def run_slab_race(
    kind: str, base: str, endpoint: str = "", conditional: bool = True
) -> dict[str, Any]:
    """WRITERS processes each write an 85-row slab into 64-row shards, TRIALS times. The two
    writers of every shared shard meet at a barrier between their read and their commit, so
    every trial races on every shared shard: with the check, exactly one commit per shared shard
    finds it changed and merges again; without it, one writer's rows of that shard are lost."""
    n = WRITERS * SLAB_ROWS
    for t in range(TRIALS):  # even trials start without shards, odd ones replace stored shards
        init = np.full((n, SLAB_WIDTH), -1 if t % 2 else 0, "int32")
        kw = dict(chunks=(16, SLAB_WIDTH), shards=(SLAB_SHARD, SLAB_WIDTH), fill_value=0)
        if kind == "xarray":
            import xarray as xr

            ds = xr.Dataset({"v": (("t", "x"), init)})
            enc = {"v": {k: kw[k] for k in ("chunks", "shards")} | {"_FillValue": 0}}
            shardwise.to_zarr(ds, slab_store(kind, base, t), encoding=enc)
        else:
            shardwise.write_array(init, slab_store(kind, base, t, endpoint), **kw)
    ctx = forkserver()
    barrier, out = ctx.Barrier(WRITERS), ctx.Queue()
    meet = {row: ctx.Barrier(2) for row in SHARED}
    jobs = [
        ctx.Process(
            target=race_region,
            args=(i, kind, base, TRIALS, WRITERS, barrier, out, endpoint, conditional, meet),
        )
        for i in range(WRITERS)
    ]
    started = time.perf_counter()
    for j in jobs:
        j.start()
    results = [out.get(timeout=300) for _ in range(WRITERS * TRIALS)]
    for j in jobs:
        j.join(timeout=60)
    seconds = time.perf_counter() - started
    errors = [r[3] for r in results if r[3]]
    lost, lost_in, problems = 0, set(), []
    path = "v" if kind == "xarray" else None
    for t in range(TRIALS):
        store = slab_store(kind, base, t, endpoint)
        got = shardwise.open_array(store, path=path).compute()
        wrong = (got != slab_array(t, WRITERS)).any(axis=1)
        lost += int(wrong.sum())
        lost_in |= {(t, int(r) // SLAB_SHARD) for r in np.flatnonzero(wrong)}
        problems += shardwise.verify(store, path=path).problems
    return dict(
        processes=WRITERS,
        trials=TRIALS,
        rows_per_trial=n,
        rows_lost=lost,
        shards_that_lost_rows=sorted(lost_in),
        conflicts_retried=sum(r[2] for r in results if r[2] > 0),
        shared_shards_per_trial=len(SHARED),
        errors=errors[:3],
        verify_problems=[str(p) for p in problems[:3]],
        seconds=round(seconds, 1),
    )


def assert_raced_and_lost_nothing(res: dict[str, Any]) -> None:
    assert res["errors"] == [] and res["verify_problems"] == []
    assert res["rows_lost"] == 0
    # the writers contended: each shared shard, each trial, one commit lost to the other's
    assert res["conflicts_retried"] == len(SHARED) * TRIALS


def test_six_processes_write_shard_splitting_slabs_on_local_files(tmp_path: Path) -> None:
    res = run_slab_race("local", str(tmp_path))
    record_figures("conditional-slabs-local", res)
    assert_raced_and_lost_nothing(res)


def test_six_processes_write_shard_splitting_slabs_with_to_zarr(tmp_path: Path) -> None:
    res = run_slab_race("xarray", str(tmp_path))
    record_figures("conditional-slabs-to-zarr", res)
    assert_raced_and_lost_nothing(res)


def test_six_processes_write_shard_splitting_slabs_on_s3(s3: MotoS3) -> None:
    res = run_slab_race("s3", f"slabs-{unique()}", s3.endpoint)
    record_figures("conditional-slabs-s3", res)
    assert_raced_and_lost_nothing(res)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_six_processes_write_shard_splitting_slabs_without_the_check_lose_rows(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """The control: the same forced races with conditional commits off lose the rows of one
    writer in every shared shard of every trial (and nothing conflicts: nothing is checked)."""
    if kind == "s3":
        s3: MotoS3 = request.getfixturevalue("s3")
        res = run_slab_race(kind, f"slabs-{unique()}", s3.endpoint, conditional=False)
    else:
        res = run_slab_race(kind, str(tmp_path), conditional=False)
    record_figures(f"conditional-slabs-unchecked-{kind}", res)
    assert res["errors"] == [] and res["conflicts_retried"] == 0
    assert res["shards_that_lost_rows"] == [(t, row) for t in range(TRIALS) for row in SHARED]


# -- leases, markers, resume, verify --------------------------------------------------------------


def test_region_writers_share_the_array_and_keep_out_a_replacing_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "a.zarr"
    shardwise.write_array(np.full((128, 6), 9, "int32"), root, **KW)
    st = ShardStore(LocalStore(root))
    with Lease.acquire_shared(st, purpose="the region job"):
        shardwise.write_array(  # a second region writer runs beside it
            np.full((10, 6), 1, "int32"), root, region=(slice(60, 70), slice(None)), mode="r+"
        )
        before = files(root, journal=True)
        with pytest.raises(LeaseHeldError, match="the region job"):
            shardwise.write_array(np.zeros((128, 6), "int32"), root, mode="w", **KW)
        assert files(root, journal=True) == before
    assert shared_leases(st) == {}
    with (
        Lease.acquire(st, purpose="the replacing job"),
        pytest.raises(LeaseHeldError, match="the replacing job"),
    ):
        shardwise.write_array(
            np.ones((10, 6), "int32"), root, region=(slice(0, 10), slice(None)), mode="r+"
        )
    # a region writer that died keeps its shared lease until it is broken on purpose
    Lease.acquire_shared(st, purpose="a dead job")
    assert main(["lease", str(root)]) == 0
    assert "shared by 'a dead job'" in capsys.readouterr().out
    shardwise.write_array(np.zeros((128, 6), "int32"), root, mode="w", break_lease=True, **KW)
    assert shared_leases(st) == {}


def test_resume_and_verify_with_writers_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "a.zarr"
    shardwise.write_array(np.full((192, 6), 9, "int32"), root, **KW)
    a, b = np.full((85, 6), 1, "int32"), np.full((85, 6), 2, "int32")
    ra, rb = (slice(0, 85), slice(None)), (slice(85, 170), slice(None))

    def killed(name: str, attempt: int) -> None:
        if threading.current_thread().name == "A":
            raise RuntimeError("writer A killed before committing its shared shard")

    monkeypatch.setattr(cond, "before_commit", killed)
    failed: list[BaseException] = []

    def write_a() -> None:
        try:
            shardwise.write_array(a, root, region=ra, mode="r+")
        except RuntimeError as e:
            failed.append(e)

    with dask.config.set(scheduler="synchronous"):
        t = threading.Thread(target=write_a, name="A")
        t.start()
        t.join(120)
        assert failed
        shardwise.write_array(b, root, region=rb, mode="r+")  # B shares shard 1 with A
        rep = shardwise.verify(root)
        assert [p.kind for p in rep.problems] == ["incomplete"]
        assert "0:85" in rep.problems[0].message
        monkeypatch.setattr(cond, "before_commit", None)
        again = shardwise.write_array(a, root, region=ra, mode="r+", resume=True)
    # shard 0 (rows 0:64) is skipped if A stored it before dying (task order is dask's)
    assert again.shards_skipped + again.shards_written == 2
    assert shardwise.verify(root).ok
    got = shardwise.open_array(root).compute()
    assert (got[:85] == 1).all() and (got[85:170] == 2).all() and (got[170:] == 9).all()


def test_a_write_beside_others_cleans_only_its_own_temp_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "a.zarr"
    shardwise.write_array(np.full((128, 6), 9, "int32"), root, **KW)

    def killed(name: str, attempt: int) -> None:
        raise RuntimeError("killed before its commit")

    monkeypatch.setattr(cond, "before_commit", killed)
    with pytest.raises(RuntimeError, match="killed"):
        _write_rows(LocalStore(root), slice(64, 100), 1)
    monkeypatch.setattr(cond, "before_commit", None)
    markers = [json.loads(m.read_text()) for m in (root / ".shardwise" / "writes").iterdir()]
    (write_id,) = [m["id"] for m in markers if m["status"] == "open"]
    own = root / "c" / "1" / f"0.{write_id[:12]}{'0' * 20}.partial"  # its leftover
    theirs = root / "c" / "1" / f"0.{'f' * 32}.partial"  # a live temp file of another writer
    own.write_bytes(b"left over")
    theirs.write_bytes(b"being written")
    rep = shardwise.write_array(
        np.full((36, 6), 1, "int32"),
        root,
        region=(slice(64, 100), slice(None)),
        mode="r+",
        resume=True,
    )
    assert rep.shards_written == 1
    assert not own.exists() and theirs.read_bytes() == b"being written"


def test_stores_without_conditional_commits_keep_one_writer(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    shardwise.write_array(np.full((128, 6), 9, "int32"), root, **KW)
    wrapped = NoSpaceStore(LocalStore(root), budget=1 << 30)
    assert versions(ShardStore(wrapped)) is None
    with (
        Lease.acquire_shared(ShardStore(LocalStore(root)), purpose="a region job"),
        pytest.raises(LeaseHeldError, match="a region job"),
    ):
        shardwise.write_array(
            np.ones((10, 6), "int32"), wrapped, region=(slice(60, 70), slice(None)), mode="r+"
        )


def test_to_zarr_region_splitting_shards_by_default(tmp_path: Path) -> None:
    import xarray as xr

    path = tmp_path / "a.zarr"
    ds = xr.Dataset({"v": (("t", "x"), np.full((128, 6), 9, "int32"))})
    shardwise.to_zarr(ds, path, encoding={"v": {"chunks": (16, 6), "shards": (64, 6)}})
    part = xr.Dataset({"v": (("t", "x"), np.full((36, 6), 1, "int32"))})
    rep = shardwise.to_zarr(part, path, region={"t": slice(64, 100)})
    assert rep.keys == ["v/c/1/0"]
    got = xr.open_zarr(path).v.values
    assert (got[64:100] == 1).all() and (got[100:] == 9).all() and (got[:64] == 9).all()
    with pytest.raises(PlanError, match="nearest shard-aligned region"):
        shardwise.to_zarr(part, path, region={"t": slice(64, 100)}, safe_shards=True)
    wrapped = NoSpaceStore(LocalStore(path), budget=1 << 30)
    with pytest.raises(PlanError, match="nearest shard-aligned region"):
        shardwise.to_zarr(part, wrapped, region={"t": slice(64, 100)})


def _write_rows_from_dask(store: Store, rows: slice, value: int) -> Any:
    """As :func:`_write_rows`, from a dask array chunked off the shard grid (which a write into a
    new array would stage)."""
    data = da.full((rows.stop - rows.start, 6), value, dtype="int32", chunks=(7, 6))
    return shardwise.write_array(data, store, region=(rows, slice(None)), mode="r+")


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_region_writes_from_any_dask_chunks_commit_shared_shards_conditionally(
    make_store: Callable[[str], Store], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(kind)
    shardwise.write_array(np.full((128, 6), 9, "int32"), store, **KW)
    rows = (slice(64, 100), slice(None))
    source = da.full((36, 6), 1, dtype="int32", chunks=(7, 6))
    job = shardwise.plan_write(source, store, region=rows, mode="r+")
    assert job.strategy == "direct"  # the shards it splits are committed conditionally
    # forced staged: its merges are unconditional, so it keeps other writers out
    other = Lease.acquire_shared(ShardStore(store))
    try:
        with pytest.raises(LeaseHeldError):
            shardwise.write_array(source, store, region=rows, mode="r+", strategy="staged")
    finally:
        other.release()
    out = _race(store, monkeypatch, _write_rows_from_dask)
    got = out["got"]
    assert (got[:64] == 9).all() and (got[64:100] == 1).all() and (got[100:] == 2).all()
    assert out["A"].conflicts_retried == 1


def test_one_botocore_client_per_process_and_settings_a_forked_child_builds_its_own(
    s3: MotoS3,
) -> None:
    """Merges and multipart uploads ask for an S3 client each time: the same settings give the
    same client in one process (built once), other settings another, and a forked child, which
    must not share its parent's connections, its own; the stores' clients work."""
    import multiprocessing

    from shardwise.storage.s3 import botocore_client, s3_client

    settings = (s3.endpoint, CREDS["region"], CREDS["key"], CREDS["secret"], None)
    client = botocore_client(*settings)
    assert botocore_client(*settings) is client
    assert botocore_client(s3.endpoint + "/", *settings[1:]) is not client
    for prefix in ("clients-a", "clients-b"):  # another prefix: the same client, its own keys
        got = s3_client(s3.obstore(prefix))
        assert got is not None and got[1:] == (BUCKET, prefix)
        got[0]("put_object", Bucket=BUCKET, Key=f"{prefix}/x", Body=b"1")

    def child(out: Any) -> None:
        mine = botocore_client(*settings)
        mine.put_object(Bucket=BUCKET, Key="clients-a/y", Body=b"2")
        out.put(mine is not client and botocore_client(*settings) is mine)

    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=child, args=(out,))
    proc.start()
    built_own = out.get(timeout=120)
    proc.join(120)
    assert proc.exitcode == 0 and built_own
    assert s3.keys("clients-a") == {"x": b"1", "y": b"2"}
    assert s3.keys("clients-b") == {"x": b"1"}
