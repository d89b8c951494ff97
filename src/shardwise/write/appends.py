"""Appends that never lose rows: the rows an append writes are reserved before its data.

The one rule of every front end that appends (``write_array(..., append_dim=)``,
``to_zarr(append_dim=)``), typed on :class:`AppendedArray`: an array the call grows along an
axis, with its planned write (region, metadata, source). Two calls appending along one axis at
once would otherwise both find length L, both write rows L:L+n and both commit length L+n: one
call's rows lost. So an append into existing arrays first *reserves* its rows in the arrays'
metadata, committed conditionally as shared shards are
(:func:`~shardwise.storage.conditional.update_json`):

1. the lead array (the first the front end passes: a Dataset's dimension coordinate, else its
   first appended array by path; the one array of ``write_array``) grows from the length it has
   at that commit, whatever length the front end saw: that length is where this call's rows go.
   A commit lost to another appender reads the new length and tries again.
2. every other appended array grows to at least the reserved end (never shrinks: another
   appender may have reserved beyond it).
3. the planned writes move to the reserved rows (:attr:`Reservation.moved`, which the front end
   plans its jobs from). Their last shard is planned whole along the append axis (the length
   padded to the shard grid), so it is merged conditionally rather than written clipped: inner
   chunks a later appender already committed there are kept.

After the data the front end commits its other metadata (:meth:`Reservation.committed`; a
group's consolidated metadata merged by :meth:`Reservation.consolidated`: each reserved array
keeps the larger of this call's end and the stored length). A call that fails before its data
is done gives its rows back while it is still the last reservation (:meth:`Reservation.release`:
the arrays return to their old length, ``giveback.py``) and removes its write markers (nothing
is left to finish); after a later reservation its rows read as the fill value, and its open
write marker says so to verify.

Resume finishes, never repeats. Each appended array's write marker names the append (its
dimension, axis and the call that finishes it) and its region is the reserved rows, written
before any data. Between the lead's commit (step 1) and those markers the rows are named by
nothing but the append's record, put in the lead's journal before the commit and removed once
the markers are there (:mod:`shardwise.durability.appending`). With ``resume=True`` the
unfinished append of this call's shape is looked for first (``unfinished.py``): its rows are
finished where they were reserved (the shards it stored and recorded skipped), or found written
already; only when there is none does the call append, as without ``resume``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from ..durability.appending import AppendRecord, survey
from ..durability.holder import LeaseInfo, mark_ended
from ..durability.journal import WriteMarker, marker_name, now, region_list
from ..storage.conditional import update_json
from ..storage.store import ShardStore
from .appended import AppendedArray, cover, moved
from .giveback import close_finished, close_open, drop_stored
from .pipeline import ArrayWrite
from .unfinished import not_reserved, unfinished

META = "zarr.json"
# called as after_claim(lead path) between the lead's commit that gave a call its rows and the
# markers that name them (tests stop a writer there)
after_claim: Callable[[str], None] | None = None


@dataclass
class Reservation:
    """The rows ``start:end`` along ``dim`` that one append reserved in the arrays ``paths``
    (the lead first), each appended along its axis ``axes[i]``; ``moved``: the planned writes
    at those rows (set by :func:`reserve`)."""

    zstore: Any
    dim: str
    paths: tuple[str, ...]
    axes: tuple[int, ...]
    found: int  # the length the front end saw
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
    call: str = "to_zarr"  # the call that finishes it (verify's advice)
    moved: list[AppendedArray] = field(default_factory=list)
    grids: dict[str, Any] = field(default_factory=dict)  # the lead's grid as its commit left it

    def note(self) -> str:
        if self.resumed:
            what = "appended before" if self.before else "of an unfinished append finished"
            return f"append along {self.dim!r}: rows {self.start}:{self.end} {what} (resume=True)"
        moved = f" (found {self.found}: others appended first)" if self.start != self.found else ""
        lost = f"; {self.conflicts} reservation commits redone" if self.conflicts else ""
        return f"append along {self.dim!r}: rows {self.start}:{self.end} reserved{moved}{lost}"

    def record(self, arrays: Sequence[AppendedArray]) -> None:
        """Each appended array's marker, open, at its reserved rows (the session that writes
        the rows takes its place); then the lead's records in ``drop`` are removed: the rows
        are named (durability/appending.py)."""
        for a in arrays:
            marker = WriteMarker(
                id=uuid.uuid4().hex,
                region=region_list(a.region),
                shape=list(a.shape),
                status="open",
                started=now(),
                append=self.named(a.axis),
            )
            a.store.put(marker_name(a.region), marker.to_bytes())
        self.settle()

    def settle(self) -> None:
        """Remove the lead's records in ``drop`` (their rows are named, or none were taken)."""
        lead = ShardStore(self.zstore, self.paths[0])
        for name in self.drop:
            lead.delete(name)
        self.drop = []

    def named(self, axis: int) -> dict[str, Any]:
        """This append as its markers name it: dimension, axis, id and who writes it (and the
        call that finishes it, but to_zarr's)."""
        out = {"dim": self.dim, "axis": axis, "id": self.token, "holder": self.holder}
        return out if self.call == "to_zarr" else {**out, "call": self.call}

    def tag[K](self, arrays: Mapping[K, ArrayWrite]) -> dict[K, ArrayWrite]:
        """The appended arrays' writes with this append in their markers (journal.py); the
        call's other writes are kept to close on a give-back."""
        axis = dict(zip(self.paths, self.axes, strict=True))
        self.rewrites = [aw for aw in arrays.values() if aw.store.path not in axis]
        return {
            i: aw
            if aw.store.path not in axis
            else replace(aw, append=self.named(axis[aw.store.path]))
            for i, aw in arrays.items()
        }

    def release(self) -> None:
        """Give the rows back if no later append reserved rows after them (the lead array still
        ends at ``end``): the other arrays first, so that a concurrent append, which reads the
        lead, never sees the lead shrunk while another array still ends here. Rows given back
        leave nothing to finish: this call's markers are removed (else they stay open, and
        verify advises the resume that finishes them)."""
        mark_ended(self.holder["token"])  # a resume from this process may finish its rows
        if self.committed:
            return  # the data and metadata are there: nothing to give back
        pairs = list(zip(self.paths, self.axes, strict=True))
        if length(ShardStore(self.zstore, self.paths[0]), self.axes[0]) == self.end:
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

    def skipped(self) -> set[str]:
        """The metadata keys the reservation committed already (the front end's metadata
        commit leaves them out)."""
        return {f"{p}/{META}" if p else META for p in self.paths}

    def consolidated(self, ours: dict[str, Any], prefix: str) -> Any:
        """The change (for :func:`update_json`) that makes a group's document ``ours``, each
        reserved array's consolidated length the larger of ``end`` and the stored one."""

        grids = {}  # a rectilinear array's extents as stored (they only grow: they cover
        for path in self.paths:  # every length a reservation committed)
            raw = ShardStore(self.zstore, path).get(META)
            grid = None if raw is None else json.loads(raw).get("chunk_grid")
            if grid is not None and grid.get("name") == "rectilinear":
                grids[path] = grid

        def change(doc: dict[str, Any]) -> tuple[None, bool]:
            mine = (ours.get("consolidated_metadata") or {}).get("metadata") or {}
            theirs = (doc.get("consolidated_metadata") or {}).get("metadata") or {}
            for path, axis in zip(self.paths, self.axes, strict=True):
                rel = path[len(prefix) :]
                if rel in mine:
                    stored = theirs.get(rel, {}).get("shape") or [0] * (axis + 1)
                    mine[rel]["shape"][axis] = max(self.end, int(stored[axis]))
                    if path in grids:
                        mine[rel]["chunk_grid"] = grids[path]
            doc.clear()
            doc.update(json.loads(json.dumps(ours)))
            return None, True

        return change


def tagged[K](res: Reservation | None, arrays: Mapping[K, ArrayWrite]) -> dict[K, ArrayWrite]:
    """``arrays``, an append's with the append named in their markers (:meth:`Reservation.tag`)."""
    return dict(arrays) if res is None else res.tag(arrays)


def reserve(
    arrays: Sequence[AppendedArray],
    dim: str,
    *,
    pad: bool,
    resume: bool = False,
    lead_names_rows: bool = False,
    call: str = "to_zarr",
) -> Reservation:
    """Reserve this append's rows in ``arrays`` (existing ones, the lead first; steps 1 and 2
    above) and plan their writes there (step 3: :attr:`Reservation.moved`, in the order of
    ``arrays``). ``pad``: the last shard planned whole (merged; False for writes that merge
    without a condition). ``resume``: the rows of an unfinished append of this shape instead,
    if there is one; ``lead_names_rows``: the lead's values tell which rows an append wrote (a
    dimension coordinate), so a finished append of these values is found. ``call``: the call
    that finishes this append, named by verify's advice."""
    for x in arrays:
        x.check()  # chunks that cannot be shards of a rectilinear axis: refused before any I/O
    lead = arrays[0]
    found = survey(lead.store) if resume else None
    done = None if found is None else unfinished(arrays, dim, found, lead_names_rows)
    if done is not None:  # finish its rows, with every array at least that long
        a, b, kind, drop = done
        first = lead.region[lead.axis].start
        paths, axes = tuple(x.path for x in arrays), tuple(x.axis for x in arrays)
        res = Reservation(lead.store.store, dim, paths, axes, first, a, b, 0, True, kind == "done")
        res.committed = res.before  # rows written before: nothing of theirs is ever given back
        res.call, grow = call, list(arrays)
    else:
        drop = [] if found is None else not_reserved(lead, dim, found)
        res, grow = _claim(arrays, dim, call), list(arrays[1:])
    res.drop += drop + ([] if found is None else found.settled)
    unnamed = done is None or done[2] == "orphan"  # rows no marker names yet
    try:
        res.moved = [moved(x, res.start, res.end, pad, res.grids.get(x.path)) for x in arrays]
        # where the rows go, before anything else (a kill now is resumable); then the records
        # of appends this call stands for, and its own, are removed
        if unnamed:
            res.record(res.moved)
        res.settle()
        later = {id(x) for x in grow}
        for i, x in enumerate(arrays):
            if id(x) in later:
                grid, _ = update_json(x.store, META, partial(_at_least, x, res.start, res.end))
                # the write planned on the extents as committed (appended.py)
                res.moved[i] = moved(x, res.start, res.end, pad, grid)
    except BaseException:
        res.release()
        raise
    return res


def _claim(arrays: Sequence[AppendedArray], dim: str, call: str) -> Reservation:
    """Step 1: the lead grown by this call's rows, its record put before (the rows it takes are
    named by nothing until its markers are put: durability/appending.py)."""
    lead = arrays[0]
    store, axis, n = lead.store, lead.axis, lead.rows
    region = region_list(lead.region)
    token, holder = uuid.uuid4().hex, asdict(LeaseInfo.new("append"))
    rec = AppendRecord.new(token, dim, axis, region, length(store, axis), holder)
    said = [replace(rec, call=call)]
    store.put(said[0].name(), said[0].to_bytes())

    def grow(doc: dict[str, Any]) -> tuple[int, bool]:
        # every try says first the length it grows from (another append committed, or a failed
        # one gave rows back, since it was read): once committed, the record names its rows
        if (at := int(doc["shape"][axis])) != said[0].seen:
            said[0] = replace(said[0], seen=at)
            store.put(said[0].name(), said[0].to_bytes())
        grids[lead.path] = cover(lead, doc, at, at + n)  # a rectilinear axis: its extents
        return _grow_by(doc, axis, n)

    grids: dict[str, Any] = {}
    try:
        start, lost = update_json(store, META, grow)
    except BaseException:
        store.delete(said[0].name())
        raise
    if after_claim is not None:
        after_claim(lead.path)
    found = lead.region[axis].start
    paths, axes = tuple(x.path for x in arrays), tuple(x.axis for x in arrays)
    res = Reservation(store.store, dim, paths, axes, found, start, start + n, lost, token=token)
    res.holder, res.drop, res.call, res.grids = holder, [said[0].name()], call, grids
    return res


def length(store: ShardStore, axis: int) -> int:
    """The stored length of the array at ``store`` along ``axis`` (-1: no array)."""
    raw = store.get(META)
    return -1 if raw is None else int(json.loads(raw)["shape"][axis])


def _grow_by(doc: dict[str, Any], axis: int, n: int) -> tuple[int, bool]:
    at = int(doc["shape"][axis])
    doc["shape"][axis] = at + n
    return at, True


def _at_least(
    a: AppendedArray, start: int, end: int, doc: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """``a``'s array at least ``end`` long (its rectilinear extents reaching there); its grid."""
    if int(doc["shape"][a.axis]) >= end:
        return doc.get("chunk_grid") or {}, False
    doc["shape"][a.axis] = end
    return cover(a, doc, start, end), True


def _shrink(store: ShardStore, axis: int, end: int, start: int) -> bool:
    """Whether the array at ``store`` went back from ``end`` to ``start`` rows."""

    def change(doc: dict[str, Any]) -> tuple[bool, bool]:
        if int(doc["shape"][axis]) != end:
            return False, False  # grown by a later append: its length stays
        doc["shape"][axis] = start
        return True, True

    return update_json(store, META, change)[0]
