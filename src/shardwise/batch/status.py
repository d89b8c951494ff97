"""The state of a batch write in the store: the open batch record (:func:`open_batch`), the parts
recorded done, and what :func:`~shardwise.batch.finalize` left about the last batch it closed."""

from __future__ import annotations

import json
from typing import Any

from ..core import args
from ..durability.journal import BATCH, PARTS
from ..errors import ArrayExistsError, BatchNotFoundError, InvalidValueError
from ..storage.icechunk import is_icechunk_store
from ..storage.store import JOURNAL, TEMP, ShardStore, describe, resolve_store
from ..write.intent import Mode, resolve
from .plan import BatchPlan, fmt

FINALIZED = f"{JOURNAL}/batch-finalized.json"  # what finalize leaves: which batch, when


def _open(store: Any, path: str | None, storage_options: dict[str, Any] | None) -> ShardStore:
    # the path check of every front end (write_array's, to_zarr's group=): before the store is
    # opened, so a refused path leaves it as it was
    args.store_path("path", path)
    args.mapping("storage_options", storage_options)
    if is_icechunk_store(store):  # a Session itself is refused by resolve_store
        raise InvalidValueError(
            "a batch does not write into an icechunk session nor its store (its leases and "
            "records are files beside the array): use write_array, to_zarr, write_pyramid or "
            "convert with the session; nothing was written"
        )
    return ShardStore(resolve_store(store, mode="w", storage_options=storage_options), path or "")


def open_batch(
    store: Any, *, path: str | None = None, storage_options: dict[str, Any] | None = None
) -> BatchPlan:
    """The batch record of the array: which region each part writes.

    Parameters
    ----------
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store``, a local path or a URL.
    path : str, optional
        The array's path inside ``store`` (default: its root).
    storage_options : dict, optional
        fsspec options, for a ``store`` given as a URL.

    Returns
    -------
    BatchPlan
        The open batch; ``.region(i)`` is the region part ``i`` writes.

    Raises
    ------
    BatchNotFoundError
        No batch is open (a ``FileNotFoundError``); the message says when the last one was
        finalized.

    Examples
    --------
    >>> import zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.batch.init(store, shape=(64,), dtype="u1", chunks=(16,), shards=(32,),
    ...                          parts=2)
    >>> shardwise.batch.open_batch(store).shape
    (64,)
    """
    sstore = _open(store, path, storage_options)
    raw = sstore.get(BATCH)
    if raw is None:
        done = read_finalized(sstore)
        where = describe(sstore.store, path)
        if done is not None:
            raise BatchNotFoundError(
                f"no open batch write for {where}: batch {str(done.get('id'))[:8]} was finalized "
                f"at {done.get('finalized')} (run batch init to start another)"
            )
        raise BatchNotFoundError(f"no open batch write for {where} (run batch init first)")
    return BatchPlan.from_bytes(raw)


def read_finalized(sstore: ShardStore) -> dict[str, Any] | None:
    """What :func:`finalize` recorded about the last batch it closed (None: nothing closed)."""
    raw = sstore.get(FINALIZED)
    if raw is None:
        return None
    try:
        done = json.loads(raw)
    except ValueError:
        return None
    return done if isinstance(done, dict) else None


def parts_done(sstore: ShardStore) -> list[int]:
    out = []
    for name in sstore.list(PARTS):
        if not TEMP.match(name) and name.endswith(".json"):
            out.append(int(name[len(PARTS) : -len(".json")]))
    return sorted(out)


def rerun_of(
    sstore: ShardStore,
    path: str | None,
    mode: Mode,
    probe: Any,
    plan: BatchPlan | None = None,
) -> BatchPlan | None:
    """The open batch a rerun of ``init`` in mode "w-" with the same arguments returns (the
    array's metadata those arguments build, ``probe``, and the same parts as ``plan``); None
    when this init writes. Refused by the write policy (:func:`~shardwise.write.intent.resolve`,
    a resume of the create): "w-" over an array with other metadata (the message names what
    differs) or without this batch, "r+" over nothing. Reads only. ``plan``: None checks the
    array alone (before the parts are planned)."""
    build = None if probe is None else (lambda: probe)
    intent = resolve(sstore.store, path, mode, mode == "w-", build)
    if mode != "w-" or intent.create or plan is None:
        return None
    raw = sstore.get(BATCH)
    existing = BatchPlan.from_bytes(raw) if raw is not None else None
    where = describe(sstore.store, path)
    if existing is None:
        raise ArrayExistsError(
            f"{where} already exists with no open batch (use mode='w' to replace it)"
        )
    if existing.regions != plan.regions:
        raise ArrayExistsError(
            f"{where} has an open batch of other parts: {existing.nparts} stored "
            f"{[fmt(r) for r in existing.regions]}, {plan.nparts} asked "
            f"{[fmt(r) for r in plan.regions]} (rerun init with the same parts, or mode='w' to "
            "replace it)"
        )
    return existing


def recorded_batch(sstore: ShardStore, part: int) -> set[str]:
    """The batch id in part ``part``'s record (none when there is no readable record)."""
    raw = sstore.get(f"{PARTS}{part}.json")
    try:
        record = json.loads(raw) if raw is not None else None
    except ValueError:
        return set()
    return {str(record.get("batch"))} if isinstance(record, dict) else set()
