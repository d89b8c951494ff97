"""The write policy every front end asks once: what is at the target, and what the write does
about it.

A front end (``write_array`` and batch parts through ``write/target.py``, ``to_zarr`` of a
Dataset or a DataTree, ``write_pyramid``'s levels, ``convert``'s copies) decides nothing of its
own about an array it writes:

- :func:`resolve` looks at the path once per mode and resume and answers with an
  :class:`Intent`: whether an array is there, whether this write keeps its metadata (an
  existing array written into, or a resumed create whose metadata is this write's), creates it,
  what it clears first (mode "w": the old array but its leases; any other create: the stale
  journal), whether it adopts a finished write's shards and whether it must find one. The
  refusals are this module's too: mode "w-" over an array (:class:`ArrayExistsError`), mode
  "r+" over nothing (:class:`ArrayNotFoundError`), a resume over other metadata.
- :func:`job_for` chooses the strategy with the scheduler asked once (threads or a local
  cluster in this process), for every front end; its ``role`` says what else decides it: an
  array by ``write_array``'s rule, a pyramid's reduced level direct wherever its shard task fits
  half the budget, a small variable (GeoZarr's coordinates) direct, written whole.
- :func:`array_write` builds the pipeline's :class:`~.pipeline.ArrayWrite` from the intent and
  the job: the flags are set here only. A write that merges shards it shares with other writers
  runs beside them (a shared lease) only where its merges commit conditionally; an explicit
  ``strategy="staged"`` merges unconditionally, so it holds the array's exclusive lease instead
  (other writers are refused while it runs), in ``write_array`` and ``to_zarr`` alike.
- :func:`create_metadata` stores a new array's metadata: once more after a transient failure
  (a try whose answer was lost may have stored it), and one error,
  :class:`ArrayExistsError`, when another writer created it first.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from ..compat import default_cluster_is_local, default_scheduler_is_local
from ..core.job import Strategy, WritePlan, make_job, shards_per_task
from ..core.plan import ShardPlan
from ..engine.tree import TreeLink
from ..engine.write import WriteSettings
from ..errors import ArrayExistsError, ArrayNotFoundError, InvalidValueError
from ..runtime.probes import default_threads
from ..storage.conditional import versions
from ..storage.nodes import array_exists, metadata_differences, same_metadata
from ..storage.retry import retry_transient
from ..storage.store import ShardStore, describe
from .finish import Kind
from .pipeline import ArrayWrite, Clear

__all__ = [
    "Intent",
    "Mode",
    "Role",
    "array_write",
    "create_metadata",
    "decide",
    "job_for",
    "resolve",
]

Mode = Literal["w", "w-", "a", "r+"]
Role = Literal["array", "reduced", "whole"]


@dataclass(frozen=True)
class Intent:
    """What a write does about what is at its array path (:func:`resolve`)."""

    exists: bool  # an array is there now
    create: bool  # this write stores the array's metadata (False: it keeps what is stored)
    clear: Clear  # before its marker: nothing, the stale journal, or the old array ("w")
    adopt_done: bool  # a finished write's shards count as done (every mode but "w")
    must_adopt: bool  # a resume of "w-" over an array: nothing to adopt is an error

    @property
    def keep(self) -> bool:
        """The stored metadata is this write's: an array written into, or a create resumed."""
        return self.exists and not self.create


def decide(mode: Mode, resume: bool, exists: bool, same: bool) -> Intent:
    """The intent of a write in ``mode`` (``resume``) over a path where an array is
    (``exists``) with this write's metadata (``same``, for a create) or not: pure, after the
    refusals (:func:`resolve` makes them)."""
    create = not exists or (mode in ("w", "w-") and not (resume and same))
    return Intent(
        exists=exists,
        create=create,
        # our own clear instead of zarr's overwrite, which would delete the lease too
        clear=("all" if mode == "w" else "journal") if create else "none",
        # a finished write is adopted too (its shards skipped, as their records still match)
        # unless mode "w" asks to replace the array
        adopt_done=mode != "w",
        must_adopt=resume and mode == "w-" and exists and not create,
    )


def resolve(
    zstore: Any,
    path: str | None,
    mode: Mode,
    resume: bool,
    probe: Callable[[], Any] | None = None,
    *,
    region: bool = False,
    exists: bool | None = None,
    what: str = "",
) -> Intent:
    """What is at ``path`` for a write in ``mode`` with ``resume``, looked up once (only where
    the answer matters: mode "w" without resume replaces whatever is there).

    ``probe``: builds the array this write would create, in memory (zarr-python's; called only
    when its metadata is compared with the stored one, so keyword errors come after these
    refusals); None for a write that keeps what is stored (``mode`` "a" or "r+" into an
    array). ``region``: the write fills a region of an existing array. ``exists``: the
    caller's own lookup (a pyramid tells a group at a level's path from an array), else looked
    up here. ``what``: the array's name in messages (default: the store and path)."""
    here = what or describe(zstore, path)
    if exists is None:
        exists = (mode != "w" or resume) and retry_transient(lambda: array_exists(zstore, path))
    exists = bool(exists)
    if mode == "w-" and exists and not resume:
        raise ArrayExistsError(f"{here} already exists (use mode='w' to replace it)")
    if mode == "r+" and not exists:
        raise ArrayNotFoundError(
            f"mode='r+' writes into an existing array, and there is none at "
            f"{what or describe(zstore, path, 'path')} (use mode='a' or 'w-' to create it)"
        )
    if exists and (mode in ("a", "r+") or region or probe is None):
        return decide(mode, resume, True, True)
    if region:
        raise InvalidValueError("region= needs an existing array (mode='r+' or 'a')")
    differences: list[str] = []
    if exists:
        assert probe is not None  # an array kept as it is returned above
        build = probe
        differences = retry_transient(lambda: metadata_differences(build(), zstore, path))
    if exists and differences and mode == "w-":
        raise ArrayExistsError(
            f"{here} exists with other metadata ({'; '.join(differences)}): nothing to resume "
            "(use mode='w' to replace it)"
        )
    return decide(mode, resume, exists, not differences)


def job_for(
    plan: ShardPlan,
    source: Any,
    itemsize: int | np.dtype[Any],
    *,
    strategy: Strategy = "auto",
    memory_limit: int | str | None = None,
    shared: bool = False,
    role: Role = "array",
    forks: bool = False,
) -> WritePlan:
    """The job of every front end: :func:`~shardwise.core.job.make_job` with the scheduler the
    write runs on asked here (threads in this process, a local cluster, or another), for a
    numpy or dask ``source`` (its chunks; None for numpy). Not validated (the caller adds its
    own refusals first).

    ``role``: ``"array"``, an array written from its source (``write_array``'s rule, for every
    front end and a pyramid's level 0); ``"reduced"``, a pyramid level reduced in the graph,
    whose blocks are the graph's own cut, never the shard pieces: ``"auto"`` writes it direct
    wherever a shard's task fits half the budget (no staging round trip through the store),
    staged where it does not; ``"whole"``, a small variable held in memory (GeoZarr's
    coordinates and grid mapping), written direct whatever ``strategy`` asks: one task per
    shard, its metadata and shards recorded as the other arrays'. ``forks``: the write goes
    into an icechunk session (its shard tasks write into forks): ``"auto"`` writes direct, each
    task its whole shards (a staged write's pieces have no place in the session)."""
    chunks = getattr(source, "chunks", None) if _is_dask(source) else None
    # without dask imported no client or scheduler is set: a numpy source runs here, on threads
    local = "dask" not in sys.modules or default_scheduler_is_local()

    def job(asked: Strategy) -> WritePlan:
        return make_job(
            plan,
            None if chunks is None else tuple(tuple(int(n) for n in c) for c in chunks),
            itemsize if isinstance(itemsize, int) else np.dtype(itemsize).itemsize,
            strategy=asked,
            memory_limit=memory_limit,
            shared=shared,
            runs_locally=local,
            local_cluster=not local and default_cluster_is_local(),
        )

    if role == "whole":
        return job("direct")
    if forks and strategy == "auto":
        reason = "into an icechunk session: each shard task writes its whole shards into its fork"
        return _runs(replace(job("direct"), requested="auto", reason=reason), plan, chunks, local)
    chosen = job(strategy)
    if role == "reduced" and strategy == "auto" and chosen.strategy == "staged":
        direct = job("direct")
        # half: a worker's budget (its memory_limit / threads) also holds the worker itself
        # and the blocks it keeps for other tasks; a direct task near the whole budget
        # gets the worker killed (2 processes of 300 MiB, a 96 MiB level-1 shard: 288 MiB)
        return direct if 2 * direct.peak_per_task <= direct.memory_limit else chosen
    return _runs(chosen, plan, chunks, local) if role == "array" else chosen


def _runs(chosen: WritePlan, plan: ShardPlan, chunks: Any, local: bool) -> WritePlan:
    """A direct job from a source without a dask graph: read shard by shard inside the shard
    tasks, which run in runs of neighbouring shards, as many as the threads that run them
    want."""
    if chosen.strategy != "direct" or chunks is not None:
        return chosen
    per = shards_per_task(plan.ntasks, default_threads(local))
    return replace(chosen, per_task=per) if per > 1 else chosen


def _is_dask(source: Any) -> bool:
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(source, da.Array)


def array_write(
    store: ShardStore,
    info: Any,
    intent: Intent,
    source: Any,
    *,
    job: WritePlan | None = None,
    plan: ShardPlan | None = None,
    create: Callable[[], object] | None = None,
    shared: bool = False,
    resume: bool = False,
    compute: bool = True,
    strategy: Kind | None = None,
    options: WriteSettings | None = None,
    prefix: str = "",
    tree: TreeLink | None = None,
) -> ArrayWrite:
    """The pipeline's write of ``source`` into the array at ``store`` (``info``), by ``job``
    (or, for a copy, ``plan`` with ``strategy="copy"``), as ``intent`` says: ``create``
    stores the metadata when the intent creates. ``shared``: the write may run beside others
    (a region of an existing array): it holds a shared lease where its merges commit
    conditionally, else the exclusive one. ``options``: the settings its tasks take;
    ``prefix``: its path in the report's keys; ``tree``: its link in a tree of writes."""
    extra: dict[str, Any] = {"prefix": prefix, "tree": tree}
    if options is not None:
        extra["options"] = options
    if job is not None:
        plan = job.plan
        extra.update(strategy=strategy or job.strategy, blocks=job.blocks, job=job)
        merges_unconditionally = job.merges_unconditionally
    else:
        extra["strategy"] = strategy
        merges_unconditionally = False
    assert plan is not None and extra["strategy"] is not None
    conditional = versions(store) is not None and not merges_unconditionally
    return ArrayWrite(
        store=store,
        info=info,
        plan=plan,
        source=source,
        shared=shared and not intent.create and conditional,
        clear=intent.clear,
        create=create if intent.create else None,
        resume=resume,
        adopt_done=intent.adopt_done,
        must_adopt=intent.must_adopt,
        # a numpy source is copied into the graph when it runs later
        copy_source=not compute,
        **extra,
    )


def create_metadata(zstore: Any, path: str | None, kwargs: dict[str, Any], probe: Any) -> None:
    """Store the new array's metadata (``kwargs`` of ``zarr.create_array``; ``probe`` the array
    they build in memory), again after a transient store failure; a try whose answer was lost
    may have stored it already, which then counts as done. Another writer's array there is
    :class:`ArrayExistsError` (never overwritten: zarr's ``overwrite=True`` would delete this
    write's lease with it)."""
    import zarr
    from zarr.errors import ContainsArrayError

    tried = False

    def create() -> None:
        nonlocal tried
        try:
            zarr.create_array(zstore, name=path or None, overwrite=False, **kwargs)
        except ContainsArrayError as e:
            if not (tried and same_metadata(probe, zstore, path)):
                # another writer created it after this call's existence check (both passed
                # it, the other took the lease first and finished): mode "w-" refused late
                raise ArrayExistsError(
                    f"{describe(zstore, path)} was created by another writer while this write "
                    "started (use mode='w' to replace it, 'a' or 'r+' to write into it)"
                ) from e
        finally:
            tried = True

    retry_transient(create)
