"""Write xarray Datasets and DataArrays into sharded Zarr v3 stores, one task per shard.

Metadata is exactly what ``Dataset.to_zarr`` writes, because xarray writes it: xarray's own
zarr store code runs first against a *dry-run overlay* of the target store (reads fall through,
read-only; writes and deletes stay in memory). Its array writer is replaced by one that records
each variable's CF-encoded data, target array and region instead of writing them. With every
check done (xarray's own, then shard alignment, dtypes and shapes), each sharded variable becomes
one :class:`~shardwise.durability.pipeline.ArrayWrite` and one write pipeline runs them all as one
graph (one task per shard, merging shards that an append or region write covers only in part);
the overlay's metadata changes are committed after the data.
A refused write therefore changes nothing in the store, and an append that fails part-way
leaves the array at its old length.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from zarr.abc.store import Store

from ..api import refuse_unknown_chunks
from ..codec.metadata import ArrayInfo, info_from_metadata
from ..compat import validate_region_and_encoding, zarr_store_writers
from ..core import args
from ..core.job import Strategy, WriteJob, make_job
from ..core.layout import Layout, Region, ceildiv, normalize_region
from ..core.plan import WritePlan
from ..core.sizing import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_SHARD_BYTES,
)
from ..durability.journal import read_marker, read_markers
from ..durability.pipeline import ArrayWrite, Part, Pipeline, compute_parts
from ..durability.session import WriteSession
from ..engine.report import WriteReport
from ..engine.write import WriteOptions
from ..errors import ArgumentValueError, PlanError, UnsupportedCodecError
from ..storage.conditional import versions
from ..storage.overlay import Overlay, read_only
from ..storage.store import ShardStore, resolve_store
from .prepare import (
    WriteMode,
    _as_dataset,
    _as_dict,
    _check_append_dim,
    _check_names,
    _check_shards_kw,
    _choose_mode,
    _stored_dims,
    _with_layout,
    check_keywords,
)

__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_SHARD_BYTES", "to_zarr"]


def to_zarr(
    obj: Any,
    store: Any,
    *,
    shards: Mapping[Hashable, int | None] | None = None,
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
    write_empty_chunks: bool = False,
    threads: int | None = None,
    fsync: bool = False,
    progress: bool = False,
    strategy: Strategy = "auto",
    memory_limit: int | str | None = None,
    resume: bool = False,
    lease: bool | None = None,
    break_lease: bool = False,
) -> WriteReport | Any:
    """Write an ``xarray.Dataset`` or ``DataArray`` to a sharded Zarr v3 store.

    Metadata, attributes, coordinates, dimension names, CF encoding (times, timedeltas,
    ``scale_factor``/``add_offset``, ``_FillValue``, strings, bools) and consolidated metadata are
    those of ``Dataset.to_zarr(..., zarr_format=3)``; the data is written with one task per
    shard whatever the dask chunks. 0-d variables are written without sharding.

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
    obj : xarray.Dataset or xarray.DataArray
        What to write.
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store``, a local path or a URL.
    shards : dict, optional
        Shard length per dimension name for every variable (``{"time": 365}``; ``None`` means
        the whole dimension); a name the data does not have is refused.
    encoding : dict, optional
        Per-variable encoding, as in ``Dataset.to_zarr`` (``chunks`` = inner chunks, ``shards``
        = shard shape, ``compressors``, CF keys); chunks that do not divide the shards are
        refused, as xarray refuses them.
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
    write_empty_chunks : bool, default False
        Store inner chunks equal to the fill value too, as :func:`shardwise.write_array`.
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
        Hold each variable's lease (default: on when ``compute=True``): exclusive in modes "w",
        "w-" and "a" without ``append_dim``, shared for region and append writes, which run
        side by side; another writer is refused with
        :class:`~shardwise.errors.LeaseHeldError` before anything is written.
    break_lease : bool, default False
        Take over the lease of a writer known to be gone.

    Returns
    -------
    WriteReport or dask.delayed.Delayed
        What the write did (:class:`~shardwise.WriteReport`), or with ``compute=False`` a dask
        ``Delayed`` that computes it.

    Raises
    ------
    ArgumentTypeError, ArgumentValueError
        A keyword of the wrong type, or a value it does not accept; the message names the
        keyword, the value and what is accepted.
    PlanError
        A write refused before anything is written: names, dimensions, encodings, dtypes,
        shapes, alignment (``safe_shards``), ``append_dim``, or a task that would not fit
        ``memory_limit``.
    LeaseHeldError
        Another writer holds a variable's lease.
    """
    # 1. open and check: everything is validated, nothing is written
    check_keywords(
        region=region,
        append_dim=append_dim,
        encoding=encoding,
        group=group,
        storage_options=storage_options,
        strategy=strategy,
        flags=dict(
            compute=compute,
            write_empty_chunks=write_empty_chunks,
            fsync=fsync,
            progress=progress,
            resume=resume,
            break_lease=break_lease,
        ),
        optional_flags=dict(consolidated=consolidated, safe_shards=safe_shards, lease=lease),
    )
    threads = args.thread_count("threads", threads)
    memory_limit = args.optional_byte_size("memory_limit", memory_limit)
    xw = _check(
        obj,
        store,
        shards=shards,
        encoding=encoding,
        mode=mode,
        append_dim=append_dim,
        region=region,
        group=group,
        consolidated=consolidated,
        storage_options=storage_options,
        safe_shards=safe_shards,
        shard_bytes=shard_bytes,
        strategy=strategy,
        memory_limit=memory_limit,
        resume=resume,
    )
    # 2. leases (a refusal removes those taken): from here on the store changes
    opts = WriteOptions(write_empty_chunks=write_empty_chunks, threads=threads)
    arrays = _array_writes(xw, opts, fsync=fsync, resume=resume)
    with Pipeline(
        list(arrays.values()), lease=compute if lease is None else lease, break_lease=break_lease
    ) as pipe:
        # 3. clear (mode "w": the old group, but not the leases held nor the variables being
        # resumed) and the write markers
        keep = _kept_keys(xw, arrays, pipe, resume)
        _refuse_foreign_leases(xw.zstore, xw.overlay, keep)
        xw.overlay.commit_deletes(xw.zstore, keep)
        if not compute:  # as xarray: the metadata now, the dask-backed data later
            xw.overlay.commit_writes(xw.zstore)
        pipe.start()
        # 4. data, 5. metadata (last: a write that fails part-way, a worker lost or a source that
        # raises, leaves the old metadata, e.g. an append leaves the array at its old length),
        # 6. markers done and leases released
        if compute:
            return pipe.run(
                _parts(pipe, arrays, xw.zstore, xw.writes),
                compute=True,
                progress=progress,
                then=lambda: xw.overlay.commit_writes(xw.zstore),
            )
        eager = [w for w in xw.writes if not w.lazy]
        lazy = [w for w in xw.writes if w.lazy]
        done = (
            compute_parts(_parts(pipe, arrays, xw.zstore, eager), progress)
            if eager
            else WriteReport()
        )
        return pipe.run(_parts(pipe, arrays, xw.zstore, lazy), compute=False, before=done)


@dataclass(frozen=True)
class _XarrayWrite:
    """A checked ``to_zarr`` call: the metadata xarray would write (in ``overlay``, not yet in
    the store), the data writes and their jobs."""

    zstore: Store
    overlay: Overlay
    writes: list[_Write]
    jobs: dict[int, WriteJob]
    mode: WriteMode
    shared: bool  # region and append writes: other processes may write beside this one


def _check(
    obj: Any,
    store: Any,
    *,
    shards: Mapping[Hashable, int | None] | None,
    encoding: Mapping[Hashable, Mapping[str, Any]] | None,
    mode: WriteMode | None,
    append_dim: Hashable | None,
    region: Any,
    group: str | None,
    consolidated: bool | None,
    storage_options: dict[str, Any] | None,
    safe_shards: bool | None,
    shard_bytes: int | str,
    strategy: Strategy,
    memory_limit: int | str | None,
    resume: bool,
) -> _XarrayWrite:
    """Open the store and run every check; xarray's own metadata pass runs against an overlay,
    so nothing is written."""
    ds = _as_dataset(obj)
    _check_names(ds)
    for name, var in ds.variables.items():
        refuse_unknown_chunks(var.data, f"variable {name!r}: ")
    unknown = sorted(map(str, set(region) - set(ds.dims))) if isinstance(region, Mapping) else []
    if unknown:
        # xarray's words for it
        raise ArgumentValueError(
            f"all keys in ``region`` are not in Dataset dimensions, got {unknown} and "
            f"{sorted(map(str, ds.dims))}: region names dimensions of the data to write"
        )
    if shards is not None:
        _check_shards_kw(ds, shards)
    shard_bytes = args.byte_size("shard_bytes", shard_bytes)
    mode = _choose_mode(mode, append_dim, region)
    if append_dim is not None and append_dim not in ds.dims:
        raise ArgumentValueError(  # with xarray's wording, which callers match on
            f"append_dim={append_dim!r} is not a dimension of the data to write: it "
            f"does not match any existing dataset dimensions {sorted(map(str, ds.dims))}"
        )
    user_encoding = {k: _as_dict(v, k) for k, v in (encoding or {}).items()}
    zstore = resolve_store(store, mode="w", storage_options=storage_options)
    base = read_only(zstore)
    stored = _stored_dims(base, group) if mode in ("a", "a-", "r+") else None
    if append_dim is not None:
        _check_append_dim(stored, group, append_dim)
    existing = set(stored or ())
    ds, user_encoding = _with_layout(ds, user_encoding, existing, shards, shard_bytes)

    overlay = Overlay(base)
    capture = _Capture()
    _run_xarray(
        ds,
        overlay,
        capture,
        mode=_resumed_mode(base, group, mode, set(map(str, ds.variables))) if resume else mode,
        group=group,
        consolidated=consolidated,
        append_dim=append_dim,
        region=region,
        encoding=user_encoding,
    )
    writes = _plan_writes(capture.items, append_dim, region is not None, safe_shards, zstore)
    shared = region is not None or append_dim is not None
    jobs = _jobs(writes, strategy, memory_limit, shared=shared)
    return _XarrayWrite(zstore, overlay, writes, jobs, mode, shared)


def _kept_keys(
    xw: _XarrayWrite, arrays: dict[int, ArrayWrite], pipe: Pipeline, resume: bool
) -> list[str]:
    """What mode "w"'s deletes spare: the leases this call holds, and on resume the variables
    an interrupted call of this dataset left."""
    sessions = {i: pipe.session(aw) for i, aw in arrays.items()}
    keep = [f"{w.path}/" for w in xw.writes if resume and _interrupted(sessions.get(id(w)))]
    keep += [
        f"{w.path}/{s.lease.name}" for w in xw.writes if (s := sessions.get(id(w))) and s.lease
    ]
    return keep


# -- the xarray pass ------------------------------------------------------------------------------


class _Capture:
    """Stands in for xarray's ArrayWriter: records what it would write instead of writing."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, Any, Any]] = []

    def add(self, source: Any, target: Any, region: Any = None) -> None:
        self.items.append((source, target, region))


def _run_xarray(
    ds: Any,
    store: Store,
    writer: _Capture,
    *,
    mode: WriteMode,
    group: str | None,
    consolidated: bool | None,
    append_dim: Hashable | None,
    region: Any,
    encoding: Mapping[Hashable, Any],
) -> None:
    """xarray's ``to_zarr`` with our writer: metadata into ``store``, data into ``writer``."""
    dump_to_store, get_writable_zarr_store = zarr_store_writers()

    for v in ds.variables.values():
        if v.size == 0:
            v.load()  # as xarray: zero-length dask arrays do not store
    zs = get_writable_zarr_store(
        store,
        mode=mode,
        group=group,
        consolidated=consolidated,
        append_dim=append_dim,
        region=region,
        safe_chunks=False,  # shardwise owns alignment: one task per shard
        zarr_format=3 if mode in ("w", "w-") else None,
    )
    with warnings.catch_warnings():
        if consolidated is None:
            # consolidated metadata is xarray's default (xr.open_zarr reads it without a
            # warning); zarr's warning that v3 does not specify it is for those who ask for it
            # with consolidated=True
            warnings.filterwarnings(
                "ignore", "Consolidated metadata is currently not part", UserWarning
            )
        try:
            if zs.zarr_group.metadata.zarr_format != 3:
                raise PlanError(
                    "the store holds Zarr format 2 metadata; shardwise writes Zarr format 3 only"
                )
            ds = validate_region_and_encoding(zs, ds, encoding)
            dump_to_store(ds, zs, writer, encoding=encoding)  # consolidates into the overlay
        finally:
            zs.close()


# -- planning the data writes ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Write:
    name: str
    path: str
    source: Any
    region: Region
    info: ArrayInfo | None  # None: not sharded, written through zarr-python
    chunks: tuple[int, ...]  # the shard shape (the chunk shape when not sharded)
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    meta: dict[str, Any]  # the array's metadata once this write is done

    @property
    def lazy(self) -> bool:
        from xarray.namedarray.pycompat import is_chunked_array

        return is_chunked_array(self.source) is True

    @property
    def size(self) -> int:
        return math.prod(s.stop - s.start for s in self.region)


def _plan_writes(
    items: Iterable[tuple[Any, Any, Any]],
    append_dim: Hashable | None,
    has_region: bool,
    safe_shards: bool | None,
    zstore: Store,
) -> list[_Write]:
    out: list[_Write] = []
    splits: list[tuple[str, str, slice, int, str]] = []
    for source, arr, reg in items:
        meta = arr.metadata
        shape = tuple(int(n) for n in arr.shape)
        dims = tuple(str(d) for d in meta.dimension_names or ("",) * len(shape))
        name = arr.path.rsplit("/", 1)[-1]
        full = tuple(slice(None) for _ in shape)
        target = normalize_region(tuple(reg) if reg else full, shape)
        want = tuple(s.stop - s.start for s in target)
        if tuple(source.shape) != want:
            raise PlanError(
                f"variable {name!r}: data of shape {tuple(source.shape)} does not fit the region "
                f"{[(s.start, s.stop) for s in target]} of the stored array {shape}"
            )
        try:
            info: ArrayInfo | None = info_from_metadata(meta) if shape else None
        except UnsupportedCodecError:
            info = None
        grid = info.layout.shard_shape if info is not None else tuple(meta.chunks) if shape else ()
        if (
            info is not None
            and not np.can_cast(source.dtype, info.dtype, casting="same_kind")
            and not (source.dtype.kind in "OUT" and info.dtype.kind in "OUT")
        ):
            raise PlanError(
                f"variable {name!r}: cannot write {source.dtype} data into the stored "
                f"{info.dtype} array without loss"
            )
        strict = safe_shards
        if strict is None:  # split shards are safe where merges commit conditionally
            strict = info is None or versions(ShardStore(zstore, arr.path)) is None
        if has_region and strict:
            unit = "shards" if info is not None else "chunks"
            for sl, s, n, d in zip(target, grid, shape, dims, strict=True):
                if d != append_dim and not _on_grid(sl, s, n):
                    splits.append((name, d, sl, s, unit))
        out.append(
            _Write(name, arr.path, source, target, info, tuple(grid), shape, dims, meta.to_dict())
        )
    if splits:
        raise PlanError(_split_message(splits, out))
    return out


def _on_grid(sl: slice, step: int, n: int) -> bool:
    start, stop = int(sl.start), int(sl.stop)
    return start % step == 0 and (stop % step == 0 or stop == n)


def _split_message(splits: list[tuple[str, str, slice, int, str]], writes: list[_Write]) -> str:
    """Name what is split and the nearest region (per dimension) aligned for every variable."""
    lines = [
        f"variable {name!r} along {d!r}: {sl.start}:{sl.stop} splits its {unit} of {s}"
        for name, d, sl, s, unit in splits
    ]
    nearest = {}
    for d in dict.fromkeys(d for _, d, _, _, _ in splits):
        grids = [
            (sl, step, n)
            for w in writes
            for sl, step, n, dim in zip(w.region, w.chunks, w.shape, w.dims, strict=True)
            if dim == d
        ]
        lo, hi = min(g[0].start for g in grids), max(g[0].stop for g in grids)
        while True:  # widen until on the grid of every variable (their shards may differ)
            nlo = min(lo // step * step for _, step, _ in grids)
            nhi = max(min(ceildiv(hi, step) * step, n) for _, step, n in grids)
            if (nlo, nhi) == (lo, hi):
                break
            lo, hi = nlo, nhi
        nearest[d] = slice(lo, hi)
    return (
        "the region splits shards that a write of the neighbouring region by another call "
        "would share (concurrent read-modify-writes of one shard lose updates):\n  "
        + "\n  ".join(lines)
        + f"\nThe nearest shard-aligned region is {nearest}. Write shard-aligned regions, or "
        "pass safe_shards=False when no other write touches these shards at the same time "
        "(they are then merged with what is stored; on local files, memory, S3, GCS and Azure "
        "shared shards are committed conditionally and are safe by default). Nothing was "
        "written."
    )


# -- running the data writes ----------------------------------------------------------------------


def _jobs(
    writes: list[_Write], strategy: Strategy, memory_limit: int | str | None, *, shared: bool
) -> dict[int, WriteJob]:
    """The validated job of every sharded variable write (by ``id`` of the write); ``shared``:
    region and append writes, which other processes may run beside this one."""
    out = {}
    for w in writes:
        if w.info is None or w.size == 0:
            continue
        chunks = getattr(w.source, "chunks", None) if w.lazy else None
        job = make_job(
            WritePlan(w.info.layout, w.region),
            None if chunks is None else tuple(tuple(int(n) for n in c) for c in chunks),
            np.dtype(w.info.dtype).itemsize,
            strategy=strategy,
            memory_limit=memory_limit,
            shared=shared,
        )
        try:
            job.validate()
            if shared and job.merges_unconditionally:
                raise PlanError(
                    f"strategy='staged' would merge the {job.plan.npartial} shards the region "
                    "covers in part without a conditional commit, and region and append writes "
                    "may run beside others: use strategy='auto' or 'direct'"
                )
        except PlanError as e:
            raise PlanError(f"variable {w.name!r}: {e}") from None
        out[id(w)] = job
    return out


def _resumed_mode(base: Store, group: str | None, mode: WriteMode, names: set[str]) -> WriteMode:
    """Mode "w-" finds the data of the interrupted call it resumes: while the group's metadata
    (written last) is missing and everything in the group is an interrupted write of one of
    this dataset's variables, that is no reason to refuse, so the xarray pass runs as "w"
    (whose deletes spare the variables being resumed). Anything else there keeps "w-", which
    refuses the call."""
    if mode != "w-":
        return mode
    from zarr.core.sync import sync

    prefix = f"{group.strip('/')}/" if group and group.strip("/") else ""

    async def children() -> list[str]:
        return [c.rstrip("/") async for c in base.list_dir(prefix)]

    if sync(base.exists(prefix + "zarr.json")):
        return "w-"
    found = sync(children())
    if not found:
        return "w-"  # nothing there: "w-" writes as it is
    for name in found:
        if name not in names or not _open_marker(ShardStore(base, prefix + name)):
            return "w-"
    return "w"


def _open_marker(store: ShardStore) -> bool:
    """Whether an interrupted write left its open marker in the array at ``store``."""
    return any(m is not None and m.status == "open" for m in read_markers(store).values())


def _array_writes(
    xw: _XarrayWrite, opts: WriteOptions, *, fsync: bool, resume: bool
) -> dict[int, ArrayWrite]:
    """The pipeline's write of every sharded variable (by ``id`` of the variable's write)."""
    out: dict[int, ArrayWrite] = {}
    for w in xw.writes:
        job = xw.jobs.get(id(w))
        if w.info is None or job is None:
            continue
        sstore = ShardStore(xw.zstore, w.path, fsync=fsync)
        out[id(w)] = ArrayWrite(
            store=sstore,
            info=w.info,
            plan=job.plan,
            strategy=job.strategy,
            # numpy-backed variables are written now, even with compute=False: no copy
            source=w.source if w.lazy else np.asarray(w.source),
            options=opts,
            blocks=job.blocks,
            # side by side only where shared shards commit conditionally (as write_array)
            shared=xw.shared and versions(sstore) is not None and not job.merges_unconditionally,
            resume=resume,
            adopt_done=xw.mode != "w",
            prefix=w.path,
        )
    return out


def _interrupted(session: WriteSession | None) -> bool:
    """Whether an interrupted create (or replace) of this variable left its data: its open
    marker, and no metadata (a create writes it last, a replace deleted the old first; an older
    array with an interrupted write of its own still has its metadata, and is replaced)."""
    if session is None or session.store.get("zarr.json") is not None:
        return False
    found = read_marker(session.store, session.region)
    return found is not None and found.status == "open" and list(found.shape) == list(session.shape)


def _refuse_foreign_leases(zstore: Store, overlay: Overlay, keep: list[str]) -> None:
    """Before mode "w" deletes the group: a lease there that this call does not hold (another
    job writing a variable this dataset drops, or a region of one) refuses the call."""
    from zarr.core.sync import sync

    from ..errors import LeaseHeldError

    dirs = overlay.changes[0]
    if not dirs:
        return

    async def leases() -> list[str]:
        out = []
        for d in dirs:
            prefix = f"{d.strip('/')}/" if d.strip("/") else ""
            out += [k async for k in zstore.list_prefix(prefix) if _is_lease(k)]
        return out

    foreign = sorted(set(sync(leases())) - set(keep))
    if foreign:
        raise LeaseHeldError(
            f"mode='w' would delete {foreign[0]!r}, the lease of another write in progress "
            f"({len(foreign)} such leases): wait for it, or break it if that writer is gone "
            "(shardwise lease --break)"
        )


def _is_lease(key: str) -> bool:
    """An array's exclusive, batch part or shared lease object (under any array path)."""
    from ..durability.lease import LEASE, SHARED

    k = "/" + key
    return k.endswith("/" + LEASE) or f"/{LEASE}.part-" in k or f"/{SHARED}" in k


def _parts(
    pipe: Pipeline, arrays: dict[int, ArrayWrite], zstore: Store, writes: list[_Write]
) -> list[Part]:
    """The dask work that writes ``writes``, run together: sharded variables through the
    pipeline's engine (shards a resumed session stored already left out), the others through
    zarr-python."""
    from dask.delayed import delayed

    parts: list[Part] = []
    for w in writes:
        if w.size == 0:
            continue
        if id(w) in arrays:
            parts += pipe.parts([arrays[id(w)]])
            continue
        source: Any = w.source if w.lazy else np.asarray(w.source)
        if not w.lazy or not w.chunks:
            part = delayed(_write_plain, pure=False)(zstore, w.path, w.meta, w.region, source)
            parts.append((w.path, part))
            continue
        # not sharded (an array some other writer created without shards): zarr writes it, from
        # dask blocks cut at chunk boundaries so that no two tasks share a chunk
        cuts = WritePlan(Layout(w.shape, w.chunks, w.chunks), w.region).task_chunks
        blocks = source.rechunk(cuts).to_delayed().ravel()
        starts = [np.cumsum((0, *c[:-1])) for c in cuts]
        for idx, block in zip(np.ndindex(*(len(c) for c in cuts)), blocks, strict=True):
            region = tuple(
                slice(r.start + int(st[i]), r.start + int(st[i]) + c[i])
                for r, st, c, i in zip(w.region, starts, cuts, idx, strict=True)
            )
            part = delayed(_write_plain, pure=False)(zstore, w.path, w.meta, region, block)
            parts.append((w.path, part))
    return parts


def _write_plain(
    zstore: Store, path: str, meta: dict[str, Any], region: Region, block: Any
) -> WriteReport:
    """Write ``block`` through zarr-python, into the array as ``meta`` describes it (which the
    store may not hold yet: metadata is written after the data)."""
    import zarr
    from zarr.core.metadata import ArrayV3Metadata
    from zarr.storage import StorePath

    data = np.asarray(block)
    meta_v3 = ArrayV3Metadata.from_dict(meta)
    zarr.Array(zarr.AsyncArray(metadata=meta_v3, store_path=StorePath(zstore, path)))[region] = data
    return WriteReport(raw_bytes=int(data.nbytes))
