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
while it is still the last reservation (the arrays return to their old length); after a later
reservation its rows read as the fill value, and its open write marker says so to verify.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from ..core.job import Strategy
from ..core.layout import ceildiv
from ..storage.conditional import update_json
from ..storage.store import ShardStore
from .capture import _Write
from .parts import _jobs, _XarrayWrite

META = "zarr.json"


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
    committed: bool = field(default=False)

    def note(self) -> str:
        moved = f" (found {self.found}: others appended first)" if self.start != self.found else ""
        lost = f"; {self.conflicts} reservation commits redone" if self.conflicts else ""
        return f"append along {self.dim!r}: rows {self.start}:{self.end} reserved{moved}{lost}"

    def release(self) -> None:
        """Give the rows back if no later append reserved rows after them (the lead array still
        ends at ``end``): the other arrays first, so that a concurrent append, which reads the
        lead, never sees the lead shrunk while another array still ends here."""
        if self.committed:
            return  # the data and metadata are there: nothing to give back
        for path, axis in reversed(list(zip(self.paths, self.axes, strict=True))):
            _shrink(ShardStore(self.zstore, path), axis, self.end, self.start)


def reserve(
    xw: _XarrayWrite,
    append_dim: Hashable | None,
    strategy: Strategy,
    memory_limit: int | str | None,
) -> tuple[_XarrayWrite, Reservation | None]:
    """Reserve this append's rows (steps 1 and 2 above) and move its writes there (step 3).
    Nothing happens (``None``) for writes that are not appends to existing arrays."""
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
    n = first.stop - first.start
    start, conflicts = update_json(
        ShardStore(xw.zstore, appended[0].path), META, lambda doc: _grow_by(doc, axes[0], n)
    )
    res = Reservation(
        xw.zstore,
        dim,
        tuple(w.path for w in appended),
        axes,
        first.start,
        start,
        start + n,
        conflicts,
    )
    try:
        for w, axis in zip(appended[1:], axes[1:], strict=True):
            update_json(ShardStore(xw.zstore, w.path), META, partial(_at_least, axis, res.end))
        # a staged write merges without a condition (it is refused where it would merge), so its
        # last shard stays clipped: strategy="staged" appends are one at a time (README)
        pad = strategy != "staged"
        moved = {id(w): _moved(w, axis, res, pad) for w, axis in zip(appended, axes, strict=True)}
        writes = [moved.get(id(w), w) for w in xw.writes]
        jobs = _jobs(writes, strategy, memory_limit, shared=True)
    except BaseException:
        res.release()
        raise
    return replace(xw, writes=writes, jobs=jobs), res


def _grow_by(doc: dict[str, Any], axis: int, n: int) -> tuple[int, bool]:
    at = int(doc["shape"][axis])
    doc["shape"][axis] = at + n
    return at, True


def _at_least(axis: int, end: int, doc: dict[str, Any]) -> tuple[None, bool]:
    if int(doc["shape"][axis]) >= end:
        return None, False
    doc["shape"][axis] = end
    return None, True


def _shrink(store: ShardStore, axis: int, end: int, start: int) -> None:
    def change(doc: dict[str, Any]) -> tuple[None, bool]:
        if int(doc["shape"][axis]) != end:
            return None, False  # grown by a later append: its length stays
        doc["shape"][axis] = start
        return None, True

    update_json(store, META, change)


def _moved(w: _Write, axis: int, res: Reservation, pad: bool) -> _Write:
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


def commit_metadata(xw: _XarrayWrite, res: Reservation | None) -> None:
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
