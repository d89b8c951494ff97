"""Who holds a lease, and whether that holder is provably gone.

A lease object records its holder: host name, boot id (``/proc/sys/kernel/random/boot_id``: a
new one after every reboot, and another on every other machine), pid, and the process's start
time (``/proc/PID/stat`` field 22, in clock ticks since boot: a pid reused by another process
has another start time). On the holder's own host and boot, that decides it: the process is
there or it is not. Elsewhere only the heartbeat can tell: the holder rewrites ``renewed`` while
it runs, and a lease whose ``renewed`` is older than its ``expiry`` has no living holder.

>>> info = LeaseInfo.new("write")
>>> LeaseInfo.from_bytes(info.to_bytes()) == info
True
>>> gone_reason(info) is None  # this very process holds it
True
"""

from __future__ import annotations

import datetime
import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

from ..errors import InvalidTypeError, InvalidValueError

# seconds without a heartbeat after which a holder on another host counts as gone; the holder
# renews every quarter of it, so a few lost renewals never make a live holder look dead
DEFAULT_EXPIRY = 300.0
EXPIRY_ENV = "SHARDWISE_LEASE_EXPIRY"


def lease_expiry(value: object = None) -> float:
    """A lease expiry in seconds: ``value``, else ``$SHARDWISE_LEASE_EXPIRY``, else the default.

    >>> lease_expiry(60)
    60.0
    >>> lease_expiry(0)
    Traceback (most recent call last):
    ...
    shardwise.errors.InvalidValueError: lease_expiry must be a positive number of seconds, got 0
    """
    name = "lease_expiry"
    if value is None:
        text = os.environ.get(EXPIRY_ENV, "").strip()
        if not text:
            return DEFAULT_EXPIRY
        name = EXPIRY_ENV
        try:
            value = float(text)
        except ValueError:
            raise InvalidValueError(
                f"{EXPIRY_ENV} must be a positive number of seconds, got {text!r}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTypeError(
            f"{name} must be a positive number of seconds, got {value!r} ({type(value).__name__})"
        )
    if not value > 0 or value == float("inf"):
        raise InvalidValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


@cache
def boot_id() -> str:
    """This machine's boot id ("" where the kernel does not tell)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # pragma: no cover - not Linux
        return ""


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot); None when there is no such
    process (or only its zombie); -1 when it runs but the system does not tell its start."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    except OSError:  # pragma: no cover - no /proc: only whether the pid exists
        return -1 if _pid_alive(pid) else None
    # the command name (field 2) may hold spaces and parentheses: split after its last ")"
    rest = stat[stat.rindex(")") + 2 :].split()
    if rest[0] in ("Z", "X"):  # a zombie has ended: it only waits for its parent
        return None
    return int(rest[19])  # field 22: fields 3.. are rest[0..]


def _pid_alive(pid: int) -> bool:  # pragma: no cover - only without /proc
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class LeaseInfo:
    """Who holds a lease (the object's content)."""

    token: str
    purpose: str
    host: str
    pid: int
    user: str
    since: str
    boot_id: str = ""
    started: int = -1  # the process's start time (see process_start); -1: not known
    renewed: float = 0.0  # the last heartbeat (Unix time); 0: none (leases of older versions)
    expiry: float = 0.0  # the holder's promise: it renews before this many seconds pass

    @classmethod
    def new(cls, purpose: str, expiry: float = DEFAULT_EXPIRY) -> LeaseInfo:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # pragma: no cover - no passwd entry in some containers
            user = "?"
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        pid = os.getpid()
        started = process_start(pid)
        return cls(
            uuid.uuid4().hex,
            purpose,
            socket.gethostname(),
            pid,
            user,
            now,
            boot_id(),
            -1 if started is None else started,
            time.time(),
            expiry,
        )

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseInfo:
        try:
            d = json.loads(data)
            fields = cls.__dataclass_fields__
            # fields a lease of an older version lacks keep their defaults
            return cls(**{k: d[k] for k in fields if k in d})
        except (ValueError, KeyError, TypeError):
            return cls("?", "unreadable lease object", "?", -1, "?", "?")

    def describe(self) -> str:
        gone = gone_reason(self)
        if gone is not None:
            state = f" ({gone})"
        elif self.host == socket.gethostname() and self.pid > 0 and self.token != "?":
            state = " (running)"
        elif self.renewed > 0:
            state = f" (last heartbeat {max(0.0, time.time() - self.renewed):.0f} s ago)"
        else:
            state = ""
        return (
            f"{self.purpose!r} by {self.user}@{self.host} pid {self.pid}{state} since {self.since}"
        )


# tokens of holders of this process whose call ended (an append that failed and could not
# give its rows back): their markers are written no more, though the process lives on
_ENDED: set[str] = set()


def mark_ended(token: str) -> None:
    """Say that the call of this process holding ``token`` has ended (its markers stay)."""
    _ENDED.add(token)


def ended_here(info: LeaseInfo) -> bool:
    """Whether ``info`` is a holder of this very process whose call has ended."""
    return (
        info.pid == os.getpid()
        and info.token in _ENDED
        and info.started == (process_start(info.pid) if info.started >= 0 else -1)
    )


def gone_reason(info: LeaseInfo, expiry: float | None = None) -> str | None:
    """Why the holder of ``info`` is provably gone, or None when it may still run.

    ``expiry``: seconds without a heartbeat that end a holder on another host, for leases that
    do not record their own (the holder's own promise wins: it is what it renews by).
    """
    if info.token == "?":  # an unreadable lease object: nothing to judge it by
        return None
    # the same host name with another boot id is a reboot, or another machine of the same
    # name: not decidable here, so only the heartbeat judges it (as for any other host)
    here = info.host == socket.gethostname() and (
        not info.boot_id or not boot_id() or info.boot_id == boot_id()
    )
    if here and info.pid > 0:
        start = process_start(info.pid)
        if start is None:
            return "that process is gone"
        if start >= 0 and info.started >= 0 and start != info.started:
            return f"that process is gone: pid {info.pid} is another process now"
        return None
    limit = info.expiry or expiry or _configured_expiry()
    last = info.renewed or _parse_time(info.since)
    if last is None:
        return None
    age = time.time() - last
    if age > limit:
        return f"no heartbeat for {age:.0f} s, past its expiry of {limit:.0f} s"
    return None


def _configured_expiry() -> float:
    try:
        return lease_expiry()
    except InvalidValueError:  # a bad variable is refused where a lease is taken, not here
        return DEFAULT_EXPIRY


def _parse_time(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class Heartbeat(threading.Thread):
    """Renews a lease every quarter of its expiry until the lease is released (one small read
    and one small conditional put each time)."""

    def __init__(self, lease: Any) -> None:  # a durability.lease.Lease
        super().__init__(name=f"shardwise-lease-{lease.info.token[:8]}", daemon=True)
        self.lease = lease
        self.every = lease.info.expiry / 4
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            try:
                if not self.lease.renew():
                    logging.getLogger("shardwise").error(
                        "lease %r was broken or taken over while this writer held it",
                        self.lease.store.key(self.lease.name),
                    )
                    return
            except Exception as e:  # the next beat tries again; the expiry allows for it
                logging.getLogger("shardwise").warning(
                    "lease %r not renewed: %s", self.lease.store.key(self.lease.name), e
                )

    def stop(self) -> None:
        self.done.set()
        if self is not threading.current_thread():
            self.join()


def lease_wanted(lease: bool | None, compute: bool, supports_deletes: bool, store: str) -> bool:
    """Whether a write holds leases (every front end's rule): ``lease`` when given, else when
    the write computes now on a store that can delete. A lease is deleted when the write ends,
    so a store that cannot delete (a zarr ``ZipStore``, which only appends) is written without
    one by default, as xarray writes it, and ``lease=True`` there is refused before anything is
    written (the write would fail only at its end, the lease objects left in the archive).
    ``store``: the store's name in the message (its type)."""
    if lease and not supports_deletes:
        raise InvalidValueError(
            f"lease=True needs a store that can delete (a lease is removed when the write "
            f"ends), and {store} cannot: pass lease=None or lease=False"
        )
    return compute and supports_deletes if lease is None else bool(lease)


def store_lease(lease: bool | None, compute: bool, zstore: Any) -> bool:
    """:func:`lease_wanted` for a zarr Store (one that does not say is taken to delete)."""
    deletes = bool(getattr(zstore, "supports_deletes", True))
    return lease_wanted(lease, compute, deletes, type(zstore).__name__)
