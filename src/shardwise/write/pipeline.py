"""The one write pipeline under every front end: an :class:`ArrayWrite` per array, one
:class:`Pipeline` around them.

A front end (``write_array``, ``to_zarr`` per variable, ``convert`` per copied array, batch
parts under their part's lease) checks its arguments, then describes each array it writes as an
:class:`ArrayWrite` (store, plan, codec, strategy, source, settings) and hands them all to one
``Pipeline``. The pipeline owns the lifecycle of every array's
:class:`~shardwise.write.session.WriteSession`::

    with Pipeline(writes, lease=..., break_lease=...) as pipe:   # every lease, or none
        pipe.start()              # per array: clear, marker (or adopt it), metadata, done shards
        parts = pipe.parts()      # one graph per array or tree (build_part), shards done out
        return pipe.run(parts, compute=...)   # one combined graph; then tidy, markers done

and, when anything raises inside it, stops the tasks of every array still running in this
process (:func:`~shardwise.runtime.pool.stop_write`) before the leases are released. N arrays
run as one dask graph (to_zarr's variables, every group of a DataTree, every level of a pyramid).
"""

from __future__ import annotations

import functools
import logging
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Literal, Protocol

from ..codec.metadata import ArrayInfo
from ..compat import tasks_run_here
from ..core.job import WritePlan
from ..core.layout import Coord
from ..core.plan import ShardPlan
from ..durability.journal import Journal
from ..durability.lease import LEASE, SHARED
from ..engine.forks import fork_tree
from ..engine.inprocess import LocalShards, dask_parts
from ..engine.report import WriteReport
from ..engine.runs import ShardRuns, copied
from ..engine.tree import TreeLink
from ..engine.write import ShardWriter, WriteSettings, build_graph, lazy_call
from ..errors import ArrayExistsError, PlanError
from ..runtime import pool as _pool
from ..storage.consolidated import Nodes
from ..storage.store import ShardStore, describe
from .compute import Part, compute_parts, deferred, total_report, total_report_of
from .finish import Finish, Kind
from .session import PartLease, WriteSession

Clear = Literal["none", "journal", "all"]
log = logging.getLogger("shardwise")


class ShardTasks(Protocol):
    """The source of a ``copy`` write: makes the task that writes one shard."""

    def copier(
        self, info: ArrayInfo, store: ShardStore, journal: Journal
    ) -> Callable[[Coord], WriteReport]: ...


@dataclass(frozen=True)
class ArrayWrite:
    """One array to write: what the session and the engine need (the job a front end builds).

    ``source``: a numpy or dask array (direct, staged) or :class:`ShardTasks` (copy).
    ``clear``: before the marker, drop stale journal state ("journal") or the old array but its
    lease ("all"). ``create``: writes the metadata after the marker, before any data.
    ``copy_source``: a numpy source is copied into the graph (it runs later: compute=False).
    ``prefix``: put before the shard keys of the report (the array's path in a group).
    ``tree``: a direct write linked into a tree of writes from one source (a pyramid's levels,
    each reduced into the next): the tree is one part, built by :func:`build_part` too.
    """

    store: ShardStore
    info: ArrayInfo
    plan: ShardPlan
    strategy: Kind
    source: Any
    options: WriteSettings = field(default_factory=WriteSettings)
    blocks: tuple[tuple[int, ...], ...] = ()
    shared: bool = False
    clear: Clear = "none"
    create: Callable[[], object] | None = None
    resume: bool = False
    adopt_done: bool = False
    must_adopt: bool = False
    copy_source: bool = False
    prefix: str = ""
    append: dict[str, Any] | None = None  # an append's dimension and axis, for its marker
    job: WritePlan | None = None  # the validated plan it came from (None: a copy)
    # shards per run task, each run's records in one object (a stream's rows written once:
    # write/stream_rows.py); None: as the job says
    per_task: int | None = None
    tree: TreeLink | None = None  # its link in a tree of direct writes (None: alone)


def check_write(w: ArrayWrite) -> None:
    """What every front end's write must be before the pipeline runs it (the pipeline checks
    each on entry, so no front end runs an unchecked plan): its job's memory check passes, the
    plan is the job's, its grid is the array's, its region inside the array and its source of
    the region's shape. A :class:`PlanError` names the array."""
    if w.job is not None:
        w.job.validate()
    lay, grid = w.plan.layout, w.info.layout
    problems = []
    if w.job is not None and w.job.plan != w.plan:
        problems.append("the plan is not its job's")
    if (lay.shard_shape, lay.shard_sizes, lay.chunk_shape) != (
        grid.shard_shape,
        grid.shard_sizes,
        grid.chunk_shape,
    ):
        problems.append(f"{lay.grid_text()}, inner chunks {lay.chunk_shape} are not the array's")
    if any(not 0 <= r.start <= r.stop <= n for r, n in zip(w.plan.region, lay.shape, strict=True)):
        problems.append(f"region {w.plan.region} is outside the array {lay.shape}")
    want = tuple(r.stop - r.start for r in w.plan.region)
    shape = getattr(w.source, "shape", None)
    if w.strategy != "copy" and shape is not None and tuple(shape) != want:
        problems.append(f"the source's shape {tuple(shape)} is not the region's {want}")
    if problems:
        raise PlanError(
            f"the write of {describe(w.store.store, w.store.path)}: " + "; ".join(problems)
        )


def lease_kind(session: WriteSession) -> str:
    """The lease a write holds: "exclusive", "shared", "part" (a batch part's) or "none"."""
    held = session.lease
    if held is None:
        return "none"
    if held.name == LEASE:
        return "exclusive"
    return "shared" if held.name.startswith(SHARED) else "part"


def _log_write(w: ArrayWrite, session: WriteSession) -> None:
    """One debug line per array: how it is written and under which lease (what a front end
    decided, through the one policy, write/intent.py)."""
    log.debug(
        "%s: %s write, %s lease, clear %s, %s",
        describe(w.store.store, w.store.path),
        w.strategy,
        lease_kind(session),
        w.clear,
        "creates" if w.create is not None else "keeps the metadata",
    )


class Pipeline:
    """A context manager over the sessions of ``writes``: leases taken on entry (a refused one
    releases those taken); on an error inside, the tasks of every write still running in this
    process finish before the leases go. Finishing is :meth:`run`'s (or the Delayed's)."""

    def __init__(
        self,
        writes: Sequence[ArrayWrite],
        *,
        lease: bool,
        break_lease: bool = False,
        part: PartLease | None = None,
        nodes: Sequence[Nodes] | None = None,
    ) -> None:
        for w in writes:
            check_write(w)
        self.writes = list(writes)
        self.lease = lease
        self.break_lease = break_lease
        self.part = part  # a batch part's lease, taken instead of the array's
        self.sessions: list[WriteSession] = []
        self.forked = False  # an icechunk session's write: its forks merged as a tree
        # what the finish re-consolidates above (default: the arrays created; () for none)
        self.nodes = list(_array_nodes(self.writes) if nodes is None else nodes)

    def __enter__(self) -> Pipeline:
        try:
            for w in self.writes:
                self.sessions.append(
                    WriteSession.begin(
                        w.store,
                        w.plan.region,
                        w.info.layout.shape,
                        lease=self.lease,
                        shared=w.shared,
                        break_lease=self.break_lease,
                        # a resumed write takes over the lease of a holder that is gone
                        takeover=w.resume,
                        part=self.part,
                    )
                )
                _log_write(w, self.sessions[-1])
        except BaseException:
            self.fail()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if error is not None:
            self.fail()

    def fail(self) -> None:
        """Refuse the tasks not started yet, wait for those running, then release the leases."""
        for s in self.sessions:
            if s.marker is not None:
                _pool.stop_write(s.marker.id)
        for s in self.sessions:
            s.abort()

    def session(self, write: ArrayWrite) -> WriteSession:
        """The session of ``write``: one of the pipeline's writes, or a flush's write of a
        region of one of its arrays (checked as every write is, inside the array's marker)."""
        for w, s in zip(self.writes, self.sessions, strict=True):
            if w is write:
                return s
        for w, s in zip(self.writes, self.sessions, strict=True):
            if w.store.store is write.store.store and w.store.path == write.store.path:
                check_write(write)
                if not _inside(write.plan.region, s.region):
                    raise PlanError(
                        f"a flush of {describe(w.store.store, w.store.path)} writes "
                        f"{write.plan.region}, outside the region its write started with "
                        f"({s.region})"
                    )
                return s
        raise PlanError(
            f"{describe(write.store.store, write.store.path)} is not an array of this write"
        )

    def onto(self, store: Any) -> None:
        """Every array's shard tasks write into ``store`` (an icechunk session's fork, which
        each task forks again): their forks merged as a tree when the parts run."""
        for s in self.sessions:
            s.store = replace(s.store, store=store)
        self.forked = True

    def compute(self, parts: list[Part], progress: bool, desc: str = "shardwise") -> WriteReport:
        """Compute ``parts`` now, in one graph, into one report (nothing finished): the
        forks of a session's tasks merged as a tree of tasks (a bar counts shard tasks: their
        forks are merged in the client)."""
        if self.forked and not progress:
            parts = fork_tree(dask_parts(parts))
        here = tasks_run_here()
        for s in self.sessions:
            s.here = here and s.here is not False
        return compute_parts(parts, progress, desc)

    def start(self) -> None:
        """Per write: clear, marker (adopted on resume), metadata, the shards done before."""
        for w, s in zip(self.writes, self.sessions, strict=True):
            if w.create is not None and w.clear != "all" and not w.resume:
                _still_absent(w.store)
            if w.clear != "none":
                s.clear(everything=w.clear == "all")
            s.start(
                resume=w.resume,
                plan=w.plan,
                adopt_done=w.adopt_done,
                must_adopt=w.must_adopt,
                append=w.append,
            )
            if w.create is not None:
                w.create()
            s.find_done(w.plan, w.info.codec)

    def parts(self, writes: Sequence[ArrayWrite] | None = None) -> list[Part]:
        """The dask work of ``writes`` (default: all), one part per array, or per tree of
        linked writes (its levels in order; none when every shard of it is stored)."""
        chosen = self.writes if writes is None else writes
        out = [(w.prefix, build_part([(w, self.session(w))])) for w in chosen if w.tree is None]
        trees: dict[str, list[tuple[ArrayWrite, WriteSession]]] = {}
        for w in chosen:
            if w.tree is not None:
                trees.setdefault(w.tree.tree, []).append((w, self.session(w)))
        for links in trees.values():
            links.sort(key=lambda ws: ws[0].tree.level if ws[0].tree else 0)
            work = build_part(links)
            if work is not None:  # None: every shard of the tree stored before (resume)
                out.append(("", work))
        return out

    def run(
        self,
        parts: list[Part],
        *,
        compute: bool,
        progress: bool = False,
        desc: str = "shardwise",
        then: Callable[[], None] | None = None,
        before: WriteReport | None = None,
    ) -> Any:
        """Compute ``parts`` as one graph and :meth:`finish`; with ``compute=False`` a Delayed
        that does both. ``before``: the report of parts already run (added in)."""
        done = Finish(
            [(w.strategy, s) for w, s in zip(self.writes, self.sessions, strict=True)],
            then,
            before,
            self.nodes,
        )
        if not compute:
            from dask.delayed import Delayed, delayed

            # the Delayed carries the sessions only, not the writes (their sources)
            items = deferred(dask_parts(parts))
            if all(isinstance(p, Delayed) for _, p in items):
                # one layer over the parts' graphs: delayed(...) of them would materialise
                # every task (seconds for tens of thousands of blocks)
                total = lazy_call(
                    functools.partial(total_report_of, [prefix for prefix, _ in items]),
                    [p.key for _, p in items],
                    [p for _, p in items],
                )
                return lazy_call(done, total.key, total)
            return delayed(done, pure=False)(delayed(total_report, pure=False)(items))
        return done(self.compute(parts, progress, desc))


def _array_nodes(writes: Sequence[ArrayWrite]) -> list[Nodes]:
    """The arrays ``writes`` create (or replace) as the nodes of their stores (one
    :class:`Nodes` per store); writes into existing arrays change no node, but a resumed one
    may finish a create that was interrupted before its refresh."""
    out: dict[int, Nodes] = {}
    for w in writes:
        if w.create is None and not w.resume:
            continue
        zstore = w.store.store
        had = out.get(id(zstore), Nodes(zstore))
        out[id(zstore)] = Nodes(zstore, (*had.paths, w.store.path), had.consolidate)
    return list(out.values())


def _inside(region: tuple[slice, ...], outer: tuple[slice, ...]) -> bool:
    return all(o.start <= r.start and r.stop <= o.stop for r, o in zip(region, outer, strict=True))


def _still_absent(store: ShardStore) -> None:
    """A new array's metadata must still be absent once its lease is held: another writer may
    have created (and finished) it after this call's existence check. Checked before the
    journal is cleared and the marker written: that writer's records and finished marker (of
    the same name) must stay."""
    if store.size("zarr.json") is not None:
        raise ArrayExistsError(
            f"{describe(store.store, store.path)} was created by another writer while this "
            "write started (use mode='w' to replace it, 'a' or 'r+' to write into it)"
        )


def build_part(writes: Sequence[tuple[ArrayWrite, WriteSession]]) -> Any:
    """The engine: the dask work that writes ``writes`` inside their sessions (markers
    started), the shards the sessions found done left out. One write of any strategy, or the
    direct writes of one tree (linked by ``tree``, in order: one graph where each level's
    shard tasks hand their reduced blocks to the next level's; None when no shard is left)."""
    write, session = writes[0]
    assert all(s.marker is not None for _, s in writes)
    if write.tree is not None:
        from ..engine.tree import TreeLevel, tree_graph

        return tree_graph(
            [
                TreeLevel(w.tree, direct_writer(w, s), s.done, w.prefix, w.source, w.copy_source)
                for w, s in writes
                if w.tree is not None
            ]
        )
    assert len(writes) == 1, "writes that are not linked are parts of their own"
    journal = session.journal(write.info.codec, write.info.layout)
    done, plan = session.done, write.plan
    if write.strategy == "copy":
        # one Delayed per shard task; the copier counts itself as a running task of the write
        from dask.delayed import delayed

        # the write's store, unless the session's was moved onto an icechunk fork
        moved = session.store.store is not write.store.store
        copy = write.source.copier(write.info, session.store if moved else write.store, journal)
        tok = uuid.uuid4().hex[:12]
        return [
            delayed(copy, pure=False)(s, dask_key_name=f"shardwise-copy-{tok}-{i}")
            for i, s in enumerate(write.info.layout.shards())
            if s not in done
        ]
    if write.strategy == "staged":
        from ..engine.staged import StagedWriter, build_staged

        assert session.marker is not None
        staged = StagedWriter(
            write.info,
            write.store,
            plan,
            write.options,
            write.blocks,
            session.marker.id,
            journal,
            done,
        )
        receipts = build_staged(staged, write.source, copy=write.copy_source)
    else:
        writer = direct_writer(write, session)
        if not _is_dask(write.source):
            # read window by window inside the shard tasks, in runs (engine/runs.py); a write
            # that creates its array records each run of many shards in one object
            per_task = write.per_task or (1 if write.job is None else write.job.per_task)
            batched = per_task > 1 and write.create is not None and not write.shared
            runs = ShardRuns(
                writer,
                write.source,
                per_task,
                plan.keep_mask(done),
                batched=batched or write.per_task is not None,
            )
            if local := LocalShards.of(runs, write.copy_source):
                return local  # a numpy source: run without dask when computed here on threads
            return (
                replace(runs, source=copied(runs.source)) if write.copy_source else runs
            ).graph()
        receipts = build_graph(writer, write.source, copy=write.copy_source)
    keep = plan.keep_mask(done)
    if keep is None:
        return receipts
    # one Delayed per shard task to run, without materializing or optimizing the graph here
    return receipts.to_delayed(optimize_graph=False)[keep].ravel().tolist()


def direct_writer(write: ArrayWrite, session: WriteSession) -> ShardWriter:
    """The direct writer of ``write``: one task per shard, its puts tagged with the write's
    id, its records in the session's journal."""
    return ShardWriter(
        info=write.info,
        store=session.store,  # tagged with this write's id
        plan=write.plan,
        options=write.options,
        journal=session.journal(write.info.codec, write.info.layout),
        shared=write.shared,
    )


def _is_dask(source: Any) -> bool:
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(source, da.Array)
