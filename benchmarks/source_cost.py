"""What a misaligned source costs before any write: the dask graph alone, no encoding, no store.

For each workload the benchmark's dask source (``workloads.dask_src``: every block copied out of
the page-cached ``.npy``) is computed into shard-sized blocks and each block dropped (one trivial
task per shard), with the source's chunks equal to the shards ("aligned") or the sub-shard chunks
of ``bench.py``'s ``mis`` cases ("misaligned": ``rechunk(method="tasks")`` to the shards), on the
threaded scheduler and on a 2-process LocalCluster (1 thread each, as ``bench.py``'s cluster
cases). The difference is what the source and dask cost any writer of those chunks; compare it
with the difference between ``bench.py``'s ``s-w-mis`` and ``s-w-shards`` (or ``s-w-mis-dist`` and
``s-w-dist``) to see what is left for the write itself.

    python benchmarks/source_cost.py [--workloads W3,W1] [--reps 3] [--out results/x.jsonl]

Each scheduler runs in its own process; repetitions interleave aligned and misaligned.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as WL


def graph(wl: str, kind: str):  # type: ignore[no-untyped-def]
    W = WL.WORKLOADS[wl]
    factor = 4 if wl == "W3" else 2  # bench.py's "mis" chunks: 256² for W3, 128³ for W1
    chunks = W["shard"] if kind == "aligned" else tuple(s // factor for s in W["shard"])
    src = WL.dask_src(wl, chunks)
    x = src if kind == "aligned" else src.rechunk(W["shard"], method="tasks")
    one = tuple((1,) * len(c) for c in x.chunks)
    return x.map_blocks(lambda b: np.zeros((1,) * b.ndim), chunks=one, dtype=float)


def one(wl: str, scheduler: str, reps: int) -> list[dict]:
    import dask

    out = []
    if scheduler == "distributed":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client = Client(cluster)
        ctx = dask.config.set({})
    else:
        cluster = client = None
        ctx = dask.config.set(scheduler="threads")
    try:
        with ctx:
            graph(wl, "aligned").compute()  # warm: imports, the page cache, the workers
            for rep in range(reps):
                for kind in ("aligned", "misaligned"):
                    g = graph(wl, kind)
                    t0 = time.perf_counter()
                    g.compute()
                    wall = time.perf_counter() - t0
                    out.append(
                        dict(workload=wl, scheduler=scheduler, kind=kind, rep=rep, wall_s=wall)
                    )
    finally:
        if client is not None:
            client.close()
            cluster.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="W3,W1")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--one", nargs=2, metavar=("WORKLOAD", "SCHEDULER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        for rec in one(args.one[0], args.one[1], args.reps):
            print(json.dumps(rec))
        return
    recs = []
    for wl in args.workloads.split(","):
        for sched in ("threads", "distributed"):
            cmd = [sys.executable, __file__, "--reps", str(args.reps), "--one", wl, sched]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            recs += [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    if args.out:
        with open(args.out, "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    print("| workload | scheduler | aligned s | misaligned s | difference s |")
    print("|---|---|---|---|---|")
    for wl in args.workloads.split(","):
        for sched in ("threads", "distributed"):
            t = {
                k: [
                    r["wall_s"]
                    for r in recs
                    if (r["workload"], r["scheduler"], r["kind"]) == (wl, sched, k)
                ]
                for k in ("aligned", "misaligned")
            }
            a, m = statistics.median(t["aligned"]), statistics.median(t["misaligned"])
            spread = {k: f"{min(v):.2f}-{max(v):.2f}" for k, v in t.items()}
            print(
                f"| {wl} | {sched} | {a:.2f} ({spread['aligned']}) "
                f"| {m:.2f} ({spread['misaligned']}) | {m - a:+.2f} |"
            )


if __name__ == "__main__":
    main()
