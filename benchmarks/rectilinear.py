#!/usr/bin/env python
"""One shard per month (a rectilinear grid, no rechunk) against a regular grid after a rechunk.

The source: a daily float32 Dataset (``--days`` days from 2021-01-01 on a 181 x 360 grid; a
smooth field plus noise, seed 43), chunked a month per dask chunk
(``ds.chunk(time=TimeResampler("ME"))``). Inner chunks (1, 181, 360) (one map) and zstd level 3
everywhere. Cases, interleaved per rep:

* ``sw-month``: ``shardwise.to_zarr(ds, p, shards={"time": "dask"})``: a shard per month, a
  rectilinear grid, each dask chunk written as it is;
* ``sw-regular``: the same data ``.chunk(time=30)`` and ``shards={"time": 30}``: a regular grid,
  the rechunk in the graph;
* ``xr-regular``: xarray's own ``to_zarr`` of that rechunked Dataset, shards (30, 181, 360);
* ``sw-files`` / ``sw-files-regular``: an uneven concatenation (``xr.concat`` of "files" of 20
  to 90 days, a dask chunk per file) written a shard per file, and rechunked to 30-day shards.

Each case reports its wall time in process (the write alone, ``compute=True``) and as a whole
process (``--whole``: interpreter start, imports and loading the source from a .npy file
included, the same for every case), and the task counts of its graph (``compute=False``: write
tasks, rechunk tasks, all tasks). Every store is read back and compared with the source once.
Prints one JSON line per rep and a table of medians, spreads (min-max) and ratios to the
rectilinear case of the same data (``sw-month``, ``sw-files``).

Usage::

    python benchmarks/rectilinear.py [--small] [--reps 3] [--whole] [--dir /tmp] [--out f.jsonl]

``--small``: 120 days on a 46 x 90 grid, to check the script in seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

CASES = ("sw-month", "sw-regular", "xr-regular", "sw-files", "sw-files-regular")
FILES = (31, 62, 20, 45, 90, 28, 73, 55, 60, 41, 88, 37, 50, 66, 24, 80)  # days per "file"


def make_source(days: int, ny: int, nx: int) -> np.ndarray:
    t = np.arange(days, dtype="f4")[:, None, None]
    y = np.linspace(-90, 90, ny, dtype="f4")[None, :, None]
    x = np.linspace(0, 360, nx, endpoint=False, dtype="f4")[None, None, :]
    field = 15 + 20 * np.cos(np.radians(y)) + 5 * np.sin(2 * np.pi * t / 365 + np.radians(x))
    noise = np.random.default_rng(43).standard_normal((days, ny, nx), dtype="f4")
    return np.asarray(field + noise, dtype="f4")


def dataset(values: np.ndarray, case: str) -> Any:
    import pandas as pd
    import xarray as xr
    from xarray.groupers import TimeResampler

    days, ny, nx = values.shape
    time_ = pd.date_range("2021-01-01", periods=days, freq="D")
    coords = {"time": time_, "lat": np.linspace(-90, 90, ny), "lon": np.linspace(0, 359, nx)}
    ds = xr.Dataset({"tas": (("time", "lat", "lon"), values)}, coords=coords)
    if case.startswith("sw-files"):
        cuts = np.cumsum((0, *FILES))
        ends = [*cuts[cuts < days].tolist(), days]
        parts = [ds.isel(time=slice(a, b)).chunk(time=-1) for a, b in itertools.pairwise(ends)]
        ds = xr.concat(parts, "time")  # a dask chunk per file
    else:
        ds = ds.chunk(time=TimeResampler("ME"))
    return ds.chunk(time=30) if case.endswith("regular") else ds


def write(values: np.ndarray, case: str, path: Path, compute: bool = True) -> Any:
    import zarr

    import shardwise

    shutil.rmtree(path, ignore_errors=True)
    ds = dataset(values, case)
    _, ny, nx = values.shape
    enc = {"tas": {"chunks": (1, ny, nx), "compressors": [zarr.codecs.ZstdCodec(level=3)]}}
    if case == "xr-regular":
        enc["tas"]["shards"] = (30, ny, nx)
        return ds.to_zarr(path, zarr_format=3, encoding=enc, compute=compute, consolidated=True)
    shards: Any = {"time": 30} if case.endswith("regular") else {"time": "dask"}
    return shardwise.to_zarr(ds, path, shards=shards, encoding=enc, compute=compute)


def tasks(delayed: Any) -> dict[str, int]:
    keys = [k[0] if isinstance(k, tuple) else k for k in dict(delayed.__dask_graph__())]
    return {
        "write_tasks": sum(str(k).startswith(("shardwise-write", "store-")) for k in keys),
        "rechunk_tasks": sum("rechunk" in str(k) for k in keys),
        "all_tasks": len(keys),
    }


def check(values: np.ndarray, path: Path) -> str:
    import xarray as xr
    import zarr

    with zarr.config.set({"array.rectilinear_chunks": True}):
        got = xr.open_zarr(path)["tas"].values
        grid = zarr.open_array(path / "tas", mode="r").metadata.chunk_grid
    np.testing.assert_array_equal(got, values)
    return type(grid).__name__


def in_process(values: np.ndarray, case: str, path: Path) -> float:
    started = time.perf_counter()
    write(values, case, path)
    return time.perf_counter() - started


def whole_process(npy: Path, case: str, path: Path) -> float:
    started = time.perf_counter()
    cmd = [sys.executable, __file__, "--one", case, "--npy", str(npy), "--dst", str(path)]
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true")
    p.add_argument("--days", type=int, default=730)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--whole", action="store_true")
    p.add_argument("--dir", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--npy", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dst", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    # zarr's note that consolidated metadata is not in the v3 spec (xarray's to_zarr)
    warnings.filterwarnings("ignore", "Consolidated metadata", UserWarning)
    if a.one:  # a whole-process run of one case
        write(np.load(a.npy), a.one, Path(a.dst))
        return
    days, ny, nx = (120, 46, 90) if a.small else (a.days, 181, 360)
    values = make_source(days, ny, nx)
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        root = Path(tmp)
        npy = root / "source.npy"
        np.save(npy, values)
        counts = {}
        for case in CASES:
            dst = root / f"{case}.zarr"
            counts[case] = tasks(write(values, case, dst, compute=False))
            write(values, case, dst)
            counts[case]["grid"] = check(values, dst)  # type: ignore[assignment]
            print(json.dumps({"case": case, **counts[case]}))
        for rep in range(a.reps):
            row: dict[str, Any] = {"shape": [days, ny, nx], "rep": rep}
            for case in CASES:
                row[f"{case}_s"] = s = in_process(values, case, root / f"{case}.zarr")
                runs.setdefault(case, []).append(s)
                if a.whole:
                    row[f"{case}_whole_s"] = w = whole_process(npy, case, root / f"{case}.zarr")
                    runs.setdefault(f"{case} (whole)", []).append(w)
            print(json.dumps(row))
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    mb = values.nbytes / 1e6
    print(f"\n{days} x {ny} x {nx} float32 ({mb:.0f} MB), inner chunks (1, {ny}, {nx}), zstd 3")
    for case, c in counts.items():
        print(f"{case:>17}: {c}")
    for name, xs in runs.items():
        pair = "sw-files" if name.startswith("sw-files") else "sw-month"  # its rectilinear case
        pair += " (whole)" if "whole" in name else ""
        ratio = statistics.median(xs) / statistics.median(runs[pair])
        print(
            f"{name:>24}: median {statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f}), "
            f"{ratio:.2f}x {pair}"
        )


if __name__ == "__main__":
    main()
