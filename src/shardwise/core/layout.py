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

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import Literal

from ..errors import InvalidValueError

Region = tuple[slice, ...]
# what a caller may pass as region=: a slice per dimension, one Ellipsis for the rest
RegionArg = Sequence[slice | EllipsisType] | slice | EllipsisType
Coord = tuple[int, ...]


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Layout:
    """Geometry of one sharded array: the array shape, the shard shape and the inner chunk shape."""

    shape: tuple[int, ...]
    shard_shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    separator: Literal["/", "."] = "/"
    key_encoding: Literal["default", "v2"] = "default"

    def __post_init__(self) -> None:
        n = len(self.shape)
        if len(self.shard_shape) != n or len(self.chunk_shape) != n:
            raise InvalidValueError(
                f"shape {self.shape}, shards {self.shard_shape} and chunks {self.chunk_shape} "
                "must have the same number of dimensions"
            )
        for s, c in zip(self.shard_shape, self.chunk_shape, strict=True):
            if c < 1 or s < 1 or s % c:
                raise InvalidValueError(
                    f"shard shape {self.shard_shape} must be a positive whole multiple of "
                    f"the inner chunk shape {self.chunk_shape}"
                )

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def shard_grid(self) -> tuple[int, ...]:
        return tuple(ceildiv(n, s) for n, s in zip(self.shape, self.shard_shape, strict=True))

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return tuple(s // c for s, c in zip(self.shard_shape, self.chunk_shape, strict=True))

    @property
    def nshards(self) -> int:
        return math.prod(self.shard_grid)

    @property
    def nchunks_per_shard(self) -> int:
        return math.prod(self.chunks_per_shard)

    def shards(self) -> Iterator[Coord]:
        """All shard coordinates in C order."""
        return itertools.product(*(range(g) for g in self.shard_grid))

    def shard_region(self, coord: Sequence[int]) -> Region:
        """The region of the array covered by shard ``coord``, clipped to the array."""
        return tuple(
            slice(i * s, min((i + 1) * s, n))
            for i, s, n in zip(coord, self.shard_shape, self.shape, strict=True)
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
        ranges = []
        for sl, s in zip(region, self.shard_shape, strict=True):
            if sl.stop <= sl.start:
                return iter(())
            ranges.append(range(sl.start // s, ceildiv(sl.stop, s)))
        return itertools.product(*ranges)

    def chunks_in_array(self, shard: Sequence[int]) -> tuple[int, ...]:
        """Inner chunks per dimension of ``shard`` that hold at least one array element."""
        return tuple(
            ceildiv(min(s, n - i * s), c)
            for i, s, c, n in zip(
                shard, self.shard_shape, self.chunk_shape, self.shape, strict=True
            )
        )


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
    for sl, s, n in zip(region, layout.shard_shape, layout.shape, strict=True):
        if sl.start % s or (sl.stop % s and sl.stop != n):
            return False
    return True
