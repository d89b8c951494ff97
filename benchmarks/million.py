"""A million shards from one call: graph build, tasks, client and scheduler memory, wall time.

Each case runs in a fresh process and writes ``N`` tiny shards (uint8 rows of 64, one shard a
row, two 32-byte inner chunks, no compression: the shard count is the point, not the bytes):

``runs``
    ``write_array`` of a source without a dask graph (an object with ``shape``, ``dtype`` and
    ``__getitem__`` computing each window: a ramp of the row index), read window by window inside
    tasks that write runs of neighbouring shards (engine/runs.py).
``per-shard``
    the same values as a dask array with one chunk per shard: one source task and one write
    task per shard (the path every source took before runs).
``dask-to-zarr``
    ``dask.array.store`` of that dask array into a zarr-python sharded array of the same
    layout (created first with ``zarr.create_array``), ``compute=False``: dask's own graph, for
    comparison.
``xarray-to-zarr``
    xarray's ``Dataset.to_zarr`` of that dask array as a variable, with the same ``chunks`` and
    ``shards`` encoding, ``compute=False``.

Figures per case: the graph build (``compute=False``) in seconds, the graph's tasks, the
client's traced Python memory at the build's peak (tracemalloc) and its resident growth; with
``--run``, the wall time of computing it on this process's threads (local files) and the shards
stored; with ``--scheduler``, the same graph computed on a ``LocalCluster`` of 2 worker
processes and the scheduler process's resident high-water mark over its baseline, read in the
scheduler itself.

Usage::

    python benchmarks/million.py run [--sizes 1000,10000,50000,1000000] [--cases runs,per-shard]
        [--run] [--scheduler] [--reps 3] [--out results/million-DATE.jsonl]
    python benchmarks/million.py report FILE.jsonl

A per-shard build above 50,000 shards takes minutes and gigabytes: pass those sizes only if you
mean it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
WIDTH = 64
CASES = ("runs", "per-shard", "dask-to-zarr", "xarray-to-zarr")


class Ramp:
    """Rows of their row index (mod 251, never the fill value 0): a source with no graph."""

    def __init__(self, rows: int) -> None:
        self.shape = (rows, WIDTH)
        self.dtype = np.dtype("u1")
        self.ndim = 2

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        rows = np.arange(key[0].start, key[0].stop, dtype="i8") % 251 + 1
        return np.broadcast_to(rows[:, None], (len(rows), key[1].stop - key[1].start)).astype("u1")


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _scheduler_hwm_reset() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _rss()


def _scheduler_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def one(case: str, n: int, run: bool, scheduler: bool, root: str) -> dict[str, Any]:
    """Build (and run) one case in this process."""
    import tracemalloc

    import dask
    import dask.array as da

    import shardwise

    kw: dict[str, Any] = dict(chunks=(1, WIDTH // 2), shards=(1, WIDTH), compressors=None)
    path = f"{root}/{case}-{n}.zarr"
    out: dict[str, Any] = {"case": case, "shards": n}
    src: Any = Ramp(n)
    if case != "runs":
        src = da.from_array(Ramp(n), chunks=(1, WIDTH), asarray=True, name=f"ramp-{n}")
    if case == "dask-to-zarr":
        import zarr

        target = zarr.create_array(
            path,
            shape=(n, WIDTH),
            dtype="u1",
            chunks=(1, WIDTH // 2),
            shards=(1, WIDTH),
            compressors=None,
            fill_value=0,
        )
    rss0 = _rss()
    tracemalloc.start()
    started = time.perf_counter()
    if case == "dask-to-zarr":
        graph = da.store(src, target, compute=False, lock=False)
    elif case == "xarray-to-zarr":
        import xarray as xr

        enc = {"v": {"chunks": kw["chunks"], "shards": kw["shards"], "compressors": None}}
        ds = xr.Dataset({"v": (("y", "x"), src)})
        graph = ds.to_zarr(path, zarr_format=3, encoding=enc, compute=False, consolidated=False)
    else:
        graph = shardwise.write_array(src, path, compute=False, **kw)
    out["build_s"] = time.perf_counter() - started
    out["traced_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    out["rss_growth_mb"] = (_rss() - rss0) / 1e6
    out["tasks"] = len(dict(graph.__dask_graph__()))
    if scheduler:
        from distributed import Client, LocalCluster

        with (
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as lc,
            Client(lc) as client,
        ):
            base = client.run_on_scheduler(_scheduler_hwm_reset)
            started = time.perf_counter()
            client.compute(graph).result()
            out["cluster_wall_s"] = time.perf_counter() - started
            out["scheduler_peak_mb"] = (client.run_on_scheduler(_scheduler_hwm) - base) / 1e6
    elif run:
        started = time.perf_counter()
        with dask.config.set(scheduler="threads"):
            rep = graph.compute()
        out["wall_s"] = time.perf_counter() - started
        if case in ("runs", "per-shard"):  # shardwise's report (the others return None)
            out["stored"] = rep.shards_written
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--sizes", default="1000,10000,50000,1000000")
    r.add_argument("--cases", default="runs,per-shard")
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--run", action="store_true", help="also compute each graph (local files)")
    r.add_argument("--scheduler", action="store_true", help="compute on a LocalCluster")
    r.add_argument("--max-per-shard", type=int, default=50_000)
    r.add_argument("--out", default=None)
    c = sub.add_parser("child")
    c.add_argument("case")
    c.add_argument("n", type=int)
    c.add_argument("--run", action="store_true")
    c.add_argument("--scheduler", action="store_true")
    p = sub.add_parser("report")
    p.add_argument("file")
    opts = ap.parse_args()
    if opts.cmd == "child":
        with tempfile.TemporaryDirectory() as root:
            print(json.dumps(one(opts.case, opts.n, opts.run, opts.scheduler, root)))
        return
    if opts.cmd == "report":
        report([json.loads(line) for line in Path(opts.file).read_text().splitlines()])
        return
    cases = opts.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        sys.exit(f"unknown cases {unknown}: choose from {CASES}")
    sizes = [int(s) for s in opts.sizes.split(",")]
    out = Path(opts.out or HERE / "results" / f"million-{time.strftime('%Y-%m-%d')}.jsonl")
    rows = []
    for rep in range(opts.reps):
        for n in sizes:
            for case in cases:
                if case != "runs" and n > opts.max_per_shard:
                    continue
                args = [sys.executable, __file__, "child", case, str(n)]
                args += ["--run"] * opts.run + ["--scheduler"] * opts.scheduler
                got = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ))
                if got.returncode:
                    sys.exit(got.stderr[-3000:])
                row = json.loads(got.stdout.strip().splitlines()[-1]) | {"rep": rep}
                print(json.dumps(row), flush=True)
                rows.append(row)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    report(rows)


def report(rows: list[dict[str, Any]]) -> None:
    """Medians (min-max) per case and size."""
    keys = [
        "build_s",
        "tasks",
        "traced_peak_mb",
        "rss_growth_mb",
        "wall_s",
        "cluster_wall_s",
        "scheduler_peak_mb",
    ]
    print("| case | shards | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 2) + "|")
    for case in CASES:
        for n in sorted({r["shards"] for r in rows if r["case"] == case}):
            got = [r for r in rows if r["case"] == case and r["shards"] == n]
            cells = []
            for k in keys:
                vals = [r[k] for r in got if k in r]
                if not vals:
                    cells.append("-")
                elif k == "tasks":
                    cells.append(f"{int(statistics.median(vals)):,}")
                else:
                    cells.append(f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})")
            print(f"| {case} | {n:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
