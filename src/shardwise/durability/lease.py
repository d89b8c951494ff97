"""The write lease: at most one writer job per array (or per batch part) at a time.

A lease is a small JSON object under the array, ``.shardwise/lease`` (or
``.shardwise/lease.part-I-of-N`` for a batch part), created *exclusively*: a hard link onto the
name on local files (fails if the name exists), ``If-None-Match: *`` on S3 (zarr's
``ObjectStore.set_if_not_exists``, s3fs ``mode="create"``), ``setdefault`` in memory. After the
create the lease is read back and compared with the token this writer chose, so a conditional
create whose acknowledgement was lost (the retry answers "already exists") still finds the lease
its own.

Writes into an existing array that merge shared shards by conditional commits (region writes,
appends, mode "a"/"r+") may run side by side: each holds a *shared* lease,
``.shardwise/leases/<token>`` (a plain put: the name is its own). The exclusive lease and the
shared ones exclude each other: each side creates its own object first and then looks for the
other side's, and gives up (its object removed) if it finds one or cannot look: two writers can
both give up but never both proceed.

A lease records its holder well enough to tell when the holder is gone: host, boot id, pid and
the process's start time (so a reused pid is not taken for the holder), and a heartbeat: while
the lease is held a background thread rewrites its ``renewed`` time every quarter of its
``expiry`` (:data:`DEFAULT_EXPIRY` seconds, or ``SHARDWISE_LEASE_EXPIRY``). A writer that
resumes (``resume=True``, ``batch part --resume``, ``batch finalize``) takes over a lease whose
holder is provably gone: on this host, its process has ended (or its pid is another process now,
or the host rebooted); on another host, its heartbeat is older than its expiry. The takeover is a
conditional replace of the very object that was judged (a lock plus a stat on local files,
``If-Match`` on S3), so of two resumers racing for one dead lease one wins and the other is
refused; a live holder is never taken over. Stores without conditional replace cannot take over:
there, and for holders that cannot be judged, a lease is broken only on purpose
(``break_lease=True`` or ``shardwise lease PATH --break``). Who holds a lease, and when that
holder is gone: :mod:`.holder`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from ..errors import LeaseHeldError
from ..storage import s3
from ..storage.conditional import CONFLICT, versions
from ..storage.retry import RetryPolicy, any_error
from ..storage.store import JOURNAL, ShardStore, describe
from .holder import (
    DEFAULT_EXPIRY,
    Heartbeat,
    LeaseInfo,
    gone_reason,
    lease_expiry,
    lease_wanted,
    store_lease,
)
from .journal import LEASE as LEASE  # the one definition (journal clears around it)

__all__ = [
    "DEFAULT_EXPIRY",
    "LEASE",
    "SHARED",
    "Lease",
    "LeaseInfo",
    "break_lease",
    "blocking_leases",
    "gone_reason",
    "held_error",
    "is_lease_key",
    "leases_under",
    "lease_expiry",
    "lease_wanted",
    "store_lease",
    "part_lease",
    "read_lease",
    "refuse_foreign",
    "shared_leases",
]

SHARED = ".shardwise/leases/"
_LEASE_NAME = LEASE.rsplit("/", 1)[1]  # "lease"
_SHARED_DIR = SHARED.strip("/").rsplit("/", 1)[1]  # "leases"
log = logging.getLogger("shardwise")


def part_lease(i: int, n: int) -> str:
    """The lease name of part ``i`` of ``n`` of a batch write."""
    return f"{LEASE}.part-{i}-of-{n}"


def _create_exclusive(store: ShardStore, name: str, data: bytes, tries: int = 4) -> None:
    """Create ``name`` with ``data`` unless it exists (then leave it untouched). Transient
    failures are retried: the read-back that follows decides who holds the lease (a create that
    happened although its answer was lost is found out there)."""
    RetryPolicy(tries=tries, retry_on=any_error).call(lambda: _create_once(store, name, data))


def _create_once(store: ShardStore, name: str, data: bytes) -> None:
    key = store.key(name)
    zstore = store.store
    fs = s3.s3fs_of(zstore)
    if fs is not None:  # zarr's FsspecStore checks then sets (not atomic)
        s3.create_if_absent(zstore, fs, key, data)
        return
    buf = default_buffer_prototype().buffer.from_bytes(data)
    with contextlib.suppress(FileExistsError):
        sync(zstore.set_if_not_exists(key, buf))


def _replace_if(store: ShardStore, name: str, data: bytes, judge: Any) -> bool:
    """Replace object ``name`` by ``data`` if ``judge(its holder)`` is true, atomically: the
    replace is conditional on the very version judged (False: not judged so, or changed since,
    or a store that cannot replace conditionally)."""
    backend = versions(store)
    if backend is None:
        return False
    old, generation = RetryPolicy(tries=4, retry_on=any_error).call(lambda: backend.get(name))
    if old is None or not judge(LeaseInfo.from_bytes(old)):
        return False
    with contextlib.suppress(Exception):  # a lost answer: the read-back that follows decides
        return backend.commit(name, [data], generation) is not CONFLICT
    return False


def read_lease(store: ShardStore, name: str = LEASE) -> LeaseInfo | None:
    """The holder of lease ``name``, or None when nobody holds it."""
    data = store.get(name)
    return None if data is None else LeaseInfo.from_bytes(data)


def shared_leases(store: ShardStore) -> dict[str, LeaseInfo]:
    """The shared leases held now (name -> holder)."""
    out = {}
    for name in store.list(SHARED.rstrip("/")):
        held = read_lease(store, name)
        if held is not None:
            out[name] = held
    return out


def is_lease_key(key: str) -> bool:
    """Whether store key ``key`` is a lease object, the one rule every check reads leases by:
    ``<array>/.shardwise/`` then ``lease``, ``lease.part-I-of-N`` or ``leases/<token>``; the lock
    files of conditional commits (``.shardwise/locks/...``, left by a takeover) are none."""
    parts = key.strip("/").split("/")
    if JOURNAL not in parts:
        return False
    rest = parts[parts.index(JOURNAL) + 1 :]
    if len(rest) == 1:
        return rest[0] == _LEASE_NAME or rest[0].startswith(f"{_LEASE_NAME}.part-")
    return len(rest) == 2 and rest[0] == _SHARED_DIR and bool(rest[1])


def leases_under(store: ShardStore, *, array: bool = False) -> dict[str, LeaseInfo]:
    """Every lease object at or below ``store``'s path (``array``: the array's own only), by
    name relative to that path, with its holder."""
    out = {}
    for name in store.list(JOURNAL if array else ""):
        if is_lease_key(name):
            held = read_lease(store, name)
            if held is not None:
                out[name] = held
    return out


def blocking_leases(
    store: ShardStore,
    *,
    keep: Iterable[str] = (),
    takeover: bool = False,
    broken: bool = False,
    array: bool = False,
) -> dict[str, LeaseInfo]:
    """The one answer to "is there a live foreign lease here": the leases at or below
    ``store``'s path that refuse a write replacing it (what ``shardwise lease`` reports held).
    ``keep``: names (or name prefixes ending in "/") this write holds or spares; ``takeover``
    (a resume): a lease whose holder is provably gone does not refuse; ``broken``
    (``break_lease=True``): none does. ``array``: the array's own leases only."""
    if broken:
        return {}
    kept = tuple(keep)
    return {
        name: held
        for name, held in leases_under(store, array=array).items()
        if name not in kept
        and not name.startswith(tuple(k for k in kept if k.endswith("/")))
        and not (takeover and gone_reason(held) is not None)
    }


def refuse_foreign(found: Iterable[str]) -> None:
    """The one refusal of mode "w" over the leases it would delete (``found``: their keys,
    from :func:`blocking_leases`)."""
    foreign = sorted(found)
    if foreign:
        raise LeaseHeldError(
            f"mode='w' would delete {foreign[0]!r}, the lease of another write in progress "
            f"({len(foreign)} such leases): wait for it, or break it if that writer is gone "
            "(break_lease=True, shardwise lease PATH --break)"
        )


def break_lease(store: ShardStore, name: str = LEASE, *, shared: bool = True) -> LeaseInfo | None:
    """Remove lease ``name`` whoever holds it; returns the holder it had (None if free).
    Breaking the array's lease (``name=LEASE``) removes the shared leases too (``shared``)."""
    held = read_lease(store, name)
    if held is not None:
        store.delete(name)
    if name == LEASE and shared:
        for other, info in shared_leases(store).items():
            store.delete(other)
            held = held or info
    return held


@dataclass(frozen=True)
class Takeover:
    """A lease taken over from a holder that was gone."""

    name: str  # the lease object
    holder: LeaseInfo  # who held it
    reason: str  # why that holder counts as gone

    def __str__(self) -> str:
        return f"took over lease {self.name!r} held for {self.holder.describe()}: {self.reason}"


@dataclass
class Lease:
    """A held lease. Use :meth:`acquire`; release with :meth:`release` or as a context manager.

    While held, a background thread renews it (see :mod:`.holder`).
    """

    store: ShardStore
    name: str
    info: LeaseInfo
    held: bool = True
    took_over: list[Takeover] = field(default_factory=list)
    _beat: Heartbeat | None = field(default=None, repr=False)

    @classmethod
    def acquire(
        cls,
        store: ShardStore,
        *,
        name: str = LEASE,
        purpose: str = "write",
        break_stale: bool = False,
        takeover: bool = False,
        expiry: float | None = None,
        where: str = "",
    ) -> Lease:
        """Create lease ``name`` exclusively or raise :class:`LeaseHeldError`.

        ``takeover=True`` takes over a lease (and removes shared leases) whose holder is
        provably gone (:func:`gone_reason`), never a live one. ``break_stale=True`` first
        removes a lease someone else holds: only on purpose, when that writer is known to be
        gone. ``expiry``: seconds this holder promises to renew within (default
        :func:`lease_expiry`).
        """
        expiry = lease_expiry(expiry)
        if break_stale:
            break_lease(store, name)
        info = LeaseInfo.new(purpose, expiry)
        took: list[Takeover] = []
        if takeover and name == LEASE:
            # a live shared holder refuses this acquire: before any takeover changes the store
            live = {n: h for n, h in shared_leases(store).items() if gone_reason(h) is None}
            if live:
                first, holder = sorted(live.items())[0]
                raise held_error(store, first, f"{holder.describe()} ({len(live)} writers)", where)
        held = _create_or_take(store, name, info, takeover, took)
        if held is None or held.token != info.token:
            who = "an unknown writer (the lease vanished)" if held is None else held.describe()
            raise held_error(store, name, who, where)
        try:  # refused by a shared holder, or the shared leases unreadable: none kept
            others = shared_leases(store) if name == LEASE else {}
            if others and takeover:
                others = _drop_gone_shared(store, others, took)
            if others:
                first, by = sorted(others.items())[0]
                raise held_error(store, first, f"{by.describe()} ({len(others)} writers)", where)
        except BaseException:
            _release_own(store, name, info)
            raise
        return cls(store, name, info, took_over=took)._started()

    @classmethod
    def acquire_shared(
        cls,
        store: ShardStore,
        *,
        purpose: str = "region write",
        break_stale: bool = False,
        takeover: bool = False,
        expiry: float | None = None,
        where: str = "",
    ) -> Lease:
        """Take a shared lease (writers of shared shards that commit conditionally), or raise
        :class:`LeaseHeldError` while the exclusive lease is held (``break_stale=True`` first
        removes it, for a holder known to be gone; ``takeover=True``, one provably gone)."""
        expiry = lease_expiry(expiry)
        if break_stale:
            break_lease(store, LEASE, shared=False)
        info = LeaseInfo.new(purpose, expiry)
        name = SHARED + info.token
        store.put(name, info.to_bytes())
        took: list[Takeover] = []
        try:  # refused by the exclusive holder, or its lease unreadable: this one removed
            held = read_lease(store, LEASE)
            if held is not None and takeover:
                # the dead holder's lease is ours for a moment, then goes (as a release)
                mine = LeaseInfo.new(f"{purpose} (taking over)", expiry)
                if _take_over(store, LEASE, mine, took):
                    _release_own(store, LEASE, mine)
                    held = read_lease(store, LEASE)
            if held is not None:
                raise held_error(store, LEASE, held.describe(), where)
        except BaseException:
            store.delete(name)
            raise
        return cls(store, name, info, took_over=took)._started()

    def _started(self) -> Lease:
        for t in self.took_over:
            log.warning("%s: %s", describe(self.store.store, self.store.path), t)
        self._beat = Heartbeat(self)
        self._beat.start()
        return self

    def renew(self) -> bool:
        """Rewrite this lease's heartbeat (``renewed``); False when this writer no longer holds
        it (broken, or taken over)."""
        if not self.held:
            return False
        info = replace(self.info, renewed=time.time())
        data = info.to_bytes()
        if versions(self.store) is not None:
            _replace_if(self.store, self.name, data, lambda now: now.token == info.token)
        else:  # no conditional replace: check, then put (a takeover cannot happen there)
            now = read_lease(self.store, self.name)
            if now is not None and now.token == info.token:
                self.store.put(self.name, data)
        now = read_lease(self.store, self.name)
        if now is None or now.token != info.token:
            return False
        self.info = info
        return True

    def release(self) -> None:
        """Remove the lease if this writer still holds it (a broken lease is left alone)."""
        if not self.held:
            return
        self.held = False
        if self._beat is not None:
            self._beat.stop()  # (joined: none of its renewals is under way)
        _release_own(self.store, self.name, self.info, renewing=self._beat is None)

    def __getstate__(self) -> dict[str, Any]:
        # a copy sent to a worker (a compute=False write's finish runs there) has no heartbeat:
        # the renewing thread stays in the process that took it, stopping once it is released
        return {**self.__dict__, "_beat": None}

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _create_or_take(
    store: ShardStore, name: str, info: LeaseInfo, takeover: bool, took: list[Takeover]
) -> LeaseInfo | None:
    """Create lease ``name`` as ``info`` or, with ``takeover``, take it over from a holder that
    is gone; the holder after that (``info`` itself when this writer holds it)."""
    held = None
    for _ in range(3):  # a lease released between the create and the read: create again
        _create_exclusive(store, name, info.to_bytes())
        held = read_lease(store, name)
        if held is not None and held.token != info.token and takeover:
            _take_over(store, name, info, took)
            held = read_lease(store, name)
        if held is not None:
            return held
    return held


def _take_over(store: ShardStore, name: str, info: LeaseInfo, took: list[Takeover]) -> bool:
    """Replace lease ``name`` by ``info`` if its holder is gone; True when ``info`` holds it."""
    judged: dict[str, Any] = {}

    def gone(holder: LeaseInfo) -> bool:
        judged.update(holder=holder, reason=gone_reason(holder, info.expiry))
        return judged["reason"] is not None

    _replace_if(store, name, info.to_bytes(), gone)
    now = read_lease(store, name)
    if now is None or now.token != info.token:
        return False
    took.append(Takeover(store.key(name), judged["holder"], judged["reason"]))
    return True


def _drop_gone_shared(
    store: ShardStore, others: dict[str, LeaseInfo], took: list[Takeover]
) -> dict[str, LeaseInfo]:
    """Remove the shared leases whose holders are gone (each is its holder's alone: nobody
    else writes it) unless one is live (then the acquire is refused, and changes nothing); the
    live ones."""
    reasons = {name: gone_reason(holder) for name, holder in others.items()}
    live = {name: others[name] for name, reason in reasons.items() if reason is None}
    if live:
        return live
    for name, reason in reasons.items():
        assert reason is not None
        store.delete(name)
        took.append(Takeover(store.key(name), others[name], reason))
    return {}


def _release_own(store: ShardStore, name: str, info: LeaseInfo, renewing: bool = False) -> None:
    """Delete lease ``name`` if it is ``info``'s. ``renewing``: the holder's heartbeat may be
    rewriting it now (a copy releases it), so the delete goes through the renewal's lock and is
    conditional on the version judged (a plain one landing between a renewal's check and its
    replace would be undone); each conflict is such a renewal, judged again."""
    backend = versions(store) if renewing else None
    for _ in range(16):
        if backend is None or not backend.can_delete:  # object stores: the renewal's put fails
            now = read_lease(store, name)
            if now is not None and now.token == info.token:
                store.delete(name)
            return
        data, generation = backend.get(name)
        if data is None or LeaseInfo.from_bytes(data).token != info.token:
            return
        if backend.commit(name, None, generation) is not CONFLICT:
            return


def held_error(store: ShardStore, name: str, who: str, where: str = "") -> LeaseHeldError:
    """The one refusal of a write by a lease held (every front end's words)."""
    return LeaseHeldError(
        f"{where or describe(store.store, store.path)} is being written by another job: lease "
        f"{store.key(name)!r} held for {who}. If that job is gone, break the lease on "
        "purpose: break_lease=True (shardwise lease PATH --break), or turn leasing off "
        "with lease=False."
    )
