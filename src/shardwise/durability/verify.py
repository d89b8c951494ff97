"""Check a stored sharded array, shard by shard, against itself and against the writer's journal.

For every object under the array:

* a shard: the index (size, checksum, every entry's range inside the data region), then every
  stored inner chunk decodes (its own crc32c where the chain has one), then the object's size
  and crc32c against the record the writer kept (:mod:`shardwise.durability.journal`);
* a recorded shard that is not stored is reported as *missing* (a reader would see fill);
* a temp file of an interrupted write, an open write marker, an unfinished batch, and objects that
  are neither metadata, journal nor a shard key of the grid are reported too.

Integrity (index, ranges, checksums, decoding) and a deleted recorded shard are *problems*. The
writer's records are a second, weaker source: a shard another tool wrote or rewrote (a plain xarray
append, a zarr-python region write) is sound but not what shardwise recorded, so it is reported as
a *note* (``unrecorded`` or ``mismatch``) unless ``strict=True`` makes it a problem. Arrays written
by other tools have no records at all: their shards are checked for integrity only, and the report
says so in its notes.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..codec.metadata import ArrayInfo
from ..core.layout import Coord, Layout
from ..runtime import pool as _pool
from ..storage.nodes import group_arrays, open_info
from ..storage.store import JOURNAL, TEMP, ShardStore, describe, store_name
from .checks import Problem, VerifyReport, _check_journal, check_shard
from .journal import RECORDS, RUNS, WRITES
from .records import read_records
from .shardrecord import Record

# the checks and their report live in checks.py; verify is the walk over an array or a group
__all__ = ["Problem", "VerifyReport", "check_shard", "verify", "verify_store"]


def verify_store(
    info: ArrayInfo,
    store: ShardStore,
    *,
    where: str = "",
    threads: int | None = None,
    check_batch: bool = True,
    strict: bool = False,
    progress: bool = False,
) -> VerifyReport:
    """:func:`verify` on an opened array (``info`` read from its metadata)."""
    started = time.perf_counter()
    report = VerifyReport(where=where or describe(store.store, store.path), strict=strict)
    names, shards = _list_shards(info, store, report)
    records, has_records = _check_records(store, report, names, shards, info.layout)
    _check_shards(info, store, report, shards, records, has_records, threads, progress)
    _check_journal(store, report, check_batch)
    report.seconds = time.perf_counter() - started
    return report


def _list_shards(
    info: ArrayInfo, store: ShardStore, report: VerifyReport
) -> tuple[list[str], dict[str, Coord]]:
    """Every object under the array, and the shards among them by key; temp files and objects
    that are neither metadata, journal nor a shard of the grid go into ``report``."""
    lay = info.layout
    names = store.list("")
    shards: dict[str, Coord] = {}
    for name in names:
        if name == "zarr.json" or name.startswith(JOURNAL + "/"):
            if TEMP.match(name):
                report.problems.append(
                    Problem("temp", store.key(name), "temp file of an interrupted write")
                )
            continue
        if TEMP.match(name):
            report.problems.append(
                Problem("temp", store.key(name), "temp file of an interrupted write")
            )
            continue
        coord = lay.parse_shard_key(name)
        if coord is None:
            report.problems.append(
                Problem("stray", store.key(name), "not metadata, journal or a shard of this grid")
            )
            continue
        shards[name] = coord
    report.shards_stored = len(shards)
    return names, shards


def _check_records(
    store: ShardStore,
    report: VerifyReport,
    names: list[str],
    shards: dict[str, Coord],
    layout: Layout,
) -> tuple[dict[str, Record | None], bool]:
    """The writer's records (and whether there are any): unreadable ones and recorded shards
    that are gone go into ``report``."""
    unreadable: list[str] = []
    records = read_records(store, unreadable, layout)
    has_records = bool(records) or any(n.startswith((RECORDS, RUNS)) for n in names)
    for name in unreadable:
        report.problems.append(Problem("journal", store.key(name), "unreadable run record"))
    if has_records:
        report.shards_recorded = sum(r is not None for r in records.values())
    else:
        report.notes.append(
            "no writer records (not written by shardwise, or nothing stored): "
            "shards checked for integrity only"
        )
    for name, rec in records.items():
        if rec is None:
            report.problems.append(
                Problem("journal", store.key(RECORDS + name), "unreadable shard record")
            )
        elif name not in shards:
            report.problems.append(
                Problem(
                    "missing",
                    store.key(name),
                    f"the writer stored this shard ({rec.size} bytes, write {rec.write[:8]}) "
                    "but it is gone: readers would see fill values",
                )
            )
    return records, has_records


def _check_shards(
    info: ArrayInfo,
    store: ShardStore,
    report: VerifyReport,
    shards: dict[str, Coord],
    records: dict[str, Record | None],
    has_records: bool,
    threads: int | None,
    progress: bool,
) -> None:
    """Every shard checked (``threads`` at a time), what they show added to ``report``."""

    def one(name: str) -> tuple[list[Problem], Problem | None, int, int]:
        return check_shard(info, store, name, records.get(name))

    nthreads = max(1, threads or _pool.cpu_count())
    bar = None
    if progress:
        from ..engine.progress import ShardBar

        bar = ShardBar(len(shards), desc="verify", what="read")
    results = []
    try:
        with ThreadPoolExecutor(nthreads) as pool:
            for got in pool.map(one, sorted(shards)):
                results.append(got)
                if bar is not None:
                    bar.step(1, got[3])
    finally:
        if bar is not None:
            bar.close()
    for name, (probs, change, decoded, nbytes) in zip(sorted(shards), results, strict=True):
        report.problems.extend(probs)
        report.chunks_checked += decoded
        report.bytes_read += nbytes
        if change is not None:
            report.add_change(change)
        if has_records and name not in records:
            report.add_change(
                Problem(
                    "unrecorded",
                    store.key(name),
                    "stored, but the writer has no record of it (written by another tool)",
                )
            )


def verify(
    store: Any,
    *,
    path: str | None = None,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
    strict: bool = False,
    progress: bool = False,
) -> VerifyReport:
    """Check every shard of the array at ``path`` in ``store``; see :class:`VerifyReport`.

    Reads every stored shard whole and decodes every inner chunk (checksums checked). Never
    raises for what it finds: look at ``report.ok`` and ``report.problems``. Shards that are
    sound but not as shardwise recorded them (another tool wrote them) are in
    ``report.changes``, as notes. A group is checked array by array.

    Parameters
    ----------
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store``, a local path or a URL.
    path : str, optional
        The array (or group) inside ``store`` (default: its root).
    threads : int, optional
        How many shards are checked at a time (default: the cores).
    storage_options : dict, optional
        fsspec options, for a ``store`` given as a URL.
    strict : bool, default False
        Count shards changed outside the writer's records as problems, not notes.
    progress : bool, default False
        Show a bar over the shards checked (one per array of a group).

    Returns
    -------
    VerifyReport
        What was found; ``ok`` is True when there are no problems.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A keyword of the wrong type, or a value it does not accept.

    Examples
    --------
    >>> import tempfile, numpy as np, shardwise
    >>> path = tempfile.mkdtemp() + "/a.zarr"
    >>> _ = shardwise.write_array(np.ones((64, 64), "u1"), path, chunks=(16, 16), shards=(32, 32))
    >>> with open(path + "/c/0/1", "r+b") as f:  # damage one shard
    ...     _ = f.write(b"garbage")
    >>> report = shardwise.verify(path)
    >>> report.ok, len(report.problems)
    (False, 1)
    """
    from ..core import args
    from ..storage.store import resolve_store

    args.optional_str("path", path)
    threads = args.thread_count("threads", threads)
    args.mapping("storage_options", storage_options)
    args.flags(strict=strict, progress=progress)
    zstore = resolve_store(store, mode="r", storage_options=storage_options)
    where = store_name(zstore) + (f" path {path!r}" if path else "")
    group = group_arrays(zstore, path)
    unfinished = _journals_without_metadata(zstore, path)
    if group is not None or unfinished:
        report = _verify_group(zstore, path, where, group or [], threads, strict, progress)
        for name in unfinished:
            _check_unfinished(zstore, name, report)
        return report
    try:
        info, note = _array_info(zstore, path)
    except Exception as e:  # what zarr raises for a missing or broken zarr.json varies
        rep = VerifyReport(where=where, strict=strict)
        rep.problems.append(Problem("metadata", path or "zarr.json", f"{type(e).__name__}: {e}"))
        return rep
    report = verify_store(
        info,
        ShardStore(zstore, path or ""),
        where=where,
        threads=threads,
        strict=strict,
        progress=progress,
    )
    report.notes[:0] = [note] if note else []
    return report


UNSHARDED = (
    "not sharded: each chunk object checked as a shard of one chunk (decoded, its checksums "
    "checked); `shardwise convert` shards the array"
)


def _array_info(zstore: Any, path: str | None) -> tuple[ArrayInfo, str | None]:
    """The array's :class:`ArrayInfo`; an unsharded Zarr v3 array's chunks as shards of one
    chunk each, with the note saying so."""
    from ..codec.metadata import unsharded_info
    from ..errors import UnsupportedCodecError
    from ..storage.nodes import open_zarr_array

    try:
        return open_info(zstore, path), None
    except UnsupportedCodecError:
        info = unsharded_info(open_zarr_array(zstore, path).metadata)
        if info is None:
            raise
        return info, UNSHARDED


def _journals_without_metadata(zstore: Any, path: str | None) -> list[str]:
    """Paths below ``path`` whose journal holds write markers but which have no metadata yet:
    an array write stores its metadata after its data (xarray's variables, a replaced array),
    so one interrupted before that leaves only its journal and shards. One listing."""
    base = (path or "").strip("/")
    keys = set(ShardStore(zstore, base).list(""))
    marker = f"{WRITES}"
    found = set()
    for k in keys:
        head, sep, _ = k.partition(marker)
        if sep and (head == "" or head.endswith("/")):
            found.add(head.rstrip("/"))
    return sorted(
        "/".join(p for p in (base, h) if p)
        for h in found
        if (f"{h}/zarr.json" if h else "zarr.json") not in keys
    )


def _check_unfinished(zstore: Any, name: str, report: VerifyReport) -> None:
    """The journal of an array whose write never stored its metadata, into ``report``."""
    found = VerifyReport(where=name)
    _check_journal(ShardStore(zstore, name), found, check_batch=True)
    if not found.problems:  # only finished markers: the metadata went missing since
        found.problems.append(
            Problem(
                "metadata",
                f"{name}/zarr.json" if name else "zarr.json",
                "the journal records a write here but the array's metadata is gone",
            )
        )
    report.problems += found.problems
    report.notes += [f"{name or '/'}: {n}" for n in found.notes]


def _verify_group(
    zstore: Any,
    path: str | None,
    where: str,
    arrays: list[str],
    threads: int | None,
    strict: bool = False,
    progress: bool = False,
) -> VerifyReport:
    """Verify every sharded array of a group (e.g. an xarray Dataset) into one report."""
    from ..errors import UnsupportedCodecError

    started = time.perf_counter()
    total = VerifyReport(where=where, strict=strict)
    recorded = 0
    any_records = False
    for name in arrays:
        try:
            info, note = _array_info(zstore, name)
        except UnsupportedCodecError:
            total.notes.append(f"{name}: not sharded, not checked")
            continue
        total.notes += [f"{name}: {note}"] if note else []
        rep = verify_store(
            info,
            ShardStore(zstore, name),
            where=name,
            threads=threads,
            strict=strict,
            progress=progress,
        )
        total.shards_stored += rep.shards_stored
        total.chunks_checked += rep.chunks_checked
        total.bytes_read += rep.bytes_read
        total.problems += rep.problems
        total.changes += rep.changes
        total.notes += [f"{name}: {n}" for n in rep.notes]
        if rep.shards_recorded is not None:
            any_records = True
            recorded += rep.shards_recorded
    total.shards_recorded = recorded if any_records else None
    total.seconds = time.perf_counter() - started
    return total
