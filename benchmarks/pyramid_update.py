"""Pyramids follow their level 0: a small region written into level 0 of an OME-Zarr pyramid,
then every level above it refreshed, against writing the whole pyramid again.

A 4096 x 4096 uint16 image (zstd, inner chunks 256 x 256, shards 1024 x 1024) is written by
``write_pyramid`` with 5 levels. Each case starts from a copy of that store, in a fresh process
(imports and page faults included in the whole-process figure), cases interleaved, ``--reps``
times; medians and min-max:

- ``update``: ``write_array(patch, region=)`` of a 64 x 64 patch into level 0, then
  ``update_pyramid(store, region)``: every level's windows above the patch reduced again;
- ``rewrite``: the same patch, then ``write_pyramid`` of the whole updated level 0 (``mode="w"``),
  what a user without ``update_pyramid`` does.

The write reports' own meters give the bytes read and written and the requests of each case.

    python benchmarks/pyramid_update.py --reps 3 --out benchmarks/results/pyramid-update.jsonl

``--side N`` another side (a multiple of 64; chunks and shards scale with it).
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
from typing import Any

SIDE = 4096
PATCH = (slice(1000, 1064), slice(2000, 2064))
KW: dict[str, Any] = dict(levels=5, dims=("y", "x"), chunks=(256, 256), shards=(1024, 1024))


def set_side(side: int) -> None:
    """Another image side (a multiple of 64): inner chunks and shards a 16th and a 4th of it,
    the patch at the same place relative to the side."""
    global SIDE, PATCH
    SIDE = side
    y, x = side * 1000 // 4096, side * 2000 // 4096
    PATCH = (slice(y, y + 64), slice(x, x + 64))
    KW.update(chunks=(side // 16,) * 2, shards=(side // 4,) * 2)


CASES = ("update", "rewrite")


def image() -> Any:
    import numpy as np

    # a smooth field plus 6 bits of noise (a camera's image, not a pattern zstd erases)
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    noise = np.random.default_rng(0).integers(0, 64, (SIDE, SIDE))
    return ((x + y) // 4 + noise).astype("uint16")


def io_counts() -> tuple[int, int]:
    """Bytes this process read and wrote through system calls so far (every library's reads,
    level 0's full read by ``rewrite`` included, which no write report meters)."""
    got = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(got["rchar"]), int(got["wchar"])


def make_base(root: Path) -> None:
    import shardwise

    shardwise.write_pyramid(image(), root, **KW)


def run_case(case: str, root: Path) -> dict[str, Any]:
    """One case on ``root`` (a copy of the base pyramid), in this process."""
    started = time.perf_counter()
    io0 = io_counts()
    import numpy as np

    import shardwise

    imported = time.perf_counter()
    patch = np.full((64, 64), 9, "uint16")
    first = shardwise.write_array(patch, root, path="0", region=PATCH, mode="r+")
    if case == "update":
        second = shardwise.update_pyramid(root, PATCH)
    else:
        level0 = shardwise.read_array(root, path="0")
        second = shardwise.write_pyramid(level0, root, mode="w", **KW)
    done = time.perf_counter()
    io1 = io_counts()
    reports = (first, second)
    return {
        "case": case,
        "seconds": done - imported,
        "seconds_with_imports": done - started,
        "bytes_read": sum(r.bytes_read for r in reports),
        "bytes_written": sum(r.bytes_written for r in reports),
        "requests": sum(r.requests for r in reports),
        "shards_written": sum(r.shards_written for r in reports),
        "rchar": io1[0] - io0[0],
        "wchar": io1[1] - io0[1],
    }


def check(root: Path, case: str) -> None:
    """Every level equals a fresh pyramid of the updated level 0 (both cases)."""
    import numpy as np

    import shardwise

    values = image()
    values[PATCH] = 9
    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "ref.zarr"
        shardwise.write_pyramid(values, ref, **KW)
        for k in range(KW["levels"]):
            got = shardwise.read_array(root, path=str(k))
            want = shardwise.read_array(ref, path=str(k))
            if not np.array_equal(got, want):
                raise SystemExit(f"{case}: level {k} differs from a fresh pyramid")


def child(case: str, root: str, out: str) -> None:
    if case.startswith("check-"):  # after the timed process: every level right
        check(Path(root), case[len("check-") :])
        return
    Path(out).write_text(json.dumps(run_case(case, Path(root))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--side", type=int, default=SIDE, help="the image's side (4096)")
    p.add_argument("--child", nargs=3, metavar=("CASE", "ROOT", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    set_side(args.side)
    if args.child:
        child(*args.child)
        return
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pyramid-update-") as tmp:
        base = Path(tmp) / "base.zarr"
        make_base(base)
        for rep in range(args.reps):
            for case in CASES:
                root, out = Path(tmp) / f"{case}.zarr", Path(tmp) / "out.json"
                shutil.rmtree(root, ignore_errors=True)
                shutil.copytree(base, root)
                t0 = time.perf_counter()
                cmd = [sys.executable, __file__, "--side", str(SIDE), "--child", case, str(root)]
                cmd.append(str(out))
                subprocess.run(cmd, check=True)
                row = json.loads(out.read_text())
                row["whole_process_seconds"] = time.perf_counter() - t0
                subprocess.run([*cmd[:-3], f"check-{case}", str(root), str(out)], check=True)
                row.update(rep=rep, side=SIDE)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary(rows)


def summary(rows: list[dict[str, Any]]) -> None:
    def med(case: str, key: str) -> tuple[float, float, float]:
        v = [r[key] for r in rows if r["case"] == case]
        return statistics.median(v), min(v), max(v)

    print(
        "| case | in process, s | whole process, s | read MB | written MB | requests "
        "| rchar MB | wchar MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for case in CASES:
        s, w = med(case, "seconds"), med(case, "whole_process_seconds")
        r, wr = med(case, "bytes_read")[0] / 1e6, med(case, "bytes_written")[0] / 1e6
        n = med(case, "requests")[0]
        rc, wc = med(case, "rchar")[0] / 1e6, med(case, "wchar")[0] / 1e6
        print(
            f"| {case} | {s[0]:.3f} ({s[1]:.3f}-{s[2]:.3f}) | {w[0]:.2f} ({w[1]:.2f}-{w[2]:.2f}) "
            f"| {r:.2f} | {wr:.2f} | {n:.0f} | {rc:.1f} | {wc:.1f} |"
        )
    for key in ("seconds", "whole_process_seconds", "bytes_written", "wchar"):
        ratio = med("rewrite", key)[0] / med("update", key)[0]
        print(f"rewrite / update, {key}: {ratio:.1f}x")


if __name__ == "__main__":
    main()
