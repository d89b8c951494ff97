"""The public verbs for arrays: write_array and open_array."""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr
from zarr.storage import MemoryStore

from .errors import PlanError
from .job import Strategy, WriteJob, make_job
from .layout import Region, normalize_region
from .metadata import ArrayInfo, info_from_metadata
from .plan import WritePlan
from .read import ShardReader
from .session import WriteSession, plan_keys, plan_shards
from .store import ShardStore, resolve_store
from .write import Mode, ShardWriter, WriteOptions, WriteReport, build_graph, run_graph

_MODES = ("w", "w-", "a", "r+")


def open_info(store: Any, path: str | None = None) -> ArrayInfo:
    """Read and translate the metadata of the array at ``path`` in a zarr ``store``."""
    arr = zarr.open_array(store, path=path or "", mode="r", zarr_format=3)
    return info_from_metadata(arr.metadata)


def _exists(store: Any, path: str | None) -> bool:
    try:
        zarr.open_array(store, path=path or "", mode="r", zarr_format=3)
    except (FileNotFoundError, KeyError, ValueError, TypeError) as e:
        if "ArrayNotFound" in type(e).__name__ or isinstance(e, FileNotFoundError | KeyError):
            return False
        if "NodeTypeValidationError" in type(e).__name__ or "ContainsGroup" in type(e).__name__:
            raise PlanError(f"a group, not an array, exists at path {path!r}") from e
        raise
    return True


def _create_kwargs(
    shape: tuple[int, ...], dtype: Any, chunks: Any, shards: Any, kwargs: dict[str, Any]
) -> dict[str, Any]:
    if shards is None:
        raise PlanError("shards= is required: the shard shape (each shard is one stored object)")
    out = dict(shape=shape, dtype=dtype, chunks=chunks, shards=shards, zarr_format=3)
    # None means "no codecs" for compressors/filters (as in zarr), "default" for the rest
    keep_none = ("compressors", "filters")
    out.update({k: v for k, v in kwargs.items() if v is not None or k in keep_none})
    return out


def write_array(
    data: Any,
    store: Any,
    *,
    path: str | None = None,
    chunks: Any = "auto",
    shards: Any = None,
    dtype: Any = None,
    fill_value: Any = None,
    compressors: Any = "auto",
    filters: Any = "auto",
    serializer: Any = "auto",
    dimension_names: Any = None,
    attributes: dict[str, Any] | None = None,
    chunk_key_encoding: Any = None,
    zarr_format: int = 3,
    mode: Mode = "w-",
    region: tuple[slice, ...] | None = None,
    write_empty_chunks: bool = False,
    threads: int | None = None,
    fsync: bool = False,
    storage_options: dict[str, Any] | None = None,
    compute: bool = True,
    progress: bool = False,
    resume: bool = False,
    lease: bool | None = None,
    break_lease: bool = False,
    strategy: Strategy = "auto",
    memory_limit: int | None = None,
    dry_run: bool = False,
) -> WriteReport | Any:
    """Write a numpy or dask array into a sharded Zarr v3 array, one task per shard.

    ``chunks`` is the inner chunk shape and ``shards`` the shard shape, as in
    ``zarr.create_array``; the dask chunking of ``data`` may be anything. Every non-empty shard
    is written by exactly one task with one atomic store ``set``; shards whose values all equal
    the fill value are not stored (and removed if they were). ``mode``: ``"w-"`` create (fail if
    it exists), ``"w"`` create or replace, ``"a"`` write into an existing array (create when
    missing), ``"r+"`` write into an existing array. ``region`` places ``data`` inside an existing
    array; shards it covers in part are merged with what is stored. ``threads`` caps the threads
    that encode inner chunks (default: the cores, or the dask worker's threads).
    ``fsync=True`` makes each shard durable (file and directory fsync) on local filesystems.

    ``resume=True`` continues an interrupted write of the same data and region: shards it already
    stored (and recorded) are skipped, temp files and abandoned multipart uploads removed. The
    write holds the array's lease (``lease``, default: on when ``compute=True``): a second writer
    is refused with :class:`LeaseHeldError` before it writes anything. ``break_lease=True`` takes
    over the lease of a writer known to be gone.

    ``strategy``: ``"direct"`` encodes each shard in one task from its raw data (the source is
    rechunked to the shard pieces; a task holds about 3x one shard); ``"staged"`` encodes the inner
    chunks where the dask blocks are and streams each shard from the encoded pieces (a task holds
    one block plus a fixed buffer, whatever the shard size); ``"auto"`` (default) is direct when
    the dask chunks already are the shard pieces and fit ``memory_limit``, else staged.
    ``memory_limit``: bytes one task may hold (default: the dask worker's memory limit per
    thread, else half the available memory per core); a job that would not fit is refused.

    Returns a :class:`WriteReport`, or with ``compute=False`` a dask ``Delayed`` that computes it,
    or with ``dry_run=True`` the :class:`WriteJob` without writing anything (see
    :func:`plan_write`). Every check runs before the first metadata or data byte is written.
    """
    if zarr_format != 3:
        raise PlanError(f"shardwise writes Zarr format 3 only (got zarr_format={zarr_format})")
    if mode not in _MODES:
        raise PlanError(f"mode must be one of {_MODES}, got {mode!r}")
    if not hasattr(data, "shape") or not hasattr(data, "dtype"):
        data = np.asarray(data)
    shape = tuple(int(n) for n in data.shape)
    zstore = resolve_store(store, mode="w", storage_options=storage_options)
    exists = (mode != "w" or resume) and _exists(zstore, path)
    if mode == "w-" and exists and not resume:
        raise FileExistsError(f"an array already exists at path {path!r} (use mode='w' or 'a')")
    if mode == "r+" and not exists:
        raise FileNotFoundError(f"no array at path {path!r} to write into (mode='r+')")

    create = not exists
    if create or (resume and mode in ("w", "w-") and region is None):
        if region is not None:
            raise PlanError("region= needs an existing array (mode='r+' or 'a')")
        kwargs = _create_kwargs(
            shape,
            data.dtype if dtype is None else dtype,
            chunks,
            shards,
            dict(
                fill_value=fill_value,
                compressors=compressors,
                filters=filters,
                serializer=serializer,
                dimension_names=dimension_names,
                attributes=attributes,
                chunk_key_encoding=chunk_key_encoding,
            ),
        )
        # build and translate the metadata in memory first: bad arguments fail before any I/O
        probe = zarr.create_array(MemoryStore(), **kwargs)
        # translate the metadata as stored (JSON), which is what readers will see: e.g. a NaN
        # fill value with a payload is stored as plain "NaN"
        info = open_info(probe.store)
        if exists and not _same_metadata(probe, zstore, path):
            if mode == "w-":
                raise FileExistsError(
                    f"an array with other metadata exists at path {path!r}: nothing to resume"
                )
            create = True
    else:
        info = open_info(zstore, path)

    target: Region = normalize_region(
        region if region is not None else tuple(slice(None) for _ in info.layout.shape),
        info.layout.shape,
    )
    want = tuple(s.stop - s.start for s in target)
    if want != shape:
        raise PlanError(f"data of shape {shape} does not fit the region {want} of the array")
    if not np.can_cast(data.dtype, info.dtype, casting="same_kind"):
        raise PlanError(f"cannot write {data.dtype} data into a {info.dtype} array without loss")

    sstore = ShardStore(zstore, path or "", fsync=fsync)
    plan = WritePlan(info.layout, target)
    job = make_job(
        plan,
        _dask_chunks(data),
        np.dtype(info.dtype).itemsize,
        strategy=strategy,
        memory_limit=memory_limit,
    )
    job.validate()
    if dry_run:
        return job
    session = WriteSession.begin(
        sstore,
        target,
        info.layout.shape,
        lease=compute if lease is None else lease,
        break_lease=break_lease,
    )
    try:
        if create:
            # our own clear instead of zarr's overwrite, which would delete the lease too
            session.clear(everything=mode == "w")
        session.start(
            resume=resume,
            keys=plan_keys(plan),
            adopt_done=mode == "w-",
            must_adopt=resume and mode == "w-" and exists and not create,
        )
        if create:
            zarr.create_array(zstore, name=path or None, overwrite=False, **kwargs)
        options = WriteOptions(write_empty_chunks=write_empty_chunks, threads=threads)
        keep, skipped = None, session.done_shards(plan, info.codec)
        if job.strategy == "staged":
            report = _run_staged(
                job, info, sstore, options, session, data, skipped, compute, progress
            )
            if not compute:
                return report
            report.shards_skipped = len(skipped)
            return session.finish(report)
        writer = ShardWriter(
            info=info,
            store=sstore,
            plan=plan,
            options=options,
            journal=session.journal(info.codec),
        )
        if skipped:
            keep = np.array([s not in skipped for s in plan_shards(plan)]).reshape(
                [len(c) for c in plan.task_chunks]
            )
        report = run_graph(
            build_graph(writer, data),
            compute=compute,
            progress=progress,
            keep=keep,
            finish=None if compute else session.finish,
        )
    except BaseException:
        session.abort()
        raise
    if not compute:
        return report
    report.shards_skipped = len(skipped)
    return session.finish(report)


def plan_write(data: Any, store: Any, **kwargs: Any) -> WriteJob:
    """The :class:`WriteJob` that :func:`write_array` would run with these arguments.

    Nothing is written (not even metadata); the job is validated (a job that would not fit
    ``memory_limit`` raises :class:`PlanError`). Print it to see shards, tasks, strategy,
    estimated peak memory per task and bytes to move.
    """
    job = write_array(data, store, dry_run=True, **kwargs)
    assert isinstance(job, WriteJob)
    return job


def _dask_chunks(data: Any) -> tuple[tuple[int, ...], ...] | None:
    chunks = getattr(data, "chunks", None)
    if chunks is None or not hasattr(data, "dask"):
        return None
    return tuple(tuple(int(n) for n in c) for c in chunks)


def _run_staged(
    job: WriteJob,
    info: ArrayInfo,
    sstore: ShardStore,
    options: WriteOptions,
    session: WriteSession,
    data: Any,
    skipped: set[Any],
    compute: bool,
    progress: bool,
) -> Any:
    from .journal import abort_multipart_uploads
    from .staged import StagedWriter, remove_staged, run_staged

    assert session.marker is not None
    write_id = session.marker.id
    writer = StagedWriter(
        info,
        sstore,
        job.plan,
        options,
        job.blocks,
        write_id,
        session.journal(info.codec),
        frozenset(skipped),
    )

    def finish(report: WriteReport) -> WriteReport:
        # pieces of tasks retried after their worker died, and any other leftovers
        session.cleaned["staged_pieces"] = session.cleaned.get("staged_pieces", 0) + (
            remove_staged(sstore, write_id)
        )
        if session.leased:  # every shard task is done: an upload still open was abandoned
            session.cleaned["multipart_uploads"] = session.cleaned.get(
                "multipart_uploads", 0
            ) + len(abort_multipart_uploads(sstore, session.keys))
        return report

    if not compute:

        def finish_all(report: WriteReport) -> Any:
            return session.finish(finish(report))

        return run_staged(writer, data, compute=False, finish=finish_all)
    return finish(run_staged(writer, data, compute=True, progress=progress))


def _same_metadata(probe: Any, zstore: Any, path: str | None) -> bool:
    """True when the stored array's metadata equals the one this write would create."""
    from zarr.core.buffer import default_buffer_prototype

    stored = zarr.open_array(zstore, path=path or "", mode="r", zarr_format=3).metadata

    def doc(meta: Any) -> bytes:  # the JSON document: NaN fill values compare equal
        return bytes(meta.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes())

    return doc(stored) == doc(probe.metadata)


def open_array(
    store: Any,
    *,
    path: str | None = None,
    chunks: Any = None,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_indexes: bool = False,
) -> Any:
    """A lazy dask array over a sharded Zarr v3 array; chunks default to the shard shape.

    Reads of part of a shard fetch its index, then only the inner chunks needed. On local files
    validated indexes are cached (checked against the file's identity, so rewrites are seen);
    on other stores ``cache_indexes=True`` caches them too, for arrays not rewritten while open.
    """
    import dask.array as da

    reader = open_reader(
        store,
        path=path,
        threads=threads,
        storage_options=storage_options,
        cache_indexes=cache_indexes,
    )
    lay = reader.info.layout
    if chunks is None:
        chunks = lay.shard_shape
    name = f"shardwise-read-{_token(reader)}"
    return da.from_array(
        reader,
        chunks=chunks,
        name=name,
        lock=False,
        asarray=False,
        fancy=False,
        meta=np.empty((0,) * lay.ndim, dtype=reader.dtype),
    )


def open_reader(
    store: Any,
    *,
    path: str | None = None,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_indexes: bool = False,
) -> ShardReader:
    zstore = resolve_store(store, mode="r", storage_options=storage_options)
    info = open_info(zstore, path)
    return ShardReader(
        info=info,
        store=ShardStore(zstore, path or ""),
        threads=threads,
        cache_indexes=cache_indexes,
    )


def _token(reader: ShardReader) -> str:
    import uuid

    return uuid.uuid4().hex
