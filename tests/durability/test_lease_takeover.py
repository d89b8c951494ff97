"""A dead holder never blocks its own rerun: resumers take over leases whose holders are gone.

Holders are real processes (a subprocess that takes a lease and holds it until its stdin pipe
closes), killed with SIGKILL where a test needs a dead one; leases of other hosts are written as
records (this machine cannot be another host). Local files and S3 (moto).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zarr.storage import LocalStore, MemoryStore

import shardwise
from faultkit import (
    MotoS3,
    exe,
    files,
    gone_pid,
    moto_s3,
    records,
    temp_files,
    unique,
    wait_until,
)
from shardwise import InvalidTypeError, InvalidValueError, LeaseHeldError
from shardwise.cli.commands import TASK_ID_VARS
from shardwise.durability.holder import LeaseInfo, process_start
from shardwise.durability.lease import LEASE, Lease, read_lease
from shardwise.storage.store import ShardStore

SRC = Path(__file__).resolve().parents[2] / "src"
TESTS = Path(__file__).resolve().parents[1]
HELD_CLI = Path(__file__).with_name("held_cli.py")

# takes the lease of the store named by argv and prints its token; holds it until stdin closes
HOLDER = """
import sys
from zarr.storage import LocalStore
from shardwise.durability.lease import Lease
from shardwise.storage.store import ShardStore
kind, where = sys.argv[1], sys.argv[2]
if kind == "local":
    store = ShardStore(LocalStore(where))
else:
    from faultkit import MotoS3
    endpoint, prefix = where.split("|")
    store = ShardStore(MotoS3(endpoint, None).obstore(prefix))
lease = Lease.acquire(store, purpose="the holder")
print(lease.info.token, flush=True)
sys.stdin.read()
lease.release()
# the lease released, the holder ends here: a native client's threads torn down at interpreter
# exit can abort the process (SIGABRT seen once on S3), which says nothing of the lease
sys.stdout.flush()
import os
os._exit(0)
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as server:
        yield server


Place = tuple[ShardStore, list[str]]  # the store, and how a subprocess names it


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Place]:
    """A fresh store per call, on local files or on S3 (moto)."""

    def make() -> Place:
        if request.param == "local":
            root = tmp_path / unique()
            root.mkdir()
            return ShardStore(LocalStore(root)), ["local", str(root)]
        server: MotoS3 = request.getfixturevalue("s3")
        prefix = f"takeover-{unique()}"
        return ShardStore(server.obstore(prefix)), ["s3", f"{server.endpoint}|{prefix}"]

    return make


def start_holder(where: list[str]) -> tuple[subprocess.Popen[str], str]:
    """A process holding the lease, and the lease's token (printed once it holds it)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), str(TESTS)]))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *where],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    token = proc.stdout.readline().strip()  # the state: the lease object exists
    assert token, f"the holder exited with {proc.wait()}"
    return proc, token


def test_a_sigkilled_holder_is_taken_over(place: Callable[[], Place]) -> None:
    st, where = place()
    proc, token = start_holder(where)
    held = read_lease(st)
    assert held is not None and held.token == token and held.pid == proc.pid
    with pytest.raises(LeaseHeldError, match="running"):  # alive: never taken over
        Lease.acquire(st, takeover=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with pytest.raises(LeaseHeldError, match="that process is gone"):  # not without takeover
        Lease.acquire(st)
    with Lease.acquire(st, purpose="the resumer", takeover=True) as lease:
        assert [(t.holder.token, t.reason) for t in lease.took_over] == [
            (token, "that process is gone")
        ]
        now = read_lease(st)
        assert now is not None and now.token == lease.info.token
    assert read_lease(st) is None


def test_a_live_holder_is_refused_and_its_lease_kept(place: Callable[[], Place]) -> None:
    st, where = place()
    proc, token = start_holder(where)
    try:
        for _ in range(3):
            with pytest.raises(LeaseHeldError, match=r"'the holder' by .* pid .* [(]running[)]"):
                Lease.acquire(st, purpose="the resumer", takeover=True)
            held = read_lease(st)
            assert held is not None and held.token == token
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the holder lets go on its own
        assert proc.wait() == 0
    assert read_lease(st) is None


def test_a_reused_pid_is_not_the_holder(tmp_path: Path) -> None:
    st = ShardStore(LocalStore(tmp_path))
    # a live process that holds nothing: its pid in a record with another start time
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    try:
        start = process_start(other.pid)
        assert start is not None and start >= 0
        base = replace(LeaseInfo.new("the old holder"), pid=other.pid)
        st.put(LEASE, replace(base, started=start).to_bytes())
        with pytest.raises(LeaseHeldError, match="running"):  # the same start: that is it
            Lease.acquire(st, takeover=True)
        st.put(LEASE, replace(base, started=start - 1).to_bytes())
        with Lease.acquire(st, takeover=True) as lease:
            (t,) = lease.took_over
            assert t.holder.pid == other.pid and "another process now" in t.reason
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait()


def other_host(renewed: float, expiry: float = 300.0) -> LeaseInfo:
    return replace(
        LeaseInfo.new("a job on another node"),
        host="node-elsewhere",
        boot_id="another-machine",
        pid=4242,
        renewed=renewed,
        expiry=expiry,
    )


def test_another_hosts_lease_is_taken_over_after_its_expiry(place: Callable[[], Place]) -> None:
    st, _ = place()
    t0 = time.time()
    st.put(LEASE, other_host(t0 - 10).to_bytes())  # a fresh heartbeat
    with pytest.raises(LeaseHeldError, match=r"last heartbeat \d+ s ago") as err:
        Lease.acquire(st, takeover=True)
    # 10 s old when put, plus however long the refusal took (rounded), however slow the store
    said = re.search(r"last heartbeat (\d+) s ago", str(err.value))
    assert said is not None
    ago = int(said.group(1))
    assert 10 <= ago <= 10 + round(time.time() - t0) + 1, ago
    st.put(LEASE, other_host(time.time() - 301).to_bytes())  # silent past its expiry
    with Lease.acquire(st, takeover=True) as lease:
        (t,) = lease.took_over
        assert t.holder.host == "node-elsewhere" and "past its expiry of 300 s" in t.reason
    # a record without its own expiry (an older version) is judged by the taker's
    old = replace(other_host(0.0, 0.0), since="2020-01-01T00:00:00+00:00")
    st.put(LEASE, old.to_bytes())
    with Lease.acquire(st, takeover=True, expiry=60) as lease:
        assert "past its expiry of 60 s" in lease.took_over[0].reason


def test_the_heartbeat_renews_until_release(tmp_path: Path) -> None:
    st = ShardStore(LocalStore(tmp_path))
    lease = Lease.acquire(st, expiry=0.4)  # renewed every 0.1 s
    first = lease.info.renewed
    # this lease's own heartbeat (leases other tests left held have theirs)
    beats = [t for t in threading.enumerate() if t is lease._beat]
    assert len(beats) == 1 and beats[0].name.startswith("shardwise-lease-")

    def renewed() -> bool:
        now = read_lease(st)
        return now is not None and now.renewed > first

    wait_until(renewed, "a heartbeat")
    lease.release()
    assert read_lease(st) is None and not beats[0].is_alive()


def test_a_taken_over_holder_finds_out_at_its_next_beat(tmp_path: Path) -> None:
    st = ShardStore(LocalStore(tmp_path))
    stale = Lease.acquire(st, expiry=0.4)
    beat = stale._beat
    assert beat is not None
    beat.stop()  # as if this holder's node were cut off: silent from now on
    st.put(LEASE, replace(stale.info, renewed=time.time() - 10, host="node-elsewhere").to_bytes())
    with Lease.acquire(st, takeover=True) as lease:
        assert lease.took_over[0].holder.token == stale.info.token
        assert stale.renew() is False  # its heartbeat never overwrites the new holder
        now = read_lease(st)
        assert now is not None and now.token == lease.info.token
        stale.release()  # leaves the new holder's lease alone
        now = read_lease(st)
        assert now is not None and now.token == lease.info.token
    assert read_lease(st) is None


def dead_lease(st: ShardStore, pid: int) -> None:
    st.put(LEASE, replace(LeaseInfo.new("the dead job"), pid=pid).to_bytes())


def race(st: ShardStore, racers: int) -> list[Lease | LeaseHeldError]:
    """``racers`` threads released together by a barrier, each resuming with a takeover."""
    barrier = threading.Barrier(racers)
    out: list[Any] = [None] * racers

    def one(i: int) -> None:
        barrier.wait()
        try:
            out[i] = Lease.acquire(st, purpose=f"resumer {i}", takeover=True)
        except LeaseHeldError as e:
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("kind", ["local", "s3", "memory"])
def test_racing_resumers_one_wins_each_time(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that ran and is gone (not reused within this test: pids wrap slowly)
    racers, trials = 4, 8
    winners: list[int] = []
    for trial in range(trials):
        if kind == "local":
            st = ShardStore(LocalStore(tmp_path / f"t{trial}"))
        elif kind == "s3":
            st = ShardStore(request.getfixturevalue("s3").obstore(f"race-{unique()}"))
        else:
            st = ShardStore(MemoryStore())
        dead_lease(st, gone.pid)
        out = race(st, racers)
        won = [lease for lease in out if isinstance(lease, Lease)]
        assert len(won) == 1, out
        assert all(isinstance(e, LeaseHeldError) for e in out if e is not won[0])
        assert [t.holder.pid for t in won[0].took_over] == [gone.pid]
        held = read_lease(st)
        assert held is not None and held.token == won[0].info.token
        winners.append(out.index(won[0]))
        won[0].release()
        assert read_lease(st) is None
    assert len(winners) == trials


# -- the flow: a batch part SIGKILLed mid-write, requeued with --resume -------------------

SHAPE, CHUNKS, SHARDS = (256, 64), "16,16", "32,32"  # 8 x 2 shards; 4 parts of 2 x 2 shards


def cli_env() -> dict[str, str]:
    # no job-array task id from the environment the tests run in
    return {k: v for k, v in os.environ.items() if k not in (*TASK_ID_VARS, "SHARDWISE_TRACEBACK")}


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    cmd = [*exe(), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=cli_env(), timeout=300)


def held_part(flag: Path, block: tuple[int, int], *args: object) -> subprocess.Popen[str]:
    """``shardwise ARGS`` with source ``block`` held back until ``flag.go`` exists."""
    cmd = [sys.executable, str(HELD_CLI), str(flag), *map(str, block), *map(str, args)]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env()
    )


def batch_source(tmp_path: Path) -> tuple[np.ndarray, Path, Path]:
    x = np.arange(np.prod(SHAPE), dtype="float32").reshape(SHAPE) + 1
    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    shardwise.write_array(x, src, chunks=(16, 16), shards=(32, 32))
    init = cli("batch", "init", dst, "--source", src, "--parts", 4, "--chunks", CHUNKS)
    assert init.returncode == 2  # --shards is required: nothing written
    init = cli("batch", "init", dst, "--source", src, "--parts", 4, "--chunks", CHUNKS,
               "--shards", SHARDS)  # fmt: skip
    assert init.returncode == 0, init.stderr
    return x, src, dst


def part_records(dst: Path, rows: tuple[int, ...]) -> int:
    return sum(k.split("/")[1] in map(str, rows) for k in records(dst))


def test_batch_part_sigkilled_is_requeued_without_break_lease(tmp_path: Path) -> None:
    x, src, dst = batch_source(tmp_path)
    flag = tmp_path / "part2"
    others = [cli_popen("batch", "part", dst, "--source", src, "--part", i) for i in (0, 1, 3)]
    # part 2 writes shard rows 4 and 5; source block (5, 1) never comes
    killed = held_part(flag, (5, 1), "batch", "part", dst, "--source", src, "--part", 2)
    wait_until(
        lambda: Path(f"{flag}.held").exists() and part_records(dst, (4, 5)) >= 1,
        "part 2 mid-write: its held block started and a shard of it committed",
    )
    killed.kill()
    assert killed.wait() == -signal.SIGKILL
    assert [p.wait() for p in others] == [0, 0, 0]
    status = cli("batch", "status", dst)
    assert "done: 3 of 4; to do: [2]" in status.stdout
    assert (dst / ".shardwise" / "lease.part-2-of-4").exists()  # what the killed run left
    assert cli("lease", dst, "--part", 2).stdout.count("that process is gone") == 1

    again = cli("batch", "part", dst, "--source", src, "--part", 2, "--resume")
    assert again.returncode == 0, again.stderr
    assert "took over lease '.shardwise/lease.part-2-of-4'" in again.stderr
    assert f"pid {killed.pid} (that process is gone)" in again.stderr
    assert "done before (resumed)" in again.stdout
    assert "took over lease '.shardwise/lease.part-2-of-4'" in again.stdout  # the report's note
    final = cli("batch", "finalize", dst)
    assert final.returncode == 0, final.stderr
    checked = cli("verify", dst)
    assert checked.returncode == 0 and "OK" in checked.stdout, checked.stdout
    assert temp_files(dst) == [] and not list((dst / ".shardwise").glob("lease*"))
    np.testing.assert_array_equal(shardwise.open_array(dst).compute(), x)


def cli_popen(*args: object) -> subprocess.Popen[str]:
    cmd = [*exe(), *map(str, args)]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=cli_env()
    )


def test_finalize_takes_over_the_leases_of_dead_parts(tmp_path: Path) -> None:
    x = np.arange(64 * 8, dtype="int32").reshape(64, 8)
    root = tmp_path / "b.zarr"
    plan = shardwise.batch.init(root, shape=x.shape, dtype=x.dtype, chunks=(8, 8),
                                shards=(16, 8), parts=2)  # fmt: skip
    for i in range(2):
        shardwise.batch.write_part(x, root, i)
    st = ShardStore(LocalStore(root))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = replace(LeaseInfo.new("batch part 1 of 2"), pid=gone.pid)
    st.put(".shardwise/lease.part-1-of-2", dead.to_bytes())
    live = Lease.acquire(st, name=".shardwise/lease.part-0-of-2", purpose="batch part 0 of 2")
    with pytest.raises(LeaseHeldError, match=r"parts still running .*part-0-of-2"):
        shardwise.batch.finalize(root)
    assert read_lease(st, ".shardwise/lease.part-1-of-2") == dead  # refused: nothing changed
    live.release()
    report = shardwise.batch.finalize(root)
    assert report.ok and plan.nparts == 2
    assert any("took over lease '.shardwise/lease.part-1-of-2'" in n for n in report.notes)
    assert read_lease(st, ".shardwise/lease.part-1-of-2") is None


@pytest.mark.parametrize(
    ("value", "env", "error", "text"),
    [
        (0, None, InvalidValueError, "lease_expiry must be a positive number of seconds, got 0"),
        ("60", None, InvalidTypeError, "lease_expiry must be a positive number.*'60' [(]str[)]"),
        (True, None, InvalidTypeError, "lease_expiry must be a positive number"),
        (None, "soon", InvalidValueError, "SHARDWISE_LEASE_EXPIRY must be a positive number"),
        (None, "-5", InvalidValueError, "SHARDWISE_LEASE_EXPIRY must be a positive number"),
    ],
)
def test_a_bad_lease_expiry_is_refused_before_the_store_changes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    value: object,
    env: str | None,
    error: type,
    text: str,
) -> None:
    x = np.arange(64 * 8, dtype="int32").reshape(64, 8)
    root = tmp_path / "b.zarr"
    shardwise.batch.init(root, shape=x.shape, dtype=x.dtype, chunks=(8, 8), shards=(16, 8), parts=2)
    before = files(root, journal=True)
    if env is not None:
        monkeypatch.setenv("SHARDWISE_LEASE_EXPIRY", env)
    with pytest.raises(error, match=text):
        shardwise.batch.write_part(x, root, 0, lease_expiry=value)  # type: ignore[arg-type]
    with pytest.raises(error, match=text):
        shardwise.batch.finalize(root, lease_expiry=value)  # type: ignore[arg-type]
    assert files(root, journal=True) == before


def test_shared_leases_of_gone_writers_and_the_exclusive_one(tmp_path: Path) -> None:
    """Region writes hold shared leases: a resumer of the whole array drops the gone ones (and
    is refused by a live one); a resumed region write takes over a gone exclusive holder's."""
    st = ShardStore(LocalStore(tmp_path))
    dead = replace(LeaseInfo.new("region write"), pid=gone_pid())
    st.put(f".shardwise/leases/{dead.token}", dead.to_bytes())
    live = Lease.acquire_shared(st)
    with pytest.raises(LeaseHeldError, match="region write"):
        Lease.acquire(st, takeover=True)
    assert read_lease(st, f".shardwise/leases/{dead.token}") == dead  # refused: left as it was
    gone = replace(LeaseInfo.new("write"), pid=gone_pid())
    st.put(LEASE, gone.to_bytes())
    with pytest.raises(LeaseHeldError, match="region write"):
        Lease.acquire(st, takeover=True)
    assert read_lease(st) == gone  # a dead exclusive holder's lease too
    live.release()
    with Lease.acquire(st, takeover=True) as lease:
        assert sorted(t.holder.token for t in lease.took_over) == sorted([dead.token, gone.token])
    assert st.list(".shardwise/leases") == []

    st.put(LEASE, replace(LeaseInfo.new("write"), pid=gone_pid()).to_bytes())
    with pytest.raises(LeaseHeldError, match="that process is gone"):
        Lease.acquire_shared(st)
    with Lease.acquire_shared(st, takeover=True) as shared:
        assert shared.took_over[0].reason == "that process is gone"
        assert read_lease(st) is None  # the dead exclusive lease is gone, not kept by us
    assert st.list(".shardwise/leases") == []


def test_a_resumed_conversion_takes_over_a_gone_writers_lease(tmp_path: Path) -> None:
    x = np.arange(40 * 30, dtype="int16").reshape(40, 30)
    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    shardwise.write_array(x, src, chunks=(10, 10), shards=(20, 30))
    shardwise.convert(src, dst, shards=(40, 30))
    st = ShardStore(LocalStore(dst))
    st.put(LEASE, replace(LeaseInfo.new("write"), pid=gone_pid()).to_bytes())
    before = files(dst, journal=True)
    with pytest.raises(LeaseHeldError, match="that process is gone"):
        shardwise.convert(src, dst, shards=(40, 30), mode="w")
    assert files(dst, journal=True) == before
    report = shardwise.convert(src, dst, shards=(40, 30), resume=True)
    assert report.ok and read_lease(st) is None
    np.testing.assert_array_equal(shardwise.open_array(dst).compute(), x)


def test_a_held_lease_pickles_without_its_heartbeat(tmp_path: Path) -> None:
    """The finish of a ``compute=False`` write carries its sessions' leases to a worker: the copy
    pickles, has no heartbeat of its own, and releasing it removes the lease, after which the
    holder's heartbeat stops at its next beat."""
    import pickle

    st = ShardStore(LocalStore(tmp_path))
    lease = Lease.acquire(st, expiry=0.4)
    copy = pickle.loads(pickle.dumps(lease))
    assert copy._beat is None and copy.info == lease.info
    copy.release()
    assert read_lease(st) is None
    beat = lease._beat
    assert beat is not None
    wait_until(lambda: not beat.is_alive(), "the holder's heartbeat to stop")


def _dataset() -> Any:
    import xarray as xr

    return xr.Dataset({"v": (("y", "x"), np.arange(64, dtype="f4").reshape(8, 8))})


def test_a_takeover_leaves_nothing_read_as_a_lease(tmp_path: Path) -> None:
    """A resumed to_zarr(mode="w") takes over its dead writer's lease (the takeover's lock file
    stays in the journal) and finishes; later mode="w" writes are not refused by what the
    takeover left, and `shardwise lease` agrees: free."""
    import shardwise.cli as cli_main

    p = tmp_path / "ds.zarr"
    ds = _dataset()
    shardwise.to_zarr(ds, p, shards={"y": 8, "x": 8})
    st = ShardStore(LocalStore(p), "v")
    st.put(LEASE, replace(LeaseInfo.new("the killed write"), pid=gone_pid()).to_bytes())
    report = shardwise.to_zarr(ds, p, mode="w", resume=True, shards={"y": 8, "x": 8})
    assert report.shards_written == 1
    assert read_lease(st) is None
    assert cli_main.main(["lease", str(p / "v")]) == 0
    for kw in ({}, {"break_lease": True}):
        shardwise.to_zarr(ds, p, mode="w", shards={"y": 8, "x": 8}, **kw)
    assert cli_main.main(["lease", str(p / "v")]) == 0


def test_mode_w_and_break_lease_agree_with_the_lease_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead writer's lease on a variable mode "w" drops: the lease command reports it held,
    mode "w" refuses (the store unchanged), a resume passes the gone holder's lease and
    break_lease=True passes any; a path that is not an array is an error (exit 3), not free."""
    import shardwise.cli as cli_main

    p = tmp_path / "ds.zarr"
    ds = _dataset()
    shardwise.to_zarr(ds.assign(old=ds.v), p, shards={"y": 8, "x": 8})
    st = ShardStore(LocalStore(p), "old")
    gone = replace(LeaseInfo.new("the killed write"), pid=gone_pid())
    for kw in ({"break_lease": True}, {"resume": True}):
        st.put(LEASE, gone.to_bytes())
        capsys.readouterr()
        assert cli_main.main(["lease", str(p / "old")]) == 0
        assert "the killed write" in capsys.readouterr().out
        before = files(p, journal=True)
        with pytest.raises(LeaseHeldError, match=r"mode='w' would delete 'old/\.shardwise/lease'"):
            shardwise.to_zarr(ds, p, mode="w", shards={"y": 8, "x": 8})
        assert files(p, journal=True) == before
        shardwise.to_zarr(ds, p, mode="w", shards={"y": 8, "x": 8}, **kw)
        assert not (p / "old").exists()
        shardwise.to_zarr(ds.assign(old=ds.v), p, mode="w", shards={"y": 8, "x": 8})
    assert cli_main.main(["lease", str(p / "old")]) == 0
    assert capsys.readouterr().out.strip() == "free"
    for path in (p, p / "nothing", tmp_path / "absent.zarr"):  # a group, nothing, no store
        assert cli_main.main(["lease", str(path)]) == 3
        assert "free" not in capsys.readouterr().out
