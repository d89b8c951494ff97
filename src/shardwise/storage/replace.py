"""Replace a whole object beside writers that merge into it (:func:`replace_whole`).

A write that covers a shard whole has nothing to merge, but in a shared write (region writes,
appends, modes "a"/"r+") other writers may be merging into the same shard at that moment. Their
commit checks the shard's generation and then stores, as one step: under the shard's lock on
local files, by the server on object stores. A plain put of the whole shard takes no lock, so on
local files it could land between another writer's check and its rename, and that writer's
merge, made from the older shard, would then replace it: the rows only this write covers lost.
The whole shard is therefore committed through the same check, on the generation it has now (a
``head``, not a read: nothing is merged), so it lands before or after a merge, never inside one.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ..errors import ShardConflictError
from . import conditional as cond
from .retry import RetryPolicy
from .store import ShardStore


def replace_whole(
    store: ShardStore, name: str, parts: Sequence[Any] | None
) -> cond.Committed[None]:
    """Store ``parts`` as object ``name`` (None: delete it) through the conditional commit of
    ``store``, whatever it holds now; as a plain put or delete where ``store`` has none, and a
    plain delete where it cannot delete conditionally (object stores without conditional
    deletes check the other writers' commits on the server: a delete changes the generation
    they expect, so they merge again)."""
    backend = cond.versions(store) if cond.ENABLED else None
    if backend is None or (parts is None and not backend.can_delete):
        existed = store.size(name) is not None
        if parts is not None:
            store.put(name, parts)
        elif existed:
            store.delete(name)
        return cond.Committed(None, parts, existed, cond.UNCHECKED, 0)
    for attempt in range(cond.TRIES):
        gen = cond._retrying(partial(backend.head, name))
        if parts is None and gen is None:
            return cond.Committed(None, None, False, None, attempt)
        new = cond._retrying(partial(backend.commit, name, parts, gen))
        if new is not cond.CONFLICT:
            return cond.Committed(None, parts, gen is not None, new, attempt)
        RetryPolicy(backoff=cond.BACKOFF, backoff_max=cond.BACKOFF_MAX, jitter=1.0).pause(attempt)
    raise ShardConflictError(store.key(name), cond.TRIES)
