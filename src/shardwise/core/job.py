"""The write job: a frozen value saying how a write will run, before it runs.

A job is the write plan (which shards, which region) plus the strategy that executes it:

``direct``
    the source is rechunked to the pieces of the region cut at shard boundaries and one task per
    shard encodes the whole raw shard (no extra copy; a task holds about 3x one shard's raw bytes,
    and the source blocks its shard is joined from when the dask chunks are not the pieces).
``staged``
    the source keeps its chunks (moved at most to inner-chunk boundaries); one task per dask block
    encodes the inner chunks inside the block and stores them as one staged piece per shard it
    touches; one task per shard then streams the pieces into the shard object. A task holds one
    dask block plus a fixed streaming buffer, whatever the shard size.

``auto`` picks direct when a shard's direct task fits the memory budget and either the dask
chunks already are the shard pieces, or the write runs on dask's threads in this process (the
caller says so: ``runs_locally``), where a rechunk in memory costs one copy and staging would
write and read every piece through the store, or on a distributed ``LocalCluster``
(``local_cluster``), whose workers hand each other the blocks on this machine. On other clusters a
misaligned source is staged: only small receipts travel between workers, where a direct write
moves every block. The job records why (``reason``). Everything here is pure: no store, no dask.

>>> from shardwise.core.layout import Layout
>>> from shardwise.core.plan import ShardPlan
>>> plan = ShardPlan(Layout((512, 512), (256, 256), (64, 64)), (slice(0, 512), slice(0, 512)))
>>> job = make_job(plan, ((128,) * 4, (512,)), 2, strategy="auto", memory_limit=2**30)
>>> job.strategy, job.tasks, job.blocks
('staged', 8, ((128, 128, 128, 128), (512,)))
>>> job.reason
'staged: distributed scheduler, staging moves less'
>>> local = make_job(plan, ((128,) * 4, (512,)), 2, memory_limit=2**30, runs_locally=True)
>>> local.strategy, local.tasks, local.peak_per_task // 2**10
('direct', 4, 640)
>>> make_job(plan, ((128,) * 4, (512,)), 2, memory_limit=2**30, local_cluster=True).reason[:30]
'direct: misaligned, each shard'
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from typing import Literal

from ..errors import PlanError
from ..runtime.probes import default_memory_limit
from ..runtime.units import UNIT_BYTES
from .args import choice, optional_byte_size
from .blocks import Chunks, edges_of, inner_aligned, staged_pieces
from .cost import RUN_FLUSH, Requests, graph_memory, requests_of, tasks_text
from .cost import size_text as _size
from .geometry import DIRECT_FACTOR, ShardGeometry
from .plan import ShardPlan

Strategy = Literal["auto", "direct", "staged"]
STRATEGIES = ("auto", "direct", "staged")

STREAM_BUFFER = 8 * 2**20  # bytes a shard task holds while it streams staged pieces
PART_BYTES = 8 * 2**20  # multipart upload parts (object stores want >= 5 MiB but the last)
STAGED_FACTOR = 2  # a staged block task: the block plus its encoded chunks
# a direct write of a source without a dask graph runs its shards in runs of neighbours, one
# task a run: about RUNS_PER_THREAD tasks per thread of the cluster, never fewer than MIN_RUNS
# (small writes keep one task per shard) nor more than MAX_RUNS (a scheduler's cost per task,
# about 1 ms and tens of KB, stays bounded at a million shards)
RUNS_PER_THREAD = 16
MIN_RUNS = 1024
MAX_RUNS = 16384


def _largest(chunks: Chunks) -> int:
    return int(math.prod(max(c, default=0) for c in chunks))


@dataclass(frozen=True)
class WritePlan:
    """How one write runs: strategy, tasks, memory per task, bytes moved. Printable, pure.

    What :func:`shardwise.plan_write` returns; ``print(job)`` shows it.

    Attributes
    ----------
    plan : shardwise.core.plan.ShardPlan
        Which shards and which region of the array the write covers.
    strategy : {"direct", "staged"}
        The strategy that runs.
    requested : {"auto", "direct", "staged"}
        The strategy asked for (``"auto"``: chosen).
    blocks : tuple of tuple of int
        The chunks the source is cut into for the tasks (direct: shard pieces; staged: dask blocks).
    source_chunks : tuple of tuple of int or None
        The dask chunks of the source (None for numpy data).
    itemsize : int
        Bytes per element.
    memory_limit : int
        Bytes one task may hold.
    memory_limit_from : str
        Where ``memory_limit`` came from (the keyword, the dask workers, the free memory).
    peak_per_task : int
        The estimated peak memory of the largest task.
    bytes_rechunked : int
        The raw bytes a rechunk moves between tasks.
    bytes_staged : int
        An upper bound of the encoded bytes that go through the staging area.
    reason : str
        Why this strategy runs, with the figures that decided it (printed by ``print(job)``).
    per_task : int
        Shards one shard task writes, one after another (a run of neighbours in C order of the
        shard grid): 1 but direct writes of a source without a dask graph of more than
        ``MIN_RUNS`` shards (``shards_per_task``).
    layout : ShardGeometry or None
        The shards and inner chunks of a new array as :func:`shardwise.plan_shards` chose them,
        with the reasons ``print(job)`` shows; None for an array written into (as stored).

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> shardwise.plan_write(np.zeros((64, 64)), zarr.storage.MemoryStore(), shards=(32, 32)).blocks
    ((32, 32), (32, 32))
    """

    plan: ShardPlan
    strategy: Literal["direct", "staged"]
    requested: Strategy
    blocks: Chunks
    source_chunks: Chunks | None
    itemsize: int
    memory_limit: int
    memory_limit_from: str
    peak_per_task: int
    bytes_rechunked: int
    bytes_staged: int
    reason: str
    per_task: int = 1
    layout: ShardGeometry | None = None

    @property
    def shards(self) -> int:
        """Shard objects this write creates or replaces."""
        return self.plan.ntasks

    @property
    def block_tasks(self) -> int:
        """Block tasks of a staged job (0 for direct)."""
        return math.prod(len(c) for c in self.blocks) if self.strategy == "staged" else 0

    @property
    def shard_tasks(self) -> int:
        """Tasks that write shards: one per run of :attr:`per_task` neighbouring shards."""
        return -(-self.shards // self.per_task)

    @property
    def tasks(self) -> int:
        """Tasks in the graph: the shard tasks, plus one per block for staged."""
        return self.shard_tasks + self.block_tasks

    @property
    def merges_unconditionally(self) -> bool:
        """True for a staged job with shards it covers in part: it merges them without a
        conditional commit, so no other writer may write the array meanwhile."""
        return self.strategy == "staged" and self.plan.npartial > 0

    @property
    def bytes_to_move(self) -> int:
        """Raw bytes rechunked plus the bound of the bytes staged."""
        return self.bytes_rechunked + self.bytes_staged

    @property
    def raw_bytes(self) -> int:
        """Raw bytes of the region written."""
        return int(math.prod(s.stop - s.start for s in self.plan.region)) * self.itemsize

    @property
    def requests(self) -> Requests:
        """The objects this write leaves and the requests it makes, upper bounds
        (:mod:`shardwise.core.cost`; ``job.requests.cost(Prices(...))`` prices them). Shards in
        runs are counted with one record object a run, as a write that creates its array
        stores them; a write of runs into an existing array records each shard."""
        staged = self.strategy == "staged"
        shard_bytes = _largest(self.plan.task_chunks) * self.itemsize
        runs = self.per_task > 1  # a create in runs: one record object a run
        touched = self.plan.touched_elements * self.itemsize
        return requests_of(
            shards=self.shards,
            partial=self.plan.npartial,
            records=self.shard_tasks if runs else self.shards,
            record_puts=self.shard_tasks * -(-self.per_task // RUN_FLUSH) if runs else None,
            staged_pieces=staged_pieces(self.plan, self.blocks) if staged else 0,
            parts_per_shard=max(1, -(-shard_bytes // PART_BYTES)) if staged else 0,
            raw_bytes=self.raw_bytes,
            bytes_read=touched * self.plan.npartial // max(1, self.shards),
            bytes_written=touched,
        )

    def validate(self) -> None:
        """Raise :class:`PlanError` (with the figures) when a task would not fit the budget."""
        if self.peak_per_task <= self.memory_limit:
            return
        lay = self.plan.layout
        if self.strategy == "direct":
            hint = (
                "use strategy='staged' (memory bounded by one dask block, whatever the shard "
                "size), smaller shards, or a larger memory_limit"
            )
            what = f"a shard task of shape up to {lay.shard_shape}" + (
                " (with the dask blocks its rechunk joins)" if self.bytes_rechunked else ""
            )
        else:
            hint = (
                "rechunk the source into smaller dask chunks (the staged strategy holds one "
                "block per task), or raise memory_limit"
            )
            what = f"a block task of shape {tuple(max(c) for c in self.blocks)}"
        raise PlanError(
            f"{what} needs about {_size(self.peak_per_task)} but memory_limit is "
            f"{_size(self.memory_limit)} per task ({self.memory_limit_from}): {hint}"
        )

    def __str__(self) -> str:
        lay = self.plan.layout
        client, scheduler = graph_memory(self.tasks, self.shards)
        lines = [
            f"WritePlan ({self.strategy}"
            + (f", chosen by {self.requested!r}" if self.requested == "auto" else "")
            + ")",
            f"  reason: {self.reason}",
            f"  array {lay.shape}, {lay.grid_text()}, inner chunks {lay.chunk_shape}",
            *([] if self.layout is None else self.layout.reason_lines()),
            f"  region {[(s.start, s.stop) for s in self.plan.region]}, "
            f"{_size(self.raw_bytes)} raw",
            f"  shards: {self.shards} ({self.plan.npartial} merge with stored data)",
            f"  tasks: {self.tasks}"
            + (
                f" ({tasks_text(self.block_tasks, 'block')} + {tasks_text(self.shards, 'shard')})"
                if self.strategy == "staged"
                else " (one per shard)"
                if self.per_task == 1
                else f" (runs of up to {self.per_task} neighbouring shards, one after another)"
            ),
            f"  graph memory: ~{_size(client)} on the client, ~{_size(scheduler)} on the "
            "scheduler (these tasks; a dask source's graph apart)",
            f"  blocks: largest {tuple(max(c, default=0) for c in self.blocks)}",
            f"  peak memory per task: ~{_size(self.peak_per_task)} "
            f"(budget {_size(self.memory_limit)}: {self.memory_limit_from})",
            f"  bytes to move: {_size(self.bytes_to_move)} (rechunk "
            f"{_size(self.bytes_rechunked)}, staged <= {_size(self.bytes_staged)})",
            "  " + self.requests.describe(),
        ]
        # what the layout costs the common reads, appends and regions (plan_shards explains it)
        lines += [f"  {line}" for line in self.geometry.cost_lines()[3:]]
        return "\n".join(lines)

    @property
    def geometry(self) -> ShardGeometry:
        """The array's shards and inner chunks with their costs (:func:`shardwise.plan_shards`
        chooses and explains them)."""
        if self.layout is not None:
            return self.layout
        lay = self.plan.layout
        return ShardGeometry(
            lay.shape, self.itemsize, lay.shard_shape, lay.chunk_shape, shard_edges=lay.shard_sizes
        )

    def _repr_html_(self) -> str:
        """The picture in a notebook: the shard grid, the dask blocks over it, the task that owns
        each shard, direct or staged (core/picture.py), above the printout."""
        from .picture import plan_picture
        from .svg import Drawing

        drawn: Chunks | None
        if self.strategy == "staged":
            drawn = self.blocks
            blocks = f"the {tasks_text(self.block_tasks, 'block')} (staged pieces)"
        else:
            drawn, blocks = (
                self.source_chunks,
                "the source's dask blocks"
                + (", already the shard pieces" if self.bytes_rechunked == 0 else ", rechunked"),
            )
        caption = [
            # the count of merged shards is in the printout below (counting them walks every task)
            f"{self.strategy}: {tasks_text(self.shards, 'shard', True)}; thick: the region written",
            f"dashed: {blocks}" if drawn is not None else "numpy source: read in place",
        ]
        picture = plan_picture(self.plan, self.strategy, drawn, caption)
        return Drawing(picture, str(self))._repr_html_()

    def __repr__(self) -> str:
        return (
            f"<WritePlan {self.strategy}: {self.shards} shards, {self.tasks} tasks, peak "
            f"~{_size(self.peak_per_task)}/task, {_size(self.bytes_to_move)} to move>"
        )


def shards_per_task(shards: int, threads: int) -> int:
    """Shards one task writes so that a write's tasks follow the cluster, not the shard count:
    about :data:`RUNS_PER_THREAD` tasks per thread of ``threads``, clamped to
    [:data:`MIN_RUNS`, :data:`MAX_RUNS`] tasks.

    >>> shards_per_task(1000, 2), shards_per_task(1_000_000, 2), shards_per_task(10**6, 4096)
    (1, 977, 62)
    """
    target = min(MAX_RUNS, max(MIN_RUNS, RUNS_PER_THREAD * max(1, threads)))
    return max(1, -(-shards // target))


def make_job(
    plan: ShardPlan,
    source_chunks: Chunks | None,
    itemsize: int,
    *,
    strategy: Strategy = "auto",
    memory_limit: int | str | None = None,
    shared: bool = False,
    runs_locally: bool = False,
    local_cluster: bool = False,
) -> WritePlan:
    """The job for writing a source with ``source_chunks`` (None: a numpy array) by ``plan``.

    ``shared``: other writers may write this array at the same time (region writes into an
    existing array). The shards the plan covers only in part are then merged and committed
    conditionally, which the direct strategy does (the staged one commits unconditionally): auto
    picks direct for such a plan; an explicit ``strategy="staged"`` keeps it, and the caller
    must then keep other writers out (see :attr:`WritePlan.merges_unconditionally`).

    ``runs_locally``: the write will run on dask's threaded or synchronous scheduler in this
    process (the front ends ask ``compat.default_scheduler_is_local``; nothing here probes dask).
    Auto then rechunks a misaligned source in memory (direct) when its shard tasks fit the budget.

    ``local_cluster``: the write will run on a distributed ``LocalCluster`` (its workers share
    this machine: ``compat.default_cluster_is_local``). Auto then writes a misaligned source
    direct too: each shard task takes its source blocks from the other local workers, which on a
    2-process LocalCluster beat staging (W1 1.10x against 1.19x the aligned write, W3 1.84x
    against 2.11x; benchmarks/README.md). Across machines staging moves less.
    """
    choice("strategy", strategy, STRATEGIES)
    given = optional_byte_size("memory_limit", memory_limit)
    if given is None:
        limit, limit_from = default_memory_limit()
    else:
        limit, limit_from = given, "memory_limit="
    aligned = source_chunks is None or tuple(source_chunks) == plan.task_chunks
    direct_peak = direct_task_peak(plan, None if aligned else source_chunks, itemsize)
    chosen, reason = _choose(
        plan,
        strategy,
        source_chunks,
        aligned,
        (direct_peak, limit),
        shared=shared,
        where="threads" if runs_locally else "local cluster" if local_cluster else "cluster",
    )
    raw_total = math.prod(s.stop - s.start for s in plan.region) * itemsize
    if chosen == "direct":
        moved = 0 if aligned else raw_total
        figures = (limit, limit_from, direct_peak, moved, 0)
        return WritePlan(
            plan, "direct", strategy, plan.task_chunks, source_chunks, itemsize, *figures, reason
        )
    # a block task holds the block and its encoded chunks; the shard task a fixed buffer
    blocks = inner_aligned(plan, source_chunks, max(1, limit // (STAGED_FACTOR + 1)), itemsize)
    moved = 0 if source_chunks is None or tuple(source_chunks) == blocks else raw_total
    peak = _staged_peak(plan, blocks, itemsize)
    figures = (limit, limit_from, peak, moved, raw_total)
    return WritePlan(plan, "staged", strategy, blocks, source_chunks, itemsize, *figures, reason)


def direct_task_peak(plan: ShardPlan, misaligned: Chunks | None, itemsize: int) -> int:
    """The estimated peak memory of the largest direct shard task: the shard's block, its
    encoded chunks and the joined shard (``DIRECT_FACTOR`` shards); with ``misaligned`` dask
    chunks also the source blocks the task's rechunk concatenates the block from (held whole:
    the pieces dask cuts from them are views)."""
    shard = _largest(plan.task_chunks) * itemsize
    if misaligned is None:
        return DIRECT_FACTOR * shard
    return DIRECT_FACTOR * shard + _overlap(plan.task_chunks, misaligned) * itemsize


def _overlap(pieces: Chunks, source: Chunks) -> int:
    """Elements of the source blocks one piece overlaps, at most: per dimension the longest run
    of source chunks a piece touches (their product bounds every piece's)."""
    total = 1
    for cut, src in zip(pieces, source, strict=True):
        edges = edges_of(src, 0)
        span = 0
        for a, b in itertools.pairwise(edges_of(cut, 0)):
            lo = edges[bisect.bisect_right(edges, a) - 1]
            hi = edges[bisect.bisect_left(edges, b)]
            span = max(span, hi - lo)
        total *= span
    return total


def _staged_peak(plan: ShardPlan, blocks: Chunks, itemsize: int) -> int:
    """The estimated peak of a staged job's largest task: a block task (the block, its encoded
    chunks and each encoding thread's unit of chunks, codec.shard.units) or a shard task (the
    streaming buffer, one upload part and the index)."""
    block_bytes = _largest(blocks) * itemsize
    index = 16 * plan.layout.nchunks_per_shard
    chunk_bytes = math.prod(plan.layout.chunk_shape) * itemsize
    return max(
        STAGED_FACTOR * block_bytes + min(block_bytes, max(UNIT_BYTES, chunk_bytes)),
        STREAM_BUFFER + PART_BYTES + 3 * index,
    )


def _choose(
    plan: ShardPlan,
    strategy: Strategy,
    source_chunks: Chunks | None,
    aligned: bool,
    peak_and_limit: tuple[int, int],
    *,
    shared: bool,
    where: Literal["threads", "local cluster", "cluster"],
) -> tuple[Literal["direct", "staged"], str]:
    """The strategy that runs, and why (what :attr:`WritePlan.reason` says)."""
    if plan.layout.ndim == 0 or plan.ntasks == 0:
        # one trivial task either way: nothing to stage
        return "direct", "direct: nothing to stage (0-d array or empty region)"
    if strategy != "auto":
        return strategy, f"{strategy}: asked for (strategy={strategy!r})"
    if shared and plan.npartial > 0:
        return "direct", (
            "direct: shards shared with other writers are merged and committed conditionally"
        )
    peak, limit = peak_and_limit
    if peak > limit:
        return "staged", (
            f"staged: a shard's direct task ({_size(peak)}) exceeds the budget ({_size(limit)})"
        )
    if source_chunks is None:
        return "direct", (
            "direct: no dask graph, each shard's piece read from the source in its task"
        )
    if aligned:
        return "direct", "direct: dask chunks are the shard pieces"
    if where == "threads":
        return "direct", (
            f"direct: misaligned, rechunked in memory on local threads (peak {_size(peak)} "
            f"<= budget {_size(limit)})"
        )
    if where == "local cluster":
        return "direct", (
            f"direct: misaligned, each shard task takes its source blocks from the other workers "
            f"of a LocalCluster, on this machine (peak {_size(peak)} <= budget {_size(limit)})"
        )
    # on a cluster a rechunk sends every block to the worker of its shard; staging sends
    # only receipts (the pieces go through the store)
    return "staged", "staged: distributed scheduler, staging moves less"
