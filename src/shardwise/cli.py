"""The ``shardwise`` command: inspect, verify, convert (and reshard), batch (HPC parts), lease.

Exit status: 0 success; 1 the array has problems (``verify``, ``batch finalize``); 2 bad usage
(arguments); 3 refused or failed: no array there (or a group, or a Zarr v2 array), the store
cannot be opened or read (e.g. missing credentials), bad plan or input, another writer holds the
lease, any other error. A failure is one line on stderr; --traceback (or SHARDWISE_TRACEBACK=1)
adds the full traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

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


def open_source(
    src: str, path: str | None, storage_options: dict[str, Any] | None = None
) -> tuple[Any, Any]:
    """(lazy dask array, zarr array) for any zarr array: sharded v3 read by shardwise."""
    import dask.array as da
    import zarr
    from zarr.errors import ContainsGroupError, NodeTypeValidationError

    from .api import open_array, open_zarr_array
    from .errors import ArrayNotFoundError
    from .storage.store import describe, resolve_store

    zstore = resolve_store(src, mode="r", storage_options=storage_options)
    try:
        arr = zarr.open_array(zstore, path=path or "", mode="r")
    except (NodeTypeValidationError, ContainsGroupError):
        open_zarr_array(zstore, path)  # raises NotAnArrayError, listing the group's arrays
        raise
    except FileNotFoundError:
        raise ArrayNotFoundError(f"no array at {describe(zstore, path, 'path')}") from None
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


def inspect_array(
    store: Any, path: str | None = None, storage_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A summary of the array: metadata, stored shards, and the writer's journal state.

    For a group: ``{"store", "path", "group": True, "arrays": [summary, ...]}`` with the summary of
    each array below it (unsharded arrays: shape, dtype and chunks only).
    """
    from .api import open_zarr_array
    from .errors import NotAnArrayError
    from .storage.store import resolve_store, store_name

    zstore = resolve_store(store, mode="r", storage_options=storage_options)
    try:
        arr = open_zarr_array(zstore, path)
    except NotAnArrayError as e:
        members = [_inspect_member(zstore, name) for name in e.arrays]
        return {"store": store_name(zstore), "path": path or "", "group": True, "arrays": members}
    return _inspect_one(zstore, path, arr)


def _inspect_member(zstore: Any, name: str) -> dict[str, Any]:
    from .api import open_zarr_array
    from .errors import UnsupportedCodecError
    from .storage.store import store_name

    arr = open_zarr_array(zstore, name)
    try:
        return _inspect_one(zstore, name, arr)
    except UnsupportedCodecError as e:
        return {
            "store": store_name(zstore),
            "path": name,
            "shape": list(arr.shape),
            "dtype": str(arr.dtype),
            "chunk_shape": list(arr.chunks),
            "sharded": False,
            "note": str(e),
        }


def _inspect_one(zstore: Any, path: str | None, arr: Any) -> dict[str, Any]:
    from .codec.metadata import info_from_metadata
    from .durability.journal import BATCH, read_markers, read_records
    from .durability.lease import read_lease
    from .durability.verify import parse_shard_key
    from .storage.store import ShardStore, store_name

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
        "store": store_name(zstore),
        "path": path or "",
        "sharded": True,
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
        "raw_bytes": int(info.dtype.itemsize * math.prod(lay.shape)),
        "shards_recorded": len(read_records(sstore)),
        "writes_open": [m.id for m in markers if m.status != "done"],
        "writes_done": sum(m.status == "done" for m in markers),
        "lease": None if lease is None else lease.describe(),
        "batch": None if batch is None else json.loads(batch),
    }


def _print_inspect(d: dict[str, Any]) -> None:
    if d.get("group"):
        arrays = d["arrays"]
        print(
            f"{d['store']}" + (f" path {d['path']!r}" if d["path"] else "") + ": a group of "
            f"{len(arrays)} arrays, {sum(m.get('objects', 0) for m in arrays)} objects of "
            "sharded arrays (inspect one with --path NAME)"
        )
        for m in arrays:
            head = f"  {m['path']}  {tuple(m['shape'])} {m['dtype']}"
            if not m["sharded"]:
                print(f"{head}, not sharded: chunks {tuple(m['chunk_shape'])}")
                continue
            print(
                f"{head}, shards {tuple(m['shard_shape'])} of inner chunks "
                f"{tuple(m['chunk_shape'])}; {m['shards_stored']} of {m['shards_total']} shards "
                f"stored, {m['bytes_stored'] / 1e6:.2f} MB"
            )
        return
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
    d = inspect_array(a.store, a.path, a.storage_options)
    if a.json:
        print(json.dumps(d, indent=2, default=str))
    else:
        _print_inspect(d)
    return EXIT_OK


def _cmd_verify(a: argparse.Namespace) -> int:
    from .durability.verify import verify

    report = verify(
        a.store,
        path=a.path,
        threads=a.threads,
        strict=a.strict,
        storage_options=a.storage_options,
        progress=a.progress,
    )
    print(report.to_json() if a.json else report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _write_options(a: argparse.Namespace) -> dict[str, Any]:
    return dict(fsync=a.fsync, progress=a.progress, threads=a.threads)


def _cmd_convert(a: argparse.Namespace) -> int:
    from .conversion.convert import convert

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
            storage_options=a.storage_options,
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
    """``256,256,64`` (a shape) or ``time=365,lat=90`` (sizes per dimension name), parsed as
    :func:`shardwise.convert` then checks and rounds it (core/shardspec.py)."""
    from .core.shardspec import parse_shards

    try:
        return parse_shards(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _cmd_reshard(a: argparse.Namespace) -> int:
    """``reshard`` is ``convert`` with its older flags (they re-encode when they change codecs)."""
    a.shard_bytes, a.json = None, False
    return _cmd_convert(a)


def _cmd_batch(a: argparse.Namespace) -> int:
    from .durability import batch

    if a.batch_cmd == "init":
        if a.source:
            _, arr = open_source(a.source, a.source_path, a.storage_options)
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
            storage_options=a.storage_options,
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
        data, _ = open_source(a.source, a.source_path, a.storage_options)
        with _scheduler(a.scheduler):
            report = batch.write_part(
                data,
                a.store,
                part,
                path=a.path,
                resume=a.resume,
                break_lease=a.break_lease,
                storage_options=a.storage_options,
                **_write_options(a),
            )
        print(f"part {part}: {report}")
        return EXIT_OK
    if a.batch_cmd == "finalize":
        try:
            checked = batch.finalize(
                a.store, path=a.path, threads=a.threads, storage_options=a.storage_options
            )
        except VerifyError as e:
            print(e.report, file=sys.stderr)
            return EXIT_PROBLEMS
        print(checked)
        return EXIT_OK
    from .durability.journal import BATCH
    from .storage.store import ShardStore, resolve_store

    zstore = resolve_store(a.store, mode="r", storage_options=a.storage_options)
    sstore = ShardStore(zstore, a.path or "")
    closed = batch.read_finalized(sstore) if sstore.get(BATCH) is None else None
    if closed is not None:
        print(
            f"batch {str(closed.get('id'))[:8]}: finalized at {closed.get('finalized')} "
            f"({closed.get('nparts')} parts, array {tuple(closed.get('shape') or ())}); "
            "no batch open"
        )
        return EXIT_OK
    plan = batch.open_batch(a.store, path=a.path, storage_options=a.storage_options)
    done = set(batch.parts_done(sstore))
    print(plan)
    print(f"done: {len(done)} of {plan.nparts}; to do: {sorted(set(range(plan.nparts)) - done)}")
    return EXIT_OK


def _cmd_lease(a: argparse.Namespace) -> int:
    from .durability.lease import LEASE, break_lease, part_lease, read_lease, shared_leases
    from .storage.store import ShardStore, resolve_store

    zstore = resolve_store(
        a.store, mode="w" if a.break_ else "r", storage_options=a.storage_options
    )
    sstore = ShardStore(zstore, a.path or "")
    nparts = a.nparts
    if a.part is not None and not nparts:
        # a part's lease is named by its batch's part count: read it from the batch record
        from .durability.batch import BatchPlan
        from .durability.journal import BATCH

        raw = sstore.get(BATCH)
        if raw is None:
            raise UsageError(
                f"no open batch at {a.store} to read the part count from: give --nparts N"
            )
        nparts = BatchPlan.from_bytes(raw).nparts
    name = LEASE if a.part is None else part_lease(a.part, nparts)
    shared = shared_leases(sstore) if name == LEASE else {}
    held = break_lease(sstore, name) if a.break_ else read_lease(sstore, name)
    if held is None and not shared:
        print("free")
    if held is not None:
        print(("broken: was held for " if a.break_ else "held for ") + held.describe())
    for info in shared.values():  # region writes side by side (broken with the lease)
        print(("broken: was " if a.break_ else "") + "shared by " + info.describe())
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (exit 2), like every other failure."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="shardwise",
        description="Inspect, verify, reshard and batch-write Zarr v3 sharded arrays.",
        epilog=__doc__.split("\n\n")[1].replace("``", "") if __doc__ else None,
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    def common_args(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--storage-option",
            dest="storage_option",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="an fsspec storage option for every store this command opens, e.g. "
            "endpoint_url=http://host:9000 or anon=true (VALUE is read as JSON when it parses, "
            "else as a string); repeat for more",
        )
        q.add_argument(
            "--storage-options",
            dest="storage_options_json",
            default=None,
            metavar="JSON",
            help="fsspec storage options as one JSON object, e.g. '{\"anon\": true}'",
        )
        q.add_argument(
            "--traceback",
            action="store_true",
            help="on failure, print the full traceback (also: SHARDWISE_TRACEBACK=1)",
        )

    def store_args(q: argparse.ArgumentParser, name: str = "store") -> None:
        q.add_argument(name, help="array location: a local directory or a URL (s3://...)")
        q.add_argument("--path", default=None, help="the array's path inside the store")
        common_args(q)

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
        progress_arg(q)

    def progress_arg(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--progress",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="a progress bar over the shards done and the bytes moved (default: on)",
        )

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
            help="zstd[:level], gzip[:level], blosc[:cname[:clevel]], none, auto (auto: zstd "
            "with its frame checksum; default: reshard keeps the source's codecs, batch init "
            "uses auto)",
        )
        q.add_argument("--crc32c", action="store_true", help="checksum every inner chunk")

    q = sub.add_parser("inspect", help="show an array's layout, storage and writer state")
    store_args(q)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_cmd_inspect)

    q = sub.add_parser("verify", help="check every shard; exit 1 on any problem")
    store_args(q)
    q.add_argument("--threads", type=int, default=None, help="shards checked at a time")
    q.add_argument(
        "--strict",
        action="store_true",
        help="shards written or changed by another tool (sound, but not as shardwise recorded "
        "them) are problems (exit 1), not notes",
    )
    q.add_argument("--json", action="store_true")
    progress_arg(q)
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
    common_args(q)
    write_args(q)
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
    common_args(q)
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
    q.add_argument(
        "--nparts",
        type=int,
        default=0,
        help="the batch's part count (default: read from the open batch)",
    )
    q.set_defaults(func=_cmd_lease)
    return p


def storage_options(a: argparse.Namespace) -> dict[str, Any] | None:
    """The storage options of ``--storage-options JSON`` and ``--storage-option K=V``."""
    out: dict[str, Any] = {}
    if a.storage_options_json:
        try:
            given = json.loads(a.storage_options_json)
        except json.JSONDecodeError as e:
            raise UsageError(f"--storage-options is not valid JSON: {e}") from None
        if not isinstance(given, dict):
            raise UsageError(f"--storage-options must be a JSON object, got {given!r}")
        out.update(given)
    for item in a.storage_option:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--storage-option takes KEY=VALUE, got {item!r}")
        try:
            value: Any = json.loads(text)
        except json.JSONDecodeError:
            value = text
        out[key.strip()] = value
    return out or None


def _one_line(e: BaseException) -> str:
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text}".rstrip(": ")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    show = args.traceback or os.environ.get("SHARDWISE_TRACEBACK", "") not in ("", "0")
    name = f"shardwise {args.cmd}" + (f" {args.batch_cmd}" if args.cmd == "batch" else "")
    try:
        args.storage_options = storage_options(args)
        code: int = args.func(args)
    except (UsageError, argparse.ArgumentTypeError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line, whatever failed (the store, the input, a bug)
        if show:
            import traceback

            traceback.print_exc()
        where = getattr(args, "store", None) or getattr(args, "src", None)
        hint = "" if show else " (--traceback for details)"
        if isinstance(e, ShardwiseError):
            print(f"{name}: {_one_line(e)}", file=sys.stderr)
        elif where and not isinstance(e, ValueError | FileNotFoundError | FileExistsError):
            print(f"{name}: cannot open store {where}: {_one_line(e)}{hint}", file=sys.stderr)
        else:
            print(f"{name}: {_one_line(e)}{hint}", file=sys.stderr)
        return EXIT_FAILED
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
