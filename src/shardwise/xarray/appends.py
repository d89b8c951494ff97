"""``to_zarr(append_dim=...)`` through the one append rule (:mod:`shardwise.write.appends`:
rows reserved before the data, given back on failure, finished on resume).

What is xarray's stays here: the variables that have the append dimension (their dimension
names give the axes), the Dataset's dimension coordinate as the lead (its values tell which rows
a finished append wrote; else the first appended array by path), the variables' writes moved to
the reserved rows (and their jobs planned there), and the metadata xarray's pass wrote into the
overlay, committed after the data but for the reserved arrays' documents (right already), a
group's consolidated lengths merged. xarray's pass reads the store through ``steady.py``.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import replace

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from ..core.job import Strategy
from ..storage.conditional import update_json
from ..storage.icechunk import is_icechunk_store
from ..storage.store import ShardStore
from ..write import appends as rule
from ..write.appended import AppendedArray
from ..write.appends import Reservation, tagged
from .parts import XarrayWrite, variable_jobs

__all__ = ["Reservation", "commit_metadata", "reserve", "tagged"]

META = "zarr.json"


def reserve(
    xw: XarrayWrite,
    append_dim: Hashable | None,
    strategy: Strategy,
    memory_limit: int | str | None,
    resume: bool = False,
) -> tuple[XarrayWrite, Reservation | None]:
    """Reserve this append's rows and move its writes there (:func:`shardwise.write.appends.
    reserve`). Nothing happens (``None``) for writes that are not appends to existing arrays.
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
    arrays = [
        AppendedArray(
            ShardStore(xw.zstore, w.path), w.dims.index(dim), w.region, w.meta, w.info, w.source
        )
        for w in appended
    ]
    # a staged write merges without a condition (it is refused where it would merge), so its
    # last shard stays clipped: strategy="staged" appends are one at a time (docs/guides/appends.md)
    res = rule.reserve(
        arrays,
        dim,
        pad=strategy != "staged",
        resume=resume,
        lead_names_rows=appended[0].name == dim,
    )
    try:
        moved = {
            id(w): replace(w, region=m.region, shape=m.shape, meta=m.meta, info=m.info)
            for w, m in zip(appended, res.moved, strict=True)
        }
        writes = [moved.get(id(w), w) for w in xw.writes]
        forks = is_icechunk_store(xw.zstore)
        jobs = variable_jobs(writes, strategy, memory_limit, shared=True, forks=forks)
    except BaseException:
        res.release()
        raise
    return replace(xw, writes=writes, jobs=jobs), res


def commit_metadata(xw: XarrayWrite, res: Reservation | None) -> None:
    """xarray's metadata from the overlay, deepest keys first; with a reservation, without the
    reserved arrays' documents and with a group's consolidated lengths merged."""
    if res is None:
        xw.overlay.commit_writes(xw.zstore)
        return
    skip = res.skipped()
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
        update_json(ShardStore(xw.zstore, prefix.rstrip("/")), META, res.consolidated(ours, prefix))
    res.committed = True
