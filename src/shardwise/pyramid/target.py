"""Where a pyramid goes: what is at its group path (checked before anything is written, per
mode and resume), the group cleared for mode "w", and a level's metadata stored."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..durability.lease import blocking_leases, refuse_foreign
from ..errors import ArrayExistsError, PlanError
from ..storage.nodes import array_exists, node_exists
from ..storage.retry import retry_transient
from ..storage.store import ShardStore, describe, join
from ..write.intent import Intent, Mode, create_metadata, decide, resolve

__all__ = ["Target", "check_target", "clear_group", "create_level"]


@dataclass(frozen=True)
class Target:
    """The pyramid's group path and what each level's write does about what is there (the
    policy's :class:`~shardwise.write.intent.Intent`: a level a resumed call keeps is
    neither cleared nor created again)."""

    prefix: str
    intents: dict[str, Intent] = field(default_factory=dict)

    def key(self, level: str) -> str:
        return join(self.prefix, level)

    @property
    def kept(self) -> frozenset[str]:
        """The levels whose stored metadata is this call's (resumed)."""
        return frozenset(n for n, i in self.intents.items() if i.keep)


def check_target(
    zstore: Any, path: str | None, levels: Sequence[tuple[str, Any]], mode: str, resume: bool
) -> Target:
    """What is at ``path`` for ``levels`` (name, the array built in memory): mode "w-" refuses
    anything there, but with ``resume`` levels of this call's metadata (kept, to resume);
    mode "w" replaces everything, but with ``resume`` keeps such levels. Each level is
    resolved by the write policy (write/intent.py), as write_array resolves its array."""
    prefix = (path or "").strip("/")
    here = describe(zstore, prefix, "path")
    if _is_array(zstore, prefix, mode):
        if mode == "w-":
            raise ArrayExistsError(f"an array is at {here} (use mode='w' to replace it)")
        return Target(prefix, {name: decide("w", False, False, False) for name, _ in levels})
    intents = {}
    wmode: Mode = "w" if mode == "w" else "w-"
    for name, probe in levels:
        key = join(prefix, name)
        exists = (mode != "w" or resume) and _is_array(zstore, key, mode)
        intents[name] = resolve(
            zstore,
            key,
            wmode,
            resume,
            functools.partial(_same, probe),
            exists=exists,
            what=f"level {name} of the pyramid at {here}",
        )
    if mode == "w-" and not resume and retry_transient(lambda: node_exists(zstore, prefix)):
        raise ArrayExistsError(f"a group is at {here} already (use mode='w' to replace it)")
    return Target(prefix, intents)


def _same(probe: Any) -> Any:
    return probe


def _is_array(zstore: Any, key: str, mode: str) -> bool:
    """Whether an array is at ``key``; a group there (or a v2 node) is not one. A key inside an
    array is refused in mode "w-" (mode "w" replaces the array around it)."""
    try:
        return bool(retry_transient(lambda: array_exists(zstore, key)))
    except PlanError:
        if mode == "w-" and not node_exists(zstore, key):
            raise
        return False


def clear_group(
    group: ShardStore, levels: Sequence[str], *, resume: bool = False, break_lease: bool = False
) -> None:
    """Mode "w": delete what is under the group but the levels (each clears its own, sparing
    its lease and, resumed, its stored shards). Another writer's lease there refuses the call
    first, as to_zarr's mode "w" (durability/lease.py: a resume passes a gone holder's and
    ``break_lease`` any, which then go with the rest)."""
    mine = tuple(f"{lv}/" for lv in levels)
    found = blocking_leases(group, keep=mine, takeover=resume, broken=break_lease)
    refuse_foreign(join(group.path, n) for n in found)
    for name in group.list():
        if name.startswith(mine):
            continue
        group.delete(name)
    root = group.local_root
    top = root / group.path if root is not None and group.path else root
    if top is not None and top.is_dir():
        # local directories of what was deleted (an old level 5 of a deeper pyramid) go too,
        # so that the group lists only this pyramid's levels
        for d, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
            rel = Path(d).relative_to(top).as_posix()
            if rel != "." and not f"{rel}/".startswith(mine):
                with contextlib.suppress(OSError):  # not empty: written meanwhile
                    Path(d).rmdir()


def create_level(zstore: Any, key: str, kwargs: dict[str, Any], probe: Any) -> None:
    """Store a level's metadata: the policy's one create (again after a transient failure;
    another writer's array there is :class:`ArrayExistsError`). Not ``overwrite=True``: it
    would delete the level's lease with the old array (the level was cleared before, sparing
    the lease)."""
    create_metadata(zstore, key, kwargs, probe)
