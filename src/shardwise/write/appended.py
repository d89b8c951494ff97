"""An array an append grows (:mod:`shardwise.write.appends`), as the append rule sees it: its
store, the axis, and the front end's planned write of it (region, metadata, source); and that
write moved to the rows the append reserved.

Along a rectilinear axis (zarr's ``rectilinear`` grid, as ``shards="dask"`` writes uneven
chunks) the shard extents are fixed in the metadata and an append adds its own: the commit that
grows an array's length also extends its extents (:func:`cover`), one shard per appended chunk
(a numpy source: one chunk). Rows that fall inside the array's last shard, declared longer than
the data, are merged into it; an extent is rounded up to whole inner chunks (the shard then
declared longer than its rows, for the next append to merge into). The write is planned on the
grid as committed (:func:`moved` with ``grid``), so two appenders at once each write the shards
their commit found, and a shard both touch is merged conditionally, as on a regular grid.
"""

from __future__ import annotations

import bisect
import copy
import itertools
from dataclasses import dataclass, replace
from typing import Any

from ..codec.metadata import ArrayInfo
from ..compat import with_rectilinear_grids
from ..core.layout import Region, ceildiv
from ..errors import PlanError
from ..storage.store import ShardStore


@dataclass(frozen=True)
class AppendedArray:
    """One array an append grows along ``axis``, and its planned write: the rows go in
    ``region`` (``region[axis]``: where the front end found the end), into the array that
    ``meta`` describes once written (``info``: its codecs and grid; None where zarr-python
    writes it, an array without sharding); ``source`` holds the values."""

    store: ShardStore
    axis: int
    region: Region
    meta: dict[str, Any]
    info: ArrayInfo | None
    source: Any

    @property
    def path(self) -> str:
        return self.store.path

    @property
    def rows(self) -> int:
        return int(self.region[self.axis].stop) - int(self.region[self.axis].start)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.meta["shape"])

    @property
    def inner(self) -> int:
        """The inner chunk length along the axis (1 without sharding)."""
        return 1 if self.info is None else int(self.info.layout.chunk_shape[self.axis])

    def cuts(self, start: int) -> list[int]:
        """Where this append's chunks along the axis end, its rows placed at ``start``."""
        chunks = getattr(self.source, "chunks", None)
        sizes = [self.rows]
        if isinstance(chunks, tuple) and chunks and isinstance(chunks[0], tuple):
            sizes = [int(n) for n in chunks[self.axis]]
        return list(itertools.accumulate(sizes, initial=start))[1:]

    def check(self) -> None:
        """Refuse (before anything is stored) chunks along a rectilinear axis that cannot each
        be a shard: each must end on a shard edge (the last may end inside its shard)."""
        sizes = extents(self.meta.get("chunk_grid") or {}, self.axis)
        if sizes is None:
            return
        start = int(self.region[self.axis].start)
        grid = extents(cover(self, copy.deepcopy(self.meta), start, start + self.rows), self.axis)
        edges = set(itertools.accumulate(grid or [], initial=0))
        cuts = self.cuts(start)
        if all(b in edges for b in cuts[:-1] if b > sum(sizes)):
            return
        c = self.inner
        raise PlanError(
            f"the data's chunks along axis {self.axis} "
            f"({[b - a for a, b in zip([start, *cuts], cuts, strict=False)]}) cannot each become "
            f"a shard of the array's rectilinear grid (inner chunks of {c} there, a shard "
            f"{sum(sizes) - start} rows past the array's end): rechunk the data so that each "
            f"chunk but the last ends on a multiple of {c} from there. Nothing was written"
        )


def extents(grid: dict[str, Any], axis: int) -> list[int] | None:
    """The shard extents along ``axis`` of a ``chunk_grid`` document, run-length decoded;
    None where the axis is regular (a regular grid, or a step in a rectilinear one)."""
    if grid.get("name") != "rectilinear":
        return None
    spec = grid["configuration"]["chunk_shapes"][axis]
    if isinstance(spec, int):
        return None
    out: list[int] = []
    for x in spec:
        out += [int(x[0])] * int(x[1]) if isinstance(x, list) else [int(x)]
    return out


def cover(a: AppendedArray, doc: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    """Extend the rectilinear extents of the array document ``doc`` along ``a``'s axis to reach
    row ``end``, this append's rows at ``start:end`` (see the module); the grid, as it is now.
    Rows a concurrent append reserved before ``start`` and has not covered yet get shards of the
    last extent's length (that append writes them as a region)."""
    from ..core.layout import _rle

    grid = doc.get("chunk_grid") or {}
    sizes = extents(grid, a.axis)
    if sizes is None or sum(sizes) >= end:
        return grid
    pos, step, c = sum(sizes), sizes[-1], a.inner
    gap = [*range(pos + step, start, step), start]
    for b in gap + a.cuts(start):
        if b > pos:
            sizes.append(ceildiv(b - pos, c) * c)
            pos += sizes[-1]
    grid["configuration"]["chunk_shapes"][a.axis] = _rle(sizes)
    return grid


@with_rectilinear_grids
def moved(
    a: AppendedArray, start: int, end: int, pad: bool, grid: dict[str, Any] | None = None
) -> AppendedArray:
    """``a`` written to rows ``start:end``, in an array padded to whole shards along the axis
    (its last shard merged, never clipped: see the module's step 3). Along a rectilinear axis
    on ``grid``, the array's as committed (else its extents as this append would extend them
    now: a plan)."""
    from zarr.core.metadata import ArrayV3Metadata

    from ..codec.metadata import info_from_metadata

    region = list(a.region)
    region[a.axis] = slice(start, end)
    shape = list(a.shape)
    meta = {**a.meta}
    if grid is None and extents(a.meta.get("chunk_grid") or {}, a.axis) is not None:
        grid = cover(a, copy.deepcopy(a.meta), start, end)
    if grid is not None:  # the stored grid (xarray's pass saw a regular stand-in of it)
        meta["chunk_grid"] = grid = copy.deepcopy(grid)
    sizes = None if grid is None else extents(grid, a.axis)
    if grid is not None and sizes is not None:
        edges = list(itertools.accumulate(sizes, initial=0))
        upto = bisect.bisect_left(edges, end)  # the shards that reach the rows' end
        shape[a.axis] = edges[upto] if pad else end
        grid["configuration"]["chunk_shapes"][a.axis] = sizes[:upto]
    else:
        step = _step(a)
        shape[a.axis] = ceildiv(end, step) * step if pad else end
    meta["shape"] = shape
    info = None if a.info is None else info_from_metadata(ArrayV3Metadata.from_dict(meta))
    return replace(a, region=tuple(region), meta=meta, info=info)


def _step(a: AppendedArray) -> int:
    """The shard (or chunk, without sharding) length along a regular axis."""
    if a.info is not None:
        return a.info.layout.axis_step(a.axis, "an append")
    return int(a.meta["chunk_grid"]["configuration"]["chunk_shape"][a.axis])
