"""Shard tasks in runs: a direct write of a source without a dask graph, as few tasks as the
cluster wants, whatever the number of shards.

A source that is not a dask array (a numpy array, a zarr array, an h5py or netCDF4 variable,
xarray's lazily indexed arrays: anything with ``shape``, ``dtype`` and ``__getitem__``) needs
no graph of its own: each shard's piece is read from it, window by window, inside the task
that writes the shard. So a task can write a *run* of neighbouring shards (consecutive in C
order of the shard grid) one after another, holding one shard's piece at a time, and a write
of a million shards is a few thousand tasks (:func:`shardwise.core.job.shards_per_task`), not
two million (one per source block and one per shard, as ``dask.array.from_array`` and
``map_blocks`` would make).

The graph is one layer of ``ceil(shards / per_task)`` tasks plus one key holding the
:class:`ShardRuns` (writer, source and which shards to leave out): its size does not grow with
the shards of a run, and the source travels once, not once per task. Each shard is still
written by exactly one task, stored with one atomic put and recorded in the journal as it is
written (:meth:`~shardwise.engine.write.ShardWriter.run_shards`): a run killed half-way leaves
its finished shards recorded, and a resume rewrites only the others.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from ..storage.meter import metered
from .report import WriteReport
from .write import ShardWriter


class RunTasks(list[Any]):
    """The Delayed reports of a write's runs (a list, as the pipeline's parts of one Delayed per
    shard task are), with the number of shards they write (``nshards``: a progress bar's
    total, which is not the number of tasks)."""

    nshards: int = 0


@dataclass(frozen=True)
class ShardRuns:
    """The shard tasks of one direct write of ``source`` (the write region's values) in runs of
    ``per_task`` neighbouring shards of ``writer.plan``'s task grid; ``keep``: a boolean grid over
    the plan's tasks, the shards to write (None: all; a resume leaves the done ones out)."""

    writer: ShardWriter
    source: Any
    per_task: int = 1
    keep: np.ndarray | None = None
    # each run's records in one object (durability.journal.RunRecords), not one per shard
    batched: bool = False

    @cached_property
    def dims(self) -> tuple[int, ...]:
        """The task grid's shape (the plan's task chunks cost O(shards along each axis))."""
        return tuple(len(e) - 1 for e in self._edges)

    @property
    def nshards(self) -> int:
        """Shards these runs write."""
        return int(np.prod(self.dims)) if self.keep is None else int(self.keep.sum())

    @property
    def nruns(self) -> int:
        return -(-int(np.prod(self.dims)) // self.per_task)

    def runs(self) -> list[int]:
        """The runs with a shard to write (all of them but for a resume)."""
        if self.keep is None:
            return list(range(self.nruns))
        # per run, whether any of its shards is kept (the last run padded with False)
        kept = np.zeros(self.nruns * self.per_task, dtype=bool)
        kept[: self.keep.size] = self.keep.ravel()
        return np.flatnonzero(kept.reshape(self.nruns, self.per_task).any(axis=1)).tolist()

    @cached_property
    def _edges(self) -> list[list[int]]:
        return [[0, *itertools.accumulate(c)] for c in self.writer.plan.task_chunks]

    def window(self, loc: Sequence[int]) -> tuple[slice, ...]:
        """The source window of the task grid's location ``loc``."""
        return tuple(slice(e[i], e[i + 1]) for e, i in zip(self._edges, loc, strict=True))

    def locations(self, run: int) -> Iterator[tuple[int, ...]]:
        """The task grid's locations of ``run`` to write, in C order."""
        stop = min((run + 1) * self.per_task, int(np.prod(self.dims)))
        flat = np.arange(run * self.per_task, stop)
        if self.keep is not None:
            flat = flat[self.keep.ravel()[flat]]
        if not self.dims:  # a 0-d array: one shard, at ()
            yield from [()] if len(flat) else []
            return
        for loc in zip(*np.unravel_index(flat, self.dims), strict=True):
            yield tuple(map(int, loc))

    def read(self, loc: tuple[int, ...]) -> Callable[[], np.ndarray]:
        """The function reading the piece of ``loc`` (a view of a numpy source, else the
        window read from the source)."""
        window = self.window(loc)
        return lambda: np.asarray(self.source[window])

    def run(self, run: int) -> WriteReport:
        """The task of ``run``: its shards written one after another (their records put
        together, ``batched``, also when the task fails half-way)."""
        pieces = ((loc, self.read(loc)) for loc in self.locations(run))
        journal = self.writer.journal
        if not self.batched or journal is None:
            return self.writer.run_shards(pieces)
        records = journal.for_run()
        with metered() as io:  # the run's record object, put after its shards
            try:
                report = replace(self.writer, journal=records).run_shards(pieces)
            finally:
                records.flush()
        report.add_io(io)
        return report

    def graph(self) -> RunTasks:
        """One Delayed report per run with a shard to write, in one layer over one key that
        holds these runs (so the source is in the graph once)."""
        from dask.delayed import Delayed
        from dask.highlevelgraph import HighLevelGraph

        tok = uuid.uuid4().hex
        name, held = f"shardwise-runs-{tok}", f"shardwise-runs-of-{tok}"
        todo = self.runs()
        layer: dict[Any, Any] = {held: self}
        layer.update({(name, i): (_run, held, i) for i in todo})
        graph = HighLevelGraph.from_collections(name, layer, dependencies=())
        out = RunTasks(Delayed((name, i), graph, layer=name) for i in todo)
        out.nshards = self.nshards
        return out


def _run(runs: ShardRuns, run: int) -> WriteReport:
    return runs.run(run)


def copied(source: Any) -> Any:
    """``source`` as a write computed later must see it: a numpy array is copied (changes made
    to it before the graph runs must not reach the store); other sources are read when their
    shards' turns come, as dask's ``from_array`` reads them."""
    return source.copy() if isinstance(source, np.ndarray) else source
