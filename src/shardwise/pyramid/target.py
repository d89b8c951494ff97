"""Where a pyramid goes: what is at its group path (checked before anything is written, per
mode and resume), and a level's metadata stored (mode "w"'s clear of the group is the one
clear, ``write/clear.py``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ArrayExistsError, PlanError
from ..storage.nodes import array_exists, node_exists
from ..storage.retry import retry_transient
from ..storage.store import describe, join
from ..write.intent import Intent, Mode, create_metadata, decide, resolve

__all__ = ["Target", "check_target", "create_level"]


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


def create_level(zstore: Any, key: str, kwargs: dict[str, Any], probe: Any) -> None:
    """Store a level's metadata: the policy's one create (again after a transient failure;
    another writer's array there is :class:`ArrayExistsError`). Not ``overwrite=True``: it
    would delete the level's lease with the old array (the level was cleared before, sparing
    the lease)."""
    create_metadata(zstore, key, kwargs, probe)
