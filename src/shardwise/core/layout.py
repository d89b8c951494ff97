"""Pure shard-grid math: shapes, grids, edge clipping, keys and which shards a region touches.

Everything here is numpy-free or numpy-only and needs no store, dask or xarray.

>>> lay = Layout(shape=(10, 7), shard_shape=(4, 4), chunk_shape=(2, 2))
>>> lay.shard_grid, lay.chunks_per_shard
((3, 2), (2, 2))
>>> lay.shard_region((2, 1))
(slice(8, 10, None), slice(4, 7, None))
>>> lay.shard_key((2, 1))
'c/2/1'
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import EllipsisType
from typing import Any, Literal

from ..errors import InvalidValueError

Region = tuple[slice, ...]
# what a caller may pass as region=: a slice per dimension, one Ellipsis for the rest
RegionArg = Sequence[slice | EllipsisType] | slice | EllipsisType
Coord = tuple[int, ...]


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Layout:
    """Geometry of one sharded array: the array shape, its shard grid and the inner chunk shape.

    A regular grid (``shard_shape``, every shard alike) is the special case of a rectilinear one
    (``shard_sizes``: per axis ``None`` where the axis is regular, else the shard extents along
    it, as zarr's ``rectilinear`` chunk grid). Regular axes are arithmetic (O(1) in memory
    whatever the shard count); rectilinear ones hold their edges and look them up by bisection.
    ``shard_shape`` is then the largest shard along each axis (what memory bounds use). Every
    module asks the layout for a shard's extent, its neighbours and the shards a region covers.

    >>> lay = Layout.rectilinear((100, 7), ([60, 40], 4), (10, 2))
    >>> lay.shard_grid, lay.shard_shape, lay.is_regular
    ((2, 2), (60, 4), False)
    >>> lay.shard_region((1, 1)), lay.shard_extent((1, 0))
    ((slice(60, 100, None), slice(4, 7, None)), (40, 4))
    >>> lay.dask_chunks()
    ((60, 40), (4, 3))
    """

    shape: tuple[int, ...]
    shard_shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    separator: Literal["/", "."] = "/"
    key_encoding: Literal["default", "v2"] = "default"
    # per axis: None (regular, steps of shard_shape) or the shard extents along it
    shard_sizes: tuple[tuple[int, ...] | None, ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.shape)
        if len(self.shard_shape) != n or len(self.chunk_shape) != n:
            raise InvalidValueError(
                f"shape {self.shape}, shards {self.shard_shape} and chunks {self.chunk_shape} "
                "must have the same number of dimensions"
            )
        if self.shard_sizes is not None:
            if len(self.shard_sizes) != n:
                raise InvalidValueError(f"shard sizes {self.shard_sizes} for {n} dimensions")
            if all(x is None for x in self.shard_sizes):
                object.__setattr__(self, "shard_sizes", None)
        edges: list[tuple[int, ...] | None] = []
        for d in range(n):
            axis = None if self.shard_sizes is None else self.shard_sizes[d]
            c = self.chunk_shape[d]
            extents = (self.shard_shape[d],) if axis is None else axis
            if c < 1 or not extents or any(s < 1 or s % c for s in extents):
                raise InvalidValueError(
                    f"shard extents {_show(self, d)} along dimension {d} must be positive whole "
                    f"multiples of the inner chunk size {c} (inner chunks {self.chunk_shape})"
                )
            if axis is not None and sum(axis) < self.shape[d]:
                raise InvalidValueError(
                    f"shard extents along dimension {d} sum to {sum(axis)}, less than the "
                    f"array's {self.shape[d]}"
                )
            edges.append(None if axis is None else tuple(itertools.accumulate(axis, initial=0)))
        object.__setattr__(self, "_edges", tuple(edges))

    @classmethod
    def rectilinear(
        cls,
        shape: Sequence[int],
        shard_sizes: Sequence[int | Sequence[int]],
        chunk_shape: Sequence[int],
        **kw: Any,
    ) -> Layout:
        """A layout from per-axis shard sizes: an int (a regular axis) or the extents along it
        (zarr's ``rectilinear`` ``chunk_shapes``, expanded); regular when every axis is."""
        sizes = tuple(None if isinstance(s, int) else tuple(int(x) for x in s) for s in shard_sizes)
        largest = tuple(s if isinstance(s, int) else max(s) for s in shard_sizes)
        return cls(tuple(shape), largest, tuple(chunk_shape), shard_sizes=sizes, **kw)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_regular(self) -> bool:
        return self.shard_sizes is None

    @property
    def regular_shards(self) -> tuple[int, ...]:
        """The one shard shape of a regular grid (pyramid levels, appends by whole shards need
        one); a rectilinear grid is refused with its extents."""
        if self.shard_sizes is not None:
            raise InvalidValueError(
                f"this needs a regular shard grid; the array's is rectilinear "
                f"({_grid_text(self)}): rewrite it with regular shards "
                "(shardwise.convert(src, dst, shards=...))"
            )
        return self.shard_shape

    def axis_step(self, d: int, what: str = "this") -> int:
        """The one shard length of axis ``d``, which ``what`` needs; a rectilinear axis is
        refused with its extents."""
        if self.shard_sizes is None or self.shard_sizes[d] is None:
            return self.shard_shape[d]
        raise InvalidValueError(
            f"{what} needs shards of one length along dimension {d}; the array's are "
            f"rectilinear there ({_grid_text(self)}): rewrite it with regular shards "
            "(shardwise.convert(src, dst, shards=...))"
        )

    # -- one axis --------------------------------------------------------------------------

    def axis_bound(self, d: int, i: int) -> int:
        """Where shard ``i`` starts along axis ``d`` (unclipped; ``i`` = the count: the end)."""
        e = self._edges[d]  # type: ignore[attr-defined]
        return i * self.shard_shape[d] if e is None else e[min(i, len(e) - 1)]

    def axis_index(self, d: int, pos: int) -> int:
        """The shard along axis ``d`` holding element ``pos``."""
        e = self._edges[d]  # type: ignore[attr-defined]
        return pos // self.shard_shape[d] if e is None else bisect.bisect_right(e, pos) - 1

    def axis_grid(self, d: int) -> int:
        """Shards along axis ``d`` that hold at least one array element."""
        e, n = self._edges[d], self.shape[d]  # type: ignore[attr-defined]
        return ceildiv(n, self.shard_shape[d]) if e is None else bisect.bisect_left(e, n)

    def axis_span(self, d: int, start: int, stop: int) -> range:
        """The shards along axis ``d`` that [start, stop) touches."""
        if stop <= start:
            return range(0)
        return range(self.axis_index(d, start), self.axis_index(d, stop - 1) + 1)

    def on_edge(self, d: int, pos: int, end: bool = True) -> bool:
        """True when ``pos`` is a shard boundary along axis ``d`` (or, with ``end``, the array
        end)."""
        if end and pos == self.shape[d]:
            return True
        e = self._edges[d]  # type: ignore[attr-defined]
        if e is None:
            return pos % self.shard_shape[d] == 0
        i = bisect.bisect_left(e, pos)
        return i < len(e) and e[i] == pos

    def axis_cuts(self, d: int, start: int, stop: int) -> tuple[int, ...]:
        """Lengths of the pieces of [start, stop) cut at the shard edges of axis ``d``."""
        if self._edges[d] is None:  # type: ignore[attr-defined]
            return _cuts(start, stop, self.shard_shape[d])
        return tuple(
            min(stop, self.axis_bound(d, i + 1)) - max(start, self.axis_bound(d, i))
            for i in self.axis_span(d, start, stop)
        )

    def axis_edges(self, d: int) -> tuple[int, ...] | None:
        """Where the shards of a rectilinear axis start and the last ends; None: regular."""
        edges: tuple[int, ...] | None = self._edges[d]  # type: ignore[attr-defined]
        return edges

    def axis_sizes(self, d: int) -> tuple[int, ...]:
        """The shard extents along axis ``d``, clipped to the array (dask's chunks)."""
        return self.axis_cuts(d, 0, self.shape[d])

    def chunk_shards(self, d: int, chunks: Any) -> tuple[Any, Any]:
        """(shard, chunk within it) along axis ``d`` of the inner chunk indices ``chunks`` (an
        integer numpy array)."""
        import numpy as np

        c = self.chunk_shape[d]
        e = self._edges[d]  # type: ignore[attr-defined]
        if e is None:
            return np.divmod(chunks, self.shard_shape[d] // c)
        starts = np.asarray(e, dtype=np.int64) // c
        shards = np.searchsorted(starts, chunks, side="right") - 1
        return shards, chunks - starts[shards]

    # -- shards ----------------------------------------------------------------------------

    @cached_property
    def shard_grid(self) -> tuple[int, ...]:
        # kept: every shard written asks for it (its key, its report)
        return tuple(self.axis_grid(d) for d in range(self.ndim))

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        """Inner chunks per side of the largest shard."""
        return tuple(s // c for s, c in zip(self.shard_shape, self.chunk_shape, strict=True))

    @property
    def nshards(self) -> int:
        return math.prod(self.shard_grid)

    @property
    def nchunks_per_shard(self) -> int:
        return math.prod(self.chunks_per_shard)

    def dask_chunks(self) -> tuple[tuple[int, ...], ...]:
        """One dask chunk per shard: the shard extents per axis, clipped to the array (a
        zero-length axis: one chunk of 0, as dask spells it)."""
        return tuple(self.axis_sizes(d) or (0,) for d in range(self.ndim))

    def shards(self) -> Iterator[Coord]:
        """All shard coordinates in C order."""
        return itertools.product(*(range(g) for g in self.shard_grid))

    def shard_extent(self, coord: Sequence[int]) -> tuple[int, ...]:
        """The whole (unclipped) shape of shard ``coord``: what its codec encodes."""
        if self.shard_sizes is None:
            return self.shard_shape
        return tuple(self.axis_bound(d, i + 1) - self.axis_bound(d, i) for d, i in enumerate(coord))

    def shard_origin(self, coord: Sequence[int]) -> Coord:
        return tuple(self.axis_bound(d, i) for d, i in enumerate(coord))

    def shard_region(self, coord: Sequence[int]) -> Region:
        """The region of the array covered by shard ``coord``, clipped to the array."""
        if self.shard_sizes is None:  # regular: arithmetic only (asked once a shard written)
            return tuple(
                slice(i * s, min(i * s + s, n))
                for i, s, n in zip(coord, self.shard_shape, self.shape, strict=True)
            )
        return tuple(
            slice(self.axis_bound(d, i), min(self.axis_bound(d, i + 1), n))
            for d, (i, n) in enumerate(zip(coord, self.shape, strict=True))
        )

    def box_region(self, box: Sequence[tuple[int, int]]) -> Region:
        """The region of the shards ``[lo, hi)`` per axis, clipped to the array."""
        return tuple(
            slice(min(self.axis_bound(d, lo), n), min(self.axis_bound(d, hi), n))
            for d, ((lo, hi), n) in enumerate(zip(box, self.shape, strict=True))
        )

    def shard_key(self, coord: Sequence[int]) -> str:
        if self.key_encoding == "v2":
            return self.separator.join(map(str, coord)) if coord else "0"
        return self.separator.join(["c", *map(str, coord)])

    def parse_shard_key(self, name: str) -> Coord | None:
        """The coordinates of shard key ``name`` in this grid, or None: the inverse of
        :meth:`shard_key`."""
        parts = name.split(self.separator)
        if self.key_encoding == "default":
            if not parts or parts[0] != "c":
                return None
            parts = parts[1:]
        elif self.ndim == 0:
            return () if name == "0" else None
        if len(parts) != self.ndim or not all(p.isdigit() for p in parts):
            return None
        coord = tuple(int(p) for p in parts)
        if any(c >= g for c, g in zip(coord, self.shard_grid, strict=True)):
            return None
        return coord if self.shard_key(coord) == name else None

    def shards_touching(self, region: Region) -> Iterator[Coord]:
        """Shard coordinates that intersect ``region`` (step-1 slices, clipped to the array)."""
        spans = zip(range(self.ndim), region, strict=True)
        ranges = [self.axis_span(d, sl.start, sl.stop) for d, sl in spans]
        if any(not r for r in ranges):
            return iter(())
        return itertools.product(*ranges)

    def shard_box(self, region: Region) -> list[tuple[int, int]]:
        """The shard-index ranges ``[lo, hi)`` per axis that ``region`` touches."""
        out = []
        for d, sl in zip(range(self.ndim), region, strict=True):
            r = self.axis_span(d, sl.start, sl.stop)
            out.append((r.start, r.stop) if r else (0, 0))
        return out

    def chunks_in_array(self, shard: Sequence[int]) -> tuple[int, ...]:
        """Inner chunks per dimension of ``shard`` that hold at least one array element."""
        return tuple(
            ceildiv(sl.stop - sl.start, c)
            for sl, c in zip(self.shard_region(shard), self.chunk_shape, strict=True)
        )

    def chunks_per_shard_at(self, shard: Sequence[int]) -> tuple[int, ...]:
        """Inner chunks per side of ``shard`` (its index has one entry per chunk)."""
        return tuple(
            s // c for s, c in zip(self.shard_extent(shard), self.chunk_shape, strict=True)
        )

    def grid_text(self) -> str:
        """The shard grid in words, for messages and reports."""
        return _grid_text(self)

    def grid_json(self) -> dict[str, Any]:
        """The zarr.json ``chunk_grid`` of this shard grid (rectilinear run-length encoded, as
        zarr-python writes it)."""
        if self.shard_sizes is None:
            return {"name": "regular", "configuration": {"chunk_shape": list(self.shard_shape)}}
        shapes: list[Any] = [
            s if axis is None else _rle(axis)
            for s, axis in zip(self.shard_shape, self.shard_sizes, strict=True)
        ]
        return {"name": "rectilinear", "configuration": {"kind": "inline", "chunk_shapes": shapes}}


def _grid_text(lay: Layout) -> str:
    """The grid in words: the shard shape, or the extents along each rectilinear axis."""
    if lay.shard_sizes is None:
        return f"shards {lay.shard_shape}"
    axes = [
        str(s) if a is None else f"[{_brief(a)}]"
        for s, a in zip(lay.shard_shape, lay.shard_sizes, strict=True)
    ]
    return f"shards of extents ({', '.join(axes)})"


def _brief(sizes: Sequence[int]) -> str:
    if len(sizes) <= 6:
        return ", ".join(map(str, sizes))
    return f"{sizes[0]}, {sizes[1]}, ..., {sizes[-1]} ({len(sizes)} shards)"


def _show(lay: Layout, d: int) -> Any:
    axis = None if lay.shard_sizes is None else lay.shard_sizes[d]
    return lay.shard_shape[d] if axis is None else list(axis)


def _rle(sizes: Sequence[int]) -> list[Any]:
    """Run-length encode ``sizes`` as the rectilinear spec does ([value, count] for runs),
    when that is shorter.

    >>> _rle([60, 40]), _rle([31, 28, 31, 31, 31])
    ([60, 40], [31, 28, [31, 3]])
    """
    out: list[Any] = []
    for v, run in itertools.groupby(sizes):
        k = len(list(run))
        out.append([v, k] if k > 1 else v)
    return out if len(out) < len(sizes) else list(sizes)


def _cuts(start: int, stop: int, step: int) -> tuple[int, ...]:
    """Lengths of the pieces of [start, stop) cut at multiples of ``step`` (by arithmetic: a
    million shards along an axis are cut in milliseconds).

    >>> _cuts(2, 10, 4), _cuts(0, 8, 4), _cuts(5, 6, 4), _cuts(3, 3, 4)
    ((2, 4, 2), (4, 4), (1,), ())
    """
    if stop <= start:
        return ()
    first = min((start // step + 1) * step, stop)
    full, rest = divmod(stop - first, step)
    return (first - start,) + (step,) * full + ((rest,) if rest else ())


def intersect(a: Region, b: Region) -> Region | None:
    """Intersection of two regions, or None when they do not overlap."""
    out = []
    for x, y in zip(a, b, strict=True):
        lo, hi = max(x.start, y.start), min(x.stop, y.stop)
        if hi <= lo:
            return None
        out.append(slice(lo, hi))
    return tuple(out)


def shift(region: Region, origin: Sequence[int]) -> Region:
    """``region`` expressed relative to ``origin``."""
    return tuple(slice(s.start - o, s.stop - o) for s, o in zip(region, origin, strict=True))


def normalize_region(region: RegionArg, shape: Sequence[int]) -> Region:
    """Turn user slices into explicit start/stop slices with step 1, validated against ``shape``.

    ``region`` is a slice per dimension; one ``Ellipsis`` stands for every dimension not given,
    as in a selection (a lone slice or ``...`` is a tuple of one). Without it, every dimension
    needs its slice: a region written with fewer is more likely a mistake than a wish.

    >>> normalize_region((slice(2, 5), ...), (10, 7, 3))
    (slice(2, 5, None), slice(0, 7, None), slice(0, 3, None))
    >>> normalize_region((..., slice(1, None)), (4, 3))
    (slice(0, 4, None), slice(1, 3, None))
    """
    items: Sequence[object] = tuple(region) if isinstance(region, Sequence) else (region,)
    nell = sum(1 for k in items if k is Ellipsis)
    if nell > 1:
        raise InvalidValueError(f"a region may hold one Ellipsis (...), got {nell}: {region!r}")
    given = len(items) - nell
    if given > len(shape) or (not nell and given != len(shape)):
        raise InvalidValueError(
            f"region has {given} dimensions, the array has {len(shape)}"
            + ("" if nell else " (an Ellipsis, ..., stands for the dimensions not given)")
        )
    if nell:
        at = list(items).index(Ellipsis)
        items = [*items[:at], *(slice(None),) * (len(shape) - given), *items[at + 1 :]]
    out = []
    for dim, (sl, n) in enumerate(zip(items, shape, strict=True)):
        if not isinstance(sl, slice):
            raise InvalidValueError(
                f"region dimension {dim}: {sl!r} is not a slice; a region takes slices with step "
                "1 and one Ellipsis (for one index i, give slice(i, i + 1))"
            )
        try:
            start, stop, step = sl.indices(n)
        except TypeError:
            raise InvalidValueError(f"region dimension {dim}: {sl} needs integer bounds") from None
        if step != 1:
            raise InvalidValueError(f"region slices must have step 1 (dimension {dim}: {sl})")
        if sl.stop is not None and sl.stop > n:
            raise InvalidValueError(
                f"region {sl} is outside the array extent {n} on dimension {dim}"
            )
        out.append(slice(start, max(start, stop)))
    return tuple(out)


def is_aligned(region: Region, layout: Layout) -> bool:
    """True when every edge of ``region`` falls on a shard boundary or the array end."""
    return all(
        layout.on_edge(d, sl.start, end=False) and layout.on_edge(d, sl.stop)
        for d, (sl, _) in enumerate(zip(region, layout.shape, strict=True))
    )
