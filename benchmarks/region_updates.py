"""Small updates to big shards: what a region write moves per byte it changes.

copick's geometry (8^3 float32 regions written into a volume stored as one shard of 128^3 inner
chunks), on local files: for each writer the same sequence of regions is written, one call per
region (and for shardwise also all of them through one ``RegionWriter`` commit), and the bytes
the writing process read and wrote are taken from the kernel (``/proc/self/io``: ``rchar`` and
``wchar``, every read and write system call, whatever library makes it), so shardwise,
zarr-python and tensorstore are measured alike. Each case runs in a fresh process, cases
interleaved, ``--reps`` times; medians and min-max.

    python benchmarks/region_updates.py --reps 3 --out benchmarks/results/region-updates.jsonl

Cases: ``sw-region`` (``write_array(region=)`` per region), ``sw-batch`` (one ``RegionWriter``
for all regions), ``zarr`` (zarr-python ``arr[region] = values``), ``ts`` (tensorstore
``arr[region].write(values)``); ``sw-region-s3`` and ``sw-batch-s3`` the same two on moto's S3
server (started in this process, the cases' processes reaching it over HTTP). The figure:
bytes moved (read + written) per byte changed.

The kernel's ``rchar``/``wchar`` count the bytes ``copy_file_range`` copies (the kernel adds
them to both counters though they never reach the process) and every module a first call
imports, so for shardwise the write reports' own meter is given too: bytes read and written
by its requests, bytes the store copied (``copy_file_range``, ``UploadPartCopy``), requests,
and the target of issue 44: the stored size of the inner chunks each call touches plus the
shard index.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VOLUMES = {"small": (256, 256, 256), "large": (384, 384, 384)}
CHUNK = (128, 128, 128)
REGION = 8
UPDATES = 10
CASES = ("sw-region", "sw-batch", "zarr", "ts", "sw-region-s3", "sw-batch-s3")
BUCKET = "region-updates"
CREDS = dict(access_key_id="testing", secret_access_key="testing", region="us-east-1")


def io_counts() -> tuple[int, int]:
    """Bytes this process read and wrote through system calls so far."""
    got = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(got["rchar"]), int(got["wchar"])


def regions(shape: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """``UPDATES`` 8^3 regions spread through the volume (deterministic)."""
    out = []
    for k in range(UPDATES):
        start = [(37 * (k + 1) * (d + 3)) % (n - REGION) for d, n in enumerate(shape)]
        out.append(tuple(slice(s, s + REGION) for s in start))
    return out


def open_store(where: str) -> Any:
    """A local path, or ``endpoint|prefix`` of the moto server."""
    import zarr

    if "|" not in where:
        return zarr.storage.LocalStore(where)
    from obstore.store import S3Store

    endpoint, prefix = where.split("|")
    s3 = S3Store(BUCKET, prefix=prefix, endpoint=endpoint, client_options={"allow_http": True},
                 **CREDS)  # fmt: skip
    return zarr.storage.ObjectStore(s3)


def make_volume(where: str, shape: tuple[int, ...]) -> None:
    """The volume: smooth float32 values (compress as tomograms do), one shard, zstd."""
    import numpy as np
    import zarr

    z = np.linspace(0, 1, shape[0], dtype="f4")[:, None, None]
    y = np.linspace(0, 1, shape[1], dtype="f4")[None, :, None]
    x = np.linspace(0, 1, shape[2], dtype="f4")[None, None, :]
    values = np.sin(9 * z) * np.cos(7 * y) + x
    zarr.create_array(
        open_store(where), name="v", shape=shape, dtype="f4", chunks=CHUNK,
        shards=shape, compressors=zarr.codecs.ZstdCodec(level=3),
    )[...] = values  # fmt: skip


def target(store: Any, todo: list[tuple[slice, ...]], batch: bool) -> int:
    """Issue 44's target: the stored bytes of the inner chunks each call touches plus the index
    (one call for a batch: each touched chunk once)."""
    import itertools

    from shardwise.codec.index import ShardIndex, index_slice
    from shardwise.storage.nodes import open_info
    from shardwise.storage.store import ShardStore

    codec = open_info(store, "v").codec
    st = ShardStore(store, "v")
    size = st.size("c/0/0/0")
    assert size is not None
    where = index_slice(codec, size)
    raw = st.get_ranges("c/0/0/0", [(where.start, where.stop - where.start)])[0]
    index = ShardIndex.from_bytes(codec, raw, size, "v")
    grid = codec.grid

    def chunks(reg: tuple[slice, ...]) -> set[int]:
        pairs = zip(reg, CHUNK, strict=True)
        spans = [range(r.start // c, (r.stop - 1) // c + 1) for r, c in pairs]
        return {int(np_ravel(k, grid)) for k in itertools.product(*spans)}

    calls = [set().union(*(chunks(r) for r in todo))] if batch else [chunks(r) for r in todo]
    return sum(int(index.lengths[list(c)].sum()) + codec.index_nbytes for c in calls)


def np_ravel(k: tuple[int, ...], grid: tuple[int, ...]) -> int:
    import numpy as np

    return int(np.ravel_multi_index(k, grid))


def run_case(case: str, where: str, shape: tuple[int, ...]) -> dict:
    """One case in this (fresh) process: the regions written, the bytes and time it took."""
    import numpy as np

    todo = regions(shape)
    values = [np.full((REGION,) * 3, k + 1, "f4") for k in range(len(todo))]
    path: Any = Path(where)
    if case.startswith("sw-"):
        return run_shardwise(case, where, shape, todo, values)
    if case == "ts":
        import tensorstore as ts

        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path / "v")}}
        arr = ts.open(spec).result()
    elif case == "zarr":
        import zarr

        arr = zarr.open_array(zarr.storage.LocalStore(path), path="v", mode="r+")
    r0, w0 = io_counts()
    t0 = time.perf_counter()
    if case == "zarr":
        for reg, v in zip(todo, values, strict=True):
            arr[reg] = v
    else:
        for reg, v in zip(todo, values, strict=True):
            arr[reg].write(v).result()
    seconds = time.perf_counter() - t0
    r1, w1 = io_counts()
    changed = len(todo) * REGION**3 * 4
    return dict(case=case, read=r1 - r0, written=w1 - w0, changed=changed, seconds=seconds,
                shard_bytes=(path / "v" / "c" / "0" / "0" / "0").stat().st_size)  # fmt: skip


def run_shardwise(case: str, where: str, shape: Any, todo: list[Any], values: list[Any]) -> dict:
    """A shardwise case: the kernel's counts and the write reports' meter."""
    import shardwise
    from shardwise.engine.report import WriteReport

    store = open_store(where)
    batch = case.startswith("sw-batch")
    goal = target(store, todo, batch)
    import dask.array  # noqa: F401  (the imports a first write makes, untimed and uncounted)

    shardwise.read_array(store, path="v", selection=(0, 0, 0))
    r0, w0 = io_counts()
    t0 = time.perf_counter()
    total = WriteReport()
    if batch:
        with shardwise.RegionWriter(store, path="v") as w:
            for reg, v in zip(todo, values, strict=True):
                w.write(reg, v)
        assert w.report is not None
        total = w.report
    else:
        for reg, v in zip(todo, values, strict=True):
            total += shardwise.write_array(v, store, path="v", region=reg, mode="r+")
    seconds = time.perf_counter() - t0
    r1, w1 = io_counts()
    return dict(case=case, read=r1 - r0, written=w1 - w0, changed=len(todo) * REGION**3 * 4,
                seconds=seconds, meter_read=total.bytes_read, meter_written=total.bytes_written,
                copied=total.bytes_copied, requests=total.requests, target=goal,
                merges=sorted(set(total.merges)))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--volumes", default="small,large")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default=None)
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case, this process
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        shape = tuple(int(n) for n in args.shape.split(","))
        print(json.dumps(run_case(args.case, args.path, shape)))
        return
    cases = args.cases.split(",")
    with moto_server(any(c.endswith("-s3") for c in cases)) as endpoint:
        rows = [
            row
            for rep in range(args.reps)
            for vol in args.volumes.split(",")
            for case in (cases if rep % 2 == 0 else cases[::-1])
            for row in one_run(case, vol, rep, endpoint)
        ]
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(table(rows))


def one_run(case: str, vol: str, rep: int, endpoint: str | None) -> list[dict]:
    """One case on a fresh volume in a fresh process: its row (none if it failed)."""
    shape = VOLUMES[vol]
    with tempfile.TemporaryDirectory(prefix="region-updates-") as tmp:
        where = str(Path(tmp) / "vol.zarr")
        if case.endswith("-s3"):
            where = f"{endpoint}|{uuid.uuid4().hex[:12]}"
        make_volume(where, shape)
        cmd = [sys.executable, __file__, "--case", case, "--path", where,
               "--shape", ",".join(map(str, shape))]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if case.endswith("-s3"):
            drop(where)
    if out.returncode:
        print(out.stderr[-2000:], file=sys.stderr)
        return []
    row = json.loads(out.stdout.strip().splitlines()[-1]) | dict(volume=vol, rep=rep)
    print(json.dumps(row), flush=True)
    return [row]


@contextmanager
def moto_server(wanted: bool) -> Iterator[str | None]:
    """moto's S3 server in this process (a thread), its bucket made; None when not wanted."""
    if not wanted:
        yield None
        return
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip


def drop(where: str) -> None:
    """The objects of a case on the moto server removed (its memory stays bounded)."""
    endpoint, prefix = where.split("|")
    c = client(endpoint)
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            c.delete_object(Bucket=BUCKET, Key=o["Key"])


def table(rows: list[dict]) -> str:
    head = "| volume | case | moved / changed (median, min-max) | read MB | written MB | seconds |"
    lines = [head, "|---|---|---|---|---|---|"]
    for vol in VOLUMES:
        for case in CASES:
            got = [r for r in rows if r["volume"] == vol and r["case"] == case]
            if not got:
                continue
            amp = [(r["read"] + r["written"]) / r["changed"] for r in got]
            secs = [r["seconds"] for r in got]
            lines.append(
                f"| {vol} {VOLUMES[vol]} | {case} | {statistics.median(amp):,.0f}x "
                f"({min(amp):,.0f}-{max(amp):,.0f}) | "
                f"{statistics.median(r['read'] for r in got) / 1e6:.1f} | "
                f"{statistics.median(r['written'] for r in got) / 1e6:.1f} | "
                f"{statistics.median(secs):.2f} ({min(secs):.2f}-{max(secs):.2f}) |"
            )
    return "\n".join([*lines, "", meter_table(rows)])


def spread(vals: list[float]) -> str:
    """The median and the min-max."""
    return f"{statistics.median(vals):,.2f} ({min(vals):,.2f}-{max(vals):,.2f})"


def meter_table(rows: list[dict]) -> str:
    """shardwise's cases by their write reports: against issue 44's target."""
    head = ("| volume | case | merges | read / target | written / target | copied MB | "
            "moved / changed | requests |")  # fmt: skip
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for vol in VOLUMES:
        for case in CASES:
            got = [r for r in rows if r["volume"] == vol and r["case"] == case and "target" in r]
            if not got:
                continue

            lines.append(
                f"| {vol} | {case} | {','.join(got[0]['merges'])} | "
                f"{spread([r['meter_read'] / r['target'] for r in got])} | "
                f"{spread([r['meter_written'] / r['target'] for r in got])} | "
                f"{statistics.median(r['copied'] for r in got) / 1e6:.1f} | "
                f"{spread([(r['meter_read'] + r['meter_written']) / r['changed'] for r in got])} | "
                f"{statistics.median(r['requests'] for r in got):.0f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
