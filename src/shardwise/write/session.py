"""One write from the client's side: lease, write marker, resume and clean-up around the graph.

:class:`shardwise.write.pipeline.Pipeline` drives one session per array written, for every
front end (``write_array``, ``to_zarr``, ``convert``, batch parts), in this order, so that a
writer killed at any moment leaves a state a rerun with ``resume=True`` can finish::

    begin    take the lease (refused: LeaseHeldError, before anything is written): exclusive,
             or shared for writes into an existing array that run side by side, or a batch
             part's own
    clear    mode "w": delete the old array except the lease (zarr's overwrite would delete it)
    start    adopt the open marker of the same region (resume) or write a new one; on resume
             remove temp files and abandoned multipart uploads aimed at this write's shards,
             and the staged pieces of the adopted write
    resume   find the shards a resumed write stored already (``done``): their tasks are left out
    ...      metadata, then the shard tasks (each stores its shard, then its record)
    tidy     after the tasks: staged pieces of retried tasks, abandoned multipart uploads
    finish   marker -> done, drop older done markers inside this region, (a batch part) its
             record, release the lease
    abort    (on error) release the lease; the open marker stays for resume and verify
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from ..codec.shard import ShardCodec
from ..core.layout import Coord, Layout, Region
from ..core.plan import ShardPlan
from ..durability.journal import (
    BATCH,
    RECORDS,
    Journal,
    WriteMarker,
    clear_array,
    marker_name,
    now,
    read_marker,
    read_markers,
    region_list,
    remove_run_temps,
    remove_temp_files,
)
from ..durability.lease import LEASE, Lease, read_lease
from ..durability.records import read_run_records
from ..engine.staged import remove_staged
from ..errors import ArrayExistsError, LeaseHeldError
from ..runtime import pool as _pool
from ..storage.s3 import abort_multipart_uploads, multipart_client
from ..storage.store import ShardStore, describe

TAG_DIGITS = 12


@dataclass(frozen=True)
class PartLease:
    """The lease of one part of a batch write (``shardwise.batch``), held instead of the
    array's: parts own disjoint shards, so they run side by side; a lease on the whole array
    refuses the part."""

    name: str  # durability.lease.part_lease(i, n)
    purpose: str
    expiry: float | None = None
    # what the part leaves once its write is done (its record), while it still holds the lease
    record: Callable[[Any], None] | None = None

    def acquire(self, store: ShardStore, break_stale: bool, takeover: bool) -> Lease:
        held = Lease.acquire(
            store,
            name=self.name,
            purpose=self.purpose,
            break_stale=break_stale,
            takeover=takeover,
            expiry=self.expiry,
        )
        whole = read_lease(store, LEASE)
        if whole is not None:
            held.release()
            raise LeaseHeldError(f"the whole array is leased by {whole.describe()}")
        return held


@dataclass
class WriteSession:
    store: ShardStore
    region: Region
    shape: tuple[int, ...]
    lease: Lease | None = None
    marker: WriteMarker | None = None
    # the shards it writes (its keys derived when a clean-up needs them: a million keys would
    # otherwise travel with the write's finish, e.g. in a compute=False graph)
    plan: ShardPlan | None = None
    resumed: bool = False
    cleaned: dict[str, int] = field(default_factory=dict)
    shared: bool = False  # other writes may run beside this one (see begin)
    done: frozenset[Coord] = frozenset()  # shards a resumed write found stored (see find_done)
    on_done: Callable[[Any], None] | None = None  # given the report once the marker is done
    # a resume that adopted a finished write's marker: put again ("open") only once a shard
    # is found missing (find_done); a write that finds every shard done changes nothing
    finished: bool = False
    # shards a finished write left all fill (not stored, no record): their tasks run again,
    # storing nothing (find_done)
    fill: frozenset[Coord] = frozenset()
    # every compute of its tasks ran in this process (Pipeline.compute; None: none ran here)
    here: bool | None = None

    @classmethod
    def begin(
        cls,
        store: ShardStore,
        region: Region,
        shape: tuple[int, ...],
        *,
        lease: bool,
        shared: bool = False,
        break_lease: bool = False,
        takeover: bool = False,
        part: PartLease | None = None,
    ) -> WriteSession:
        """``shared``: a write into an existing array whose shared shards commit conditionally
        takes a shared lease (side by side with other such writes), any other the exclusive one.
        ``takeover`` (a resumed write): take over a lease whose holder is provably gone.
        ``part``: a batch part's write takes that part's lease instead (see :class:`PartLease`).
        """
        if part is not None:
            mine = part.acquire(store, break_lease, takeover) if lease else None
            return cls(store, region, shape, mine, shared=shared, on_done=part.record)
        held = None
        if lease and shared:
            held = Lease.acquire_shared(
                store, purpose="region write", break_stale=break_lease, takeover=takeover
            )
        elif lease:
            held = Lease.acquire(
                store, name=LEASE, purpose="write", break_stale=break_lease, takeover=takeover
            )
        if held is not None and store.get(BATCH) is not None:
            held.release()
            raise LeaseHeldError(
                f"{describe(store.store, store.path)} has a batch write in progress (see "
                "shardwise.batch): finalize it first, or write with lease=False"
            )
        return cls(store, region, shape, held, shared=shared)

    @property
    def keys(self) -> frozenset[str]:
        """The keys of the shards this write writes."""
        return frozenset() if self.plan is None else frozenset(plan_keys(self.plan))

    @property
    def leased(self) -> bool:
        return self.lease is not None

    def clear(self, *, everything: bool) -> None:
        """Before a create: drop the old array (``everything``) or just stale journal state."""
        keep = {LEASE} if self.lease is not None else set()
        clear_array(self.store, keep, journal_only=not everything)

    def start(
        self,
        *,
        resume: bool,
        plan: ShardPlan | None = None,
        adopt_done: bool = False,
        must_adopt: bool = False,
        append: dict[str, Any] | None = None,
    ) -> None:
        """Write (or on resume adopt) this write's marker; on resume clean up after the last try.

        Resume adopts the open marker of an interrupted write of the same region; a finished one
        only with ``adopt_done`` (every mode but "w", which replaces the array): its shards whose
        records still match are skipped.
        ``must_adopt``: raise FileExistsError when there is nothing to adopt.
        ``append``: an append's dimension and axis, kept in its marker (journal.py).
        """
        found = read_marker(self.store, self.region) if resume else None
        if found is not None and (
            list(found.shape) != list(self.shape) or (found.status == "done" and not adopt_done)
        ):
            found = None
        if found is None and must_adopt:
            raise ArrayExistsError(
                f"an array exists at {self.store.path or '/'!r} without an interrupted write of "
                "this region to resume (use mode='w' to replace it)"
            )
        if found is not None:
            self.marker = replace(found, status="open", finished=None, append=append)
            self.resumed = True
            self.finished = found.status == "done"
        else:
            self.marker = WriteMarker(
                id=uuid.uuid4().hex,
                region=region_list(self.region),
                shape=list(self.shape),
                status="open",
                started=now(),
                append=append,
            )
        _pool.start_write(self.marker.id)
        self.plan = plan
        # this write's temp files carry its id (kept on resume): clean-ups of a write that runs
        # beside others remove its own leftovers only
        self.store = replace(self.store, tag=self.marker.id[:TAG_DIGITS])
        if resume:
            started = datetime.datetime.now(datetime.UTC)
            self.cleaned["temp_files"] = len(self._remove_temp_files())
            self.cleaned["multipart_uploads"] = len(
                abort_multipart_uploads(self.store, self.keys, before=started)
            )
            # pieces of an interrupted staged write: redone (whatever strategy resumes it)
            self.cleaned["staged_pieces"] = remove_staged(self.store, self.marker.id)
        if not self.finished:  # a finished write's marker stays done until a shard is missing
            self.store.put(marker_name(self.region), self.marker.to_bytes())

    def resize(self, region: Region, shape: tuple[int, ...], plan: ShardPlan) -> None:
        """The open write now covers ``region`` of the array at ``shape`` (a stream's write
        grown by a shard-row, or cut back to what was written): its marker, open, put under
        the new region before the old one goes (a kill between leaves both, the same write);
        the shards found done before are not skipped from here on (the caller writes them)."""
        assert self.marker is not None and not self.finished
        old = marker_name(self.region)
        self.region, self.shape, self.plan = region, tuple(shape), plan
        self.marker = replace(self.marker, region=region_list(region), shape=list(self.shape))
        self.done = frozenset()
        self.store.put(marker_name(region), self.marker.to_bytes())
        if marker_name(region) != old:
            self.store.delete(old)

    def _remove_temp_files(self) -> list[str]:
        assert self.marker is not None
        tag = self.store.tag if self.shared else ""
        removed = remove_temp_files(self.store, self._targets(), tag=tag)
        return removed + remove_run_temps(self.store, self.marker.id)

    def _targets(self) -> set[str]:
        """Every key this write may put: its shards, their records, its marker, the metadata."""
        keys = self.keys
        extra = {marker_name(self.region), "zarr.json"}
        if self.lease is not None and self.lease.name == LEASE:  # nobody else may create it now
            extra.add(LEASE)
        return {*keys, *(RECORDS + k for k in keys), *extra}

    def journal(self, codec: ShardCodec, layout: Layout | None = None) -> Journal:
        assert self.marker is not None
        end = codec.index_location == "end"
        return Journal(self.store, self.marker.id, codec.index_nbytes, end, layout)

    @property
    def skipped(self) -> int:
        """Shards this (resumed) write leaves out: stored and recorded before."""
        return len(self.done)

    def find_done(self, plan: ShardPlan, codec: ShardCodec) -> frozenset[Coord]:
        """Remember (as ``done``) and return the shards of ``plan`` stored before (resume).
        A finished write resumed with a shard missing (deleted or damaged since) is open
        again before any task runs; with none missing it has nothing to do (:attr:`idle`)."""
        if not self.resumed:
            self.done = frozenset()
            return self.done
        done, fill = stored_before(self.journal(codec, plan.layout), plan, fill=self.finished)
        self.done, self.fill = frozenset(done), frozenset(fill)
        if self.finished and len(self.done) + len(self.fill) < plan.ntasks:
            assert self.marker is not None
            self.store.put(marker_name(self.region), self.marker.to_bytes())
            self.finished = False
        return self.done

    @property
    def idle(self) -> bool:
        """A resume of a finished write that found every shard done: it changes nothing (its
        marker, records and shards stay as they were)."""
        return self.finished

    def tidy(self, *, staged: bool, multipart: bool) -> None:
        """After every shard task ran: remove the ``staged`` pieces of tasks retried after their
        worker died, and (``multipart``: shards committed by multipart upload) the uploads such
        workers abandoned; only a leased write may, nobody else then writes its shards."""
        assert self.marker is not None
        if staged:
            self._count("staged_pieces", remove_staged(self.store, self.marker.id))
        if multipart and self.leased and multipart_client(self.store) is not None:
            self._count("multipart_uploads", len(abort_multipart_uploads(self.store, self.keys)))

    def _count(self, what: str, n: int) -> None:
        self.cleaned[what] = self.cleaned.get(what, 0) + n

    def finish(self, report: Any) -> Any:
        """Mark the write done, drop done markers it supersedes, release the lease."""
        try:
            assert self.marker is not None
            # a task rerun after its worker died leaves the dead one's temp file behind; tasks
            # that all ran here removed their own (no directory listed)
            if self.plan is not None and self.plan.ntasks and not self.here:
                self._count("temp_files", len(self._remove_temp_files()))
            if not self.idle:  # an idle resume leaves the finished write's marker as it was
                done = replace(self.marker, status="done", finished=now())
                me = marker_name(self.region)
                self.store.put(me, done.to_bytes())
                for name, m in read_markers(self.store).items():
                    if (
                        name != me
                        and m is not None
                        and m.status == "done"
                        and m.inside(done.region)
                    ):
                        self.store.delete(name)
            if self.on_done is not None:
                self.on_done(report)
        finally:
            self.abort()
        return report

    def abort(self) -> None:
        if self.lease is not None:
            self.lease.release()


def stored_before(
    journal: Journal, plan: ShardPlan, *, fill: bool = True
) -> tuple[set[Coord], set[Coord]]:
    """The shards of ``plan`` that the write of ``journal`` stored and recorded (their objects
    as recorded), and (``fill``: looked for) those with neither object nor record: when that
    write finished (its marker done), shards of all fill value, which a write does not
    store."""
    store = journal.store
    lay = plan.layout
    shards = list(plan_shards(plan))
    runs = read_run_records(store, journal.write_id)  # the records its runs put

    def state(shard: Coord) -> str:
        key = lay.shard_key(shard)
        if journal.matches(key, runs):
            return "done"
        if fill and store.size(key) is None and store.get(RECORDS + key) is None:
            return "fill"  # (a run records no empty shard either)
        return ""

    with ThreadPoolExecutor(4) as pool:  # whole objects in memory on remote stores
        found = list(pool.map(state, shards))
    return (
        {s for s, f in zip(shards, found, strict=True) if f == "done"},
        {s for s, f in zip(shards, found, strict=True) if f == "fill"},
    )


def finished_write(store: ShardStore, plan: ShardPlan, codec: ShardCodec) -> tuple[int, int] | None:
    """The shards a finished write of ``plan``'s region stored and those it left all fill,
    when every shard is as it left them (a resume of it has nothing to do); None when it has
    not finished (no done marker of this region and shape) or a shard is missing or changed
    since. Reads only."""
    found = read_marker(store, plan.region)
    if found is None or found.status != "done" or list(found.shape) != list(plan.layout.shape):
        return None
    end = codec.index_location == "end"
    journal = Journal(store, found.id, codec.index_nbytes, end, plan.layout)
    done, fill = stored_before(journal, plan)
    return (len(done), len(fill)) if len(done) + len(fill) == plan.ntasks else None


def plan_shards(plan: ShardPlan) -> Iterable[Coord]:
    """The shard of every task of ``plan`` (C order)."""
    import itertools

    grids = [range(f, f + len(c)) for f, c in zip(plan.first_shard, plan.task_chunks, strict=True)]
    yield from itertools.product(*grids)


def plan_keys(plan: ShardPlan) -> list[str]:
    lay: Layout = plan.layout
    return [lay.shard_key(s) for s in plan_shards(plan)]
