#!/usr/bin/env python
"""shardwise benchmark, side by side with the anchors and the machine's limits.

Everything it needs is in this directory: ``workloads.py`` (W1, W2, W3: definitions, seeded
sources generated into /tmp/bench-src on first use, the dask/xarray inputs) and
``anchors_local.py`` (the ``Meter``: wall, CPU of the process tree, sampled peak RSS; the limits
``g-limits``; the xarray, zarr-python and tensorstore cases; the read store and the verification
that compares every inner chunk with the source). This file adds the shardwise cases and runs
everything the same way: each case in a fresh subprocess, repetitions interleaved, stores deleted
after each case.

Subcommands (each takes ``--size full|small``; ``small`` runs the same cases on arrays of a few
MB, a smoke run in seconds):
  run     [--workloads W3,W1] [--cases ...] [--reps 3] [--once ...] --out FILE.jsonl
  case    WL CASE [--rep N] [--out FILE]   one run of one case (shardwise or anchor), one JSON line
  report  FILE.jsonl ...                   markdown: targets table + the per-workload tables
  profile WL CASE [--top 40]               one shardwise case under cProfile (all threads)
  gen     WL ...                           generate the seeded sources
  prepare-read WL                          write the store the read cases read
  list                                     workloads, case groups and cases
  clean                                    remove the sources and stores

Case groups for --cases: ``sw`` (all shardwise cases that apply to the workload), ``sw-write``,
``sw-read``, ``limits`` (g-limits), ``key`` (a-xr-threads, f2-ts-full-nosync, h-ts, h-xr-shards),
``write``/``mis``/``read`` (the anchor groups), or single case names.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# the benchmark modules next to this file, importable here and by dask workers (which unpickle
# the workloads' NpySource)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)

import anchors_local as A  # noqa: E402
import workloads as WL  # noqa: E402

WORKLOADS = WL.WORKLOADS


# ----------------------------------------------------------------------------------------------
# availability of the shardwise parts still in progress
# ----------------------------------------------------------------------------------------------
def _sw_to_zarr() -> Any:
    import shardwise

    fn = getattr(shardwise, "to_zarr", None)
    if fn is None:
        try:
            from shardwise.xarray import writer as xarray_write

            fn = getattr(xarray_write, "to_zarr", None)
        except ImportError:
            fn = None
    return fn


def _engine_available() -> bool:
    import xarray as xr

    try:
        return "shardwise" in xr.backends.list_engines()
    except Exception:  # a broken entry point counts as absent
        return False


def skip_note(case: str) -> str | None:
    """Why a shardwise case cannot run yet, or None."""
    if case.startswith("s-xr-") and _sw_to_zarr() is None:
        return (
            "skipped: shardwise.to_zarr does not exist yet "
            "(src/shardwise/xarray/writer.py not written or not exported)"
        )
    if case == "h-sw-engine" and not _engine_available():
        return (
            "skipped: xarray engine 'shardwise' is not registered yet "
            "(xr.backends.list_engines() has no 'shardwise')"
        )
    return None


# ----------------------------------------------------------------------------------------------
# shardwise cases (each returns the anchors' info dict: wall_s, cpu_s, peak_rss_mib, verify ...)
# ----------------------------------------------------------------------------------------------
def _dask_chunks(wl: str, chunks: str) -> tuple[int, ...]:
    W = WORKLOADS[wl]
    return {
        "shard": W["shard"],
        "mis": W["misaligned"],
        "cross": W["cross"],
        "inner": W["inner"],
    }[chunks]


def _zstd() -> Any:
    from zarr.codecs import ZstdCodec

    return ZstdCodec(level=WL.ZSTD_LEVEL)


def _report_dict(rep: Any) -> dict[str, Any]:
    keys = (
        "shards_written",
        "shards_empty",
        "shards_deleted",
        "bytes_stored",
        "raw_bytes",
        "stored_raw_bytes",
        "chunks_stored",
        "chunks_empty",
        "seconds",
    )
    out = {k: getattr(rep, k) for k in keys if hasattr(rep, k)}
    if hasattr(rep, "compression_ratio"):
        out["compression_ratio"] = rep.compression_ratio
    return out


def _warm_imports() -> float:
    """Import what the first dask compute of a process imports (dask.array and, through dask's
    scheduler lookup and shardwise's worker check, distributed: about 0.5 s together here), so
    the timed part measures the write or read, not a once-per-process import. Returns its cost,
    recorded as ``warm_imports_s``; the anchors' dask cases pay it inside their timed part."""
    t0 = time.perf_counter()
    import dask.array  # noqa: F401
    import distributed  # noqa: F401

    return time.perf_counter() - t0


def _readers(rep: int) -> list[str]:
    # tensorstore always, zarr-python as well on the first repetition
    return ["ts"] + (["zarr"] if rep == 0 else [])


def _start_cluster() -> tuple[Any, Any]:
    return A.start_cluster()


def case_sw_write(
    wl: str,
    rep: int,
    *,
    chunks: str = "shard",
    scheduler: str = "threads",
    strategy: str = "auto",
    source: str = "npy",
) -> dict:
    """``write_array`` of the workload: from the dask source (each task copies its block out
    of the page-cached ``.npy``), or with ``chunks="numpy"`` from the whole array loaded into
    memory before the timed part, the input tensorstore's write cases get. ``strategy`` is
    handed to ``write_array`` (the report records the one that ran and why).
    ``source="memory"``: the dask source's blocks are views of that in-memory array (threads
    only), so that the source costs nothing per block: aligned, misaligned and crossing chunks
    then differ only by what the write does with them."""
    import dask

    import shardwise

    W = WORKLOADS[wl]
    info: dict[str, Any] = dict(scheduler=scheduler, strategy_asked=strategy)
    if chunks == "numpy":
        data = np.ascontiguousarray(WL.load_src(wl, mmap=False))
        info["source"] = "numpy in memory"
    else:
        ch = _dask_chunks(wl, chunks)
        if source == "memory":
            import dask.array as da

            whole = np.ascontiguousarray(WL.load_src(wl, mmap=False))
            data = da.from_array(whole, chunks=ch, asarray=False, inline_array=True)
            info["source"] = "dask blocks: views of the array in memory"
        else:
            data = WL.dask_src(wl, ch)
        info.update(dask_chunks=list(ch), n_dask_chunks=int(np.prod(data.numblocks)))
    path = A.store_path(wl, f"sw-{chunks}-{source}", rep)
    info["warm_imports_s"] = _warm_imports()
    cluster = client = None
    if scheduler == "distributed":
        t0 = time.perf_counter()
        cluster, client = _start_cluster()
        info["cluster_start_s"] = round(time.perf_counter() - t0, 2)
    ctx = dask.config.set(scheduler="threads") if scheduler == "threads" else dask.config.set({})
    try:
        with ctx, warnings.catch_warnings(record=True) as wlist:
            warnings.simplefilter("always")
            with A.Meter() as m:
                report = shardwise.write_array(
                    data,
                    path,
                    chunks=W["inner"],
                    shards=W["shard"],
                    dtype=W["dtype"],
                    fill_value=0,
                    compressors=_zstd(),
                    dimension_names=W["dims"],
                    mode="w",
                    strategy=strategy,
                )
            info["warnings"] = sorted(
                {f"{w.category.__name__}: {str(w.message)[:160]}" for w in wlist}
            )
    finally:
        if client is not None:
            client.close()
            cluster.close()
    info.update(m.result())
    info["write_report"] = _report_dict(report)
    info["store_bytes"], info["store_files"] = A.dir_bytes(path)
    info["verify"] = A.verify_all(wl, path, _readers(rep))
    A.rmtree(path)
    return info


def case_sw_xr_write(wl: str, rep: int, *, chunks: str = "shard") -> dict:
    """W2 (or any workload) as an xarray Dataset through shardwise.to_zarr."""
    import dask
    import xarray as xr

    to_zarr = _sw_to_zarr()
    W = WORKLOADS[wl]
    ch = _dask_chunks(wl, chunks)
    ds = WL.make_ds(wl, ch)
    path = A.store_path(wl, f"swxr-{chunks}", rep)
    enc = A.xr_encoding(W)  # chunks = inner, shards = shard, zstd-3: the same as the anchors
    info: dict[str, Any] = dict(
        dask_chunks=list(ch),
        n_dask_chunks=int(np.prod(ds[W["var"]].data.numblocks)),
        scheduler="threads",
    )
    info["warm_imports_s"] = _warm_imports()
    with dask.config.set(scheduler="threads"), warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")
        with A.Meter() as m:
            out = to_zarr(ds, path, encoding=enc, mode="w")
        info["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in wlist})
    info.update(m.result())
    if out is not None and hasattr(out, "shards_written"):
        info["write_report"] = _report_dict(out)
    info["store_bytes"], info["store_files"] = A.dir_bytes(path)
    info["verify"] = A.verify_all(wl, os.path.join(path, W["var"]), _readers(rep))
    # coordinates, attributes and dims as xarray reads them (the data was checked above)
    try:
        back = xr.open_zarr(path, zarr_format=3)
        src = ds.drop_vars(W["var"])
        xr.testing.assert_identical(back.drop_vars(W["var"]).load(), src.load())
        same_attrs = back[W["var"]].attrs == ds[W["var"]].attrs
        same_dims = back[W["var"]].dims == ds[W["var"]].dims
        info["coords_ok"] = bool(same_attrs and same_dims)
        if not info["coords_ok"]:
            info["coords_problem"] = f"attrs {back[W['var']].attrs} dims {back[W['var']].dims}"
    except Exception as e:
        info["coords_ok"] = False
        info["coords_problem"] = f"{type(e).__name__}: {str(e)[:300]}"
    if not info["coords_ok"]:
        info["verify"]["ok"] = False
        info["verify"]["all_readers"].append("xarray coords: " + info["coords_problem"][:200])
    A.rmtree(path)
    return info


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class AnonSampler:
    """Peak anonymous RSS of this process, sampled every ``interval`` seconds in a thread."""

    def __init__(self, interval: float = 0.001) -> None:
        import threading

        self.interval = interval
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self.base = self.peak = _vm("RssAnon")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _vm("RssAnon"))
            self._stop.wait(self.interval)

    def __enter__(self) -> AnonSampler:
        self.base = self.peak = _vm("RssAnon")
        self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()
        self.peak = max(self.peak, _vm("RssAnon"))


def case_sw_task_mem(wl: str, rep: int) -> dict:
    """Peak memory of one shard write task: one interior shard written as a region write from
    a one-chunk dask array (the workloads' NpySource, so the task loads its own input block).

    After a warm-up write of another shard, measured twice: the growth of anonymous RSS sampled
    every 1 ms (the source's memmap pages are file-backed and not counted; the driver runs this
    case with MALLOC_MMAP_THRESHOLD_ so freed large buffers return to the OS), and tracemalloc's
    peak (Python and numpy allocations). Both include the task's input block; given in multiples
    of the shard's raw bytes. The floor is raw + encoded.
    """
    import tracemalloc

    import dask

    import shardwise

    W = WORKLOADS[wl]
    slices = list(WL.shard_slices(W))
    warm, target = slices[0], slices[len(slices) // 2 + 1]
    src = WL.dask_src(wl, W["shard"])
    path = A.store_path(wl, "sw-taskmem", rep)
    shard_raw = int(np.prod([s.stop - s.start for s in target])) * np.dtype(W["dtype"]).itemsize
    A.zarr_create(path, W)  # same metadata as every other case
    info: dict[str, Any] = dict(
        shard=[[s.start, s.stop] for s in target],
        shard_raw_bytes=shard_raw,
        malloc_mmap_threshold=os.environ.get("MALLOC_MMAP_THRESHOLD_"),
    )
    kw = dict(mode="r+")
    with dask.config.set(scheduler="threads"):
        shardwise.write_array(src[warm], path, region=warm, **kw)
        with AnonSampler() as m:
            t0 = time.perf_counter()
            report = shardwise.write_array(src[target], path, region=target, **kw)
            info["wall_s"] = time.perf_counter() - t0
        # the same task again (it rewrites the shard with the same bytes) under tracemalloc
        tracemalloc.start()
        shardwise.write_array(src[target], path, region=target, **kw)
        _cur, tpeak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    encoded = int(report.bytes_stored)
    info.update(
        encoded_bytes=encoded,
        raw_plus_encoded_x=(shard_raw + encoded) / shard_raw,
        anon_peak_mib=(m.peak - m.base) / 2**20,
        anon_task_x=(m.peak - m.base) / shard_raw,
        tracemalloc_peak_mib=tpeak / 2**20,
        tracemalloc_task_x=tpeak / shard_raw,
        write_report=_report_dict(report),
    )
    # check the shard against the source with tensorstore
    import tensorstore as ts

    t = ts.open(A.ts_spec(path), open=True, read=True).result()
    ok = bool(np.array_equal(t[target].read().result(), WL.load_src(wl)[target]))
    info["verify"] = dict(
        reader="tensorstore",
        ok=ok,
        bad_inner_chunks=0 if ok else -1,
        total_inner_chunks=0,
        bad_chunks_all_fill=0,
        all_readers=["tensorstore:" + ("ok" if ok else "BAD")],
    )
    A.rmtree(path)
    return info


def case_sw_read(wl: str, rep: int, *, how: str) -> dict:
    """Full read of the read store (written by xarray, prepare-read) with shardwise."""
    import dask

    W = WORKLOADS[wl]
    path = A.read_store_path(wl)
    arr_path = os.path.join(path, W["var"])
    if not os.path.exists(arr_path):
        raise RuntimeError(f"read store missing: run `bench.py prepare-read {wl}` first")
    info: dict[str, Any] = dict(how=how)
    info["warm_imports_s"] = _warm_imports()
    with dask.config.set(scheduler="threads"), warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")
        if how == "array":
            import shardwise

            with A.Meter() as m:
                arr = shardwise.open_array(arr_path)
                info["n_dask_chunks"] = int(np.prod(arr.numblocks))
                out = arr.compute()
        elif how == "engine":
            import xarray as xr

            with A.Meter() as m:
                ds = xr.open_dataset(path, engine="shardwise", chunks={})
                v = ds[W["var"]]
                info["n_dask_chunks"] = int(np.prod(v.data.numblocks))
                info["dask_chunksize"] = list(v.data.chunksize)
                out = v.values
        else:
            raise ValueError(how)
        info["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in wlist})
    info.update(m.result())
    info["read_ok"] = bool(np.array_equal(np.asarray(out), WL.load_src(wl)))
    return info


SW_CASES: dict[str, tuple[Any, str]] = {
    "s-w-shards": (
        lambda wl, r: case_sw_write(wl, r),
        "shardwise.write_array(dask), dask chunks = shards, threads",
    ),
    "s-w-numpy": (
        lambda wl, r: case_sw_write(wl, r, chunks="numpy"),
        "shardwise.write_array(numpy array in memory: tensorstore's input), threads",
    ),
    "s-w-mis": (
        lambda wl, r: case_sw_write(wl, r, chunks="mis"),
        "shardwise.write_array(dask), the anchors' sub-shard chunks (as b1/b3), threads",
    ),
    "s-w-cross": (
        lambda wl, r: case_sw_write(wl, r, chunks="cross"),
        "shardwise.write_array(dask), chunks crossing shard boundaries, threads",
    ),
    "s-w-shards-mem": (
        lambda wl, r: case_sw_write(wl, r, source="memory"),
        "s-w-shards from dask blocks that are views of the array in memory (no per-block cost)",
    ),
    "s-w-mis-mem": (
        lambda wl, r: case_sw_write(wl, r, chunks="mis", source="memory"),
        "s-w-mis from dask blocks that are views of the array in memory",
    ),
    "s-w-cross-mem": (
        lambda wl, r: case_sw_write(wl, r, chunks="cross", source="memory"),
        "s-w-cross from dask blocks that are views of the array in memory",
    ),
    "s-w-dist": (
        lambda wl, r: case_sw_write(wl, r, scheduler="distributed"),
        "shardwise.write_array(dask), chunks = shards, LocalCluster 2 procs x 1 thread",
    ),
    "s-w-mis-dist": (
        lambda wl, r: case_sw_write(wl, r, chunks="mis", scheduler="distributed"),
        "shardwise.write_array(dask), the anchors' sub-shard chunks, LocalCluster 2 x 1 thread",
    ),
    "s-w-mis-dist-direct": (
        lambda wl, r: case_sw_write(
            wl, r, chunks="mis", scheduler="distributed", strategy="direct"
        ),
        "s-w-mis-dist with strategy='direct' (the rechunk runs on the cluster)",
    ),
    "s-w-mis-staged": (
        lambda wl, r: case_sw_write(wl, r, chunks="mis", strategy="staged"),
        "s-w-mis with strategy='staged' (the pieces go through the store)",
    ),
    "s-xr-w": (
        lambda wl, r: case_sw_xr_write(wl, r),
        "shardwise.to_zarr(Dataset), dask chunks = shards, threads",
    ),
    "s-xr-w-mis": (
        lambda wl, r: case_sw_xr_write(wl, r, chunks="mis"),
        "shardwise.to_zarr(Dataset), the anchors' sub-shard chunks, threads",
    ),
    "s-task-mem": (
        lambda wl, r: case_sw_task_mem(wl, r),
        "peak memory of one shard write task (not timed as a write)",
    ),
    "h-sw-array": (
        lambda wl, r: case_sw_read(wl, r, how="array"),
        "shardwise.open_array(path).compute(), threads",
    ),
    "h-sw-engine": (
        lambda wl, r: case_sw_read(wl, r, how="engine"),
        "xr.open_dataset(path, engine='shardwise', chunks={}).values, threads",
    ),
}
# environment per case (set by the driver for the case subprocess)
CASE_ENV = {"s-task-mem": {"MALLOC_MMAP_THRESHOLD_": "131072"}}
# not timed writes: keep them out of the write tables
NOT_TIMED = {"s-task-mem"}


def _register_cases() -> None:
    """Insert the shardwise cases into the anchors' registry (writes after the anchor writes,
    reads after its reads) so that its report prints them in the right tables."""
    new: dict[str, Any] = {}
    writes = {k: v for k, v in SW_CASES.items() if k.startswith("s-") and k not in NOT_TIMED}
    reads = {k: v for k, v in SW_CASES.items() if k.startswith("h-")}
    items = list(A.CASES.items())
    first_read = next(i for i, (k, _v) in enumerate(items) if k.startswith("h-"))
    new.update(items[:first_read])
    new.update(writes)
    new.update(items[first_read:])
    new.update(reads)
    A.CASES = new


_register_cases()

KEY_ANCHORS = ["a-xr-threads", "f2-ts-full-nosync", "h-ts", "h-xr-shards"]
SW_WRITE = {
    "W1": ["s-w-shards", "s-w-numpy", "s-w-mis", "s-w-cross", "s-task-mem"],
    "W2": ["s-xr-w", "s-task-mem"],
    "W3": ["s-w-shards", "s-w-numpy", "s-w-mis", "s-w-cross", "s-task-mem"],
}
SW_READ = {
    "W1": ["h-sw-array", "h-sw-engine"],
    "W2": ["h-sw-engine"],
    "W3": ["h-sw-array", "h-sw-engine"],
}


def expand_cases(wl: str, spec: str) -> list[str]:
    out: list[str] = []
    for c in (x.strip() for x in spec.split(",")):
        if not c:
            continue
        if c == "sw":
            out += SW_WRITE[wl] + SW_READ[wl]
        elif c == "sw-write":
            out += SW_WRITE[wl]
        elif c == "sw-read":
            out += SW_READ[wl]
        elif c == "limits":
            out.append("g-limits")
        elif c == "key":
            out += KEY_ANCHORS
        elif c == "write":
            out += A.WRITE_CASES
        elif c == "mis":
            out += A.MIS_CASES + A.MIS_CASES_EXTRA.get(wl, [])
        elif c == "read":
            out += A.READ_CASES
        elif c in A.CASES or c in SW_CASES:
            out.append(c)
        else:
            raise SystemExit(f"unknown case or group {c!r} (see `bench.py list`)")
    seen: set[str] = set()
    return [c for c in out if not (c in seen or seen.add(c))]  # type: ignore[func-returns-value]


# ----------------------------------------------------------------------------------------------
# one case, in this process (called in a fresh subprocess by the driver)
# ----------------------------------------------------------------------------------------------
def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    return str(o)


def run_case(wl: str, case: str, rep: int, out: str | None) -> dict:
    t0 = time.time()
    rec: dict[str, Any] = dict(
        workload=wl, case=case, rep=rep, started=t0, loadavg_start=os.getloadavg()[0]
    )
    note = skip_note(case) if case in SW_CASES else None
    if note:
        rec.update(status="skipped", note=note, error=note)
    else:
        fn = SW_CASES[case][0] if case in SW_CASES else A.CASES[case][0]
        try:
            info = fn(wl, rep)
            rec.update(info)
            rec["status"] = "error-expected" if "error" in info else "ok"
        except Exception as e:
            rec["status"] = "failed"
            rec["exception"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()[-3000:]
    rec["elapsed_total_s"] = time.time() - t0
    line = json.dumps(rec, default=_json_default)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
    print(line[:1500], flush=True)
    return rec


# ----------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------
def _cpu_busy_s() -> float:
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    v = [int(x) for x in parts]
    # user + nice + system + irq + softirq + steal
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _git_state() -> dict[str, Any]:
    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", REPO, *a], capture_output=True, text=True, timeout=20
            ).stdout.strip()
        except Exception:
            return ""

    import hashlib

    dirty = [x for x in git("status", "--porcelain", "--", "src").splitlines() if x.strip()]
    h = hashlib.blake2b(digest_size=8)  # the source actually measured (the tree may be dirty)
    src = os.path.join(REPO, "src", "shardwise")
    for name in sorted(os.listdir(src)) if os.path.isdir(src) else []:
        if name.endswith(".py"):
            with open(os.path.join(src, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return dict(
        git_head=git("rev-parse", "--short", "HEAD"),
        git_dirty_src_files=len(dirty),
        src_hash=h.hexdigest(),
    )


def env_record(argv: list[str]) -> dict[str, Any]:
    import importlib.metadata as md

    v = A.versions()
    for p in ("shardwise", "zstandard", "tensorstore"):
        try:
            v[p] = md.version(p)
        except Exception:
            v[p] = None
    v["size"] = WL.SIZE
    v["shardwise_to_zarr"] = _sw_to_zarr() is not None
    v["shardwise_engine"] = _engine_available()
    v.update(_git_state())
    v["loadavg"] = os.getloadavg()
    return dict(workload="env", case="env", rep=0, started=time.time(), argv=argv, **v)


def _cleanup_case_stores(pid: int) -> None:
    d = A.STORE_DIR
    if not os.path.isdir(d):
        return
    for p in os.listdir(d):
        if p.endswith((f"-{pid}", f"-{pid}.zarr")):
            A.rmtree(os.path.join(d, p))


def run_one_subprocess(wl: str, case: str, rep: int, out: str, waited: float = 0.0) -> None:
    env = dict(os.environ)
    env.update(CASE_ENV.get(case, {}))
    fd, tmp = tempfile.mkstemp(prefix="bench-case-", suffix=".jsonl")
    os.close(fd)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "case",
        wl,
        case,
        "--rep",
        str(rep),
        "--out",
        tmp,
    ]
    busy0, own0, t0 = _cpu_busy_s(), _children_cpu_s(), time.time()
    proc = subprocess.Popen(cmd, env=env)
    timed_out = False
    try:
        proc.wait(timeout=A.CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.kill()
        proc.wait()
    elapsed = time.time() - t0
    foreign = max(0.0, (_cpu_busy_s() - busy0) - (_children_cpu_s() - own0)) / max(elapsed, 1e-9)
    _cleanup_case_stores(proc.pid)
    with open(tmp) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    os.unlink(tmp)
    if timed_out or not lines:
        lines = [
            dict(
                workload=wl,
                case=case,
                rep=rep,
                started=t0,
                status="timeout" if timed_out else "failed",
                exception=f"timeout after {A.CASE_TIMEOUT_S} s"
                if timed_out
                else f"case process exited with {proc.returncode} and no record",
            )
        ]
    with open(out, "a") as f:
        for rec in lines:
            # CPU seconds/s used by other processes on the machine while this case ran (all of
            # the subprocess' life, not only the timed part): a measure of interference
            rec["foreign_cpu_cores"] = round(foreign, 3)
            rec["waited_for_quiet_s"] = round(waited, 1)
            f.write(json.dumps(rec, default=_json_default) + "\n")


def wait_for_quiet(max_foreign: float, max_wait: float) -> float:
    """Wait until other processes use less than ``max_foreign`` cores (5 s windows), at most
    ``max_wait`` seconds. Returns the seconds waited. The driver itself is idle meanwhile."""
    if max_foreign <= 0:
        return 0.0
    t0 = time.time()
    while True:
        b0 = _cpu_busy_s()
        time.sleep(5)
        used = (_cpu_busy_s() - b0) / 5
        if used < max_foreign or time.time() - t0 > max_wait:
            return time.time() - t0


def driver(args: argparse.Namespace) -> None:
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "a") as f:
        f.write(json.dumps(env_record(sys.argv), default=_json_default) + "\n")
    once = {c.strip() for c in args.once.split(",") if c.strip()}
    for wl in args.workloads.split(","):
        cases = expand_cases(wl, args.cases)
        for c in sorted(once):
            if c not in cases:
                cases.append(c)
        skipped = {c: skip_note(c) for c in cases if c in SW_CASES and skip_note(c)}
        runnable = [c for c in cases if c not in skipped]
        if runnable and not os.path.exists(WL.src_path(wl)):
            WL.gen(wl)
        needs_read = any(c.startswith(("h-", "i-")) for c in runnable)
        if needs_read:
            subprocess.run(
                [sys.executable, os.path.abspath(__file__), "prepare-read", wl],
                check=True,
                cwd=tempfile.gettempdir(),
            )
        try:
            for rep in range(args.reps):
                for case in cases:
                    if rep > 0 and (case in once or case.startswith("b0-")):
                        continue
                    if case in skipped:
                        if rep == 0:
                            with open(out, "a") as f:
                                f.write(
                                    json.dumps(
                                        dict(
                                            workload=wl,
                                            case=case,
                                            rep=rep,
                                            started=time.time(),
                                            status="skipped",
                                            note=skipped[case],
                                            error=skipped[case],
                                        )
                                    )
                                    + "\n"
                                )
                            print(f"### {wl} {case}: {skipped[case]}", flush=True)
                        continue
                    waited = wait_for_quiet(args.quiet, args.quiet_wait)
                    print(
                        f"### {wl} {case} rep={rep} (waited {waited:.0f} s for a quiet machine)",
                        flush=True,
                    )
                    run_one_subprocess(wl, case, rep, out, waited)
        finally:
            if needs_read and not args.keep_read_store:
                A.rmtree(A.read_store_path(wl))


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------
# ratios to the limit of the anchors' reference run (RESULTS-anchors.md, 22 Nov), for context
REF_RUN = {
    ("W1", "f2-ts-full-nosync"): 1.09,
    ("W1", "a-xr-threads"): 1.37,
    ("W3", "f2-ts-full-nosync"): 1.43,
    ("W3", "a-xr-threads"): 20.18,
    ("W2", "f2-ts-full-nosync"): 1.36,
    ("W2", "a-xr-threads"): 1.47,
    ("W1", "h-ts"): 1.88,
    ("W3", "h-ts"): 1.96,
    ("W1", "h-xr-shards"): 4.24,
    ("W3", "h-xr-shards"): 35.42,
    ("W3", "h-xr-default"): 267.73,
    ("W1", "h-xr-default"): 8.75,
}

TARGETS = [
    # workload, case, kind, target (x limit), anchor cases to compare with
    ("W1", "s-w-shards", "write", 1.05, ["f2-ts-full-nosync", "a-xr-threads"]),
    ("W1", "s-w-numpy", "write", None, ["f2-ts-full-nosync"]),
    ("W1", "s-w-mis", "write", None, ["b3-xr-mis-align-threads", "f2-ts-full-nosync"]),
    ("W1", "s-w-cross", "write", None, ["f2-ts-full-nosync"]),
    ("W3", "s-w-shards", "write", 1.15, ["f2-ts-full-nosync", "a-xr-threads"]),
    ("W3", "s-w-numpy", "write", None, ["f2-ts-full-nosync"]),
    ("W3", "s-w-mis", "write", None, ["b3-xr-mis-align-threads", "f2-ts-full-nosync"]),
    ("W3", "s-w-cross", "write", None, ["f2-ts-full-nosync"]),
    ("W2", "s-xr-w", "write", 1.10, ["a-xr-threads", "f2-ts-full-nosync"]),
    ("W1", "h-sw-array", "read", 1.40, ["h-ts", "h-xr-shards"]),
    ("W1", "h-sw-engine", "read", 1.40, ["h-ts", "h-xr-shards"]),
    ("W3", "h-sw-array", "read", 1.30, ["h-ts", "h-xr-shards"]),
    ("W3", "h-sw-engine", "read", 1.30, ["h-ts", "h-xr-shards", "h-xr-default"]),
    ("W2", "h-sw-engine", "read", None, ["h-ts", "h-xr-shards"]),
]


def _load(paths: list[str]) -> list[dict]:
    recs = []
    for p in paths:
        with open(p) as f:
            recs += [json.loads(x) for x in f if x.strip()]
    return recs


def _med(v: list[float]) -> float:
    return statistics.median(v) if v else float("nan")


def targets_report(recs: list[dict]) -> str:
    by: dict[tuple[str, str], list[dict]] = {}
    for r in recs:
        by.setdefault((r["workload"], r["case"]), []).append(r)

    def ok_walls(wl: str, c: str) -> list[float]:
        return [r["wall_s"] for r in by.get((wl, c), []) if r.get("status") == "ok"]

    def limit(wl: str, key: str) -> float:
        return _med([r[key] for r in by.get((wl, "g-limits"), []) if r.get("status") == "ok"])

    lines = [
        "### Targets: shardwise against the machine's limits and the anchors (medians)\n",
        "| workload | case | n | median s | spread s | x limit | target | met | vs anchors "
        "(median ratio; anchor x limit) | CPU util | peak RSS MiB (Δanon) | other load "
        "(cores) | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for wl, case, kind, tgt, anchors in TARGETS:
        rs = by.get((wl, case))
        if not rs:
            continue
        walls = ok_walls(wl, case)
        lim = limit(wl, "write_limit_s" if kind == "write" else "read_limit_s")
        if not walls:
            st = rs[0].get("status", "?")
            msg = rs[0].get("note") or rs[0].get("exception") or ""
            lines.append(
                f"| {wl} | {case} | 0 | {st} | | | {tgt or ''} | n/a | | | | | {msg[:160]} |"
            )
            continue
        m = _med(walls)
        ok = [r for r in rs if r.get("status") == "ok"]
        x = m / lim if lim == lim else float("nan")
        met = "n/a" if tgt is None or x != x else ("yes" if x <= tgt else "**no**")
        vs = []
        for a in anchors:
            aw = ok_walls(wl, a)
            ref = REF_RUN.get((wl, a))
            if aw:
                vs.append(f"{m / _med(aw):.2f}x {a} ({_med(aw) / lim:.2f}x lim)")
            elif ref is not None:
                vs.append(f"{a} not run (ref run {ref:.2f}x lim)")
        util = _med([r["cpu_s"] / r["wall_s"] for r in ok if "cpu_s" in r])
        rss = _med([r.get("peak_rss_mib", float("nan")) for r in ok])
        dan = _med([r.get("delta_anon_mib", float("nan")) for r in ok])
        checks = []
        for r in ok:
            if "verify" in r:
                v = r["verify"]
                checks.append(
                    "ok"
                    if v["ok"]
                    else f"CORRUPT {v.get('bad_inner_chunks')}/{v.get('total_inner_chunks')}"
                )
            elif "read_ok" in r:
                checks.append("ok" if r["read_ok"] else "MISMATCH")
        chk = ", ".join(sorted(set(checks)))
        if ok and "verify" in ok[0]:
            readers = sorted(
                {x.split(":")[0] for r in ok for x in r["verify"].get("all_readers", [])}
            )
            chk += f" ({' + '.join(readers)})"
        fc = [r["foreign_cpu_cores"] for r in ok if "foreign_cpu_cores" in r]
        fcs = f"{_med(fc):.2f} (max {max(fc):.2f})" if fc else "n/a"
        nf = len(rs) - len(ok)
        if nf:
            chk += f"; {nf} not ok: {(rs[0].get('exception') or rs[0].get('status'))[:80]}"
        lines.append(
            f"| {wl} | {case} | {len(ok)} | {m:.2f} | {min(walls):.2f}-{max(walls):.2f} | "
            f"{x:.2f} | {'<= ' + format(tgt, '.2f') if tgt else ''} | {met} | "
            f"{'; '.join(vs)} | {100 * util:.0f}% | {rss:.0f} ({dan:+.0f}) | {fcs} | "
            f"{chk} |"
        )
    if len(lines) == 3:
        lines = []
    # the engine against xr.open_zarr with default chunks
    eng, dflt = ok_walls("W3", "h-sw-engine"), ok_walls("W3", "h-xr-default")
    if eng or dflt:
        if eng and dflt:
            sp = _med(dflt) / _med(eng)
            lines.append(
                f"\nW3 engine read vs `xr.open_zarr` default chunks (h-xr-default, "
                f"n={len(dflt)}): **{sp:.0f}x faster** (target > 100x: "
                f"{'met' if sp > 100 else '**not met**'})."
            )
        elif eng:
            lines.append(
                f"\nW3 engine read: h-xr-default not run here; ref run 119.87 s -> "
                f"{119.87 / _med(eng):.0f}x."
            )
    # memory of one write task
    mem = [
        (wl, [r for r in by.get((wl, "s-task-mem"), []) if r.get("status") == "ok"])
        for wl in WORKLOADS
    ]
    mem = [(wl, rs) for wl, rs in mem if rs]
    if mem:
        lines += [
            "\nPeak memory of one shard write task (s-task-mem), input block included, in "
            "multiples of the shard's raw bytes (target about 2x; floor raw + encoded):\n",
            "| workload | n | shard raw MiB | floor raw+encoded (x) | anon RSS peak growth MiB (x) "
            "| tracemalloc peak MiB (x) | check |",
            "|---|---|---|---|---|---|---|",
        ]
        for wl, rs in mem:

            def g(k: str, rs: list[dict] = rs) -> float:
                return _med([r[k] for r in rs if k in r])

            lines.append(
                f"| {wl} | {len(rs)} | {rs[0]['shard_raw_bytes'] / 2**20:.1f} | "
                f"{g('raw_plus_encoded_x'):.2f} | {g('anon_peak_mib'):.1f} "
                f"({g('anon_task_x'):.2f}x) | {g('tracemalloc_peak_mib'):.1f} "
                f"({g('tracemalloc_task_x'):.2f}x) | "
                f"{'ok' if all(r['verify']['ok'] for r in rs) else 'MISMATCH'} |"
            )
    # machine load while the cases ran
    fc = [r["foreign_cpu_cores"] for r in recs if "foreign_cpu_cores" in r]
    if fc:
        lines.append(
            f"\nOther processes on the machine used {_med(fc):.2f} cores (median over the "
            f"case runs; max {max(fc):.2f}) while cases ran (of 2 cores)."
        )
    return "\n".join(lines)


def report(paths: list[str]) -> None:
    recs = _load(paths)
    sizes = {r.get("size", "full") for r in recs if r["case"] == "env"}
    if len(sizes) == 1:
        WL.set_size(sizes.pop())  # the workload shapes the records were measured on
    print(targets_report(recs))
    print("\n## Every case, per workload (anchors and shardwise)\n")
    timed = [r for r in recs if r["case"] not in NOT_TIMED and r["case"] != "env"]
    print(A.report(timed, list(A.CASES)))


# ----------------------------------------------------------------------------------------------
# profile
# ----------------------------------------------------------------------------------------------
def profile(wl: str, case: str, top: int, dump: str | None = None) -> None:
    """Run one case (rep 0) with cProfile on during its timed part; print the top functions.

    On Python >= 3.12 cProfile is built on sys.monitoring and one profiler sees every thread
    (dask's and shardwise's encode pool): times are summed over the threads, and time a thread
    spends waiting shows up as lock ``acquire``/``wait``.
    """
    import cProfile
    import pstats

    fn = SW_CASES[case][0] if case in SW_CASES else A.CASES[case][0]
    prof = cProfile.Profile()
    meter = A.Meter

    class ProfiledMeter(meter):  # type: ignore[misc,valid-type]
        """The anchors' Meter, profiling exactly its timed part (not set-up or verification)."""

        def __enter__(self) -> Any:
            out = super().__enter__()
            prof.enable()
            return out

        def __exit__(self, *exc: object) -> Any:
            prof.disable()
            return super().__exit__(*exc)

    A.Meter = ProfiledMeter
    try:
        info = fn(wl, 0)
    finally:
        A.Meter = meter
    keep = ("wall_s", "cpu_s", "verify", "read_ok")
    print(json.dumps({k: v for k, v in info.items() if k in keep}, default=_json_default)[:600])
    print("(all threads; the profiler slows Python-heavy code, compare shares, not seconds)")
    st = pstats.Stats(prof)
    if dump:
        st.dump_stats(dump)
        print(f"(stats saved to {dump}: python -m pstats {dump})")
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--size",
        choices=sorted(WL.SIZES),
        default=os.environ.get("BENCH_SIZE", "full"),
        help="full: the published workloads (GBs); small: the same on a few MB (smoke run)",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("case", parents=[common])
    c.add_argument("workload")
    c.add_argument("case")
    c.add_argument("--rep", type=int, default=0)
    c.add_argument("--out", default=None)
    r = sub.add_parser("run", parents=[common])
    r.add_argument("--workloads", default="W3,W1")
    r.add_argument("--cases", default="limits,sw,key")
    r.add_argument("--once", default="", help="cases to run at rep 0 only (e.g. h-xr-default)")
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--out", required=True)
    r.add_argument("--keep-read-store", action="store_true")
    r.add_argument(
        "--quiet",
        type=float,
        default=0.0,
        help="before each case wait until other processes use fewer cores than this "
        "(0 = do not wait)",
    )
    r.add_argument(
        "--quiet-wait", type=float, default=300.0, help="longest wait for --quiet, seconds"
    )
    rp = sub.add_parser("report", parents=[common])
    rp.add_argument("paths", nargs="+")
    pf = sub.add_parser("profile", parents=[common])
    pf.add_argument("workload")
    pf.add_argument("case")
    pf.add_argument("--top", type=int, default=40)
    pf.add_argument("--dump", default=None, help="also save the pstats file here")
    g = sub.add_parser("gen", parents=[common])
    g.add_argument("workloads", nargs="+")
    pr = sub.add_parser("prepare-read", parents=[common])
    pr.add_argument("workload")
    sub.add_parser("list", parents=[common])
    sub.add_parser("clean", parents=[common])
    args = ap.parse_args()
    WL.set_size(args.size)
    if args.cmd == "case":
        run_case(args.workload, args.case, args.rep, args.out)
    elif args.cmd == "run":
        driver(args)
    elif args.cmd == "report":
        report(args.paths)
    elif args.cmd == "profile":
        profile(args.workload, args.case, args.top, args.dump)
    elif args.cmd == "gen":
        for wl in args.workloads:
            WL.gen(wl)
    elif args.cmd == "prepare-read":
        A.prepare_read(args.workload)
    elif args.cmd == "clean":
        A.rmtree(WL.SRC_DIR)
        A.rmtree(A.STORE_DIR)
    elif args.cmd == "list":
        for k, W in WORKLOADS.items():
            print(k, W)
        print("\ngroups: sw sw-write sw-read limits key write mis read")
        for k in WORKLOADS:
            print(f"  sw[{k}] = {SW_WRITE[k] + SW_READ[k]}")
        print(f"  key = {KEY_ANCHORS}\n")
        for k, (_f, d) in A.CASES.items():
            print(f"{k:28s} {'[shardwise] ' if k in SW_CASES else ''}{d}")
        print(f"{'s-task-mem':28s} [shardwise] {SW_CASES['s-task-mem'][1]}")
        print(
            f"\nsize: {WL.SIZE}; shardwise.to_zarr: {_sw_to_zarr() is not None}; "
            f"engine: {_engine_available()}"
        )


if __name__ == "__main__":
    main()
