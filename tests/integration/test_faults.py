"""Fault injection, with figures: what breaks, how often, and that nothing is lost or wrong.

Fast (every run): corruption fuzz, a full disk (ENOSPC store wrapper and RLIMIT_FSIZE), 8 writer
jobs racing for one local lease. Slow (``-m slow``, run by CI too): worker deaths and a paused
worker on a dask cluster, SIGKILL of the whole writer then resume, S3 faults through a proxy in
front of moto, racing jobs on S3.

Every test records what it measured (``faultkit.record_figures``): JSON files under
``$SHARDWISE_FIGURES`` (default: the temp dir's ``shardwise-figures``), and a ``[figures]`` line.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec
from zarr.storage import LocalStore, MemoryStore

import shardwise
from faultkit import (
    KILL_KW,
    TEMP,
    FaultProxy,
    MotoS3,
    NoSpaceStore,
    StallStore,
    files,
    forkserver,
    kill_data,
    kill_writer,
    moto_s3,
    race_lease,
    race_write,
    record_figures,
    temp_files,
    torn_shards,
    unique,
    wait_until,
)
from shardwise.core.layout import normalize_region
from shardwise.durability.journal import Record
from shardwise.durability.lease import Lease, read_lease
from shardwise.durability.verify import check_shard, verify
from shardwise.engine.read import ShardReader, open_reader
from shardwise.errors import CorruptShardError
from shardwise.storage.nodes import open_info
from shardwise.storage.store import ShardStore

# -- corruption fuzz ------------------------------------------------------------------------------

FUZZ_PER_CHAIN = 1000
CHAINS: dict[str, dict[str, Any]] = {
    "bytes+crc32c": dict(compressors=[Crc32cCodec()]),
    "zstd+crc32c": dict(compressors=[ZstdCodec(level=3), Crc32cCodec()]),
    "gzip+crc32c": dict(compressors=[GzipCodec(level=1), Crc32cCodec()]),
    "transpose+bytes(big)+blosc+crc32c": dict(
        filters=[TransposeCodec(order=(1, 0))],
        serializer=BytesCodec(endian="big"),
        compressors=[BloscCodec(cname="lz4", clevel=5), Crc32cCodec()],
    ),
}


def corrupt(raw: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One random corruption of a shard's bytes (always a change)."""
    b = bytearray(raw)
    n = len(b)
    how = rng.choice(
        [
            "bitflip",
            "bitflips",
            "overwrite",
            "zero",
            "truncate",
            "append",
            "delete",
            "duplicate",
            "index",
        ]
    )
    if how in ("bitflip", "bitflips", "index"):
        for _ in range(1 if how != "bitflips" else rng.randint(2, 8)):
            i = rng.randrange(n - 40, n) if how == "index" else rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
    elif how in ("overwrite", "zero"):
        i = rng.randrange(n)
        k = rng.randint(1, 32)
        fill = bytes(rng.randrange(256) for _ in range(k)) if how == "overwrite" else bytes(k)
        b[i : i + k] = fill[: len(b[i : i + k])]
    elif how == "truncate":
        del b[rng.randrange(n) :]
    elif how == "append":
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif how == "delete":
        i = rng.randrange(n)
        del b[i : i + rng.randint(1, 16)]
    else:
        i = rng.randrange(n)
        b[i:i] = b[i : i + rng.randint(1, 16)]
    return how, bytes(b)


def reads_the_same(raw: bytes, bad: bytes, index_nbytes: int) -> bool:
    """Whether a read of the whole shard ``bad`` finds the bytes it would read in ``raw``: the
    index (the last ``index_nbytes``) and every chunk it points to (index entries: little-endian
    offset and length pairs, all ones for a chunk not stored, then a 4-byte checksum)."""
    if len(bad) < index_nbytes or bad[-index_nbytes:] != raw[-index_nbytes:]:
        return False
    entries = np.frombuffer(raw[-index_nbytes:-4], "<u8").reshape(-1, 2)
    stored = [(int(o), int(o + k)) for o, k in entries if o != np.iinfo("u8").max]
    return all(bad[a:b] == raw[a:b] for a, b in stored)


@pytest.mark.parametrize("chain", list(CHAINS))
def test_corruption_fuzz_never_reads_wrong_data(chain: str) -> None:
    rng = random.Random(f"fuzz-{chain}")
    store = MemoryStore()
    x = np.random.default_rng(1).normal(size=(48, 48)).astype("float32")
    x[x > 1.5] = 0  # some fill, some structure
    shardwise.write_array(x, store, chunks=(8, 8), shards=(16, 24), fill_value=0, **CHAINS[chain])
    info = open_info(store)
    sstore = ShardStore(store)
    lay = info.layout
    shards = [s for s in lay.shards() if sstore.size(lay.shard_key(s))]
    originals = {s: sstore.get(lay.shard_key(s)) for s in shards}
    outcomes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    verify_missed = mispredicted = 0
    index_nbytes = info.codec.index_nbytes
    while sum(kinds.values()) < FUZZ_PER_CHAIN:
        shard = rng.choice(shards)
        key = lay.shard_key(shard)
        raw = originals[shard]
        assert raw is not None
        how, bad = corrupt(raw, rng)
        if bad == raw:
            continue
        kinds[how] += 1
        sstore.put(key, bad)
        region = lay.shard_region(shard)
        window = tuple(slice(r.start + 1, r.start + 9) for r in region)  # ranged path
        for name, sel in (("whole", region), ("window", window)):
            reader = ShardReader(info=info, store=sstore, threads=1)  # fresh index cache
            try:
                got = reader.read(sel)
            except CorruptShardError as e:
                assert key in str(e)
                outcome = "detected"
            else:
                outcome = "right values" if np.array_equal(got, x[sel]) else "WRONG values"
            outcomes[f"{name}: {outcome}"] += 1
            if name == "whole":  # every stored byte read: the outcome is known in advance
                want = "right values" if reads_the_same(raw, bad, index_nbytes) else "detected"
                mispredicted += outcome != want
        record = Record.of("w", [raw], info.codec.index_nbytes, True)
        # a corruption verify reports: an integrity problem, or (where no checksum covers the
        # damaged bytes) a difference from the writer's record, a problem with strict=True
        problems, change, _, _ = check_shard(info, sstore, key, record)
        verify_missed += not problems and change is None
        sstore.put(key, raw)
    n = sum(kinds.values())
    record_figures(
        f"fuzz-{chain}",
        {
            "corruptions": n,
            "by_kind": dict(kinds),
            "outcomes": dict(outcomes),
            "silent_wrong_reads": outcomes["whole: WRONG values"]
            + outcomes["window: WRONG values"],
            "verify_missed": verify_missed,
            "whole_reads_mispredicted": mispredicted,
        },
    )
    assert n == FUZZ_PER_CHAIN
    assert outcomes["whole: WRONG values"] == outcomes["window: WRONG values"] == 0
    # a whole-shard read is right exactly when the corruption spared every byte it reads (the
    # index at the end and each stored chunk where the index says), else it is detected
    assert mispredicted == 0
    assert outcomes["whole: detected"] > 0 and outcomes["window: detected"] > 0
    assert verify_missed == 0


# -- a full disk ----------------------------------------------------------------------------------

DISK_KW: dict[str, Any] = dict(chunks=(16, 16), shards=(32, 64), fill_value=0, compressors=None)


def disk_data() -> np.ndarray:
    return np.random.default_rng(5).random((128, 128)).astype("float64")  # 16 KiB per shard


def test_enospc_from_the_store_reaches_the_caller_and_a_rerun_completes(tmp_path: Path) -> None:
    ref, root = tmp_path / "ref.zarr", tmp_path / "a.zarr"
    shardwise.write_array(disk_data(), ref, **DISK_KW)
    full = NoSpaceStore(LocalStore(root), budget=5 * 16 * 1024)
    with dask.config.set(scheduler="threads"), pytest.raises(OSError) as e:
        shardwise.write_array(da.from_array(disk_data(), chunks=(32, 64)), full, **DISK_KW)
    assert e.value.errno == errno.ENOSPC
    stored = [k for k in files(root) if k.startswith("c/")]
    assert temp_files(root) == [] and torn_shards(root) == []
    assert read_lease(ShardStore(LocalStore(root))) is None
    assert [p.kind for p in verify(root).problems] == ["incomplete"]
    roomy = NoSpaceStore(LocalStore(root), budget=10**9)
    rep = shardwise.write_array(disk_data(), roomy, resume=True, **DISK_KW)
    assert rep.shards_skipped == len(stored)
    assert files(root) == files(ref) and verify(root).ok
    record_figures(
        "disk-full-store-wrapper",
        {
            "errno": errno.errorcode[e.value.errno],
            "shards_before_full": len(stored),
            "sets_refused": full.refused,
            "partial_shards": 0,
            "rerun_skipped": rep.shards_skipped,
            "rerun_written": rep.shards_written,
        },
    )


RLIMIT_CHILD = textwrap.dedent("""
    import errno, json, resource, signal, sys
    import numpy as np
    import shardwise
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (12000, 12000))  # smaller than one shard
    x = np.random.default_rng(5).random((128, 128))
    try:
        shardwise.write_array(x, sys.argv[1], chunks=(16, 16), shards=(32, 64), fill_value=0,
                              compressors=None)
    except OSError as e:
        print(json.dumps({"errno": e.errno, "type": type(e).__name__, "msg": str(e)}))
    else:
        print(json.dumps({"errno": None}))
""")


def test_rlimit_fsize_in_a_subprocess(tmp_path: Path) -> None:
    import json

    ref, root = tmp_path / "ref.zarr", tmp_path / "a.zarr"
    shardwise.write_array(disk_data(), ref, **DISK_KW)
    proc = subprocess.run(
        [sys.executable, "-c", RLIMIT_CHILD, str(root)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["errno"] == errno.EFBIG, got
    assert temp_files(root) == [] and torn_shards(root) == []
    assert [k for k in files(root) if k.startswith("c/")] == []
    assert read_lease(ShardStore(LocalStore(root))) is None
    rep = shardwise.write_array(disk_data(), root, resume=True, **DISK_KW)
    assert files(root) == files(ref) and verify(root).ok
    record_figures(
        "disk-full-rlimit-fsize",
        {
            "errno": errno.errorcode[got["errno"]],
            "exception": got["type"],
            "partial_shards": 0,
            "temp_files_left": 0,
            "rerun_written": rep.shards_written,
        },
    )


# -- racing writer jobs ---------------------------------------------------------------------------

RACE_JOBS, RACE_TRIALS = 8, 100


def run_lease_race(kind: str, base: str, endpoint: str = "") -> dict[str, Any]:
    ctx = forkserver()
    barrier, out = ctx.Barrier(RACE_JOBS), ctx.Queue()
    jobs = [
        ctx.Process(target=race_lease, args=(i, kind, base, RACE_TRIALS, barrier, out, endpoint))
        for i in range(RACE_JOBS)
    ]
    started = time.perf_counter()
    for j in jobs:
        j.start()
    results = [out.get(timeout=300) for _ in range(RACE_JOBS * RACE_TRIALS)]
    for j in jobs:
        j.join(timeout=60)
    errors = [r for r in results if isinstance(r[2], str) and r[2].startswith("error")]
    winners: dict[int, list[tuple[int, str]]] = {}
    for t, idx, token in results:
        if token and not str(token).startswith("error"):
            winners.setdefault(t, []).append((idx, token))
    exactly_one = sum(len(winners.get(t, [])) == 1 for t in range(RACE_TRIALS))
    return dict(
        jobs=RACE_JOBS,
        trials=RACE_TRIALS,
        trials_with_exactly_one_holder=exactly_one,
        errors=errors[:3],
        winners=winners,
        seconds=round(time.perf_counter() - started, 1),
    )


def test_eight_jobs_race_for_a_local_lease(tmp_path: Path) -> None:
    res = run_lease_race("local", str(tmp_path))
    assert res["errors"] == []
    for t, won in res["winners"].items():  # the object names the one winner
        held = read_lease(ShardStore(LocalStore(tmp_path / f"t{t}")))
        assert held is not None and [held.token] == [tok for _, tok in won]
    winners = res.pop("winners")
    record_figures(
        "lease-race-local",
        {**res, "distinct_winning_jobs": len({w[0][0] for w in winners.values()})},
    )
    assert res["trials_with_exactly_one_holder"] == RACE_TRIALS


@pytest.mark.slow
def test_eight_writer_jobs_race_on_one_array(tmp_path: Path) -> None:
    ctx = forkserver()
    trials = 10
    outcomes: Counter[str] = Counter()
    for t in range(trials):
        root = str(tmp_path / f"a{t}.zarr")
        barrier, out = ctx.Barrier(RACE_JOBS), ctx.Queue()
        jobs = [
            ctx.Process(target=race_write, args=(i, root, barrier, out)) for i in range(RACE_JOBS)
        ]
        for j in jobs:
            j.start()
        res = [out.get(timeout=120) for _ in jobs]
        for j in jobs:
            j.join(timeout=60)
        wrote = [r for r in res if r[1] == "wrote"]
        assert len(wrote) == 1, res
        assert all(r[1] in ("wrote", "refused", "exists") for r in res), res
        outcomes.update(r[1] for r in res)
        values = np.unique(shardwise.open_array(root).compute())
        assert values.tolist() == [wrote[0][0]]  # nobody else wrote a byte
        assert verify(root).ok
    record_figures(
        "lease-race-writes", {"trials": trials, "jobs": RACE_JOBS, "outcomes": dict(outcomes)}
    )


# -- S3 -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


def retrying(s3: MotoS3, prefix: str, endpoint: str) -> Any:
    ms = datetime.timedelta(milliseconds=1)
    return s3.obstore(
        prefix,
        endpoint=endpoint,
        max_retries=25,
        backoff={"init_backoff": 5 * ms, "max_backoff": 200 * ms, "base": 2},
        retry_timeout=datetime.timedelta(seconds=120),
    )


@pytest.mark.slow
def test_s3_faults_through_a_proxy(s3: MotoS3) -> None:
    port = int(s3.endpoint.rsplit(":", 1)[1])
    proxy = FaultProxy(("127.0.0.1", port), p=0.3, p_ack=0.5, seed=11).start()
    try:
        prefix = unique()
        store = retrying(s3, prefix, proxy.endpoint)
        x = np.random.default_rng(2).integers(0, 500, (96, 80)).astype("int32")
        kw = dict(chunks=(8, 8), shards=(32, 40), compressors=[ZstdCodec(), Crc32cCodec()])
        report = shardwise.write_array(x, store, **kw)
        assert report.shards_written == 6
        writes = dict(proxy.counts)
        # an interrupted write, resumed through the same faults
        prefix2 = unique()
        store2 = retrying(s3, prefix2, proxy.endpoint)

        def cut(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
            assert block_info is not None
            if block_info[0]["chunk-location"] == (2, 1):
                raise RuntimeError("interrupted")
            return block

        src = da.from_array(x, chunks=(32, 40)).map_blocks(cut, meta=x[:0, :0])
        with dask.config.set(scheduler="synchronous"), pytest.raises(RuntimeError):
            shardwise.write_array(src, store2, **kw)
        shardwise.write_array(x, store2, resume=True, **kw)
        direct1, direct2 = s3.keys(prefix), s3.keys(prefix2)
        assert {k: v for k, v in direct1.items() if not k.startswith(".shardwise")} == {
            k: v for k, v in direct2.items() if not k.startswith(".shardwise")
        }

        wrong = errors = reads = 0
        windows = [
            (slice(0, 96), slice(0, 80)),
            (slice(3, 9), slice(35, 47)),
            (slice(30, 70), slice(1, 2)),
            (slice(90, 96), slice(70, 80)),
        ]
        for i in range(20):
            reader = open_reader(store if i % 2 else store2)
            for w in windows:
                reads += 1
                try:
                    got = reader[w]
                except Exception:
                    errors += 1
                    continue
                wrong += not np.array_equal(got, x[w])
        leases = 0
        for i in range(30):
            st = ShardStore(store, f"leases/{i}")
            held = Lease.acquire(st, purpose=f"lease {i}")
            leases += read_lease(st) == held.info
            held.release()
        rep = verify(store)
    finally:
        proxy.stop()
    counts = dict(proxy.counts)
    record_figures(
        "s3-faults",
        {
            "requests": counts.get("requests", 0),
            "faults": {k: v for k, v in counts.items() if k != "requests"},
            "faults_during_first_write": {k: v for k, v in writes.items() if k != "requests"},
            "reads": reads,
            "wrong_reads": wrong,
            "failed_reads": errors,
            "leases_taken_through_lost_acks": leases,
            "verify_ok": rep.ok,
        },
    )
    assert wrong == 0 and errors == 0
    assert leases == 30 and counts.get("lost_ack", 0) >= 10
    assert rep.ok
    for k in ("503", "drop", "lost", "500", "truncate"):
        assert counts.get(k, 0) > 0


@pytest.mark.slow
def test_eight_jobs_race_for_an_s3_lease(s3: MotoS3) -> None:
    res = run_lease_race("s3", unique(), s3.endpoint)
    assert res["errors"] == []
    res.pop("winners")
    record_figures("lease-race-s3", res)
    assert res["trials_with_exactly_one_holder"] == RACE_TRIALS


# -- the whole writer killed at random moments ----------------------------------------------------

KILL_TRIALS = 30


HOLD = (3, 2)  # the source block of the last shards: held until the writer is killed


def stored_shards(root: Path) -> int:
    """Shards visible under ``root`` (names only: a writer is busy there)."""
    return sum(not TEMP.search(f) for _, _, names in os.walk(root / "c") for f in names)


@pytest.mark.slow
def test_sigkill_of_the_writer_then_resume(tmp_path: Path) -> None:
    """SIGKILL of the whole writer after a random number of shards is stored, then resume.

    One source block is held until the kill, so the writer can never finish first: every trial
    kills mid-write, at a point chosen by shards stored, not by a clock.
    """
    ctx = forkserver()
    ref = tmp_path / "ref.zarr"
    shardwise.write_array(kill_data(0), ref, **KILL_KW)
    reference = files(ref)
    # shards that do not wait for the held block: those a trial may see stored before the kill
    lay = open_info(LocalStore(ref)).layout
    block = tuple(
        slice(h * c, min(h * c + c, n)) for h, c, n in zip(HOLD, (200, 300), lay.shape, strict=True)
    )
    held = set(lay.shards_touching(normalize_region(block, lay.shape)))
    free = [k for k in reference if k.startswith("c/")]
    free = [k for k in free if tuple(int(i) for i in k.split("/")[1:]) not in held]
    rng = random.Random(7)
    fig: Counter[str] = Counter()
    torn_total = temp_after = 0
    for trial in range(KILL_TRIALS):
        root = tmp_path / f"k{trial}.zarr"
        started = ctx.Event()
        p = ctx.Process(target=kill_writer, args=(str(root), 0, started, HOLD))
        p.start()
        assert started.wait(120)
        stored_before_kill = rng.randrange(len(free))

        wait_until(
            lambda r=root, n=stored_before_kill: stored_shards(r) >= n,
            f"trial {trial}: {stored_before_kill} shards stored",
            300,
        )
        p.kill()
        p.join(120)
        assert not p.is_alive()
        fig["killed_mid_write" if p.exitcode == -signal.SIGKILL else "finished_first"] += 1
        shards_seen = [k for k in files(root) if k.startswith("c/")] if root.exists() else []
        fig["shards_visible_after_kill"] += len(shards_seen)
        torn_total += len(torn_shards(root)) if (root / "zarr.json").exists() else 0
        temps = temp_files(root) if root.exists() else []
        fig["trials_with_temp_files_left"] += bool(temps)
        held_lease = root.exists() and read_lease(ShardStore(LocalStore(root))) is not None
        fig["lease_left_held"] += held_lease
        rep = shardwise.write_array(kill_data(0), root, resume=True, break_lease=True, **KILL_KW)
        fig["shards_skipped_on_resume"] += rep.shards_skipped
        temp_after += len(temp_files(root))
        assert files(root) == reference, f"trial {trial}"
        assert verify(root).ok
    record_figures(
        "sigkill-resume",
        {
            "trials": KILL_TRIALS,
            **fig,
            "torn_shards_visible": torn_total,
            "temp_files_after_resume": temp_after,
            "identical_to_uninterrupted": KILL_TRIALS,
        },
    )
    assert torn_total == 0 and temp_after == 0
    assert fig["killed_mid_write"] == KILL_TRIALS


# -- dask cluster: worker deaths and a paused worker ----------------------------------------------

CLUSTER_KW: dict[str, Any] = dict(
    chunks=(16, 16), shards=(64, 64), fill_value=0, compressors=[ZstdCodec(level=1)]
)


def cluster_data() -> np.ndarray:
    return np.random.default_rng(9).integers(0, 300, (384, 384)).astype("uint16")


def gate_then_copy(
    block: np.ndarray, flags: str, gated: list[tuple[int, int]], block_info: Any = None
) -> np.ndarray:
    """The source of a shard task; at a ``gated`` block the first try blocks its worker until the
    test kills it (``<flags>/gate-<i>-<j>`` names the worker's pid), the retry goes through."""
    assert block_info is not None
    loc = tuple(block_info[0]["chunk-location"])
    if loc in gated:
        flag = Path(flags) / f"gate-{loc[0]}-{loc[1]}"
        mine = Path(flags) / f"pid-{os.getpid()}-{loc[0]}-{loc[1]}"
        mine.write_text(str(os.getpid()))
        try:
            os.link(mine, flag)  # atomic: exactly one try of this block is held at the gate
        except FileExistsError:
            pass  # the retry after the kill
        else:
            threading.Event().wait(600)  # held here until SIGKILL
            raise RuntimeError(f"worker {os.getpid()} was never killed at block {loc}")
    return block.copy()


# function scope: its Client is the default scheduler while it lives, so a module-scoped one
# would run the writes of any test ordered after it (in-memory stores then stay empty here)
@pytest.fixture
def cluster() -> Iterator[Any]:
    from distributed import Client, LocalCluster

    conf = {
        "distributed.scheduler.allowed-failures": 20,
        # a nanny restarts its killed worker; the cluster must not give up on it (and close the
        # nanny) when the restart takes longer than usual on a busy machine
        "distributed.deploy.lost-worker-timeout": "1 hour",
    }
    with dask.config.set(conf):
        lc = LocalCluster(
            n_workers=3,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.CRITICAL,
        )
        client = Client(lc)
        client.wait_for_workers(3, timeout=120)
        try:
            yield client
        finally:
            client.close()
            lc.close()


def _workers(client: Any) -> dict[str, int]:
    """Address -> pid of the workers alive now."""
    got = client.run(os.getpid, on_error="ignore")
    return {a: int(p) for a, p in got.items() if isinstance(p, int)}


DEATH_RUNS, KILLS_PER_RUN, NWORKERS = 6, 2, 3


def _cluster_state(client: Any, fut: Any) -> str:
    """What the scheduler holds, for a run that stalls: workers, their tasks, unfinished tasks."""

    def state(dask_scheduler: Any) -> dict[str, Any]:
        s = dask_scheduler
        return {
            "workers": {a: [t.key for t in w.processing] for a, w in s.workers.items()},
            "tasks": {
                str(k): t.state for k, t in s.tasks.items() if t.state not in ("memory", "released")
            },
            "queued": len(s.queued),
            "unrunnable": len(s.unrunnable),
        }

    try:
        return f"future={fut.status} {client.run_on_scheduler(state)}"
    except Exception as e:  # a diagnostic must not hide the timeout
        return f"future={fut.status}; no scheduler state: {e!r}"


@pytest.mark.slow
def test_worker_deaths_during_writes(
    cluster: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """SIGKILL of a worker inside a shard task, twice per write, on 3 workers (one always lives:
    losing every worker at once is a test of dask's scheduler, not of shardwise).

    Each kill hits a task that is held at a gate until it is killed, so every run has its two
    deaths however slow the machine; each run starts with all workers back.
    """
    x = cluster_data()
    ref = tmp_path / "ref.zarr"
    shardwise.write_array(x, ref, **CLUSTER_KW)
    reference = files(ref)
    blocks = [(i, j) for i in range(6) for j in range(6)]
    rng = random.Random(3)
    killed: set[int] = set()
    kills_per_run, seconds = [], []
    for run in range(DEATH_RUNS):
        wait_until(
            lambda: len(set(_workers(cluster).values()) - killed) >= NWORKERS,
            f"{NWORKERS} live workers before run {run}",
            300,
        )
        root, flags = tmp_path / f"run{run}.zarr", tmp_path / f"flags{run}"
        flags.mkdir()
        gated = rng.sample(blocks, KILLS_PER_RUN)
        src = da.from_array(x, chunks=(64, 64)).map_blocks(
            gate_then_copy, str(flags), gated, meta=x[:0, :0]
        )
        t0 = time.perf_counter()
        fut = cluster.compute(
            shardwise.write_array(src, root, lease=True, compute=False, **CLUSTER_KW)
        )
        # kill whichever gated block is held first: a worker's queue may hold the other gated
        # block behind the one it is held at, so waiting for them in a fixed order can deadlock
        waiting = {flags / f"gate-{i}-{j}" for i, j in gated}
        kills = 0
        while waiting:
            try:
                # a write that failed instead of reaching a gate shows its own error
                wait_until(
                    lambda fut=fut, w=waiting: fut.done() or any(f.exists() for f in w),
                    f"run {run}: a worker at a gate of {sorted(f.name for f in waiting)}",
                    300,
                )
            except TimeoutError as e:
                raise TimeoutError(f"{e}; cluster: {_cluster_state(cluster, fut)}") from None
            assert not fut.done(), fut.result()  # the write cannot finish without gated shards
            for flag in [f for f in waiting if f.exists()]:
                pid = int(flag.read_text())
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
                kills += 1
                waiting.discard(flag)
        report = fut.result(timeout=300)
        seconds.append(round(time.perf_counter() - t0, 1))
        kills_per_run.append(kills)
        # the retried tasks went through their gates, and every shard is counted once
        assert report.shards_written == 36 and len(set(report.keys)) == 36
        assert torn_shards(root) == [] and temp_files(root) == []
        assert files(root) == reference, f"run {run}"
        assert verify(root).ok
    record_figures(
        "worker-deaths",
        {
            "runs": DEATH_RUNS,
            "kills_per_run": kills_per_run,
            "workers_killed": len(killed),
            "seconds_per_run": seconds,
            "corrupt_shards": 0,
            "missing_shards": 0,
            "runs_identical_to_reference": DEATH_RUNS,
        },
    )
    assert kills_per_run == [KILLS_PER_RUN] * DEATH_RUNS
    assert len(killed) == KILLS_PER_RUN * DEATH_RUNS  # every kill took a live worker
    # expected deaths are not logged (distributed's logs stay at ERROR, see conftest)
    err = capfd.readouterr().err
    assert "killed by signal" not in err and "Restarting worker" not in err, err[-2000:]


@pytest.mark.slow
async def _remove_worker(address: str, dask_scheduler: Any = None) -> None:
    """Run on the scheduler: remove a worker as its worker-ttl check does."""
    await dask_scheduler.remove_worker(address, stimulus_id="test-paused-worker")


def test_a_paused_worker_finishing_late_changes_nothing(tmp_path: Path) -> None:
    from distributed import Client, LocalCluster

    x = cluster_data()
    ref = tmp_path / "ref.zarr"
    shardwise.write_array(x, ref, **CLUSTER_KW)
    root, flag = tmp_path / "a.zarr", str(tmp_path / "stalled")
    key = "c/2/3"
    # the paused worker is removed by the test once it is paused (what worker-ttl would do after
    # its silence); the ttl itself is long, so that however busy the machine, the healthy worker
    # is never declared dead too (there is no nanny to bring it back)
    conf = {
        "distributed.scheduler.worker-ttl": "600s",
        "distributed.scheduler.allowed-failures": 20,
    }
    env = {
        **os.environ,
        # tests/, where faultkit is, so the worker processes can import it
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    with dask.config.set(conf):
        lc = LocalCluster(
            n_workers=0, processes=True, dashboard_address=None, silence_logs=logging.CRITICAL
        )
    client = Client(lc)
    # workers without a nanny: a nanny would kill its paused worker instead of letting it finish
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_worker",
                lc.scheduler_address,
                "--no-nanny",
                "--nthreads",
                "1",
                "--no-dashboard",
            ],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        client.wait_for_workers(2, timeout=120)
        pids = client.run(os.getpid)  # each worker's address -> its process
        store = StallStore(LocalStore(root), key, flag)
        t0 = time.perf_counter()
        fut = client.compute(
            shardwise.write_array(
                da.from_array(x, chunks=(64, 64)), store, lease=True, compute=False, **CLUSTER_KW
            )
        )
        wait_until(lambda: os.path.exists(flag), "a worker inside the put of c/2/3", 300)
        paused = int(Path(flag).read_text())
        os.kill(paused, signal.SIGSTOP)  # inside the put of shard c/2/3
        # the scheduler gives up on it, as worker-ttl would: its task goes to the healthy worker
        gone = [a for a, pid in pids.items() if pid == paused]
        assert len(gone) == 1, (pids, paused)
        client.run_on_scheduler(_remove_worker, gone[0])
        Path(f"{flag}.go").write_text("")  # what it sees when it runs again
        report = fut.result(timeout=300)
        done_at = time.perf_counter() - t0
        assert report.shards_written == 36
        assert files(root) == files(ref) and verify(root).ok
        inode = (root / key).stat().st_ino
        record = root / ".shardwise" / "shards" / key
        record_before = (record.stat().st_ino, record.stat().st_mtime_ns)
        os.kill(paused, signal.SIGCONT)
        wait_until(lambda: (root / key).stat().st_ino != inode, "the paused worker's late put")
        wait_until(
            lambda: (record.stat().st_ino, record.stat().st_mtime_ns) != record_before,
            "the late put's record",
        )
        late = True
        assert files(root) == files(ref)
        assert temp_files(root) == [] and torn_shards(root) == []
        assert verify(root).ok
    finally:
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGCONT)
            w.kill()
            w.wait(30)
        client.close()
        lc.close()
    record_figures(
        "paused-worker",
        {
            "paused_seconds": round(done_at, 1),
            "late_write_landed": late,
            "bytes_identical_after_late_write": True,
            "torn_shards": 0,
            "temp_files": 0,
        },
    )


def test_zarr_reads_what_survived(tmp_path: Path) -> None:
    """After a failed write, zarr-python reads the stored shards as written, the rest as fill.

    Which shards survive is fixed, not left to the task order: the source block of shard row 3
    (which every shard of that row needs) fails only once the twelve shards of rows 0-2 are
    stored."""
    root = tmp_path / "a.zarr"
    x = np.arange(64 * 64, dtype="int32").reshape(64, 64) + 1
    survivors = {f"c/{r}/{c}" for r in range(3) for c in range(4)}

    def stored() -> set[str]:
        return {k for k in files(root) if k.startswith("c/") and not k.endswith(".partial")}

    def cut(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
        assert block_info is not None
        if block_info[0]["chunk-location"][0] == 3:
            wait_until(lambda: stored() == survivors, "the shards of rows 0-2", 120)
            raise RuntimeError("interrupted")
        return block

    src = da.from_array(x, chunks=(16, 64)).map_blocks(cut, meta=x[:0, :0])
    with dask.config.set(scheduler="threads", num_workers=4), pytest.raises(RuntimeError):
        shardwise.write_array(src, root, chunks=(8, 8), shards=(16, 16))
    assert stored() == survivors
    got = zarr.open_array(root)[...]
    np.testing.assert_array_equal(got[:48], x[:48])
    np.testing.assert_array_equal(got[48:], np.zeros_like(x[48:]))
