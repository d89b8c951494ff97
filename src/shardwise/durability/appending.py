"""An append's word before it reserves its rows: ``.shardwise/appending/<token>.json``.

An append (``append_dim`` of ``write_array`` or ``to_zarr``, :mod:`shardwise.write.appends`)
grows its lead array's length by a conditional commit of ``zarr.json``, and only then puts the
write markers that name the rows that commit gave it. The two are separate objects: a writer
killed between them would leave rows in the lead's length that nothing names, and a resume
would append again.

So before that commit the append puts a *record* in the lead array's journal: its token (the id
its markers carry), the dimension and axis, the region it planned (as many rows, the extent of
every other dimension), its holder (the process, as a lease's) and ``seen``: the lead's length
that try of the commit grows from (the record is put again before a try that reads another
length), so once the commit is done its rows are exactly ``seen`` to ``seen`` plus its row count
(:meth:`Survey.block`). Once its markers are put the record is removed. A record whose token some
marker of the lead carries is *settled* (its markers speak for it: the writer died before it
removed the record).

An unsettled record whose holder is gone (:func:`holder_may_run`) is an append killed before its
markers: either before its commit (nothing reserved) or after it (its block reserved, unnamed).
Its block tells which (:meth:`Survey.judge`). Had the commit happened, the block would lie within
the lead's length, no marker would name any of it, and it would hold no values (no data is
written before the markers): when any of that fails, the commit never took those rows, and the
append reserved nothing (past the length: not committed; named: another append's; holding
values: another tool's, xarray's own ``to_zarr`` appends without markers). Otherwise the block is
the killed append's, unless another unsettled record claims rows of it: a writer still running
(it may be between its own commit and its markers: whose the rows are shows once they are named)
or a killed append of another shape or block (one of the two never committed), unless the
killed appends' blocks make up the unnamed rows there in one way only: those are the committed
ones (:meth:`Survey._tiling`). Killed appends of one shape and one block are twins: one of
them took the block, which one does not matter (they are one call's shape, finished in the
order the calls are rerun).

Records of the earlier format said the length read before the commit, its rows there or later:
their block starts at the first unnamed row from ``seen`` on.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..storage.store import JOURNAL, TEMP, ShardStore
from .holder import LeaseInfo, ended_here, gone_reason
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
    seen: int  # the length its commit grows from: its rows start there (see ``exact``)
    holder: dict[str, Any]
    started: str
    exact: bool = False  # False: a record of the earlier format (its rows at ``seen`` or later)
    call: str = "to_zarr"  # the call that finishes it (verify's advice)

    @classmethod
    def new(
        cls, token: str, dim: str, axis: int, region: list[list[int]], seen: int, holder: Any
    ) -> AppendRecord:
        return cls(token, dim, axis, region, seen, holder, now(), True)

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
            keys = [k for k in cls.__dataclass_fields__ if k not in ("exact", "call")]
            rec = cls(
                **{k: d[k] for k in keys},
                exact=bool(d.get("exact", False)),
                call=str(d.get("call", "to_zarr")),
            )
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
    if holder is None or ended_here(holder):
        return False  # no holder recorded, or this process's call that ended: none to wait for
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
    holds: Callable[[int, tuple[int, int]], bool | None] = field(repr=False, compare=False)

    def unnamed(self, rec: AppendRecord) -> list[tuple[int, int]]:
        """The stretches of rows along ``rec``'s axis from ``rec.seen`` to the end that no
        marker names."""
        axis = rec.axis
        spans = sorted(
            (int(m.region[axis][0]), int(m.region[axis][1]))
            for m in self.markers
            if len(m.region) == len(self.length)
        )
        out, at, end = [], rec.seen, self.end(axis)
        for a, b in spans:
            if a > at:
                out.append((at, min(a, end)))
            at = max(at, b)
        if at < end:
            out.append((at, end))
        return [(a, b) for a, b in out if a < b]

    def end(self, axis: int) -> int:
        return self.length[axis] if axis < len(self.length) else 0

    def block(self, rec: AppendRecord) -> tuple[int, int]:
        """The rows ``rec``'s commit took if it happened (see the module docstring)."""
        start = rec.seen
        if not rec.exact:
            rows = self.unnamed(rec)
            start = rows[0][0] if rows else max(rec.seen, self.end(rec.axis))
        return start, start + rec.rows

    def judge(self, rec: AppendRecord) -> str:
        """What the killed append of ``rec`` reserved: ``"reserved"`` (its :meth:`block`),
        ``"nothing"``, ``"reserving"`` (a writer still running claims rows of the block) or
        ``"unsure"`` (a killed append of another shape or block claims some)."""
        a, b = self.block(rec)
        free = any(x <= a and b <= y for x, y in self.unnamed(rec))
        values = self.holds(rec.axis, (a, b)) if free and rec.rows > 0 else None
        if rec.rows <= 0 or not free or values:
            # never committed: past the length, rows of it named by a marker (another append's),
            # or another tool's values there
            return "nothing"

        def claims(other: AppendRecord) -> bool:
            x, y = self.block(other)
            return other.axis == rec.axis and x < b and y > a

        if any(claims(r) for r in self.running):
            return "reserving"
        # killed appends of another shape or block claiming rows of it (twins, of its shape and
        # block, are not rivals): one of the two never committed
        rivals = [
            r
            for _, r in self.stale
            if claims(r) and not (r.fits(rec.dim, rec.axis, rec.region) and self.block(r) == (a, b))
        ]
        tiling = self._tiling(rec)
        if tiling is not None:  # the one way killed appends' blocks make up the unnamed rows
            if (a, b) not in tiling:
                return "nothing"  # its block is not among them: another's commit came first
            # a rival with this very block (another shape): which one committed it?
            return "unsure" if any(self.block(r) == (a, b) for r in rivals) else "reserved"
        # no row of the block to read (it lies in one shard with earlier rows): another tool's
        # rows there would look the same
        return "unsure" if rivals or values is None else "reserved"

    def _tiling(self, rec: AppendRecord) -> set[tuple[int, int]] | None:
        """The blocks of killed appends along ``rec``'s axis that make up, end to end, the
        unnamed stretch holding ``rec``'s block, when exactly one choice of them does (each
        block once, twins as one); None otherwise (other rows there, or several ways)."""
        a, _ = self.block(rec)
        x, y = next((x, y) for x, y in self.unnamed(rec) if x <= a < y)
        starts: dict[int, list[int]] = {}
        for p, q in {self.block(r) for _, r in self.stale if r.axis == rec.axis}:
            if x <= p < q <= y:
                starts.setdefault(p, []).append(q)
        ways = {y: 1}  # the number of tilings from a row to y (2 meaning several)
        for pos in sorted({*starts, x}, reverse=True):
            ways[pos] = min(2, sum(ways.get(q, 0) for q in starts.get(pos, [])))
        if ways.get(x) != 1:
            return None
        out, at = set(), x
        while at < y:
            q = next(q for q in starts[at] if ways.get(q) == 1)
            out.add((at, q))
            at = q
        return out

    def killed_rows(self, rec: AppendRecord) -> tuple[int, int] | None:
        """The rows the killed append of ``rec`` reserved and never named, when certain."""
        return self.block(rec) if self.judge(rec) == "reserved" else None


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


def holds_values(store: ShardStore, axis: int, rows: tuple[int, int]) -> bool | None:
    """Whether ``rows`` along ``axis`` of the array at ``store`` hold anything but the fill value
    (NaN as NaN), from the first shard boundary at or after their start: the shard across that
    start also holds earlier rows, and may keep values an append gave back (it removes only the
    shards past its start). None when no row is left to tell (the rows lie in that shard's
    tail). Read one shard at a time."""
    import numpy as np

    from ..engine.read import ShardReader
    from ..storage.nodes import open_info

    info = open_info(store.store, store.path)
    lay = info.layout
    start = rows[0]
    if axis < len(lay.shape) and start < lay.shape[axis] and not lay.on_edge(axis, start):
        start = lay.axis_bound(axis, lay.axis_index(axis, start) + 1)
    if start >= rows[1]:
        return None
    region = tuple(
        slice(start, rows[1]) if i == axis else slice(0, n) for i, n in enumerate(lay.shape)
    )
    reader = ShardReader(info, store)
    fill = np.asarray(info.fill_value, dtype=info.dtype)
    for shard in lay.shards_touching(region):
        part = lay.shard_region(shard)
        part = tuple(
            slice(max(sl.start, start), min(sl.stop, rows[1])) if i == axis else sl
            for i, sl in enumerate(part)
        )
        values = reader.read(part)
        other = values != fill
        if values.dtype.kind in "fc" and np.isnan(fill).any():
            other &= ~np.isnan(values)
        if bool(np.any(other)):
            return True
    return False
