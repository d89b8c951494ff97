"""Convert a zarr v2 or v3 array or group into sharded v3, copying encoded chunks when possible.

``convert`` plans every array first (:mod:`shardwise.conversion.plan`: shard shape, codecs,
metadata, copy or re-encode), refuses before writing anything, then writes array by array:

* **copy**: one dask task per target shard reads the source's encoded inner chunks (chunk
  objects, or ranges of source shards after their index), a window at a time, and streams them
  with the new index into the shard object through the staged path's commit (temp file + rename,
  one multipart upload, or one put): memory is a window of chunks, whatever the shard size.
  Missing source chunks stay empty; a shard with no chunk is not written.
* **reencode**: the source read as a dask array and written by :func:`shardwise.write_array`
  (a rectilinear source a shard per dask chunk: ``shards="dask"`` keeps its grid).

Both run inside the write session of ``write_array`` (lease, marker, per-shard records), so an
interrupted conversion resumes with ``resume=True`` and skips the shards already committed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..compat import with_rectilinear_grids
from ..core import args
from ..core.shardspec import ShardSpec, check_chunks, check_names, check_shards
from ..engine.report import WriteReport
from ..errors import ArrayExistsError, CorruptShardError
from ..storage.consolidated import Nodes, refresh
from ..storage.icechunk import SessionWrite, writes_into_session
from ..storage.nodes import node_exists, walk
from ..storage.store import ShardStore, resolve_store
from ..write.clear import clear_for_replace
from ..write.execute import Target
from ..write.options import WriteOptions
from .copy import copy_array
from .overlap import refuse_overlap
from .plan import XARRAY_DIMS, ArrayPlan, plan_array
from .pyramid import convert_pyramid, plan_source, pyramid_options, verify_pyramid
from .report import ArrayReport, ConvertReport
from .source import source_array
from .unshard import check_unsharded, reencode_unsharded
from .verify import source_failed

# -- planning the nodes ---------------------------------------------------------------------------


def _join(*parts: str | None) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _count(store: ShardStore, skip_journal: bool = True) -> int:
    from ..storage.store import JOURNAL

    return sum(1 for n in store.list("") if not (skip_journal and n.startswith(JOURNAL)))


def _dims(arr: Any) -> tuple[str | None, ...] | None:
    """An array's dimension names: v3 ``dimension_names``, else xarray's v2 attribute."""
    names = getattr(arr.metadata, "dimension_names", None) or arr.attrs.get(XARRAY_DIMS)
    return None if names is None else tuple(names)


@writes_into_session
def convert(
    src: Any,
    dst: Any,
    *,
    path: str | None = None,
    dst_path: str | None = None,
    shards: Sequence[int] | Mapping[str, int] | str | None = "auto",
    shard_bytes: int | str | None = None,
    chunks: Sequence[int] | Mapping[str, int] | None = None,
    compressors: Any = None,
    mode: str = "w-",
    resume: bool = False,
    verify: bool = False,
    progress: bool = False,
    lease: bool | None = None,
    break_lease: bool = False,
    fsync: bool = False,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
    pyramid: bool | Mapping[str, Any] | None = None,
    commit: str | None = None,
) -> ConvertReport:
    """Convert a zarr v2 or v3 array or group into sharded (or plain) Zarr v3, one dask task
    per shard.

    Every array of a group is converted (an xarray dataset store: data variables and
    coordinates), with its attributes, dimension names (v2 ``_ARRAY_DIMENSIONS`` become v3
    ``dimension_names``) and fill value carried over as xarray reads them, so ``xr.open_zarr``
    gives an identical dataset. The source's chunks become the inner chunks. Arrays whose codec
    chain has an equivalent in v3 are copied as encoded chunks (no decode); the others are
    decoded and re-encoded; the report says which and why, per array. A destination that is
    the source, lies inside it or contains it is refused (convert elsewhere, then swap).
    Everything is checked before the first byte is written.

    Parameters
    ----------
    src : zarr.abc.store.Store, str or os.PathLike
        The source store: a zarr ``Store``, a local path or a URL.
    dst : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        The destination store, or a writable ``icechunk.Session`` of a repository: every
        array's shard tasks (copied or re-encoded) write into forks of the session, merged
        back into it (checked disjoint) array by array; the caller commits (or passes
        ``commit``). No lease, ``resume`` or consolidated metadata there.
    path : str, optional
        The array or group to convert inside ``src`` (default: its root).
    dst_path : str, optional
        Where to write it inside ``dst`` (default: the same path).
    shards : sequence of int or dict, optional
        A shape for every array, or ``{dimension name: size}``; rounded up to whole chunks. A
        size may be a list of shard extents (``{"time": [31, 28, 31]}``: a rectilinear grid,
        re-encoded). Sizes below 1, extents not summing to the axis, a shape of another rank,
        an unknown name, or names for an array without them are refused. Or a target of
        :func:`shardwise.plan_shards` (``"2GB"``, ``"XY"``), around each array's inner chunks;
        ``"auto"`` (default): of about ``shard_bytes``. ``None``: no shards, a plain Zarr v3
        array of one object per chunk (inner chunks of a sharded source copied as chunk
        objects, not decoded, where the codecs allow).
    shard_bytes : int or str, optional
        With ``shards="auto"``, shards are sized to this (bytes or a string like ``"64MiB"``;
        default 64 MiB).
    chunks : sequence of int or dict, optional
        Inner chunks replacing the source's, as a shape or ``{dimension name: size}`` (the
        other dimensions keep the source's); the arrays are then re-encoded.
    compressors : zarr codec or list of codecs, optional
        Compressors replacing the source's (the arrays are then re-encoded).
    mode : {"w-", "w"}, default "w-"
        ``"w-"`` refuses an existing destination, ``"w"`` replaces it.
    resume : bool, default False
        Continue an interrupted conversion, skipping committed shards.
    verify : bool, default False
        Check every shard as :func:`shardwise.verify` does (every inner chunk decoded, checksums
        checked: a corrupt source chunk is reported as ``verify`` reports it) and compare the
        result with the source (copied chunks byte for byte, re-encoded arrays by value). A
        source chunk a re-encoding cannot decode stops that array's write and is a problem of
        the report, by its store key (without ``verify``: ``CorruptShardError``).
    progress : bool, default False
        Show a progress bar over shards done and bytes moved.
    lease : bool, optional
        Hold each destination array's lease while it is written, as
        :func:`shardwise.write_array` does (default: on where the destination can delete; a
        zarr ``ZipStore``, which only appends, is written without and refuses ``True``).
    break_lease : bool, default False
        Take over the lease of a writer known to be gone.
    fsync : bool, default False
        Make each shard durable (file and directory fsync) on local filesystems.
    threads : int, optional
        Caps the threads that encode inner chunks, as in :func:`shardwise.write_array`.
    storage_options : dict, optional
        fsspec options, for stores given as URLs.
    pyramid : bool or dict, optional
        Write the source array (``path`` must be an array) as an OME-Zarr 0.5 pyramid at
        ``dst_path``, through :func:`shardwise.write_pyramid`: ``True`` with its defaults, or a
        dict of its keywords ``levels``, ``factors``, ``method``, ``dims``, ``scale``,
        ``translation``, ``units``, ``name``. Level 0 (array ``"0"`` of the group) holds the
        source's values with the shards, inner chunks and codecs a plain conversion would
        give it (re-encoded); levels 1.. are reduced from its blocks in the same dask graph,
        so the source is read once. The axes are the source's dimension names (they must
        be among ``t``, ``c``, ``z``, ``y``, ``x``; else pass ``dims``), unnamed axes the last
        of them. ``resume``, ``mode``, ``lease`` and ``verify`` (every level checked, level 0
        against the source by value) work as for the array itself. The pyramid goes next to
        nothing else: the source's own group is refused as the destination (it contains the
        source), so convert it elsewhere, then swap.
    commit : str, optional
        Into an icechunk session: commit it with this message once every array is in it,
        as :func:`shardwise.write_array` does (the snapshot is the report's ``snapshot``).

    Returns
    -------
    ConvertReport
        Per array: copy or reencode (and why), shard shape, shards, bytes, objects before and
        after; ``ok`` is False when ``verify=True`` found problems.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A keyword of the wrong type, or a value it does not accept (the shard settings above
        included); the message names the keyword (and the array).
    ArrayExistsError
        ``mode="w-"`` and the destination exists.
    ArrayNotFoundError
        Nothing at ``path`` in ``src``.
    PlanError
        A destination that is the source, lies inside it or contains it.
    TransactionError
        Into an icechunk session: two shard tasks wrote one shard, or the commit conflicts.

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> src, dst = zarr.storage.MemoryStore(), zarr.storage.MemoryStore()
    >>> a = zarr.create_array(src, shape=(256, 200), chunks=(64, 64), dtype="uint16",
    ...                       zarr_format=2, attributes={"_ARRAY_DIMENSIONS": ["y", "x"]})
    >>> a[...] = np.arange(256 * 200, dtype="uint16").reshape(256, 200)
    >>> report = shardwise.convert(src, dst, shards=(128, 128), pyramid={"levels": 3})
    >>> [zarr.open_array(dst, path=str(k)).shape for k in range(3)]
    [(256, 200), (128, 100), (64, 50)]
    """
    import zarr

    started = time.perf_counter()
    # the keywords of the write itself, checked as write_array checks them; then the others
    # that are not about layout (those are conversion.plan's), before any I/O
    how = WriteOptions.checked(
        modes=("w-", "w"),
        verb="convert",
        mode=mode,
        resume=resume,
        progress=progress,
        break_lease=break_lease,
        fsync=fsync,
        lease=lease,
        threads=threads,
    )
    args.flags(verify=verify)
    args.optional_str("path", path)
    args.store_path("dst_path", dst_path)
    args.mapping("storage_options", storage_options)
    nbytes = args.optional_byte_size("shard_bytes", shard_bytes)
    spec = check_shards(None if isinstance(shards, str) and shards == "auto" else shards)
    levels = pyramid_options(pyramid)
    zsrc = resolve_store(src, mode="r", storage_options=storage_options)
    # into an icechunk session: its refusals first, then a write into its store (each
    # array's write forks it and merges its forks back; one commit at the end)
    target, how = Target.open(dst, commit, how)
    tx = target.session
    sharded = check_unsharded(shards, shard_bytes, pyramid, tx, resume)
    zdst = resolve_store(target.store, mode="w", storage_options=storage_options)
    name = str(dst) if tx is None else f"the icechunk session of branch {tx.session.branch!r}"
    # write_array's rule, before anything is written
    how = replace(how, lease=target.lease(how.lease, True, zdst))
    path = (path or "").strip("/")
    dst_path = path if dst_path is None else dst_path.strip("/")
    refuse_overlap(zsrc, path, zdst, dst_path)
    if levels is not None:
        one = plan_source(
            zsrc, path, dst_path, spec, shard_bytes=nbytes, chunks=chunks, compressors=compressors
        )  # fmt: skip
        report = _to_pyramid(ConvertReport(src=str(src), dst=name), one, zsrc, zdst,
                             dst_path, levels, how, verify)  # fmt: skip
        return _done(report, tx, started)
    layout = dict(shard_bytes=nbytes, chunks=check_chunks(chunks), compressors=compressors)
    root, groups, plans = _plan_all(zsrc, path, dst_path, spec, sharded=sharded, **layout)
    if how.lease and not break_lease:
        _refuse_held_leases(zdst, plans, resume)
    exists = node_exists(zdst, dst_path)
    if exists and mode == "w-" and not resume:
        raise ArrayExistsError(
            f"{name} already holds a zarr node at {dst_path or '/'!r}: use mode='w' to replace "
            "it, or resume=True to finish an interrupted conversion"
        )
    # from here on the destination changes: the groups, then array by array
    report = ConvertReport(src=str(src), dst=name)
    if isinstance(root, zarr.Group):
        if exists and mode == "w" and not resume:
            # the one clear of mode "w" (write/clear.py): another writer's lease anywhere
            # under the destination refuses, as to_zarr's and write_pyramid's
            clear_for_replace(zdst, [dst_path], break_lease=break_lease)
        _write_groups(zdst, dst_path, [("", root), *groups])
    written = [p for p in plans if _convert_or_report(p, zsrc, zdst, how, report, verify)]
    # the consolidated groups above the copy (and the copy's own group, consolidated as the
    # source was) re-consolidated once, after every array (their writes leave it to this)
    # (a session's store keeps none: it lists a group's members itself)
    as_source = (dst_path,) if isinstance(root, zarr.Group) and _consolidated(root) else ()
    if tx is None:
        refresh(Nodes(zdst, (dst_path,), consolidate=as_source))
    if verify:
        from .verify import verify_conversion

        verify_conversion(report, written, zsrc, zdst, threads=how.settings.threads)
    return _done(report, tx, started)


def _done(report: ConvertReport, tx: SessionWrite | None, started: float) -> ConvertReport:
    """The report timed; into an icechunk session with ``commit=``, the session committed
    (every array's forks were merged by its own write)."""
    if tx is not None and tx.commit is not None:
        report.snapshot = tx.commit_now()
    report.seconds = time.perf_counter() - started
    return report


def _to_pyramid(
    report: ConvertReport,
    one: ArrayPlan,
    zsrc: Any,
    zdst: Any,
    dst_path: str,
    levels: Any,
    how: WriteOptions,
    verify: bool,
) -> ConvertReport:
    """``convert(pyramid=...)``: the one source array written as a pyramid at ``dst_path``."""
    try:
        convert_pyramid(one, zsrc, zdst, dst_path, levels, report, **_passed_on(how, how.mode))
    except CorruptShardError as e:
        if not verify:
            raise
        report.arrays.append(source_failed(replace(one, dst_path=dst_path), e, report))
        return report
    if verify:
        verify_pyramid(report, one, zsrc, zdst, how.settings.threads)
    return report


def _plan_all(
    zsrc: Any,
    path: str,
    dst_path: str,
    spec: ShardSpec,
    *,
    shard_bytes: int | None,
    chunks: tuple[int, ...] | dict[str, int] | None,
    compressors: Any,
    sharded: bool,
) -> tuple[Any, list[tuple[str, Any]], list[ArrayPlan]]:
    """The source node at ``path``, its subgroups and the plan of each of its arrays; every
    target's metadata is built in memory, so bad arguments fail before any byte is written."""
    import zarr

    from ..api import create_in_memory

    root, arrays, groups = walk(zsrc, path)
    xarray_group = any(XARRAY_DIMS in a.attrs for _, a in arrays) or any(
        getattr(a.metadata, "dimension_names", None) for _, a in arrays
    )
    where = f"array {path or '/'!r}" if isinstance(root, zarr.Array) else "the group"
    for given in (spec, chunks):
        check_names(given, [(rel or "/", _dims(a)) for rel, a in arrays], where)
    plans = [
        plan_array(
            a,
            _join(path, rel),
            _join(dst_path, rel),
            shards=spec,
            shard_bytes=shard_bytes,
            chunks=chunks,
            compressors=compressors,
            xarray_group=xarray_group and not isinstance(root, zarr.Array),
            sharded=sharded,
        )
        for rel, a in arrays
    ]
    for p in plans:
        create_in_memory(p.create)
    return root, groups, plans


@with_rectilinear_grids
def _write_groups(zdst: Any, dst_path: str, groups: list[tuple[str, Any]]) -> None:
    """The source's groups (relative path, group) as v3 groups with their attributes."""
    import zarr

    for rel, g in groups:
        zarr.open_group(
            zdst,
            path=_join(dst_path, rel),
            mode="a",
            zarr_format=3,
            attributes=dict(g.attrs),
        ).attrs.update(dict(g.attrs))


def _refuse_held_leases(zdst: Any, plans: Sequence[ArrayPlan], resume: bool) -> None:
    """Refuse before writing anything when another writer holds an array's lease (each array's
    write takes its lease for real later; this only keeps a refused group untouched). A resumed
    conversion takes over the leases of holders that are gone (when it takes them)."""
    from ..durability.lease import blocking_leases, held_error

    for p in plans:
        sstore = ShardStore(zdst, p.dst_path)
        held = blocking_leases(sstore, takeover=resume, array=True)
        if held:
            name, who = sorted(held.items())[0]
            raise held_error(sstore, name, who.describe())


def _consolidated(group: Any) -> bool:
    return getattr(group.metadata, "consolidated_metadata", None) is not None


def _convert_or_report(
    plan: ArrayPlan, zsrc: Any, zdst: Any, how: WriteOptions, report: ConvertReport, verify: bool
) -> bool:
    """Convert one array into ``report``; whether it was written. With ``verify``, a source
    chunk (or shard index) that does not decode is one of the report's problems, naming its
    key, and the array is not verified (its write stays unfinished); without, it raises."""
    try:
        report.arrays.append(_convert_array(plan, zsrc, zdst, how))
        return True
    except CorruptShardError as e:
        if not verify:
            raise
        report.arrays.append(source_failed(plan, e, report))
        return False


def _convert_array(plan: ArrayPlan, zsrc: Any, zdst: Any, how: WriteOptions) -> ArrayReport:
    started = time.perf_counter()
    out = ArrayReport(
        path=plan.dst_path,
        method=plan.method,
        reason=plan.reason,
        shards=plan.shards if plan.sharded else None,
        chunks=plan.chunks,
    )
    src_store = ShardStore(zsrc, plan.src_path)
    out.objects_before = _count(src_store)
    write = copy_array if plan.method == "copy" else _reencode_array
    write = write if plan.sharded or write is copy_array else reencode_unsharded
    wrote = write(plan, zsrc, zdst, how)
    out.shards_written = wrote.shards_written
    out.shards_skipped = wrote.shards_skipped
    out.notes = list(wrote.notes)
    out.bytes_stored = wrote.bytes_stored
    out.objects_after = _count(ShardStore(zdst, plan.dst_path))
    out.seconds = time.perf_counter() - started
    return out


def _reencode_array(plan: ArrayPlan, zsrc: Any, zdst: Any, how: WriteOptions) -> WriteReport:
    from ..api import write_array

    c = {**plan.create, **({} if plan.keep is None else {"shards": plan.keep})}  # grid kept
    for k in ("shape", "zarr_format"):
        c.pop(k)
    report: WriteReport = write_array(
        source_array(plan, zsrc),
        zdst,
        path=plan.dst_path or None,
        **_passed_on(how, "w" if how.mode == "w" and not how.resume else "w-"),
        **c,
    )
    return report


def _passed_on(how: WriteOptions, mode: str) -> dict[str, Any]:
    """The keywords of convert's own write (write_array's or write_pyramid's) from ``how``."""
    return dict(
        mode=mode,
        resume=how.resume,
        progress=how.progress,
        lease=how.lease,
        break_lease=how.break_lease,
        fsync=how.fsync,
        threads=how.settings.threads,
    )
