"""An array an append grows (:mod:`shardwise.write.appends`), as the append rule sees it: its
store, the axis, and the front end's planned write of it (region, metadata, source); and that
write moved to the rows the append reserved."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..codec.metadata import ArrayInfo
from ..compat import with_rectilinear_grids
from ..core.layout import Region, ceildiv
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
    def step(self) -> int:
        """The shard (or chunk, without sharding) length along the axis."""
        if self.info is not None:
            return self.info.layout.axis_step(self.axis, "an append")
        return int(self.meta["chunk_grid"]["configuration"]["chunk_shape"][self.axis])


@with_rectilinear_grids
def moved(a: AppendedArray, start: int, end: int, pad: bool) -> AppendedArray:
    """``a`` written to rows ``start:end``, in an array padded to whole shards along the axis
    (its last shard merged, never clipped: see the module's step 3)."""
    from zarr.core.metadata import ArrayV3Metadata

    from ..codec.metadata import info_from_metadata

    region = list(a.region)
    region[a.axis] = slice(start, end)
    shape = list(a.shape)
    shape[a.axis] = ceildiv(end, a.step) * a.step if pad else end
    meta = {**a.meta, "shape": shape}
    info = None if a.info is None else info_from_metadata(ArrayV3Metadata.from_dict(meta))
    return replace(a, region=tuple(region), meta=meta, info=info)
