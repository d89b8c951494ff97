"""The one write call: every front end checks its keywords, plans, and calls :func:`execute`.

A front end (``write_array``, a batch part, ``to_zarr`` of a Dataset or a DataTree,
``write_pyramid``, ``convert``'s arrays, ``to_icechunk``) does three things::

    target, o = Target.open(store, commit, options)         # a store, or an icechunk session
    lease = target.lease(o.lease, o.compute, zstore)         # the one lease rule, before a byte
    call = WriteCall(writes, lease=lease, ...)               # its plan: what, and around it
    return execute(target, call)                             # the one sequence below

and :func:`execute` runs the one sequence every write takes::

    leases     every array's (or none: a session, a store that cannot delete, lease=False)
    clear      the front end's groups replaced in mode "w" (``WriteCall.clear``)
    first      metadata the front end puts before the data (``WriteCall.first``)
    start      per array: marker (or the one a resume adopts), metadata, the shards done before
    fork       an icechunk session: forked once, its fork's store given to every shard task
    run        one graph of every array's shard tasks; then tidy, ``WriteCall.then`` (metadata
               after the data), consolidated groups refreshed, markers done, leases released
    commit     an icechunk session: the tasks' forks merged (checked disjoint), committed

A front end that receives its data over time opens the sequence once (:class:`Execution`: one
lease, one marker per array, one fork), writes each flush's shards with
``ex.flush(ex.parts(writes))`` and finishes once with :meth:`Execution.run`: the lifecycle is
not paid per flush. A failure anywhere inside stops this write's running tasks before the
leases go; what was stored stays recorded for ``resume=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from ..durability.lease import store_lease
from ..engine.report import WriteReport
from ..errors import PlanError
from ..storage.consolidated import Nodes
from ..storage.icechunk import SessionWrite, into_session
from ..storage.meter import IOMeter, metered
from ..storage.store import describe
from .compute import Part
from .pipeline import ArrayWrite, Pipeline, check_write
from .session import PartLease

__all__ = ["Execution", "Target", "WriteCall", "execute"]

Options = TypeVar("Options")


@dataclass(frozen=True)
class Target:
    """Where one front-end call writes: a store as given (a zarr store, a path or a URL), or
    an icechunk session, whose ``store`` the front end plans and writes its metadata through;
    its shard tasks write into forks, merged back and committed when the write is done."""

    store: Any
    session: SessionWrite | None = None

    @classmethod
    def open(cls, store: Any, commit: Any, options: Options) -> tuple[Target, Options]:
        """The target of ``store`` and the ``options`` (a dataclass with ``lease``,
        ``resume``, ``compute`` and ``strategy``, such as ``WriteOptions``) a write into it
        takes: into a session, its refusals first (before anything is written), then no lease
        and each shard task writing its whole shards."""
        tx, zstore, checked = into_session(store, commit, options)
        return cls(zstore, tx), checked

    @property
    def forks(self) -> bool:
        """Whether the shard tasks write into forks of an icechunk session."""
        return self.session is not None

    def lease(self, lease: bool | None, compute: bool, zstore: Any) -> bool:
        """Whether the write holds leases on ``zstore`` (the store it resolved): the rule of
        every front end, refused (``lease=True`` on a store that cannot delete) before a
        byte is written. A session's write holds none (its transaction is the lease)."""
        return store_lease(lease, compute, zstore)

    def fork(self, pipe: Pipeline) -> Any:
        """Once the metadata is in the session: fork it and move the pipeline's arrays onto
        the fork's store (each shard task forks it again). Returns the store the tasks write
        into (the fork's; None for a plain store: the arrays' own)."""
        if self.session is None:
            return None
        store = self.session.fork_store()
        pipe.onto(store)
        return store

    def finish(self, report: Any, progress: bool) -> Any:
        """The end of a write that ran: a session's forks merged and committed when asked;
        the report as it is for a store."""
        if self.session is None:
            return report
        return self.session.finish(report, progress=progress)


@dataclass(frozen=True)
class WriteCall:
    """A front end's plan for :func:`execute`: its arrays' writes (each planned and checked
    by the write policy) and what the one sequence does around them.

    ``lease``: whether the arrays are leased (:meth:`Target.lease`); ``part``: a batch part's
    lease instead. ``nodes``: the groups re-consolidated at the end (default: those of the
    arrays created). ``clear(pipe)``: mode "w"'s replaced groups, deleted once the leases are
    held (the pipeline's leases are spared). ``first()``: metadata put before the data (before
    the session is forked: its tasks see it). ``then()``: metadata put after the data (a
    write killed before it leaves the old metadata). ``parts(pipe, store)``: the dask work,
    when the front end builds more than the arrays' shard tasks (``store``: the fork's store
    of a session, else None); default: the pipeline's parts of every array."""

    writes: Sequence[ArrayWrite]
    lease: bool
    break_lease: bool = False
    compute: bool = True
    progress: bool = False
    desc: str = "shardwise"
    part: PartLease | None = None
    nodes: Sequence[Nodes] | None = None
    clear: Callable[[Pipeline], object] | None = None
    first: Callable[[], object] | None = None
    then: Callable[[], None] | None = None
    parts: Callable[[Pipeline, Any], list[Part]] | None = None


def execute(target: Target, call: WriteCall) -> Any:
    """Run ``call`` into ``target`` as the one sequence (module docstring): the report, or
    with ``compute=False`` a Delayed that runs the data and finishes."""
    with Execution(target, call) as ex:
        return ex.run(ex.parts())


@dataclass
class Execution:
    """The one sequence held open: entered, the leases are held, the groups cleared, every
    array started and a session forked; :meth:`flush` writes shards now (any number of
    times), :meth:`run` writes the last ones and finishes once. An error inside stops the
    running tasks and releases the leases (the markers stay for resume)."""

    target: Target
    call: WriteCall
    pipe: Pipeline = field(init=False)
    store: Any = field(init=False, default=None)  # the fork's store of a session
    flushed: WriteReport | None = field(init=False, default=None)
    # the requests and bytes of the client around the tasks (leases, markers, records)
    io: ExitStack = field(init=False, default_factory=ExitStack)
    client: IOMeter = field(init=False, default_factory=IOMeter)

    def __post_init__(self) -> None:
        c = self.call
        self.pipe = Pipeline(
            c.writes, lease=c.lease, break_lease=c.break_lease, part=c.part, nodes=c.nodes
        )

    def __enter__(self) -> Execution:
        self.client = self.io.enter_context(metered())
        try:
            self.pipe.__enter__()
        except BaseException:
            self.io.close()
            raise
        try:
            if self.call.clear is not None:
                self.call.clear(self.pipe)
            if self.call.first is not None:
                self.call.first()
            self.pipe.start()
            self.store = self.target.fork(self.pipe)
        except BaseException:
            self.pipe.fail()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.pipe.__exit__(kind, error, tb)
        finally:
            self.io.close()

    def parts(self, writes: Sequence[ArrayWrite] | None = None) -> list[Part]:
        """The dask work of ``writes`` (default: the call's, built as the call says); a
        flush's writes are new regions of the call's arrays, each with its source."""
        if writes is None and self.call.parts is not None:
            return self.call.parts(self.pipe, self.store)
        return self.pipe.parts(writes)

    def flush(self, parts: list[Part], *, merge: bool = False) -> WriteReport:
        """Write ``parts`` now (``parts(writes)`` of regions of the call's arrays, each with
        its source), inside the open sequence: their shards stored and recorded under its
        leases and markers, nothing finished. Returns this flush's report (added into the one
        :meth:`run` returns). ``merge``: into a session, this flush's forks merged into it now
        (checked disjoint; a stream's flushes, each forked by :meth:`fork_again`)."""
        report = self.pipe.compute(parts, self.call.progress, self.call.desc)
        if merge and self.target.session is not None:
            self.target.session.finish(report)  # no commit: a stream's session has none
        self.flushed = report if self.flushed is None else self.flushed + report
        return report

    def fork_again(self) -> None:
        """Into a session: fork it again (its changes since the last fork, such as an array's
        grown shape and the forks merged by ``flush(merge=True)``, seen by the next flush's
        tasks); nothing for a store."""
        if self.target.session is not None:
            self.store = self.target.fork(self.pipe)

    def resize(self, write: ArrayWrite) -> None:
        """The call's write of ``write``'s array becomes ``write``: a region of the array
        grown (or cut back) to ``write.info``'s shape, checked as every write is. Its open
        marker is put under the new region (``WriteSession.resize``); later flushes write
        inside it. A stream grows its write by each shard-row it seals."""
        check_write(write)
        pipe = self.pipe
        for i, (w, s) in enumerate(zip(pipe.writes, pipe.sessions, strict=True)):
            if w.store.store is write.store.store and w.store.path == write.store.path:
                s.resize(write.plan.region, write.info.layout.shape, write.plan)
                pipe.writes[i] = write
                return
        raise PlanError(
            f"{describe(write.store.store, write.store.path)} is not an array of this write"
        )

    def run(self, parts: list[Part], *, compute: bool | None = None) -> Any:
        """Write ``parts`` and finish the write once (tidy, ``then``, consolidated groups,
        markers done, leases released, a session's forks merged and committed); with
        ``compute=False`` (default: the call's), a Delayed doing both."""
        c = self.call
        now = c.compute if compute is None else compute
        report = self.pipe.run(
            parts, compute=now, progress=c.progress, desc=c.desc, then=c.then,
            before=self.flushed,
        )  # fmt: skip
        if not now:
            return report
        report.add_io(self.client)  # the client's own requests, counted once, at the end
        return self.target.finish(report, c.progress)
