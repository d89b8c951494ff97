"""The ``shardwise`` command: inspect, verify, convert (and reshard), batch (HPC parts), lease.

Exit status: 0 success; 1 the array has problems (``verify``, ``batch finalize``); 2 bad usage;
3 refused or failed (another writer holds the lease, no array there, bad plan, I/O error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .errors import ShardwiseError, VerifyError

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3


class UsageError(Exception):
    """Arguments argparse cannot check on its own."""


# job-array index variables of the common schedulers (0-based as set up in docs/hpc.md)
TASK_ID_VARS = ("SHARDWISE_PART", "SLURM_ARRAY_TASK_ID", "PBS_ARRAY_INDEX", "PBS_ARRAYID")


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 256,256,64, got {text!r}") from None


def compressors(spec: str, crc32c: bool) -> Any:
    """zarr ``compressors=`` for ``zstd[:level]``, ``gzip[:level]``, ``blosc[:cname[:clevel]]``,
    ``none`` or ``auto``; ``crc32c`` appends a checksum of every inner chunk."""
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    name, *args = spec.lower().split(":")
    if name == "auto" and not crc32c:
        return "auto"
    out: list[Any]
    if name in ("auto", "zstd"):
        out = [ZstdCodec(level=int(args[0]) if args else 0)]
    elif name == "gzip":
        out = [GzipCodec(level=int(args[0]) if args else 5)]
    elif name == "blosc":
        cname: Any = args[0] if args else "zstd"
        out = [BloscCodec(cname=cname, clevel=int(args[1]) if len(args) > 1 else 5)]
    elif name == "none":
        out = []
    else:
        raise argparse.ArgumentTypeError(f"unknown compressor {spec!r}")
    if crc32c:
        out.append(Crc32cCodec())
    return out or None


def open_source(src: str, path: str | None) -> tuple[Any, Any]:
    """(lazy dask array, zarr array) for any zarr array: sharded v3 read by shardwise."""
    import dask.array as da
    import zarr

    from .api import open_array
    from .store import resolve_store

    zstore = resolve_store(src, mode="r")
    arr = zarr.open_array(zstore, path=path or "", mode="r")
    if arr.metadata.zarr_format == 3 and arr.shards is not None:
        try:
            return open_array(zstore, path=path), arr
        except ShardwiseError:
            pass
    return da.from_zarr(arr), arr


def _like(arr: Any) -> dict[str, Any]:
    meta = arr.metadata
    dims = getattr(meta, "dimension_names", None)
    return dict(
        dtype=arr.dtype,
        fill_value=arr.fill_value,
        dimension_names=dims,
        attributes=dict(arr.attrs) or None,
    )


def inspect_array(store: str, path: str | None = None) -> dict[str, Any]:
    """A summary of the array: metadata, stored shards, and the writer's journal state."""
    import zarr

    from .journal import BATCH, read_markers, read_records
    from .lease import read_lease
    from .metadata import info_from_metadata
    from .store import ShardStore, resolve_store
    from .verify import parse_shard_key

    zstore = resolve_store(store, mode="r")
    arr = zarr.open_array(zstore, path=path or "", mode="r", zarr_format=3)
    info = info_from_metadata(arr.metadata)
    lay = info.layout
    sstore = ShardStore(zstore, path or "")
    names = sstore.list("")
    stored = [n for n in names if parse_shard_key(lay, n) is not None]
    with ThreadPoolExecutor(8) as pool:
        sizes = [s or 0 for s in pool.map(sstore.size, stored)]
    markers = [m for m in read_markers(sstore).values() if m is not None]
    lease = read_lease(sstore)
    batch = sstore.get(BATCH)
    meta = arr.metadata.to_dict()
    return {
        "store": str(zstore),
        "path": path or "",
        "shape": list(lay.shape),
        "dtype": str(info.dtype),
        "fill_value": meta.get("fill_value"),
        "dimension_names": meta.get("dimension_names"),
        "shard_shape": list(lay.shard_shape),
        "chunk_shape": list(lay.chunk_shape),
        "shard_grid": list(lay.shard_grid),
        "shards_total": lay.nshards,
        "chunks_per_shard": lay.nchunks_per_shard,
        "codecs": meta["codecs"],
        "shards_stored": len(stored),
        "objects": sum(not n.startswith(".shardwise/") for n in names),
        "bytes_stored": int(sum(sizes)),
        "raw_bytes": int(info.dtype.itemsize * _prod(lay.shape)),
        "shards_recorded": len(read_records(sstore)),
        "writes_open": [m.id for m in markers if m.status != "done"],
        "writes_done": sum(m.status == "done" for m in markers),
        "lease": None if lease is None else lease.describe(),
        "batch": None if batch is None else json.loads(batch),
    }


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _print_inspect(d: dict[str, Any]) -> None:
    inner = d["codecs"][0].get("configuration", {}) if d["codecs"] else {}
    chain = " -> ".join(c["name"] for c in inner.get("codecs", []))
    index = " + ".join(c["name"] for c in inner.get("index_codecs", []))
    ratio = d["raw_bytes"] / d["bytes_stored"] if d["bytes_stored"] else float("nan")
    batch = d["batch"]
    rows = [
        f"{d['store']}" + (f" path {d['path']!r}" if d["path"] else ""),
        f"  array    {tuple(d['shape'])} {d['dtype']}, fill {d['fill_value']}"
        + (f", dims {tuple(d['dimension_names'])}" if d["dimension_names"] else ""),
        f"  shards   {tuple(d['shard_shape'])}: grid {tuple(d['shard_grid'])} = "
        f"{d['shards_total']} shards of {d['chunks_per_shard']} inner chunks "
        f"{tuple(d['chunk_shape'])}",
        f"  codecs   {chain}; index {index} at the {inner.get('index_location', 'end')}",
        f"  stored   {d['shards_stored']} shards ({d['objects']} objects with the metadata), "
        f"{d['bytes_stored'] / 1e6:.2f} MB "
        f"(ratio {ratio:.2f} to the full raw array)",
        f"  journal  {d['shards_recorded']} shard records, {d['writes_done']} writes done, "
        f"{len(d['writes_open'])} open" + (" (resume them)" if d["writes_open"] else ""),
        f"  lease    {d['lease'] or 'free'}",
    ]
    if batch:
        rows.append(f"  batch    open: {batch['nparts']} parts (shardwise batch status)")
    print("\n".join(rows))


def _scheduler(spec: str | None) -> Any:
    """A context for the dask scheduler: threads (default), processes, synchronous or ADDRESS."""
    import contextlib

    import dask

    if spec in (None, "threads", "synchronous", "processes"):
        return dask.config.set(scheduler=spec or "threads")
    from distributed import Client

    client = Client(spec)
    stack = contextlib.ExitStack()
    stack.enter_context(client)
    return stack


def _cmd_inspect(a: argparse.Namespace) -> int:
    from .store import resolve_store
    from .verify import _group_arrays

    arrays = _group_arrays(resolve_store(a.store, mode="r"), a.path)
    if arrays is None:
        d = inspect_array(a.store, a.path)
        if a.json:
            print(json.dumps(d, indent=2, default=str))
        else:
            _print_inspect(d)
        return EXIT_OK
    # a group (e.g. an xarray dataset): every array, and the objects of them all
    found = [inspect_array(a.store, name) for name in arrays]
    if a.json:
        print(json.dumps({"arrays": found}, indent=2, default=str))
        return EXIT_OK
    for d in found:
        _print_inspect(d)
    total = sum(d["objects"] for d in found)
    print(f"group: {len(found)} arrays, {total} objects (shards and metadata of the arrays)")
    return EXIT_OK


def _cmd_verify(a: argparse.Namespace) -> int:
    from .verify import verify

    report = verify(a.store, path=a.path, threads=a.threads)
    print(report.to_json() if a.json else report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _write_options(a: argparse.Namespace) -> dict[str, Any]:
    return dict(fsync=a.fsync, progress=a.progress, threads=a.threads)


def _cmd_convert(a: argparse.Namespace) -> int:
    from .convert import convert

    with _scheduler(a.scheduler):
        report = convert(
            a.src,
            a.dst,
            path=a.src_path,
            dst_path=a.dst_path,
            shards=a.shards,
            shard_bytes=a.shard_bytes,
            chunks=getattr(a, "chunks", None),
            compressors=_compressors(a),
            mode=a.mode,
            resume=a.resume,
            verify=a.verify,
            progress=a.progress,
            lease=not a.no_lease,
            break_lease=a.break_lease,
            fsync=a.fsync,
            threads=a.threads,
        )
    print(json.dumps(report.to_dict(), indent=2, default=str) if a.json else report)
    if a.verify:
        print("OK" if report.ok else "verification FAILED")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _compressors(a: argparse.Namespace) -> Any:
    """reshard's ``--compressor``/``--crc32c``: None keeps the source's codecs."""
    spec = getattr(a, "compressor", None)
    crc = getattr(a, "crc32c", False)
    if spec is None and not crc:
        return None
    return compressors(spec or "auto", crc)


def _shards_arg(text: str) -> Any:
    """``256,256,64`` (a shape) or ``time=365,lat=90`` (sizes per dimension name)."""
    if "=" not in text:
        return _shape(text)
    out = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        try:
            out[name.strip()] = int(size)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected name=size, got {part!r}") from None
    return out


def _cmd_reshard(a: argparse.Namespace) -> int:
    """``reshard`` is ``convert`` with its older flags (they re-encode when they change codecs)."""
    a.shard_bytes, a.json = None, False
    return _cmd_convert(a)


def _cmd_batch(a: argparse.Namespace) -> int:
    from . import batch

    if a.batch_cmd == "init":
        if a.source:
            _, arr = open_source(a.source, a.source_path)
            meta = dict(shape=arr.shape, **_like(arr))
            chunks = a.chunks or tuple(int(c) for c in arr.chunks)
        elif a.shape and a.dtype:
            meta = dict(shape=a.shape, dtype=a.dtype, fill_value=a.fill_value)
            chunks = a.chunks
        else:
            raise UsageError("batch init needs --source SRC, or --shape and --dtype")
        if chunks is None:
            raise UsageError("batch init needs --chunks (the inner chunk shape)")
        plan = batch.init(
            a.store,
            path=a.path,
            chunks=chunks,
            shards=a.shards,
            parts=a.parts,
            mode=a.mode,
            compressors=compressors(a.compressor or "auto", a.crc32c),
            break_lease=a.break_lease,
            **meta,
        )
        print(plan)
        return EXIT_OK
    if a.batch_cmd == "part":
        part = a.part
        if part is None:
            found = [os.environ[v] for v in TASK_ID_VARS if os.environ.get(v)]
            if not found:
                raise UsageError(f"give --part I (or set one of {', '.join(TASK_ID_VARS)})")
            part = int(found[0]) - a.index_base
        data, _ = open_source(a.source, a.source_path)
        with _scheduler(a.scheduler):
            report = batch.write_part(
                data,
                a.store,
                part,
                path=a.path,
                resume=a.resume,
                break_lease=a.break_lease,
                **_write_options(a),
            )
        print(f"part {part}: {report}")
        return EXIT_OK
    if a.batch_cmd == "finalize":
        try:
            checked = batch.finalize(a.store, path=a.path, threads=a.threads)
        except VerifyError as e:
            print(e.report, file=sys.stderr)
            return EXIT_PROBLEMS
        print(checked)
        return EXIT_OK
    plan = batch.open_batch(a.store, path=a.path)
    from .store import ShardStore, resolve_store

    done = set(batch.parts_done(ShardStore(resolve_store(a.store, mode="r"), a.path or "")))
    print(plan)
    print(f"done: {len(done)} of {plan.nparts}; to do: {sorted(set(range(plan.nparts)) - done)}")
    return EXIT_OK


def _cmd_lease(a: argparse.Namespace) -> int:
    from .lease import LEASE, break_lease, part_lease, read_lease
    from .store import ShardStore, resolve_store

    sstore = ShardStore(resolve_store(a.store, mode="w" if a.break_ else "r"), a.path or "")
    name = LEASE if a.part is None else part_lease(a.part, a.nparts)
    held = break_lease(sstore, name) if a.break_ else read_lease(sstore, name)
    if held is None:
        print("free")
    else:
        print(("broken: was held for " if a.break_ else "held for ") + held.describe())
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardwise",
        description="Inspect, verify, reshard and batch-write Zarr v3 sharded arrays.",
        epilog=__doc__.split("\n\n")[1].replace("``", "") if __doc__ else None,
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    def store_args(q: argparse.ArgumentParser, name: str = "store") -> None:
        q.add_argument(name, help="array location: a local directory or a URL (s3://...)")
        q.add_argument("--path", default=None, help="the array's path inside the store")

    def write_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--resume", action="store_true", help="continue an interrupted write")
        q.add_argument(
            "--break-lease",
            action="store_true",
            help="take over the lease of a writer known to be gone",
        )
        q.add_argument("--fsync", action="store_true", help="fsync every shard (local files)")
        q.add_argument("--threads", type=int, default=None, help="inner-chunk codec threads")
        q.add_argument(
            "--scheduler",
            default=None,
            help="threads (default), processes, synchronous, or a scheduler address",
        )
        q.add_argument("--progress", action="store_true", help="show a progress bar")

    def codec_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--shards", type=_shape, required=True, help="shard shape, e.g. 256,256,256")
        q.add_argument(
            "--chunks",
            type=_shape,
            default=None,
            help="inner chunk shape (default: the source's chunks)",
        )
        q.add_argument(
            "--compressor",
            default=None,
            help="zstd[:level], gzip[:level], blosc[:cname[:clevel]], none, auto "
            "(default: reshard keeps the source's codecs, batch init uses auto)",
        )
        q.add_argument("--crc32c", action="store_true", help="checksum every inner chunk")

    q = sub.add_parser("inspect", help="show an array's layout, storage and writer state")
    store_args(q)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_cmd_inspect)

    q = sub.add_parser("verify", help="check every shard; exit 1 on any problem")
    store_args(q)
    q.add_argument("--threads", type=int, default=None, help="shards checked at a time")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_cmd_verify)

    q = sub.add_parser(
        "convert",
        help="convert a zarr v2/v3 array or group into sharded v3 (copies encoded chunks)",
    )
    q.add_argument("src", help="source zarr array or group (v2 or v3)")
    q.add_argument("dst", help="destination")
    q.add_argument("--src-path", "--path", dest="src_path", default=None)
    q.add_argument("--dst-path", default=None)
    q.add_argument(
        "--shards",
        type=_shards_arg,
        default=None,
        help="shard shape (256,256,256) or sizes per dimension name (time=365)",
    )
    q.add_argument(
        "--shard-bytes", default=None, help="target shard size, e.g. 64MiB (default 64 MiB)"
    )
    write_args(q)
    q.set_defaults(progress=True)
    q.add_argument("--no-progress", dest="progress", action="store_false")
    q.add_argument("--mode", default="w-", choices=["w-", "w"])
    q.add_argument("--no-lease", action="store_true", help="do not take the write lease")
    q.add_argument("--verify", action="store_true", help="check the result against the source")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.set_defaults(func=_cmd_convert)

    q = sub.add_parser("reshard", help="copy an array into a new sharded array (see convert)")
    q.add_argument("src", help="source zarr array (any zarr format and chunking)")
    q.add_argument("dst", help="destination")
    q.add_argument("--src-path", default=None)
    q.add_argument("--dst-path", default=None)
    codec_args(q)
    write_args(q)
    q.add_argument("--mode", default="w-", choices=["w-", "w"])
    q.add_argument("--no-lease", action="store_true", help="do not take the write lease")
    q.add_argument("--verify", action="store_true", help="verify the result afterwards")
    q.set_defaults(func=_cmd_reshard)

    q = sub.add_parser("batch", help="HPC batch writes in shard-disjoint parts")
    bsub = q.add_subparsers(dest="batch_cmd", required=True)
    b = bsub.add_parser("init", help="write the metadata and split the array into parts")
    store_args(b)
    b.add_argument("--parts", type=int, required=True)
    b.add_argument("--source", default=None, help="take shape, dtype, fill value from this array")
    b.add_argument("--source-path", default=None)
    b.add_argument("--shape", type=_shape, default=None)
    b.add_argument("--dtype", default=None)
    b.add_argument("--fill-value", type=float, default=None)
    b.add_argument("--mode", default="w-", choices=["w-", "w", "r+"])
    b.add_argument("--break-lease", action="store_true")
    codec_args(b)
    b = bsub.add_parser("part", help="write one part (default: the job-array task id)")
    store_args(b)
    b.add_argument("--source", required=True, help="the array to copy the part from")
    b.add_argument("--source-path", default=None)
    b.add_argument("--part", type=int, default=None)
    b.add_argument(
        "--index-base",
        type=int,
        default=0,
        help="first task id of the job array (1 for PBS/SGE arrays numbered from 1)",
    )
    write_args(b)
    b = bsub.add_parser("finalize", help="check all parts and verify; exit 1 on problems")
    store_args(b)
    b.add_argument("--threads", type=int, default=None)
    b = bsub.add_parser("status", help="which parts are done")
    store_args(b)
    q.set_defaults(func=_cmd_batch)

    q = sub.add_parser("lease", help="show (or break) an array's write lease")
    store_args(q)
    q.add_argument(
        "--break",
        dest="break_",
        action="store_true",
        help="remove the lease: only when its holder is known to be gone",
    )
    q.add_argument("--part", type=int, default=None, help="a batch part's lease instead")
    q.add_argument("--nparts", type=int, default=0)
    q.set_defaults(func=_cmd_lease)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except (UsageError, argparse.ArgumentTypeError) as e:
        print(f"shardwise {args.cmd}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (ShardwiseError, OSError, ValueError) as e:  # zarr's errors are ValueErrors
        print(f"shardwise {args.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
