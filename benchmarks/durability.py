#!/usr/bin/env python
"""What ``fsync=True`` costs: the same writes with and without it, repetitions interleaved.

    python benchmarks/durability.py [--reps 5] [--dir /path/on/the/disk/to/test]

``fsync=True`` makes every shard durable before the write returns: the temp file is fsynced,
renamed onto the shard, then its directory is fsynced (and the parent of every directory the write
created). Prints a markdown table of median wall times and the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

import shardwise

WORKLOADS: dict[str, dict[str, Any]] = {
    # a few large shards: the data dominates
    "large shards: uint16 512x512x256, shards 128^3 (32 x 4 MiB raw)": dict(
        shape=(512, 512, 256), dtype="uint16", chunks=(32, 32, 32), shards=(128, 128, 128)
    ),
    # many small shards: one fsync per small file
    "small shards: float32 2048x2048, shards 128^2 (256 x 64 KiB raw)": dict(
        shape=(2048, 2048), dtype="float32", chunks=(32, 32), shards=(128, 128)
    ),
}


def source(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype("float32") * 100 + 1000
    return x.astype(dtype)


def one(x: np.ndarray, root: Path, fsync: bool, wl: dict[str, Any]) -> float:
    shutil.rmtree(root, ignore_errors=True)
    src = da.from_array(x, chunks=wl["shards"])
    t = time.perf_counter()
    shardwise.write_array(
        src,
        root,
        chunks=wl["chunks"],
        shards=wl["shards"],
        fsync=fsync,
        compressors=zarr.codecs.ZstdCodec(level=3),
        mode="w",
    )
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="shardwise-durability-", dir=a.dir))
    rows = ["| workload | fsync=False (s) | fsync=True (s) | ratio |", "|---|---|---|---|"]
    try:
        with dask.config.set(scheduler="threads"):
            for name, wl in WORKLOADS.items():
                x = source(wl["shape"], wl["dtype"])
                one(x, base / "warm", False, wl)
                times: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(a.reps):
                    for fs in (False, True):
                        times[fs].append(one(x, base / f"fsync-{fs}", fs, wl))
                off, on = statistics.median(times[False]), statistics.median(times[True])
                rows.append(f"| {name} | {off:.2f} | {on:.2f} | {on / off:.2f}x |")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
