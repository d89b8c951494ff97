"""The page's suites, one declaration each (``page_suites.Suite``), in the page's order."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from page_suites import (
    HERE,
    LIMIT,
    Rec,
    Row,
    Suite,
    fixed,
    pick,
    pyramid_caption,
    row,
    stream_caption,
    workload_caption,
)

MIB = 2**20


def _bench_rows(s: Suite, r: Rec) -> list[Row]:
    """bench.py: a table per workload and kind (writes, reads); its limits in both."""
    wl, case = r.get("workload"), r.get("case")
    if case not in s.cases or wl == "env":
        return []
    ok = r.get("status") == "ok"
    if s.cases[case][0] == LIMIT:
        return [row(f"{wl} {k}s", case, r.get(f"{k}_limit_s"), None, ok) for k in ("write", "read")]
    kind = "read" if case.startswith("h-") else "write"
    good = ok and r.get("verify", {}).get("ok", True) and r.get("read_ok", True)
    return [row(f"{wl} {kind}s", case, r.get("wall_s"), None, good)]


def _numpy_rows(s: Suite, r: Rec) -> list[Row]:
    case = r.get("case")
    if case not in s.cases:
        return []
    table = f"{r['wl']} {case.rsplit('-', 1)[1]}s"
    return [row(table, case, r.get("s_in"), r.get("s_whole"), r.get("ok"))]


def _stream_rows(s: Suite, r: Rec) -> list[Row]:
    spec, variant, writer = r["case"]
    return [row(f"{spec} {variant}", writer, r.get("seconds"), r.get("whole"),
                r.get("ok", True) and "error" not in r)]  # fmt: skip


def _stream_limits(s: Suite, size: str, out: str, env: dict[str, str]) -> None:
    """``stream.limit`` (the script's own measurement, which it prints but does not write) for
    each spec of the size, appended to ``out`` for its compressed variants."""
    specs, variants = s.args[size][1].split(","), s.args[size][3].split(",")
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
            for v in (v for v in variants if v.endswith("zstd")):  # a limit of compression
                f.write(json.dumps({"case": [lim["spec"], v, LIMIT], "rep": 0, **lim}) + "\n")


def _convert_rows(s: Suite, r: Rec) -> list[Row]:
    table = f"{r['shape'][0]}^3"
    return [row(table, case, x) for case in ("copy", "reencode", "cp") for x in r["runs"][case]]


def _rectilinear_rows(s: Suite, r: Rec) -> list[Row]:
    if "rep" not in r:
        return []
    out = []
    for case in s.cases:
        table = "files" if case.startswith("sw-files") else "months"
        out.append(row(f"{r['shape'][0]} days, {table}", case, r.get(f"{case}_s"),
                       r.get(f"{case}_whole_s")))  # fmt: skip
    return out


def _million_rows(s: Suite, r: Rec) -> list[Row]:
    n = f"{r['shards']:,} shards"
    return [row(f"{n}: build", r["case"], r["build_s"]),
            *([row(f"{n}: write", r["case"], r["wall_s"])] if "wall_s" in r else [])]  # fmt: skip


def _memory_rows(s: Suite, r: Rec) -> list[Row]:
    """pyramid.py's peaks (held by the write above the process's baseline; on the cluster the
    largest worker's) and icechunk_writes.py's memory runs (one task, anonymous memory)."""
    case = r.get("case")
    if case not in s.cases:
        return []
    if "image" in r:
        held = max(r["worker_held"]) if "worker_held" in r else r["rss"] - r["base_rss"]
        return [row(f"{r['image']} held by the write", case, held / MIB, None, r.get("ok"))]
    if r.get("mode") == "mem":
        return [row(f"{r['wl']} one task", case, r.get("task_anon_mib"), None, r.get("ok"))]
    return []


_W = {"tiny": "W3", "quick": "W3", "full": "W3,W1"}
_REPS = {"tiny": "1", "quick": "3", "full": "3"}
_SMALL = {"tiny": ["--small"], "quick": ["--small"], "full": []}


def _sized(build: Any) -> dict[str, list[str]]:
    return {size: build(size) for size in ("tiny", "quick", "full")}


def _workload_run(sub: str) -> dict[str, list[str]]:
    """A workload script's measuring run per size, in its own directory ``sub``."""
    return _sized(
        lambda z: [
            "run",
            *_SMALL[z],
            "--workloads",
            _W[z],
            "--reps",
            _REPS[z],
            "--dir",
            f"{{dir}}/{sub}",
        ]
    )


def _workload_gen(sub: str) -> dict[str, list[str]]:
    """The same script's generation of its stores, into ``sub``."""
    return _sized(lambda z: ["gen", *_SMALL[z], "--workloads", _W[z], "--dir", f"{{dir}}/{sub}"])


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
            "tiny": ["run", "--size", "small", "--workloads", "W3", "--reps", "1"],
            "quick": ["run", "--size", "small", "--workloads", "W3,W1", "--reps", "3"],
            "full": ["run", "--workloads", "W3", "--reps", "3"],
        },
        _bench_rows,
        workload_caption,
    ),
    Suite(
        "cluster",
        "Dask arrays on a cluster",
        "bench.py",
        "the dask suite's writes on a `LocalCluster` of 2 worker processes of 1 thread each "
        "(the cluster's start not counted): blocks of one shard, and sub-shard blocks that "
        "shardwise regroups into shards (`s-w-mis-dist`); every store read back and compared",
        {
            "s-w-dist": ("shardwise", "write_array(dask array), dask chunks = shards"),
            "s-w-mis-dist": ("shardwise", "write_array(dask array), sub-shard dask chunks"),
            "c-xr-dist": ("xarray", "Dataset.to_zarr, dask chunks = shards"),
        },
        _sized(
            lambda z: [
                "run",
                *(["--size", "small"] if z != "full" else []),
                "--workloads",
                "W3",
                "--reps",
                _REPS[z],
            ]
        ),
        _bench_rows,
        workload_caption,
        ref_case="s-w-dist",
        sized_cases={"tiny": ("s-w-dist", "c-xr-dist")},
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
            "tiny": ["run", "--small", "--workloads", "W3", "--reps", "1", "--dir", "{dir}"],
            "quick": ["run", "--workloads", "W3", "--reps", "3", "--dir", "{dir}"],
            "full": ["run", "--workloads", "W3,W1", "--reps", "3", "--dir", "{dir}"],
        },
        _numpy_rows,
        workload_caption,
    ),
    Suite(
        "reads",
        "Full reads, every shardwise door",
        "reads.py",
        "W1, W2 and W3 written once by shardwise, then read whole through each of shardwise's "
        "doors and by tensorstore, each case in a fresh process; every read compared with "
        "tensorstore's (crc32c of the bytes); whole-process seconds include the interpreter "
        "and the imports",
        {
            "direct": ("shardwise", "read_array"),
            "array": ("shardwise", "open_array(...).compute()"),
            "array-graph": ("shardwise", "dask.compute(open_array(...)): the block graph"),
            "engine": ("shardwise", "xr.open_dataset(engine='shardwise').values"),
            "engine-dask": ("shardwise", "the same with chunks={}"),
            "ts": ("tensorstore", "read()"),
        },
        _workload_run("reads"),
        pick("{workload} reads", "read_s", "process_s"),
        workload_caption,
        ref_case="direct",
        sized_cases={"tiny": ("direct", "array", "ts")},
        prepare=_workload_gen("reads"),
    ),
    Suite(
        "loads",
        "Full loads through xarray",
        "full_loads.py",
        "a dataset written once by `shardwise.to_zarr`, loaded whole through each of xarray's "
        "doors on the shardwise engine (`ds` is `open_dataset(engine='shardwise', chunks={})`) "
        "and by tensorstore, each case in a fresh process; every load compared with the source",
        {
            "read_array": ("shardwise", "read_array"),
            "open_array": ("shardwise", "open_array(...).compute()"),
            "load": ("shardwise", "ds.load()"),
            "values": ("shardwise", "ds[var].values"),
            "compute": ("shardwise", "ds.compute()"),
            "engine.load": ("shardwise", "open_dataset(engine='shardwise').load(), no dask"),
            "ts": ("tensorstore", "read()"),
        },
        _workload_run("loads"),
        pick("{wl} loads", "s_in", "s_whole"),
        workload_caption,
        ref_case="read_array",
        sized_cases={"tiny": ("read_array", "values", "ts")},
        prepare=_workload_gen("loads"),
    ),
    Suite(
        "pyramid",
        "Pyramids (OME-Zarr, 5 levels, mean)",
        "pyramid.py",
        "a 5-level mean pyramid written from a dask source against level 0 alone, ngff-zarr's "
        "to_multiscales + to_ngff_zarr and ome-zarr-py's write_image; `task` and `task-half` run "
        "on one thread (their peaks are the memory suite's); every level read back by "
        "zarr-python",
        {
            "level0": ("shardwise", "write_array of level 0 alone"),
            "pyramid": ("shardwise", "write_pyramid(levels=5)"),
            "pyramid-cluster": ("shardwise", "the same on a LocalCluster (2 x 1 thread)"),
            "task": ("shardwise", "the same on one thread"),
            "task-half": ("shardwise", "on one thread, half of every axis"),
            "ngff": ("ngff-zarr", "to_multiscales + to_ngff_zarr"),
            "omezarr": ("ome-zarr", "write_image(method=LOCAL_MEAN)"),
        },
        {
            "tiny": ["run", "--tiny", "--images", "vol", "--reps", "1", "--dir", "{dir}"],
            "quick": ["run", "--small", "--images", "vol,img", "--reps", "3", "--dir", "{dir}"],
            "full": ["run", "--images", "img", "--reps", "3", "--dir", "{dir}"],
        },
        pick("{image} writes", "s_in", "s_whole"),
        pyramid_caption,
        ref_case="pyramid",
        sized_cases={"tiny": ("pyramid", "ngff", "omezarr")},
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
            "tiny": [
                "run",
                "--small",
                "--workloads",
                "W2",
                "--reps",
                "1",
                "--mem-cases",
                "",
                "--dir",
                "{dir}",
            ],
            "quick": [
                "run",
                "--small",
                "--workloads",
                "W1,W2",
                "--reps",
                "3",
                "--mem-cases",
                "sw-repo,ic-xr",
                "--dir",
                "{dir}",
            ],
            "full": [
                "run",
                "--workloads",
                "W2",
                "--reps",
                "3",
                "--mem-cases",
                "sw-repo,ic-xr",
                "--dir",
                "{dir}",
            ],
        },
        pick("{wl} writes", "s_in", "s_whole", keep=lambda r: r.get("mode") == "time"),
        workload_caption,
        ref_case="sw-repo",
    ),
    Suite(
        "memory",
        "Memory",
        "pyramid.py",
        "the peak memory of the pyramid suite's runs (the process's peak above its baseline "
        "before the write; on the cluster the largest worker's; `task-half` is `task` on half "
        "of every axis: what one task holds does not grow with the image) and of the icechunk "
        "suite's one-task runs (icechunk_writes.py `--mem-cases`, synchronous scheduler, "
        "anonymous memory); read from those suites' results",
        {
            "pyramid": ("shardwise", "write_pyramid(levels=5), threads"),
            "pyramid-cluster": ("shardwise", "the same on a LocalCluster: one worker"),
            "task": ("shardwise", "the same on one thread"),
            "task-half": ("shardwise", "on one thread, half of every axis"),
            "ngff": ("ngff-zarr", "to_multiscales + to_ngff_zarr"),
            "omezarr": ("ome-zarr", "write_image"),
            "sw-repo": ("shardwise", "into an icechunk session: one task"),
            "ic-xr": ("icechunk", "to_icechunk: one task"),
        },
        {"tiny": [], "quick": [], "full": []},
        _memory_rows,
        pyramid_caption,
        ref_case="pyramid",
        source=("pyramid", "icechunk"),
        unit="MiB",
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
            "tiny": ["--specs", "B", "--variants", "shards-zstd", "--reps", "1", "--dir", "{dir}"],
            "quick": [
                "--specs",
                "A,B",
                "--variants",
                "shards-zstd",
                "--reps",
                "3",
                "--dir",
                "{dir}",
            ],
            "full": [
                "--specs",
                "A,B",
                "--variants",
                "shards,shards-zstd",
                "--reps",
                "5",
                "--dir",
                "{dir}",
            ],
        },
        _stream_rows,
        stream_caption,
        case_flag="--writers",
        limit="zstd-3, 2 threads",
        finish=_stream_limits,
    ),
    Suite(
        "convert",
        "Zarr v2 chunks into v3 shards",
        "convert.py",
        "a Zarr v2 store of 64^3 zstd chunks converted into 256^3 shards by `shardwise.convert`: "
        "the encoded chunks copied into the shards (`copy`) or decoded and encoded again "
        "(`reencode`); the limit is `cp -r` of the source tree (the same bytes, as files)",
        {
            "copy": ("shardwise", "convert: encoded chunks copied"),
            "reencode": ("shardwise", "convert with compressors: decode, encode"),
            "cp": (LIMIT, "cp -r of the source"),
        },
        {
            "tiny": ["--side", "256", "--reps", "1", "--dir", "{dir}"],
            "quick": ["--small", "--reps", "3", "--dir", "{dir}"],
            "full": ["--reps", "3", "--dir", "{dir}"],
        },
        _convert_rows,
        fixed(
            "`{table}` uint16 (a smooth ramp plus noise), v2 chunks of 64^3, zstd "
            "level 1, into shards of 256^3"
        ),
        ref_case="copy",
        case_flag=None,
    ),
    Suite(
        "rectilinear",
        "A shard per month (rectilinear grids)",
        "rectilinear.py",
        "a daily Dataset chunked a month per dask chunk written a shard per month (a rectilinear "
        "grid, no rechunk) against a regular grid after a rechunk, by shardwise and by xarray; "
        "and an uneven concatenation of files written a shard per file; every store read back",
        {
            "sw-month": ("shardwise", "to_zarr(shards={'time': 'dask'})"),
            "sw-regular": ("shardwise", ".chunk(time=30), shards of 30 days"),
            "xr-regular": ("xarray", "to_zarr of the rechunked Dataset, shards of 30 days"),
            "sw-files": ("shardwise", "a shard per file"),
            "sw-files-regular": ("shardwise", "rechunked into 30-day shards"),
        },
        {
            "tiny": ["--small", "--reps", "1", "--whole", "--dir", "{dir}"],
            "quick": ["--small", "--reps", "3", "--whole", "--dir", "{dir}"],
            "full": ["--reps", "3", "--whole", "--dir", "{dir}"],
        },
        _rectilinear_rows,
        fixed(
            "`{table}`: float32, a day a map (inner chunks of one day), "
            "zstd level 3 (`--small`: a 46 x 90 grid, else 181 x 360)"
        ),
        case_flag=None,
    ),
    Suite(
        "appends",
        "Concurrent appends",
        "appends.py",
        "N processes appending rows to one Dataset at once (`to_zarr(append_dim=)`), "
        "each append reserved by a conditional commit, against the same with conditional commits "
        "off (rows are lost: the script counts them); seconds per append, each writer's own call",
        {
            "conditional": ("shardwise", "to_zarr(append_dim='t'), every row lands"),
            "unconditional": ("shardwise", "conditional commits off: rows lost"),
        },
        _sized(
            lambda z: [
                *_SMALL[z],
                "--procs",
                {"tiny": "2", "quick": "2,4"}.get(z, "2,4,8"),
                "--reps",
                {"full": "5"}.get(z, _REPS[z]),
                "--dir",
                "{dir}",
            ]
        ),
        pick(
            "{procs} writers",
            "per_append",
            case="mode",
            ok=lambda r: r["lost"] == 0 or r["mode"] == "unconditional",
        ),
        fixed(
            "{table}: each appends 10 rows of a float32 variable (10 x 64 x 64 with `--small`, "
            "else 10 x 256 x 256), shards of 8 rows"
        ),
        case_flag=None,
    ),
    Suite(
        "regions",
        "Small region updates into big shards",
        "region_updates.py",
        "10 regions of 8^3 float32 written into a volume stored as one shard of 128^3 inner "
        "chunks, one call per region (`sw-batch`: all through one RegionWriter commit), "
        "each case in a fresh process; `-s3` on a local S3 server (moto)",
        {
            "sw-region": ("shardwise", "write_array(region=) per region"),
            "sw-batch": ("shardwise", "one RegionWriter"),
            "sw-region-s3": ("shardwise", "write_array(region=) per region, S3"),
            "sw-batch-s3": ("shardwise", "one RegionWriter, S3"),
            "zarr": ("zarr-python", "arr[region] = values"),
            "ts": ("tensorstore", "arr[region].write(values)"),
        },
        _sized(
            lambda z: ["--reps", _REPS[z], "--volumes", "small,large" if z == "full" else "small"]
        ),
        pick("{volume} volume", "seconds"),
        fixed("the {table} (small 256^3, large 384^3): float32, inner chunks 128^3, one shard"),
        ref_case="sw-region",
        sized_cases={"tiny": ("sw-region", "sw-batch", "zarr", "ts")},
    ),
    Suite(
        "pyramid-update",
        "A pyramid refreshed after a region write",
        "pyramid_update.py",
        "a 64 x 64 patch written into level 0 of a 5-level pyramid, then `update_pyramid` "
        "refreshing every level above it, against `write_pyramid` of the whole level 0 again; "
        "every level then compared with a fresh pyramid",
        {
            "update": ("shardwise", "write_array(region=) + update_pyramid"),
            "rewrite": ("shardwise", "write_array(region=) + write_pyramid(mode='w')"),
        },
        _sized(
            lambda z: [
                *{"tiny": ["--side", "512"], "quick": ["--side", "2048"]}.get(z, []),
                "--reps",
                _REPS[z],
            ]
        ),
        pick("{side}^2 image", "seconds", "whole_process_seconds"),
        fixed("a {table}: uint16, inner chunks and shards a 16th and a 4th of the side, zstd"),
        case_flag=None,
    ),
    Suite(
        "million",
        "Many shards from one call",
        "million.py",
        "N tiny shards (a row of 64 bytes each) written from one call: the graph's build "
        "(`compute=False`, the client's cost per shard) and its run on threads; shardwise's runs "
        "of shards and one task per shard, against dask.array.store into zarr-python and xarray",
        {
            "runs": ("shardwise", "write_array(source without a graph): runs of shards"),
            "per-shard": ("shardwise", "write_array(dask array, a chunk per shard)"),
            "dask-to-zarr": ("zarr-python", "dask.array.store into zarr.create_array"),
            "xarray-to-zarr": ("xarray", "Dataset.to_zarr"),
        },
        _sized(
            lambda z: [
                "run",
                "--sizes",
                {"tiny": "1000", "quick": "1000,10000"}.get(z, "1000,10000,50000"),
                "--reps",
                _REPS[z],
                "--run",
            ]
        ),
        _million_rows,
        fixed("{table}: uint8 rows of 64, two inner chunks of 32 a shard, no compression"),
        ref_case="runs",
    ),
)
