#!/usr/bin/env python
"""What the lease heartbeat costs: W1 writes with it renewing often, at the default, and never.

    python benchmarks/heartbeat.py [--size small|full] [--reps 5] [--dir /path/to/write/under]

A write holds a lease whose heartbeat thread rewrites it every quarter of its expiry
(``SHARDWISE_LEASE_EXPIRY``, default 300 s; each beat is one small read and one small
conditional put). Three cases, each write in a fresh process, repetitions interleaved:

* ``never``: expiry 10^9 s, so no beat falls inside the write (the baseline);
* ``default``: expiry 300 s (a beat every 75 s);
* ``often``: expiry 0.4 s (a beat every 0.1 s, far more often than anyone would set it).

Each child counts the beats it made (``Lease.renew`` calls) and times the write in process; the
parent times the whole process (interpreter start and imports included). Prints a markdown table
of medians, spreads (min-max) and the ratio to ``never``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = {"never": "1e9", "default": "300", "often": "0.4"}

CHILD = r"""
import json, sys, time
sys.path.insert(0, {here!r})
import dask, zarr
import workloads as w
import shardwise
from shardwise.durability import lease as _lease

beats = [0]
renew = _lease.Lease.renew
def counted(self):
    beats[0] += 1
    return renew(self)
_lease.Lease.renew = counted

W = w.WORKLOADS["W1"]
src = w.dask_src("W1", W["shard"])
t = time.perf_counter()
with dask.config.set(scheduler="threads"):
    shardwise.write_array(src, {out!r}, chunks=W["inner"], shards=W["shard"],
                          compressors=zarr.codecs.ZstdCodec(level=w.ZSTD_LEVEL), mode="w")
print(json.dumps(dict(write_s=time.perf_counter() - t, beats=beats[0])))
"""


def one(case: str, out: Path, size: str) -> dict[str, float]:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "SHARDWISE_LEASE_EXPIRY": CASES[case], "BENCH_SIZE": size}
    code = CHILD.format(here=str(HERE), out=str(out))
    t = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    whole = time.perf_counter() - t
    row: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_s"] = whole
    return row


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--size", choices=("small", "full"), default="full")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    a = ap.parse_args()
    os.environ["BENCH_SIZE"] = a.size
    sys.path.insert(0, str(HERE))
    import workloads

    workloads.set_size(a.size)
    workloads.load_src("W1")  # generated once, before any timing
    base = Path(tempfile.mkdtemp(prefix="shardwise-heartbeat-", dir=a.dir))
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CASES}
    try:
        one("never", base / "warm", a.size)
        for _ in range(a.reps):
            for c in CASES:
                runs[c].append(one(c, base / c, a.size))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    base_write = statistics.median(r["write_s"] for r in runs["never"])
    print(f"W1 ({a.size}) writes, {a.reps} interleaved repetitions, fresh processes")
    print("| heartbeat | expiry (s) | beats | write (s) | whole process (s) | write ratio |")
    print("|---|---|---|---|---|---|")
    for c, rows in runs.items():
        w = [r["write_s"] for r in rows]
        p = [r["process_s"] for r in rows]
        beats = statistics.median(r["beats"] for r in rows)
        ratio = statistics.median(w) / base_write
        print(f"| {c} | {CASES[c]} | {beats:.0f} | {spread(w)} | {spread(p)} | {ratio:.3f}x |")


if __name__ == "__main__":
    main()
