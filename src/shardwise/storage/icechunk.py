"""Writes into an icechunk ``Session``: one transaction, one task per shard, nothing lost.

icechunk itself is imported only when a front end is given an ``icechunk.Session`` (or its
store): ``import shardwise`` never imports it. A write into a session runs as any other write
(every check first, the metadata written by zarr-python into the session itself), then:

1. :meth:`SessionWrite.fork_store`: the session is forked once, after the metadata (the write's
   target, ``write/execute.py``, moves its pipeline onto the fork); every shard task gets that
   fork (pickled to the workers of a cluster);
2. each shard task writes its whole shards into a fork of its own
   (:meth:`SessionBackend.task_fork`: a copy of the one fork, so on threads too no two tasks
   share one change set) and hands it back in its report (``WriteReport.forks``); a shard the
   write covers in part is read from the session's base (its snapshot plus the changes made
   before the fork) and merged by its one task; the forks are merged as a tree of tasks where
   the shard tasks ran (``engine/forks.py``), each merge checking its inputs disjoint;
3. :meth:`SessionWrite.finish`: the forks left (one per array) are checked disjoint (icechunk's
   merge keeps the last of two writes of one chunk, silently), merged into the session, and
   committed when asked (``rebase_with=ConflictDetector()``).

One write into a session at a time: a session is one change set, and two writes running in it
at once would each merge forks made before the other's changes (an append's rows reserved twice,
a shard two regions share kept from one of them). :meth:`SessionWrite.begin` claims the session
for the call (:func:`writes_into_session`, around every front end, gives the claim back when the
call returns or raises); a call from another thread while it is held is refused before any
change (:class:`TransactionError`). A call inside the same thread's write (``convert``'s arrays)
goes on. A stream holds the claim from its open to its close (:func:`hold`, :func:`release`),
the streams of one front end (a Dataset stream's variables, a pyramid stream's levels) counted:
the session is given back when the last of them has closed or been abandoned.

The transaction is the atomicity: no lease, no ``.shardwise`` journal is written into the
repository (:class:`SessionBackend` keeps them out), and there is nothing to resume: a write
interrupted before its commit leaves the branch unchanged (and, in a client that survived, the
session uncommitted with the new metadata but none of the data); discard its changes
(``session.discard_changes()``) or take a new session and run the write again. The chunk
objects its tasks stored are unreferenced (``repo.garbage_collect``). README's Icechunk section
lists what to rerun.
"""

from __future__ import annotations

import functools
import pickle
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InvalidTypeError, InvalidValueError, TransactionError
from .zarr_backend import ZarrStoreBackend


def is_session(obj: Any) -> bool:
    """Whether ``obj`` is an icechunk Session (no import of icechunk when it is not loaded)."""
    import sys

    mod = sys.modules.get("icechunk")
    return mod is not None and isinstance(obj, mod.Session)


def is_icechunk_store(obj: Any) -> bool:
    """Whether ``obj`` is an ``icechunk.IcechunkStore``."""
    import sys

    mod = sys.modules.get("icechunk")
    return mod is not None and isinstance(obj, mod.IcechunkStore)


def session_write(
    store: Any, commit: Any, lease: Any, resume: Any, compute: Any, strategy: Any
) -> SessionWrite | None:
    """The checked write of a front end into ``store`` when it is an icechunk Session (its
    refusals first), else None; ``commit`` without a session is refused. A session's store
    stands for its session (a read-only one is refused). Imports icechunk only when it is
    one."""
    if is_icechunk_store(store):
        if store.read_only or store.session.read_only:
            raise InvalidValueError(
                "the icechunk store is read-only (the store of a read-only session, or a "
                "read-only view): write into repo.writable_session(branch) or its .store; "
                "nothing was written"
            )
        store = store.session
    if is_session(store):
        return SessionWrite.begin(
            store, commit=commit, lease=lease, resume=resume, compute=compute, strategy=strategy
        )
    if commit is not None:
        raise InvalidValueError(
            f"commit= applies to writes into an icechunk Session, not to {type(store).__name__}"
        )
    return None


def into_session[Options](
    store: Any, commit: Any, options: Options
) -> tuple[SessionWrite | None, Any, Options]:
    """:func:`session_write` and what a front end then writes with: the session's store, and
    its checked ``options`` (a dataclass with ``lease``, ``resume``, ``compute`` and
    ``strategy``, such as ``WriteOptions``) with no lease (the job, ``write/intent.py:job_for``,
    decides the strategy with the session as its input); the store and options as given
    without a session."""
    o: Any = options
    tx = session_write(store, commit, o.lease, o.resume, o.compute, o.strategy)
    if tx is None:
        return None, store, options
    return tx, tx.store, replace(o, lease=False)  # type: ignore[no-any-return]


@dataclass(eq=False)
class _Claim:
    """A session a shardwise write is running in, the thread whose call runs it, and the open
    streams holding it (:func:`hold`: given back by the last of them to close)."""

    session: Any
    thread: int
    streams: int = 0


_claims_lock = threading.Lock()
_claims: list[_Claim] = []  # the sessions being written in this process (compared by ==)


def claim(session: Any) -> None:
    """Claim ``session`` for the calling thread's write: a :class:`TransactionError` when a
    write of another thread holds it (nothing changed); held by this thread already, nothing
    to do. :func:`writes_into_session` gives it back."""
    me = threading.get_ident()
    with _claims_lock:
        other = next((c for c in _claims if c.session == session), None)
        if other is None:
            _claims.append(_Claim(session, me))
            return
    if other.thread != me:
        raise TransactionError(
            f"another shardwise write into this icechunk session (branch "
            f"{session.branch!r}) is running, in another thread: two writes in one session at "
            "once would lose one's changes (each merges forks made before the other's rows "
            "and shards); nothing of this one was written. Run them one after the other, or "
            "each in a session of its own (repo.writable_session(branch)), committed one by "
            "one (commits that share shards conflict instead of losing data)"
        )


def hold(session: Any) -> None:
    """An open stream keeps this thread's claim on ``session`` (:func:`claim`, taken by its
    open) until it closes, across the caller's calls: counted, so that the streams of one
    front end (a Dataset stream's variables, a pyramid stream's levels) keep it until the
    last of them has finished."""
    with _claims_lock:
        for c in _claims:
            if c.session == session:
                c.streams += 1


def release(session: Any) -> None:
    """A stream that held the claim on ``session`` (:func:`hold`) gives its hold back,
    whichever thread it runs in: the claim is given back with the last hold."""
    with _claims_lock:
        for c in _claims:
            if c.session == session:
                c.streams -= 1
        _claims[:] = [c for c in _claims if c.session != session or c.streams > 0]


def writes_into_session[**P, R](call: Callable[P, R]) -> Callable[P, R]:
    """A front end whose call claims a session (:func:`claim`, in :meth:`SessionWrite.begin`):
    the claims its thread took during the call are given back when it returns or raises."""

    @functools.wraps(call)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        me = threading.get_ident()
        with _claims_lock:
            held = [c for c in _claims if c.thread == me]
        try:
            return call(*args, **kwargs)
        finally:
            with _claims_lock:
                _claims[:] = [
                    c
                    for c in _claims
                    if c.thread != me or c.streams > 0 or any(c is h for h in held)
                ]

    return run


@dataclass(frozen=True)
class SessionBackend(ZarrStoreBackend):
    """The I/O of a :class:`~shardwise.storage.store.ShardStore` over an ``IcechunkStore``:
    zarr's API, but nothing of shardwise's journal (``skip``, a key's path segment) goes into
    the repository: its puts and deletes are dropped and it reads as absent."""

    skip: str = ".shardwise"

    def _journal(self, key: str) -> bool:
        return self.skip in key.split("/")

    def get(self, key: str) -> bytes | None:
        return None if self._journal(key) else super().get(key)

    def size(self, key: str) -> int | None:
        import icechunk

        if self._journal(key):
            return None
        try:
            size = super().size(key)
        except icechunk.NotFoundError:  # icechunk's for a missing node or chunk
            return None
        if size == 0 and super().get(key) is None:
            return None  # a chunk deleted in the session has size 0
        return size

    def get_suffix(self, key: str, n: int) -> tuple[bytes, int] | None:
        """The size first (icechunk raises its own error for a missing key), then the range."""
        size = self.size(key)
        if size is None:
            return None
        if size == 0:
            return b"", 0
        return self.get_ranges(key, [(max(0, size - n), min(n, size))])[0], size

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if self._journal(key):
            raise FileNotFoundError(key)
        return super().get_ranges(key, ranges)

    def put(self, key: str, parts: Sequence[Any]) -> None:
        if not self._journal(key):
            super().put(key, parts)

    def delete(self, key: str) -> None:
        if not self._journal(key):
            super().delete(key)

    def list(self, prefix: str) -> list[str]:
        """The keys under ``prefix``. icechunk lists only under a group or an array (a name
        not in the repository yet is an ``InvalidInputError``): under anything else, the keys
        of its nearest listable parent that are under ``prefix``."""
        import icechunk

        if self._journal(prefix):
            return []
        try:
            return super().list(prefix)
        except icechunk.InvalidInputError as e:
            if not prefix.strip("/") or getattr(e, "kind", None) != "bad-key-prefix":
                raise
            parent = prefix.strip("/").rpartition("/")[0]
            under = prefix.strip("/") + "/"
            return [k for k in self.list(parent) if k.startswith(under)]

    def task_fork(self) -> Any:
        """A fork of its own for one shard task (a copy of this store's fork, which no task
        writes into), or None when this store is not a fork's (the caller's own session)."""
        import icechunk

        session = self.store.session  # type: ignore[attr-defined]
        if not isinstance(session, icechunk.ForkSession):
            return None
        return pickle.loads(pickle.dumps(session))


@dataclass
class SessionWrite:
    """One front end call's write into ``session``: checked by :meth:`begin`, forked by
    :meth:`fork` once the metadata is in the session, merged (and committed with ``commit``)
    by :meth:`finish`."""

    session: Any
    commit: str | None = None

    @classmethod
    def begin(
        cls,
        session: Any,
        *,
        commit: Any,
        lease: Any,
        resume: Any,
        compute: Any,
        strategy: Any = "auto",
    ) -> SessionWrite:
        """Refuse what a write into ``session`` cannot do, before anything is written, then
        claim the session for this call (:func:`claim`)."""
        import icechunk

        if isinstance(session, icechunk.ForkSession):
            raise InvalidValueError(
                "write into the Session a fork came from, not into a ForkSession: shardwise "
                "forks the session itself, one fork per shard task"
            )
        if session.read_only:
            raise InvalidValueError(
                "the icechunk session is read-only: write into repo.writable_session(branch)"
            )
        if commit is not None and not isinstance(commit, str):
            raise InvalidTypeError(f"commit must be a str (the commit message), got {commit!r}")
        for name, value, why in (
            ("lease", lease, "the session's transaction keeps other writers out"),
            ("resume", resume, "an interrupted write leaves the session uncommitted: rerun it"),
        ):
            if value is True:
                raise InvalidValueError(f"{name}=True does not apply to an icechunk session: {why}")
        if compute is not True:
            raise InvalidValueError(
                "compute=False does not apply to an icechunk session: the forks of the shard "
                "tasks are merged into it when the write runs"
            )
        if strategy == "staged":
            raise InvalidValueError(
                "strategy='staged' does not apply to an icechunk session: each shard task "
                "writes its whole shard into its fork (strategy='direct')"
            )
        claim(session)  # the last refusal: no other thread's write runs in the session
        return cls(session, commit)

    def xarray_keywords(self, safe_shards: Any, consolidated: Any) -> tuple[Any, bool]:
        """``to_zarr``'s own keywords in a session (its store, lease and strategy are
        :func:`into_session`'s): regions that split shards allowed (each split shard is merged
        by its one task, and another session's write of it conflicts at commit); no
        consolidated metadata (icechunk's store keeps none)."""
        if consolidated is True:
            raise InvalidValueError(
                "consolidated=True does not apply to an icechunk session: its store keeps no "
                "consolidated metadata (it lists a group's members itself)"
            )
        return (False if safe_shards is None else safe_shards), False

    @property
    def store(self) -> Any:
        """The zarr store of the session: the checks and the metadata go through it."""
        return self.session.store

    def fork_store(self) -> Any:
        """Fork the session once (its metadata written) and return the fork's store: the
        write's shard tasks each fork that again (:meth:`SessionBackend.task_fork`), and their
        forks are merged as a tree (``engine/forks.py``) before :meth:`finish`."""
        return self.session.fork().store

    def finish(self, report: Any, progress: bool = False) -> Any:
        """Merge the forks of ``report`` into the session (checked disjoint first), commit if
        asked; returns the report without its forks. ``progress``: a bar over the forks merged
        and the commit (the shard tasks' bar closed when they were done; with a bar, the forks
        are merged here, in the client, and that is not done yet)."""
        forks, report.forks = report.forks, []
        check_disjoint(forks)
        bar = _MergeBar(len(forks)) if progress and forks else None
        try:
            if bar is None:
                self.session.merge(*forks)
            else:
                for fork in forks:
                    self.session.merge(fork)
                    bar.step()
            if self.commit is not None:
                if bar is not None:
                    bar.note(f"committing {self.commit!r}")
                snapshot = self.commit_now()
                report.notes.append(f"committed snapshot {snapshot}")
                if bar is not None:
                    bar.note(f"committed snapshot {snapshot}")
        finally:
            if bar is not None:
                bar.close()
        return report

    def commit_now(self) -> str:
        """Commit the session, rebased on what others committed meanwhile when no chunk of
        theirs is one of ours; a conflict raises :class:`TransactionError`, and so does a
        session without a change to commit (icechunk makes no empty commit)."""
        import icechunk

        assert self.commit is not None
        if not self.session.has_uncommitted_changes:
            raise TransactionError(
                f"commit={self.commit!r}: the write changed nothing in the session of branch "
                f"{self.session.branch!r} (what it wrote was stored already), and icechunk "
                "makes no empty commit; nothing was committed. Write without commit=, or "
                "commit the session yourself (session.commit(message, allow_empty=True))"
            )
        try:
            return str(self.session.commit(self.commit, rebase_with=icechunk.ConflictDetector()))
        except (icechunk.ConflictError, icechunk.RebaseFailedError) as e:
            raise TransactionError(
                f"the commit of branch {self.session.branch!r} conflicts with another "
                f"commit{_conflicts(e)}; the session keeps this write uncommitted (nothing "
                "of either write is lost: rerun this one in a new session)"
            ) from e


class _MergeBar:
    """A tqdm bar over the forks merged into the session, then its commit."""

    def __init__(self, total: int) -> None:
        from tqdm.auto import tqdm

        from ..runtime.terminal import bar_screen

        # a terminal that reports no size: a bar all the same, not an empty line
        self.bar = tqdm(
            total=total, desc="shardwise: merge into the session", unit="fork", **bar_screen()
        )

    def step(self) -> None:
        self.bar.update(1)

    def note(self, text: str) -> None:
        self.bar.set_postfix_str(text)

    def close(self) -> None:
        self.bar.close()


def _conflicts(error: Exception) -> str:
    """What a failed rebase found, array by array: ``: array '/a' shards [0, 1], ...``."""
    found = [
        f"array {c.path!r}"
        + (f" shards {', '.join(map(str, c.conflicted_chunks))}" if c.conflicted_chunks else "")
        + f" ({c.conflict_type})"
        for c in getattr(error, "conflicts", None) or []
    ]
    return f": {'; '.join(found)}" if found else f" ({error})"


def check_disjoint(forks: Sequence[Any]) -> None:
    """Refuse forks that changed one chunk twice (a :class:`TransactionError` naming it):
    merged, the last would win silently. Each shard task's fork changes only its shards."""
    owner: dict[tuple[str, tuple[int, ...]], int] = {}
    for i, fork in enumerate(forks):
        for path, coords in fork.status().updated_chunks.items():
            for c in coords:
                key = (path, tuple(c))
                j = owner.setdefault(key, i)
                if j != i:
                    raise TransactionError(
                        f"two shard tasks (forks {j} and {i}) wrote shard {list(key[1])} of "
                        f"array {path!r}: merged, one write would be lost; nothing was merged"
                    )
