"""Mode "w"'s one clear of what a write replaces, for every front end: ``to_zarr`` of a Dataset
or a DataTree (the groups xarray's pass deletes), ``write_pyramid`` (its group but the levels)
and ``convert`` (the destination group). An array's own clear (its old data and journal, its
lease spared) is the pipeline's, under the lease it holds (``write/session.py``).

:func:`clear_for_replace` first refuses, before deleting anything, when a lease of another
write in progress is under what it would delete (the one answer to "is it held",
:func:`~shardwise.durability.lease.blocking_leases`: a resume passes a gone holder's,
``break_lease=True`` any, which then go with the rest), with the one message
(:func:`~shardwise.durability.lease.refuse_foreign`); then deletes everything under each
prefix but what the write keeps: the arrays it writes (each clears its own), the leases it
holds, the variables a resume finishes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..durability.lease import blocking_leases, refuse_foreign
from ..storage.overlay import delete_under
from ..storage.store import ShardStore, join

__all__ = ["clear_for_replace", "foreign_leases"]


def foreign_leases(
    zstore: Any,
    prefixes: Iterable[str],
    keep: Iterable[str] = (),
    *,
    resume: bool = False,
    break_lease: bool = False,
) -> list[str]:
    """The keys of the leases under ``prefixes`` that refuse a write replacing them: not in
    ``keep`` (keys, or prefixes ending in "/", from the store's root), held by a live writer
    (``resume``: a gone holder's do not refuse; ``break_lease``: none does)."""
    kept = tuple(keep)
    found: list[str] = []
    for d in prefixes:
        prefix = d.strip("/")
        under = f"{prefix}/" if prefix else ""
        mine = [k.removeprefix(under) for k in kept if k.startswith(under)]
        held = blocking_leases(
            ShardStore(zstore, prefix), keep=mine, takeover=resume, broken=break_lease
        )
        found += [join(prefix, n) for n in held]
    return found


def clear_for_replace(
    zstore: Any,
    prefixes: Iterable[str],
    keep: Iterable[str] = (),
    *,
    resume: bool = False,
    break_lease: bool = False,
) -> None:
    """Mode "w": refuse another write's lease under ``prefixes`` (:class:`LeaseHeldError`,
    nothing deleted), then delete everything under them but ``keep`` (keys, or prefixes ending
    in "/", from the store's root)."""
    where = [d.strip("/") for d in prefixes]
    kept = tuple(keep)
    refuse_foreign(foreign_leases(zstore, where, kept, resume=resume, break_lease=break_lease))
    for d in where:
        delete_under(zstore, d, kept)
