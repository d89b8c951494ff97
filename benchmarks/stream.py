#!/usr/bin/env python
"""Frames streamed into Zarr v3: shardwise.stream against tensorstore, zarr-python and
acquire-zarr writing the same arrays frame by frame.

    python benchmarks/stream.py [--reps 5] [--dir /path/to/disk] [--specs A,B,C] [--out f.jsonl]

Specs (ome-writers' published benchmarks): A, 500 frames of 256x256 uint16 (#37); B, 200 frames
of 128x128 uint16 (#52); and C, a 2048x2048 uint16 camera: 100 frames (a second at 100 frames/s,
800 MiB; shards of 10 frames, 80 MiB, in the shard variants). Variants: ``chunks`` (one
frame a chunk, no compression: ome-writers' own; shardwise and acquire-zarr store each chunk as
a shard of one chunk, zarr-python and tensorstore as a plain chunk), ``shards`` (one frame a
chunk, 50 frames a shard, no compression) and ``shards-zstd`` (the same, zstd level 3).
Frames are camera-like (a slow ramp plus shot noise), generated before the clock starts.

Every case runs in a fresh process (repetitions interleaved: rep 0 of every case, then rep 1,
...). In the process: ``write`` is the seconds from opening the array to its close (every frame
appended one at a time, then flushed/closed); ``peak`` is the resident high-water mark over the
baseline taken with the frames in memory. Whole-process seconds (start to exit, imports
included) are measured by the driver. Every written array is read back by zarr-python and
compared with the frames. ``limit`` is the machine's zstd-3 compression of the same chunks on
2 threads (no writer can encode faster). Prints a markdown table (medians, min-max).
A case's files are emptied after it, not removed, and every tree is removed at the end
(``empty_files``: a new file or directory costs far more just after others were removed).

acquire-zarr runs when ``import acquire_zarr`` works (``pip install --target DIR acquire-zarr``
and ``AQZ_PATH=DIR``).

Pyramids while streaming (``--writers shardwise,shardwise-levels,acquire-zarr-levels``):
``shardwise-levels`` is ``shardwise.stream_pyramid`` of ``LEVELS`` levels (y and x halved at
each, mean; time not reduced), ``acquire-zarr-levels`` acquire-zarr's mean downsampling
(``max_levels=LEVELS``); both with inner chunks of a quarter of y and x (acquire-zarr makes
levels down to one chunk), the shards as the variant's; level 0 is read back and compared, as
for every writer.
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
from typing import Any

import numpy as np

SPECS = {"A": (500, 256, 256), "B": (200, 128, 128), "C": (100, 2048, 2048)}
VARIANTS = ("chunks", "shards", "shards-zstd")
WRITERS = ("shardwise", "tensorstore", "zarr-python", "acquire-zarr")
PYRAMID_WRITERS = ("shardwise-levels", "acquire-zarr-levels")
LEVELS = 3
SHARD = 50
CAMERA_SHARD = 10  # frames of a shard of the 2048x2048 camera (C): 80 MiB
LEVEL = 3


def make_frames(spec: str) -> np.ndarray:
    n, h, w = SPECS[spec]
    rng = np.random.default_rng(37)
    ramp = (np.arange(h)[:, None] + np.arange(w)[None, :]).astype("u2") * 4
    # the camera's noise: 8 frames drawn, taken in turn (drawing 800 MiB would take longer)
    noise = rng.poisson(20, size=(min(n, 8) if h > 256 else n, h, w)).astype("u2")
    cycle = np.arange(n) % len(noise)
    return ramp[None] + noise[cycle] + np.arange(n, dtype="u2")[:, None, None]


def shard_frames(h: int) -> int:
    return SHARD if h <= 256 else CAMERA_SHARD


def layout(variant: str, h: int, w: int) -> tuple[int, ...]:
    """The shard shape along (t, y, x): one frame a shard for ``chunks``."""
    return (1, h, w) if variant == "chunks" else (shard_frames(h), h, w)


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def write_shardwise(root: str, x: np.ndarray, variant: str) -> None:
    from zarr.codecs import ZstdCodec

    import shardwise

    n, h, w = x.shape
    comp = [ZstdCodec(level=LEVEL)] if variant == "shards-zstd" else None
    with shardwise.stream(
        root, shape=(None, h, w), dtype=x.dtype, chunks=(1, h, w),
        shards=layout(variant, h, w), compressors=comp,
    ) as s:  # fmt: skip
        for t in range(n):
            s.append(x[t])


def write_shardwise_levels(root: str, x: np.ndarray, variant: str) -> None:
    from zarr.codecs import ZstdCodec

    import shardwise

    n, h, w = x.shape
    comp = [ZstdCodec(level=LEVEL)] if variant == "shards-zstd" else None
    with shardwise.stream_pyramid(
        root, shape=(None, h, w), dtype=x.dtype, dims=("t", "y", "x"), levels=LEVELS,
        chunks=(1, h // 4, w // 4), shards=layout(variant, h, w), compressors=comp,
    ) as s:  # fmt: skip
        for t in range(n):
            s.append(x[t])


def write_tensorstore(root: str, x: np.ndarray, variant: str) -> None:
    import tensorstore as ts

    n, h, w = x.shape
    inner: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if variant == "shards-zstd":
        inner.append({"name": "zstd", "configuration": {"level": LEVEL}})
    if variant == "chunks":
        codecs, grid = inner, [1, h, w]
    else:
        shard = {"chunk_shape": [1, h, w], "codecs": inner}
        codecs = [{"name": "sharding_indexed", "configuration": shard}]
        grid = [shard_frames(h), h, w]
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": root},
        "metadata": {
            "shape": [n, h, w],
            "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
            "codecs": codecs,
        },
        "create": True,
        "delete_existing": True,
    }
    arr = ts.open(spec).result()
    futures = [arr[t].write(x[t]) for t in range(n)]  # frame by frame, as a camera gives them
    for f in futures:
        f.result()


def write_zarr(root: str, x: np.ndarray, variant: str) -> None:
    import zarr
    from zarr.codecs import ZstdCodec

    n, h, w = x.shape
    comp = [ZstdCodec(level=LEVEL)] if variant == "shards-zstd" else None
    shards = None if variant == "chunks" else (shard_frames(h), h, w)
    z = zarr.create_array(
        root, shape=(n, h, w), dtype=x.dtype, chunks=(1, h, w), shards=shards,
        compressors=comp, zarr_format=3, fill_value=0,
    )  # fmt: skip
    for t in range(n):
        z[t] = x[t]


def write_acquire_levels(root: str, x: np.ndarray, variant: str) -> None:
    write_acquire(root, x, variant, levels=LEVELS)


def write_acquire(root: str, x: np.ndarray, variant: str, levels: int = 1) -> None:
    import acquire_zarr as aqz

    n, h, w = x.shape
    per = 1 if variant == "chunks" else shard_frames(h)
    q = 4 if levels > 1 else 1  # levels: chunks of a quarter of y and x (levels down to a chunk)
    dims = [
        aqz.Dimension(name="t", kind=aqz.DimensionType.TIME, array_size_px=0,
                      chunk_size_px=1, shard_size_chunks=per),
        aqz.Dimension(name="y", kind=aqz.DimensionType.SPACE, array_size_px=h,
                      chunk_size_px=h // q, shard_size_chunks=q),
        aqz.Dimension(name="x", kind=aqz.DimensionType.SPACE, array_size_px=w,
                      chunk_size_px=w // q, shard_size_chunks=q),
    ]  # fmt: skip
    extra: dict[str, Any] = {}
    if variant == "shards-zstd":
        extra["compression"] = aqz.CompressionSettings(
            compressor=aqz.Compressor.ZSTD, codec=aqz.CompressionCodec.ZSTD, level=LEVEL
        )
    if levels > 1:
        extra["downsampling_method"] = aqz.DownsamplingMethod.MEAN
        extra["max_levels"] = levels
    array = aqz.ArraySettings(dimensions=dims, data_type=aqz.DataType.UINT16, **extra)
    stream = aqz.ZarrStream(aqz.StreamSettings(store_path=root, arrays=[array]))
    for t in range(n):
        stream.append(x[t])
    stream.close()


def read_back(root: str, writer: str) -> np.ndarray:
    import zarr

    node = zarr.open(root, mode="r")
    if isinstance(node, zarr.Group):  # an OME-Zarr group (acquire-zarr, pyramids): level 0
        node = node["0"] if "0" in node else node[next(iter(node.array_keys()))]
    return np.asarray(node[...])


def case(spec: str, variant: str, writer: str, root: str) -> dict[str, Any]:
    """One run in this (fresh) process: the write's seconds and peak memory, checked."""
    x = make_frames(spec)
    write = {
        "shardwise": write_shardwise,
        "tensorstore": write_tensorstore,
        "zarr-python": write_zarr,
        "acquire-zarr": write_acquire,
        "shardwise-levels": write_shardwise_levels,
        "acquire-zarr-levels": write_acquire_levels,
    }[writer]
    import tensorstore  # noqa: F401
    import zarr  # noqa: F401

    import shardwise  # noqa: F401 (imports paid before the clock, for every writer alike)

    warm = root + ".warm"
    write(warm, x[:2], variant)  # first-call costs: thread pools, lazy imports (kept)
    reset_peak()
    base = status("VmRSS")
    t0 = time.perf_counter()
    write(root, x, variant)
    seconds = time.perf_counter() - t0
    peak = status("VmHWM") - base
    got = read_back(root, writer)
    ok = bool(np.array_equal(got, x))
    size = sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())
    return {"seconds": seconds, "peak": peak, "ok": ok, "bytes": size, "raw": x.nbytes}


def limit(spec: str) -> dict[str, Any]:
    """zstd-3 of every frame (one chunk each) on 2 threads: MB/s of raw data."""
    from concurrent.futures import ThreadPoolExecutor

    import zstandard

    x = make_frames(spec)
    half = len(x) // 2
    best = float("inf")

    def encode(part: np.ndarray) -> None:  # a compressor per thread (they are not shared)
        cctx = zstandard.ZstdCompressor(level=LEVEL)
        for frame in part:
            cctx.compress(frame.tobytes())

    for _ in range(3):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(encode, [x[:half], x[half:]]))
        best = min(best, time.perf_counter() - t0)
    return {"seconds": best, "raw": x.nbytes}


def run_one(spec: str, variant: str, writer: str, where: str) -> dict[str, Any]:
    root = tempfile.mkdtemp(dir=where) + "/a.zarr"
    env = dict(os.environ)
    if os.environ.get("AQZ_PATH"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), env["AQZ_PATH"]]))
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, __file__, "case", spec, variant, writer, root],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    whole = time.perf_counter() - t0
    empty_files(os.path.dirname(root))
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1][:200]}
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["whole"] = whole
    return got


def empty_files(top: str) -> None:
    """Every file below ``top`` cut to 0 bytes, the files and directories kept until the run
    ends (``main`` removes them): a file system without a journal (ext4 without one, as on
    this project's VM) skips inodes freed in the last minutes when it allocates new ones, so a
    case run just after the last one's tree was removed pays for that scan, a writer of one
    file a frame most (measured: 0.3-1 ms a new file or directory instead of tens of us)."""
    for d, _, files in os.walk(top):
        for f in files:
            os.truncate(os.path.join(d, f), 0)


def has_acquire() -> bool:
    env = dict(os.environ)
    if os.environ.get("AQZ_PATH"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), env["AQZ_PATH"]]))
    done = subprocess.run([sys.executable, "-c", "import acquire_zarr"], env=env, timeout=60)
    return done.returncode == 0


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--specs", default="A,B,C")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--writers", default=",".join(WRITERS), help="also: shardwise-levels, ...")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    writers = [w for w in a.writers.split(",") if not w.startswith("acquire") or has_acquire()]
    cases = [(s, v, w) for s in a.specs.split(",") for v in a.variants.split(",") for w in writers]
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {c: [] for c in cases}
    runs_dir = tempfile.mkdtemp(dir=a.dir, prefix="shardwise-stream-bench-")
    for rep in range(a.reps):
        for c in cases:
            got = run_one(*c, runs_dir)
            results[c].append(got)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps({"case": c, "rep": rep, **got}) + "\n")
            print(rep, c, got, file=sys.stderr, flush=True)
    shutil.rmtree(runs_dir, ignore_errors=True)
    print("| spec | variant | writer | frames/s | MB/s | write s | whole-process s | peak MiB "
          "| stored MB | vs tensorstore |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s, v, w in cases:
        runs = [r for r in results[(s, v, w)] if "seconds" in r]
        if not runs:
            err = results[(s, v, w)][0].get("error", "?")
            print(f"| {s} | {v} | {w} | failed: {err} |||||||")
            continue
        n = SPECS[s][0]
        secs = [r["seconds"] for r in runs]
        ts_runs = [r["seconds"] for r in results.get((s, v, "tensorstore"), []) if "seconds" in r]
        ratio = statistics.median(ts_runs) / statistics.median(secs) if ts_runs else float("nan")
        bad = "" if all(r["ok"] for r in runs) else " (MISMATCH)"
        print(
            f"| {s} | {v} | {w}{bad} | {spread([n / t for t in secs], '.0f')} "
            f"| {spread([r['raw'] / t / 1e6 for r, t in zip(runs, secs, strict=True)], '.0f')} "
            f"| {spread(secs, '.3f')} | {spread([r['whole'] for r in runs], '.2f')} "
            f"| {spread([r['peak'] / 2**20 for r in runs], '.0f')} "
            f"| {runs[0]['bytes'] / 1e6:.1f} | {ratio:.2f}x |"
        )
    for s in a.specs.split(","):
        lim = limit(s)
        n = SPECS[s][0]
        print(
            f"\nlimit {s}: zstd-{LEVEL} of the frames on 2 threads: "
            f"{n / lim['seconds']:.0f} frames/s, {lim['raw'] / lim['seconds'] / 1e6:.0f} MB/s"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "case":
        print(json.dumps(case(*sys.argv[2:6])))
    else:
        main()
