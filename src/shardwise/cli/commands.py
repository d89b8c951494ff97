"""What each ``shardwise`` command does with its parsed arguments; each returns an exit status."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import VerifyError
from .inspection import inspect_array, print_inspect, shard_map
from .status import EXIT_OK, EXIT_PROBLEMS, UsageError

# job-array index variables of the common schedulers (0-based as set up in docs/hpc.md)
TASK_ID_VARS = ("SHARDWISE_PART", "SLURM_ARRAY_TASK_ID", "PBS_ARRAY_INDEX", "PBS_ARRAYID")


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

    from ..api import open_array
    from ..errors import ShardwiseError
    from ..storage.nodes import node_errors
    from ..storage.store import resolve_store

    zstore = resolve_store(src, mode="r", storage_options=storage_options)
    with node_errors(zstore, path, "array"):
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


def cmd_inspect(a: argparse.Namespace) -> int:
    if a.plot is not None:
        from .plot import require_matplotlib, write_png

        require_matplotlib()  # before the store is read
        drawing = shard_map(a.store, a.path, a.storage_options)
        write_png(drawing.picture, a.plot)
    d = inspect_array(a.store, a.path, a.storage_options)
    if a.json:
        print(json.dumps(d, indent=2, default=str))
    else:
        print_inspect(d)
        if a.plot is not None:
            print(f"  picture  {a.plot}")
    return EXIT_OK


def cmd_verify(a: argparse.Namespace) -> int:
    from ..durability.verify import verify
    from ..errors import ArrayNotFoundError, UnsupportedCodecError
    from ..storage.nodes import group_arrays, open_zarr_array
    from ..storage.store import resolve_store

    zstore = resolve_store(a.store, mode="r", storage_options=a.storage_options)
    if group_arrays(zstore, a.path) is None:
        # nothing to verify (no array, or a Zarr v2 one) is a refusal (exit 3), not a problem
        # of an array; metadata that does not parse stays a problem verify reports (exit 1)
        try:
            open_zarr_array(zstore, a.path)
        except (ArrayNotFoundError, UnsupportedCodecError):
            raise
        except Exception:  # verify itself names what is wrong with the metadata
            pass
    report = verify(
        zstore,
        path=a.path,
        threads=a.threads,
        strict=a.strict,
        progress=a.progress,
    )
    print(report.to_json() if a.json else report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def cmd_convert(a: argparse.Namespace) -> int:
    from ..conversion.convert import convert

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
            pyramid=_pyramid(a),
        )
    print(json.dumps(report.to_dict(), indent=2, default=str) if a.json else report)
    if a.verify:
        print("OK" if report.ok else "verification FAILED")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _pyramid(a: argparse.Namespace) -> dict[str, Any] | None:
    """convert's ``--pyramid`` and its options as ``convert(pyramid=...)``; reshard has none."""
    given = {
        k: getattr(a, k, None)
        for k in ("levels", "factors", "method")
        if getattr(a, k, None) is not None
    }
    if not getattr(a, "pyramid", False):
        if given:
            named = ", ".join(f"--{k}" for k in given)
            raise UsageError(f"{named} shape a pyramid: add --pyramid")
        return None
    return given


def _compressors(a: argparse.Namespace) -> Any:
    """reshard's ``--compressor``/``--crc32c``: None keeps the source's codecs."""
    spec = getattr(a, "compressor", None)
    crc = getattr(a, "crc32c", False)
    if spec is None and not crc:
        return None
    return compressors(spec or "auto", crc)


def cmd_reshard(a: argparse.Namespace) -> int:
    """``reshard`` is ``convert`` without a pyramid: the same grammar for shards and chunks
    (``--compressor`` and new ``--chunks`` re-encode)."""
    return cmd_convert(a)


def cmd_batch(a: argparse.Namespace) -> int:
    if a.batch_cmd == "init":
        return _batch_init(a)
    if a.batch_cmd == "part":
        return _batch_part(a)
    if a.batch_cmd == "finalize":
        from .. import batch

        try:
            checked = batch.finalize(
                a.store, path=a.path, threads=a.threads, storage_options=a.storage_options
            )
        except VerifyError as e:
            print(e.report, file=sys.stderr)
            return EXIT_PROBLEMS
        print(checked)
        return EXIT_OK
    return _batch_status(a)


def _batch_init(a: argparse.Namespace) -> int:
    from .. import batch

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
    shape = tuple(meta["shape"])
    for option, given in (("--shards", a.shards), ("--chunks", chunks)):
        if len(given) != len(shape):
            raise UsageError(
                f"{option} {','.join(map(str, given))} has {len(given)} size(s), but the array "
                f"has {len(shape)} dimension(s) {shape}: give one size per dimension"
            )
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


def _part_from_env(index_base: int) -> int:
    """The part of this job-array task: its index variable less the array's first index."""
    found = [(v, os.environ[v]) for v in TASK_ID_VARS if os.environ.get(v)]
    if not found:
        raise UsageError(f"give --part I (or set one of {', '.join(TASK_ID_VARS)})")
    var, text = found[0]
    try:
        part = int(text) - index_base
    except ValueError:
        raise UsageError(f"{var}={text!r} is not a task number: give --part I") from None
    if part < 0:
        raise UsageError(f"{var}={text} is below --index-base {index_base}: give --part I")
    return part


def _batch_part(a: argparse.Namespace) -> int:
    from .. import batch

    part = _part_from_env(a.index_base) if a.part is None else a.part
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
            fsync=a.fsync,
            progress=a.progress,
            threads=a.threads,
        )
    print(f"part {part}: {report}")
    return EXIT_OK


def _batch_status(a: argparse.Namespace) -> int:
    from .. import batch
    from ..durability.journal import BATCH
    from ..storage.store import ShardStore, resolve_store

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


def cmd_lease(a: argparse.Namespace) -> int:
    from ..durability.lease import LEASE, break_lease, part_lease, read_lease, shared_leases
    from ..storage.store import ShardStore, resolve_store

    zstore = resolve_store(
        a.store, mode="w" if a.break_ else "r", storage_options=a.storage_options
    )
    sstore = ShardStore(zstore, a.path or "")
    nparts = a.nparts
    if a.part is not None and not nparts:
        # a part's lease is named by its batch's part count: read it from the batch record
        from ..batch import BatchPlan
        from ..durability.journal import BATCH

        raw = sstore.get(BATCH)
        if raw is None:
            raise UsageError(
                f"no open batch at {a.store} to read the part count from: give --nparts N"
            )
        nparts = BatchPlan.from_bytes(raw).nparts
    name = LEASE if a.part is None else part_lease(a.part, nparts)
    shared = shared_leases(sstore) if name == LEASE else {}
    held = break_lease(sstore, name) if a.break_ else read_lease(sstore, name)
    # the batch parts' leases too: "free" means what mode "w" finds free (blocking_leases)
    parts = _part_leases(sstore) if name == LEASE else {}
    if held is None and not shared and not parts:
        _lease_target(zstore, sstore, a.path)  # "free" only where a write could hold one
        print("free")
    if held is not None:
        print(("broken: was held for " if a.break_ else "held for ") + held.describe())
    for info in shared.values():  # region writes side by side (broken with the lease)
        print(("broken: was " if a.break_ else "") + "shared by " + info.describe())
    for part, info in parts.items():
        print(f"{part} held for {info.describe()} (--part to see or break it)")
    return EXIT_OK


def _part_leases(sstore: Any) -> dict[str, Any]:
    """The batch parts' leases held at the array ("part I of N" -> holder)."""
    from ..durability.lease import LEASE, leases_under

    out = {}
    for name, info in sorted(leases_under(sstore, array=True).items()):
        if name.startswith(f"{LEASE}.part-"):
            i, n = name.removeprefix(f"{LEASE}.part-").split("-of-")
            out[f"part {i} of {n}"] = info
    return out


def _lease_target(zstore: Any, sstore: Any, path: str | None) -> None:
    """An array, or what a write left of one (its journal): else the lease's path is a
    mistake, refused (a group, a Zarr v2 array or nothing: exit status 3), not "free"."""
    from ..storage.nodes import open_info
    from ..storage.store import JOURNAL

    if not sstore.list(JOURNAL):
        open_info(zstore, path)


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
