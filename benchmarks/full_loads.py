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
* ``open_array-threads`` the same after ``dask.config.set(scheduler="threads")`` (as
  ``numpy_paths.py``'s ``sw-dask-read``);
* ``load``          ``ds.load()`` (of a shallow copy of ``ds``, as every in-place load here);
* ``values``        ``ds[var].values``;
* ``compute``       ``ds.compute()``;
* ``asarray``       ``np.asarray(ds[var])``;
* ``DataArray.load`` ``ds[var].load()``;
* ``dask.compute-2`` ``dask.compute(ds[var].data, ds[var_2].data)``;
* ``blocks``        ``ds[var].values`` with dask's own array optimization configured, so the block
  graph runs (each block read, then dask's one-thread concatenation): the path before full loads
  became one read;
* ``engine.load``   ``xr.open_dataset(root, engine="shardwise").load()`` without ``chunks``:
  xarray's lazy arrays over the engine's, no dask array (the process imports neither dask's
  array module nor distributed unless something else does).

``--ref DIR`` runs every shardwise case a second time per repetition with the ``src`` directory
``DIR`` (another checkout's, e.g. ``git worktree add /tmp/old <commit>``, then ``/tmp/old/src``)
in place of this checkout's, as ``<case>@ref``, interleaved with the rest; ``report`` gives each
``@ref`` row's ratio beside its case's. Both source trees are byte-compiled before the first case
(an installed package is; a source checkout run with ``PYTHONDONTWRITEBYTECODE`` set would compile
every module again in every process, 50-80 ms of a fresh process's read).

Per case: whole-process seconds (from the launch of the subprocess to the end of its load:
interpreter start, imports and the open included, the check against the source after it not: the
figure the targets are set on), in-process seconds (the load alone, after the open), and the
growth of the peak RSS over the load in multiples of the bytes loaded, and the CPU seconds of the
load (user + system of every thread, ``getrusage``; steadier than the wall clock on a shared
machine) and of the whole process up to its end. Every result is compared with the source after
the timing.

Usage::

    python benchmarks/full_loads.py gen    [--small] [--dir D] [--workloads W1,W2,W3]
    python benchmarks/full_loads.py run    [--small] [--dir D] [--reps 3] [--out FILE.jsonl]
                                           [--workloads W3] [--cases ts,open_array] [--ref DIR]
    python benchmarks/full_loads.py report FILE.jsonl
    python benchmarks/full_loads.py warm   [--small] [--dir D] [--reps 5]   # one process, warm
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# the shardwise sources a case runs (``--ref`` hands a case process another checkout's)
SRC = os.environ.get("BENCH_SHARDWISE_SRC") or os.path.join(os.path.dirname(HERE), "src")
sys.path[:0] = [SRC, HERE]

import workloads  # noqa: E402

CASES = (
    "ts",
    "ts-2",
    "read_array",
    "open_array",
    "open_array-threads",
    "load",
    "values",
    "compute",
    "asarray",
    "DataArray.load",
    "dask.compute-2",
    "blocks",
    "engine.load",
)
REFERENCE = {"dask.compute-2": "ts-2"}  # the rest against "ts"
REF = "@ref"  # the suffix of a case run with ``--ref``'s sources


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


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


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
    if case.startswith("open_array"):
        if case == "open_array-threads":
            import dask

            dask.config.set(scheduler="threads")
        lazy = shardwise.open_array(root, path=var)
        return lambda: [lazy.compute()]
    if case == "engine.load":
        import xarray as xr

        plain = xr.open_dataset(root, engine="shardwise", drop_variables=[f"{var}_2"])
        return lambda: [plain.load()[var].values]
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
    before, c0 = _hwm_bytes(), _cpu()
    t0 = time.perf_counter()
    got = load()
    secs = time.perf_counter() - t0
    done = time.time()  # the end of the load on the wall clock: the parent's whole-process figure
    cpu_whole = _cpu()
    grown = _hwm_bytes() - before
    src = workloads.load_src(wl)
    ok = all(np.array_equal(g, src) for g in got)
    nbytes = sum(g.nbytes for g in got)
    out = dict(
        wl=wl,
        case=case,
        s_in=round(secs, 4),
        cpu_in=round(cpu_whole - c0, 4),
        cpu_whole=round(cpu_whole, 4),
        rss_x=round(grown / nbytes, 2),
        ok=ok,
        done=done,
        imported_dask=[m for m in ("dask.array", "distributed") if m in sys.modules],
    )
    if "shardwise" in sys.modules:  # which checkout's code ran (``--ref``)
        out["src"] = os.path.dirname(os.path.dirname(sys.modules["shardwise"].__file__ or ""))
    print(json.dumps(out), flush=True)


# -- the run --------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> None:
    cases = args.cases.split(",") if args.cases else list(CASES)
    if args.ref:  # every shardwise case again with the other sources
        cases += [c + REF for c in cases if not c.startswith("ts")]
    size = ["--small"] if args.small else []
    for src in filter(None, (SRC, args.ref)):  # as an installed package would be
        compileall.compile_dir(src, quiet=1)
    with open(args.out, "a") as out:
        for rep in range(args.reps):
            order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
            for wl in args.workloads.split(","):
                for case in order:
                    name = case.removesuffix(REF)
                    env = dict(os.environ)
                    if case.endswith(REF):
                        env["BENCH_SHARDWISE_SRC"] = os.path.abspath(args.ref)
                    cmd = [sys.executable, __file__, "one", wl, name, "--dir", args.dir, *size]
                    launched = time.time()
                    got = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
                    if got.returncode:
                        raise SystemExit(f"{wl} {case} failed:\n{got.stderr[-3000:]}")
                    row = json.loads(got.stdout.strip().splitlines()[-1])
                    # from the launch to the end of the load: interpreter start, imports, the open
                    # and the load; not the check against the source that follows
                    whole = row.pop("done") - launched
                    row.update(case=case, rep=rep, s_whole=round(whole, 4), size=workloads.SIZE)
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
        return statistics.median(r.get(key, float("nan")) for r in by[wl, case])

    def spread(wl: str, case: str, key: str) -> str:
        got = [r[key] for r in by[wl, case]]
        return f"{statistics.median(got):.3f} ({min(got):.3f}-{max(got):.3f})"

    def ratio(wl: str, case: str, ref: str, key: str) -> str:
        return f"{med(wl, case, key) / med(wl, ref, key):.2f}" if (wl, ref) in by else ""

    print(
        "| workload | case | n | in-process s (median, min-max) | x ref | CPU s | whole s "
        "(median, min-max) | x ref | whole CPU s | RSS x |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")

    def order(k: tuple[str, str]) -> tuple[str, int, bool]:
        return k[0], CASES.index(k[1].removesuffix(REF)), k[1].endswith(REF)

    for wl, case in sorted(by, key=order):
        ref = REFERENCE.get(case.removesuffix(REF), "ts")
        bad = "" if all(r["ok"] for r in by[wl, case]) else " WRONG VALUES"
        print(
            f"| {wl} | {case} | {len(by[wl, case])} | {spread(wl, case, 's_in')} "
            f"| {ratio(wl, case, ref, 's_in')} | {med(wl, case, 'cpu_in'):.3f} "
            f"| {spread(wl, case, 's_whole')} | {ratio(wl, case, ref, 's_whole')} "
            f"| {med(wl, case, 'cpu_whole'):.3f} | {med(wl, case, 'rss_x'):.2f}{bad} |"
        )
    # within each repetition the cases ran within a minute of one another: the median of the
    # per-repetition ratios, and the ratio of the fastest runs, are less at the mercy of other
    # jobs on a shared machine than the ratio of the medians
    print(
        "\n| workload | case | in-process x ref (paired median; min/min) "
        "| whole x ref (paired median; min/min) | whole CPU x ref (paired median) |"
    )
    print("|---|---|---|---|---|")
    for wl, case in sorted(by, key=order):
        ref = REFERENCE.get(case.removesuffix(REF), "ts")
        if (wl, ref) not in by or case == ref:
            continue
        cells = [_paired(by[wl, case], by[wl, ref], k) for k in ("s_in", "s_whole", "cpu_whole")]
        print(f"| {wl} | {case} | {' | '.join(cells)} |")
    pairs = [(wl, c) for wl, c in sorted(by, key=order) if (wl, c + REF) in by]
    if pairs:
        head = "in-process x @ref | CPU x @ref | whole x @ref | whole CPU x @ref"
        print(f"\n| workload | case | {head} |")
        print("|---|---|---|---|---|---|")
        for wl, c in pairs:
            cells = [ratio(wl, c, c + REF, k) for k in ("s_in", "cpu_in", "s_whole", "cpu_whole")]
            print(f"| {wl} | {c} | {' | '.join(cells)} |")


def _paired(rows: list[dict[str, Any]], refs: list[dict[str, Any]], key: str) -> str:
    """The median (min-max) of ``rows``' ratios to ``refs``' of the same repetition, and the
    ratio of the two minima."""
    ref_of = {r["rep"]: r[key] for r in refs if key in r}
    got = [r[key] / ref_of[r["rep"]] for r in rows if key in r and r["rep"] in ref_of]
    if not got:
        return ""
    lowest = min(r[key] for r in rows if key in r) / min(ref_of.values())
    return f"{statistics.median(got):.2f} ({min(got):.2f}-{max(got):.2f}); {lowest:.2f}"


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
            s.add_argument("--ref", default="", help="another checkout's src directory")
    r = sub.add_parser("report")
    r.add_argument("file")
    args = p.parse_args()
    if getattr(args, "small", False):
        workloads.set_size("small")
    {"gen": gen, "run": run, "one": one, "warm": warm, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
