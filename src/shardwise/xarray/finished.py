"""A resume over a finished write of ``to_zarr``: whether the store holds what the call
writes (its metadata and small arrays, :func:`stored_as`, :func:`writes_stored`) and every
variable as that write left it (:func:`finished_shards`); then the call has nothing to do, as
every front end's resume of a finished write (write/session.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from zarr.abc.store import Store

from ..compat import with_rectilinear_grids
from ..storage.overlay import Overlay
from ..storage.store import ShardStore
from .capture import VariableWrite
from .parts import XarrayWrite


def _join(group: str | None, path: str) -> str:
    return "/".join(p for p in ((group or "").strip("/"), path) if p)


def has_metadata(base: Any, group: str | None) -> bool:
    """Whether a node (a group's or an array's ``zarr.json``) is stored at ``group``."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    key = f"{_join(group, '')}/zarr.json" if _join(group, "") else "zarr.json"
    try:
        return sync(base.get(key, default_buffer_prototype())) is not None
    except FileNotFoundError:  # a local store's directory not there (a read-only view)
        return False


def stored_as(overlay: Overlay, base: Any, group: str | None) -> bool:
    """Whether ``base`` holds under ``group`` exactly the nodes ``overlay`` would write there
    (:func:`writes_stored`) and no other node."""
    from zarr.core.sync import sync

    if not writes_stored(overlay, base):
        return False
    written = overlay.changes[2]
    prefix = f"{_join(group, '')}/" if _join(group, "") else ""

    async def metadata() -> list[str]:
        return [k async for k in base.list_prefix(prefix) if k.rsplit("/", 1)[-1] == "zarr.json"]

    return set(sync(metadata())) <= set(written)


def writes_stored(overlay: Overlay, base: Any) -> bool:
    """Whether every object ``overlay`` would write is stored in ``base`` as it is (documents
    equal as JSON, other objects byte for byte)."""
    import json

    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    proto = default_buffer_prototype()
    for key in overlay.changes[2]:
        ours, theirs = sync(overlay.get(key, proto)), sync(base.get(key, proto))
        if ours is None or theirs is None:
            return False
        a, b = ours.to_bytes(), theirs.to_bytes()
        if a != b and not (key.endswith("zarr.json") and json.loads(a) == json.loads(b)):
            return False
    return True


def finished_shards(xw: XarrayWrite) -> tuple[int, int] | None:
    """The shards of a finished write of ``xw`` (a resume of it: ``xw.finished``), when every
    variable is as it left it: each sharded one's shards as its done marker's records say (or
    all fill), each unsharded one's stored values those of the data; None when something is
    missing or changed since; else the shards stored and those left all fill (not stored).
    Reads only."""
    from ..write.session import finished_write

    stored = fill = 0
    for w in xw.writes:
        if w.info is None:
            if not _stored_values(xw.zstore, w):
                return None
            continue
        job = xw.jobs.get(id(w))
        if job is None:
            continue  # an empty variable: no shard
        found = finished_write(ShardStore(xw.zstore, w.path), job.plan, w.info.codec)
        if found is None:
            return None
        stored, fill = stored + found[0], fill + found[1]
    return stored, fill


@with_rectilinear_grids
def _stored_values(zstore: Store, w: VariableWrite) -> bool:
    """Whether the unsharded array of ``w`` (written through zarr-python) holds its data."""
    import zarr

    from ..storage.nodes import readable

    try:
        stored = zarr.open_array(readable(zstore), path=w.path, mode="r")[...]
    except Exception:  # missing or unreadable: not as the finished write left it
        return False
    given = np.asarray(w.source)
    try:
        return bool(np.array_equal(stored, given, equal_nan=True))
    except TypeError:  # strings and objects: no NaN to compare
        return bool(np.array_equal(stored, given))
