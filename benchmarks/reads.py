#!/usr/bin/env python
"""Full reads of W1, W2 and W3, shardwise against tensorstore in the same run.

Self-contained: the data are generated here (a smooth field plus noise), written once by
shardwise into ``--dir``, then every case runs in a fresh process, repetitions interleaved
(rep 0 of every case, then rep 1, ...; the case order rotates each repetition).

Cases (``case`` names):

* ``ts``         tensorstore ``read()`` of the whole array (the reference);
* ``direct``     ``shardwise.read_array(root, path="data")``;
* ``array``      ``shardwise.open_array(root, path="data").compute()`` (threaded scheduler: one
  direct read into the output, no dask block);
* ``array-graph`` ``dask.compute(shardwise.open_array(root, path="data"))``: the dask graph, one
  block per shard, assembled into one output on the pool;
* ``array-whole`` ``open_array(..., chunks=-1).compute()`` (the same direct read as ``array``);
* ``engine``     ``xr.open_dataset(root, engine="shardwise")["data"].values`` (no dask);
* ``engine-dask`` the same with ``chunks={}`` (one dask chunk per shard);
* ``mean-dask``  ``shardwise.open_array(root, path="data").mean().compute()``.

Per case: whole-process seconds (from the start of the process to the end of the read: interpreter
start and imports included), in-process seconds (the read alone), peak RSS of the process and its
growth over the read, in multiples of the array's bytes. Every full read is compared with
tensorstore's (a crc32c of the bytes, computed after the timing); ``mean-dask`` with the mean of
tensorstore's result.

Usage::

    python benchmarks/reads.py gen  [--small] [--dir D]          # once: writes W1, W2 and W3
    python benchmarks/reads.py run  [--small] [--dir D] [--reps 5] [--out FILE.jsonl]
    python benchmarks/reads.py report FILE.jsonl

``--small`` uses small arrays with the same inner chunks (a check that everything runs, < 2 min).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")

# name: (shape, shard shape, inner chunk shape, dtype, dimension names)
W2_DIMS = ("time", "lat", "lon")
FULL = {
    "W1": ((1024, 1024, 1024), (256, 256, 256), (64, 64, 64), "uint16", ("z", "y", "x")),
    "W2": ((2920, 361, 720), (584, 361, 720), (8, 361, 720), "float32", W2_DIMS),
    "W3": ((8192, 8192), (1024, 1024), (32, 32), "float32", ("y", "x")),
}
SMALL = {
    "W1": ((256, 256, 256), (128, 128, 128), (64, 64, 64), "uint16", ("z", "y", "x")),
    "W2": ((320, 91, 180), (64, 91, 180), (8, 91, 180), "float32", W2_DIMS),
    "W3": ((2048, 2048), (512, 512), (32, 32), "float32", ("y", "x")),
}
MEDIUM = {
    "W1": ((512, 512, 512), (256, 256, 256), (64, 64, 64), "uint16", ("z", "y", "x")),
    "W2": ((1460, 361, 720), (584, 361, 720), (8, 361, 720), "float32", W2_DIMS),
    "W3": ((4096, 4096), (1024, 1024), (32, 32), "float32", ("y", "x")),
}
CASES = (
    "ts",
    "direct",
    "array",
    "array-graph",
    "array-whole",
    "engine",
    "engine-dask",
    "mean-dask",
)


def sizes(args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "medium", False):
        return MEDIUM
    return SMALL if args.small else FULL


def root_of(args: argparse.Namespace, wl: str) -> str:
    tag = "medium" if getattr(args, "medium", False) else "small" if args.small else "full"
    return os.path.join(args.dir, f"{wl}-{tag}.zarr")


# -- data -----------------------------------------------------------------------------------------


def _block(shape: tuple[int, ...], origin: tuple[int, ...], dtype: str) -> np.ndarray:
    """A smooth field plus a little noise, reproducible from the block's origin."""
    grids = np.meshgrid(
        *[np.arange(o, o + n, dtype=np.float32) for o, n in zip(origin, shape, strict=True)],
        indexing="ij",
        sparse=True,
    )
    smooth = sum(np.sin(g / (150.0 + 50 * i)) for i, g in enumerate(grids))
    rng = np.random.default_rng(abs(hash(origin)) % 2**32)
    if np.dtype(dtype).kind == "u":
        noise = rng.integers(-3, 4, size=shape, dtype=np.int32)
        return (30000 + 3000 * smooth + noise).astype(dtype)
    noise = rng.normal(0, 0.01, size=shape).astype(np.float32)
    return (10 * smooth + noise).astype(dtype)


def gen(args: argparse.Namespace) -> None:
    import dask.array as da
    import zarr
    from zarr.codecs import ZstdCodec

    sys.path.insert(0, SRC)
    import shardwise

    os.makedirs(args.dir, exist_ok=True)
    for wl in args.workloads.split(","):
        shape, shard, chunk, dtype, dims = sizes(args)[wl]
        root = root_of(args, wl)
        if os.path.exists(os.path.join(root, "data", "zarr.json")) and not args.force:
            print(f"{wl}: {root} exists (--force rewrites it)")
            continue

        def block(block_info: Any = None, dtype: str = dtype) -> np.ndarray:
            info = block_info[None]
            loc = tuple(a for a, _ in info["array-location"])
            return _block(tuple(info["chunk-shape"]), loc, dtype)

        x = da.map_blocks(block, chunks=da.core.normalize_chunks(shard, shape), dtype=dtype)
        zarr.open_group(root, mode="w", zarr_format=3)
        t0 = time.perf_counter()
        shardwise.write_array(
            x,
            root,
            path="data",
            chunks=chunk,
            shards=shard,
            compressors=ZstdCodec(level=3),
            dimension_names=dims,
            mode="w",
        )
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        stored = sum(
            os.path.getsize(os.path.join(d, f))
            for d, _, fs in os.walk(os.path.join(root, "data"))
            for f in fs
        )
        print(
            f"{wl}: {shape} {dtype} in {shard} shards of {chunk} chunks: {nbytes / 2**20:.0f} MiB,"
            f" stored {stored / 2**20:.0f} MiB, written in {time.perf_counter() - t0:.1f} s"
        )


# -- one case (in a fresh process) -----------------------------------------------------------------


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _reader(name: str, root: str) -> Callable[[], Any]:
    """The read of case ``name``, with what it needs imported (the imports are the case's own:
    they count in the whole-process figure, not in the in-process one)."""
    if name == "ts":
        import tensorstore as ts

        kvstore = {"driver": "file", "path": os.path.join(root, "data")}
        return lambda: ts.open({"driver": "zarr3", "kvstore": kvstore}).result().read().result()
    sys.path.insert(0, SRC)
    import shardwise

    if name == "direct":
        return lambda: shardwise.read_array(root, path="data")
    if name in ("engine", "engine-dask"):
        import xarray as xr

        kw: dict[str, Any] = {"chunks": {}} if name == "engine-dask" else {}
        if name == "engine-dask":
            import dask
            import dask.array

            dask.config.set(scheduler="threads")
        return lambda: xr.open_dataset(root, engine="shardwise", **kw)["data"].values
    import dask
    import dask.array

    dask.config.set(scheduler="threads")
    if name == "array":
        return lambda: shardwise.open_array(root, path="data").compute()
    if name == "array-graph":  # the blocks, assembled: what dask.compute runs
        return lambda: dask.compute(shardwise.open_array(root, path="data"))[0]
    if name == "array-whole":
        return lambda: shardwise.open_array(root, path="data", chunks=-1).compute()
    if name == "mean-dask":
        return lambda: float(shardwise.open_array(root, path="data").mean().compute())
    raise SystemExit(f"unknown case {name!r}")


def _peak_mib() -> float:
    """This process's own peak RSS (``VmHWM``), MiB: ``ru_maxrss`` carries the peak of the
    process that started this one across ``exec``."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def case(args: argparse.Namespace) -> None:
    name, root = args.case, args.root
    read = _reader(name, root)
    before = _rss_mib()
    c0 = os.times()
    t0 = time.perf_counter()
    got = read()
    t1 = time.perf_counter()
    end = time.time()
    c1 = os.times()
    peak = _peak_mib()
    rec: dict[str, Any] = dict(
        read_s=t1 - t0,
        read_end=end,
        cpu_s=(c1.user - c0.user) + (c1.system - c0.system),
        rss_before_mib=before,
        peak_rss_mib=peak,
        mean=got if name == "mean-dask" else None,
    )
    if name != "mean-dask":
        import crc32c

        out = np.ascontiguousarray(got)
        rec["crc"] = int(crc32c.crc32c(memoryview(out).cast("B")))
        rec["nbytes"] = int(out.nbytes)
        if name == "ts":
            rec["mean"] = float(out.mean(dtype=np.float64))
    print(json.dumps(rec))


# -- the driver ------------------------------------------------------------------------------------


def run_one(args: argparse.Namespace, wl: str, name: str) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "case", wl, name, root_of(args, wl)]
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode:
        return dict(workload=wl, case=name, error=p.stderr[-2000:])
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    rec["process_s"] = rec.pop("read_end") - start
    return dict(workload=wl, case=name, **rec)


def run(args: argparse.Namespace) -> None:
    cases = args.cases.split(",")
    out = open(args.out, "a") if args.out else None  # noqa: SIM115
    recs = []
    for rep in range(args.reps):
        for wl in args.workloads.split(","):
            shift = rep % len(cases)
            for name in cases[shift:] + cases[:shift]:
                rec = run_one(args, wl, name)
                rec["rep"] = rep
                rec["size"] = "small" if args.small else "medium" if args.medium else "full"
                recs.append(rec)
                line = json.dumps(rec)
                if out:
                    out.write(line + "\n")
                    out.flush()
                brief = {k: rec.get(k) for k in ("workload", "case", "rep", "read_s", "process_s")}
                print(json.dumps(brief) if "error" not in rec else line, flush=True)
    if out:
        out.close()
    print(table(recs))


def table(recs: list[dict[str, Any]]) -> str:
    """Markdown: medians (min-max) per case, ratios to tensorstore's median, peak RSS."""
    lines = [
        "| workload | case | in-process s | x ts | whole process s | x ts | CPU s of the read "
        "| peak RSS / array | RSS growth / array | equal to ts |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for wl in sorted({r["workload"] for r in recs}):
        mine = [r for r in recs if r["workload"] == wl and "error" not in r]
        ts = [r for r in mine if r["case"] == "ts"]
        if not ts:
            continue
        ts_read = statistics.median(r["read_s"] for r in ts)
        ts_proc = statistics.median(r["process_s"] for r in ts)
        crcs = {r["crc"] for r in ts}
        mean = ts[0]["mean"]
        nbytes = ts[0]["nbytes"]
        for name in CASES:
            rs = [r for r in mine if r["case"] == name]
            if not rs:
                continue
            rd = [r["read_s"] for r in rs]
            pr = [r["process_s"] for r in rs]
            peak = statistics.median(r["peak_rss_mib"] for r in rs) * 2**20 / nbytes
            grow = (
                statistics.median(r["peak_rss_mib"] - r["rss_before_mib"] for r in rs)
                * 2**20
                / nbytes
            )
            cpus = [r["cpu_s"] for r in rs if "cpu_s" in r]
            cpu = f"{statistics.median(cpus):.2f}" if cpus else "-"
            if name == "mean-dask":
                ok = all(abs(r["mean"] - mean) <= 1e-6 * max(1.0, abs(mean)) for r in rs)
            else:
                ok = all(r["crc"] in crcs for r in rs) and len(crcs) == 1
            lines.append(
                f"| {wl} | {name} | {statistics.median(rd):.2f} ({min(rd):.2f}-{max(rd):.2f}) "
                f"| {statistics.median(rd) / ts_read:.2f} "
                f"| {statistics.median(pr):.2f} ({min(pr):.2f}-{max(pr):.2f}) "
                f"| {statistics.median(pr) / ts_proc:.2f} | {cpu} | {peak:.2f} | {grow:.2f} "
                f"| {'yes' if ok else 'NO'} |"
            )
        errs = [r for r in recs if r["workload"] == wl and "error" in r]
        for r in errs:
            lines.append(f"| {wl} | {r['case']} | error: {r['error'][-200:]!r} |")
    return "\n".join(lines)


def report(args: argparse.Namespace) -> None:
    recs = []
    for path in args.files:
        with open(path) as f:
            recs.extend(json.loads(line) for line in f if line.strip())
    print(table(recs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("gen", "run"):
        s = sub.add_parser(name)
        s.add_argument("--dir", default="/tmp/shardwise-reads")
        s.add_argument("--small", action="store_true")
        s.add_argument("--medium", action="store_true", help=argparse.SUPPRESS)
        s.add_argument("--workloads", default="W1,W2,W3")
        if name == "gen":
            s.add_argument("--force", action="store_true")
        else:
            s.add_argument("--reps", type=int, default=5)
            s.add_argument("--cases", default=",".join(CASES))
            s.add_argument("--out")
    c = sub.add_parser("case")
    c.add_argument("workload")
    c.add_argument("case")
    c.add_argument("root")
    r = sub.add_parser("report")
    r.add_argument("files", nargs="+")
    args = p.parse_args()
    {"gen": gen, "run": run, "case": case, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
