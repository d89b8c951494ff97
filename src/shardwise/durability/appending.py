"""An append's word before it reserves its rows: ``.shardwise/appending/<token>.json``.

An append (``to_zarr(append_dim=...)``, :mod:`shardwise.xarray.appends`) grows its lead array's
length by a conditional commit of ``zarr.json``, and only then puts the write markers that name
the rows that commit gave it. The two are separate objects: a writer killed between them would
leave rows in the lead's length that nothing names, and a resume would append again.

So before that commit the append puts a *record* in the lead array's journal: its token (the id
its markers carry), the dimension and axis, the region it planned (as many rows, the extent of
every other dimension), its holder (the process, as a lease's) and ``seen``, the lead's length
read just before: the rows its commit takes start there or later. Once its markers are put the
record is removed. A record whose token some marker of the lead carries is *settled* (its
markers speak for it: the writer died before it removed the record).

An unsettled record whose holder is gone (:func:`holder_may_run`) is an append killed before its
markers: either before its commit (nothing reserved) or after it (rows reserved, unnamed). The
rows no marker of the lead names, from ``seen`` to the lead's end (:func:`unnamed`), tell which:
when no unsettled record of a writer still running is there (it may be between its own commit
and markers) and they are whole blocks of the record's row count, no more than the killed
appends there can have reserved, the first block is a killed append's (which one of several of
this shape does not matter: they are finished first rows first); anything else reserved there
was named first. Rows before ``seen`` are never
looked at, so arrays written before markers existed are read right.

Another tool may append without markers (xarray's own ``to_zarr``): its rows are unnamed too,
but they hold its values, where a killed append's reserved rows hold none (no data is written
before the markers). So a block is a killed append's only when no shard wholly inside it holds
values (:meth:`Survey.killed_rows`, :func:`holds_values`), and when the first unnamed rows
after ``seen`` hold values the killed append reserved nothing (:meth:`Survey.foreign_first`):
its reserved rows would come first.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..storage.store import JOURNAL, TEMP, ShardStore
from .holder import LeaseInfo, gone_reason
from .journal import WriteMarker, now, read_markers
from .lease import shared_leases

APPENDING = f"{JOURNAL}/appending/"


@dataclass(frozen=True)
class AppendRecord:
    """One append about to reserve its rows in the lead array (see the module docstring)."""

    id: str  # the append's token, the "id" of its markers' ``append``
    dim: str
    axis: int
    region: list[list[int]]  # as planned: region[axis] gives the row count, the rest the extents
    seen: int  # the lead's length before its commit: its rows start there or later
    holder: dict[str, Any]
    started: str

    @classmethod
    def new(
        cls, token: str, dim: str, axis: int, region: list[list[int]], seen: int, holder: Any
    ) -> AppendRecord:
        return cls(token, dim, axis, region, seen, holder, now())

    @property
    def rows(self) -> int:
        a, b = self.region[self.axis]
        return int(b) - int(a)

    def name(self) -> str:
        return f"{APPENDING}{self.id}.json"

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> AppendRecord | None:
        try:
            d = json.loads(data)
            rec = cls(**{k: d[k] for k in cls.__dataclass_fields__})
            return rec if rec.rows >= 0 else None
        except (ValueError, KeyError, TypeError, IndexError):
            return None

    def fits(self, dim: str, axis: int, region: list[list[int]]) -> bool:
        """Whether this is an append of ``region``'s shape along ``dim`` (axis ``axis``): as
        many rows, the same extent in every other dimension."""
        if (self.dim, self.axis, len(self.region)) != (dim, axis, len(region)):
            return False
        same = all(
            list(r) == list(q)
            for i, (r, q) in enumerate(zip(self.region, region, strict=True))
            if i != axis
        )
        return same and self.rows == region[axis][1] - region[axis][0]


def read_appending(store: ShardStore) -> dict[str, AppendRecord | None]:
    """Every append record of the array at ``store`` (None for an unreadable one), by name."""
    out: dict[str, AppendRecord | None] = {}
    for name in store.list(APPENDING):
        if not TEMP.match(name):
            raw = store.get(name)
            out[name] = None if raw is None else AppendRecord.from_bytes(raw)
    return out


def holder_may_run(store: ShardStore, raw: Any) -> bool:
    """Whether the append whose holder is ``raw`` (as its marker or record keeps it) may still be
    running in the array at ``store``. On its own host its process decides; from another, a
    holder counts as gone once no shared lease of that process on the array was renewed within
    the lease expiry, as for lease takeovers."""
    try:
        holder = LeaseInfo(**raw) if isinstance(raw, dict) else None
    except TypeError:
        holder = None
    if holder is None:
        return False  # no holder recorded: nothing to wait for
    if gone_reason(holder) is None:
        return True
    same = [
        info
        for info in shared_leases(store).values()
        if (info.host, info.pid, info.started) == (holder.host, holder.pid, holder.started)
    ]
    return any(gone_reason(info) is None for info in same)


@dataclass(frozen=True)
class Survey:
    """The lead array's state for its append records, read in the order that makes it safe: its
    length, then its markers, then its records (a writer between its commit and its markers,
    seen in the length but not in the markers, still has its record when they are listed)."""

    length: list[int]
    markers: list[WriteMarker]
    stale: list[tuple[str, AppendRecord]]  # unsettled, their writers gone
    running: list[AppendRecord]  # unsettled, their writers may still run
    settled: list[str]  # names of records whose markers are there
    unreadable: list[str]  # names of records that do not parse
    # whether rows along an axis hold values (:func:`holds_values` of the lead array, each
    # stretch read once however many questions ask about it)
    holds: Callable[[int, tuple[int, int]], bool] = field(repr=False, compare=False)

    def unnamed(self, rec: AppendRecord) -> list[tuple[int, int]]:
        """The stretches of rows along ``rec``'s axis from ``rec.seen`` to the end that no
        marker names."""
        axis = rec.axis
        spans = sorted(
            (int(m.region[axis][0]), int(m.region[axis][1]))
            for m in self.markers
            if len(m.region) == len(self.length)
        )
        out, at, end = [], rec.seen, self.length[axis] if axis < len(self.length) else 0
        for a, b in spans:
            if a > at:
                out.append((at, min(a, end)))
            at = max(at, b)
        if at < end:
            out.append((at, end))
        return [(a, b) for a, b in out if a < b]

    def orphaned(self, rec: AppendRecord) -> tuple[int, int] | None:
        """The first rows a killed append of ``rec``'s shape reserved and never named, when that
        is certain: no writer may be between its commit and its markers, and the unnamed rows
        from ``rec.seen`` on are whole blocks of its row count, no more than the killed appends
        there (all of its shape) can have reserved. Which of those appends a block was is not
        known, nor needed: they are one call's shape, finished first rows first."""
        rows = self.unnamed(rec)
        if self.running or not rows:
            return None
        owners = [r for _, r in self.stale if self.unnamed(r)]
        if not all(r.fits(rec.dim, rec.axis, rec.region) for r in owners):
            return None  # appends of other shapes may hold some: which rows are whose is unknown
        n = rec.rows
        if n <= 0 or any((b - a) % n for a, b in rows):
            return None
        if sum(b - a for a, b in rows) > n * len(owners):
            return None  # rows no killed append can have reserved: not ours to take
        return rows[0][0], rows[0][0] + n

    def killed_rows(self, rec: AppendRecord) -> tuple[int, int] | None:
        """:meth:`orphaned`, unless values are stored there: a block of another tool's rows (no
        marker, its values stored) is never taken for a killed append's."""
        rows = self.orphaned(rec)
        return rows if rows is not None and not self.holds(rec.axis, rows) else None

    def foreign_first(self, rec: AppendRecord) -> bool:
        """Whether the first unnamed rows after ``rec.seen`` (as many as ``rec``'s) hold values:
        another tool appended them, and the killed append of ``rec`` reserved nothing."""
        rows = self.unnamed(rec)
        if not rows:
            return False
        a, b = rows[0]
        return self.holds(rec.axis, (a, min(b, a + rec.rows)))


def survey(store: ShardStore) -> Survey | None:
    """The state of the array at ``store`` (None: no metadata) for its append records."""
    raw = store.get("zarr.json")
    if raw is None:
        return None
    length = [int(s) for s in json.loads(raw).get("shape") or []]
    markers = [m for m in read_markers(store).values() if m is not None]
    tokens = {str((m.append or {}).get("id")) for m in markers if m.append}
    stale, running, settled = [], [], []
    records = read_appending(store)
    found = sorted(
        ((n, r) for n, r in records.items() if r is not None),
        key=lambda nr: (nr[1].seen, nr[1].started),
    )
    for name, rec in found:
        if rec.id in tokens:
            settled.append(name)
        elif holder_may_run(store, rec.holder):
            running.append(rec)
        else:
            stale.append((name, rec))
    unreadable = [n for n, r in records.items() if r is None]
    holds = functools.cache(functools.partial(holds_values, store))
    return Survey(length, markers, stale, running, settled, unreadable, holds)


def holds_values(store: ShardStore, axis: int, rows: tuple[int, int]) -> bool:
    """Whether a shard of the array at ``store`` lying wholly inside ``rows`` along ``axis``
    holds anything but the fill value (NaN as NaN). Shards across the edges of ``rows`` also hold
    rows before or after them, and may keep values an append gave back with them (it removes
    only the shards past its start): they tell nothing. Read one shard at a time."""
    import numpy as np

    from ..engine.read import ShardReader
    from ..storage.nodes import open_info

    info = open_info(store.store, store.path)
    lay = info.layout
    region = tuple(
        slice(rows[0], rows[1]) if i == axis else slice(0, n) for i, n in enumerate(lay.shape)
    )
    reader = ShardReader(info, store)
    fill = np.asarray(info.fill_value, dtype=info.dtype)
    for shard in lay.shards_touching(region):
        part = lay.shard_region(shard)
        if part[axis].start < rows[0] or part[axis].stop > rows[1]:
            continue
        values = reader.read(part)
        other = values != fill
        if values.dtype.kind in "fc" and np.isnan(fill).any():
            other &= ~np.isnan(values)
        if bool(np.any(other)):
            return True
    return False
