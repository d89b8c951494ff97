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

import zarr

from ..durability.lease import is_lease_key
from ..errors import ArrayExistsError, PlanError
from ..storage.nodes import array_exists, node_exists, same_metadata
from ..storage.retry import retry_transient
from ..storage.store import ShardStore, describe, join

__all__ = ["Target", "check_target", "clear_group", "create_level"]


@dataclass(frozen=True)
class Target:
    """The pyramid's group path and the levels a resumed call keeps (their stored metadata is
    this call's): those are neither cleared nor created again."""

    prefix: str
    kept: frozenset[str] = field(default_factory=frozenset)

    def key(self, level: str) -> str:
        return join(self.prefix, level)


def check_target(
    zstore: Any, path: str | None, levels: Sequence[tuple[str, Any]], mode: str, resume: bool
) -> Target:
    """What is at ``path`` for ``levels`` (name, the array built in memory): mode "w-" refuses
    anything there, but with ``resume`` levels of this call's metadata (kept, to resume);
    mode "w" replaces everything, but with ``resume`` keeps such levels."""
    prefix = (path or "").strip("/")
    here = describe(zstore, prefix, "path")
    if _is_array(zstore, prefix, mode):
        if mode == "w-":
            raise ArrayExistsError(f"an array is at {here} (use mode='w' to replace it)")
        return Target(prefix)
    kept = set()
    for name, probe in levels:
        key = join(prefix, name)
        if not _is_array(zstore, key, mode):
            continue
        if resume and retry_transient(functools.partial(same_metadata, probe, zstore, key)):
            kept.add(name)
        elif mode == "w-":
            what = "with other metadata: nothing to resume" if resume else "already"
            raise ArrayExistsError(
                f"level {name} of the pyramid at {here} exists {what} (use mode='w' to "
                "replace the pyramid)"
            )
    if mode == "w-" and not resume and retry_transient(lambda: node_exists(zstore, prefix)):
        raise ArrayExistsError(f"a group is at {here} already (use mode='w' to replace it)")
    return Target(prefix, frozenset(kept))


def _is_array(zstore: Any, key: str, mode: str) -> bool:
    """Whether an array is at ``key``; a group there (or a v2 node) is not one. A key inside an
    array is refused in mode "w-" (mode "w" replaces the array around it)."""
    try:
        return bool(retry_transient(lambda: array_exists(zstore, key)))
    except PlanError:
        if mode == "w-" and not node_exists(zstore, key):
            raise
        return False


def clear_group(group: ShardStore, levels: Sequence[str]) -> None:
    """Mode "w": delete what is under the group but the levels (each clears its own, sparing
    its lease and, resumed, its stored shards) and any lease (another writer's is not ours to
    delete)."""
    mine = tuple(f"{lv}/" for lv in levels)
    for name in group.list():
        if name.startswith(mine) or is_lease_key(name):
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
                with contextlib.suppress(OSError):  # not empty: a lease kept
                    Path(d).rmdir()


def create_level(zstore: Any, key: str, kwargs: dict[str, Any]) -> None:
    """Store a level's metadata (again after a transient failure: a try whose answer was lost
    may have stored it, which counts as done)."""

    from zarr.errors import ContainsArrayError

    tried = False

    def create() -> None:
        nonlocal tried
        try:
            # not overwrite=True: it would delete the level's lease with the old array (the
            # level was cleared before, sparing the lease)
            zarr.create_array(zstore, name=key, overwrite=False, **kwargs)
        except ContainsArrayError:
            if not tried:
                raise
        finally:
            tried = True

    retry_transient(create)
