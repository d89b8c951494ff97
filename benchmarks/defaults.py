"""The defaults target: plain ``xr.open_zarr`` reading a store written by
``shardwise.to_zarr(ds, p, shards={"time": N})`` against xarray's own default layout of the same
data (``ds.to_zarr(p, zarr_format=3)``: zarr's chunks, no shards), and against the inner chunks
the previous rule picked for the same shards (long strips along time), on a 181x360 and a
721x1440 float32 grid, N = 10, 30, 64.

Two reads: a full load (``xr.open_zarr(p).load()``) and one map (``.isel(time=k).values``).
Every layout is read once per round, rounds interleaved; medians, spreads (min-max) and ratios
to xarray's layout. Full loads are also timed whole-process (a fresh interpreter: import, open,
load). The data is a smooth field plus noise (it compresses as real fields do).

    PYTHONPATH=src python benchmarks/defaults.py [--reps 5] [--procs 3] [--out DIR]
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
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import shardwise
from shardwise.core.sizing import dividing_chunks

GRIDS = {"181x360": (365, 181, 360), "721x1440": (128, 721, 1440)}
NS = (10, 30, 64)


def field(shape: tuple[int, int, int]) -> xr.Dataset:
    t, y, x = shape
    rng = np.random.default_rng(0)
    lat = np.linspace(-90, 90, y, dtype="float32")
    lon = np.linspace(0, 360, x, endpoint=False, dtype="float32")
    base = 15 * np.cos(np.deg2rad(lat))[:, None] + 3 * np.sin(np.deg2rad(lon))[None, :]
    data = np.empty(shape, "float32")
    for i in range(t):
        data[i] = base + 5 * np.sin(2 * np.pi * i / 365) + rng.normal(0, 0.5, (y, x))
    return xr.Dataset({"t2m": (("time", "lat", "lon"), data)}, coords={"lat": lat, "lon": lon})


def write_stores(root: Path, name: str, ds: xr.Dataset) -> dict[str, Path]:
    """xarray's default layout, and per N shardwise's default and the previous rule's."""
    out = {}
    p = root / f"{name}-xarray.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(p, zarr_format=3, mode="w")
    out["xarray default"] = p
    _, y, x = ds.t2m.shape
    for n in NS:
        p = root / f"{name}-shardwise-{n}.zarr"
        shardwise.to_zarr(ds, p, shards={"time": n}, mode="w")
        out[f"shardwise N={n}"] = p
        old = dividing_chunks((n, y, x), 4)  # the previous rule for inner chunks
        p = root / f"{name}-before-{n}.zarr"
        enc = {"t2m": {"chunks": old, "shards": (n, y, x)}}
        shardwise.to_zarr(ds, p, encoding=enc, mode="w")
        out[f"before N={n}"] = p
    return out


def layout(p: Path) -> str:
    import zarr

    a = zarr.open_array(p, path="t2m")
    return f"chunks {a.chunks}" if a.shards is None else f"shards {a.shards} chunks {a.chunks}"


def full_load(p: Path) -> float:
    t0 = time.perf_counter()
    xr.open_zarr(p).load()
    return time.perf_counter() - t0


def one_map(p: Path, k: int) -> float:
    t0 = time.perf_counter()
    np.asarray(xr.open_zarr(p).t2m.isel(time=k).values)
    return time.perf_counter() - t0


LOAD = "import sys, xarray as xr; xr.open_zarr(sys.argv[1]).load()"


def process_load(p: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-W", "ignore", "-c", LOAD, str(p)], check=True)
    return time.perf_counter() - t0


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def run(reps: int, procs: int, root: Path) -> list[dict[str, Any]]:
    rows = []
    for name, shape in GRIDS.items():
        stores = write_stores(root, name, field(shape))
        k = shape[0] // 2 + 1
        times: dict[str, dict[str, list[float]]] = {
            s: {"load": [], "map": [], "proc": []} for s in stores
        }
        for r in range(max(reps, procs)):
            for s, p in stores.items():  # interleaved: every layout once per round
                if r < reps:
                    times[s]["load"].append(full_load(p))
                    times[s]["map"].append(one_map(p, k))
                if r < procs:
                    times[s]["proc"].append(process_load(p))
        ref = {m: statistics.median(times["xarray default"][m]) for m in ("load", "map", "proc")}
        for s, p in stores.items():
            med = {m: statistics.median(times[s][m]) for m in ("load", "map", "proc")}
            rows.append(
                dict(
                    grid=f"{shape[0]}x{name}",
                    layout=s,
                    geometry=layout(p),
                    load=spread(times[s]["load"]),
                    load_ratio=round(med["load"] / ref["load"], 2),
                    map=spread(times[s]["map"]),
                    map_ratio=round(med["map"] / ref["map"], 2),
                    process_load=spread(times[s]["proc"]),
                    process_ratio=round(med["proc"] / ref["proc"], 2),
                )
            )
        for p in stores.values():
            shutil.rmtree(p)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| grid | layout | geometry | full load s | ratio | map s | ratio | full load, process s "
        "| ratio |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [
        f"| {r['grid']} | {r['layout']} | {r['geometry']} | {r['load']} | {r['load_ratio']} | "
        f"{r['map']} | {r['map_ratio']} | {r['process_load']} | {r['process_ratio']} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="keep the rows as JSON lines here")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="shardwise-defaults-"))
    try:
        rows = run(a.reps, a.procs, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.out:
        a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(table(rows))


if __name__ == "__main__":
    main()
