"""Time to build the write graph of the ZEP 2 example, never computed.

uint8 25000x18000x6000 (2.5 TiB), 64^3 inner chunks, 2048^3 shards (351 shards of 8 GiB), a dask
array of zeros in 512^3 chunks (21,168 blocks): ``write_array(..., compute=False)`` takes the
staged path (writes only the metadata) and ``plan_write`` prints the job. Prints the median of
``--reps`` builds of each, and the graph's task count (summed over its layers, without building
them).

Usage::

    python benchmarks/plan_time.py [--reps 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import dask.array as da

import shardwise

SHAPE, INNER, SHARDS, BLOCK = (25000, 18000, 6000), (64,) * 3, (2048,) * 3, 512


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None)
    opts = ap.parse_args()
    source = da.zeros(SHAPE, dtype="uint8", chunks=BLOCK)
    builds, plans, tasks = [], [], 0
    with tempfile.TemporaryDirectory(dir=opts.dir) as tmp:
        for i in range(opts.reps):
            started = time.perf_counter()
            delayed = shardwise.write_array(
                source, f"{tmp}/w{i}", chunks=INNER, shards=SHARDS, compute=False
            )
            builds.append(time.perf_counter() - started)
            tasks = sum(len(layer) for layer in delayed.__dask_graph__().layers.values())
            started = time.perf_counter()
            text = str(shardwise.plan_write(source, f"{tmp}/p{i}", chunks=INNER, shards=SHARDS))
            plans.append(time.perf_counter() - started)
    print(text)
    print(f"write_array(compute=False): median {statistics.median(builds):.3f} s of {opts.reps}")
    print(f"plan_write + print:         median {statistics.median(plans):.3f} s of {opts.reps}")
    print(f"graph: {tasks} tasks for {source.npartitions} blocks")


if __name__ == "__main__":
    main()
