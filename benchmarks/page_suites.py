"""The suites of ``page.py``: which script runs, with which options at each size, which of its
cases belong to which tool, and how its JSON lines become the page's rows.

Each suite runs one benchmark script as its own usage line shows (``run`` with ``--out``), so
the measurement (fresh processes, interleaved repetitions, the check of every store) is the
script's. A row of the page is ``dict(table, tool, case, what, s, whole, ok)``: ``s`` the
in-process seconds the script reports for the case, ``whole`` its whole-process seconds where the
script measures them. ``limit`` rows are the machine's limit for the same bytes, where the script
measures one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = ("tiny", "quick", "full")

# tool -> (the module its cases import, the distribution its version is read from, what it is)
TOOLS: dict[str, tuple[str, str, str]] = {
    "shardwise": ("shardwise", "shardwise", "this project"),
    "tensorstore": ("tensorstore", "tensorstore", "Google's C++ Zarr library"),
    "zarr-python": ("zarr", "zarr", "the reference Python implementation"),
    "xarray": ("xarray", "xarray", "xarray's own to_zarr/open_zarr (zarr-python under it)"),
    "zarrista": ("zarrista", "zarrista", "Python bindings of the Rust zarrs crate"),
    "ngff-zarr": ("ngff_zarr", "ngff-zarr", "OME-Zarr multiscales"),
    "icechunk": ("icechunk", "icechunk", "icechunk's own dask and xarray writers"),
    "acquire-zarr": ("acquire_zarr", "acquire-zarr", "a C++ streaming writer"),
}
# installed libraries the page lists with their versions (not tools of a table)
LIBS = ("dask", "distributed", "numpy", "numcodecs", "zstandard", "ome-zarr", "zarrs")
LIMIT = "limit"


@dataclass(frozen=True)
class Suite:
    key: str
    title: str
    script: str
    about: str
    cases: dict[str, tuple[str, str]]  # case -> (tool or "limit", what it runs)
    args: dict[str, list[str]]  # size -> the script's options (no --cases, no --out)
    ref: str = "shardwise"  # the tool every ratio is taken to
    case_flag: str = "--cases"
    extra: dict[str, str] = field(default_factory=dict)


SUITES: tuple[Suite, ...] = (
    Suite(
        "dask",
        "Dask arrays: writes and full reads",
        "bench.py",
        "a dask array (one block per shard) written, then read whole, on the threaded scheduler "
        "(2 cores); every written store read back and compared chunk by chunk; the limits are the "
        "best 2-core zstd-3 compression (writes) and decompression (reads) of the same chunks",
        {
            "s-w-shards": ("shardwise", "shardwise.write_array(dask array)"),
            "a-xr-threads": ("xarray", "Dataset.to_zarr"),
            "f2-ts-full-nosync": ("tensorstore", "write (file_io_sync off)"),
            "d1-zarr-full": ("zarr-python", "arr[...] = numpy"),
            "h-sw-array": ("shardwise", "open_array(path).compute()"),
            "h-xr-shards": ("xarray", "open_zarr(chunks=shards).values"),
            "h-ts": ("tensorstore", "read()"),
            "h-zarr": ("zarr-python", "arr[...]"),
            "g-limits": (LIMIT, "zstd-3 on 2 cores, no file"),
        },
        {
            "tiny": ["--size", "small", "--workloads", "W3", "--reps", "1"],
            "quick": ["--size", "small", "--workloads", "W3,W1", "--reps", "3"],
            "full": ["--workloads", "W3", "--reps", "3"],
        },
    ),
    Suite(
        "numpy",
        "Arrays in memory: writes and whole reads",
        "numpy_paths.py",
        "a numpy array written and read whole, each library on its own threads; in-process "
        "seconds (the write or read alone) and whole-process seconds (interpreter, imports, "
        "loading the source); the limits compress or decompress every chunk on 2 threads",
        {
            "sw-write": ("shardwise", "write_array(numpy)"),
            "sw-dask-write": ("shardwise", "write_array(dask.array.from_array)"),
            "ts-write": ("tensorstore", "open(create=True).write"),
            "zr-write": ("zarrista", "a[...] = x"),
            "limit-write": (LIMIT, "zstd-3 of every chunk, 2 threads"),
            "sw-read": ("shardwise", "read_array"),
            "sw-dask-read": ("shardwise", "open_array(path).compute()"),
            "ts-read": ("tensorstore", "read()"),
            "zr-read": ("zarrista", "a[...].to_numpy()"),
            "limit-read": (LIMIT, "decompress every frame into new memory, 2 threads"),
        },
        {
            "tiny": ["--small", "--workloads", "W3", "--reps", "1"],
            "quick": ["--workloads", "W3", "--reps", "3"],
            "full": ["--workloads", "W3,W1", "--reps", "3"],
        },
    ),
    Suite(
        "pyramid",
        "Pyramids (OME-Zarr, 5 levels, mean)",
        "pyramid.py",
        "a 5-level mean pyramid written from a dask source against level 0 alone and ngff-zarr's "
        "to_multiscales + to_ngff_zarr; every level read back by zarr-python",
        {
            "level0": ("shardwise", "write_array of level 0 alone"),
            "pyramid": ("shardwise", "write_pyramid(levels=5)"),
            "ngff": ("ngff-zarr", "to_multiscales + to_ngff_zarr"),
        },
        {
            "tiny": ["--tiny", "--images", "vol", "--reps", "1"],
            "quick": ["--small", "--images", "vol,img", "--reps", "3"],
            "full": ["--images", "img", "--reps", "3"],
        },
        extra={"ref_case": "pyramid"},
    ),
    Suite(
        "icechunk",
        "Into an icechunk repository",
        "icechunk_writes.py",
        "W1 (an array) and W2 (a Dataset with coordinates) written into a new icechunk "
        "repository and committed, against a plain store and icechunk's own writers",
        {
            "sw-store": ("shardwise", "into a plain local store"),
            "sw-repo": ("shardwise", "into a session, then commit"),
            "ic-dask": ("icechunk", "icechunk.dask.store_dask"),
            "ic-xr": ("icechunk", "icechunk.xarray.to_icechunk"),
        },
        {
            "tiny": ["--small", "--workloads", "W2", "--reps", "1", "--mem-cases", ""],
            "quick": ["--small", "--workloads", "W1,W2", "--reps", "3", "--mem-cases", ""],
            "full": ["--workloads", "W2", "--reps", "3", "--mem-cases", ""],
        },
        extra={"ref_case": "sw-repo"},
    ),
    Suite(
        "stream",
        "Frames streamed into Zarr v3",
        "stream.py",
        "frames of uint16 appended one at a time (one frame a chunk, 50 frames a shard, zstd "
        "level 3), then closed; the limit compresses the same frames on 2 threads",
        {
            "shardwise": ("shardwise", "shardwise.stream"),
            "tensorstore": ("tensorstore", "write per frame"),
            "zarr-python": ("zarr-python", "arr[i] = frame"),
            "acquire-zarr": ("acquire-zarr", "ZarrStream.append"),
        },
        {
            "tiny": ["--specs", "B", "--variants", "shards-zstd", "--reps", "1"],
            "quick": ["--specs", "A,B", "--variants", "shards-zstd", "--reps", "3"],
            "full": ["--specs", "A,B", "--variants", "shards,shards-zstd", "--reps", "5"],
        },
        case_flag="--writers",
    ),
)

# -- the script's JSON lines as the page's rows ----------------------------------------------------


def _rows_dask(s: Suite, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in recs:
        wl, case = r.get("workload"), r.get("case")
        if case not in s.cases or wl == "env":
            continue
        tool, what = s.cases[case]
        ok = r.get("status") == "ok"
        if case == "g-limits":
            for kind in ("write", "read"):
                rows.append(
                    dict(table=f"{wl} {kind}s", tool=tool, case=case, what=what,
                         s=r.get(f"{kind}_limit_s"), whole=None, ok=ok)
                )  # fmt: skip
            continue
        kind = "read" if case.startswith("h-") else "write"
        good = ok and (r.get("verify", {}).get("ok", True) and r.get("read_ok", True))
        rows.append(
            dict(table=f"{wl} {kind}s", tool=tool, case=case, what=what, s=r.get("wall_s"),
                 whole=None, ok=bool(good))
        )  # fmt: skip
    return rows


def _rows_common(s: Suite, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in recs:
        case = r.get("case")
        if case not in s.cases or r.get("mode", "time") != "time":
            continue
        tool, what = s.cases[case]
        where = r.get("wl") or r.get("image")
        kind = case.rsplit("-", 1)[1] + "s" if s.key == "numpy" else "writes"
        rows.append(
            dict(table=f"{where} {kind}", tool=tool, case=case, what=what, s=r.get("s_in"),
                 whole=r.get("s_whole"), ok=bool(r.get("ok")))
        )  # fmt: skip
    return rows


def _rows_stream(s: Suite, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in recs:
        spec, variant, writer = r["case"]
        table = f"{spec} {variant}"
        if writer == LIMIT:
            rows.append(dict(table=table, tool=LIMIT, case=LIMIT, what="zstd-3, 2 threads",
                             s=r["seconds"], whole=None, ok=True))  # fmt: skip
            continue
        tool, what = s.cases[writer]
        rows.append(
            dict(table=table, tool=tool, case=writer, what=what, s=r.get("seconds"),
                 whole=r.get("whole"), ok=bool(r.get("ok")) and "error" not in r)
        )  # fmt: skip
    return rows


def rows(s: Suite, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's rows of one suite's JSON lines (the rows of failed cases have ``s=None``)."""
    if s.key == "dask":
        return _rows_dask(s, recs)
    if s.key == "stream":
        return _rows_stream(s, recs)
    return _rows_common(s, recs)


def stream_limits(size: str, out: str, env: dict[str, str]) -> None:
    """The stream suite's limit rows: ``stream.limit`` (the script's own measurement, which it
    prints but does not write) for each spec of the size, appended to ``out``."""
    specs = next(a for a in SUITES if a.key == "stream").args[size][1].split(",")
    variants = next(a for a in SUITES if a.key == "stream").args[size][3].split(",")
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import stream\n"
        "for spec in sys.argv[2].split(','):\n"
        "    print(json.dumps({'spec': spec, **stream.limit(spec)}))"
    )
    got = subprocess.run(
        [sys.executable, "-c", code, HERE, ",".join(specs)],
        env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    with open(out, "a") as f:
        for line in got.stdout.splitlines():
            lim = json.loads(line)
            for v in variants:
                if v.endswith("zstd"):  # a limit of compression: the compressed variants only
                    row = {"case": [lim["spec"], v, LIMIT], "rep": 0, **lim}
                    f.write(json.dumps(row) + "\n")


def caption(s: Suite, name: str, recs: list[dict[str, Any]]) -> str:
    """What a table's arrays are: dtype, shape, inner chunks and shards at the size measured."""
    sys.path.insert(0, HERE)
    first = name.split()[0]
    if s.key == "stream":
        import stream

        n, h, w = stream.SPECS[first]
        return f"spec {first}: {n} frames of {h}x{w} uint16, variant `{name.split()[1]}`"
    size = next((r["size"] for r in recs if "size" in r), "full")
    if s.key == "pyramid":
        import pyramid

        G = pyramid.IMAGES[size][first]
        nd = len(G["shape"])
        return (f"`{first}`: {G['dtype']} {tuple(G['shape'])}, inner chunks {(G['inner'],) * nd}, "
                f"shards {(G['shard'],) * nd} ({size})")  # fmt: skip
    import workloads

    W = workloads.SIZES[size][first]
    return (f"{first} ({W['name']}): {W['dtype']} {tuple(W['shape'])}, inner chunks "
            f"{tuple(W['inner'])}, shards {tuple(W['shard'])} ({size})")  # fmt: skip
