"""xarray's own ``to_zarr`` pass, run against the dry-run overlay with a writer that records each
variable's data, target array and region instead of writing them; and those records planned as
data writes (shapes, dtypes and split shards checked: nothing is written here).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from zarr.abc.store import Store

from ..codec.metadata import ArrayInfo, info_from_metadata
from ..compat import validate_region_and_encoding, zarr_store_writers
from ..core.layout import Layout, Region, ceildiv, normalize_region
from ..errors import PlanError, UnsupportedCodecError
from ..storage.conditional import versions
from ..storage.store import ShardStore
from .prepare import WriteMode


class Capture:
    """Stands in for xarray's ArrayWriter: records what it would write instead of writing."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, Any, Any]] = []

    def add(self, source: Any, target: Any, region: Any = None) -> None:
        self.items.append((source, target, region))


def run_xarray(
    ds: Any,
    store: Store,
    writer: Capture,
    *,
    mode: WriteMode,
    group: str | None,
    consolidated: bool | None,
    append_dim: Hashable | None,
    region: Any,
    encoding: Mapping[Hashable, Any],
) -> None:
    """xarray's ``to_zarr`` with our writer: metadata into ``store``, data into ``writer``."""
    dump_to_store, get_writable_zarr_store = zarr_store_writers()

    for v in ds.variables.values():
        if v.size == 0:
            v.load()  # as xarray: zero-length dask arrays do not store
    zs = get_writable_zarr_store(
        store,
        mode=mode,
        group=group,
        consolidated=consolidated,
        append_dim=append_dim,
        region=region,
        safe_chunks=False,  # shardwise owns alignment: one task per shard
        zarr_format=3 if mode in ("w", "w-") else None,
    )
    with warnings.catch_warnings():
        if consolidated is None:
            # consolidated metadata is xarray's default (xr.open_zarr reads it without a
            # warning); zarr's warning that v3 does not specify it is for those who ask for it
            # with consolidated=True
            warnings.filterwarnings(
                "ignore", "Consolidated metadata is currently not part", UserWarning
            )
        try:
            if zs.zarr_group.metadata.zarr_format != 3:
                raise PlanError(
                    "the store holds Zarr format 2 metadata; shardwise writes Zarr format 3 only"
                )
            ds = validate_region_and_encoding(zs, ds, encoding)
            dump_to_store(ds, zs, writer, encoding=encoding)  # consolidates into the overlay
        finally:
            zs.close()


# -- planning the data writes ---------------------------------------------------------------------


@dataclass(frozen=True)
class VariableWrite:
    name: str
    path: str
    source: Any
    region: Region
    info: ArrayInfo | None  # None: not sharded, written through zarr-python
    chunks: tuple[int, ...]  # the shard shape (the chunk shape when not sharded)
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    meta: dict[str, Any]  # the array's metadata once this write is done

    @property
    def lazy(self) -> bool:
        from xarray.namedarray.pycompat import is_chunked_array

        return is_chunked_array(self.source) is True

    @property
    def size(self) -> int:
        return math.prod(s.stop - s.start for s in self.region)


def plan_writes(
    items: Iterable[tuple[Any, Any, Any]],
    append_dim: Hashable | None,
    has_region: bool,
    safe_shards: bool | None,
    zstore: Store,
) -> list[VariableWrite]:
    out: list[VariableWrite] = []
    splits: list[tuple[str, str, slice, int, str]] = []
    for source, arr, reg in items:
        meta = arr.metadata
        shape = tuple(int(n) for n in arr.shape)
        dims = tuple(str(d) for d in meta.dimension_names or ("",) * len(shape))
        name = arr.path.rsplit("/", 1)[-1]
        full = tuple(slice(None) for _ in shape)
        target = normalize_region(tuple(reg) if reg else full, shape)
        want = tuple(s.stop - s.start for s in target)
        if tuple(source.shape) != want:
            raise PlanError(
                f"variable {name!r}: data of shape {tuple(source.shape)} does not fit the region "
                f"{[(s.start, s.stop) for s in target]} of the stored array {shape}"
            )
        try:
            info: ArrayInfo | None = info_from_metadata(meta) if shape else None
        except UnsupportedCodecError:
            info = None
        grid = info.layout.shard_shape if info is not None else tuple(meta.chunks) if shape else ()
        if (
            info is not None
            and not np.can_cast(source.dtype, info.dtype, casting="same_kind")
            and not (source.dtype.kind in "OUT" and info.dtype.kind in "OUT")
        ):
            raise PlanError(
                f"variable {name!r}: cannot write {source.dtype} data into the stored "
                f"{info.dtype} array without loss"
            )
        strict = safe_shards
        if strict is None:  # split shards are safe where merges commit conditionally
            strict = info is None or versions(ShardStore(zstore, arr.path)) is None
        if has_region and strict:
            unit = "shards" if info is not None else "chunks"
            lay = info.layout if info is not None else None
            for k, (sl, s, n, d) in enumerate(zip(target, grid, shape, dims, strict=True)):
                on = _on_grid(sl, s, n) if lay is None else _on_layout(lay, k, sl)
                if d != append_dim and not on:
                    splits.append((name, d, sl, s, unit))
        out.append(
            VariableWrite(
                name, arr.path, source, target, info, tuple(grid), shape, dims, meta.to_dict()
            )
        )
    if splits:
        raise PlanError(_split_message(splits, out))
    return out


def _on_grid(sl: slice, step: int, n: int) -> bool:
    start, stop = int(sl.start), int(sl.stop)
    return start % step == 0 and (stop % step == 0 or stop == n)


def _on_layout(lay: Layout, d: int, sl: slice) -> bool:
    return lay.on_edge(d, int(sl.start), end=False) and lay.on_edge(d, int(sl.stop))


def _split_message(
    splits: list[tuple[str, str, slice, int, str]], writes: list[VariableWrite]
) -> str:
    """Name what is split and the nearest region (per dimension) aligned for every variable."""
    lines = [
        f"variable {name!r} along {d!r}: {sl.start}:{sl.stop} splits its {unit} of {s}"
        for name, d, sl, s, unit in splits
    ]
    nearest = {}
    for d in dict.fromkeys(d for _, d, _, _, _ in splits):
        grids = [
            (sl, step, n)
            for w in writes
            for sl, step, n, dim in zip(w.region, w.chunks, w.shape, w.dims, strict=True)
            if dim == d
        ]
        lo, hi = min(g[0].start for g in grids), max(g[0].stop for g in grids)
        while True:  # widen until on the grid of every variable (their shards may differ)
            nlo = min(lo // step * step for _, step, _ in grids)
            nhi = max(min(ceildiv(hi, step) * step, n) for _, step, n in grids)
            if (nlo, nhi) == (lo, hi):
                break
            lo, hi = nlo, nhi
        nearest[d] = slice(lo, hi)
    return (
        "the region splits shards that a write of the neighbouring region by another call "
        "would share (concurrent read-modify-writes of one shard lose updates):\n  "
        + "\n  ".join(lines)
        + f"\nThe nearest shard-aligned region is {nearest}. Write shard-aligned regions, or "
        "pass safe_shards=False when no other write touches these shards at the same time "
        "(they are then merged with what is stored; on local files, memory, S3, GCS and Azure "
        "shared shards are committed conditionally and are safe by default). Nothing was "
        "written."
    )
