"""A stream's shard-row buffers, its background writer and the writes of one of its flushes
(``write/streams.py``).

The buffers are the slots of one array allocated when the stream opens (:class:`Ring`), handed
out in turn: shard-rows sealed one after another sit in slots one after another, so the rows
of a flush that follow each other in the ring are one write (:func:`row_writes`), their source
one view. Its shards go to a few run tasks (about one per core, ``ArrayWrite.per_task``) and
each run's records are put as one object (``durability/journal.py``'s ``RunRecords``), not one
record object per shard: with one frame a shard, the record puts cost as much as the shards.

A shard-row readers already see in part (flushed, or the partial row a resume read back) is a
write of its own: superseded in place (``codec/supersede.py``) and recorded with its own
record, which is newer than any run's and wins over it (``durability/records.py``). Every other
row is written once per stream; a resume cuts the run records of the rows it removes past the
stored length (``write/stream_open.py``), so no record outlives its shard.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..core.plan import ShardPlan
from ..runtime.pool import cpu_count
from .pipeline import ArrayWrite
from .stream_open import _rows

__all__ = ["Ring", "RowWriter", "row_writes"]

Row = tuple[int, int, int]  # a shard-row sealed or flushed: its index, its slot, its frames


class Ring:
    """``slots`` shard-row buffers of ``row_shape`` (``axis``: the append axis) in one array;
    ``free`` holds the slots not in use (slot 0 is the first open row's)."""

    def __init__(self, row_shape: tuple[int, ...], dtype: Any, axis: int, slots: int) -> None:
        self.axis, self.step, self.slots = axis, int(row_shape[axis]), slots
        shape = list(row_shape)
        shape[axis] *= slots
        self.array = np.empty(tuple(shape), dtype)
        self.free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for s in range(1, slots):
            self.free.put(s)

    def view(self, slot: int, frames: int | None = None) -> np.ndarray:
        """The first ``frames`` frames (default: all) from slot ``slot`` on: a view, which may
        span the slots after it."""
        start = slot * self.step
        stop = start + (self.step if frames is None else frames)
        where = [slice(None)] * self.array.ndim
        where[self.axis] = slice(start, stop)
        return self.array[tuple(where)]


class RowWriter:
    """A stream's background writer: the shard-rows sealed since its last write (``put``),
    written together by ``write`` in one flush (rows smaller than a flush's fixed costs are
    batched when the appender runs ahead), their slots given back to ``ring`` failed or not.
    The first error stays in ``error``; rows after it are given back unwritten. C queues
    between the threads: no Python lock per frame."""

    def __init__(self, write: Callable[[list[Row]], None], ring: Ring) -> None:
        self._write, self._ring = write, ring
        # sealed rows, a drain's Event (set once the rows before it are written), None: stop
        self._jobs: queue.SimpleQueue[Row | threading.Event | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        ctx = contextvars.copy_context()  # the write's I/O meter counts the seals too
        self._thread = threading.Thread(
            target=ctx.run, args=(self._work,), name="shardwise-stream", daemon=True
        )
        self._thread.start()

    def put(self, row: Row) -> None:
        self._jobs.put(row)

    def drain(self) -> None:
        """Wait until every row put so far is written (or given back after an error)."""
        if self._thread.is_alive():
            done = threading.Event()
            self._jobs.put(done)
            done.wait()

    def stop(self) -> None:
        """Write the rows put so far, then end the thread."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _work(self) -> None:
        stop = False
        while not stop:
            jobs = [self._jobs.get()]
            while jobs[-1] is not None:
                try:
                    jobs.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            rows: list[Row] = []
            for job in jobs:
                if isinstance(job, tuple):
                    rows.append(job)
                    continue
                self._rows(rows)
                rows = []
                if job is None:
                    stop = True
                else:
                    job.set()
            self._rows(rows)

    def _rows(self, rows: list[Row]) -> None:
        try:
            if self.error is None and rows:
                self._write(rows)
        except BaseException as e:
            self.error = e
        finally:
            for _, slot, _ in rows:
                self._ring.free.put(slot)


def _groups(rows: list[Row], step: int, stored: int) -> list[list[Row]]:
    """``rows`` (in order) in groups of one write: rows after each other in the array and in
    the ring, each full but the last; a row readers see in part (before ``stored``) alone."""
    out: list[list[Row]] = []
    for r in rows:
        if out and r[0] * step >= stored and out[-1][0][0] * step >= stored:
            row, slot, k = out[-1][-1]
            if k == step and r[0] == row + 1 and r[1] == slot + 1:
                out[-1].append(r)
                continue
        out.append([r])
    return out


def row_writes(
    whole: ArrayWrite, ring: Ring, rows: list[Row], stored: int, threads: int | None = None
) -> list[ArrayWrite]:
    """The writes of ``rows`` into ``whole`` (the stream's write at the flush's length), with
    ``stored`` frames readers see: one per group of rows (:func:`_groups`)."""
    lay, axis, step = whole.info.layout, ring.axis, ring.step
    n = max(1, threads or cpu_count())
    out = []
    for group in _groups(rows, step, stored):
        (first, slot, _), (last, _, k) = group[0], group[-1]
        start, stop = first * step, last * step + k
        plan = ShardPlan(lay, _rows(lay.shape, axis, start, stop))
        source = ring.view(slot, stop - start)
        if start < stored:  # read in part already: superseded, with its own record
            shown = replace(whole.options, supersede=True)
            out.append(replace(whole, plan=plan, source=source, options=shown))
        else:
            fresh = replace(whole.options, supersede=False)
            per = max(1, -(-plan.ntasks // n))  # about one run task per core
            out.append(replace(whole, plan=plan, source=source, options=fresh, per_task=per))
    return out
