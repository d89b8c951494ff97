#!/usr/bin/env python
"""unshard: a sharded array into plain chunks, the raw copy against decode and re-encode.

The source: uint16 ``n^3`` (a smooth ramp plus noise, generated here), inner chunks 64^3
compressed with zstd (with its checksum, shardwise's default), in 256^3 shards. Each rep runs,
interleaved:

* ``copy``: ``shardwise.convert(src, dst, shards=None)``: every inner chunk copied as its chunk
  object, never decoded;
* ``decode``: the same conversion forced to decode and re-encode (``compressors=`` the same zstd
  codec, which the plan counts as other compressors);
* ``cli-copy`` / ``cli-decode``: the same two as whole processes (``shardwise convert --shards
  none``, ``--compressor zstd:0``), interpreter start and imports included.

Prints one JSON line per rep and a table of medians, spreads (min-max) and the decode/copy
ratios. The source was just written (the page cache holds it); nothing is fsynced.

Usage::

    python benchmarks/unshard.py [--small] [--reps 3] [--dir /tmp] [--out results/unshard.jsonl]

``--small``: 256^3 (64 chunks in 8 shards), to check the script in seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

INNER, SHARD = 64, 256


def make_source(root: Path, n: int) -> None:
    import shardwise

    grids = np.ogrid[:n, :n, :n]
    ramp = sum(((g * (5 + 2 * i)) % 16000).astype("uint16") for i, g in enumerate(grids))
    noise = np.random.default_rng(7).integers(0, 16, (n, n, n), dtype="uint16")
    data = np.asarray(ramp + noise, dtype="uint16")
    shardwise.write_array(data, root, chunks=(INNER,) * 3, shards=(min(SHARD, n),) * 3)


def in_process(src: Path, dst: Path, decode: bool) -> float:
    import zarr

    import shardwise

    shutil.rmtree(dst, ignore_errors=True)
    kw = {"compressors": [zarr.codecs.ZstdCodec(level=0, checksum=True)]} if decode else {}
    started = time.perf_counter()
    report = shardwise.convert(src, dst, shards=None, **kw)
    seconds = time.perf_counter() - started
    assert report.arrays[0].method == ("reencode" if decode else "copy"), report
    return seconds


def whole_process(src: Path, dst: Path, decode: bool) -> float:
    shutil.rmtree(dst, ignore_errors=True)
    cmd = [sys.executable, "-m", "shardwise.cli", "convert", str(src), str(dst)]
    cmd += ["--shards", "none", "--no-progress"] + (["--compressor", "zstd:0"] if decode else [])
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    n = 256 if a.small else 512
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        root = Path(tmp)
        make_source(root / "src.zarr", n)
        runs: dict[str, list[float]] = {}
        for rep in range(a.reps):
            row: dict[str, object] = {"n": n, "rep": rep}
            for name, fn, decode in (
                ("copy", in_process, False),
                ("decode", in_process, True),
                ("cli-copy", whole_process, False),
                ("cli-decode", whole_process, True),
            ):
                row[f"{name}_s"] = s = fn(root / "src.zarr", root / f"{name}.zarr", decode)
                runs.setdefault(name, []).append(s)
            print(json.dumps(row))
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    chunks = (n // INNER) ** 3
    print(f"\n{n}^3 uint16, {chunks} chunks of {INNER}^3 in shards of {min(SHARD, n)}^3")
    for name, xs in runs.items():
        print(f"{name:>11}: median {statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f})")
    for kind in ("", "cli-"):
        ratio = statistics.median(runs[f"{kind}decode"]) / statistics.median(runs[f"{kind}copy"])
        print(f"{kind}decode / {kind}copy: {ratio:.2f}x")


if __name__ == "__main__":
    main()
