#!/usr/bin/env python
"""Arrays in memory: numpy writes and whole reads of W1 and W3, against tensorstore and zarrista.

The W1/W3 geometry and data of ``benchmarks/workloads.py`` (``--small``: its small sizes): zstd
level 3 inner chunks, ``bytes`` + ``crc32c`` shard index at the end, fill value 0. Every case runs
in a fresh process, repetitions interleaved (rep 0 of every case, then rep 1, ...; the order of
the cases rotates each repetition).

Cases (the source is the workload's ``.npy`` loaded into memory before anything is timed):

* ``sw-write``      ``shardwise.write_array(x, path, chunks=inner, shards=shard, ...)`` (after
  a first write of a 1-element array, outside the in-process figure: it imports what writes use);
  its shard tasks run on the process's threads without dask (the row's ``dask`` says whether the
  process imported it: false for ``sw-write`` and ``sw-read``);
* ``sw-dask-write`` the same of ``dask.array.from_array(x, chunks=shard)`` (threaded scheduler);
* ``ts-write``      tensorstore ``open(create=True)`` then ``write(x)`` (``file_io_sync`` off:
  shardwise and zarrista do not fsync either);
* ``zr-write``      zarrista ``Array.from_metadata(...)``, ``store_metadata()``, ``a[...] = x``;
* ``sw-read``       ``shardwise.read_array(path)`` (after a first read of one element, outside
  the in-process figure: it imports what reads use);
* ``sw-dask-read``  ``shardwise.open_array(path).compute()``;
* ``ts-read``       tensorstore ``open`` then ``read()``;
* ``zr-read``       zarrista ``Array.open(...)[...].to_numpy()`` (a view of zarrista's memory);
* ``limit-write``   the machine's compression limit: every inner chunk compressed (zstd level 3,
  python-zstandard's batch call, one reused context per thread) on as many threads as cores,
  from the chunks already gathered contiguous by shard before the clock; no gather, no file;
* ``limit-read``    the machine's limit for a whole read into new memory: every stored frame
  (the read store's shards loaded and split by their index before the clock) decompressed by
  shard on as many threads as cores and copied into its place in a fresh output array; no file.
  Its row also gives ``s_codec``, the decompression alone (into each thread's reused buffer).

The reads read one store per workload, written once by shardwise before the first repetition.

Per case: in-process seconds (the write or read alone: the library's import and open are not in
it), CPU seconds over the same span (user + system of every thread, ``getrusage``: less noisy
than the wall clock on a shared machine), whole-process seconds (from the launch of the
subprocess to the end of the write or read: interpreter start, imports, loading the source and
the open included; the check after it not), and the growth of the peak RSS (``VmHWM``) over the
write or read in multiples of the array's bytes. After the timing, every written store is read
back by another library (tensorstore reads shardwise's and zarrista's, shardwise tensorstore's)
and compared with the source; every read is compared with the source.

The compiled libraries come with the ``bench`` extra (``pip install -e .[bench]``); a case of a
library that is not installed fails.

Usage::

    python benchmarks/numpy_paths.py run    [--small] [--dir D] [--reps 3] [--workloads W1,W3]
                                            [--cases ...] [--out FILE.jsonl]
    python benchmarks/numpy_paths.py one    WL CASE [--small] [--dir D]
    python benchmarks/numpy_paths.py report FILE.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
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

import limits  # noqa: E402
import workloads  # noqa: E402

LIBS = ("sw", "sw-dask", "ts", "zr", "limit")
CASES = tuple(f"{lib}-{op}" for op in ("write", "read") for lib in LIBS)


def store_of(args: argparse.Namespace, wl: str, case: str) -> str:
    return os.path.join(args.dir, f"{workloads.tag(wl)}-{case}.zarr")


def metadata(W: dict[str, Any]) -> dict[str, Any]:
    """The array's zarr.json, as tensorstore and zarrista are given it."""
    sharding = {
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": list(W["inner"]),
            "codecs": [
                {"name": "bytes", "configuration": {"endian": "little"}},
                {
                    "name": "zstd",
                    "configuration": {"level": workloads.ZSTD_LEVEL, "checksum": False},
                },
            ],
            "index_codecs": [
                {"name": "bytes", "configuration": {"endian": "little"}},
                {"name": "crc32c"},
            ],
            "index_location": "end",
        },
    }
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(W["shape"]),
        "data_type": W["dtype"],
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(W["shard"])}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [sharding],
        "attributes": {},
        "dimension_names": list(W["dims"]),
    }


def ts_spec(path: str, W: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": path},
        "context": {"file_io_sync": False},
    }
    if W is not None:
        meta = {k: v for k, v in metadata(W).items() if k not in ("zarr_format", "node_type")}
        spec.update(metadata=meta, create=True, delete_existing=True)
    return spec


def sw_write(path: str, W: dict[str, Any], data: Any) -> None:
    from zarr.codecs import ZstdCodec

    import shardwise

    shardwise.write_array(
        data,
        path,
        chunks=tuple(W["inner"]),
        shards=tuple(W["shard"]),
        compressors=ZstdCodec(level=workloads.ZSTD_LEVEL),
        fill_value=0,
        dimension_names=list(W["dims"]),
        mode="w",
    )


# -- one case, in a fresh process -----------------------------------------------------------------


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _op(case: str, path: str, W: dict[str, Any], src: np.ndarray | None) -> Callable[[], Any]:
    """The write or read of ``case`` as a function. Imports and the open (metadata only) are paid
    here: in the whole-process figure, not in the in-process one."""
    lib, op = case.rsplit("-", 1)
    if lib == "limit":
        return limits.write_limit(W, src) if op == "write" else limits.read_limit(W, path)
    if lib == "ts":
        import tensorstore as ts

        if op == "write":
            t = ts.open(ts_spec(path, W)).result()
            return lambda: t.write(src).result()
        t = ts.open(ts_spec(path), open=True, read=True).result()
        return lambda: t.read().result()
    if lib == "zr":
        import zarrista

        store = zarrista.store.FilesystemStore(path)
        if op == "write":
            arr = zarrista.Array.from_metadata(metadata(W), store, "/")  # type: ignore[arg-type]

            def write() -> None:
                arr.store_metadata()
                arr[...] = src

            return write
        arr = zarrista.Array.open(store, "/")
        return lambda: arr[...].to_numpy()  # type: ignore[union-attr]
    import shardwise

    if op == "write":
        assert src is not None
        # a first write_array imports what writes use (the writers, zarr's codecs; dask's array
        # module for the dask cases) and starts the pool: in the whole-process figure only
        warm = f"{path}-warm"
        shardwise.write_array(np.zeros((1,) * src.ndim, src.dtype), warm, chunks=1, mode="w")
        shutil.rmtree(warm)
    if lib == "sw-dask":
        import dask
        import dask.array as da

        dask.config.set(scheduler="threads")
        if op == "write":
            x = da.from_array(src, chunks=tuple(W["shard"]))
            return lambda: sw_write(path, W, x)
        lazy = shardwise.open_array(path)
        return lambda: lazy.compute()
    if op == "write":
        import zarr.codecs  # noqa: F401  (the codec object the call is given)

        return lambda: sw_write(path, W, src)
    # a first read of one element imports what reads use (shardwise's engine and codec modules
    # are imported on first use, about 0.2 s) and starts nothing else: as the write's first
    # write, in the whole-process figure only
    shardwise.read_array(path, (0,) * len(W["shape"]))
    return lambda: shardwise.read_array(path)


def _check(case: str, path: str, W: dict[str, Any], src: np.ndarray, got: Any) -> bool:
    """Written stores read back by another library; reads compared with the source."""
    if case == "limit-write":
        return limits.frames_hold(got, W, src)
    if case.endswith("-read"):
        return bool(np.array_equal(np.asarray(got), src))
    if case.startswith("ts-"):
        import shardwise

        return bool(np.array_equal(shardwise.read_array(path), src))
    import tensorstore as ts

    t = ts.open(ts_spec(path), open=True, read=True).result()
    return bool(np.array_equal(t.read().result(), src))


def one(args: argparse.Namespace) -> None:
    """Run one case once (or ``prepare`` the read store); print its figures as one JSON line."""
    wl, case = args.wl, args.case
    W = workloads.WORKLOADS[wl]
    reads = case.endswith("-read")

    def source() -> np.ndarray:
        return np.ascontiguousarray(workloads.load_src(wl, mmap=False))

    read_path = store_of(args, wl, "read")
    if case == "prepare":
        os.makedirs(args.dir, exist_ok=True)
        if not os.path.exists(os.path.join(read_path, "zarr.json")):
            sw_write(read_path, W, source())
        print(json.dumps(dict(wl=wl, case=case, done=time.time())), flush=True)
        return
    path = read_path if reads else store_of(args, wl, case)
    # a write's source is in memory before the clock starts; a read's is loaded after it
    src = None if reads else source()
    fn = _op(case, path, W, src)
    before, c0, t0 = _hwm_bytes(), _cpu(), time.perf_counter()
    got = fn()
    secs, cpu = time.perf_counter() - t0, _cpu() - c0
    done = time.time()  # the end of the op on the wall clock: the parent's whole-process figure
    grown = _hwm_bytes() - before
    src = source() if src is None else src
    ok = _check(case, path, W, src, got)
    if not reads:
        shutil.rmtree(path, ignore_errors=True)
    row = dict(
        wl=wl,
        case=case,
        s_in=round(secs, 4),
        cpu_in=round(cpu, 4),
        rss_x=round(grown / src.nbytes, 2),
        ok=ok,
        dask="dask" in sys.modules,
        done=done,
    )
    if case == "limit-read":
        row["s_codec"] = round(limits.decompress_only(W, path), 4)
    print(json.dumps(row), flush=True)


# -- the run --------------------------------------------------------------------------------------


def _child(args: argparse.Namespace, wl: str, case: str) -> dict[str, Any]:
    size = ["--small"] if args.small else []
    cmd = [sys.executable, __file__, "one", wl, case, "--dir", args.dir, *size]
    launched = time.time()
    got = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if got.returncode:
        raise SystemExit(f"{wl} {case} failed:\n{got.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(got.stdout.strip().splitlines()[-1])
    # from the launch to the end of the op: interpreter start, imports, the source, the open and
    # the op; not the check that follows
    row["s_whole"] = round(row.pop("done") - launched, 4)
    return row


def run(args: argparse.Namespace) -> None:
    cases = args.cases.split(",") if args.cases else list(CASES)
    wls = args.workloads.split(",")
    unknown = [c for c in cases if c not in CASES]
    unknown += [w for w in wls if w not in workloads.WORKLOADS]
    if unknown:  # before any child runs
        raise SystemExit(f"unknown case or workload {unknown}; cases: {', '.join(CASES)}")
    if any(c.endswith("-read") for c in cases):
        for wl in wls:  # the read store (and the source), once, before any timing
            _child(args, wl, "prepare")
    with open(args.out, "a") as out:
        for rep in range(args.reps):
            order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
            for wl in wls:
                for case in order:
                    row = _child(args, wl, case)
                    row.update(rep=rep, size=workloads.SIZE)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(json.dumps(row), flush=True)
    if not args.keep:
        for wl in wls:
            shutil.rmtree(store_of(args, wl, "read"), ignore_errors=True)


def report(args: argparse.Namespace) -> None:
    with open(args.file) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["wl"], r["case"]), []).append(r)

    def med(key: tuple[str, str], field: str) -> float:
        return statistics.median(r[field] for r in by[key])

    print(
        "| workload | case | n | in-process s (median, min-max) | CPU s | whole s | RSS x "
        "| in / ts | in / zr | whole / ts | whole / zr | in / limit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for wl, case in sorted(by, key=lambda k: (k[0], CASES.index(k[1]))):
        rs = by[wl, case]
        ins = [r["s_in"] for r in rs]
        op = case.rsplit("-", 1)[1]
        ratios = []
        for field in ("s_in", "s_whole"):
            for ref in ("ts", "zr"):
                k = (wl, f"{ref}-{op}")
                ratios.append(f"{med((wl, case), field) / med(k, field):.2f}" if k in by else "")
        lim = (wl, f"limit-{op}")
        ratios.append(f"{med((wl, case), 's_in') / med(lim, 's_in'):.2f}" if lim in by else "")
        bad = "" if all(r["ok"] for r in rs) else " WRONG VALUES"
        print(
            f"| {wl} | {case} | {len(rs)} | {statistics.median(ins):.3f} "
            f"({min(ins):.3f}-{max(ins):.3f}) | {med((wl, case), 'cpu_in'):.3f} "
            f"| {med((wl, case), 's_whole'):.3f} | {med((wl, case), 'rss_x'):.2f} "
            f"| {' | '.join(ratios)}{bad} |"
        )
    for wl, case in sorted(k for k in by if k[1] == "limit-read"):
        codec = [r["s_codec"] for r in by[wl, case]]
        print(
            f"\n{wl} limit-read: the decompression alone {statistics.median(codec):.3f} s "
            f"({min(codec):.3f}-{max(codec):.3f}), no output array"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "one"):
        s = sub.add_parser(name)
        s.add_argument("--small", action="store_true")
        s.add_argument("--dir", default="/tmp/bench-numpy")
        if name == "one":
            s.add_argument("wl")
            s.add_argument("case", choices=(*CASES, "prepare"))
        else:
            s.add_argument("--workloads", default="W1,W3")
            s.add_argument("--reps", type=int, default=3)
            s.add_argument("--cases", default="", help="comma-separated (default: all)")
            s.add_argument("--out", default="numpy-paths.jsonl")
            s.add_argument("--keep", action="store_true", help="keep the read stores")
    r = sub.add_parser("report")
    r.add_argument("file")
    args = p.parse_args()
    if getattr(args, "small", False):
        workloads.set_size("small")
    {"run": run, "one": one, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
