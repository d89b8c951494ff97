"""Appends that never lose rows: the rows an append writes are reserved before its data.

Two calls appending along one dimension at once would otherwise both find length L, both write
rows L:L+n and both commit length L+n: one call's rows lost. So an append into existing arrays
first *reserves* its rows in the arrays' metadata, committed conditionally as shared shards are
(:func:`~shardwise.storage.conditional.update_json`):

1. the lead array (the dimension coordinate, else the first appended array by path) grows from
   the length it has at that commit, whatever length xarray's pass saw: that length is where
   this call's rows go. A commit lost to another appender reads the new length and tries again.
2. every other appended array grows to at least the reserved end (never shrinks: another
   appender may have reserved beyond it).
3. the planned writes move to the reserved rows. Their last shard is planned whole along the
   append dimension (the length padded to the shard grid), so it is merged conditionally rather
   than written clipped: inner chunks a later appender already committed there are kept.

After the data, xarray's other metadata is committed but the reserved arrays' (right already),
and a group's consolidated metadata is merged: each reserved array keeps the larger of this
call's end and the stored length. A call that fails before its data is done gives its rows back
while it is still the last reservation (the arrays return to their old length) and removes its
write markers (nothing is left to finish); after a later reservation its rows read as the fill
value, and its open write marker says so to verify.

Resume finishes, never repeats. Each appended array's write marker names the append (its
dimension and axis) and its region is the reserved rows, written before any data. Between the
lead's commit (step 1) and those markers the rows are named by nothing but the append's record,
put in the lead's journal before the commit and removed once the markers are there
(:mod:`shardwise.durability.appending`). With ``resume=True`` the open append markers are
searched first: the first one of this call's shape (as many rows, the same extent in every other
dimension) whose writer is gone is finished, its rows written again where they were reserved
(the shards it stored and recorded skipped); then a finished append whose rows of the dimension
coordinate hold this call's values (nothing to write); then the record of a killed append of
this shape whose commit took its rows (``Survey.judge``: they lie in the lead's length, named by
no marker, holding no values, and no other unsettled record claims them): they are finished,
named first by this call's markers. Only when there is none does the call append, as without
``resume``, removing a record of this shape whose append reserved nothing; while a running
append's record claims a killed one's rows, the call is refused before any change
(``LeaseHeldError``).

xarray's pass reads every array's length, and refuses arrays of one dimension that disagree
("conflicting lengths"): between another appender's lead commit and its others, or after an
append killed between them, they do. The pass therefore runs over ``steady_lengths``, a
view in which every array of a group that has the append dimension shows the longest of them
(the lead; the rows this call writes are moved to its reservation anyway): ``steady.py``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from ..core.job import Strategy
from ..core.layout import ceildiv
from ..durability.appending import (
    AppendRecord,
    Survey,
    holder_may_run,
    survey,
)
from ..durability.holder import LeaseInfo
from ..durability.journal import (
    WriteMarker,
    appends_of,
    marker_name,
    now,
    region_list,
)
from ..errors import LeaseHeldError
from ..storage.conditional import update_json
from ..storage.icechunk import is_icechunk_store
from ..storage.store import ShardStore
from ..write.pipeline import ArrayWrite
from .capture import VariableWrite
from .giveback import close_finished, close_open, drop_stored
from .parts import XarrayWrite, variable_jobs

META = "zarr.json"
# called as after_claim(lead path) between the lead's commit that gave a call its rows and the
# markers that name them (tests stop a writer there)
after_claim: Callable[[str], None] | None = None


@dataclass
class Reservation:
    """The rows ``start:end`` along ``dim`` that one append reserved in the arrays ``paths``
    (the lead first), each appended along its axis ``axes[i]``."""

    zstore: Any
    dim: str
    paths: tuple[str, ...]
    axes: tuple[int, ...]
    found: int  # the length xarray's pass saw
    start: int
    end: int
    conflicts: int  # reservation commits lost to other appenders
    resumed: bool = False  # the rows of an unfinished append, finished by this call
    before: bool = False  # resumed: rows a finished append wrote (nothing left to write)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)  # in this call's markers
    holder: dict[str, Any] = field(default_factory=lambda: asdict(LeaseInfo.new("append")))
    committed: bool = field(default=False)
    rewrites: list[ArrayWrite] = field(default_factory=list)  # the call's other arrays
    drop: list[str] = field(default_factory=list)  # lead records to remove once named

    def note(self) -> str:
        if self.resumed:
            what = "appended before" if self.before else "of an unfinished append finished"
            return f"append along {self.dim!r}: rows {self.start}:{self.end} {what} (resume=True)"
        moved = f" (found {self.found}: others appended first)" if self.start != self.found else ""
        lost = f"; {self.conflicts} reservation commits redone" if self.conflicts else ""
        return f"append along {self.dim!r}: rows {self.start}:{self.end} reserved{moved}{lost}"

    def record(self, writes: list[VariableWrite]) -> None:
        """Each appended array's marker, open, at its reserved rows (the session that writes
        the rows takes its place); then the lead's records in ``drop`` are removed: the rows
        are named (durability/appending.py)."""
        for w, axis in zip(writes, self.axes, strict=True):
            marker = WriteMarker(
                id=uuid.uuid4().hex,
                region=region_list(w.region),
                shape=list(w.shape),
                status="open",
                started=now(),
                append=self.named(axis),
            )
            ShardStore(self.zstore, w.path).put(marker_name(w.region), marker.to_bytes())
        self.settle()

    def settle(self) -> None:
        """Remove the lead's records in ``drop`` (their rows are named, or none were taken)."""
        lead = ShardStore(self.zstore, self.paths[0])
        for name in self.drop:
            lead.delete(name)
        self.drop = []

    def named(self, axis: int) -> dict[str, Any]:
        """This append as its markers name it: dimension, axis, id and who writes it."""
        return {"dim": self.dim, "axis": axis, "id": self.token, "holder": self.holder}

    def tag(self, arrays: dict[int, ArrayWrite]) -> dict[int, ArrayWrite]:
        """The appended arrays' writes with this append in their markers (journal.py)."""
        axis = dict(zip(self.paths, self.axes, strict=True))
        self.rewrites = [aw for aw in arrays.values() if aw.prefix not in axis]
        return {
            i: aw if aw.prefix not in axis else replace(aw, append=self.named(axis[aw.prefix]))
            for i, aw in arrays.items()
        }

    def release(self) -> None:
        """Give the rows back if no later append reserved rows after them (the lead array still
        ends at ``end``): the other arrays first, so that a concurrent append, which reads the
        lead, never sees the lead shrunk while another array still ends here. Rows given back
        leave nothing to finish: this call's markers are removed (else they stay open, and
        verify advises the resume that finishes them)."""
        if self.committed:
            return  # the data and metadata are there: nothing to give back
        pairs = list(zip(self.paths, self.axes, strict=True))
        if _length(ShardStore(self.zstore, self.paths[0]), self.axes[0]) == self.end:
            # still the last reservation: the shards it stored past the old end are its alone
            # (each dropped only while it holds this call's bytes)
            for path, axis in pairs:
                drop_stored(ShardStore(self.zstore, path), axis, self.start, self.token)
        stores = [ShardStore(self.zstore, p) for p in self.paths]
        given = [
            _shrink(st, a, self.end, self.start)
            for st, a in reversed(list(zip(stores, self.axes, strict=True)))
        ]
        if given[-1]:  # the lead's: no later append reserved rows after these
            self.settle()  # (else its record names the rows until its markers do)
            for st in stores:
                close_open(st, self.token)
            for aw in self.rewrites:
                close_finished(aw)


def tagged(res: Reservation | None, arrays: dict[int, ArrayWrite]) -> dict[int, ArrayWrite]:
    """``arrays``, an append's with the append named in their markers (:meth:`Reservation.tag`)."""
    return arrays if res is None else res.tag(arrays)


def reserve(
    xw: XarrayWrite,
    append_dim: Hashable | None,
    strategy: Strategy,
    memory_limit: int | str | None,
    resume: bool = False,
) -> tuple[XarrayWrite, Reservation | None]:
    """Reserve this append's rows (steps 1 and 2 above) and move its writes there (step 3).
    Nothing happens (``None``) for writes that are not appends to existing arrays.
    ``resume``: the rows of an unfinished append of this shape instead, if there is one."""
    dim = None if append_dim is None else str(append_dim)
    appended = [
        w
        for w in xw.writes
        if dim in w.dims and w.size and ShardStore(xw.zstore, w.path).get(META) is not None
    ]
    if dim is None or not appended:
        return xw, None
    appended.sort(key=lambda w: (w.name != dim, w.path))
    axes = tuple(w.dims.index(dim) for w in appended)
    first = appended[0].region[axes[0]]
    paths = tuple(w.path for w in appended)
    found = survey(ShardStore(xw.zstore, paths[0])) if resume else None
    unfinished = None if found is None else _unfinished(xw, appended, axes, dim, found)
    if unfinished is not None:  # finish its rows, with every array at least that long
        a, b, kind, drop = unfinished
        res = Reservation(xw.zstore, dim, paths, axes, first.start, a, b, 0, True, kind == "done")
        res.committed = res.before  # rows written before: nothing of theirs is ever given back
        grow = list(zip(appended, axes, strict=True))
    else:
        drop = [] if found is None else _not_reserved(xw, found, dim, axes[0], appended[0])
        res = _claim(xw, appended[0], axes[0], dim, paths, axes)
        grow = list(zip(appended[1:], axes[1:], strict=True))
    res.drop += drop + ([] if found is None else found.settled)
    unnamed = unfinished is None or unfinished[2] == "orphan"  # rows no marker names yet
    try:
        # a staged write merges without a condition (it is refused where it would merge), so its
        # last shard stays clipped: strategy="staged" appends are one at a time (README)
        pad = strategy != "staged"
        moved = {id(w): _moved(w, axis, res, pad) for w, axis in zip(appended, axes, strict=True)}
        # where the rows go, before anything else (a kill now is resumable); then the records
        # of appends this call stands for, and its own, are removed
        if unnamed:
            res.record([moved[id(w)] for w in appended])
        res.settle()
        for w, axis in grow:
            update_json(ShardStore(xw.zstore, w.path), META, partial(_at_least, axis, res.end))
        writes = [moved.get(id(w), w) for w in xw.writes]
        forks = is_icechunk_store(xw.zstore)
        jobs = variable_jobs(writes, strategy, memory_limit, shared=True, forks=forks)
    except BaseException:
        res.release()
        raise
    return replace(xw, writes=writes, jobs=jobs), res


def _claim(
    xw: XarrayWrite,
    lead: VariableWrite,
    axis: int,
    dim: str,
    paths: tuple[str, ...],
    axes: tuple[int, ...],
) -> Reservation:
    """Step 1: the lead grown by this call's rows, its record put before (the rows it takes are
    named by nothing until its markers are put: durability/appending.py)."""
    store = ShardStore(xw.zstore, lead.path)
    region = region_list(lead.region)
    n = region[axis][1] - region[axis][0]
    token, holder = uuid.uuid4().hex, asdict(LeaseInfo.new("append"))
    said = [AppendRecord.new(token, dim, axis, region, _length(store, axis), holder)]
    store.put(said[0].name(), said[0].to_bytes())

    def grow(doc: dict[str, Any]) -> tuple[int, bool]:
        # every try says first the length it grows from (another append committed, or a failed
        # one gave rows back, since it was read): once committed, the record names its rows
        if (at := int(doc["shape"][axis])) != said[0].seen:
            said[0] = replace(said[0], seen=at)
            store.put(said[0].name(), said[0].to_bytes())
        return _grow_by(doc, axis, n)

    rec = said[0]
    try:
        start, lost = update_json(store, META, grow)
    except BaseException:
        store.delete(rec.name())
        raise
    if after_claim is not None:
        after_claim(lead.path)
    found = region[axis][0]
    res = Reservation(xw.zstore, dim, paths, axes, found, start, start + n, lost, token=token)
    res.holder, res.drop = holder, [rec.name()]
    return res


def _not_reserved(
    xw: XarrayWrite, found: Survey, dim: str, axis: int, lead: VariableWrite
) -> list[str]:
    """The record of an append of this shape killed before it reserved anything (its commit
    never took its rows: durability/appending.py): this call, appending, stands for it.
    Refused while another append, still running, claims rows of its block (they are that
    append's, or the killed one's had it committed first: whose they are shows once they are
    named); killed appends whose rows are not certain stay reported."""
    want = region_list(lead.region)
    for name, rec in found.stale:
        if not rec.fits(dim, axis, want):
            continue
        verdict = found.judge(rec)
        if verdict == "nothing":
            return [name]
        if verdict == "reserving":
            a, b = found.block(rec)
            raise LeaseHeldError(
                f"an append of {rec.rows} rows along {dim!r} at {lead.path!r} (started "
                f"{rec.started}) was killed around its reservation, and another append is "
                f"reserving rows now: rows {a}:{b} are named by no write yet, and whether they "
                "are the killed append's shows once that append names its rows. Nothing was "
                "written: rerun with resume=True in a moment"
            )
    return []


def _unfinished(
    xw: XarrayWrite,
    appended: list[VariableWrite],
    axes: tuple[int, ...],
    dim: str,
    found: Survey,
) -> tuple[int, int, str, list[str]] | None:
    """The rows of the first unfinished append along ``dim`` of this call's shape (as many rows,
    the same extent in every other dimension): an open marker in any appended array, the
    lead's first; else those of a finished one whose rows of the dimension coordinate (the
    lead) hold exactly this call's values; else the rows a killed append reserved in the lead
    and never named (``found``, durability/appending.py). (start, end, "open" | "done" |
    "orphan", the names of the lead's records that are settled by it)."""
    for w, axis in zip(appended, axes, strict=True):
        store = ShardStore(xw.zstore, w.path)
        for m in appends_of(store, dim, "open"):
            holder = (m.append or {}).get("holder")
            if (rows := _rows_of(m, w, axis)) is not None and not holder_may_run(store, holder):
                return rows[0], rows[1], "open", []
    lead, axis = appended[0], axes[0]
    if lead.name == dim:
        for m in appends_of(ShardStore(xw.zstore, lead.path), dim, "done"):
            rows = _rows_of(m, lead, axis)
            if rows is not None and _holds(xw.zstore, lead, axis, rows):
                return rows[0], rows[1], "done", []
    want = region_list(lead.region)
    for name, rec in found.stale:
        if rec.fits(dim, axis, want) and (rows := found.killed_rows(rec)) is not None:
            return rows[0], rows[1], "orphan", [name]
    return None


def _rows_of(m: WriteMarker, w: VariableWrite, axis: int) -> tuple[int, int] | None:
    """The rows of the append ``m`` if it has the shape of ``w``'s (appended along ``axis``)."""
    want = [[s.start, s.stop] for s in w.region]
    if int((m.append or {}).get("axis", -1)) != axis or len(m.region) != len(want):
        return None
    a, b = (int(r) for r in m.region[axis])
    same = all(r == q for i, (r, q) in enumerate(zip(m.region, want, strict=True)) if i != axis)
    return (a, b) if same and b - a == want[axis][1] - want[axis][0] else None


def _holds(zstore: Any, w: VariableWrite, axis: int, rows: tuple[int, int]) -> bool:
    """Whether the stored array of ``w`` holds ``w``'s values at ``rows`` along ``axis``."""
    import numpy as np
    import zarr

    sel = tuple(slice(*rows) if i == axis else s for i, s in enumerate(w.region))
    stored = zarr.open_array(zstore, path=w.path, mode="r")[sel]
    return bool(np.array_equal(np.asarray(stored), np.asarray(w.source), equal_nan=False))


def _length(store: ShardStore, axis: int) -> int:
    raw = store.get(META)
    return -1 if raw is None else int(json.loads(raw)["shape"][axis])


def _grow_by(doc: dict[str, Any], axis: int, n: int) -> tuple[int, bool]:
    at = int(doc["shape"][axis])
    doc["shape"][axis] = at + n
    return at, True


def _at_least(axis: int, end: int, doc: dict[str, Any]) -> tuple[None, bool]:
    if int(doc["shape"][axis]) >= end:
        return None, False
    doc["shape"][axis] = end
    return None, True


def _shrink(store: ShardStore, axis: int, end: int, start: int) -> bool:
    """Whether the array at ``store`` went back from ``end`` to ``start`` rows."""

    def change(doc: dict[str, Any]) -> tuple[bool, bool]:
        if int(doc["shape"][axis]) != end:
            return False, False  # grown by a later append: its length stays
        doc["shape"][axis] = start
        return True, True

    return update_json(store, META, change)[0]


def _moved(w: VariableWrite, axis: int, res: Reservation, pad: bool) -> VariableWrite:
    """``w`` written to the reserved rows, in an array padded to whole shards along the append
    axis (its last shard merged, never clipped: see the module's step 3)."""
    from zarr.core.metadata import ArrayV3Metadata

    from ..codec.metadata import info_from_metadata

    region = list(w.region)
    region[axis] = slice(res.start, res.end)
    shape = list(w.shape)
    shape[axis] = ceildiv(res.end, w.chunks[axis]) * w.chunks[axis] if pad else res.end
    meta = {**w.meta, "shape": shape}
    info = None if w.info is None else info_from_metadata(ArrayV3Metadata.from_dict(meta))
    return replace(w, region=tuple(region), shape=tuple(shape), meta=meta, info=info)


def commit_metadata(xw: XarrayWrite, res: Reservation | None) -> None:
    """xarray's metadata from the overlay, deepest keys first; with a reservation, without the
    reserved arrays' documents and with a group's consolidated lengths merged."""
    if res is None:
        xw.overlay.commit_writes(xw.zstore)
        return
    skip = {f"{p}/{META}" for p in res.paths}
    proto = default_buffer_prototype()
    for key in sorted(xw.overlay.changes[2], key=lambda k: (-k.count("/"), k)):
        if key in skip:
            continue
        buf = sync(xw.overlay.get(key, proto))
        assert buf is not None
        ours = json.loads(buf.to_bytes()) if key.endswith(META) else None
        if ours is None or "consolidated_metadata" not in ours:
            sync(xw.zstore.set(key, buf))
            continue
        prefix = key[: -len(META)]
        update_json(
            ShardStore(xw.zstore, prefix.rstrip("/")), META, _consolidated(ours, prefix, res)
        )
    res.committed = True


def _consolidated(ours: dict[str, Any], prefix: str, res: Reservation) -> Any:
    """The change that makes a group's document ``ours``, each reserved array's consolidated
    length the larger of ``res.end`` and the stored one."""

    def change(doc: dict[str, Any]) -> tuple[None, bool]:
        mine = (ours.get("consolidated_metadata") or {}).get("metadata") or {}
        theirs = (doc.get("consolidated_metadata") or {}).get("metadata") or {}
        for path, axis in zip(res.paths, res.axes, strict=True):
            rel = path[len(prefix) :]
            if rel in mine:
                stored = theirs.get(rel, {}).get("shape") or [0] * (axis + 1)
                mine[rel]["shape"][axis] = max(res.end, int(stored[axis]))
        doc.clear()
        doc.update(json.loads(json.dumps(ours)))
        return None, True

    return change
