#!/usr/bin/env python
"""W1 and W2 into an icechunk repository: shardwise against a plain store and icechunk's writers.

The W1/W2 geometry and data of ``benchmarks/workloads.py`` (``--small``: its small sizes): zstd
level 3 inner chunks, ``bytes`` + ``crc32c`` shard index at the end, fill value 0, dask chunks
equal to the shards (the workloads' page-cached ``.npy``, each task copying its own block out of
it), the threaded scheduler. Every array is written at the workload's variable name (``volume``,
``t2m``). Cases:

* ``sw-store``  shardwise into a plain local store: W1 ``write_array(x, path)``, W2
  ``shardwise.to_zarr(ds, path)`` (the Dataset with its coordinates);
* ``sw-repo``   the same call into a writable session of a new local-filesystem icechunk
  repository, then ``session.commit``;
* ``ic-dask``   ``icechunk.dask.store_dask`` of the variable's dask array (the array created
  first by zarr-python in the session with the same codecs, chunks and shards; a fork written,
  merged, committed): no coordinates, for W2 too;
* ``ic-xr``     ``icechunk.xarray.to_icechunk(ds, session, encoding=...)`` (W1 as a one-variable
  Dataset), then ``session.commit``.

Every case runs in a fresh process (after a tiny write of the same kind, outside the clock: the
imports and first calls), repetitions interleaved (rep 0 of every case, then rep 1, ...; the order
of the cases rotates each repetition). Per case: in-process seconds (the write, the merge and the
commit; ``commit_s`` the commit alone), CPU seconds over the same span (user + system of every
thread), whole-process seconds (the launch of the subprocess to the end of the commit), the growth
of the peak RSS (``VmHWM``) over the write in multiples of the array's bytes, the bytes stored.
After the timing every written array is read back by zarr-python shard by shard and compared with
the source (W2's coordinates by xarray's own zarr engine, where the writer wrote them).

Peak memory per task (``--mem-cases``, all four by default): each case once more on the
synchronous scheduler (one task at a time) with ``MALLOC_MMAP_THRESHOLD_`` set (freed large
buffers go back to the OS), the growth of its anonymous RSS sampled every millisecond, in
multiples of one shard's raw bytes (the task's input block is one of them). It includes what the
write keeps between tasks (the forks, the session's change set). icechunk's chunk bytes are held
in its own memory, so tracemalloc would miss them: RSS is the measure.

Usage::

    python benchmarks/icechunk_writes.py run [--small] [--reps 3] [--workloads W1,W2]
        [--cases sw-store,sw-repo,ic-dask,ic-xr] [--mem-cases ...] [--dir D] [--out FILE.jsonl]
        (rows appended to FILE.jsonl, by default benchmarks/results/icechunk-writes.jsonl)
    python benchmarks/icechunk_writes.py one WL CASE [--mem] [--small] [--dir D]
    python benchmarks/icechunk_writes.py report FILE.jsonl

``--small`` (alias ``--quick``) is the smoke run; its figures say nothing of speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
sys.path[:0] = [SRC, HERE]

import workloads  # noqa: E402

CASES = ("sw-store", "sw-repo", "ic-dask", "ic-xr")
MEM_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


# -- the writers ----------------------------------------------------------------------------------


def _zstd() -> Any:
    from zarr.codecs import ZstdCodec

    return ZstdCodec(level=workloads.ZSTD_LEVEL)


def _encoding(W: dict[str, Any]) -> dict[str, Any]:
    return {W["var"]: {"chunks": W["inner"], "shards": W["shard"], "compressors": (_zstd(),)}}


def _sw(W: dict[str, Any], ds: Any, target: Any) -> None:
    """shardwise's write of the workload into ``target`` (a path or a session): W2 (a Dataset
    with coordinates) through ``to_zarr``, the others through ``write_array``."""
    import shardwise

    if "time" in ds.coords:
        shardwise.to_zarr(ds, target, encoding=_encoding(W), mode="w")
        return
    shardwise.write_array(
        ds[W["var"]].data,
        target,
        path=W["var"],
        chunks=W["inner"],
        shards=W["shard"],
        fill_value=0,
        compressors=_zstd(),
        dimension_names=W["dims"],
        mode="w",
    )


def _ic_dask(W: dict[str, Any], ds: Any, session: Any) -> None:
    import zarr
    from icechunk.dask import store_dask

    zarr.create_array(
        session.store,
        name=W["var"],
        shape=W["shape"],
        dtype=W["dtype"],
        chunks=W["inner"],
        shards=W["shard"],
        compressors=_zstd(),
        fill_value=0,
        dimension_names=W["dims"],
    )
    fork = session.fork()
    target = zarr.open_array(fork.store, path=W["var"], mode="a")
    session.merge(store_dask(sources=[ds[W["var"]].data], targets=[target]))


def _ic_xr(W: dict[str, Any], ds: Any, session: Any) -> None:
    from icechunk.xarray import to_icechunk

    to_icechunk(ds, session, encoding=_encoding(W), mode="w")


WRITERS: dict[str, Callable[[dict[str, Any], Any, Any], None]] = {
    "sw-store": _sw,
    "sw-repo": _sw,
    "ic-dask": _ic_dask,
    "ic-xr": _ic_xr,
}


def write(case: str, W: dict[str, Any], ds: Any, root: str) -> tuple[Any, float]:
    """Write ``ds`` by ``case`` into a new store or repository at ``root``; returns what reads
    it back (a path, or the repository) and the seconds of the commit."""
    if case == "sw-store":
        WRITERS[case](W, ds, root)
        return root, 0.0
    import icechunk

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(root))
    session = repo.writable_session("main")
    WRITERS[case](W, ds, session)
    t0 = time.perf_counter()
    session.commit(case)
    return repo, time.perf_counter() - t0


def _tiny(W: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """A 2-shard array of the workload's kind (and a Dataset with a time axis for W2): the
    warm-up write of a case, outside the clock."""
    import dask.array as da
    import pandas as pd
    import xarray as xr

    nd = len(W["shape"])
    tiny = dict(W, shape=(4,) * nd, inner=(1,) * nd, shard=(2,) * nd)
    x = da.zeros(tiny["shape"], dtype=W["dtype"], chunks=2)
    coords = {"time": pd.date_range("2000-01-01", periods=4)} if "time" in W["dims"] else {}
    return tiny, xr.Dataset({W["var"]: (W["dims"], x)}, coords=coords)


# -- one case, in a fresh process -----------------------------------------------------------------


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class AnonSampler:
    """Peak anonymous RSS of this process, sampled every millisecond in a thread."""

    def __init__(self) -> None:
        self.base = self.peak = _vm("RssAnon")
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._th.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _vm("RssAnon"))

    def stop(self) -> int:
        self._stop.set()
        self._th.join()
        return max(self.peak, _vm("RssAnon")) - self.base


def _opened(target: Any, W: dict[str, Any]) -> Any:
    import zarr

    store = target if isinstance(target, str) else target.readonly_session("main").store
    return store, zarr.open_array(store, path=W["var"], mode="r")


def check(case: str, wl: str, target: Any) -> dict[str, Any]:
    """The array read back by zarr-python shard by shard against the source; W2's coordinates
    by xarray's zarr engine (not for ``ic-dask``, which writes the variable alone)."""
    import xarray as xr

    W = workloads.WORKLOADS[wl]
    src = workloads.load_src(wl)
    store, arr = _opened(target, W)
    bad = sum(
        not np.array_equal(arr[ssl], src[ssl]) for ssl in workloads.shard_slices(W)
    )  # fmt: skip
    out: dict[str, Any] = dict(ok=bad == 0, bad_shards=bad, shards_read=arr.shards == W["shard"])
    if "time" in W["dims"] and case != "ic-dask":
        back = xr.open_dataset(store, engine="zarr", consolidated=False)
        ref = workloads.make_ds(wl, W["shard"])
        out["coords_ok"] = all(
            np.array_equal(back[c].values, ref[c].values) for c in ("time", "lat", "lon")
        )
        out["ok"] = out["ok"] and out["coords_ok"]
    return out


def one(args: argparse.Namespace) -> None:
    """Run one case once (timed, or ``--mem``: on the synchronous scheduler with the anonymous
    RSS sampled); print its figures as one JSON line."""
    import dask
    from anchors_local import dir_bytes

    wl, case = args.wl, args.case
    W = workloads.WORKLOADS[wl]
    ds = workloads.make_ds(wl, W["shard"])
    root = os.path.join(args.dir, f"{workloads.tag(wl)}-{case}-{os.getpid()}")
    os.makedirs(args.dir, exist_ok=True)
    tiny, tiny_ds = _tiny(W)
    with dask.config.set(scheduler="threads"):  # imports and first calls: not timed
        write(case, tiny, tiny_ds, root + "-warm")
    shutil.rmtree(root + "-warm")
    scheduler = "sync" if args.mem else "threads"
    with dask.config.set(scheduler=scheduler):
        sampler = AnonSampler() if args.mem else None
        before, c0, t0 = _vm("VmHWM"), _cpu(), time.perf_counter()
        target, commit_s = write(case, W, ds, root)
        secs, cpu = time.perf_counter() - t0, _cpu() - c0
        done = time.time()  # the end of the commit on the wall clock: the whole-process figure
        grown = _vm("VmHWM") - before
        anon = sampler.stop() if sampler else None
    nbytes = int(np.prod(W["shape"])) * np.dtype(W["dtype"]).itemsize
    shard = int(np.prod(W["shard"])) * np.dtype(W["dtype"]).itemsize
    row: dict[str, Any] = dict(
        wl=wl, case=case, mode="mem" if args.mem else "time", scheduler=scheduler
    )
    row.update(
        s_in=round(secs, 4),
        cpu_in=round(cpu, 4),
        commit_s=round(commit_s, 4),
        rss_x=round(grown / nbytes, 3),
        stored_bytes=dir_bytes(root)[0],
        done=done,
    )
    if anon is not None:
        row.update(task_anon_mib=round(anon / 2**20, 1), task_x=round(anon / shard, 2))
        row["malloc_mmap_threshold"] = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    row.update(check(case, wl, target))
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(row), flush=True)


# -- the run --------------------------------------------------------------------------------------


def _child(args: argparse.Namespace, wl: str, case: str, mem: bool = False) -> dict[str, Any]:
    extra = (["--small"] if args.small else []) + (["--mem"] if mem else [])
    cmd = [sys.executable, __file__, "one", wl, case, "--dir", args.dir, *extra]
    env = {**os.environ, **(MEM_ENV if mem else {})}
    launched = time.time()
    got = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if got.returncode:
        raise SystemExit(f"{wl} {case} failed:\n{got.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(got.stdout.strip().splitlines()[-1])
    # from the launch to the end of the commit: interpreter start, imports, the warm-up write
    # and the timed one; not the check that follows
    row["s_whole"] = round(row.pop("done") - launched, 4)
    return row


def env_row() -> dict[str, Any]:
    import importlib.metadata as md

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    libs = ("icechunk", "zarr", "xarray", "dask", "numpy")
    head = subprocess.run(
        ["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return dict(
        case="env",
        size=workloads.SIZE,
        commit=head,
        python=platform.python_version(),
        cpus=os.cpu_count(),
        load=os.getloadavg(),
        **{lib: version(lib) for lib in libs},
    )


def run(args: argparse.Namespace) -> None:
    cases = args.cases.split(",") if args.cases else list(CASES)
    mem = args.mem_cases.split(",") if args.mem_cases else []
    wls = args.workloads.split(",")
    for wl in wls:  # the sources, generated once, before any timing
        workloads.load_src(wl)
    with open(args.out, "a") as out:

        def put(row: dict[str, Any]) -> None:
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)

        put(env_row())
        for rep in range(args.reps):
            order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
            for wl in wls:
                for case in order:
                    put(_child(args, wl, case) | {"rep": rep, "size": workloads.SIZE})
        for wl in wls:
            for case in mem:
                put(_child(args, wl, case, mem=True) | {"rep": 0, "size": workloads.SIZE})


def _span(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def report(args: argparse.Namespace) -> None:
    with open(args.file) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r.get("case") != "env"]
    by: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["wl"], r["case"], r["mode"]), []).append(r)

    def med(key: tuple[str, str, str], field: str) -> float:
        return statistics.median(r[field] for r in by[key])

    print(
        "| workload | case | n | in-process s (median, min-max) | CPU s | commit s | whole s "
        "(median, min-max) | RSS growth x array | stored MB | in / sw-store | in / sw-repo |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    timed = sorted((k for k in by if k[2] == "time"), key=lambda k: (k[0], CASES.index(k[1])))
    for key in timed:
        wl, case, _ = key
        rs = by[key]
        ratios = [
            f"{med(key, 's_in') / med((wl, ref, 'time'), 's_in'):.2f}"
            if (wl, ref, "time") in by
            else ""
            for ref in ("sw-store", "sw-repo")
        ]
        bad = "" if all(r["ok"] for r in rs) else " WRONG VALUES"
        print(
            f"| {wl} | {case} | {len(rs)} | {_span([r['s_in'] for r in rs])} "
            f"| {med(key, 'cpu_in'):.2f} | {med(key, 'commit_s'):.3f} "
            f"| {_span([r['s_whole'] for r in rs])} | {med(key, 'rss_x'):.2f} "
            f"| {med(key, 'stored_bytes') / 1e6:.1f} | {' | '.join(ratios)}{bad} |"
        )
    mem = sorted((k for k in by if k[2] == "mem"), key=lambda k: (k[0], CASES.index(k[1])))
    if mem:
        print("\nPeak memory per task (synchronous scheduler, anonymous RSS growth):\n")
        print("| workload | case | MiB | x shard | seconds (sync) |")
        print("|---|---|---|---|---|")
        for key in mem:
            bad = "" if all(r["ok"] for r in by[key]) else " WRONG VALUES"
            print(
                f"| {key[0]} | {key[1]} | {med(key, 'task_anon_mib'):.1f} "
                f"| {med(key, 'task_x'):.2f} | {med(key, 's_in'):.2f}{bad} |"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "one"):
        s = sub.add_parser(name)
        s.add_argument("--small", "--quick", action="store_true", dest="small")
        s.add_argument("--dir", default="/tmp/bench-icechunk")
        if name == "one":
            s.add_argument("wl", choices=("W1", "W2", "W3"))
            s.add_argument("case", choices=CASES)
            s.add_argument("--mem", action="store_true")
        else:
            s.add_argument("--workloads", default="W1,W2")
            s.add_argument("--reps", type=int, default=3)
            s.add_argument("--cases", default="", help="comma-separated (default: all)")
            s.add_argument("--mem-cases", default=",".join(CASES), help="'' for none")
            s.add_argument("--out", default=os.path.join(HERE, "results", "icechunk-writes.jsonl"))
    r = sub.add_parser("report")
    r.add_argument("file")
    args = p.parse_args()
    if getattr(args, "small", False):
        workloads.set_size("small")
    {"run": run, "one": one, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
