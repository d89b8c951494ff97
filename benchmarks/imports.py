#!/usr/bin/env python
"""What a fresh process pays before its first read: the imports of each door, module by module.

For each door, ``--reps`` fresh interpreters run ``python -X importtime -c "<its imports>"``
(repetitions interleaved across the doors); the report gives, per door, the median of the whole
process (launch to exit, the interpreter's start included) and the median cumulative import time
of the packages that weigh (each as the first line naming it in that process's ``importtime``
output, so a package imported inside another counts there too). The doors import what their
user's code does before a full load: tensorstore; ``read_array`` (``shardwise`` and the read
modules it loads on first use); ``open_array`` (``dask.array`` too); the xarray engine
(``xarray``, and the ``dask`` package that the engine's open imports to install its whole-load
optimization).

Usage::

    python benchmarks/imports.py [--reps 7] [--out FILE.jsonl]
    python benchmarks/imports.py report FILE.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")

READ = "import shardwise, shardwise.engine.load, shardwise.codec.decode"
DOORS = {
    "python": "pass",
    "tensorstore": "import tensorstore",
    "read_array": READ,
    "open_array": f"{READ}; import dask.array, shardwise.engine.lazy",
    "engine": f"{READ}; import xarray, dask, shardwise.xarray.backend",
    "distributed": "import distributed",
}
# packages whose cumulative import time is reported (where a door imports them)
PACKAGES = (
    "tensorstore",
    "zarr",
    "shardwise.errors",
    "dask",
    "dask.array",
    "xarray",
    "xarray.coders",  # where dask.array imports xarray (its import lists no "xarray" line then)
    "pandas",
    "dask.array.fft",
    "dask.array.chunk_types",
    "distributed",
)


def measure(code: str) -> dict[str, float]:
    """One fresh process: its wall seconds and the cumulative seconds of ``PACKAGES``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    got = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    out: dict[str, float] = {"process": time.perf_counter() - t0}
    for line in got.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].strip()
        if name in PACKAGES and name not in out:
            out[name] = int(parts[1]) / 1e6
    return out


def run(args: argparse.Namespace) -> None:
    import compileall

    compileall.compile_dir(SRC, quiet=1)  # as an installed package would be
    with open(args.out, "a") as f:
        for rep in range(args.reps):
            for door, code in DOORS.items():
                row: dict[str, Any] = {"door": door, "rep": rep, **measure(code)}
                f.write(json.dumps(row) + "\n")
                f.flush()
    report(args.out)


def report(path: str) -> None:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    doors = list(dict.fromkeys(r["door"] for r in rows))
    print("| door | n | process s (median, min-max) | " + " | ".join(PACKAGES) + " |")
    print("|---|---|---|" + "---|" * len(PACKAGES))
    for door in doors:
        rs = [r for r in rows if r["door"] == door]
        proc = [r["process"] for r in rs]
        cells = []
        for p in PACKAGES:
            got = [r[p] for r in rs if p in r]
            cells.append(f"{statistics.median(got):.3f}" if got else "")
        print(
            f"| {door} | {len(rs)} | {statistics.median(proc):.3f} "
            f"({min(proc):.3f}-{max(proc):.3f}) | " + " | ".join(cells) + " |"
        )


def main() -> None:
    if sys.argv[1:2] == ["report"]:
        report(sys.argv[2])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default="imports.jsonl")
    run(p.parse_args())


if __name__ == "__main__":
    main()
