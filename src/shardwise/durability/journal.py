"""The writer's journal: what a write intends and what it stored, kept next to the array.

Everything lives under ``.shardwise/`` inside the array (zarr-python and tensorstore ignore keys
that are not metadata or chunk keys):

``.shardwise/shards/<shard key>``
    one record per stored shard, written by the task that stored it, right after the shard:
    the id of the write, the object size, the crc32c of the whole object and of its index (a
    shard a range merge built: the ranges the merge wrote and their crc32c instead of the
    whole object's, see :mod:`shardwise.durability.shardrecord`).
    A task that finds its shard empty removes the record. The records are the expected shard
    set that :func:`shardwise.verify` checks (a deleted shard is reported, not read as fill).
``.shardwise/runs/<write id>-<token>.json``
    the records of a run of shards (engine/runs.py) of a write that creates its array: one
    object per task instead of one per shard (a million shards, a million fewer objects). The
    task puts it again, whole, every :data:`RUN_FLUSH` shards and when it ends or fails, so a
    task killed outright loses the records of at most ``RUN_FLUSH - 1`` shards, which a resume
    writes again. A shard's own record, where one exists, is newer than any run's (run records
    come only from writes that created the array, after its journal was cleared): it wins.
``.shardwise/writes/<region digest>.json``
    one marker per write region: ``open`` while the write runs, ``done`` when every shard task
    finished. An open marker is an interrupted write; ``resume=True`` adopts its id and skips
    the shards whose record carries that id and still matches the object. The marker of an
    append (``to_zarr(append_dim=...)``) also names the dimension and axis it appends along
    (``append``): its region is where the rows it reserved go, written before any of them, so
    that ``resume=True`` finishes those rows rather than appending again. An append that gives
    its rows back removes its markers (nothing is left to finish).
``.shardwise/appending/<token>.json``
    the record of an append about to reserve its rows (the lead array's): see
    :mod:`shardwise.durability.appending`.
``.shardwise/lease``, ``.shardwise/leases/`` and ``.shardwise/batch.json``
    see :mod:`shardwise.durability.lease` and :mod:`shardwise.batch.run`.
``.shardwise/locks/<shard key>``
    local files: the lock files of shards committed conditionally
    (:mod:`shardwise.storage.conditional`).

A record follows its shard, so a writer killed between the two leaves a shard without a (current)
record: it is rewritten on resume, and reported by verify until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import math
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from zarr.core.sync import sync

from ..core.cost import RUN_FLUSH
from ..core.layout import Layout, Region
from ..storage.conditional import UNCHECKED, commit_beside
from ..storage.store import JOURNAL, TEMP, ShardStore
from .shardrecord import Record, stored_matches
from .shardrecord import object_crc32c as object_crc32c  # its callers' name for it

RECORDS = f"{JOURNAL}/shards/"
RUNS = f"{JOURNAL}/runs/"
WRITES = f"{JOURNAL}/writes/"
BATCH = f"{JOURNAL}/batch.json"
LEASE = f"{JOURNAL}/lease"  # and lease.part-I-of-N: see shardwise.durability.lease
PARTS = f"{JOURNAL}/parts/"
IO_THREADS = 8


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


# -- per-shard records ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Journal:
    """The part of the journal a shard task writes; travels to the workers with the writer.
    The engine's :class:`~shardwise.engine.recorder.ShardRecorder`."""

    store: ShardStore
    write_id: str
    index_nbytes: int
    index_at_end: bool
    # a rectilinear grid: each shard's index has its own size (None: every shard's is alike)
    layout: Layout | None = None

    def index_size(self, key: str) -> int:
        """The index size of shard ``key`` (16 bytes per inner chunk, plus the crc32c's 4)."""
        lay = self.layout
        coord = None if lay is None or lay.is_regular else lay.parse_shard_key(key)
        if coord is None or lay is None:
            return self.index_nbytes
        return 16 * math.prod(lay.chunks_per_shard_at(coord)) + self.index_nbytes % 16

    def record(self, key: str, parts: Sequence[Any] | None, generation: Any = UNCHECKED) -> None:
        """Record the shard stored as ``parts`` (None: forget a removed or empty shard).

        ``generation``: that of a conditional commit of a shard other writers may share. The
        record is then written only while the shard is still that commit's, so the last commit's
        record is the one that stays.
        """
        data = None
        if parts is not None:
            rec = Record.of(self.write_id, parts, self.index_size(key), self.index_at_end)
            data = rec.to_bytes()
        commit_beside(self.store, RECORDS + key, data, owner=key, generation=generation)

    def record_spliced(self, key: str, segments: Sequence[Any], generation: Any) -> None:
        """Record the shard a range merge built from ``segments`` (ranges copied from the
        shard it replaced, and the parts it wrote) and committed as ``generation``: a
        ``"spliced"`` record (:class:`~.shardrecord.Record`), kept as :meth:`record` keeps
        one."""
        rec = Record.spliced_of(self.write_id, segments, self.index_size(key), self.index_at_end)
        commit_beside(self.store, RECORDS + key, rec.to_bytes(), owner=key, generation=generation)

    def record_object(self, key: str, size: int, crc: int, index_crc: int) -> None:
        """Record a shard whose checksums its commit computed while it streamed the object."""
        self.store.put(RECORDS + key, Record(self.write_id, size, crc, index_crc).to_bytes())

    def for_run(self) -> RunRecords:
        """A run's recorder: its records in one object (:class:`RunRecords`)."""
        return RunRecords(self, uuid.uuid4().hex[:16])

    def flush(self) -> None:
        """Nothing: every record is put when it is made."""

    def matches(self, key: str, runs: dict[str, Record] | None = None) -> bool:
        """True when ``key`` holds exactly the object this write recorded for it (its own
        record, else the one in ``runs``: :func:`~.records.read_run_records` of this write).

        Size and crc32c of the whole object: the index alone can coincide between two shards
        whose inner chunks happen to compress to the same sizes. A spliced shard's record: size
        and the crc32c of the ranges its merge wrote, the index among them
        (:func:`~.shardrecord.stored_matches`).
        """
        raw = self.store.get(RECORDS + key)
        rec = None if raw is None else Record.from_bytes(raw)
        if rec is None and runs is not None:
            rec = runs.get(key)
        if rec is None or rec.write != self.write_id:
            return False
        return stored_matches(self.store, key, rec)


class RunRecords:
    """A run's recorder (engine/runs.py): the records of the shards one task writes, put as one
    object (:data:`RUNS`) every :data:`RUN_FLUSH` shards and by :meth:`flush` when the task
    ends. Only for unconditional records (a write that creates its array); a shard committed
    conditionally is recorded on its own, as :meth:`Journal.record` does."""

    def __init__(self, journal: Journal, token: str) -> None:
        self.journal = journal
        self.name = f"{RUNS}{journal.write_id}-{token}.json"
        self.records: dict[str, list[int]] = {}
        self.unflushed = 0

    @property
    def write_id(self) -> str:
        return self.journal.write_id

    def record(self, key: str, parts: Sequence[Any] | None, generation: Any = UNCHECKED) -> None:
        if generation is not UNCHECKED:
            self.journal.record(key, parts, generation)
            return
        if parts is None:
            # an empty shard: stored nowhere, recorded nowhere (a create wrote no other record)
            if self.records.pop(key, None) is None:
                return
        else:
            j = self.journal
            rec = Record.of(j.write_id, parts, j.index_size(key), j.index_at_end)
            assert rec.crc32c is not None  # a whole object's record
            self.records[key] = [rec.size, rec.crc32c, rec.index_crc32c]
        self.unflushed += 1
        if self.unflushed >= RUN_FLUSH:
            self.flush()

    def record_spliced(self, key: str, segments: Sequence[Any], generation: Any) -> None:
        self.journal.record_spliced(key, segments, generation)  # conditional: its own record

    def record_object(self, key: str, size: int, crc: int, index_crc: int) -> None:
        self.records[key] = [size, crc, index_crc]
        self.unflushed += 1
        if self.unflushed >= RUN_FLUSH:
            self.flush()

    def matches(self, key: str) -> bool:
        return self.journal.matches(key)

    def for_run(self) -> RunRecords:
        return self

    def flush(self) -> None:
        """Put the run's records, whole (nothing when none changed since the last put)."""
        if not self.unflushed:
            return
        doc = {"write": self.write_id, "at": now(), "records": self.records}
        self.journal.store.put(self.name, _json(doc))
        self.unflushed = 0


# -- write markers --------------------------------------------------------------------------------


def region_list(region: Region) -> list[list[int]]:
    return [[int(s.start), int(s.stop)] for s in region]


def marker_name(region: Region) -> str:
    digest = hashlib.sha1(_json(region_list(region))).hexdigest()[:16]
    return f"{WRITES}{digest}.json"


@dataclass(frozen=True)
class WriteMarker:
    """One write of one region: ``open`` while it runs, ``done`` once every shard task finished."""

    id: str
    region: list[list[int]]
    shape: list[int]
    status: str
    started: str
    finished: str | None = None
    # an append's: {"dim": name, "axis": i}; the rows it reserved are region[i]
    append: dict[str, Any] | None = None

    def to_bytes(self) -> bytes:
        d = asdict(self)
        if d["append"] is None:
            del d["append"]  # the stored form of every other write is unchanged
        return _json(d)

    @classmethod
    def from_bytes(cls, data: bytes) -> WriteMarker | None:
        try:
            d = json.loads(data)
            return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})
        except (ValueError, TypeError):
            return None

    def inside(self, region: list[list[int]]) -> bool:
        pairs = zip(self.region, region, strict=True)
        return all(a >= lo and b <= hi for (a, b), (lo, hi) in pairs)


def read_marker(store: ShardStore, region: Region) -> WriteMarker | None:
    raw = store.get(marker_name(region))
    return None if raw is None else WriteMarker.from_bytes(raw)


def appends_of(store: ShardStore, dim: str, status: str) -> list[WriteMarker]:
    """The markers of appends along ``dim`` in the array at ``store`` with ``status``, first
    rows first."""
    found = [
        m
        for m in read_markers(store).values()
        if m is not None and m.status == status and m.append and m.append.get("dim") == dim
    ]
    return sorted(found, key=lambda m: m.region[int(m.append["axis"])] if m.append else [0])


def read_markers(store: ShardStore) -> dict[str, WriteMarker | None]:
    out: dict[str, WriteMarker | None] = {}
    for name in store.list(WRITES):
        if TEMP.match(name):
            continue
        raw = store.get(name)
        out[name] = None if raw is None else WriteMarker.from_bytes(raw)
    return out


# -- leftovers of interrupted writes --------------------------------------------------------------


def temp_target(name: str) -> str | None:
    """The key a temp file was going to become (zarr's stem form gives the stem), or None."""
    m = TEMP.match(name)
    return None if m is None else m.group("base")


def _hex(name: str) -> str:
    m = TEMP.match(name)
    return "" if m is None else m.group("hex")


def remove_temp_files(
    store: ShardStore, keys: set[str] | None = None, *, tag: str = ""
) -> list[str]:
    """Delete the temp files of interrupted local writes (only those aimed at ``keys`` if given,
    only those whose hex part starts with ``tag``: one writer's, see ``ShardStore.tag``).

    With ``keys`` only their directories are listed. Returns the names removed. Other stores
    write objects whole, so they have none.
    """
    root = store.local_root
    if root is None:
        return []
    names = store.list("") if keys is None else _temp_names(store, root, keys)
    removed = []
    for name in names:
        base = temp_target(name)
        if base is None or not _hex(name).startswith(tag):
            continue
        if keys is not None and base not in keys and f"{base}.json" not in keys:
            continue
        try:
            os.unlink(root / store.key(name))
        except FileNotFoundError:
            continue
        removed.append(name)
    return removed


def remove_run_temps(store: ShardStore, write_id: str) -> list[str]:
    """Delete the temp files of this write's interrupted run-record puts
    (``.shardwise/runs/<write id>-<token>.json``): their names are random, so no list of the
    keys a write may put names them. Returns the names removed (local stores only)."""
    root = store.local_root
    if root is None:
        return []
    mine, removed = f"{RUNS}{write_id}-", []
    for name in store.list(RUNS):
        base = temp_target(name)
        if base is None or not base.startswith(mine):
            continue
        try:
            os.unlink(root / store.key(name))
        except FileNotFoundError:
            continue
        removed.append(name)
    return removed


def _temp_names(store: ShardStore, root: Path, keys: set[str]) -> list[str]:
    """The temp files in the directories of ``keys`` (a write's shards and records: a listing
    per directory, none under a directory found missing, e.g. the records of a write that
    recorded its shards in run objects)."""
    names: list[str] = []
    top = os.fspath(root)
    missing: set[str] = set()
    for d in sorted({k.rpartition("/")[0] for k in keys}):
        up = d.split("/")
        if missing and any("/".join(up[:i]) in missing for i in range(1, len(up))):
            continue
        try:
            # store.key, not store.path: a path given as "/grp/arr" must stay inside root
            entries = os.listdir(os.path.join(top, store.key(d)))
        except (FileNotFoundError, NotADirectoryError):
            while len(up) > 1 and not os.path.isdir(
                os.path.join(top, store.key("/".join(up[:-1])))
            ):
                up.pop()  # the highest missing directory above it: none under it is listed
            missing.add("/".join(up))
            continue
        names += [f"{d}/{e}" if d else e for e in entries if TEMP.match(e)]
    return names


def clear_array(store: ShardStore, keep: set[str], *, journal_only: bool = False) -> None:
    """Delete what is stored under the array path except the names in ``keep`` and any lease.

    ``journal_only`` limits this to the journal (stale records and markers before a create).
    Used instead of zarr's ``overwrite=True``, which would also delete the leases.
    """
    root = store.local_root
    if root is not None:
        # store.key(""): the array path without its slashes; root / "/grp/arr" would be an
        # absolute path outside the store (a write with mode="w" would clear that directory)
        top = root / store.key("")
        if not top.is_dir():
            return
        for entry in top.iterdir():
            if entry.name == JOURNAL:
                _clear_local(entry, {top / k for k in keep}, top / LEASE)
            elif not journal_only:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink(missing_ok=True)
        return
    names = store.list(JOURNAL + "/" if journal_only else "")
    doomed = [n for n in names if n not in keep and not n.startswith(LEASE)]
    zstore = store.store

    async def go() -> None:
        await asyncio.gather(*(zstore.delete(store.key(n)) for n in doomed))

    if doomed:
        sync(go())


def _clear_local(top: Path, keep: set[Path], lease: Path) -> None:
    for d, dirs, files in os.walk(top, topdown=False):
        for f in files:
            p = Path(d) / f
            if p not in keep and not str(p).startswith(str(lease)):
                p.unlink(missing_ok=True)
        for sub in dirs:
            with contextlib.suppress(OSError):
                (Path(d) / sub).rmdir()
