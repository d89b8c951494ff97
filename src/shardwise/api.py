"""The public verbs for arrays: write_array, plan_write and open_array (write_array is a
sequence of named steps; its checks and planning are in write/target.py, a new array's metadata in
write/create.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .engine.read import ShardReader, open_reader
from .errors import InvalidTypeError, InvalidValueError
from .storage.icechunk import writes_into_session
from .storage.store import describe
from .write.create import create_in_memory as create_in_memory

if TYPE_CHECKING:
    from .core.job import Strategy, WritePlan
    from .core.layout import RegionArg
    from .engine.report import WriteReport
    from .engine.write import Mode


@writes_into_session
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
    mode: Mode | None = None,
    region: RegionArg | None = None,
    append_dim: int | str | None = None,
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
    commit: str | None = None,
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
    store : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        A zarr ``Store`` (``LocalStore``, ``MemoryStore``, ``ObjectStore``, ``FsspecStore``), a
        local path or a URL; or a writable ``icechunk.Session``: the write is one change of its
        transaction (each shard task writes into a fork of the session, the forks, checked
        disjoint, are merged into it), which the caller commits, or ``commit=`` does. No lease
        or journal is written into the repository; a write interrupted before the merge leaves
        the session uncommitted: discard its changes or run the write again.
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
        ``(128, 64)``). Or a target of :func:`shardwise.plan_shards`: a byte size
        (``"2GB"``) or axis names (``"XY"``, ``"one per time step"``). An axis given as a list
        of shard extents (``[[31, 28, 31], 181, 360]``, or ``{"time": [31, 28, 31]}`` with
        dimension names) makes a rectilinear shard grid: the extents sum to the axis length,
        inner chunks divide every extent (given ones that do not are refused).
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
    mode : {"w-", "w", "a", "r+"}, optional
        ``"w-"`` create (fail if it exists), ``"w"`` create or replace, ``"a"`` write into an
        existing array (create when missing), ``"r+"`` write into an existing array. Defaults
        to ``"w-"`` (``"a"`` with ``append_dim``, the only mode it takes).
    region : tuple of slice, optional
        Places ``data`` inside an existing array: a slice (step 1) per dimension, or one
        ``Ellipsis`` for the dimensions not given (``region=(slice(a, b), ...)``); shards it
        covers in part are merged with what is stored, by their one owning task.
    append_dim : int or str, optional
        Append ``data`` at the end of the existing array along this axis (an int, negative
        from the end; or a dimension name of the array, or of ``data`` as a ``DataArray``), as
        ``to_zarr(append_dim=...)`` appends a Dataset: every other dimension of ``data`` must
        be the array's (a :class:`PlanError` before anything is written), and the array must
        exist (:class:`ArrayNotFoundError`). Any number of processes may append to one array
        at once: each call first reserves its rows by a conditional commit of the array's
        metadata, so every append lands, at the rows its commit took (the report's ``notes``
        say which); a call that fails before its data is done gives its rows back while no
        later append reserved after them, else its rows read as the fill value and ``verify``
        reports them, advising the call that finishes them. With ``resume=True`` an append
        killed part-way is finished where its rows were reserved (or found written already),
        never appended twice.
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
        False returns a dask ``Delayed`` that runs the write and computes the report. True
        with a numpy ``data`` runs its shard tasks on this process's threads without dask (not
        imported; a ``dask.distributed`` client, a synchronous scheduler, dask callbacks or
        ``progress`` run them through dask).
    progress : bool, default False
        Show a progress bar over shards done and bytes moved, on the local schedulers and on a
        ``dask.distributed`` client.
    resume : bool, default False
        Continue an interrupted write of the same data and region: shards it already stored
        (and recorded) are skipped, temp files and abandoned multipart uploads removed.
    lease : bool, optional
        Hold the array's lease (default: on when ``compute=True`` and the store can delete: a
        lease is deleted when the write ends, so a zarr ``ZipStore``, which only appends, is
        written without one and refuses ``True`` before anything is written). A write that
        creates or replaces the array holds its exclusive lease: another writer is refused with
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
        one block plus a fixed buffer, whatever the shard size); ``"auto"`` is direct when a
        shard's direct task fits ``memory_limit`` and the dask chunks already are the shard
        pieces or the write runs on dask's threads in this process (a rechunk in memory), else
        staged (the plan's ``reason`` says why).
    memory_limit : int or str, optional
        Bytes one task may hold, an int or a string as dask takes it (``"256MiB"``,
        ``"1.5GB"``; default: the dask worker's memory limit per thread, else half the available
        memory per core); a job that would not fit is refused.
    dry_run : bool, default False
        Return the :class:`WritePlan` without writing anything (see :func:`plan_write`).
    commit : str, optional
        With an icechunk ``Session``: commit it with this message once the write is merged,
        rebased (``icechunk.ConflictDetector``) over commits made meanwhile that changed other
        chunks (the report's ``notes`` name the snapshot).

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
        ``zarr_format`` other than 3, ``region`` without an existing array, or an
        ``append_dim`` that is no axis or dimension of the array.
    ArrayExistsError
        ``mode="w-"`` and an array is already there (with ``resume=True``: one with other
        metadata, so nothing to resume).
    ArrayNotFoundError
        ``mode="r+"`` or ``append_dim`` and no array there.
    PlanError
        A write that cannot be placed: data of another shape than the region (with
        ``append_dim``: than the array in the other dimensions), data that cannot be cast to
        the array's dtype without loss, a dask array of unknown chunk sizes, a task that would
        not fit ``memory_limit``, or more than 4,194,304 shard tasks.
    LeaseHeldError
        Another writer holds the array's lease.
    ShardConflictError
        A shard shared with other writers kept changing between this write's read and its
        commit.
    TransactionError
        Into an icechunk session: two shard tasks wrote one shard (nothing merged), or the
        commit conflicts with another commit to the branch.

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> report = shardwise.write_array(np.arange(4096, dtype="u2").reshape(64, 64), store,
    ...                                chunks=(16, 16), shards=(32, 32))
    >>> report.shards_written, int(zarr.open_array(store, mode="r")[63, 63])
    (4, 4095)
    """
    # deferred: the writers, journal and leases (about 60 ms at import) are needed by
    # writes only, not by open_array
    from .write.append_array import append_array
    from .write.execute import Target, WriteCall, execute
    from .write.options import WriteOptions
    from .write.target import prepare_write

    # 1. every keyword checked, once, into one record, before the store is looked at: those of
    # the signature the record takes (all but ``commit``, the session's), by name
    called = locals()
    options = WriteOptions.checked(**{k: called[k] for k in WriteOptions.keywords()})
    # the target: a store, or an icechunk session (its own refusals first)
    target, options = Target.open(store, commit, options)
    # 2-4: the source, the target and the validated job, before the store is written (dry_run
    # stops here)
    prepared = prepare_write(data, target.store, options)
    # a store that cannot delete (ZipStore) cannot hold a lease: refused here, as a plan would be
    leased = target.lease(options.lease, options.compute, prepared.write.store.store)
    if options.dry_run:
        return prepared.job
    if prepared.appended is not None:  # append_dim: its rows reserved first, then written
        return append_array(prepared, options, target, leased)  # (write/append_array.py)
    # 5. the one sequence of every write (write/execute.py)
    return execute(
        target,
        WriteCall(
            [prepared.write],
            lease=leased,
            break_lease=options.break_lease,
            compute=options.compute,
            progress=options.progress,
        ),
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

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> job = shardwise.plan_write(np.zeros((64, 64)), zarr.storage.MemoryStore(),
    ...                            chunks=(16, 16), shards=(32, 32))
    >>> job.strategy, job.blocks
    ('direct', ((32, 32), (32, 32)))
    """
    from .core.job import WritePlan

    job = write_array(data, store, dry_run=True, **kwargs)
    assert isinstance(job, WritePlan)
    return job


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

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_array(np.ones((64, 64), "u1"), store, chunks=(16, 16), shards=(32, 32))
    >>> a = shardwise.open_array(store)  # a dask array, one chunk per shard
    >>> a.chunks, int(a.sum().compute())
    (((32, 32), (32, 32)), 4096)
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
        chunks = lay.dask_chunks()
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
    except (TypeError, ValueError, ArithmeticError) as e:  # chunks=0: dask divides by it
        kind = InvalidTypeError if isinstance(e, TypeError) else InvalidValueError
        why = "sizes must be positive" if isinstance(e, ArithmeticError) else e
        raise kind(f"chunks must be {accepted}, got {chunks!r} ({why})") from None
    if any(c < 1 for dim, n in zip(out, shape, strict=True) if n for c in dim):
        raise InvalidValueError(f"chunks must be {accepted} with positive sizes, got {chunks!r}")
    return out


def _token(reader: ShardReader) -> str:
    """Dask keys of an opened array from its store, path and metadata (the same array opened
    twice shares its keys, as ``dask.array.from_zarr`` does; the data are not looked at)."""
    from dask.base import tokenize

    return tokenize(describe(reader.store.store, reader.store.path), repr(reader.info))
