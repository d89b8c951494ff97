"""ShardGeometry: an array's shards and inner chunks as a value that explains itself: why each
size was chosen, what a shard weighs, the objects and the memory of a write task, what the
common reads decode (a map, a time series, the whole array) and which appends and region writes
read, merge and rewrite shards. :func:`~shardwise.core.planner.plan_shards` makes it; ``inspect``
and :class:`~shardwise.core.job.WritePlan` print its costs. Pure arithmetic.

>>> g = ShardGeometry((365, 181, 360), 4, (30, 181, 360), (3, 181, 360))
>>> g.nshards, g.chunks_per_shard, human(g.shard_bytes)
(13, 10, '7.5 MiB')
>>> print(g.reads()[0])
a map (axis 0 at one index): 1 shard, 1 chunk, 763.6 KiB decoded for 254.5 KiB (3.0x)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .layout import ceildiv

__all__ = ["DIRECT_FACTOR", "LevelGeometry", "ReadCost", "ShardGeometry", "human"]

# a direct shard task holds at most about this many times the shard's raw bytes: the block, its
# encoded chunks and, for small chunks, the joined shard (incompressible data)
DIRECT_FACTOR = 3
INDEX_ENTRY = 16  # bytes of one inner chunk's (offset, nbytes) in a shard index


def human(n: float) -> str:
    """Bytes in binary units, as plans print them.

    >>> human(1536), human(3 * 2**30)
    ('1.5 KiB', '3.0 GiB')
    """
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class ReadCost:
    """What one read decodes: shards whose index it reads, inner chunks it decodes, their raw
    bytes, and the bytes it asked for."""

    what: str
    shards: int
    chunks: int
    decoded: int
    wanted: int

    def __str__(self) -> str:
        ratio = self.decoded / max(1, self.wanted)
        return (
            f"{self.what}: {self.shards} shard{'s' * (self.shards != 1)}, {self.chunks} "
            f"chunk{'s' * (self.chunks != 1)}, {human(self.decoded)} decoded"
            + (f" for {human(self.wanted)} ({ratio:.1f}x)" if ratio >= 1.05 else "")
        )


@dataclass(frozen=True)
class LevelGeometry:
    """One level of a pyramid: its shape, inner chunks and shards (level 0's, fitted)."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    shards: tuple[int, ...]

    @property
    def nshards(self) -> int:
        return math.prod(ceildiv(n, s) for n, s in zip(self.shape, self.shards, strict=True))


@dataclass(frozen=True)
class ShardGeometry:
    """The shard and inner-chunk geometry of one array, and why (printable: ``report()``).

    Attributes
    ----------
    shape : tuple of int
        The array's shape.
    itemsize : int
        Bytes per element.
    shards : tuple of int
        The shard shape (a rectilinear grid's largest shard).
    chunks : tuple of int
        The inner-chunk shape.
    dims : tuple of str or None, optional
        Dimension names (None: not named), used in the report.
    shards_reason : str
        The rule that chose the shards, in words.
    chunks_reason : str
        The rule that chose the inner chunks, in words.
    write_axes : tuple of int
        Axes separate writers split: a shard spans one inner chunk along each.
    memory_per_task : int or None
        The budget one write task may hold (None: not given).
    levels : tuple of LevelGeometry
        A pyramid's levels (level 0 first); empty for a single array.
    shard_edges : tuple or None
        Per axis, the extents of a rectilinear shard grid (None along regular axes); None for a
        regular grid.

    Examples
    --------
    >>> import shardwise
    >>> g = shardwise.plan_shards((4096, 4096), "float32", chunks=(256, 256),
    ...                           shard_bytes="16 MiB")
    >>> g.shards, g.chunks
    ((2048, 2048), (256, 256))
    """

    shape: tuple[int, ...]
    itemsize: int
    shards: tuple[int, ...]
    chunks: tuple[int, ...]
    dims: tuple[str | None, ...] | None = None
    shards_reason: str = "as stored"
    chunks_reason: str = "as stored"
    write_axes: tuple[int, ...] = ()
    memory_per_task: int | None = None
    levels: tuple[LevelGeometry, ...] = ()
    shard_edges: tuple[tuple[int, ...] | None, ...] | None = field(default=None)

    # -- sizes ----------------------------------------------------------------------------------

    @property
    def shard_bytes(self) -> int:
        """Raw bytes of one (full) shard."""
        return math.prod(self.shards) * self.itemsize

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunks) * self.itemsize

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    def _counts(self, axis: int) -> int:
        """Shards along ``axis``."""
        edges = self.shard_edges[axis] if self.shard_edges else None
        if edges is not None:
            return len(edges)
        return ceildiv(self.shape[axis], self.shards[axis])

    @property
    def nshards(self) -> int:
        return math.prod(self._counts(i) for i in range(len(self.shape)))

    @property
    def chunks_per_shard(self) -> int:
        return math.prod(ceildiv(s, c) for s, c in zip(self.shards, self.chunks, strict=True))

    @property
    def task_memory(self) -> int:
        """About what a direct write task holds for its shard."""
        return DIRECT_FACTOR * self.shard_bytes

    # -- costs ----------------------------------------------------------------------------------

    def _name(self, axis: int) -> str:
        name = self.dims[axis] if self.dims and axis < len(self.dims) else None
        return str(name) if name is not None else f"axis {axis}"

    def read_cost(self, what: str, box: Sequence[tuple[int, int]]) -> ReadCost:
        """The cost of reading ``box`` (a ``(start, stop)`` per axis)."""
        chunks = shards = decoded = 1
        for (a, b), n, c, s in zip(box, self.shape, self.chunks, self.shards, strict=True):
            if b <= a:
                return ReadCost(what, 0, 0, 0, 0)
            chunks *= ceildiv(min(b, n), c) - a // c
            shards *= ceildiv(min(b, n), s) - a // s
            decoded *= min(n, ceildiv(b, c) * c) - a // c * c  # edge chunks hold less
        wanted = math.prod(b - a for a, b in box) * self.itemsize
        return ReadCost(what, shards, chunks, decoded * self.itemsize, wanted)

    def reads(self) -> list[ReadCost]:
        """The common reads: a map (one index along every axis but the last two, for 3 or more
        dimensions), a time series (all of the first axis at one point, for 2 or more) and the
        whole array.

        Returns
        -------
        list of ReadCost
            Each read's shards, inner chunks and bytes decoded, printable.
        """
        nd, out = len(self.shape), []
        if not nd or 0 in self.shape:
            return [ReadCost("the whole array", 0, 0, 0, 0)]
        if nd >= 3:
            lead = ", ".join(self._name(i) for i in range(nd - 2))
            box = [(0, 1)] * (nd - 2) + [(0, n) for n in self.shape[-2:]]
            out.append(self.read_cost(f"a map ({lead} at one index)", box))
        if nd >= 2:
            box = [(0, self.shape[0])] + [(0, 1)] * (nd - 1)
            what = f"a time series (all of {self._name(0)} at one point)"
            out.append(self.read_cost(what, box))
        out.append(self.read_cost("the whole array", [(0, n) for n in self.shape]))
        return out

    def append_risk(self) -> str:
        """What appends along the first axis cost."""
        if not self.shape:
            return "a 0-d array is not appended to"
        n, s, name = self.shape[0], self.shards[0], self._name(0)
        edges = self.shard_edges[0] if self.shard_edges else None
        if edges is not None:  # rectilinear: the extents sum to the length
            return (
                f"along {name}: an append adds a shard per appended chunk (rows inside a last "
                "shard declared longer merge into it)"
            )
        head = (
            f"along {name}: appends of a multiple of {s} write new shards only"
            if n % s == 0
            else f"along {name}: the last shard holds {n % s} of {s}, so the next append "
            f"reads, merges and rewrites it ({human(self.shard_bytes)} at most)"
        )
        return head + (
            f"; other appends merge into the last shard (up to {human(self.shard_bytes)})"
            if n % s == 0 and s > 1
            else ""
        )

    @property
    def smallest(self) -> tuple[int, ...]:
        """The smallest shard's extent per axis (a rectilinear grid's; else ``shards``)."""
        edges = self.shard_edges or (None,) * len(self.shards)
        return tuple(s if e is None else min(e) for s, e in zip(self.shards, edges, strict=True))

    def region_risk(self) -> str:
        where = "shard edges" if self.shard_edges else f"shards (multiples of {self.shards})"
        return (
            f"aligned to the {where} write whole shards; others "
            f"read, merge and rewrite every shard they cover in part (up to "
            f"{human(self.shard_bytes)} each)"
        )

    def writers(self) -> str:
        if not self.write_axes:
            return "none given: writers that split an axis inside a shard share it (merged)"
        names = ", ".join(self._name(i) for i in self.write_axes)
        return f"along {names} a shard spans one inner chunk: separate writers never share one"

    # -- text -----------------------------------------------------------------------------------

    def cost_lines(self) -> list[str]:
        """The costs, one line each (what ``inspect`` and ``WritePlan`` print)."""
        index = self.chunks_per_shard * INDEX_ENTRY + 4
        small = self.smallest
        few = math.prod(ceildiv(s, c) for s, c in zip(small, self.chunks, strict=True))
        span = (  # a rectilinear grid: from its smallest shard to its largest
            ("", "")
            if small == self.shards
            else (f" (largest; smallest {small})", f"{human(math.prod(small) * self.itemsize)} to ")
        )
        many = self.chunks_per_shard
        lines = [
            f"shards   {self.shards}{span[0]}: {self.nshards} of {span[1]}"
            f"{human(self.shard_bytes)} ({f'{few} to ' if span[0] else ''}{many} inner "
            f"chunk{'s' * (many != 1)}, index {'up to ' * bool(span[0])}{human(index)})",
            f"chunks   {self.chunks}: {human(self.chunk_bytes)} each",
            f"objects  {self.nshards} shard{'s' * (self.nshards != 1)} + metadata; "
            f"memory per write task ~{human(self.task_memory)}"
            + (
                f" (budget {human(self.memory_per_task)})"
                if self.memory_per_task is not None
                else ""
            ),
        ]
        lines += [
            f"reads    {r}" if i == 0 else f"         {r}" for i, r in enumerate(self.reads())
        ]
        lines.append(f"appends  {self.append_risk()}")
        lines.append(f"regions  {self.region_risk()}")
        return lines

    def reason_lines(self) -> list[str]:
        """Why the shards and inner chunks are these (a plan's lines; none when both were given
        whole)."""
        if self.shards_reason == self.chunks_reason == "as given":
            return []
        return [
            f"    shards because: {self.shards_reason}",
            f"    inner chunks because: {self.chunks_reason}",
        ]

    def report(self) -> str:
        """The geometry, why it was chosen and what it costs.

        Returns
        -------
        str
            The report, one line per item (what ``print`` shows).
        """
        dims = f", dims {tuple(self.dims)}" if self.dims else ""
        lines = [
            f"ShardGeometry of {self.shape} ({self.itemsize}-byte items, "
            f"{human(self.nbytes)}){dims}",
            *(f"  {line}" for line in self.cost_lines()),
        ]
        lines.insert(2, f"           why: {self.shards_reason}")
        lines.insert(4, f"           why: {self.chunks_reason}")
        if self.shard_edges:
            for i, edges in enumerate(self.shard_edges):
                if edges is not None:
                    lines.append(
                        f"  rectilinear along {self._name(i)}: {len(edges)} shards of "
                        f"{min(edges)} to {max(edges)}"
                    )
        lines.append(f"  writers  {self.writers()}")
        for i, lv in enumerate(self.levels):
            lines.append(
                f"  level {i}  {lv.shape}: shards {lv.shards} x{lv.nshards}, chunks {lv.chunks}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()
