#!/usr/bin/env python
"""The staged write strategy: peak memory per task, time and bytes moved between workers.

W1 geometry (uint16 1024^3, inner chunks 64^3) from 128^3 dask chunks, in 256^3 shards (32 MiB)
and in 1024^3 shards (one 2 GiB shard), on threads and on a 2-process LocalCluster; and the ZEP 2
geometry scaled to this machine (uint8, 4 GiB in one shard from 256^3 chunks). The data is made
inside the tasks (a smooth ramp plus noise), so the source never exists whole.

Figures per case (one JSON line each, and a table):

* ``task_peak_blocks``: peak memory of the largest task, as a multiple of one dask block, measured
  with tracemalloc on the synchronous scheduler (one task at a time; the writer's allocations
  plus the generated block);
* ``seconds`` and ``GB/s`` (raw bytes / wall time) on the scheduler of the case;
* ``rss_peak_MiB``: the process's (threads) or each worker's (cluster) peak RSS;
* ``moved_MiB`` vs ``stored_MiB``: bytes the workers sent each other
  (``transfer_outgoing_bytes_total``) against the bytes stored (cluster only).

Usage::

    python benchmarks/staged.py [--small] [--cases w1-256,w1-1024,zep2]
        [--schedulers threads,cluster] [--strategies staged,direct]
        [--out results/staged.jsonl] [--dir /tmp]

``--small`` runs the same cases on arrays 4x smaller per side (seconds, for checking the script).
The direct strategy is skipped where one of its tasks would not fit the memory budget.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import tracemalloc
from typing import Any

import numpy as np

CASES: dict[str, dict[str, Any]] = {
    # name: shape, dtype, inner chunks, shards, dask chunks
    "w1-256": dict(shape=(1024,) * 3, dtype="uint16", inner=64, shards=256, block=128),
    "w1-1024": dict(shape=(1024,) * 3, dtype="uint16", inner=64, shards=1024, block=128),
    "zep2": dict(shape=(2048, 2048, 1024), dtype="uint8", inner=64, shards=None, block=256),
}


def smooth_noise(shape: tuple[int, ...], origin: tuple[int, ...], dtype: str) -> np.ndarray:
    grids = np.ogrid[tuple(slice(o, o + n) for o, n in zip(origin, shape, strict=True))]
    top = np.iinfo(dtype).max
    ramp = sum(((g * (5 + 2 * i)) % (top // 4)).astype(dtype) for i, g in enumerate(grids))
    rng = np.random.default_rng([7, *origin])
    noise = rng.integers(0, 16, shape, dtype=dtype)
    return np.asarray(ramp + noise, dtype=dtype)


def _gen(dtype: str, block_info: Any = None) -> np.ndarray:
    info = block_info[None]
    origin = tuple(lo for lo, _ in info["array-location"])
    return smooth_noise(tuple(info["chunk-shape"]), origin, dtype)


def source(case: dict[str, Any]) -> Any:
    import dask.array as da

    shape, dtype = case["shape"], case["dtype"]
    chunks = da.core.normalize_chunks((case["block"],) * len(shape), shape)
    return da.map_blocks(
        _gen, dtype, dtype=dtype, chunks=chunks, meta=np.empty((0,) * len(shape), dtype)
    )


def geometry(name: str, small: bool) -> dict[str, Any]:
    case = dict(CASES[name])
    if small:
        case["shape"] = tuple(n // 4 for n in case["shape"])
        case["inner"] //= 2
        case["block"] //= 4
        if case["shards"]:
            case["shards"] //= 4
    if case["shards"] is None:  # one shard holds the whole array
        case["shards_shape"] = case["shape"]
    else:
        case["shards_shape"] = (case["shards"],) * len(case["shape"])
    return case


def write_kwargs(case: dict[str, Any], strategy: str) -> dict[str, Any]:
    from zarr.codecs import ZstdCodec

    nd = len(case["shape"])
    return dict(
        chunks=(case["inner"],) * nd,
        shards=case["shards_shape"],
        compressors=[ZstdCodec(level=1)],
        strategy=strategy,
    )


def block_bytes(case: dict[str, Any]) -> int:
    return case["block"] ** len(case["shape"]) * np.dtype(case["dtype"]).itemsize


def raw_bytes(case: dict[str, Any]) -> int:
    return math.prod(case["shape"]) * np.dtype(case["dtype"]).itemsize


def task_peak(case: dict[str, Any], strategy: str, root: str) -> int:
    """Peak traced memory of the whole write on the synchronous scheduler: one task at a time."""
    import dask

    import shardwise

    warm = os.path.join(root, "warm")  # lazy imports and the thread's stream buffer: fixed costs
    small = dict(case, shape=(case["inner"] * 2,) * len(case["shape"]), block=case["inner"])
    small["shards_shape"] = small["shape"]
    with dask.config.set(scheduler="sync"):
        shardwise.write_array(source(small), warm, **write_kwargs(small, strategy))
        tracemalloc.start()
        try:
            shardwise.write_array(
                source(case), os.path.join(root, "peak"), **write_kwargs(case, strategy)
            )
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def run(case: dict[str, Any], strategy: str, scheduler: str, root: str) -> dict[str, Any]:
    import dask

    import shardwise

    out: dict[str, Any] = {}
    target = os.path.join(root, "a.zarr")
    if scheduler == "threads":
        job = shardwise.plan_write(source(case), target, **write_kwargs(case, strategy))
        out["job"] = repr(job)
        sampler = RssSampler()
        with dask.config.set(scheduler="threads"):
            rep = shardwise.write_array(source(case), target, **write_kwargs(case, strategy))
        out["rss_peak_MiB"] = round(sampler.stop() / 2**20, 1)
        out["rss_start_MiB"] = round(sampler.start_rss / 2**20, 1)
    else:
        from distributed import Client, LocalCluster

        with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            client.run(_noop)
            job = shardwise.plan_write(source(case), target, **write_kwargs(case, strategy))
            out["job"] = repr(job)
            before = client.run(_moved)
            client.run(_start_sampler)
            rep = shardwise.write_array(source(case), target, **write_kwargs(case, strategy))
            after = client.run(_moved)
            out["moved_MiB"] = round((sum(after.values()) - sum(before.values())) / 2**20, 1)
            got = client.run(_stop_sampler).values()
            out["rss_peak_MiB"] = [round(peak / 2**20, 1) for peak, _ in got]
            out["rss_start_MiB"] = [round(start / 2**20, 1) for _, start in got]
    out["seconds"] = round(rep.seconds, 2)
    out["GB/s"] = round(raw_bytes(case) / rep.seconds / 1e9, 3)
    out["stored_MiB"] = round(rep.bytes_stored / 2**20, 1)
    out["shards_written"] = rep.shards_written
    return out


def _noop() -> None:
    return None


def _moved(dask_worker: Any) -> float:
    return float(getattr(dask_worker, "transfer_outgoing_bytes_total", 0))


class RssSampler:
    """The process's peak resident memory, sampled every 5 ms (``ru_maxrss`` is no use in a
    spawned worker: it starts from its parent's peak)."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.start_rss = self.peak = int(self.proc.memory_info().rss)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, int(self.proc.memory_info().rss))

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


def _start_sampler(dask_worker: Any) -> None:
    dask_worker._staged_bench_rss = RssSampler()


def _stop_sampler(dask_worker: Any) -> tuple[int, int]:
    sampler: RssSampler = dask_worker._staged_bench_rss
    return sampler.stop(), sampler.start_rss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--small", action="store_true", help="4x smaller per side (a quick check)")
    ap.add_argument("--cases", default="w1-256,w1-1024,zep2")
    ap.add_argument("--schedulers", default="threads,cluster")
    ap.add_argument("--strategies", default="staged,direct")
    ap.add_argument("--out", default=None, help="append JSON lines here")
    ap.add_argument("--dir", default=None, help="where the arrays go (deleted after each case)")
    ap.add_argument("--no-peak", action="store_true", help="skip the tracemalloc runs")
    args = ap.parse_args(argv)

    import shardwise

    rows = []
    for name in args.cases.split(","):
        case = geometry(name, args.small)
        for strategy in args.strategies.split(","):
            probe = tempfile.mkdtemp(dir=args.dir)
            try:
                job = shardwise.plan_write(
                    source(case), os.path.join(probe, "p"), **write_kwargs(case, strategy)
                )
            except shardwise.PlanError as e:
                print(f"{name} {strategy}: skipped ({e})", file=sys.stderr)
                continue
            finally:
                shutil.rmtree(probe, ignore_errors=True)
            peak = None
            if not args.no_peak:
                root = tempfile.mkdtemp(dir=args.dir)
                try:
                    peak = task_peak(case, strategy, root)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
            for scheduler in args.schedulers.split(","):
                root = tempfile.mkdtemp(dir=args.dir)
                try:
                    got = run(case, strategy, scheduler, root)
                except shardwise.PlanError as e:  # does not fit this scheduler's workers
                    print(f"{name} {strategy} {scheduler}: skipped ({e})", file=sys.stderr)
                    continue
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                row = {
                    "case": name + ("-small" if args.small else ""),
                    "strategy": job.strategy,
                    "scheduler": scheduler,
                    "shape": case["shape"],
                    "shards": case["shards_shape"],
                    "block_MiB": round(block_bytes(case) / 2**20, 2),
                    "shard_MiB": round(
                        math.prod(case["shards_shape"]) * np.dtype(case["dtype"]).itemsize / 2**20,
                        1,
                    ),
                    "task_peak_MiB": None if peak is None else round(peak / 2**20, 1),
                    "task_peak_blocks": None
                    if peak is None
                    else round(peak / block_bytes(case), 2),
                    **got,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    cols = [
        "case",
        "strategy",
        "scheduler",
        "shard_MiB",
        "block_MiB",
        "task_peak_blocks",
        "seconds",
        "GB/s",
        "rss_start_MiB",
        "rss_peak_MiB",
        "moved_MiB",
        "stored_MiB",
    ]
    print("\n| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
