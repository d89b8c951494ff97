"""Rows given back by an append that failed while it was still the last reservation
(:meth:`shardwise.write.appends.Reservation.release`): the shards it stored past the old end
dropped while they are still its own, its markers removed or closed."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

from ..durability.journal import RECORDS, marker_name, now, read_marker, read_markers
from ..durability.records import read_records
from ..durability.shardrecord import Record, stored_matches
from ..storage.conditional import read_merge_commit, versions
from ..storage.nodes import open_info
from ..storage.store import ShardStore
from .pipeline import ArrayWrite
from .session import plan_keys

META = "zarr.json"


class NotOurs(Exception):
    pass


def drop_stored(store: ShardStore, axis: int, start: int, token: str) -> None:
    """Delete the shards (and their records) that the append ``token`` stored wholly past row
    ``start`` of the array at ``store``: a shard another writer committed since is kept."""
    ids = {m.id for m in read_markers(store).values() if m and (m.append or {}).get("id") == token}
    raw = store.get(META)
    if not ids or raw is None:
        return
    lay = open_info(store.store, store.path).layout  # a regular or rectilinear grid
    for key, rec in read_records(store).items():
        coord = key.split("/")[1:]
        if rec is None or rec.write not in ids or len(coord) <= axis:
            continue
        if lay.axis_bound(axis, int(coord[axis])) < start:
            continue  # holds rows from before the append: kept
        store.delete(RECORDS + key)

        def merge(data: bytes | None, rec: Record = rec) -> Any:
            if data is None or not rec.holds(data):
                raise NotOurs
            return None, None

        with contextlib.suppress(NotOurs):
            backend = versions(store)
            if backend is None or backend.can_delete:
                read_merge_commit(store, key, merge)
            else:  # an object store without conditional deletes: checked, then deleted (the
                merge(store.get(key))  # shard lies past the array's end now: no fill stand-in)
                store.delete(key)


def close_finished(aw: ArrayWrite) -> None:
    """Close the open marker of an array the given-back call rewrote (not appended): when each
    shard of it is an object its writer recorded whole (this call's, or the earlier write's it
    never reached), nothing is half-written and the marker is done; else it stays open."""
    m = read_marker(aw.store, aw.plan.region)
    if m is None or m.status != "open":
        return
    if all(whole_object(aw.store, k) for k in plan_keys(aw.plan)):
        done = replace(m, status="done", finished=now())
        aw.store.put(marker_name(aw.plan.region), done.to_bytes())


def whole_object(store: ShardStore, key: str) -> bool:
    raw = store.get(RECORDS + key)
    rec = None if raw is None else Record.from_bytes(raw)
    if rec is None:
        return raw is None and store.size(key) is None
    return stored_matches(store, key, rec)


def close_open(store: ShardStore, token: str) -> None:
    """Remove the open markers of the append ``token`` from the array at ``store``."""
    for name, m in read_markers(store).items():
        if m is not None and m.status == "open" and (m.append or {}).get("id") == token:
            store.delete(name)
