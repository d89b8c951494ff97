"""Consolidated metadata kept true: the one re-consolidation every write ends with.

A group's ``zarr.json`` may carry *consolidated metadata*: the documents of every node below
it, so that readers (``xr.open_zarr``, ``xr.open_datatree``, zarr-python) open the hierarchy
from one object. A write that adds, replaces, grows or deletes a node below such a group makes
it stale; :func:`refresh` rebuilds it for every consolidated group at or above the nodes a
write touched (deepest first, so a group's entry of a consolidated child is the child's new
document), each one committed conditionally
(:func:`~shardwise.storage.conditional.update_json`): the walk of the hierarchy runs after the
read of the group's generation, and a commit lost to another writer walks again, so writers
adding different nodes at once all stay visible. Groups without consolidated metadata are left
without it, but those a write asks for (a pyramid's group).

The write pipeline's finish (:mod:`shardwise.write.pipeline`) calls :func:`refresh` with
the nodes of its write (:class:`Nodes`), so every front end re-consolidates the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..compat import consolidated_metadata, with_rectilinear_grids
from ..errors import ArrayNotFoundError
from .conditional import update_json
from .overlay import read_only
from .store import ShardStore

META = "zarr.json"


@dataclass(frozen=True)
class Nodes:
    """The nodes one write adds, replaces, grows or deletes in ``store`` (a zarr Store):
    ``paths`` (arrays or groups); the consolidated groups at or above them are re-consolidated.
    ``consolidate``: groups given consolidated metadata even if they have none yet."""

    store: Any
    paths: tuple[str, ...] = ()
    consolidate: tuple[str, ...] = ()


def refresh(nodes: Nodes) -> list[str]:
    """Re-consolidate every consolidated group at or above ``nodes.paths`` (and the groups of
    ``nodes.consolidate``), deepest first; returns notes for what could not be (a store that
    cannot replace an object, such as a zarr ``ZipStore``)."""
    zstore = nodes.store
    wanted = {p.strip("/") for p in nodes.consolidate}
    replaces = getattr(zstore, "supports_deletes", True)
    for group in _groups_above([*nodes.paths, *wanted]):
        if replaces:
            refresh_group(zstore, group, create=group in wanted)
        elif _stale(zstore, group, group in wanted):
            return [
                f"consolidated metadata of group {'/' + group!r} not updated: the store cannot "
                f"replace an object ({type(zstore).__name__}); open it with "
                "consolidated=False to see every node"
            ]
    return []


@with_rectilinear_grids
def refresh_group(zstore: Any, group: str, *, create: bool = False) -> bool:
    """Re-consolidate ``group`` if its ``zarr.json`` carries consolidated metadata (or
    ``create``); whether it changed."""
    if _stored_doc(zstore, group, create) is None:
        return False  # no group there, or one without consolidated metadata: nothing stale

    def change(doc: dict[str, Any]) -> tuple[bool, bool]:
        if not _wanted(doc, create):
            return False, False
        fresh = _walk(zstore, group)
        if doc.get("consolidated_metadata") == fresh:
            return False, False
        doc["consolidated_metadata"] = fresh
        return True, True

    try:
        changed, _ = update_json(ShardStore(zstore, group), META, change)
    except ArrayNotFoundError:
        return False  # deleted meanwhile (another writer's mode="w"): nothing to refresh
    return changed


def _stored_doc(zstore: Any, group: str, create: bool) -> dict[str, Any] | None:
    """The ``zarr.json`` of ``group`` when it is a group to consolidate, else None."""
    raw = ShardStore(zstore, group).get(META)
    doc = None if raw is None else json.loads(raw)
    return doc if isinstance(doc, dict) and _wanted(doc, create) else None


def _stale(zstore: Any, group: str, create: bool) -> bool:
    """Whether ``group`` should be re-consolidated: its consolidated metadata (or, with
    ``create``, its lack of any) differs from what is stored below it."""
    doc = _stored_doc(zstore, group, create)
    return doc is not None and doc.get("consolidated_metadata") != _walk(zstore, group)


def _wanted(doc: dict[str, Any], create: bool) -> bool:
    return doc.get("node_type") == "group" and (
        create or doc.get("consolidated_metadata") is not None
    )


def _walk(zstore: Any, group: str) -> Any:
    """The consolidated metadata of ``group`` as stored now, as zarr-python's own consolidation
    builds it (read-only: nothing is written)."""
    return consolidated_metadata(read_only(zstore), group)


def _groups_above(paths: Iterable[str]) -> list[str]:
    """Every path and every group above it (the root ""), deepest first."""
    out: set[str] = set()
    for path in paths:
        parts = [p for p in path.strip("/").split("/") if p]
        out.update("/".join(parts[:i]) for i in range(len(parts) + 1))
    return sorted(out, key=lambda p: (-(p.count("/") + bool(p)), p))
