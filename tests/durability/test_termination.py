"""Orderly termination: SIGTERM (a scheduler's preemption or time limit) and SIGINT stop a write
with its shards done kept, no temp file, its lease released, and ``--resume`` finishing it.

The commands run as real subprocesses with one source block held back (held_cli.py), so the
signal always comes mid-write: once the first shard is committed, while the held task runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
from zarr.storage import LocalStore

import shardwise
from faultkit import exe, record_figures, records, temp_files, wait_until
from shardwise import Interrupted, InvalidTypeError, InvalidValueError
from shardwise.cli.commands import TASK_ID_VARS
from shardwise.durability.lease import read_lease
from shardwise.durability.verify import verify
from shardwise.runtime import pool as _pool
from shardwise.storage.store import ShardStore

HELD_CLI = Path(__file__).with_name("held_cli.py")
SHAPE = (128, 64)  # 4 x 2 shards of 32 x 32; one part


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (*TASK_ID_VARS, "SHARDWISE_TRACEBACK")}


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    cmd = [*exe(), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=cli_env(), timeout=300)


class Lines:
    """The stderr lines of a process, read as they come (a thread: the pipe never fills)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stderr is not None
        self.thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self.thread.start()

    def _read(self, f: Any) -> None:
        for line in f:
            self.lines.append(line)

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signalled_batch_part_stops_in_order_and_resumes(
    tmp_path: Path, sig: signal.Signals, status: int
) -> None:
    x = np.arange(np.prod(SHAPE), dtype="float32").reshape(SHAPE) + 1
    src, dst, flag = tmp_path / "src.zarr", tmp_path / "dst.zarr", tmp_path / "part0"
    shardwise.write_array(x, src, chunks=(16, 16), shards=(32, 32))
    init = cli("batch", "init", dst, "--source", src, "--parts", 1, "--chunks", "16,16",
               "--shards", "32,32")  # fmt: skip
    assert init.returncode == 0, init.stderr
    args = ["batch", "part", dst, "--source", src, "--part", 0, "--threads", 1]
    cmd = [sys.executable, str(HELD_CLI), str(flag), 1, 1, *args]
    # one dask thread: while the held task runs no other starts, so the signal comes with
    # shards left that never start
    env = dict(cli_env(), DASK_NUM_WORKERS="1")
    proc = subprocess.Popen(
        [str(c) for c in cmd], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    err = Lines(proc)
    wait_until(
        lambda: Path(f"{flag}.held").exists() and len(records(dst)) >= 1,
        "the part mid-write: a shard committed and the held block's task running",
    )
    sent = time.monotonic()
    proc.send_signal(sig)
    wait_until(lambda: err.has("stopping"), "the part starts stopping")
    Path(f"{flag}.go").touch()  # the running task goes on: it commits its shard
    assert proc.wait(timeout=60) == status
    # how long the stop took is a figure, not a check (a loaded machine may stretch it); what is
    # checked is the order of the stop below: the running task's shard kept, no new task started
    record_figures(f"termination-{sig.name}", {"signal_to_exit_s": time.monotonic() - sent})
    err.thread.join()
    assert err.has(f"stopped by {sig.name}: the shards done are kept (--resume finishes it)")
    done = len(records(dst))
    assert 1 <= done < 8  # the tasks not started when the signal came never started
    assert temp_files(dst) == []
    assert read_lease(ShardStore(LocalStore(dst)), ".shardwise/lease.part-0-of-1") is None
    assert "to do: [0]" in cli("batch", "status", dst).stdout

    again = cli("batch", "part", dst, "--source", src, "--part", 0, "--resume")
    assert again.returncode == 0, again.stderr
    assert f"{done} done before (resumed)" in again.stdout
    assert "took over" not in again.stderr  # nothing to take over: the lease was released
    assert cli("batch", "finalize", dst).returncode == 0
    np.testing.assert_array_equal(shardwise.open_array(dst).compute(), x)


def test_a_library_write_stops_on_a_signal_when_asked(tmp_path: Path) -> None:
    """Inside ``stop_on_signals`` a write stops as the commands do; resume finishes it."""
    x = np.arange(64 * 64, dtype="int32").reshape(64, 64) + 1
    root = tmp_path / "a.zarr"

    def signal_once(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        if block_info is not None and block_info[0]["chunk-location"] == (2, 0):
            os.kill(os.getpid(), signal.SIGTERM)  # the main thread handles it
            # this task goes on only once it has: the tasks after it then never start
            wait_until(lambda: _pool._stopping_all is not None, "the main thread stopping")
        return block

    src = da.from_array(x, chunks=(16, 16)).map_blocks(signal_once, dtype=x.dtype)
    before = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(Interrupted, match="stopped by SIGTERM") as e,
        shardwise.stop_on_signals(),
        dask.config.set(scheduler="threads", num_workers=1),
    ):
        shardwise.write_array(src, root, chunks=(8, 8), shards=(16, 16), threads=1)
    assert e.value.exit_status == 143 and isinstance(e.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is gone again
    assert read_lease(ShardStore(LocalStore(root))) is None
    assert temp_files(root) == [] and 1 <= len(records(root)) < 16
    assert not verify(root).ok  # an interrupted write, as verify says
    rep = shardwise.write_array(x, root, chunks=(8, 8), shards=(16, 16), resume=True)
    assert rep.shards_skipped == len(records(root)) - rep.shards_written
    np.testing.assert_array_equal(shardwise.open_array(root).compute(), x)
    assert verify(root).ok


def test_without_the_opt_in_python_keeps_its_default_handling(tmp_path: Path) -> None:
    # the handlers the child starts with are its parent's choice (a shell running this suite in
    # the background starts it with SIGINT ignored): the write must leave them as they were
    script = (
        "import signal, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
        "before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]\n"
        "import numpy as np, shardwise\n"
        f"shardwise.write_array(np.ones((8, 8)), {str(tmp_path / 'a.zarr')!r}, chunks=(4, 4),"
        " shards=(8, 8))\n"
        "after = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]\n"
        "print(*(a is b for a, b in zip(before, after)), flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().split() == ["True", "True"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM  # ended by the signal, as Python does


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        (dict(signals="SIGTERM"), InvalidTypeError, "signals must be a sequence"),
        (dict(signals=[12345]), InvalidValueError, "signals must be signal numbers"),
        (dict(signals=[signal.SIGKILL]), InvalidValueError, "SIGKILL cannot be handled"),
        (dict(grace=0), InvalidValueError, "grace must be a positive number"),
        (dict(grace="20"), InvalidTypeError, "grace must be a positive number"),
    ],
)
def test_stop_on_signals_refuses_bad_arguments(kwargs: Any, error: type, text: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(error, match=text), shardwise.stop_on_signals(**kwargs):
        pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_stop_on_signals_only_in_the_main_thread() -> None:
    out: list[BaseException] = []

    def run() -> None:
        try:
            with shardwise.stop_on_signals():
                pass
        except InvalidValueError as e:
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert len(out) == 1 and "main thread" in str(out[0])
