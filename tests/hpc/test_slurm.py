"""docs/hpc.md's SLURM job array, run as written on a real single-node SLURM (servers/slurm.sh).

The two scripts of the document (``convert.sh``, ``part.sh``) are read from it and submitted
unchanged: an ``init`` job, an array of 4 parts, a ``finalize`` job. Two parts are stopped
mid-write, each in its first run, by SLURM itself:

* part 0 by ``scontrol requeue``: SLURM's SIGTERM to all its processes, then its rerun;
* part 1 by its time limit: SIGTERM from the script's ``--signal``, an orderly stop (exit 143)
  and the script's own ``scontrol requeue``.

Nothing else is done by hand: SLURM reruns both, ``finalize`` runs after the whole array, and
the array is then verified and compared with the source values.

"Mid-write" is a state, not a moment: the first run of parts 0 and 1 goes through a ``shardwise``
on ``PATH`` that runs the real command with one source block held back
(``durability/held_cli.py``); the test acts once a shard of that part is committed and the held
block's task runs. Every wait polls a state (files, ``squeue``) with a bound.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import shardwise
from faultkit import exe, records, wait_until
from shardwise.cli.commands import TASK_ID_VARS
from skips import in_ci

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "servers" / "slurm.sh"
HELD_CLI = ROOT / "tests" / "durability" / "held_cli.py"
DOC = ROOT / "docs" / "hpc.md"
SHAPE, SHARD = (256, 64), 32  # 8 x 2 shards of 32 x 32; 4 parts of 64 rows (4 shards each)
NPARTS = 4


def doc_script(name: str) -> str:
    """The ```bash block of docs/hpc.md that is the script ``name`` (its first comment names it)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", DOC.read_text(), flags=re.DOTALL | re.MULTILINE)
    found = [b for b in blocks if re.search(rf"^# {re.escape(name)}:", b, flags=re.MULTILINE)]
    assert len(found) == 1, f"docs/hpc.md: {len(found)} blocks for {name}"
    return found[0]


@pytest.fixture(scope="session")
def slurm() -> Iterator[None]:
    """A running single-node SLURM, started through servers/slurm.sh (a second start finds it
    running; outside CI it installs nothing). Where it cannot start, a skip that says why
    (CI=true fails it: tests/skips.py)."""
    env = dict(os.environ, SLURM_INSTALL="1" if in_ci() else "0")
    try:
        run = subprocess.run(
            ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900, env=env
        )
    except OSError as e:
        pytest.skip(f"SLURM did not start: servers/slurm.sh: {e}")
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["(no message)"])[-1]
        pytest.skip(f"SLURM did not start: servers/slurm.sh exit {run.returncode}: {last}")
    yield


def wrapper(bin_dir: Path, flags: Path) -> None:
    """``shardwise`` for the jobs: the first run of parts 0 and 1 holds back the source block
    of one of the part's 4 shards (the other worker thread commits the others meanwhile); every
    other run is the plain command."""
    real = " ".join(shlex.quote(c) for c in exe())
    held = f"{shlex.quote(sys.executable)} {shlex.quote(str(HELD_CLI))}"
    text = f"""#!/bin/bash
i=${{SLURM_ARRAY_TASK_ID:-}}
echo "shardwise: part ${{i:-none}}, restarts ${{SLURM_RESTART_COUNT:-0}}: $*" >&2
if [ "$1 $2" = "batch part" ] && [ -z "${{SLURM_RESTART_COUNT:-}}" ] && [[ "$i" == [01] ]]; then
  exec {held} {shlex.quote(str(flags))}/part$i $((2 * i + 1)) 1 "$@"
fi
exec {real} "$@"
"""
    path = bin_dir / "shardwise"
    path.write_text(text)
    path.chmod(0o755)


def committed(dst: Path, part: int) -> int:
    """Shards of ``part`` whose record is stored (keys c/ROW/COL)."""
    rows = range(2 * part, 2 * part + 2)
    return sum(int(k.split("/")[-2]) in rows for k in records(dst))


def slurm_cmd(*args: str) -> str:
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, f"{' '.join(args)}: {out.stderr}"
    return out.stdout


class Jobs:
    """The three jobs convert.sh submitted, and their logs in the submit directory."""

    def __init__(self, line: str, where: Path) -> None:
        m = re.search(r"init (\d+), parts (\d+), finalize (\d+)", line)
        assert m, line
        self.init, self.parts, self.final = m.groups()
        self.where = where

    def log(self, task: int | None = None) -> str:
        name = f"slurm-{self.final}.out" if task is None else f"slurm-{self.parts}_{task}.out"
        path = self.where / name
        return path.read_text() if path.exists() else ""

    def pending(self) -> list[str]:
        ids = ",".join((self.init, self.parts, self.final))
        out = slurm_cmd("squeue", "-h", "-j", ids, "-o", "%i %T %r")
        never = [x for x in out.splitlines() if "DependencyNeverSatisfied" in x]
        assert not never, f"a job failed, so {never} never runs: {self.logs()}"
        return out.splitlines()

    def logs(self) -> str:
        return "\n".join(f"--- part {i}\n{self.log(i)}" for i in range(NPARTS))


def test_the_documented_job_array_finishes_after_a_requeue_and_a_time_limit(
    slurm: None, tmp_path: Path
) -> None:
    x = np.arange(np.prod(SHAPE), dtype="float32").reshape(SHAPE)
    src, dst, flags, bin_dir = (tmp_path / n for n in ("src.zarr", "dst.zarr", "flags", "bin"))
    flags.mkdir()
    bin_dir.mkdir()
    shardwise.write_array(x, src, chunks=(16, 16), shards=(SHARD, SHARD))
    for name in ("convert.sh", "part.sh"):
        (tmp_path / name).write_text(doc_script(name))
    wrapper(bin_dir, flags)
    env = {k: v for k, v in os.environ.items() if k not in TASK_ID_VARS}
    env.update(
        PATH=f"{bin_dir}:{Path(sys.executable).parent}:{env['PATH']}",
        SRC=str(src), DST=str(dst), N=str(NPARTS), CPUS="1", SHARDS=f"{SHARD},{SHARD}",
        CHUNKS="16,16",
    )  # fmt: skip
    sub = subprocess.run(["bash", "convert.sh"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    jobs = Jobs(sub.stdout, tmp_path)
    try:
        run_the_array(jobs, dst, flags)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{jobs.logs()}") from e
    finally:
        subprocess.run(["scancel", jobs.init, jobs.parts, jobs.final], check=False)
    check_the_outcome(jobs, src, dst, x)


def mid_write(jobs: Jobs, dst: Path, flags: Path, part: int) -> bool:
    assert jobs.pending()  # fails at once when a job failed
    return (flags / f"part{part}.held").exists() and committed(dst, part) >= 1


def run_the_array(jobs: Jobs, dst: Path, flags: Path) -> None:
    wait_until(lambda: mid_write(jobs, dst, flags, 0), "part 0 mid-write")
    slurm_cmd("scontrol", "requeue", f"{jobs.parts}_0")
    wait_until(lambda: mid_write(jobs, dst, flags, 1), "part 1 mid-write")
    # its time limit now: 2 minutes from its start, inside --signal's 120 s, so SLURM sends the
    # SIGTERM at its next check (every 30 s), well before the limit itself
    slurm_cmd("scontrol", "update", f"JobId={jobs.parts}_1", "TimeLimit=2")
    wait_until(lambda: "stopping" in jobs.log(1), "part 1 SIGTERMed by its time limit", 120)
    (flags / "part1.go").touch()  # the held task commits, as a running one does when stopped
    wait_until(lambda: not jobs.pending(), "the jobs done", timeout=300)


def check_the_outcome(jobs: Jobs, src: Path, dst: Path, x: np.ndarray) -> None:
    first0, _, rerun0 = jobs.log(0).partition("restarts 1")
    assert "DUE TO JOB REQUEUE" in first0  # requeued while running
    first1, _, rerun1 = jobs.log(1).partition("restarts 1")
    assert "stopped by SIGTERM: the shards done are kept" in first1
    assert "part.sh: part 1 stopped by SIGTERM: requeueing" in first1  # exit 143, requeued
    assert "took over" not in rerun1  # the orderly stop released its lease
    for log in (rerun0, rerun1):  # the requeued runs resumed, skipping what was stored
        assert re.search(r"[1-3] done before \(resumed\)", log), log
    for part in (2, 3):  # undisturbed: one run each
        assert "restarts 0" in jobs.log(part) and "restarts 1" not in jobs.log(part)
    assert ": OK; 16 shards stored (16 recorded)" in jobs.log(), jobs.log()  # finalize's verify
    status = subprocess.run([*exe(), "batch", "status", str(dst)], capture_output=True, text=True)
    assert "finalized at" in status.stdout and "no batch open" in status.stdout, status.stdout
    verify = subprocess.run([*exe(), "verify", str(dst)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    np.testing.assert_array_equal(shardwise.open_array(dst).compute(), x)
    np.testing.assert_array_equal(shardwise.read_array(src), x)  # the source untouched
