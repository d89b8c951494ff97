"""The public verbs for arrays: write_array and open_array."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.storage import MemoryStore

from .codec.metadata import ArrayInfo, default_compressors
from .core import args
from .core.job import STRATEGIES, Strategy, WritePlan, make_job
from .core.layout import Region, RegionArg, normalize_region
from .core.plan import ShardPlan
from .core.sizing import default_layout
from .durability.pipeline import ArrayWrite, Pipeline
from .engine.read import ShardReader, open_reader
from .engine.report import WriteReport
from .engine.write import Mode, WriteSettings
from .errors import (
    ArrayExistsError,
    ArrayNotFoundError,
    InvalidTypeError,
    InvalidValueError,
    PlanError,
    ShardwiseError,
)
from .storage.conditional import versions
from .storage.nodes import array_exists, open_info, same_metadata
from .storage.retry import retry_transient
from .storage.store import ShardStore, describe, resolve_store

_MODES = ("w", "w-", "a", "r+")


def _create_kwargs(
    shape: tuple[int, ...], dtype: Any, chunks: Any, shards: Any, kwargs: dict[str, Any]
) -> dict[str, Any]:
    chunks, shards = _layout(shape, dtype, chunks, shards)
    out = dict(shape=shape, dtype=dtype, chunks=chunks, shards=shards, zarr_format=3)
    # None means "no codecs" for compressors/filters (as in zarr), "default" for the rest
    keep_none = ("compressors", "filters")
    out.update({k: v for k, v in kwargs.items() if v is not None or k in keep_none})
    return out


def _probe(
    shape: tuple[int, ...], dtype: Any, chunks: Any, shards: Any, given: dict[str, Any]
) -> tuple[dict[str, Any], Any]:
    """The keywords of ``zarr.create_array`` and the array they create in memory."""
    kwargs = _create_kwargs(shape, dtype, chunks, shards, given)
    return kwargs, create_in_memory(kwargs)


# what a keyword of zarr.create_array falls back to when it is left out
_ZARR_DEFAULTS: dict[str, Any] = {"filters": "auto", "serializer": "auto"}
# the keywords a refusal may be blamed on; the layout (shape, chunks, shards) keeps zarr's words
_BLAMED = (
    "fill_value",
    "compressors",
    "filters",
    "serializer",
    "dimension_names",
    "attributes",
    "chunk_key_encoding",
)


def create_in_memory(kwargs: dict[str, Any]) -> Any:
    """``zarr.create_array(MemoryStore(), **kwargs)``: the metadata built and checked without a
    byte written anywhere. What zarr refuses becomes an :class:`InvalidTypeError` /
    :class:`InvalidValueError` naming the keyword at fault, found by building again without
    each one (only on the error path); ``dtype`` is blamed last, a fill value wrong for the
    dtype being the fill value's fault."""
    try:
        return zarr.create_array(MemoryStore(), **kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ShardwiseError):
            raise
        error = e

    def builds(**changed: Any) -> bool:
        try:
            zarr.create_array(MemoryStore(), **{**kwargs, **changed})
        except (TypeError, ValueError):
            return False
        return True

    def default(name: str) -> Any:
        return default_compressors() if name == "compressors" else _ZARR_DEFAULTS.get(name)

    culprit = next((n for n in _BLAMED if n in kwargs and builds(**{n: default(n)})), None)
    if culprit is None and builds(dtype=np.float64, fill_value=None):
        culprit = "dtype"
    if culprit is None:  # the layout, or a combination: zarr's own words
        raise error
    kind = InvalidTypeError if isinstance(error, TypeError) else InvalidValueError
    raise kind(
        f"{culprit}={kwargs[culprit]!r} is not accepted (as zarr.create_array takes it): {error}"
    ) from None


def _layout(shape: tuple[int, ...], dtype: Any, chunks: Any, shards: Any) -> tuple[Any, Any]:
    """Inner chunks and shards for a new array: a missing shard shape or ``chunks="auto"`` is
    completed by the same rule as :func:`shardwise.to_zarr` (inner chunks always divide the
    shards); anything else goes to zarr as given."""
    if isinstance(shards, dict):  # zarr's {"shape": ..., "index_location": ...}
        shape_of = shards.get("shape")
        if shape_of is None or chunks not in ("auto", None):
            return chunks, shards
        inner, _ = _layout(shape, dtype, chunks, tuple(shape_of))
        return inner, shards
    given_chunks = _shape_or_none(chunks, len(shape))
    given_shards = _shape_or_none(shards, len(shape))
    if (chunks not in ("auto", None) and given_chunks is None) or (
        shards is not None and given_shards is None
    ):
        return chunks, shards  # other forms: zarr validates them
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # a zarr data type object: its numpy form
        itemsize = getattr(dtype, "to_native_dtype", lambda: np.dtype("V8"))().itemsize
    return default_layout(shape, itemsize, given_chunks, given_shards)


def _shape_or_none(value: Any, ndim: int) -> tuple[int, ...] | None:
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        return (int(value),) * ndim
    if isinstance(value, tuple | list) and all(
        isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value
    ):
        return tuple(int(v) for v in value)
    return None


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


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
    region: RegionArg | None = None,
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
    memory_limit: int | str | None = None,
    dry_run: bool = False,
) -> WriteReport | Any:
    """Write a numpy or dask array into a sharded Zarr v3 array, one task per shard.

    Every non-empty shard is written by exactly one task with one atomic store ``set``, whatever
    the dask chunking of ``data``; shards whose values all equal the fill value are not stored
    (and removed if they were). Every check runs before the first metadata or data byte is
    written (the values of a dask object array are checked to be strings as each shard is
    written).

    Parameters
    ----------
    data : numpy.ndarray, dask.array.Array or xarray.DataArray
        The array to write; of a ``DataArray``, its ``.data`` is written. datetime64/timedelta64
        data is stored as zarr's ``numpy.datetime64``/``numpy.timedelta64`` types, strings (numpy
        ``StringDType``, or object arrays of Python ``str`` with ``dtype=str`` or no dtype) as
        zarr's variable-length UTF-8 ``string`` type, as zarr-python stores them.
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store`` (``LocalStore``, ``MemoryStore``, ``ObjectStore``, ``FsspecStore``), a
        local path or a URL.
    path : str, optional
        The array's path inside ``store`` (default: its root).
    chunks : tuple of int or "auto", default "auto"
        The inner chunk shape, as in ``zarr.create_array``. ``"auto"`` follows the rule of
        :func:`shardwise.to_zarr` (inner chunks of about 1 MiB); default inner chunks always
        divide the shards.
    shards : tuple of int, optional
        The shard shape, as in ``zarr.create_array``. Left out, the rule of
        :func:`shardwise.to_zarr`: shards of up to 64 MiB. Given with ``chunks``, it is rounded
        up to whole chunks (``chunks=(32, 32), shards=(100, 64)`` stores shards of
        ``(128, 64)``).
    dtype : numpy.dtype or str, optional
        The array's data type, as in ``zarr.create_array`` (default: that of ``data``).
    fill_value : scalar, optional
        As in ``zarr.create_array``.
    compressors : zarr codec, list of codecs, "auto" or None, default "auto"
        ``"auto"`` is zstd with its frame checksum, so a damaged inner chunk raises
        :class:`CorruptShardError` on read; pass your own (e.g. ``ZstdCodec(level=0)``, or None)
        to store inner chunks without it.
    filters, serializer : zarr codecs or "auto", default "auto"
        As in ``zarr.create_array``.
    dimension_names : sequence of str, optional
        As in ``zarr.create_array``.
    attributes : dict, optional
        As in ``zarr.create_array``.
    chunk_key_encoding : dict or zarr chunk key encoding, optional
        As in ``zarr.create_array``.
    zarr_format : int, default 3
        Must be 3: shardwise writes Zarr format 3 only.
    mode : {"w-", "w", "a", "r+"}, default "w-"
        ``"w-"`` create (fail if it exists), ``"w"`` create or replace, ``"a"`` write into an
        existing array (create when missing), ``"r+"`` write into an existing array.
    region : tuple of slice, optional
        Places ``data`` inside an existing array: a slice (step 1) per dimension, or one
        ``Ellipsis`` for the dimensions not given (``region=(slice(a, b), ...)``); shards it
        covers in part are merged with what is stored, by their one owning task.
    write_empty_chunks : bool, default False
        Store inner chunks equal to the fill value too; by default they are not stored.
    threads : int, optional
        Caps the threads that encode inner chunks (default: the cores, or the dask worker's
        threads).
    fsync : bool, default False
        Make each shard durable (file and directory fsync) on local filesystems.
    storage_options : dict, optional
        fsspec options, for a ``store`` given as a URL.
    compute : bool, default True
        False returns a dask ``Delayed`` that runs the write and computes the report.
    progress : bool, default False
        Show a progress bar over shards done and bytes moved, on the local schedulers and on a
        ``dask.distributed`` client.
    resume : bool, default False
        Continue an interrupted write of the same data and region: shards it already stored
        (and recorded) are skipped, temp files and abandoned multipart uploads removed.
    lease : bool, optional
        Hold the array's lease (default: on when ``compute=True``). A write that creates or
        replaces the array holds its exclusive lease: another writer is refused with
        :class:`LeaseHeldError` before it writes anything. Writes into an existing array
        (``region``, mode ``"a"``/``"r+"``) run side by side from any number of processes: each
        shard they share is read, merged and committed only if no other writer replaced it
        meanwhile (else merged again), on local and shared filesystems, S3 (obstore, s3fs), GCS
        and Azure (obstore) and in memory; on other stores they take the exclusive lease.
    break_lease : bool, default False
        Take over the lease of a writer known to be gone.
    strategy : {"auto", "direct", "staged"}, default "auto"
        ``"direct"`` encodes each shard in one task from its raw data (the source is rechunked to
        the shard pieces; a task holds about 3x one shard); ``"staged"`` encodes the inner chunks
        where the dask blocks are and streams each shard from the encoded pieces (a task holds
        one block plus a fixed buffer, whatever the shard size); ``"auto"`` is direct when the
        dask chunks already are the shard pieces and fit ``memory_limit``, else staged.
    memory_limit : int or str, optional
        Bytes one task may hold, an int or a string as dask takes it (``"256MiB"``,
        ``"1.5GB"``; default: the dask worker's memory limit per thread, else half the available
        memory per core); a job that would not fit is refused.
    dry_run : bool, default False
        Return the :class:`WritePlan` without writing anything (see :func:`plan_write`).

    Returns
    -------
    WriteReport or dask.delayed.Delayed or WritePlan
        What the write did; with ``compute=False`` a dask ``Delayed`` that computes it; with
        ``dry_run=True`` the job that would run.

    Raises
    ------
    InvalidTypeError
        A keyword of the wrong type (a ``TypeError``); the message names the keyword, the value
        and what is accepted.
    InvalidValueError
        A keyword value outside what the keyword accepts (a ``ValueError``), e.g. a
        ``zarr_format`` other than 3, or ``region`` without an existing array.
    ArrayExistsError
        ``mode="w-"`` and an array is already there (with ``resume=True``: one with other
        metadata, so nothing to resume).
    ArrayNotFoundError
        ``mode="r+"`` and no array there.
    PlanError
        A write that cannot be placed: data of another shape than the region, data that
        cannot be cast to the array's dtype without loss, a dask array of unknown chunk sizes,
        a task that would not fit ``memory_limit``, or more than 4,194,304 shard tasks.
    LeaseHeldError
        Another writer holds the array's lease.
    ShardConflictError
        A shard shared with other writers kept changing between this write's read and its
        commit.
    """
    # 1. every keyword is checked before the store is looked at
    flags = dict(
        write_empty_chunks=write_empty_chunks,
        fsync=fsync,
        compute=compute,
        progress=progress,
        resume=resume,
        break_lease=break_lease,
        dry_run=dry_run,
    )
    threads, memory_limit = _check_write_keywords(
        zarr_format,
        mode,
        strategy,
        threads,
        memory_limit,
        flags,
        lease,
        path,
        storage_options,
        region,
    )
    # 2. the data, then what is at the path (refusals of "w-" and "r+")
    data = _source(data)
    if dtype is None and data.dtype == object:
        dtype = _object_dtype(data)
    shape = tuple(int(n) for n in data.shape)
    zstore = resolve_store(store, mode="w", storage_options=storage_options)
    exists = _check_exists(zstore, path, mode, resume)
    # 3. the array's metadata: a new one built and checked in memory, else the stored one
    layout = (shape, data.dtype if dtype is None else dtype, chunks, shards)
    given = dict(
        fill_value=fill_value,
        compressors=default_compressors() if _is_auto(compressors) else compressors,
        filters=filters,
        serializer=serializer,
        dimension_names=dimension_names,
        attributes=attributes,
        chunk_key_encoding=chunk_key_encoding,
    )
    meta = _target_metadata(zstore, path, exists, mode, resume, region, layout, given)
    # 4. where the data goes, and the job that puts it there (validated: dry_run stops here)
    target, data = _placed(data, meta.info, region, shape)
    sstore = ShardStore(zstore, path or "", fsync=fsync)
    job, shared = _validated_job(sstore, meta, target, data, mode, strategy, memory_limit)
    if dry_run:
        return job
    # 5. the write: lease, clear, metadata, data, done (the pipeline's order)
    options = WriteSettings(write_empty_chunks=write_empty_chunks, threads=threads)
    write = _array_write(sstore, meta, job, data, options, shared, mode, resume, exists, compute)
    with Pipeline(
        [write], lease=compute if lease is None else lease, break_lease=break_lease
    ) as pipe:
        pipe.start()
        return pipe.run(pipe.parts(), compute=compute, progress=progress)


def _check_write_keywords(
    zarr_format: Any,
    mode: Any,
    strategy: Any,
    threads: Any,
    memory_limit: Any,
    flags: dict[str, Any],
    lease: Any,
    path: Any,
    storage_options: Any,
    region: Any,
) -> tuple[int | None, int | None]:
    """Refuse a keyword of :func:`write_array` of the wrong type or value (in the order of its
    signature, so the first one wrong is named); returns ``threads`` and ``memory_limit``
    checked."""
    if type(zarr_format) is not int or zarr_format != 3:
        raise InvalidValueError(
            f"zarr_format must be 3 (shardwise writes Zarr format 3 only), got {zarr_format!r}"
        )
    args.choice("mode", mode, _MODES)
    args.choice("strategy", strategy, STRATEGIES)
    checked_threads = args.thread_count("threads", threads)
    checked_limit = args.optional_byte_size("memory_limit", memory_limit)
    args.flags(**flags)
    args.optional_flags(lease=lease)
    args.optional_str("path", path)
    args.mapping("storage_options", storage_options)
    args.region("region", region)
    return checked_threads, checked_limit


def _check_exists(zstore: Any, path: str | None, mode: Mode, resume: bool) -> bool:
    """Whether an array is at ``path`` (looked up only where the answer matters): mode "w-"
    refuses one (unless resuming), "r+" refuses its absence."""
    exists = (mode != "w" or resume) and retry_transient(lambda: array_exists(zstore, path))
    if mode == "w-" and exists and not resume:
        raise ArrayExistsError(
            f"{describe(zstore, path)} already exists (use mode='w' to replace it, 'a' or 'r+' "
            "to write into it)"
        )
    if mode == "r+" and not exists:
        raise ArrayNotFoundError(
            f"mode='r+' writes into an existing array, and there is none at "
            f"{describe(zstore, path, 'path')} (use mode='a' or 'w-' to create it)"
        )
    return bool(exists)


@dataclass(frozen=True)
class _Target:
    """The metadata of the array a write goes into; ``create`` stores it when this write
    creates (or replaces) the array, else None."""

    info: ArrayInfo
    create: Callable[[], None] | None


def _target_metadata(
    zstore: Any,
    path: str | None,
    exists: bool,
    mode: Mode,
    resume: bool,
    region: RegionArg | None,
    layout: tuple[tuple[int, ...], Any, Any, Any],
    given: dict[str, Any],
) -> _Target:
    """The stored metadata of an existing array, else (and when a create or replace is resumed)
    the new array's, built and checked in memory before any I/O. ``layout``: shape, dtype,
    chunks and shards of a new array; ``given``: its other ``zarr.create_array`` keywords."""
    if exists and not (resume and mode in ("w", "w-") and region is None):
        return _Target(retry_transient(lambda: open_info(zstore, path)), None)
    if region is not None:
        raise InvalidValueError("region= needs an existing array (mode='r+' or 'a')")
    kwargs, probe = _probe(*layout, given)
    # translate the metadata as stored (JSON), which is what readers will see: e.g. a NaN
    # fill value with a payload is stored as plain "NaN"
    info = open_info(probe.store)
    if exists and same_metadata(probe, zstore, path):
        return _Target(info, None)  # a resumed create: the array is there already
    if exists and mode == "w-":
        raise ArrayExistsError(
            f"{describe(zstore, path)} exists with other metadata: nothing to resume"
        )
    return _Target(info, lambda: _create_in_store(zstore, path, kwargs, probe))


def _placed(
    data: Any, info: ArrayInfo, region: RegionArg | None, shape: tuple[int, ...]
) -> tuple[Region, Any]:
    """The region of the array that ``data`` fills (all of it without ``region``), and the data
    in a form the encoder takes for the array's dtype; a PlanError when either does not fit."""
    target: Region = normalize_region(
        region if region is not None else tuple(slice(None) for _ in info.layout.shape),
        info.layout.shape,
    )
    want = tuple(s.stop - s.start for s in target)
    if want != shape:
        raise PlanError(f"data of shape {shape} does not fit the region {want} of the array")
    return target, _cast_source(data, info.dtype)


def _validated_job(
    sstore: ShardStore,
    meta: _Target,
    target: Region,
    data: Any,
    mode: Mode,
    strategy: Strategy,
    memory_limit: int | None,
) -> tuple[WritePlan, bool]:
    """The validated job that writes ``data`` into ``target``, and whether the write is shared:
    into an existing array, side by side with other such writes, whose shards they share are
    committed conditionally (on stores that can; the others keep one writer per array)."""
    shared = meta.create is None and mode in ("a", "r+") and versions(sstore) is not None
    job = make_job(
        ShardPlan(meta.info.layout, target),
        _dask_chunks(data),
        np.dtype(meta.info.dtype).itemsize,
        strategy=strategy,
        memory_limit=memory_limit,
        shared=shared,
    )
    job.validate()
    return job, shared


def _array_write(
    sstore: ShardStore,
    meta: _Target,
    job: WritePlan,
    data: Any,
    options: WriteSettings,
    shared: bool,
    mode: Mode,
    resume: bool,
    exists: bool,
    compute: bool,
) -> ArrayWrite:
    """The pipeline's write of ``data`` by ``job`` into the array of ``meta`` at ``sstore``."""
    create = meta.create is not None
    return ArrayWrite(
        store=sstore,
        info=meta.info,
        plan=job.plan,
        strategy=job.strategy,
        source=data,
        options=options,
        blocks=job.blocks,
        # a staged merge commits unconditionally: then this write keeps the others out
        shared=shared and not job.merges_unconditionally,
        # our own clear instead of zarr's overwrite, which would delete the lease too
        clear=("all" if mode == "w" else "journal") if create else "none",
        create=meta.create,
        resume=resume,
        # a finished write is adopted too (its shards skipped, as their records still match)
        # unless mode "w" asks to replace the array
        adopt_done=mode != "w",
        must_adopt=resume and mode == "w-" and exists and not create,
        copy_source=not compute,
    )


def plan_write(data: Any, store: Any, **kwargs: Any) -> WritePlan:
    """The :class:`WritePlan` that :func:`write_array` would run with these arguments.

    Nothing is written (not even metadata); the job is validated. Print it to see shards, tasks,
    strategy, estimated peak memory per task and bytes to move.

    Parameters
    ----------
    data : numpy.ndarray, dask.array.Array or xarray.DataArray
        The array :func:`write_array` would write.
    store : zarr.abc.store.Store, str or os.PathLike
        Where it would write: a zarr ``Store``, a local path or a URL.
    **kwargs
        The keywords of :func:`write_array` (all but ``dry_run``), checked as it checks them.

    Returns
    -------
    WritePlan
        The job: strategy, shards, tasks, blocks, peak memory per task, bytes to move.

    Raises
    ------
    PlanError
        A job that would not fit ``memory_limit`` (the message has the figures), and every
        refusal of :func:`write_array` that comes before its first write.
    """
    job = write_array(data, store, dry_run=True, **kwargs)
    assert isinstance(job, WritePlan)
    return job


def _dask_chunks(data: Any) -> tuple[tuple[int, ...], ...] | None:
    if not _is_dask(data):
        return None
    return tuple(tuple(int(n) for n in c) for c in data.chunks)


def _source(data: Any) -> Any:
    """``data`` as a numpy or dask array (or another array zarr can read), checked for what
    cannot be written: every refusal here comes before the store is touched."""
    xr = sys.modules.get("xarray")
    if xr is not None and isinstance(data, xr.DataArray | xr.Variable):
        data = data.data  # the dask or numpy array under it
    if not hasattr(data, "shape") or not hasattr(data, "dtype"):
        data = np.asarray(data)
    refuse_unknown_chunks(data)
    return data


def refuse_unknown_chunks(data: Any, where: str = "") -> None:
    """A :class:`PlanError` for a dask array of unknown (NaN) chunk sizes, which no write can
    place: ``where`` starts the message (e.g. the variable's name)."""
    if _is_dask(data) and any(math.isnan(c) for dim in data.chunks for c in dim):
        raise PlanError(
            f"{where}the dask array has unknown chunk sizes (shape {data.shape}, e.g. after "
            "boolean indexing): call data.compute_chunk_sizes() first, or write it with known "
            "chunks"
        )


def _is_dask(data: Any) -> bool:
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(data, da.Array)


def _object_dtype(data: Any) -> Any:
    """The array dtype for object ``data`` when none is given: strings if numpy holds only str."""
    if not _is_dask(data) and all(isinstance(v, str) for v in np.asarray(data).flat):
        return str
    raise InvalidValueError(
        "data of dtype object: pass dtype= (e.g. dtype=str for Python strings, stored as zarr "
        "variable-length UTF-8 strings)"
    )


def _cast_source(data: Any, dtype: np.dtype[Any]) -> Any:
    """``data`` in a form the encoder takes for an array of ``dtype``, or a PlanError."""
    if dtype.kind == "T" and data.dtype.kind in "OUT":  # numpy StringDType: zarr's "string"
        if data.dtype.kind != "O":
            return data
        if _is_dask(data):
            return data.map_blocks(_to_strings, dtype=dtype)
        return _to_strings(np.asarray(data), dtype)
    if not np.can_cast(data.dtype, dtype, casting="same_kind"):
        raise PlanError(
            f"cannot write {data.dtype} data into a {dtype} array without loss: convert the "
            f"data first (e.g. data.astype({str(dtype)!r}))"
        )
    return data


def _to_strings(block: np.ndarray, dtype: Any = None) -> np.ndarray:
    """An object block of Python strings as numpy strings; a PlanError names a non-string."""
    for v in block.flat:
        if not isinstance(v, str):
            raise PlanError(
                f"a string array takes Python str values only, got {v!r} of type "
                f"{type(v).__name__}: convert the values first"
            )
    return block.astype(np.dtypes.StringDType() if dtype is None else dtype)


def _create_in_store(zstore: Any, path: str | None, kwargs: dict[str, Any], probe: Any) -> None:
    """Store the new array's metadata, again after a transient store failure; a try whose
    answer was lost may have stored it already, which then counts as done."""
    from zarr.errors import ContainsArrayError

    tried = False

    def create() -> None:
        nonlocal tried
        try:
            zarr.create_array(zstore, name=path or None, overwrite=False, **kwargs)
        except ContainsArrayError:
            if not (tried and same_metadata(probe, zstore, path)):
                raise
        finally:
            tried = True

    retry_transient(create)


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

    Its ``compute()`` (and ``np.asarray`` of it) on the threaded or synchronous scheduler, with
    no dask callbacks active, reads straight into one output, as :func:`read_array` does; on
    other schedulers the blocks are assembled into one output on the pool (see
    ``shardwise.engine.assemble``). Slices and reductions of it run as dask graphs.

    Reads of part of a shard fetch its index, then only the inner chunks needed.

    Parameters
    ----------
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store``, a local path or a URL.
    path : str, optional
        The array's path inside ``store`` (default: its root).
    chunks : int, tuple, "auto", byte size or None, optional
        The dask chunks, as dask normalizes them (default: the shard shape). Any other chunks
        work and read only the inner chunks they need.
    threads : int, optional
        Caps the threads that decode inner chunks (default: the shared thread pool's size).
    storage_options : dict, optional
        fsspec options, for a ``store`` given as a URL.
    cache_indexes : bool, default False
        Cache validated shard indexes on stores other than local files, for arrays not rewritten
        while open. On local files they are always cached (checked against the file's identity,
        so rewrites are seen).

    Returns
    -------
    dask.array.Array
        The lazy array, of the stored array's shape and dtype.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A keyword of the wrong type, or a value it does not accept (e.g. chunks that are not
        positive); the message names the keyword.
    ArrayNotFoundError
        No array or group at ``path``.
    NotAnArrayError
        ``path`` is a group; the message lists its arrays.
    UnsupportedCodecError
        A Zarr v2 array (``convert`` it first), or a codec chain shardwise cannot decode.
    """

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
    chunks = _read_chunks(chunks, lay.shape, reader.dtype)
    from .engine.lazy import ShardView, view_array

    return view_array(ShardView.whole(reader, _token(reader)), chunks)


def _read_chunks(chunks: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    """``chunks=`` of :func:`open_array` as dask normalizes them (positive sizes), or a clear
    error naming the keyword."""
    from dask.array.core import normalize_chunks

    accepted = "None (the shards), an int, a tuple of ints per dimension, 'auto' or a byte size"
    try:
        out = normalize_chunks(chunks, shape, dtype=dtype)
    except (TypeError, ValueError) as e:
        kind = InvalidTypeError if isinstance(e, TypeError) else InvalidValueError
        raise kind(f"chunks must be {accepted}, got {chunks!r} ({e})") from None
    if any(c < 1 for dim, n in zip(out, shape, strict=True) if n for c in dim):
        raise InvalidValueError(f"chunks must be {accepted} with positive sizes, got {chunks!r}")
    return out


def _token(reader: ShardReader) -> str:
    """Dask keys of an opened array from its store, path and metadata (the same array opened
    twice shares its keys, as ``dask.array.from_zarr`` does; the data are not looked at)."""
    from dask.base import tokenize

    return tokenize(describe(reader.store.store, reader.store.path), repr(reader.info))
