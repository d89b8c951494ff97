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

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..codec.codecs import crc32c
from ..codec.metadata import ArrayInfo
from ..codec.shard import ShardIndex
from ..core.layout import Coord
from ..engine.staged import STAGED, staged_leftovers
from ..errors import CorruptShardError
from ..runtime import pool as _pool
from ..storage.nodes import group_arrays, open_info
from ..storage.store import JOURNAL, TEMP, ShardStore, describe, store_name
from .journal import (
    BATCH,
    PARTS,
    RECORDS,
    Record,
    read_markers,
    read_records,
)
from .lease import read_lease

MAX_PER_SHARD = 8


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a stored array.

    Attributes
    ----------
    kind : str
        One of ``corrupt`` (index or inner chunk), ``missing`` (recorded, not stored),
        ``mismatch`` (stored bytes differ from the record), ``unrecorded`` (stored, no record) --
        these two are notes, not problems, unless verify is strict -- ``temp`` (temp file left by
        an interrupted write), ``stray`` (not a key of this array), ``incomplete`` (a write that
        did not finish), ``batch`` (a batch not finalized), ``journal`` (an unreadable journal
        object), ``staged`` (encoded pieces of a staged write that did not finish),
        ``metadata``.
    key : str
        The store key concerned.
    message : str
        What is wrong.
    chunk : tuple of int or None
        The inner chunk inside the shard, when the problem is one inner chunk.
    """

    kind: str
    key: str
    message: str
    chunk: tuple[int, ...] | None = None

    def __str__(self) -> str:
        where = self.key + ("" if self.chunk is None else f" chunk {self.chunk}")
        return f"{self.kind:<10} {where}: {self.message}"


@dataclass
class VerifyReport:
    """What :func:`verify` found. ``ok`` is True when there are no problems.

    Attributes
    ----------
    where : str
        The store and path checked.
    shards_stored : int
        Shards found in the store.
    shards_recorded : int or None
        Shards the writer recorded (None: no writer records, e.g. not written by shardwise).
    chunks_checked : int
        Inner chunks decoded.
    bytes_read : int
        Bytes read.
    seconds : float
        Wall time of the check.
    strict : bool
        Whether changes count as problems.
    problems : list of Problem
        Integrity failures (exit status 1 in the CLI).
    changes : list of Problem
        Shards whose bytes are sound but differ from the writer's records or have none (written
        or rewritten by another tool); notes, unless ``strict`` (then they are in ``problems``).
    notes : list of str
        Anything else worth knowing (no records at all, a lease held).
    """

    where: str
    shards_stored: int = 0
    shards_recorded: int | None = None
    chunks_checked: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    strict: bool = False
    problems: list[Problem] = field(default_factory=list)
    changes: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add_change(self, change: Problem) -> None:
        """A shard changed outside the writer's records: a problem when strict, else a note."""
        (self.problems if self.strict else self.changes).append(change)

    @property
    def ok(self) -> bool:
        """True when there are no problems."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """The report as a dict of plain values, ``ok`` included.

        Returns
        -------
        dict
            The fields of the report and ``ok``.
        """
        d = asdict(self)
        d["ok"] = self.ok
        return d

    def to_json(self) -> str:
        """The report as JSON (what ``shardwise verify --json`` prints).

        Returns
        -------
        str
            :meth:`to_dict`, indented.
        """
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        rec = (
            "no writer records"
            if self.shards_recorded is None
            else (f"{self.shards_recorded} recorded")
        )
        head = (
            f"{self.where}: {'OK' if self.ok else f'{len(self.problems)} problem(s)'}; "
            f"{self.shards_stored} shards stored ({rec}), {self.chunks_checked} inner chunks "
            f"decoded, {self.bytes_read / 1e6:.1f} MB read in {self.seconds:.2f} s"
        )
        lines = [head, *(f"  {p}" for p in self.problems[:50])]
        if len(self.problems) > 50:
            lines.append(f"  ... and {len(self.problems) - 50} more")
        if self.changes:
            lines.append(
                f"  note: {len(self.changes)} shard(s) sound but not as the writer recorded them "
                "(written or rewritten by another tool; --strict / strict=True makes these "
                "problems):"
            )
            lines += [f"    {p}" for p in self.changes[:50]]
            if len(self.changes) > 50:
                lines.append(f"    ... and {len(self.changes) - 50} more")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def check_shard(
    info: ArrayInfo, store: ShardStore, name: str, record: Record | None
) -> tuple[list[Problem], Problem | None, int, int]:
    """Integrity problems of one stored shard, its difference from the writer's record (if
    any), the inner chunks decoded and the bytes read."""
    key = store.key(name)
    data = store.get(name)
    if data is None:
        return [Problem("missing", key, "listed but gone when read")], None, 0, 0
    out: list[Problem] = []
    change = None
    if record is not None and (record.size != len(data) or record.crc32c != crc32c(data)):
        change = Problem(
            "mismatch",
            key,
            f"stored object ({len(data)} bytes, crc32c {crc32c(data):#010x}) differs from "
            f"what the writer recorded ({record.size} bytes, crc32c {record.crc32c:#010x}): "
            "rewritten by another tool, or damaged where no checksum covers it",
        )
    codec = info.codec
    mv = memoryview(data)
    try:
        index = ShardIndex.of_shard(codec, mv, key)
    except CorruptShardError as e:
        return [Problem("corrupt", key, e.problem, e.chunk)], change, 0, len(data)
    present = np.flatnonzero(index.stored)
    inner = codec.inner
    decoded = 0
    for flat in present.tolist():
        o, n = (int(v) for v in index.entries[flat])
        chunk = tuple(int(c) for c in np.unravel_index(flat, codec.grid))
        try:
            inner.decode(mv[o : o + n])
        except (ValueError, CorruptShardError) as e:
            bad = [p for p in out if p.kind == "corrupt"]
            if len(bad) < MAX_PER_SHARD:
                out.append(Problem("corrupt", key, f"inner chunk does not decode: {e}", chunk))
            continue
        decoded += 1
    return out, change, decoded, len(data)


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

    records = read_records(store)
    has_records = bool(records) or any(n.startswith(RECORDS) for n in names)
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

    _check_journal(store, report, check_batch)
    report.seconds = time.perf_counter() - started
    return report


def _check_journal(store: ShardStore, report: VerifyReport, check_batch: bool) -> None:
    for name, marker in read_markers(store).items():
        if marker is None:
            report.problems.append(Problem("journal", store.key(name), "unreadable write marker"))
        elif marker.status != "done":
            region = ", ".join(f"{a}:{b}" for a, b in marker.region)
            report.problems.append(
                Problem(
                    "incomplete",
                    store.key(name),
                    f"write {marker.id[:8]} of region [{region}] started {marker.started} did not "
                    "finish: rerun it with resume=True",
                )
            )
    staged: dict[str, int] = {}
    for name in staged_leftovers(store):
        write = name[len(STAGED) :].split("/", 1)[0]
        staged[write] = staged.get(write, 0) + 1
    for write, n in sorted(staged.items()):
        report.problems.append(
            Problem(
                "staged",
                store.key(STAGED + write),
                f"{n} staged pieces of write {write[:8]} left behind: rerun the write with "
                "resume=True to finish it (or delete them)",
            )
        )
    raw = store.get(BATCH)
    if raw is not None and check_batch:
        try:
            nparts = int(json.loads(raw)["nparts"])
        except (ValueError, KeyError, TypeError):
            nparts = -1
        done = len([n for n in store.list(PARTS) if not TEMP.match(n)])
        report.problems.append(
            Problem(
                "batch",
                store.key(BATCH),
                f"batch write not finalized: {done} of {nparts} parts done",
            )
        )
    held = read_lease(store)
    if held is not None:
        report.notes.append(f"write lease held: {held.describe()}")


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
    if group is not None:
        return _verify_group(zstore, path, where, group, threads, strict, progress)
    try:
        info = open_info(zstore, path)
    except Exception as e:  # what zarr raises for a missing or broken zarr.json varies
        rep = VerifyReport(where=where, strict=strict)
        rep.problems.append(Problem("metadata", path or "zarr.json", f"{type(e).__name__}: {e}"))
        return rep
    return verify_store(
        info,
        ShardStore(zstore, path or ""),
        where=where,
        threads=threads,
        strict=strict,
        progress=progress,
    )


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
            info = open_info(zstore, name)
        except UnsupportedCodecError:
            total.notes.append(f"{name}: not sharded, not checked")
            continue
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
