"""The store as xarray's pass of an append sees it: one length per dimension.

xarray refuses arrays of one dimension whose lengths disagree ("found conflicting lengths for
dimension t", when the append dimension has no coordinate variable). Appends reserve their rows
array by array (``appends.py``): between another appender's lead commit and its others, or after
an append killed between them, the stored lengths do disagree. xarray's pass of an append
therefore reads the store through :func:`steady_lengths`: every array of a group that has the
append dimension shows the longest length along it (the lead's), taken once per group. The rows
the call writes are moved to its own reservation afterwards, whatever length the pass saw.
xarray also refuses to append to a rectilinear array: the pass sees its grid as a regular one
of its largest shards, and the append's reservation extends the real extents.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

META = "zarr.json"


def steady_lengths(store: Store, append_dim: Hashable | None) -> Store:
    """``store`` as xarray's pass of an append along ``append_dim`` should see it: every array of
    a group that has that dimension as long along it as the longest of them (see the module).
    Read-only; other keys and other writes unchanged."""
    return store if append_dim is None else _SteadyLengths(store, str(append_dim))


class _SteadyLengths(WrapperStore[Store]):
    def __init__(self, store: Store, dim: str, lengths: dict[str, int] | None = None) -> None:
        super().__init__(store)
        self.dim = dim
        # per group prefix, the longest length along dim: taken once, so that every array of
        # the group shows the same one however the store changes during the pass
        self.lengths = {} if lengths is None else lengths

    def _with_store(self, store: Store) -> _SteadyLengths:
        return _SteadyLengths(store, self.dim, self.lengths)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        buf = await self._store.get(key, prototype, byte_range)
        if buf is None or byte_range is not None or key.rpartition("/")[2] != META:
            return buf
        doc = _appended_doc(buf.to_bytes(), self.dim)
        if doc is None:
            return buf
        group = key.rpartition("/")[0].rpartition("/")[0]
        if group not in self.lengths:
            self.lengths[group] = await self._longest(group, prototype)
        axis = doc["dimension_names"].index(self.dim)
        doc["shape"][axis] = self.lengths[group]
        _regular_stand_in(doc)
        return prototype.buffer.from_bytes(json.dumps(doc).encode())

    async def _longest(self, group: str, prototype: BufferPrototype) -> int:
        prefix = f"{group}/" if group else ""
        out = 0
        async for child in self._store.list_dir(prefix):
            if child.rstrip("/") == META:  # the group's own document, not a child node
                continue
            buf = await self._store.get(f"{prefix}{child.rstrip('/')}/{META}", prototype)
            doc = None if buf is None else _appended_doc(buf.to_bytes(), self.dim)
            if doc is not None:
                out = max(out, int(doc["shape"][doc["dimension_names"].index(self.dim)]))
        return out


def _appended_doc(raw: bytes, dim: str) -> dict[str, Any] | None:
    """The document of an array that has dimension ``dim``, else None."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("node_type") != "array":
        return None
    names = doc.get("dimension_names")
    return doc if isinstance(names, list) and dim in names else None


def _regular_stand_in(doc: dict[str, Any]) -> None:
    """A rectilinear grid shown as a regular one of its largest shards: xarray refuses to
    append to rectilinear arrays, and the append's commit extends the real extents
    (:func:`shardwise.write.appended.cover`)."""
    grid = doc.get("chunk_grid") or {}
    if grid.get("name") != "rectilinear":
        return
    step = [
        s if isinstance(s, int) else max(x[0] if isinstance(x, list) else x for x in s)
        for s in grid["configuration"]["chunk_shapes"]
    ]
    doc["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": step}}
