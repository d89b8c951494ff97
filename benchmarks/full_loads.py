#!/usr/bin/env python
"""Full loads through every door, against tensorstore in the same run (issue #21, item 2).

The W1/W2/W3 geometry and data of ``benchmarks/workloads.py`` (``--small``: its small sizes) are
written once by ``shardwise.to_zarr`` into ``--dir`` as a dataset of two variables, the workload's
own and a copy of it named ``<var>_2`` (for the door that computes several at once). Every case runs
in a fresh process, repetitions interleaved (rep 0 of every case, then rep 1, ...; the order of the
cases rotates each repetition).

Cases (``ds`` is ``xr.open_dataset(root, engine="shardwise", chunks={})``, the copy dropped unless
the case reads it; dask's threaded scheduler):

* ``ts``            tensorstore ``read()`` of the variable (the reference);
* ``ts-2``          tensorstore reads of both variables, issued together (the reference of
  ``dask.compute-2``);
* ``read_array``    ``shardwise.read_array(root, path=var)``;
* ``open_array``    ``shardwise.open_array(root, path=var).compute()``;
* ``load``          ``ds.load()`` (of a shallow copy of ``ds``, as every in-place load here);
* ``values``        ``ds[var].values``;
* ``compute``       ``ds.compute()``;
* ``asarray``       ``np.asarray(ds[var])``;
* ``DataArray.load`` ``ds[var].load()``;
* ``dask.compute-2`` ``dask.compute(ds[var].data, ds[var_2].data)``;
* ``blocks``        ``ds[var].values`` with dask's own array optimization configured, so the block
  graph runs (each block read, then dask's one-thread concatenation): the path before full loads
  became one read.

Per case: whole-process seconds (from the launch of the subprocess to the end of its load:
interpreter start, imports and the open included, the check against the source after it not: the
figure the targets are set on), in-process seconds (the load alone, after the open), and the
growth of the peak RSS over the load in multiples of the bytes loaded. Every result is compared
with the source after the timing.

Usage::

    python benchmarks/full_loads.py gen    [--small] [--dir D] [--workloads W1,W2,W3]
    python benchmarks/full_loads.py run    [--small] [--dir D] [--reps 3] [--out FILE.jsonl]
    python benchmarks/full_loads.py report FILE.jsonl
    python benchmarks/full_loads.py warm   [--small] [--dir D] [--reps 5]   # one process, warm
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
sys.path[:0] = [SRC, HERE]

import workloads  # noqa: E402

CASES = (
    "ts",
    "ts-2",
    "read_array",
    "open_array",
    "load",
    "values",
    "compute",
    "asarray",
    "DataArray.load",
    "dask.compute-2",
    "blocks",
)
REFERENCE = {"dask.compute-2": "ts-2"}  # the rest against "ts"


def root_of(args: argparse.Namespace, wl: str) -> str:
    return os.path.join(args.dir, f"{workloads.tag(wl)}-loads.zarr")


def gen(args: argparse.Namespace) -> None:
    from zarr.codecs import ZstdCodec

    import shardwise

    os.makedirs(args.dir, exist_ok=True)
    for wl in args.workloads.split(","):
        W = workloads.WORKLOADS[wl]
        root = root_of(args, wl)
        if os.path.exists(os.path.join(root, "zarr.json")) and not args.force:
            print(f"{wl}: {root} exists (--force rewrites it)")
            continue
        ds = workloads.make_ds(wl, tuple(W["shard"]))
        ds[f"{W['var']}_2"] = ds[W["var"]]
        enc = {"chunks": tuple(W["inner"]), "compressors": ZstdCodec(level=workloads.ZSTD_LEVEL)}
        t0 = time.perf_counter()
        shardwise.to_zarr(
            ds,
            root,
            shards=dict(zip(W["dims"], W["shard"], strict=True)),
            encoding={name: enc for name in ds.data_vars},
            mode="w",
        )
        print(f"{wl}: {root} written in {time.perf_counter() - t0:.1f} s", flush=True)


# -- one case, in a fresh process -----------------------------------------------------------------


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _load(case: str, root: str, var: str) -> Callable[[], list[np.ndarray]]:
    """The load of ``case`` as a function returning the arrays it loaded. Imports and the open
    (tensorstore's, ``open_array``'s, ``xr.open_dataset``'s; metadata only) are paid here: in the
    whole-process figure, not in the in-process one."""
    if case in ("ts", "ts-2"):
        import tensorstore as ts

        names = [var] if case == "ts" else [var, f"{var}_2"]

        def spec(name: str) -> dict[str, Any]:
            return {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{root}/{name}"}}

        stores = [ts.open(spec(n)).result() for n in names]
        # every read issued before the first is waited for
        return lambda: [r.result() for r in [a.read() for a in stores]]
    import shardwise

    # each door imports what its user's code would: read_array neither dask nor xarray,
    # open_array dask (it builds a dask array) but not xarray
    if case == "read_array":
        return lambda: [shardwise.read_array(root, path=var)]
    if case == "open_array":
        lazy = shardwise.open_array(root, path=var)
        return lambda: [lazy.compute()]
    import dask
    import dask.array
    import xarray as xr

    dask.config.set(scheduler="threads")
    both = case == "dask.compute-2"
    ds = xr.open_dataset(
        root, engine="shardwise", chunks={}, drop_variables=[] if both else [f"{var}_2"]
    )
    doors: dict[str, Callable[[], list[np.ndarray]]] = {
        # a shallow copy, so that a repeated load (``warm``) loads again: load() fills the
        # variables it is called on
        "load": lambda: [ds.copy().load()[var].values],
        "values": lambda: [ds[var].values],
        "compute": lambda: [ds.compute()[var].values],
        "asarray": lambda: [np.asarray(ds[var])],
        "DataArray.load": lambda: [ds.copy()[var].load().values],
        "dask.compute-2": lambda: list(dask.compute(ds[var].data, ds[f"{var}_2"].data)),
    }
    if case == "blocks":
        from dask.array.optimization import optimize

        def blocks() -> list[np.ndarray]:
            with dask.config.set(array_optimize=optimize):  # dask's own: the block graph runs
                return [ds[var].values]

        return blocks
    return doors[case]


def one(args: argparse.Namespace) -> None:
    """Run one case once; print its figures as one JSON line."""
    wl, case = args.wl, args.case
    W = workloads.WORKLOADS[wl]
    load = _load(case, root_of(args, wl), W["var"])
    before = _hwm_bytes()
    t0 = time.perf_counter()
    got = load()
    secs = time.perf_counter() - t0
    done = time.time()  # the end of the load on the wall clock: the parent's whole-process figure
    grown = _hwm_bytes() - before
    src = workloads.load_src(wl)
    ok = all(np.array_equal(g, src) for g in got)
    nbytes = sum(g.nbytes for g in got)
    out = dict(
        wl=wl, case=case, s_in=round(secs, 4), rss_x=round(grown / nbytes, 2), ok=ok, done=done
    )
    print(json.dumps(out), flush=True)


# -- the run --------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> None:
    cases = args.cases.split(",") if args.cases else list(CASES)
    size = ["--small"] if args.small else []
    with open(args.out, "a") as out:
        for rep in range(args.reps):
            order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
            for wl in args.workloads.split(","):
                for case in order:
                    cmd = [sys.executable, __file__, "one", wl, case, "--dir", args.dir, *size]
                    launched = time.time()
                    got = subprocess.run(cmd, capture_output=True, text=True, check=False)
                    if got.returncode:
                        raise SystemExit(f"{wl} {case} failed:\n{got.stderr[-3000:]}")
                    row = json.loads(got.stdout.strip().splitlines()[-1])
                    # from the launch to the end of the load: interpreter start, imports, the open
                    # and the load; not the check against the source that follows
                    whole = row.pop("done") - launched
                    row.update(rep=rep, s_whole=round(whole, 4), size=workloads.SIZE)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(json.dumps(row), flush=True)


def warm(args: argparse.Namespace) -> None:
    """Every case in this one process, after a first run of each (imports, dask's import of
    distributed on a first compute, the pool's threads): the loads alone, interleaved; medians."""
    cases = args.cases.split(",") if args.cases else list(CASES)
    for wl in args.workloads.split(","):
        var = workloads.WORKLOADS[wl]["var"]
        loads = {c: _load(c, root_of(args, wl), var) for c in cases}
        times: dict[str, list[float]] = {c: [] for c in cases}
        for rep in range(args.reps + 1):
            for c in cases:
                t0 = time.perf_counter()
                _ = loads[c]()
                if rep:
                    times[c].append(time.perf_counter() - t0)
        ts = statistics.median(times["ts"]) if "ts" in times else 0
        for c in cases:
            m = statistics.median(times[c])
            spread = f"{min(times[c]):.4f}-{max(times[c]):.4f}"
            print(f"{wl} {c:15s} {m:.4f} s ({spread})  x ts {m / ts if ts else 0:.2f}", flush=True)


def report(args: argparse.Namespace) -> None:
    with open(args.file) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["wl"], r["case"]), []).append(r)

    def med(wl: str, case: str, key: str) -> float:
        return statistics.median(r[key] for r in by[wl, case])

    print("| workload | case | n | whole s (median, min-max) | x ref | in-process s | RSS x |")
    print("|---|---|---|---|---|---|---|")
    for wl, case in sorted(by, key=lambda k: (k[0], CASES.index(k[1]))):
        rs = by[wl, case]
        whole = [r["s_whole"] for r in rs]
        ref = REFERENCE.get(case, "ts")
        ratio = med(wl, case, "s_whole") / med(wl, ref, "s_whole") if (wl, ref) in by else 0
        bad = "" if all(r["ok"] for r in rs) else " WRONG VALUES"
        print(
            f"| {wl} | {case} | {len(rs)} | {statistics.median(whole):.3f} "
            f"({min(whole):.3f}-{max(whole):.3f}) | {ratio:.2f} | {med(wl, case, 's_in'):.3f} "
            f"| {med(wl, case, 'rss_x'):.2f}{bad} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("gen", "run", "one", "warm"):
        s = sub.add_parser(name)
        s.add_argument("--small", action="store_true")
        s.add_argument("--dir", default="/tmp/bench-loads")
        if name == "one":
            s.add_argument("wl")
            s.add_argument("case", choices=CASES)
        else:
            s.add_argument("--workloads", default="W1,W2,W3")
        if name == "gen":
            s.add_argument("--force", action="store_true")
        if name in ("run", "warm"):
            s.add_argument("--reps", type=int, default=3)
            s.add_argument("--cases", default="", help="comma-separated (default: all)")
        if name == "run":
            s.add_argument("--out", default="full-loads.jsonl")
    r = sub.add_parser("report")
    r.add_argument("file")
    args = p.parse_args()
    if getattr(args, "small", False):
        workloads.set_size("small")
    {"gen": gen, "run": run, "one": one, "warm": warm, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
