"""Orderly termination on SIGTERM and SIGINT: finish what runs, start nothing new, let go.

A batch scheduler stops a job with SIGTERM (SLURM on preemption and at the time limit) and
sends SIGKILL ``KillWait`` seconds later (30 by default). Python's default ends the process on
SIGTERM at once, leaving the lease held and maybe a temp file. Inside :func:`stop_on_signals`
the first SIGTERM or SIGINT instead:

1. stops the shard tasks of every write in this process from starting
   (:func:`shardwise.runtime.pool.stop_all`: a task that starts after it writes nothing);
2. raises :class:`Interrupted` (a ``KeyboardInterrupt``) in the main thread, where the write is
   waiting for its tasks. The write unwinds as after any failure: it waits (at most
   :data:`GRACE` seconds) for the tasks still running, each of which commits its shard and
   record or leaves nothing, releases its lease, and keeps its open marker, so that a rerun
   with ``resume=True`` (``--resume``) finishes it.

Signals that come while stopping are ignored: the stop is under way, and cutting it short would
leave the lease held. The shardwise commands run inside it (exit status 128 + the signal: 143
for SIGTERM, 130 for SIGINT); a library user opts in, nothing is installed by default::

    with shardwise.stop_on_signals():
        shardwise.write_array(data, "out.zarr", ...)
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

from ..errors import InvalidTypeError, InvalidValueError
from . import pool as _pool

__all__ = ["GRACE", "Interrupted", "stop_on_signals"]

# seconds a stopping write waits for the shard tasks still running: well inside SLURM's default
# KillWait of 30 s, with room for releasing the lease and exiting
GRACE = 20.0
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
log = logging.getLogger("shardwise")


class Interrupted(KeyboardInterrupt):
    """A signal stopped the work in :func:`stop_on_signals` (a ``KeyboardInterrupt``: code that
    catches ``Exception`` lets it through, as it lets Ctrl-C through).

    Parameters
    ----------
    signum : int
        The signal received (kept as ``.signum``); ``.exit_status`` is ``128 + signum``, the
        status a shell reports for a process ended by that signal.

    Examples
    --------
    >>> import signal, shardwise
    >>> e = shardwise.Interrupted(signal.SIGTERM)
    >>> int(e.signum), e.exit_status, isinstance(e, KeyboardInterrupt)
    (15, 143, True)
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_status = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


@contextmanager
def stop_on_signals(
    signals: Sequence[int] = DEFAULT_SIGNALS, *, grace: float = GRACE
) -> Iterator[None]:
    """Stop shardwise writes in an orderly way on ``signals`` (default SIGTERM and SIGINT).

    On the first of them, shard tasks not started yet do not start, the ones running commit
    their shard or leave nothing (waited for at most ``grace`` seconds), leases are released,
    and :class:`Interrupted` is raised in the main thread. A write stopped so is finished by
    running it again with ``resume=True``. The previous handlers come back on exit. Only in
    the main thread (where Python runs signal handlers).

    Parameters
    ----------
    signals : sequence of int, default (SIGTERM, SIGINT)
        The signals to handle.
    grace : float, default 20
        Seconds a stopping write waits for its running shard tasks.

    Yields
    ------
    None

    Raises
    ------
    InvalidTypeError, InvalidValueError
        ``signals`` not signal numbers, ``grace`` not a positive number, or not called in the
        main thread.

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> with shardwise.stop_on_signals():  # SIGTERM or Ctrl-C: the shards done are kept
    ...     report = shardwise.write_array(np.ones((64, 64), "u1"), store, shards=(32, 32))
    >>> report.shards_written
    4
    """
    wanted = _check(signals, grace)
    if threading.current_thread() is not threading.main_thread():
        raise InvalidValueError(
            "stop_on_signals works in the main thread only (Python runs signal handlers there)"
        )
    stopping: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if stopping:
            log.warning("%s while stopping: ignored", signal.Signals(signum).name)
            return
        stopping.append(signum)
        log.warning("%s: stopping (running shard tasks finish)", signal.Signals(signum).name)
        _pool.stop_all(grace)
        raise Interrupted(signum)

    before: dict[int, Any] = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for s, old in before.items():
            signal.signal(s, old)
        if stopping:
            _pool.stop_all(None)  # writes may run again


def _check(signals: object, grace: object) -> list[signal.Signals]:
    if isinstance(signals, int | str) or not isinstance(signals, Sequence):
        raise InvalidTypeError(
            f"signals must be a sequence of signal numbers, got {signals!r} "
            f"({type(signals).__name__})"
        )
    out = []
    for s in signals:
        try:
            out.append(signal.Signals(s))
        except ValueError:
            raise InvalidValueError(
                f"signals must be signal numbers (e.g. signal.SIGTERM), got {s!r}"
            ) from None
        if out[-1] in (signal.SIGKILL, signal.SIGSTOP):
            raise InvalidValueError(f"signals: {out[-1].name} cannot be handled")
    if isinstance(grace, bool) or not isinstance(grace, int | float):
        raise InvalidTypeError(
            f"grace must be a positive number of seconds, got {grace!r} ({type(grace).__name__})"
        )
    if not grace > 0:
        raise InvalidValueError(f"grace must be a positive number of seconds, got {grace!r}")
    return out
