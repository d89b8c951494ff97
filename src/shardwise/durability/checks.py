"""The checks of :func:`~shardwise.durability.verify.verify`: one stored shard against itself
and the writer's record (:func:`check_shard`), the journal's state (open markers, staged pieces
left behind, an unfinished batch, a held lease), and what they find (:class:`Problem`,
:class:`VerifyReport`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..codec.codecs import crc32c
from ..codec.metadata import ArrayInfo
from ..codec.shard import ShardIndex
from ..core.cost import counted
from ..engine.staged import STAGED, staged_leftovers
from ..errors import CorruptShardError
from ..storage.store import TEMP, ShardStore
from .appending import APPENDING, AppendRecord, Survey, survey
from .journal import BATCH, PARTS, WriteMarker, read_markers
from .lease import read_lease
from .shardrecord import Record

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

    Examples
    --------
    >>> import tempfile, numpy as np, shardwise
    >>> path = tempfile.mkdtemp() + "/a.zarr"
    >>> _ = shardwise.write_array(np.ones((64, 64), "u1"), path, chunks=(16, 16), shards=(32, 32))
    >>> with open(path + "/c/0/1", "r+b") as f:  # damage one shard
    ...     _ = f.write(b"garbage")
    >>> [(p.kind, p.key) for p in shardwise.verify(path).problems]
    [('corrupt', 'c/0/1')]
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

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_array(np.ones((64, 64), "u1"), store, chunks=(16, 16), shards=(32, 32))
    >>> report = shardwise.verify(store)
    >>> report.ok, report.shards_stored, report.chunks_checked
    (True, 4, 16)
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
            f"{self.where}: {'OK' if self.ok else counted(len(self.problems), 'problem')}; "
            f"{counted(self.shards_stored, 'shard')} stored ({rec}), "
            f"{counted(self.chunks_checked, 'inner chunk')} decoded, "
            f"{self.bytes_read / 1e6:.1f} MB read in {self.seconds:.2f} s"
        )
        lines = [head, *(f"  {p}" for p in self.problems[:50])]
        if len(self.problems) > 50:
            lines.append(f"  ... and {len(self.problems) - 50} more")
        if self.changes:
            lines.append(
                f"  note: {counted(len(self.changes), 'shard')} sound but not what the writer "
                "recorded (written or rewritten by another tool; problems with --strict / "
                "strict=True):"
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
    any, and only for a sound shard: a corrupt one is a problem, never also "sound but not as
    the writer recorded it"), the inner chunks decoded and the bytes read."""
    key = store.key(name)
    data = store.get(name)
    if data is None:
        return [Problem("missing", key, "listed but gone when read")], None, 0, 0
    out: list[Problem] = []
    change = None
    if record is not None and not record.holds(data):
        change = Problem(
            "mismatch",
            key,
            f"stored object ({len(data)} bytes, crc32c {crc32c(data):#010x}) differs from "
            f"what the writer recorded ({record.describe()}): "
            "rewritten by another tool, or damaged where no checksum covers it",
        )
    coord = info.layout.parse_shard_key(name)
    codec = info.codec if coord is None else info.shard_codec(coord)
    mv = memoryview(data)
    try:
        index = ShardIndex.of_shard(codec, mv, key)
    except CorruptShardError as e:
        return [Problem("corrupt", key, e.problem, e.chunk)], None, 0, len(data)
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
    return out, None if out else change, decoded, len(data)


def _advice(marker: WriteMarker, parts: list[list[list[int]]]) -> str:
    """The call that finishes an unfinished write (``parts``: the regions of an open batch's
    parts, whose writes are rerun as parts)."""
    part = next((i for i, r in enumerate(parts) if marker.inside(r)), None)
    if part is not None and not marker.append:
        return (
            f"batch part {part} stopped: rerun it with --resume (shardwise batch part <store> "
            f"--source <source> --part {part} --resume; in Python, batch.write_part(<source>, "
            f"<store>, {part}, resume=True)), which skips the shards it stored"
        )
    if not marker.append:
        return "rerun it with resume=True"
    if marker.append.get("call") == "stream":
        return (
            "a stream that stopped before close(): reopen it with shardwise.stream(<the same "
            "store, path and layout>, resume=True), which keeps every stored frame"
        )
    dim, axis = marker.append.get("dim"), int(marker.append.get("axis", 0))
    a, b = marker.region[axis]
    call = append_call(str(marker.append.get("call", "to_zarr")), str(dim), axis)
    return (
        f"an append of rows {a}:{b} along {dim!r} (those not written read as fill values): "
        f"rerun it with resume=True, {call}, which writes them there and adds no rows"
    )


def append_call(call: str, dim: str, axis: int) -> str:
    """The call that finishes an append of ``call`` (``to_zarr``: by dimension name;
    ``write_array``: by axis)."""
    if call == "write_array":
        return f"write_array(<the same data, store and path>, append_dim={axis}, resume=True)"
    return f"to_zarr(<the same data>, append_dim={dim!r}, resume=True)"


def _batch_parts(raw: bytes | None) -> list[list[list[int]]]:
    """The regions of an open batch's parts, as its record stores them (none: no batch, or a
    record that cannot be read, which the batch check reports)."""
    try:
        return [[[int(a), int(b)] for a, b in r] for r in json.loads(raw or b"{}")["regions"]]
    except (ValueError, KeyError, TypeError):
        return []


def _check_journal(store: ShardStore, report: VerifyReport, check_batch: bool) -> None:
    raw = store.get(BATCH)
    parts = _batch_parts(raw)
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
                    f"finish: {_advice(marker, parts)}",
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
    _check_appending(store, report)


def _check_appending(store: ShardStore, report: VerifyReport) -> None:
    """The records of appends about to reserve rows (durability/appending.py): one whose writer
    is gone stopped before its markers named its rows, if it reserved any."""
    found = survey(store) if store.list(APPENDING) else None
    if found is None:
        return
    for name in found.unreadable:
        report.problems.append(Problem("journal", store.key(name), "unreadable append record"))
    for rec in found.running:
        report.notes.append(
            f"append {rec.id[:8]} of {rec.rows} rows along {rec.dim!r} reserving its rows now"
        )
    for name, rec in found.stale:
        report.problems.append(
            Problem(
                "incomplete",
                store.key(name),
                f"append {rec.id[:8]} started {rec.started} did not finish: "
                f"{_reserved(found, rec)}",
            )
        )


def _reserved(found: Survey, rec: AppendRecord) -> str:
    """What a killed append's record says, and the call that finishes it."""
    call = append_call(rec.call, rec.dim, rec.axis)
    verdict = found.judge(rec)
    a, b = found.block(rec)
    if verdict == "reserved":
        return (
            f"an append of rows {a}:{b} along {rec.dim!r} (reserved, never written: "
            f"they read as fill values): rerun it with resume=True, {call}, which writes them "
            "there and adds no rows"
        )
    if verdict == "nothing":
        return (
            f"an append of {rec.rows} rows along {rec.dim!r} stopped before it reserved them "
            f"(nothing of it is stored): rerun it with resume=True, {call}, which appends them once"
        )
    spans = ", ".join(f"{x}:{y}" for x, y in found.unnamed(rec))
    if verdict == "reserving":
        return (
            f"an append of {rec.rows} rows along {rec.dim!r} stopped before it named the rows "
            f"it reserved, if any (rows {a}:{b}), and another append, still running, claims "
            f"rows there: rerun it with resume=True, {call}, once that append is done"
        )
    return (
        f"an append of {rec.rows} rows along {rec.dim!r} stopped before it named the rows it "
        f"reserved, if any; rows {spans} along {rec.dim!r} are named by no write, and whether "
        f"rows {a}:{b} are its own cannot be told (another killed append claims rows there, or "
        "no row of them can be read apart from earlier rows, and other rows there are nobody's "
        f"append's): rerun with resume=True, {call}, appends its rows again"
    )
