"""What the inner-chunk checksum costs: write and full read with and without it.

Self-contained: the data is generated in this process (seeded), written to a temporary directory
and read back whole, for three inner chains (``bytes`` + ...):

* ``zstd``            zstd level 0 (zarr's default level), no checksum: the old default;
* ``zstd+checksum``   zstd's own frame checksum: the default now;
* ``zstd+crc32c``     a ``crc32c`` codec after zstd: the other sound choice.

Workloads: ``W1`` uint16 cube in 64^3 inner chunks, ``W3`` float32 square in 32^2 inner chunks,
both a smooth field plus noise. ``--size small`` (default, well under 2 minutes on 2 cores):
W1 256^3 in 128^3 shards, W3 2048^2 in 1024^2 shards. ``--size full``: the W1 (1024^3, 256^3
shards) and W3 (8192^2, 1024^2 shards) geometry of ``bench.py`` (about 6.5 GB of memory: the
source, dask's blocks and the concatenated read; 2.2 GB of disk, one array at a time).

Every timing is one call in this process; the chains alternate within each repetition (rep 0 of
every chain, then rep 1, ...), and the table shows medians and the change against ``zstd``.
Every read is compared with the source once per chain.

    python benchmarks/checksum_cost.py [--size small|full] [--reps 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zarr.codecs as zc

import shardwise

CHAINS: dict[str, Callable[[], list[Any]]] = {
    "zstd": lambda: [zc.ZstdCodec(level=0)],
    "zstd+checksum": lambda: [zc.ZstdCodec(level=0, checksum=True)],
    "zstd+crc32c": lambda: [zc.ZstdCodec(level=0), zc.Crc32cCodec()],
}

# name -> (shape, dtype, inner chunks, shards)
SIZES: dict[str, dict[str, tuple[tuple[int, ...], str, tuple[int, ...], tuple[int, ...]]]] = {
    "small": {
        "W1": ((256, 256, 256), "uint16", (64, 64, 64), (128, 128, 128)),
        "W3": ((2048, 2048), "float32", (32, 32), (1024, 1024)),
    },
    "full": {
        "W1": ((1024, 1024, 1024), "uint16", (64, 64, 64), (256, 256, 256)),
        "W3": ((8192, 8192), "float32", (32, 32), (1024, 1024)),
    },
}


def generate(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """A smooth field plus noise, built slab by slab along the first axis (bounded temporaries)."""
    rng = np.random.default_rng(seed)
    out = np.empty(shape, dtype=dtype)
    axes = [np.linspace(0.0, 6.0 * np.pi, n, dtype="float32") for n in shape]
    tail = np.zeros(shape[1:], dtype="float32")
    for i, ax in enumerate(axes[1:]):
        tail += np.sin(ax * (i + 1)).reshape([-1 if j == i else 1 for j in range(len(shape) - 1)])
    step = max(1, (64 << 20) // max(1, tail.nbytes))
    for lo in range(0, shape[0], step):
        hi = min(lo + step, shape[0])
        first = np.cos(axes[0][lo:hi]).reshape([-1] + [1] * (len(shape) - 1))
        smooth = first + tail
        if np.dtype(dtype).kind == "u":
            noise = rng.integers(0, 64, smooth.shape, dtype="uint16")
            out[lo:hi] = (smooth * 4000 + 20000).astype("uint16") + noise
        else:
            noise = rng.standard_normal(smooth.shape, dtype="float32") * 0.01
            out[lo:hi] = smooth + noise
    return out


def stored_bytes(root: Path) -> int:
    return sum(
        p.stat().st_size for p in root.rglob("*") if p.is_file() and ".shardwise" not in p.parts
    )


def run(size: str, reps: int, base: Path) -> list[dict[str, Any]]:
    rows = []
    for name, (shape, dtype, chunks, shards) in SIZES[size].items():
        data = generate(shape, dtype)
        times: dict[str, dict[str, list[float]]] = {c: {"write": [], "read": []} for c in CHAINS}
        nbytes: dict[str, int] = {}
        for rep in range(reps):
            for chain, compressors in CHAINS.items():
                root = base / f"{name}-{chain}-{rep}.zarr"
                t0 = time.perf_counter()
                shardwise.write_array(
                    data, root, chunks=chunks, shards=shards, compressors=compressors()
                )
                t1 = time.perf_counter()
                back = shardwise.open_array(root).compute(scheduler="threads")
                t2 = time.perf_counter()
                if rep == 0:
                    if not np.array_equal(back, data):
                        raise AssertionError(f"{name} {chain}: read back differs from the source")
                    nbytes[chain] = stored_bytes(root)
                del back
                shutil.rmtree(root)
                times[chain]["write"].append(t1 - t0)
                times[chain]["read"].append(t2 - t1)
        for chain in CHAINS:
            rows.append(
                dict(
                    workload=name,
                    chain=chain,
                    raw=data.nbytes,
                    stored=nbytes[chain],
                    write=statistics.median(times[chain]["write"]),
                    read=statistics.median(times[chain]["read"]),
                )
            )
        del data
    return rows


def table(rows: list[dict[str, Any]], size: str, reps: int) -> str:
    out = [
        f"size {size}, median of {reps} interleaved runs per chain",
        "",
        "| workload | chain | stored MB | write s | vs zstd | read s | vs zstd |",
        "|---|---|---|---|---|---|---|",
    ]
    ref = {(r["workload"]): r for r in rows if r["chain"] == "zstd"}
    for r in rows:
        base = ref[r["workload"]]
        dw = 100 * (r["write"] / base["write"] - 1)
        dr = 100 * (r["read"] / base["read"] - 1)
        out.append(
            f"| {r['workload']} | {r['chain']} | {r['stored'] / 1e6:.1f} | {r['write']:.3f} | "
            f"{dw:+.1f}% | {r['read']:.3f} | {dr:+.1f}% |"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default=None, help="where the arrays are written (default: a temp dir)")
    a = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="checksum-cost-", dir=a.dir))
    try:
        rows = run(a.size, a.reps, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(table(rows, a.size, a.reps))


if __name__ == "__main__":
    main()
