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
other side's, and gives up if it finds one, so two writers can both give up but never both
proceed.

A lease never expires: a job that died keeps it until someone breaks it on purpose
(``break_lease=True`` or ``shardwise lease PATH --break``). The holder's host, pid and start time
are in the object, and in the :class:`~shardwise.errors.LeaseHeldError` a refused writer gets.

>>> info = LeaseInfo.new("write")
>>> LeaseInfo.from_bytes(info.to_bytes()) == info
True
"""

from __future__ import annotations

import contextlib
import datetime
import getpass
import json
import os
import socket
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from ..errors import LeaseHeldError
from ..storage import s3
from ..storage.retry import RetryPolicy, any_error
from ..storage.store import ShardStore, describe
from .journal import LEASE as LEASE  # the one definition (journal clears around it)

SHARED = ".shardwise/leases/"


def part_lease(i: int, n: int) -> str:
    """The lease name of part ``i`` of ``n`` of a batch write."""
    return f"{LEASE}.part-{i}-of-{n}"


@dataclass(frozen=True)
class LeaseInfo:
    """Who holds a lease (the object's content)."""

    token: str
    purpose: str
    host: str
    pid: int
    user: str
    since: str

    @classmethod
    def new(cls, purpose: str) -> LeaseInfo:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # pragma: no cover - no passwd entry in some containers
            user = "?"
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        return cls(uuid.uuid4().hex, purpose, socket.gethostname(), os.getpid(), user, now)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseInfo:
        try:
            d = json.loads(data)
            return cls(**{k: d[k] for k in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError):
            return cls("?", "unreadable lease object", "?", -1, "?", "?")

    def describe(self) -> str:
        alive = ""
        if self.host == socket.gethostname() and self.pid > 0:
            alive = " (running)" if _pid_alive(self.pid) else " (that process is gone)"
        return (
            f"{self.purpose!r} by {self.user}@{self.host} pid {self.pid}{alive} since {self.since}"
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _create_exclusive(store: ShardStore, name: str, data: bytes, tries: int = 4) -> None:
    """Create ``name`` with ``data`` unless it exists (then leave it untouched).

    Transient failures are retried: the read-back that follows decides who holds the lease,
    so a create that did happen although its answer was lost is found out there.
    """
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


def break_lease(store: ShardStore, name: str = LEASE, *, shared: bool = True) -> LeaseInfo | None:
    """Remove lease ``name`` whoever holds it; returns the holder it had (None if free).

    Breaking the array's lease (``name=LEASE``) removes the shared leases too (``shared``).
    """
    held = read_lease(store, name)
    if held is not None:
        store.delete(name)
    if name == LEASE and shared:
        for other, info in shared_leases(store).items():
            store.delete(other)
            held = held or info
    return held


@dataclass
class Lease:
    """A held lease. Use :meth:`acquire`; release with :meth:`release` or as a context manager."""

    store: ShardStore
    name: str
    info: LeaseInfo
    held: bool = True

    @classmethod
    def acquire(
        cls,
        store: ShardStore,
        *,
        name: str = LEASE,
        purpose: str = "write",
        break_stale: bool = False,
        where: str = "",
    ) -> Lease:
        """Create lease ``name`` exclusively or raise :class:`LeaseHeldError`.

        ``break_stale=True`` first removes a lease someone else holds: only on purpose, when
        that writer is known to be gone.
        """
        if break_stale:
            break_lease(store, name)
        info = LeaseInfo.new(purpose)
        _create_exclusive(store, name, info.to_bytes())
        held = read_lease(store, name)
        if held is None or held.token != info.token:
            who = "an unknown writer (the lease vanished)" if held is None else held.describe()
            raise _held(store, name, who, where)
        others = shared_leases(store) if name == LEASE else {}
        if others:
            _release_own(store, name, info)
            first, holder = sorted(others.items())[0]
            raise _held(store, first, f"{holder.describe()} ({len(others)} writers)", where)
        return cls(store, name, info)

    @classmethod
    def acquire_shared(
        cls,
        store: ShardStore,
        *,
        purpose: str = "region write",
        break_stale: bool = False,
        where: str = "",
    ) -> Lease:
        """Take a shared lease (writers of shared shards that commit conditionally), or raise
        :class:`LeaseHeldError` while the exclusive lease is held (``break_stale=True`` first
        removes it: only when its holder is known to be gone)."""
        if break_stale:
            break_lease(store, LEASE, shared=False)
        info = LeaseInfo.new(purpose)
        name = SHARED + info.token
        store.put(name, info.to_bytes())
        held = read_lease(store, LEASE)
        if held is not None:
            store.delete(name)
            raise _held(store, LEASE, held.describe(), where)
        return cls(store, name, info)

    def release(self) -> None:
        """Remove the lease if this writer still holds it (a broken lease is left alone)."""
        if not self.held:
            return
        self.held = False
        _release_own(self.store, self.name, self.info)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _release_own(store: ShardStore, name: str, info: LeaseInfo) -> None:
    now = read_lease(store, name)
    if now is not None and now.token == info.token:
        store.delete(name)


def _held(store: ShardStore, name: str, who: str, where: str) -> LeaseHeldError:
    return LeaseHeldError(
        f"{where or describe(store.store, store.path)} is being written by another job: lease "
        f"{store.key(name)!r} held for {who}. If that job is gone, break the lease on "
        "purpose: break_lease=True (shardwise lease PATH --break), or turn leasing off "
        "with lease=False."
    )
