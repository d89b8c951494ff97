#!/usr/bin/env python
"""Concurrent appends: rows lost (must be 0) and time per append, N processes appending at once.

    python benchmarks/appends.py [--small] [--procs 2,4,8] [--reps 5] [--dir /path/to/disk]
        [--out FILE.jsonl]

Every repetition creates a Dataset of ``rows`` rows (a ``rows x width x width`` float32
variable, a 1-d variable and the ``t`` coordinate; shards of ``shard`` rows) and starts N
independent processes that, after a barrier, each append ``rows`` rows of their own values with
``shardwise.to_zarr(..., append_dim="t")``. Appends are reserved in the arrays' metadata by
conditional commits, so all land, one after another. Two modes, repetitions interleaved:
``conditional`` (the default) and ``unconditional`` (conditional commits turned off: every
writer keeps the length it found, and rows are lost). Prints a markdown table per N and mode:
rows lost (coordinate values missing from the result), median seconds per append (each
writer's own call), the wall time from the barrier to the last return, and reservation commits
redone; ``--out`` appends one JSON line per repetition. ``--small`` is a quick smoke run (a few
MB).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def dataset(ids: np.ndarray, width: int) -> Any:
    import xarray as xr

    v = np.broadcast_to(ids[:, None, None].astype("float32"), (len(ids), width, width))
    return xr.Dataset(
        {"v": (("t", "y", "x"), v.copy()), "w": (("t",), ids + 0.5)}, coords={"t": ids}
    )


def writer(idx: int, root: str, args: dict[str, Any], barrier: Any, out: Any) -> None:
    import dask

    import shardwise
    import shardwise.storage.conditional as cond

    cond.ENABLED = args["conditional"]
    redone = [0]

    def count(name: str, attempt: int) -> None:
        redone[0] += name.endswith("zarr.json") and attempt > 0

    cond.before_commit = count
    dask.config.set(scheduler="synchronous")
    ds = dataset((idx + 1) * 1_000_000 + np.arange(args["rows"]), args["width"])
    barrier.wait(timeout=600)
    t0 = time.perf_counter()
    shardwise.to_zarr(ds, root, append_dim="t")
    out.put((idx, time.perf_counter() - t0, time.time(), redone[0]))


def one_rep(base: Path, procs: int, args: dict[str, Any]) -> dict[str, Any]:
    import shutil

    import shardwise

    root = base / f"p{procs}.zarr"
    shutil.rmtree(root, ignore_errors=True)
    enc = {"v": {"shards": (args["shard"], args["width"], args["width"])}}
    shardwise.to_zarr(dataset(np.arange(args["rows"]), args["width"]), root, encoding=enc)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["shardwise", "xarray", "numpy", "zarr"])
    barrier, out = ctx.Barrier(procs + 1), ctx.Queue()
    jobs = [
        ctx.Process(target=writer, args=(i, str(root), args, barrier, out)) for i in range(procs)
    ]
    for j in jobs:
        j.start()
    barrier.wait(timeout=600)
    start = time.time()
    results = [out.get(timeout=600) for _ in range(procs)]
    for j in jobs:
        j.join(timeout=60)
    stored = set(shardwise.read_array(root, path="t").tolist())
    want = [(i + 1) * 1_000_000 + r for i in range(procs) for r in range(args["rows"])]
    shutil.rmtree(root, ignore_errors=True)
    return dict(
        lost=sum(v not in stored for v in want),
        per_append=statistics.median(r[1] for r in results),
        wall=max(r[2] for r in results) - start,
        redone=sum(r[3] for r in results),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--small", action="store_true", help="a quick smoke run (a few MB)")
    p.add_argument("--procs", default="2,4,8", help="writer counts (default 2,4,8)")
    p.add_argument("--reps", type=int, default=5, help="repetitions per count and mode")
    p.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    p.add_argument("--out", default=None, help="append a JSON line per repetition to this file")
    a = p.parse_args()
    args = dict(rows=10, width=64 if a.small else 256, shard=8)
    base = Path(a.dir or tempfile.mkdtemp(prefix="appends-"))
    print("| writers | mode | rows lost | s per append (median) | wall s (median) | redone |")
    print("|---|---|---|---|---|---|")
    for procs in (int(x) for x in a.procs.split(",")):
        runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for rep in range(a.reps):
            for conditional in (True, False):
                got = one_rep(base, procs, {**args, "conditional": conditional})
                runs[conditional].append(got)
                if a.out:
                    mode = "conditional" if conditional else "unconditional"
                    with open(a.out, "a") as f:
                        row = {"procs": procs, "mode": mode, "rep": rep, "small": a.small}
                        f.write(json.dumps({**row, **got}) + "\n")
        for conditional, rs in runs.items():
            mode = "conditional" if conditional else "unconditional"
            print(
                f"| {procs} | {mode} | {sum(r['lost'] for r in rs)} "
                f"| {statistics.median(r['per_append'] for r in rs):.3f} "
                f"| {statistics.median(r['wall'] for r in rs):.3f} "
                f"| {sum(r['redone'] for r in rs)} |"
            )


if __name__ == "__main__":
    main()
