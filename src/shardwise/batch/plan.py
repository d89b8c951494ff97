"""The plan of a batch write: the array split into N shard-aligned, disjoint parts (by count, or
regions given by hand and checked), and :class:`BatchPlan`, the batch record that says which
region each part writes. Pure, no I/O: ``shardwise.batch`` runs its steps over it (its docstring
shows a split and a refusal)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core import args
from ..core.layout import Layout, Region, RegionArg, is_aligned, normalize_region
from ..errors import InvalidTypeError, InvalidValueError, PlanError

Box = list[tuple[int, int]]  # shard-index ranges per dimension


def fmt(region: Sequence[slice]) -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in region) + "]"


def _box_region(layout: Layout, box: Box) -> Region:
    return layout.box_region(box)


def _split(box: Box, n: int, axis: int) -> list[Box]:
    if n == 1:
        return [box]
    ax = next(a for a in range(axis, len(box)) if box[a][1] - box[a][0] > 1)
    lo, hi = box[ax]
    extent = hi - lo
    if extent >= n:
        cuts = [lo + extent * i // n for i in range(n + 1)]
        return [[*box[:ax], (a, b), *box[ax + 1 :]] for a, b in itertools.pairwise(cuts)]
    out = []
    for i in range(extent):
        count = n // extent + (i < n % extent)
        out += _split([*box[:ax], (lo + i, lo + i + 1), *box[ax + 1 :]], count, ax + 1)
    return out


def split_parts(layout: Layout, n: int) -> list[Region]:
    """``n`` disjoint, shard-aligned regions covering the array: slabs along the first axes."""
    if n < 1:
        raise InvalidValueError(f"a batch needs at least 1 part, got {n}")
    if n > layout.nshards:
        raise PlanError(
            f"{n} parts for {layout.nshards} shards: each part needs at least one whole shard "
            f"(shard grid {layout.shard_grid}); use at most {layout.nshards} parts or smaller "
            "shards"
        )
    if layout.ndim == 0:
        return [()]
    return [_box_region(layout, b) for b in _split([(0, g) for g in layout.shard_grid], n, 0)]


def nearest_aligned(layout: Layout, region: Region) -> Region:
    """``region`` with every edge moved to the nearest shard boundary (or the array end)."""
    out = []
    for d, (sl, n) in enumerate(zip(region, layout.shape, strict=True)):
        lo = _nearest_edge(layout, d, sl.start)
        hi = sl.stop if sl.stop == n else _nearest_edge(layout, d, sl.stop)
        if hi <= lo:
            k = layout.axis_index(d, min(lo, n - 1))
            lo, hi = layout.axis_bound(d, k), min(layout.axis_bound(d, k + 1), n)
        out.append(slice(lo, hi))
    return tuple(out)


def _nearest_edge(layout: Layout, d: int, pos: int) -> int:
    """The shard boundary along axis ``d`` nearest ``pos`` (the array end included)."""
    n = layout.shape[d]
    if pos >= n:
        return n
    k = layout.axis_index(d, pos)
    lo, hi = layout.axis_bound(d, k), min(layout.axis_bound(d, k + 1), n)
    return lo if pos - lo < hi - pos else hi


def _grid_words(layout: Layout) -> str:
    if layout.is_regular:
        return f"multiples of the shard shape {layout.shard_shape}"
    sizes = tuple(list(layout.axis_sizes(d)) for d in range(layout.ndim))
    return f"shard boundaries (shards of {sizes})"


def _shard_box(layout: Layout, region: Region) -> Box:
    return layout.shard_box(region)


def check_parts(layout: Layout, regions: Sequence[RegionArg]) -> list[Region]:
    """Normalized ``regions``; PlanError if one is misaligned or two share a shard."""
    out = [normalize_region(r, layout.shape) for r in regions]
    for i, r in enumerate(out):
        if any(s.stop <= s.start for s in r):
            raise InvalidValueError(f"part {i} region {fmt(r)} is empty")
        if not is_aligned(r, layout):
            raise PlanError(
                f"part {i} region {fmt(r)} would share shards with another part: edges must fall "
                f"on {_grid_words(layout)} or the array end "
                f"{layout.shape}; nearest aligned split: {fmt(nearest_aligned(layout, r))}"
            )
    boxes = [_shard_box(layout, r) for r in out]
    for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2):
        if all(max(x[0], y[0]) < min(x[1], y[1]) for x, y in zip(a, b, strict=True)):
            raise PlanError(f"parts {i} {fmt(out[i])} and {j} {fmt(out[j])} share shards")
    return out


def check_coverage(layout: Layout, regions: Sequence[Region]) -> None:
    """PlanError naming the rows no part covers (``regions`` from :func:`check_parts`, disjoint:
    counting their shards suffices). A new array must be covered whole: rows in no part would
    never be written, and finalize could not tell."""
    boxes = [_shard_box(layout, r) for r in regions]
    covered = sum(int(np.prod([hi - lo for lo, hi in b])) for b in boxes)
    if covered == layout.nshards:
        return
    owned = np.zeros(layout.shard_grid, dtype=bool)
    for b in boxes:
        owned[tuple(slice(lo, hi) for lo, hi in b)] = True
    gaps = np.argwhere(~owned)
    first = tuple(int(c) for c in gaps[0])
    region = _box_region(layout, [(c, c + 1) for c in first])
    raise PlanError(
        f"the parts leave {len(gaps)} of {layout.nshards} shards in no part, e.g. shard {first} "
        f"= region {fmt(region)} of the array {layout.shape}: those rows would never be written; "
        "add parts that cover them, give parts as a count, or (to rewrite only some regions of "
        "an existing array) use mode='r+'"
    )


@dataclass(frozen=True)
class BatchPlan:
    """The batch record: which region of the array each part writes.

    Attributes
    ----------
    id : str
        The batch's id.
    shape : tuple of int
        The array's shape.
    regions : tuple of tuple of slice
        The region of each part, disjoint and shard-aligned.
    created : str
        When the batch was opened.

    Examples
    --------
    >>> import zarr, shardwise
    >>> plan = shardwise.batch.init(zarr.storage.MemoryStore(), shape=(64,), dtype="u1",
    ...                             chunks=(16,), shards=(32,), parts=2)
    >>> plan.shape, len(plan.regions)
    ((64,), 2)
    """

    id: str
    shape: tuple[int, ...]
    regions: tuple[Region, ...]
    created: str

    @property
    def nparts(self) -> int:
        """The number of parts."""
        return len(self.regions)

    def region(self, part: int) -> Region:
        """The region part ``part`` writes.

        Parameters
        ----------
        part : int
            The part, ``0 .. nparts - 1``.

        Returns
        -------
        tuple of slice
            One slice per dimension.

        Raises
        ------
        InvalidValueError
            No such part.
        """
        if not 0 <= part < self.nparts:
            raise InvalidValueError(
                f"part {part} does not exist: the parts are 0..{self.nparts - 1}"
            )
        return self.regions[part]

    def to_bytes(self) -> bytes:
        regions = [[[s.start, s.stop] for s in r] for r in self.regions]
        d = dict(
            id=self.id,
            shape=list(self.shape),
            nparts=self.nparts,
            regions=regions,
            created=self.created,
        )
        return json.dumps(d, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> BatchPlan:
        d = json.loads(data)
        regions = tuple(tuple(slice(a, b) for a, b in r) for r in d["regions"])
        return cls(str(d["id"]), tuple(d["shape"]), regions, str(d["created"]))

    def __str__(self) -> str:
        rows = [f"batch {self.id[:8]}: array {self.shape} in {self.nparts} parts"]
        rows += [f"  part {i}: {fmt(r)}" for i, r in enumerate(self.regions)]
        return "\n".join(rows)


def check_shape_and_parts(shape: object, parts: object) -> None:
    """``init``'s ``shape`` (non-negative ints) and ``parts`` (a positive count, or regions:
    tuples of slices), refused with the keyword named."""
    if (
        not isinstance(shape, Sequence)
        or isinstance(shape, str)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise InvalidTypeError(f"shape must be a tuple of non-negative ints, got {shape!r}")
    if isinstance(parts, int) and not isinstance(parts, bool):
        args.positive_int("parts", parts)
    elif isinstance(parts, bool | str) or not isinstance(parts, Sequence):
        raise InvalidTypeError(
            f"parts must be a positive int or a list of regions (tuples of slices), got "
            f"{parts!r} ({type(parts).__name__})"
        )
    else:
        for r in parts:
            args.region("parts", r)
