"""The public verbs for arrays: write_array and open_array."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import zarr
from zarr.storage import MemoryStore

from .codec.metadata import ArrayInfo, default_compressors, info_from_metadata
from .core import args
from .core.job import STRATEGIES, Strategy, WriteJob, make_job
from .core.layout import Region, RegionArg, normalize_region
from .core.plan import WritePlan
from .core.sizing import default_layout
from .engine.pipeline import ArrayWrite, Pipeline
from .engine.read import ShardReader
from .engine.write import Mode, WriteOptions, WriteReport
from .errors import (
    ArgumentTypeError,
    ArgumentValueError,
    ArrayExistsError,
    ArrayNotFoundError,
    NotAGroupError,
    NotAnArrayError,
    PlanError,
    ShardwiseError,
    UnsupportedCodecError,
)
from .storage.conditional import versions
from .storage.retry import retry_transient
from .storage.store import ShardStore, describe, resolve_store

_MODES = ("w", "w-", "a", "r+")


def open_info(store: Any, path: str | None = None) -> ArrayInfo:
    """Read and translate the metadata of the array at ``path`` in a zarr ``store``."""
    meta = open_zarr_array(store, path).metadata
    try:
        return info_from_metadata(meta)
    except UnsupportedCodecError as e:
        raise UnsupportedCodecError(f"{describe(store, path)}: {e}") from None


def open_zarr_array(store: Any, path: str | None = None) -> Any:
    """zarr-python's array at ``path`` (Zarr v3), or a shardwise error saying what is there
    instead: :class:`NotAnArrayError` for a group (listing its arrays),
    :class:`UnsupportedCodecError` for a Zarr v2 array, :class:`ArrayNotFoundError` for nothing."""
    try:
        with node_errors(store, path, "array"):
            return zarr.open_array(store, path=path or "", mode="r", zarr_format=3)
    except ArrayNotFoundError:  # maybe a Zarr v2 node, which a format-3 open does not see
        kind = _v2_node(store, path)
        if kind is None:
            raise
    raise UnsupportedCodecError(_v2_message(store, path, kind))


def open_node(store: Any, path: str | None = None) -> Any:
    """zarr-python's array or group at ``path`` (Zarr v2 or v3); nothing there is an
    :class:`ArrayNotFoundError` naming the store and path, not zarr's own error."""
    with node_errors(store, path, "node"):
        return zarr.open(store, path=path or "", mode="r")


@contextmanager
def node_errors(store: Any, path: str | None, want: str) -> Iterator[None]:
    """zarr's errors for a missing node or a node of the other kind, raised inside, as shardwise
    errors naming the store and path (zarr's own name the internal StorePath): nothing there is
    :class:`ArrayNotFoundError` (a ``FileNotFoundError``), a group where ``want`` is "array" is
    :class:`NotAnArrayError` listing its arrays, an array where ``want`` is "group" is
    :class:`NotAGroupError` (both ``ValueError``)."""
    from zarr.errors import (
        ContainsArrayError,
        ContainsGroupError,
        NodeTypeValidationError,
    )

    try:
        yield
    except FileNotFoundError as e:  # zarr's NodeNotFoundError, or a missing local root
        if isinstance(e, ArrayNotFoundError):
            raise
        noun = "zarr array or group" if want == "node" else want
        raise ArrayNotFoundError(f"no {noun} at {describe(store, path, 'path')}") from None
    except ContainsArrayError:
        raise _not_a_group(store, path) from None
    except (ContainsGroupError, NodeTypeValidationError):
        # zarr raises NodeTypeValidationError for metadata of the other kind either way round
        raise (
            _not_a_group(store, path) if want == "group" else _not_an_array(store, path)
        ) from None


def _not_a_group(store: Any, path: str | None) -> NotAGroupError:
    return NotAGroupError(
        f"{describe(store, path, 'path')} is an array, not a group: pass the path of the group "
        "that holds it, or open it as an array (shardwise.open_array)"
    )


def _not_an_array(store: Any, path: str | None) -> NotAnArrayError:
    from .durability.verify import _group_arrays

    arrays = _group_arrays(store, path) or []
    listed = ", ".join(repr(a) for a in arrays[:20]) + (" ..." if len(arrays) > 20 else "")
    return NotAnArrayError(
        f"{describe(store, path, 'group')} is a group, not an array: "
        + (
            f"pass path= (CLI: --path) with one of its arrays: {listed}"
            if arrays
            else "it has no arrays"
        ),
        arrays,
    )


def _array_above(store: Any, path: str | None) -> str | None:
    """The path of an array (Zarr v2 or v3) that ``path`` would lie inside, else None."""
    parts = (path or "").strip("/").split("/")[:-1]
    for i in range(len(parts) + 1) if path and path.strip("/") else ():
        try:
            node = zarr.open(store, path="/".join(parts[:i]), mode="r")
        except (FileNotFoundError, ValueError):  # nothing there, or not zarr metadata
            continue
        if isinstance(node, zarr.Array):
            return "/".join(parts[:i])
    return None


def _v2_node(store: Any, path: str | None) -> str | None:
    """ "array" or "group" when a Zarr v2 node is at ``path``, else None."""
    try:
        node = zarr.open(store, path=path or "", mode="r", zarr_format=2)
    except FileNotFoundError:  # zarr's NodeNotFoundError is one
        return None
    return "array" if isinstance(node, zarr.Array) else "group"


def _v2_message(store: Any, path: str | None, kind: str) -> str:
    return (
        f"{describe(store, path, kind)} is a Zarr v2 {kind}: shardwise reads and writes Zarr v3 "
        "sharded arrays; read it with zarr-python (zarr.open_array, dask.array.from_zarr) or "
        "convert it to sharded v3 with `shardwise convert SRC DST` (Python: shardwise.convert)"
    )


def _exists(store: Any, path: str | None) -> bool:
    above = _array_above(store, path)
    if above is not None:  # zarr would refuse only after the write's marker is stored
        raise PlanError(
            f"{describe(store, above)} holds no other nodes, so nothing can be written at "
            f"{describe(store, path, 'path')}: pick a path that is not inside an array"
        )
    try:
        open_zarr_array(store, path)
    except ArrayNotFoundError:
        return False
    except UnsupportedCodecError as e:  # a Zarr v2 node
        raise PlanError(f"{e}; mode='w' replaces it") from None
    except NotAnArrayError as e:
        raise PlanError(
            f"{describe(store, path, 'path')} is a group, not an array: pass path= to write "
            "an array inside it, or mode='w' to replace the group"
        ) from e
    return True


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
    byte written anywhere. What zarr refuses becomes an :class:`ArgumentTypeError` /
    :class:`ArgumentValueError` naming the keyword at fault, found by building again without
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
    kind = ArgumentTypeError if isinstance(error, TypeError) else ArgumentValueError
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

    ``chunks`` is the inner chunk shape and ``shards`` the shard shape, as in
    ``zarr.create_array``; the dask chunking of ``data`` may be anything. Left out, they follow
    the rule of :func:`shardwise.to_zarr`: inner chunks of about 1 MiB in shards of up to
    64 MiB; default inner chunks (``chunks="auto"``) always divide the shards. Every non-empty shard
    is written by exactly one task with one atomic store ``set``; shards whose values all equal
    the fill value are not stored (and removed if they were). ``mode``: ``"w-"`` create (fail if
    it exists), ``"w"`` create or replace, ``"a"`` write into an existing array (create when
    missing), ``"r+"`` write into an existing array. ``region`` places ``data`` inside an existing
    array: a slice (step 1) per dimension, or one ``Ellipsis`` for the dimensions not given
    (``region=(slice(a, b), ...)``); shards it covers in part are merged with what is stored.
    ``threads`` caps the threads that encode inner chunks (default: the cores, or the dask
    worker's threads).
    ``fsync=True`` makes each shard durable (file and directory fsync) on local filesystems.
    ``compressors="auto"`` (the default) is zstd with its frame checksum, so a damaged inner chunk
    raises :class:`CorruptShardError` on read; pass your own (e.g. ``ZstdCodec(level=0)``, or
    None) to store inner chunks without it.

    ``resume=True`` continues an interrupted write of the same data and region: shards it already
    stored (and recorded) are skipped, temp files and abandoned multipart uploads removed. A
    write that creates or replaces the array holds its exclusive lease (``lease``, default: on
    when ``compute=True``): another writer is refused with :class:`LeaseHeldError` before it
    writes anything. Writes into an existing array (``region``, mode ``"a"``/``"r+"``) run side
    by side from any number of processes: each shard they share is read, merged and committed
    only if no other writer replaced it meanwhile (else merged again), on local and shared
    filesystems, S3 (obstore, s3fs), GCS and Azure (obstore) and in memory; on other stores they
    take the exclusive lease. ``break_lease=True`` takes over the lease of a writer known to be
    gone.

    ``strategy``: ``"direct"`` encodes each shard in one task from its raw data (the source is
    rechunked to the shard pieces; a task holds about 3x one shard); ``"staged"`` encodes the inner
    chunks where the dask blocks are and streams each shard from the encoded pieces (a task holds
    one block plus a fixed buffer, whatever the shard size); ``"auto"`` (default) is direct when
    the dask chunks already are the shard pieces and fit ``memory_limit``, else staged.
    ``memory_limit``: bytes one task may hold, an int or a string as dask takes it (``"256MiB"``,
    ``"1.5GB"``; default: the dask worker's memory limit per
    thread, else half the available memory per core); a job that would not fit is refused.

    ``data`` may be a numpy or dask array or an ``xarray.DataArray`` (its ``.data`` is written).
    datetime64/timedelta64 data is stored as zarr's ``numpy.datetime64``/``numpy.timedelta64``
    types, strings (numpy ``StringDType``, or object arrays of Python ``str`` with ``dtype=str``
    or no dtype) as zarr's variable-length UTF-8 ``string`` type, as zarr-python stores them.

    Returns a :class:`WriteReport`, or with ``compute=False`` a dask ``Delayed`` that computes it,
    or with ``dry_run=True`` the :class:`WriteJob` without writing anything (see
    :func:`plan_write`). Every check runs before the first metadata or data byte is written
    (the values of a dask object array are checked to be strings as each shard is written).
    """
    # every keyword is checked before the store is looked at
    if type(zarr_format) is not int or zarr_format != 3:
        raise ArgumentValueError(
            f"zarr_format must be 3 (shardwise writes Zarr format 3 only), got {zarr_format!r}"
        )
    args.choice("mode", mode, _MODES)
    args.choice("strategy", strategy, STRATEGIES)
    threads = args.thread_count("threads", threads)
    memory_limit = args.optional_byte_size("memory_limit", memory_limit)
    args.flags(
        write_empty_chunks=write_empty_chunks,
        fsync=fsync,
        compute=compute,
        progress=progress,
        resume=resume,
        break_lease=break_lease,
        dry_run=dry_run,
    )
    args.optional_flags(lease=lease)
    args.optional_str("path", path)
    args.mapping("storage_options", storage_options)
    args.region("region", region)
    data = _source(data)
    if dtype is None and data.dtype == object:
        dtype = _object_dtype(data)
    shape = tuple(int(n) for n in data.shape)
    zstore = resolve_store(store, mode="w", storage_options=storage_options)
    exists = (mode != "w" or resume) and retry_transient(lambda: _exists(zstore, path))
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

    create = not exists
    if create or (resume and mode in ("w", "w-") and region is None):
        if region is not None:
            raise PlanError("region= needs an existing array (mode='r+' or 'a')")
        given = dict(
            fill_value=fill_value,
            compressors=default_compressors() if _is_auto(compressors) else compressors,
            filters=filters,
            serializer=serializer,
            dimension_names=dimension_names,
            attributes=attributes,
            chunk_key_encoding=chunk_key_encoding,
        )
        # build and translate the metadata in memory first: bad arguments fail before any I/O
        kwargs, probe = _probe(shape, data.dtype if dtype is None else dtype, chunks, shards, given)
        # translate the metadata as stored (JSON), which is what readers will see: e.g. a NaN
        # fill value with a payload is stored as plain "NaN"
        info = open_info(probe.store)
        if exists and not _same_metadata(probe, zstore, path):
            if mode == "w-":
                raise ArrayExistsError(
                    f"{describe(zstore, path)} exists with other metadata: nothing to resume"
                )
            create = True
    else:
        info = retry_transient(lambda: open_info(zstore, path))

    target: Region = normalize_region(
        region if region is not None else tuple(slice(None) for _ in info.layout.shape),
        info.layout.shape,
    )
    want = tuple(s.stop - s.start for s in target)
    if want != shape:
        raise PlanError(f"data of shape {shape} does not fit the region {want} of the array")
    data = _cast_source(data, info.dtype)

    sstore = ShardStore(zstore, path or "", fsync=fsync)
    plan = WritePlan(info.layout, target)
    # into an existing array, side by side with other such writes: shards they share are
    # committed conditionally (on stores that can; the others keep one writer per array)
    shared = not create and mode in ("a", "r+") and versions(sstore) is not None
    job = make_job(
        plan,
        _dask_chunks(data),
        np.dtype(info.dtype).itemsize,
        strategy=strategy,
        memory_limit=memory_limit,
        shared=shared,
    )
    job.validate()
    if dry_run:
        return job
    write = ArrayWrite(
        store=sstore,
        info=info,
        plan=plan,
        strategy=job.strategy,
        source=data,
        options=WriteOptions(write_empty_chunks=write_empty_chunks, threads=threads),
        blocks=job.blocks,
        # a staged merge commits unconditionally: then this write keeps the others out
        shared=shared and not job.merges_unconditionally,
        # our own clear instead of zarr's overwrite, which would delete the lease too
        clear=("all" if mode == "w" else "journal") if create else "none",
        create=(lambda: _create_in_store(zstore, path, kwargs, probe)) if create else None,
        resume=resume,
        # a finished write is adopted too (its shards skipped, as their records still match)
        # unless mode "w" asks to replace the array
        adopt_done=mode != "w",
        must_adopt=resume and mode == "w-" and exists and not create,
        copy_source=not compute,
    )
    with Pipeline(
        [write], lease=compute if lease is None else lease, break_lease=break_lease
    ) as pipe:
        pipe.start()
        return pipe.run(pipe.parts(), compute=compute, progress=progress)


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
    raise PlanError(
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
            if not (tried and _same_metadata(probe, zstore, path)):
                raise
        finally:
            tried = True

    retry_transient(create)


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

    Its ``compute()`` on a local scheduler reads straight into one output, as
    :func:`read_array` does; on other schedulers the blocks are assembled into one output on the
    pool (see :mod:`shardwise.engine.assemble`). Slices and reductions of it run as dask graphs.

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
    chunks = _read_chunks(chunks, lay.shape, reader.dtype)
    name = f"shardwise-read-{_token(reader)}"
    arr = da.from_array(
        reader,
        chunks=chunks,
        name=name,
        lock=False,
        asarray=False,
        fancy=False,
        meta=np.empty((0,) * lay.ndim, dtype=reader.dtype),
    )
    from .engine.assemble import as_shard_array

    return as_shard_array(arr, reader)


def _read_chunks(chunks: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    """``chunks=`` of :func:`open_array` as dask normalizes them (positive sizes), or a clear
    error naming the keyword."""
    from dask.array.core import normalize_chunks

    accepted = "None (the shards), an int, a tuple of ints per dimension, 'auto' or a byte size"
    try:
        out = normalize_chunks(chunks, shape, dtype=dtype)
    except (TypeError, ValueError) as e:
        kind = ArgumentTypeError if isinstance(e, TypeError) else ArgumentValueError
        raise kind(f"chunks must be {accepted}, got {chunks!r} ({e})") from None
    if any(c < 1 for dim, n in zip(out, shape, strict=True) if n for c in dim):
        raise ArgumentValueError(f"chunks must be {accepted} with positive sizes, got {chunks!r}")
    return out


def open_reader(
    store: Any,
    *,
    path: str | None = None,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_indexes: bool = False,
) -> ShardReader:
    """The reader of the array at ``path``; the keywords of every read verb checked first."""
    args.optional_str("path", path)
    threads = args.thread_count("threads", threads)
    args.mapping("storage_options", storage_options)
    args.flags(cache_indexes=cache_indexes)
    zstore = resolve_store(store, mode="r", storage_options=storage_options)
    info = open_info(zstore, path)
    return ShardReader(
        info=info,
        store=ShardStore(zstore, path or ""),
        threads=threads,
        cache_indexes=cache_indexes,
    )


def _token(reader: ShardReader) -> str:
    """Dask keys of an opened array from its store, path and metadata (the same array opened
    twice shares its keys, as ``dask.array.from_zarr`` does; the data are not looked at)."""
    from dask.base import tokenize

    return tokenize(describe(reader.store.store, reader.store.path), repr(reader.info))
