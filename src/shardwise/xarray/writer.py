"""Write xarray Datasets and DataArrays into sharded Zarr v3 stores, one task per shard.

Metadata is exactly what ``Dataset.to_zarr`` writes, because xarray writes it: xarray's own
zarr store code runs first against a *dry-run overlay* of the target store (reads fall through,
read-only; writes and deletes stay in memory). Its array writer is replaced by one that records
each variable's CF-encoded data, target array and region instead of writing them. With every
check done (xarray's own, then shard alignment, dtypes and shapes), each sharded variable becomes
one :class:`~shardwise.write.pipeline.ArrayWrite` and one write pipeline runs them all as one
graph (one task per shard, merging shards that an append or region write covers only in part);
the overlay's metadata changes are committed after the data.
A refused write therefore changes nothing in the store. An append reserves its rows in the
arrays' metadata first (``appends.py``: concurrent appends all land); one that fails part-way
leaves the array at its old length while no later append reserved rows after it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Literal

from ..core.job import Strategy
from ..core.shardspec import wants_dask
from ..core.sizing import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_SHARD_BYTES,
)
from ..engine.report import NOTHING_TO_DO, WriteReport
from ..errors import ArrayExistsError
from ..storage.consolidated import Nodes
from ..storage.icechunk import writes_into_session
from ..storage.store import describe
from ..write.clear import clear_for_replace
from ..write.execute import Execution, Target, WriteCall
from ..write.options import WriteOptions
from ..write.pipeline import ArrayWrite, Pipeline
from .appends import Reservation, commit_metadata, reserve, tagged
from .daskgrid import extents_as_dask
from .finished import finished_shards
from .parts import (
    XarrayWrite,
    array_writes,
    dask_parts,
    resumed_paths,
)
from .prepare import (
    WriteMode,
    check_keywords,
    empty_chunks,
    shards_by_dimension,
)
from .tree import check_tree

__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_SHARD_BYTES", "to_zarr"]

# to_zarr's keywords that write_array takes too, checked by its record (WriteOptions); mode,
# region and group are xarray's (its modes, a region by dimension name, a group path)
_RECORDED = frozenset(
    {"storage_options", "strategy", "memory_limit", "threads", "lease", "break_lease"}
    | {"compute", "fsync", "progress", "resume"}
)


@writes_into_session
def to_zarr(
    obj: Any,
    store: Any,
    *,
    shards: Mapping[Hashable, int | None] | Sequence[int] | None = None,
    encoding: Mapping[Hashable, Mapping[str, Any]] | None = None,
    mode: WriteMode | None = None,
    append_dim: Hashable | None = None,
    region: Mapping[str, slice | Literal["auto"]] | Literal["auto"] | None = None,
    group: str | None = None,
    consolidated: bool | None = None,
    compute: bool = True,
    storage_options: dict[str, Any] | None = None,
    safe_shards: bool | None = None,
    shard_bytes: int | str = DEFAULT_SHARD_BYTES,
    write_empty_chunks: bool | None = False,
    threads: int | None = None,
    fsync: bool = False,
    progress: bool = False,
    strategy: Strategy = "auto",
    memory_limit: int | str | None = None,
    resume: bool = False,
    lease: bool | None = None,
    break_lease: bool = False,
    write_inherited_coords: bool = False,
    commit: str | None = None,
) -> WriteReport | Any:
    """Write an :class:`xarray.Dataset`, ``DataArray`` or ``DataTree`` to a sharded Zarr v3 store.

    Metadata, attributes, coordinates, dimension names, CF encoding (times, timedeltas,
    ``scale_factor``/``add_offset``, ``_FillValue``, strings, bools) and consolidated metadata are
    those of :meth:`xarray.Dataset.to_zarr` with ``zarr_format=3``; the data is written with one
    task per shard whatever the dask chunks. 0-d variables are written without sharding.

    Layout of the variables this call creates (existing arrays keep theirs), first match wins:

    * ``encoding[name]["shards"]`` / ``["chunks"]``: shard shape and inner chunk shape, as xarray;
    * ``shards={"time": 365}``: shard length per dimension name for every variable; dimensions
      not named span their whole length (as in ``Dataset.chunk``); ``None`` means whole;
    * ``chunks`` / ``shards`` kept in the variable's own ``.encoding`` (e.g. from a store it was
      opened from; kept inner chunks that do not divide new shards from ``shards=`` are
      replaced, and if the chunks of an encoding read from a store were changed since, new
      shards are built around them);
    * the default: inner chunks of about 1 MiB (``DEFAULT_CHUNK_BYTES``; the largest
      dimension is halved until under it), or the variable's dask chunks when they are uniform
      and no larger (as ``Dataset.to_zarr`` takes them) and a shard holds at most 4096 of
      them, and shards of whole inner chunks up to
      ``shard_bytes`` (``DEFAULT_SHARD_BYTES``, 64 MiB before compression; estimated from
      the in-memory dtype). Inner chunks not given are chosen to divide the shard shape.

    Inner chunks of the variables this call creates carry zstd's frame checksum (a damaged chunk
    raises :class:`~shardwise.errors.CorruptShardError` on read) unless their encoding names
    ``compressors`` (e.g. ``encoding={"v": {"compressors": zarr.codecs.ZstdCodec()}}`` for none).

    Appends and region writes may cut through shards: the one task that owns such a shard
    merges (inner chunks the write does not touch keep their stored bytes) and commits only if
    no other writer replaced the shard meanwhile (else it merges again), so independent calls
    writing neighbouring regions from many processes at once lose nothing.

    Each sharded variable is written as :func:`shardwise.write_array` writes an array: under its
    lease, with a write marker that verify reads, and with a record per shard.

    Every check (names, dimensions, encodings, dtypes, shapes, alignment, ``append_dim``, the
    memory each task needs) runs before the first metadata or data byte is written; a refused
    call leaves the store as it was. The metadata is written after the data, so a write that
    fails part-way leaves the old metadata (an append can simply be run again).

    Parameters
    ----------
    obj : xarray.Dataset, xarray.DataArray or xarray.DataTree
        What to write. A ``DataTree`` is written group by group as ``DataTree.to_zarr`` writes
        it (every node a group, empty ones too, with its attributes; the root in ``mode``, the
        nodes below created or, with ``"a"``/``"r+"``, updated), all of its variables in one
        graph and one write; its metadata is written once, after the data.
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store``, a local path or a URL.
    shards : dict or tuple, optional
        Shard length per dimension name for every variable (``{"time": 365}``; ``None`` means
        the whole dimension); a name the data does not have is refused. A shape (``(10, 10)``,
        as :func:`shardwise.write_array` takes it) gives its sizes, by position, to the
        dimensions of the data variables, which must all have that many dimensions. A string
        is a target of :func:`shardwise.plan_shards` for each variable (``"2GB"``, ``"XY"``,
        ``"one per time step"``). A length may be a list of shard extents (``{"time": [31,
        28, 31]}``, summing to the dimension): a shard per extent, a rectilinear grid.
    encoding : dict, optional
        Per-variable encoding, as in ``Dataset.to_zarr`` (``chunks`` = inner chunks, ``shards``
        = shard shape, ``compressors``, CF keys); chunks that do not divide the shards are
        refused, as xarray refuses them. For a ``DataTree`` keyed by group path first, as in
        ``DataTree.to_zarr`` (``{"/a/b": {"var": {...}}}``); a group or variable the tree does
        not have is refused.
    mode : {"w-", "w", "a", "a-", "r+"}, optional
        As in ``Dataset.to_zarr``; defaults to ``"w-"`` (``"a"`` with ``append_dim``, ``"r+"``
        with ``region``).
    append_dim : hashable, optional
        As in ``Dataset.to_zarr``: the dimension to append along.
    region : dict or "auto", optional
        As in ``Dataset.to_zarr``, including ``"auto"``: where in the stored arrays to write.
    group : str, optional
        As in ``Dataset.to_zarr``: the group to write into.
    consolidated : bool, optional
        As in ``Dataset.to_zarr``: ``None`` writes consolidated metadata, so that
        ``xr.open_zarr(p)`` opens it without a warning; zarr's warning that Zarr v3 does not
        specify consolidated metadata is shown only when the call asks for it (``True``).
    compute : bool, default True
        False writes the metadata and the variables not backed by dask at once (as xarray does)
        and returns a dask ``Delayed`` that writes the dask-backed ones and computes the report.
    storage_options : dict, optional
        fsspec options, for a ``store`` given as a URL.
    safe_shards : bool, optional
        ``True`` refuses a ``region`` whose edges split shards (a strict check: the error names
        the nearest shard-aligned region); ``None`` (the default) refuses it only where the
        merge cannot be committed conditionally (stores other than local files, memory, S3, GCS
        and Azure, and arrays without sharding, which zarr-python writes); ``False`` never
        refuses.
    shard_bytes : int or str, default 64 MiB
        The size of default shards, before compression (bytes, or a string such as
        ``"64MiB"``).
    write_empty_chunks : bool or None, default False
        Store inner chunks equal to the fill value too, as :func:`shardwise.write_array`;
        ``None`` (``Dataset.to_zarr``'s default) is zarr's ``array.write_empty_chunks`` setting.
    threads : int, optional
        Caps the threads that encode inner chunks, as in :func:`shardwise.write_array`.
    fsync : bool, default False
        Make each shard durable (file and directory fsync) on local filesystems.
    progress : bool, default False
        Show a progress bar over shards done and bytes moved.
    strategy : {"auto", "direct", "staged"}, default "auto"
        How each variable's shards are written, as in :func:`shardwise.write_array`
        (``"staged"`` bounds each task's memory by one dask block whatever the shard size).
    memory_limit : int or str, optional
        Bytes one task may hold, as in :func:`shardwise.write_array`.
    resume : bool, default False
        Continue an interrupted call with the same arguments: shards it already stored and
        recorded are skipped (with ``mode="w"`` the variables being resumed are not deleted
        first).
    lease : bool, optional
        Hold each variable's lease (default: on when ``compute=True`` and the store can
        delete; a zarr ``ZipStore`` cannot, is written without, and refuses ``True``):
        exclusive in modes "w", "w-" and "a" without ``append_dim``, shared for region and
        append writes, which run side by side; another writer is refused with
        :class:`~shardwise.errors.LeaseHeldError` before anything is written.
    break_lease : bool, default False
        Take over the lease of a writer known to be gone.
    write_inherited_coords : bool, default False
        ``DataTree`` only, as in ``DataTree.to_zarr``: also write into each group the
        coordinates it inherits from its parents (else only the root's, read back inherited).
    commit : str, optional
        With an icechunk ``Session`` as ``store``: commit it with this message once the write
        is merged into it (see :func:`shardwise.to_icechunk`).

    Returns
    -------
    WriteReport or dask.delayed.Delayed
        What the write did (:class:`~shardwise.WriteReport`), or with ``compute=False`` a dask
        ``Delayed`` that computes it.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A keyword of the wrong type, or a value it does not accept; the message names the
        keyword, the value and what is accepted; also variable names, dimension names,
        encodings and an ``append_dim`` the data or the store does not have.
    PlanError
        A write refused before anything is written: dtypes, shapes, alignment
        (``safe_shards``), or a task that would not fit ``memory_limit``.
    LeaseHeldError
        Another writer holds a variable's lease.

    Examples
    --------
    >>> import numpy as np, xarray as xr, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> ds = xr.Dataset({"t": (("y", "x"), np.ones((64, 64)))}).chunk({"y": 16})
    >>> report = shardwise.to_zarr(ds, store, shards={"y": 32, "x": 32})
    >>> report.shards_written, xr.open_zarr(store).t.shape
    (4, (64, 64))
    """
    # 1. open and check: everything is validated, nothing is written. The keywords of
    # xarray's call first, then those write_array takes too, by its record (WriteOptions:
    # write_empty_chunks=None resolved to zarr's setting once checked)
    check_keywords(
        region=region,
        append_dim=append_dim,
        encoding=encoding,
        group=group,
        flags=dict(write_inherited_coords=write_inherited_coords),
        optional_flags=dict(consolidated=consolidated, safe_shards=safe_shards),
        write_empty_chunks=write_empty_chunks,
    )
    o = WriteOptions.checked(
        verb="to_zarr",
        write_empty_chunks=empty_chunks(write_empty_chunks),
        **{k: v for k, v in locals().items() if k in _RECORDED},
    )
    # into an icechunk session: a write into its store, forked once its metadata is there
    target, o = Target.open(store, commit, o)
    if target.session is not None:
        safe_shards, consolidated = target.session.xarray_keywords(safe_shards, consolidated)
    obj, shards = extents_as_dask(obj, shards)  # extents by name: a shard per chunk of them
    xw = check_tree(  # a Dataset is a tree of one node
        obj,
        target.store,
        write_inherited_coords=write_inherited_coords,
        shards=shards if wants_dask(shards) else shards_by_dimension(shards, obj),  # type: ignore[arg-type]
        encoding=encoding,
        mode=mode,
        append_dim=append_dim,
        region=region,
        group=group,
        consolidated=consolidated,
        storage_options=o.storage_options,
        safe_shards=safe_shards,
        shard_bytes=shard_bytes,
        strategy=o.strategy,
        memory_limit=o.memory_limit,
        resume=o.resume,
    )
    # 2. an append's rows reserved in the arrays' metadata (appends.py): from here on the
    # store changes; a call that fails gives them back while no later append reserved after
    leased = target.lease(o.lease, o.compute, xw.zstore)  # the rule of every front end
    if xw.finished and (nothing := _nothing_to_do(xw, group, o.compute)) is not None:
        return nothing  # a resume over the finished write of this call: nothing is written
    xw, held = reserve(xw, append_dim, o.strategy, o.memory_limit, o.resume)
    try:
        # 3. leases (a refusal removes those taken)
        arrays = tagged(held, array_writes(xw, o.settings, fsync=o.fsync, resume=o.resume))
        # as xarray: the metadata first with compute=False; into a session before its fork
        # (the shard tasks write into it); else last, after the data
        first = not o.compute or target.forks
        call = WriteCall(
            list(arrays.values()),
            lease=leased,
            break_lease=o.break_lease,
            compute=o.compute,
            progress=o.progress,
            nodes=[_changed_nodes(xw)],  # re-consolidated above, at the finish
            # 4. clear (mode "w": the old group, but not the leases held nor the variables
            # being resumed)
            clear=lambda pipe: _clear(xw, _kept_keys(xw, arrays, pipe), o.resume, o.break_lease),
            first=(lambda: commit_metadata(xw, held)) if first else None,
            then=None if first else (lambda: commit_metadata(xw, held)),
        )
        with Execution(target, call) as ex:
            # 5. data, 6. metadata, 7. markers done and leases released
            return _write_data(ex, arrays, xw, held)
    except BaseException:
        if held is not None:
            held.release()
        raise


def _nothing_to_do(xw: XarrayWrite, group: str | None, compute: bool) -> WriteReport | Any:
    """The answer of every front end to a resume over a finished write: nothing written, a
    report that says so (the shards found done before), the store as it was. When something
    was changed since (a shard missing, or not as recorded): mode "w-" refuses (its checked
    write is a replacing one, never run), mode "a" writes (None: the call goes on)."""
    done = finished_shards(xw)
    if done is None and xw.mode == "a":
        return None
    if done is None:
        raise ArrayExistsError(
            f"{describe(xw.zstore, group, 'group')} holds a finished write of this data, changed "
            "since (a shard missing or not as recorded): nothing to resume; shardwise.verify "
            "names what changed; mode='a' with resume=True (without encoding=: the arrays keep "
            "theirs) writes it again, mode='w' replaces it"
        )
    # as the pipeline counts a resume: shards left all fill are counted as found again
    report = WriteReport(shards_skipped=done[0], shards_empty=done[1], notes=[NOTHING_TO_DO])
    if compute:
        return report
    from dask.delayed import delayed

    return delayed(report)


def _write_data(
    ex: Execution, arrays: dict[int, ArrayWrite], xw: XarrayWrite, held: Reservation | None
) -> WriteReport | Any:
    """The data, then the metadata (last: a write that fails part-way, a worker lost or a
    source that raises, leaves the old metadata, e.g. an append leaves the array at its old
    length). ``compute=False``: the variables not backed by dask now, the others in the
    returned ``Delayed`` (the metadata was committed before, as xarray does). Into an icechunk
    session the variables zarr writes go into the session's fork, as the shard tasks do."""
    zstore = xw.zstore if ex.store is None else ex.store
    if ex.call.compute:
        report = ex.run(dask_parts(ex.pipe, arrays, zstore, xw.writes))
        if held is not None:
            report.notes.append(held.note())
        return report
    eager = [w for w in xw.writes if not w.lazy]
    if eager:
        ex.flush(dask_parts(ex.pipe, arrays, zstore, eager))
    return ex.run(dask_parts(ex.pipe, arrays, zstore, [w for w in xw.writes if w.lazy]))


def _changed_nodes(xw: XarrayWrite) -> Nodes:
    """The nodes whose metadata this call writes or deletes (groups and arrays, appends'
    grown arrays among them): the consolidated groups above them are re-consolidated."""
    dirs, deleted, written = xw.overlay.changes
    paths = {d.strip("/") for d in dirs} | {k.rpartition("/")[0] for k in deleted + written}
    return Nodes(xw.zstore, tuple(sorted(paths)))


def _clear(xw: XarrayWrite, keep: list[str], resume: bool, break_lease: bool) -> None:
    """What xarray's pass deleted: the groups by the one clear of mode "w" (another writer's
    lease there refuses first, write/clear.py), then the keys."""
    clear_for_replace(
        xw.zstore, xw.overlay.changes[0], keep, resume=resume, break_lease=break_lease
    )
    xw.overlay.commit_deletes(xw.zstore, keep, dirs=False)


def _kept_keys(xw: XarrayWrite, arrays: dict[int, ArrayWrite], pipe: Pipeline) -> list[str]:
    """What mode "w"'s deletes spare: the leases this call holds, and on resume the variables
    an interrupted call of this dataset left."""
    sessions = {i: pipe.session(aw) for i, aw in arrays.items()}
    keep = resumed_paths(arrays)  # the intents that keep what an interrupted call left
    keep += [
        f"{w.path}/{s.lease.name}" for w in xw.writes if (s := sessions.get(id(w))) and s.lease
    ]
    return keep
