#!/usr/bin/env python
"""Time from a kill to a finished array through the requeue path of a batch conversion.

    python benchmarks/requeue.py [--size 4096] [--parts 4] [--reps 3] [--dir D] [--slurm]

A source of ``size x size`` float32 (shards of 512, zstd) is converted with ``shardwise batch``
in ``parts`` parts. Once part 0 has committed a shard:

* processes (default): part 0 is SIGKILLed and run again with ``--resume``, as a requeued task
  would (it takes over the lease the killed run left); the other parts run meanwhile;
* ``--slurm``: docs/hpc.md's ``convert.sh`` and ``part.sh`` are submitted to the running SLURM
  (``servers/slurm.sh``) and part 0 is requeued with ``scontrol requeue``; SLURM reruns it.

The figure is the wall time from the kill (or the requeue) to the end of ``batch finalize``;
``rerun`` is the resumed run of part 0 alone. Prints one markdown row per repetition.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import shardwise

ROOT = Path(__file__).resolve().parents[1]
SHARD = 512


def cli() -> list[str]:
    found = shutil.which("shardwise", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "shardwise.cli"]


def env() -> dict[str, str]:
    # the part number comes from --part (or SLURM's array): none inherited from this shell
    skip = ("SHARDWISE_PART", "SLURM_ARRAY_TASK_ID", "PBS_ARRAY_INDEX", "PBS_ARRAYID")
    out = {k: v for k, v in os.environ.items() if k not in skip}
    out["PATH"] = f"{Path(sys.executable).parent}:{out.get('PATH', '')}"
    return out


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 600.0) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"requeue.py: {what}: not after {timeout:.0f} s")
        time.sleep(0.01)


def committed(dst: Path, rows: range) -> int:
    """Shard records stored in the shard rows ``rows`` (keys c/ROW/COL)."""
    top = dst / ".shardwise" / "shards" / "c"
    return sum(len(list((top / str(r)).iterdir())) for r in rows if (top / str(r)).is_dir())


def make_source(work: Path, size: int) -> Path:
    src = work / "src.zarr"
    if not src.exists():
        rng = np.random.default_rng(0)
        x = (rng.standard_normal((size, size)) * 100).astype("float32")
        shardwise.write_array(x, src, chunks=(128, 128), shards=(SHARD, SHARD))
    return src


def run(*args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env())
    if check and out.returncode != 0:
        raise SystemExit(f"requeue.py: {' '.join(map(str, args))} failed: {out.stderr[-2000:]}")
    return out


def processes(work: Path, src: Path, size: int, parts: int) -> dict[str, float]:
    """Part 0 SIGKILLed once it committed a shard, then rerun with --resume; then finalize."""
    dst = work / "dst.zarr"
    run(
        *cli(),
        "batch",
        "init",
        dst,
        "--source",
        src,
        "--parts",
        parts,
        "--shards",
        f"{SHARD},{SHARD}",
        "--chunks",
        "128,128",
        "--compressor",
        "zstd:3",
    )
    part = [*cli(), "batch", "part", str(dst), "--source", str(src), "--resume", "--no-progress"]
    procs = [
        subprocess.Popen(
            [*part, "--part", str(i)],
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(parts)
    ]
    rows0 = range(0, size // SHARD // parts or 1)
    wait_for(lambda: committed(dst, rows0) >= 1 or procs[0].poll() is not None, "part 0 commits")
    procs[0].send_signal(signal.SIGKILL)
    t0 = time.perf_counter()
    procs[0].wait()
    stored = committed(dst, rows0)
    again = run(*part, "--part", 0)  # the requeued task
    rerun = time.perf_counter() - t0
    for p in procs[1:]:
        if p.wait() != 0:
            raise SystemExit("requeue.py: a part that was not killed failed")
    run(*cli(), "batch", "finalize", dst)
    total = time.perf_counter() - t0
    took = "took over" in again.stderr
    return {
        "kill_to_finalized_s": total,
        "rerun_s": rerun,
        "took_over": float(took),
        "stored": stored,
    }


def slurm(work: Path, src: Path, size: int, parts: int) -> dict[str, float]:
    """docs/hpc.md's scripts through SLURM; part 0 requeued once it committed a shard."""
    dst = work / "dst.zarr"
    text = (ROOT / "docs" / "hpc.md").read_text()
    for name in ("convert.sh", "part.sh"):
        block = re.search(rf"```bash\n(#!/bin/bash\n(?:#SBATCH.*\n)?# {name}:.*?)```", text, re.S)
        assert block, name
        (work / name).write_text(block.group(1))
    e = dict(
        env(),
        SRC=str(src),
        DST=str(dst),
        N=str(parts),
        CPUS="1",
        SHARDS=f"{SHARD},{SHARD}",
        CHUNKS="128,128",
    )
    out = subprocess.run(["bash", "convert.sh"], cwd=work, env=e, capture_output=True, text=True)
    m = re.search(r"init (\d+), parts (\d+), finalize (\d+)", out.stdout)
    if m is None:
        raise SystemExit(f"requeue.py: convert.sh: {out.stderr}")
    ids = ",".join(m.groups())
    rows0 = range(0, size // SHARD // parts or 1)
    wait_for(lambda: committed(dst, rows0) >= 1, "part 0 commits")
    run("scontrol", "requeue", f"{m.group(2)}_0")
    t0 = time.perf_counter()
    stored = committed(dst, rows0)
    wait_for(lambda: run("squeue", "-h", "-j", ids).stdout.strip() == "", "the jobs done")
    total = time.perf_counter() - t0
    log = (work / f"slurm-{m.group(2)}_0.out").read_text()
    return {
        "kill_to_finalized_s": total,
        "rerun_s": float("nan"),
        "took_over": float("took over" in log),
        "stored": stored,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where the stores go (a temp dir)")
    ap.add_argument("--slurm", action="store_true", help="through the running SLURM")
    a = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(dir=a.dir, prefix="requeue-"))
    try:
        src = make_source(base, a.size)
        how = "SLURM requeue" if a.slurm else "SIGKILL + rerun"
        print(
            "| path | array | parts | part 0 shards stored at the kill | kill -> finalized (s) "
            "| rerun of the part (s) | took over |"
        )
        print("|---|---|---|---|---|---|---|")
        for rep in range(a.reps):
            work = base / f"rep{rep}"
            work.mkdir()
            r = (slurm if a.slurm else processes)(work, src, a.size, a.parts)
            print(
                f"| {how} | {a.size}^2 float32 | {a.parts} | {r['stored']:.0f} "
                f"| {r['kill_to_finalized_s']:.2f} "
                f"| {r['rerun_s']:.2f} | {'yes' if r['took_over'] else 'no'} |",
                flush=True,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
