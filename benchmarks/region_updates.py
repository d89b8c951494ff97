"""Small updates to big shards: what a region write moves per byte it changes.

copick's geometry (8^3 float32 regions written into a volume stored as one shard of 128^3 inner
chunks), on local files: for each writer the same sequence of regions is written, one call per
region (and for shardwise also all of them through one ``RegionWriter`` commit), and the bytes
the writing process read and wrote are taken from the kernel (``/proc/self/io``: ``rchar`` and
``wchar``, every read and write system call, whatever library makes it), so shardwise,
zarr-python and tensorstore are measured alike. Each case runs in a fresh process, cases
interleaved, ``--reps`` times; medians and min-max.

    python benchmarks/region_updates.py --reps 3 --out benchmarks/results/region-updates.jsonl

Cases: ``sw-region`` (``write_array(region=)`` per region), ``sw-batch`` (one ``RegionWriter``
for all regions), ``zarr`` (zarr-python ``arr[region] = values``), ``ts`` (tensorstore
``arr[region].write(values)``). The figure: bytes moved (read + written) per byte changed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VOLUMES = {"small": (256, 256, 256), "large": (384, 384, 384)}
CHUNK = (128, 128, 128)
REGION = 8
UPDATES = 10
CASES = ("sw-region", "sw-batch", "zarr", "ts")


def io_counts() -> tuple[int, int]:
    """Bytes this process read and wrote through system calls so far."""
    got = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(got["rchar"]), int(got["wchar"])


def regions(shape: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """``UPDATES`` 8^3 regions spread through the volume (deterministic)."""
    out = []
    for k in range(UPDATES):
        start = [(37 * (k + 1) * (d + 3)) % (n - REGION) for d, n in enumerate(shape)]
        out.append(tuple(slice(s, s + REGION) for s in start))
    return out


def make_volume(path: Path, shape: tuple[int, ...]) -> None:
    """The volume: smooth float32 values (compress as tomograms do), one shard, zstd."""
    import numpy as np
    import zarr

    z = np.linspace(0, 1, shape[0], dtype="f4")[:, None, None]
    y = np.linspace(0, 1, shape[1], dtype="f4")[None, :, None]
    x = np.linspace(0, 1, shape[2], dtype="f4")[None, None, :]
    values = np.sin(9 * z) * np.cos(7 * y) + x
    zarr.create_array(
        zarr.storage.LocalStore(path), name="v", shape=shape, dtype="f4", chunks=CHUNK,
        shards=shape, compressors=zarr.codecs.ZstdCodec(level=3),
    )[...] = values  # fmt: skip


def run_case(case: str, path: Path, shape: tuple[int, ...]) -> dict:
    """One case in this (fresh) process: the regions written, the bytes and time it took."""
    import numpy as np

    todo = regions(shape)
    values = [np.full((REGION,) * 3, k + 1, "f4") for k in range(len(todo))]
    if case == "ts":
        import tensorstore as ts

        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path / "v")}}
        arr = ts.open(spec).result()
    elif case == "zarr":
        import zarr

        arr = zarr.open_array(zarr.storage.LocalStore(path), path="v", mode="r+")
    else:
        import shardwise
    r0, w0 = io_counts()
    t0 = time.perf_counter()
    if case == "sw-region":
        import shardwise

        for reg, v in zip(todo, values, strict=True):
            shardwise.write_array(v, path, path="v", region=reg, mode="r+")
    elif case == "sw-batch":
        import shardwise

        with shardwise.RegionWriter(path, path="v") as w:
            for reg, v in zip(todo, values, strict=True):
                w.write(reg, v)
    elif case == "zarr":
        for reg, v in zip(todo, values, strict=True):
            arr[reg] = v
    else:
        for reg, v in zip(todo, values, strict=True):
            arr[reg].write(v).result()
    seconds = time.perf_counter() - t0
    r1, w1 = io_counts()
    changed = len(todo) * REGION**3 * 4
    return dict(case=case, read=r1 - r0, written=w1 - w0, changed=changed, seconds=seconds,
                shard_bytes=(path / "v" / "c" / "0" / "0" / "0").stat().st_size)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--volumes", default="small,large")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default=None)
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case, this process
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        shape = tuple(int(n) for n in args.shape.split(","))
        print(json.dumps(run_case(args.case, Path(args.path), shape)))
        return
    rows = []
    for rep in range(args.reps):
        for vol in args.volumes.split(","):
            shape = VOLUMES[vol]
            cases = args.cases.split(",")
            for case in cases if rep % 2 == 0 else cases[::-1]:
                with tempfile.TemporaryDirectory(prefix="region-updates-") as tmp:
                    path = Path(tmp) / "vol.zarr"
                    make_volume(path, shape)
                    cmd = [sys.executable, __file__, "--case", case, "--path", str(path),
                           "--shape", ",".join(map(str, shape))]  # fmt: skip
                    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
                    if out.returncode:
                        print(out.stderr[-2000:], file=sys.stderr)
                        continue
                    row = json.loads(out.stdout.strip().splitlines()[-1]) | dict(
                        volume=vol, rep=rep
                    )
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(table(rows))


def table(rows: list[dict]) -> str:
    head = "| volume | case | moved / changed (median, min-max) | read MB | written MB | seconds |"
    lines = [head, "|---|---|---|---|---|---|"]
    for vol in VOLUMES:
        for case in CASES:
            got = [r for r in rows if r["volume"] == vol and r["case"] == case]
            if not got:
                continue
            amp = [(r["read"] + r["written"]) / r["changed"] for r in got]
            lines.append(
                f"| {vol} {VOLUMES[vol]} | {case} | {statistics.median(amp):,.0f}x "
                f"({min(amp):,.0f}-{max(amp):,.0f}) | "
                f"{statistics.median(r['read'] for r in got) / 1e6:.1f} | "
                f"{statistics.median(r['written'] for r in got) / 1e6:.1f} | "
                f"{statistics.median(r['seconds'] for r in got):.2f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
