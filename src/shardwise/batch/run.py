"""HPC batch writes: one array written by N independent jobs, each owning whole shards.

Three steps, each safe to rerun:

1. :func:`init` (once, e.g. before the job array): writes the metadata and the batch record
   ``.shardwise/batch.json``, which splits the array into N shard-aligned, disjoint parts;
2. :func:`write_part` (job-array task ``i``): writes part ``i`` only, holding the lease of that
   part (a requeued copy of the same task is refused while the first runs); ``resume=True``
   continues an interrupted part;
3. :func:`finalize` (after all tasks): checks every part finished, runs :func:`shardwise.verify`
   and closes the batch (raises :class:`~shardwise.errors.VerifyError` when anything is wrong).

Parts never share a shard, so the jobs need no coordination. Regions given by hand are refused
when two parts would share a shard, with the nearest aligned split in the message:

>>> from shardwise.core.layout import Layout
>>> lay = Layout((100, 64), (32, 32), (8, 8))
>>> [[(s.start, s.stop) for s in r] for r in split_parts(lay, 3)]
[[(0, 32), (0, 64)], [(32, 64), (0, 64)], [(64, 100), (0, 64)]]
>>> check_parts(lay, [(slice(0, 40), slice(None)), (slice(40, 100), slice(None))])
Traceback (most recent call last):
...
shardwise.errors.PlanError: part 0 region [0:40, 0:64] would share shards with another part: \
edges must fall on multiples of the shard shape (32, 32) or the array end (100, 64); nearest \
aligned split: [0:32, 0:64]
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, cast

import zarr

from ..codec.metadata import default_compressors, info_from_metadata
from ..core import args
from ..core.layout import RegionArg
from ..core.shardspec import target_shape
from ..durability.holder import lease_expiry as check_expiry
from ..durability.journal import BATCH, PARTS, clear_array, now
from ..durability.lease import LEASE, Lease, Takeover, gone_reason, part_lease, read_lease
from ..durability.verify import VerifyReport, verify_store
from ..engine.report import WriteReport
from ..errors import InvalidTypeError, LeaseHeldError, VerifyError
from ..storage.consolidated import Nodes, refresh
from ..storage.store import ShardStore
from ..write.intent import Mode
from ..write.session import PartLease
from .plan import BatchPlan, check_coverage, check_parts, check_shape_and_parts, split_parts
from .status import FINALIZED, _open, open_batch, parts_done, recorded_batch, rerun_of


def init(
    store: Any,
    *,
    shape: Sequence[int],
    dtype: Any,
    chunks: Any,
    shards: Any,
    parts: int | Sequence[RegionArg],
    path: str | None = None,
    mode: str = "w-",
    lease: bool | None = None,
    break_lease: bool = False,
    storage_options: dict[str, Any] | None = None,
    **create: Any,
) -> BatchPlan:
    """Create the array's metadata and the batch record splitting it into ``parts``.

    Parameters
    ----------
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store``, a local path or a URL.
    shape : sequence of int
        The array's shape.
    dtype : numpy.dtype or str
        The array's data type, as in ``zarr.create_array``.
    chunks : tuple of int
        The inner chunk shape, as in ``zarr.create_array``.
    shards : tuple of int or str
        The shard shape, as in ``zarr.create_array``, or a target of
        :func:`shardwise.plan_shards` around ``chunks`` (``"2GB"``, ``"XY"``).
    parts : int or sequence of tuple of slice
        A count (slabs along the first axes) or a list of regions (slices, or one ``Ellipsis``
        for the dimensions not given, as ``region=`` of :func:`shardwise.write_array`;
        shard-aligned, disjoint and, unless ``mode="r+"`` rewrites regions of an existing array,
        covering the whole array).
    path : str, optional
        The array's path inside ``store`` (default: its root); refused as ``write_array``
        refuses it (an empty name between two ``/``, ``zarr.json``, ``.shardwise``, ``.``,
        ``..``) before the store is touched.
    mode : {"w-", "w", "r+"}, default "w-"
        ``"w-"`` create (rerunning with the same arguments returns the open batch), ``"w"``
        replace, ``"r+"`` keep an existing array's metadata.
    lease : bool, optional
        Hold the array's lease while the metadata and the batch record are written (default:
        on where the store can delete, the rule of every front end: a zarr ``ZipStore`` is
        written without, and refuses ``True`` before anything is written).
    break_lease : bool, default False
        Take over the lease of a writer known to be gone.
    storage_options : dict, optional
        fsspec options, for a ``store`` given as a URL.
    **create
        ``zarr.create_array`` keywords (``fill_value``, ``compressors`` (default: zstd with its
        frame checksum, as :func:`shardwise.write_array`), ``dimension_names``, ...).

    Returns
    -------
    BatchPlan
        The batch record: which region of the array each part writes.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A keyword of the wrong type, or a value it does not accept.
    PlanError
        Parts that are misaligned, share a shard (the message has the nearest aligned split),
        leave shards in no part, or are more than the shards.
    ArrayExistsError
        ``mode="w-"`` and an array is there that is not this batch's: one with other metadata
        (the message names what differs: dtype, chunks, shards, fill value, codecs), without
        an open batch, or with an open batch of other parts.
    ArrayNotFoundError
        ``mode="r+"`` and no array there.
    LeaseHeldError
        Another writer holds the array's lease.

    Examples
    --------
    >>> import zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> shardwise.batch.init(store, shape=(64,), dtype="u1", chunks=16, shards=32, parts=2).regions
    ((slice(0, 32, None),), (slice(32, 64, None),))
    """
    from ..api import create_in_memory
    from ..write.execute import Target

    args.check_mode(mode, ("w-", "w", "r+"), "batch init mode")
    args.optional_flags(lease=lease)
    args.flags(break_lease=break_lease)
    check_shape_and_parts(shape, parts)
    sstore = _open(store, path, storage_options)
    leased = Target(sstore.store).lease(lease, True, sstore.store)  # every front end's rule
    shards = target_shape(shards, shape, dtype, chunks)  # "2GB", "XY": the planner's
    kwargs = _create_kwargs(
        dict(shape=tuple(shape), dtype=dtype, chunks=chunks, shards=shards), create
    )
    # what is at the path, by the policy of every front end, before anything is written: "w-"
    # over another array or this one with other metadata (a rerun with other arguments) and
    # "r+" over nothing are refused
    built = None if mode == "r+" else create_in_memory(kwargs)
    probe: Any = built
    rerun_of(sstore, path, cast(Mode, mode), built)
    if mode == "r+":
        probe = zarr.open_array(sstore.store, path=path or "", mode="r", zarr_format=3)
    layout = info_from_metadata(probe.metadata).layout
    regions = split_parts(layout, parts) if isinstance(parts, int) else check_parts(layout, parts)
    if mode != "r+":
        check_coverage(layout, regions)
    plan = BatchPlan(uuid.uuid4().hex, layout.shape, tuple(regions), now())
    existing = rerun_of(sstore, path, cast(Mode, mode), built, plan)  # other parts refused
    if existing is not None:
        return existing

    held = Lease.acquire(sstore, purpose="batch init", break_stale=break_lease) if leased else None
    try:
        # again under the lease: another init may have created the array meanwhile
        existing = rerun_of(sstore, path, cast(Mode, mode), built, plan)
        if existing is not None:
            return existing
        if mode != "r+":
            keep = {LEASE} if held is not None else set()
            clear_array(sstore, keep, journal_only=mode == "w-")
            zarr.create_array(sstore.store, name=path or None, overwrite=False, **kwargs)
            refresh(Nodes(sstore.store, (path or "",)))  # seen from a consolidated group above
        elif sstore.get(BATCH) is None:
            # stale part records of an earlier batch would count as done
            for name in sstore.list(PARTS):
                sstore.delete(name)
        sstore.put(BATCH, plan.to_bytes())
    finally:
        if held is not None:
            held.release()
    return plan


def _create_kwargs(layout: dict[str, Any], create: dict[str, Any]) -> dict[str, Any]:
    """The ``zarr.create_array`` keywords of the batch's array: ``layout`` and the ``create``
    keywords given (None is zarr's default, but for ``compressors``, where it means none, as
    in write_array; "auto": zstd with its frame checksum, as write_array)."""
    kwargs = dict(layout, zarr_format=3)
    kwargs.update({k: v for k, v in create.items() if v is not None or k == "compressors"})
    wanted = kwargs.get("compressors", "auto")
    if isinstance(wanted, str) and wanted == "auto":
        kwargs["compressors"] = default_compressors()
    return kwargs


def write_part(
    data: Any,
    store: Any,
    part: int,
    *,
    path: str | None = None,
    resume: bool = False,
    lease: bool | None = None,
    break_lease: bool = False,
    lease_expiry: float | None = None,
    storage_options: dict[str, Any] | None = None,
    **write: Any,
) -> WriteReport:
    """Write part ``part`` of an open batch, holding the lease of that part.

    A requeued copy of the same task is refused while the first runs; with ``resume=True`` it
    takes over the lease of a first run that is provably gone (killed, or preempted on another
    node and silent for longer than its lease expiry). Every keyword of the write is checked
    before the part's lease is taken: a refused write leaves the store as it was.

    Parameters
    ----------
    data : numpy.ndarray or dask.array.Array
        The whole array or just that part; may be lazy (dask): only the part's region is
        computed.
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store``, a local path or a URL.
    part : int
        The part to write, ``0 .. nparts - 1`` (e.g. the job-array task's index).
    path : str, optional
        The array's path inside ``store`` (default: its root).
    resume : bool, default False
        Continue an interrupted part, skipping the shards it already stored, and take over the
        part's lease if its holder is provably gone.
    lease : bool, optional
        Hold the part's lease while it is written (default: on where the store can delete, the
        rule of every front end: a zarr ``ZipStore`` is written without, and refuses ``True``
        before anything is written).
    break_lease : bool, default False
        Take over the lease of a writer known to be gone.
    lease_expiry : float, optional
        Seconds without a heartbeat after which this part's lease counts as abandoned (it is
        renewed every quarter of that while the part runs); default
        ``$SHARDWISE_LEASE_EXPIRY`` or 300.
    storage_options : dict, optional
        fsspec options, for a ``store`` given as a URL.
    **write
        :func:`shardwise.write_array` options (``threads``, ``fsync``, ``write_empty_chunks``,
        ``progress``).

    Returns
    -------
    WriteReport
        What the part's write did.

    Raises
    ------
    BatchNotFoundError
        No batch is open for the array.
    InvalidTypeError, InvalidValueError
        A ``part`` that is not an int or not one of the parts, or another keyword refused.
    LeaseHeldError
        The part (or the whole array) is leased by another writer.

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.batch.init(store, shape=(64,), dtype="u1", chunks=16, shards=32, parts=2)
    >>> shardwise.batch.write_part(np.ones(32, "u1"), store, 1).shards_written  # rows 32 to 64
    1
    """
    from ..write.execute import Execution, Target, WriteCall
    from ..write.options import WriteOptions
    from ..write.target import prepare_write

    args.flags(resume=resume, break_lease=break_lease)
    args.optional_flags(lease=lease)
    expiry = check_expiry(lease_expiry)
    if not isinstance(part, int) or isinstance(part, bool):
        raise InvalidTypeError(f"part must be an int, got {part!r} ({type(part).__name__})")
    sstore = _open(store, path, storage_options)
    plan = open_batch(sstore.store, path=path)
    region = plan.region(part)
    shape = tuple(int(n) for n in data.shape)
    if shape == plan.shape and shape != tuple(s.stop - s.start for s in region):
        data = data[region]
    # every keyword of the write checked (once) before the part's lease is taken: a refused
    # write leaves the store as it was
    for name in sorted(set(write) & {"mode", "region", "modes", "verb", "via"}):
        raise InvalidTypeError(
            f"{name!r} is not a keyword of batch.write_part (a part writes its own region of "
            "the batch's array, in mode 'r+')"
        )
    options = WriteOptions.checked(
        via="batch.write_part", path=path, mode="r+", region=region, resume=resume, **write
    )
    prepared = prepare_write(data, sstore.store, options)
    # whether the part holds its lease: the rule of every front end, before anything is written
    target = Target(prepared.write.store.store)
    leased = target.lease(lease, True, prepared.write.store.store)

    def record(report: WriteReport) -> None:
        """The part's record, once its write is done, while its lease is still held (a
        resume that found the part finished keeps its record of this batch as it is)."""
        if report.nothing_to_do and plan.id in recorded_batch(sstore, part):
            return
        done = dict(
            part=part,
            nparts=plan.nparts,
            batch=plan.id,
            finished=now(),
            shards_written=report.shards_written,
            bytes_stored=report.bytes_stored,
        )
        sstore.put(f"{PARTS}{part}.json", json.dumps(done).encode())

    held_part = PartLease(
        part_lease(part, plan.nparts), f"batch part {part} of {plan.nparts}", expiry, record
    )
    call = WriteCall(
        [prepared.write],
        lease=leased,
        break_lease=break_lease,
        progress=options.progress,
        part=held_part,
    )
    with Execution(target, call) as ex:
        report: WriteReport = ex.run(ex.parts())
    held = ex.pipe.sessions[0].lease
    report.notes += [str(t) for t in held.took_over] if held is not None else []
    return report


def finalize(
    store: Any,
    *,
    path: str | None = None,
    threads: int | None = None,
    lease_expiry: float | None = None,
    storage_options: dict[str, Any] | None = None,
) -> VerifyReport:
    """Check that every part finished and the array verifies; then close the batch.

    The leases of parts whose writers are provably gone are taken over and removed (the
    report's notes say which); a part still running refuses the finalize.

    Parameters
    ----------
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store``, a local path or a URL.
    path : str, optional
        The array's path inside ``store`` (default: its root).
    threads : int, optional
        How many shards are verified at a time (default: the cores).
    lease_expiry : float, optional
        Seconds without a heartbeat after which a lease counts as abandoned (default
        ``$SHARDWISE_LEASE_EXPIRY`` or 300).
    storage_options : dict, optional
        fsspec options, for a ``store`` given as a URL.

    Returns
    -------
    VerifyReport
        The verification of the whole array.

    Raises
    ------
    VerifyError
        Parts are missing or anything fails verification (the report is ``.report``); the
        batch stays open so the missing parts can be rerun.
    BatchNotFoundError
        No batch is open for the array.
    LeaseHeldError
        Parts are still running (or died holding a lease that cannot be judged).

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.batch.init(store, shape=(64,), dtype="u1", chunks=16, shards=32, parts=1)
    >>> _ = shardwise.batch.write_part(np.ones(64, "u1"), store, 0)
    >>> shardwise.batch.finalize(store).ok
    True
    """
    from ..storage.nodes import open_info

    threads = args.thread_count("threads", threads)
    expiry = check_expiry(lease_expiry)
    sstore = _open(store, path, storage_options)
    plan = open_batch(sstore.store, path=path)
    took = _clear_dead_parts(sstore, expiry)
    with Lease.acquire(sstore, purpose="batch finalize", takeover=True, expiry=expiry) as held:
        info = open_info(sstore.store, path)
        report = verify_store(
            info, sstore, where=f"{sstore.store}", threads=threads, check_batch=False
        )
        report.notes = [n for n in report.notes if "batch finalize" not in n]  # our own lease
        report.notes += [str(t) for t in took + held.took_over]
        missing = sorted(set(range(plan.nparts)) - set(parts_done(sstore)))
        if missing:
            from ..durability.verify import Problem

            report.problems.insert(
                0,
                Problem(
                    "batch",
                    sstore.key(BATCH),
                    f"{len(missing)} of {plan.nparts} parts not done: {missing}",
                ),
            )
        if not report.ok:
            raise VerifyError(report)
        done = dict(id=plan.id, nparts=plan.nparts, shape=list(plan.shape), finalized=now())
        sstore.put(FINALIZED, json.dumps(done).encode())
        sstore.delete(BATCH)
        for name in sstore.list(PARTS):
            sstore.delete(name)
    return report


def _clear_dead_parts(sstore: ShardStore, expiry: float) -> list[Takeover]:
    """Take over (and drop) the lease of every part whose writer is provably gone; raise
    :class:`LeaseHeldError` for a part still running. The takeovers done."""
    running = [n for n in sstore.list(".shardwise") if n.startswith(f"{LEASE}.part-")]
    # judged all first: a finalize refused for a running part leaves every lease as it was
    holders = {n: read_lease(sstore, n) for n in running}
    live = [n for n, h in holders.items() if h is not None and gone_reason(h, expiry) is None]
    if live:
        raise LeaseHeldError(f"parts still running (or died holding their lease): {live}")
    took: list[Takeover] = []
    for name in running:
        try:
            with Lease.acquire(
                sstore, name=name, purpose="batch finalize", takeover=True, expiry=expiry
            ) as lease:
                took += lease.took_over
        except LeaseHeldError:
            live.append(name)
    if live:
        raise LeaseHeldError(f"parts still running (or died holding their lease): {live}")
    return took
