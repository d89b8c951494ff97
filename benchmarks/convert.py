#!/usr/bin/env python
"""convert: a zarr v2 store of 64^3 zstd chunks into 256^3 shards, copy path against re-encode.

W1 geometry: uint16 1024^3 (2 GiB raw), v2 chunks 64^3 compressed with zstd (4096 chunk objects),
converted into 256^3 shards (64 objects). The source is generated in the script (a smooth ramp
plus noise, one 64-plane slab at a time) and written once.

Figures (one JSON line, and a table):

* ``objects_before`` / ``objects_after``: stored objects of the source and of the result;
* ``cp_s``: ``cp -r`` of the source tree (the machine's copy limit for these bytes);
* ``copy_s``: ``shardwise.convert`` (encoded chunks copied into the shards);
* ``reencode_s``: the same conversion forced to decode and re-encode (same zstd level);
* ``copy_vs_cp`` and ``reencode_vs_copy``: the ratios.

The source was just written, so all runs read it from the page cache; none fsyncs.

Usage::

    python benchmarks/convert.py [--small | --side N] [--reps 1] [--dir /tmp] [--out FILE.jsonl]

``--small`` converts a 512^3 array (8 shards) in well under two minutes, to check the script;
``--side N`` an N^3 array (a multiple of 256), e.g. 256 for a smoke run of seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

INNER, SHARD, LEVEL = 64, 256, 1


def smooth_noise(shape: tuple[int, ...], origin: tuple[int, ...]) -> np.ndarray:
    grids = np.ogrid[tuple(slice(o, o + n) for o, n in zip(origin, shape, strict=True))]
    ramp = sum(((g * (5 + 2 * i)) % 16000).astype("uint16") for i, g in enumerate(grids))
    noise = np.random.default_rng([7, *origin]).integers(0, 16, shape, dtype="uint16")
    return np.asarray(ramp + noise, dtype="uint16")


def make_source(root: Path, n: int) -> None:
    import numcodecs
    import zarr

    z = zarr.create_array(
        root,
        shape=(n, n, n),
        chunks=(INNER,) * 3,
        dtype="uint16",
        zarr_format=2,
        compressors=numcodecs.Zstd(level=LEVEL),
    )
    for i in range(0, n, INNER):  # one slab of chunk rows at a time
        z[i : i + INNER] = smooth_noise((INNER, n, n), (i, 0, 0))


def tree(root: Path) -> tuple[int, int]:
    """(objects, bytes) under ``root``, the shardwise journal left out."""
    n = size = 0
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x != ".shardwise"]
        for f in names:
            n += 1
            size += os.path.getsize(os.path.join(d, f))
    return n, size


def timed_call(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t, out


def run(n: int, reps: int, base: Path) -> dict[str, Any]:
    from zarr.codecs import ZstdCodec

    import shardwise

    src = base / "v2.zarr"
    t, _ = timed_call(make_source, src, n)
    # first use pays for imports and thread pools: warm up on a small array, untimed
    make_source(base / "warm.zarr", 2 * INNER)
    for name, kw in (("w1", {}), ("w2", dict(compressors=[ZstdCodec(level=LEVEL)]))):
        shardwise.convert(base / "warm.zarr", base / name, shards=(INNER * 2,) * 3, **kw)
    before, src_bytes = tree(src)
    out: dict[str, Any] = dict(
        shape=[n] * 3, inner=INNER, shard=SHARD, zstd_level=LEVEL, make_s=round(t, 2)
    )
    cp, copy, reenc = [], [], []
    after = dst_bytes = reenc_bytes = 0
    zstd = [ZstdCodec(level=LEVEL)]
    for _ in range(reps):
        t, _ = timed_call(subprocess.run, ["cp", "-r", str(src), str(base / "cp.zarr")], check=True)
        cp.append(t)
        shutil.rmtree(base / "cp.zarr")
        t, rep = timed_call(shardwise.convert, src, base / "copy.zarr", shards=(SHARD,) * 3)
        copy.append(t)
        assert rep.arrays[0].method == "copy", rep
        after, dst_bytes = tree(base / "copy.zarr")
        shutil.rmtree(base / "copy.zarr")
        t, rep = timed_call(
            shardwise.convert, src, base / "re.zarr", shards=(SHARD,) * 3, compressors=zstd
        )
        reenc.append(t)
        assert rep.arrays[0].method == "reencode", rep
        reenc_bytes = tree(base / "re.zarr")[1]
        shutil.rmtree(base / "re.zarr")
    med = {k: float(np.median(v)) for k, v in (("cp", cp), ("copy", copy), ("reenc", reenc))}
    out.update(
        objects_before=before,
        objects_after=after,
        src_MB=round(src_bytes / 1e6, 1),
        copy_MB=round(dst_bytes / 1e6, 1),
        reencode_MB=round(reenc_bytes / 1e6, 1),
        cp_s=round(med["cp"], 3),
        copy_s=round(med["copy"], 3),
        reencode_s=round(med["reenc"], 3),
        copy_vs_cp=round(med["copy"] / med["cp"], 2),
        reencode_vs_copy=round(med["reenc"] / med["copy"], 2),
        runs=dict(cp=cp, copy=copy, reencode=reenc),
        cores=os.cpu_count(),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="512^3 instead of 1024^3")
    p.add_argument("--side", type=int, default=0, help="N^3 (a multiple of 256)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to put the stores (default: a temp dir)")
    p.add_argument("--out", default=None, help="append the JSON line to this file")
    a = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="shardwise-convert-", dir=a.dir))
    try:
        res = run(a.side or (512 if a.small else 1024), a.reps, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    res["small"] = a.small
    line = json.dumps(res)
    print(line)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")
    print(
        f"\nobjects {res['objects_before']} -> {res['objects_after']}; "
        f"cp -r {res['cp_s']:.2f} s | copy {res['copy_s']:.2f} s ({res['copy_vs_cp']}x cp) | "
        f"re-encode {res['reencode_s']:.2f} s ({res['reencode_vs_copy']}x copy)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
