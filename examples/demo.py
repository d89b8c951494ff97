"""Demo: write a sample array with dask to a local sharded store, read it back, print a report."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import dask.array as da
import numpy as np
import zarr

import shardwise


def main() -> int:
    if len(sys.argv) > 1:  # a directory the user names: kept
        out = Path(sys.argv[1])
        shutil.rmtree(out, ignore_errors=True)
        return run(out)
    with tempfile.TemporaryDirectory(prefix="shardwise-demo-") as tmp:
        code = run(Path(tmp) / "demo.zarr")
        print(f"(removed {tmp}; `python examples/demo.py DIR` writes into DIR and keeps it)")
    return code


def run(out: Path) -> int:
    rng = np.random.default_rng(0)
    # a smooth field plus noise, quantized: compresses like real measurements
    y, x = np.mgrid[0:2048, 0:2048].astype("float32")
    field = (np.sin(x / 97) + np.cos(y / 131) + rng.normal(0, 0.05, x.shape)).astype("float32")
    field = np.round(field * 256) / 256
    field[:512, :512] = 0  # one all-fill shard: not stored
    # dask chunks deliberately misaligned with the 512x512 shards
    source = da.from_array(field, chunks=(300, 700))
    mb = field.nbytes / 1e6
    print(f"writing float32 {field.shape} ({mb:.0f} MB), dask chunks {source.chunksize}")
    print("  inner chunks (64, 64), shards (512, 512), zstd level 3")
    report = shardwise.write_array(
        source,
        out,
        chunks=(64, 64),
        shards=(512, 512),
        compressors=zarr.codecs.ZstdCodec(level=3),
        dimension_names=["y", "x"],
        mode="w",
    )
    print(f"  {report}")
    # shard objects live under the array's chunk-key prefix "c/"; the writer's bookkeeping
    # (a journal of the shards written, for verify and resume) lives under ".shardwise/"
    files = [p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()]
    shards = [f for f in files if f.startswith("c/")]
    other = len(files) - len(shards) - 1
    print(
        f"  in {out}: zarr.json + {len(shards)} shard objects"
        + (f" + {other} bookkeeping files of the writer" if other else "")
    )

    t = time.perf_counter()
    lazy = shardwise.open_array(out)
    back = lazy.compute()
    print(
        f"read back with shardwise.open_array: {lazy.npartitions} shard-aligned tasks, "
        f"{time.perf_counter() - t:.2f} s, equal: {np.array_equal(back, field)}"
    )
    window = lazy[1000:1010, 1000:1010].compute()
    same = np.array_equal(window, field[1000:1010, 1000:1010])
    print(f"  a 10x10 window reads 1 inner chunk: equal: {same}")
    other = zarr.open_array(out, mode="r")[...]
    print(f"read back with zarr-python: equal: {np.array_equal(other, field)}")
    ok = np.array_equal(back, field) and np.array_equal(other, field)
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
