#!/usr/bin/env python
"""What conditional shard commits cost: N processes writing shard-splitting slabs at once.

    python benchmarks/region_writes.py [--small] [--procs 6] [--reps 3] [--dir /path/to/disk]

Every repetition creates an empty array of ``procs * slab`` rows (shards of ``shard`` rows) and
starts ``procs`` independent processes; after a barrier each writes its own slab of ``slab`` rows
with ``shardwise.write_array(..., region=..., mode="r+")``. Slabs do not line up with shards, so
neighbours share a shard. Two modes, repetitions interleaved: ``conditional`` (the default: a
shared shard is read with its generation, merged and committed only if unchanged) and
``unconditional`` (the check turned off, as a plain read-modify-write: fast, and loses updates).
Wall time runs from the barrier to the last writer's return. Prints a markdown table: median wall
time, its ratio, rows lost (rows whose values differ from what their writer wrote) and conflicts
retried (summed ``WriteReport.conflicts_retried``).

``--small`` is a quick run (a few MB in all); the default size is 6 x 85 x 512 x 512 float32
(535 MB raw, zstd level 3).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def slab_data(rows: slice, width: int, rep: int) -> np.ndarray:
    n = rows.stop - rows.start
    base = np.arange(rows.start, rows.stop, dtype="float32")[:, None, None] + 1000 * rep
    noise = np.random.default_rng(rows.start + rep).random((n, width, width), dtype="float32")
    return base + noise


def writer(
    idx: int, root: str, args: dict[str, Any], conditional: bool, barrier: Any, out: Any
) -> None:
    import shardwise
    import shardwise.storage.conditional

    shardwise.storage.conditional.ENABLED = conditional
    slab, width, rep = args["slab"], args["width"], args["rep"]
    rows = slice(idx * slab, (idx + 1) * slab)
    x = slab_data(rows, width, rep)
    # first-call costs (lazy imports, thread pools) are paid before the clock starts
    warm = f"{root}.warm-{idx}"
    shardwise.write_array(np.ones((4, 4), "float32"), warm, chunks=(2, 2), shards=(2, 2))
    shardwise.write_array(
        np.ones((1, 4), "float32"), warm, region=(slice(1, 2), slice(None)), mode="r+"
    )
    shutil.rmtree(warm, ignore_errors=True)
    barrier.wait(timeout=600)
    t0 = time.time()
    rep_ = shardwise.write_array(x, root, region=(rows, slice(None), slice(None)), mode="r+")
    out.put((idx, t0, time.time(), rep_.conflicts_retried))


def one(root: Path, conditional: bool, a: dict[str, Any]) -> dict[str, Any]:
    import zarr

    import shardwise

    shutil.rmtree(root, ignore_errors=True)
    procs, slab, width = a["procs"], a["slab"], a["width"]
    n = procs * slab
    zarr.create_array(
        root,
        shape=(n, width, width),
        dtype="float32",
        chunks=(a["chunk"], min(128, width), min(128, width)),
        shards=(a["shard"], width, width),
        compressors=zarr.codecs.ZstdCodec(level=3),
        fill_value=0,
    )
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["shardwise", "numpy", "dask.array", "zarr"])
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    jobs = [
        ctx.Process(target=writer, args=(i, str(root), a, conditional, barrier, out))
        for i in range(procs)
    ]
    for j in jobs:
        j.start()
    got = []
    while len(got) < len(jobs):
        try:
            got.append(out.get(timeout=1))
        except queue.Empty:
            dead = [j.exitcode for j in jobs if j.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a writer process failed (exit codes {dead})") from None
    for j in jobs:
        j.join(timeout=60)
    wall = max(g[2] for g in got) - min(g[1] for g in got)
    stored = shardwise.open_array(root).compute()
    lost = 0
    for i in range(procs):
        rows = slice(i * slab, (i + 1) * slab)
        lost += int((stored[rows] != slab_data(rows, width, a["rep"])).any(axis=(1, 2)).sum())
    return dict(wall=wall, lost=lost, conflicts=sum(g[3] for g in got))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--small", action="store_true", help="a quick run: 64 x 64 rows")
    p.add_argument("--procs", type=int, default=6)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--slab", type=int, default=85)
    p.add_argument("--shard", type=int, default=64)
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--width", type=int, default=None, help="row width (default 512; small 64)")
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ns = p.parse_args()
    width = ns.width or (64 if ns.small else 512)
    base = Path(tempfile.mkdtemp(prefix="region-writes-", dir=ns.dir))
    results: dict[str, list[dict[str, Any]]] = {"conditional": [], "unconditional": []}
    try:
        for rep in range(ns.reps):
            for mode in results:
                a = dict(
                    procs=ns.procs,
                    slab=ns.slab,
                    shard=ns.shard,
                    chunk=ns.chunk,
                    width=width,
                    rep=rep,
                )
                r = one(base / "a.zarr", mode == "conditional", a)
                results[mode].append(r)
                print(f"rep {rep} {mode}: {r}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    raw = ns.procs * ns.slab * width * width * 4
    print(
        f"\n{ns.procs} processes x {ns.slab}-row slabs, shards of {ns.shard} rows, "
        f"{width}x{width} float32 rows ({raw / 1e6:.0f} MB raw), {ns.reps} reps, medians\n"
    )
    print("| mode | wall (s) | x conditional | rows lost (all reps) | conflicts retried |")
    print("|---|---|---|---|---|")
    ref = statistics.median(r["wall"] for r in results["conditional"])
    for mode, rs in results.items():
        wall = statistics.median(r["wall"] for r in rs)
        print(
            f"| {mode} | {wall:.2f} | {wall / ref:.2f} | {sum(r['lost'] for r in rs)} | "
            f"{sum(r['conflicts'] for r in rs)} |"
        )


if __name__ == "__main__":
    main()
