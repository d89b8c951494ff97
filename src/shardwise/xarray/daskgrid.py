"""``to_zarr(..., shards="dask")`` and ``shards={"time": "dask"}``: one shard per dask chunk of
each variable along those dimensions, without a rechunk.

Where a variable's chunks along such a dimension are uniform (all equal, the last possibly
shorter) its grid stays regular; where they are not, its shards are those chunks: a rectilinear
grid (zarr's ``rectilinear`` chunk grid, regular inner chunks dividing every shard,
:func:`~shardwise.core.shardspec.dask_layout`). xarray refuses to create rectilinear arrays, so
its pass creates each such array with a regular stand-in (its largest shard) and
:func:`apply_grids` puts the rectilinear grid into the overlay's metadata before anything is
planned or stored (the group's consolidated metadata rebuilt with it).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from ..codec.metadata import default_compressors
from ..compat import with_rectilinear_grids
from ..core.extents import check_extents, has_extents, is_extents
from ..core.planner import default_layout
from ..core.shardspec import DASK, dask_layout, wants_dask
from ..errors import InvalidValueError
from .prepare import with_layout

Grids = dict[str, list[Any]]  # variable name -> its shards as zarr takes them (rectilinear)


def check_shards(ds: Any, shards: Mapping[Hashable, Any] | str) -> None:
    """``shards=`` of a Dataset checked before any I/O: a planner target every data variable
    takes, else names that are dimensions of the data with sizes that are positive ints or None
    (or ``"dask"``: then any size may be)."""
    if isinstance(shards, str):
        for var in () if shards == DASK else ds.data_vars.values():
            if var.ndim:
                shape, itemsize = tuple(map(int, var.shape)), var.dtype.itemsize
                default_layout(shape, itemsize, None, shards, dims=tuple(map(str, var.dims)))
        return
    dask = wants_dask(shards)
    for dim, n in shards.items():
        if dim not in ds.dims:
            raise InvalidValueError(
                f"shards names dimension {dim!r}, which the data does not have "
                f"(dimensions: {sorted(map(str, ds.dims))})"
            )
        positive = isinstance(n, int | np.integer) and not isinstance(n, bool) and n > 0
        if not (n is None or positive or (dask and n == DASK)):
            sizes = "a positive int, None or 'dask'" if dask else "a positive int or None"
            raise InvalidValueError(f"shards[{dim!r}] must be {sizes}, got {n!r}")


def extents_as_dask(obj: Any, shards: Any) -> tuple[Any, Any]:
    """``shards=`` with shard extents by dimension name (``{"time": [31, 28, 31]}``) as one
    shard per dask chunk of ``obj`` chunked to those extents (checked first: names the data
    has, positive extents summing to the dimension's length); anything else as given."""
    if not isinstance(shards, Mapping) or not has_extents(shards):
        return obj, shards
    import xarray as xr

    nodes = (
        [n.to_dataset(inherit=False) for n in obj.subtree]
        if isinstance(obj, xr.DataTree)
        else [obj]
    )
    sizes: dict[str, set[int]] = {}
    for ds in nodes:
        for d, n in ds.sizes.items():
            sizes.setdefault(str(d), set()).add(int(n))
    given = {str(d): v for d, v in shards.items() if is_extents(v)}
    for d, v in given.items():
        if d not in sizes:
            raise InvalidValueError(
                f"shards names dimension {d!r}, which the data does not have "
                f"(dimensions: {sorted(sizes)})"
            )
        ext = check_extents(v, f"of dimension {d!r}")
        for n in sizes[d]:
            if sum(ext) != n:
                raise InvalidValueError(
                    f"shard extents of dimension {d!r} sum to {sum(ext)}, not its length {n}: "
                    "the extents must tile the dimension"
                )
        given[d] = ext
    return obj.chunk(given), {**shards, **dict.fromkeys(given, DASK)}


def with_dask_layout(
    ds: Any,
    user_encoding: dict[Hashable, dict[str, Any]],
    existing: set[str],
    shards_kw: Mapping[Hashable, Any] | str | None,
    shard_bytes: int,
) -> tuple[Any, dict[Hashable, dict[str, Any]], Grids]:
    """:func:`~shardwise.xarray.prepare.with_layout` with one shard per dask chunk along the
    dimensions ``shards_kw`` gives as ``"dask"``; and the rectilinear grids it chose, by
    variable name (for :func:`apply_grids`)."""
    grids: Grids = {}
    if not wants_dask(shards_kw):
        plain = with_layout(ds, user_encoding, existing, shards_kw, shard_bytes)  # type: ignore[arg-type]
        return (*plain, grids)
    assert shards_kw is not None
    ds = ds.copy(deep=False)
    out = dict(user_encoding)
    done = set()
    for name, var in ds.variables.items():
        if name in existing or var.ndim == 0:
            continue
        spec = shards_kw if isinstance(shards_kw, str) else _own(shards_kw, var.dims)
        if not wants_dask(spec):
            continue
        if var.chunks is None:
            if name in ds.data_vars:
                raise InvalidValueError(
                    f"variable {name!r}: shards={shards_kw!r} makes a shard of each dask chunk, "
                    "but it is not chunked: chunk it (ds.chunk(...)) or give shard sizes"
                )
            continue  # a coordinate in memory: the default rule
        explicit = name in user_encoding
        enc = user_encoding[name] if explicit else var.encoding
        given = enc.get("chunks") if explicit else None
        chunks, shards = dask_layout(
            spec,
            tuple(int(n) for n in var.shape),
            var.chunks,
            max(1, var.dtype.itemsize),
            None if given is None else tuple(given),
            tuple(map(str, var.dims)),
            shard_bytes,
        )
        if not all(isinstance(s, int) for s in shards):
            grids[str(name)] = shards
        stand_in = tuple(s if isinstance(s, int) else max(s) for s in shards)
        layout: dict[str, Any] = {"chunks": chunks, "shards": stand_in}
        if "compressors" not in enc and "compressor" not in enc:
            layout["compressors"] = default_compressors()
        if explicit:
            out[name] = {**enc, **layout}
        else:
            var.encoding = {**var.encoding, **layout}
        done.add(str(name))
    rest = None
    if not isinstance(shards_kw, str):
        rest = {d: n for d, n in shards_kw.items() if n != DASK} or None
    ds, out = with_layout(ds, out, existing | done, rest, shard_bytes)
    return ds, out, grids


def _own(shards: Mapping[Hashable, Any], dims: Any) -> dict[str, Any]:
    return {str(d): n for d, n in shards.items() if d in dims}


@with_rectilinear_grids
def apply_grids(overlay: Any, items: list[Any], group: str | None, grids: Grids) -> None:
    """Put the rectilinear grids into the metadata xarray's pass stored in ``overlay`` (under
    ``group``), reopen the captured targets of those arrays, and rebuild the group's
    consolidated metadata if it has some."""
    import zarr
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.metadata.v3 import RectilinearChunkGridMetadata
    from zarr.core.sync import sync

    if not grids:
        return
    proto = default_buffer_prototype()
    paths = {}
    for name, shards in grids.items():
        path = f"{group.strip('/')}/{name}" if group and group.strip("/") else name
        key = f"{path}/zarr.json"
        doc = json.loads(sync(overlay.get(key, proto)).to_bytes())
        shapes = tuple(s if isinstance(s, int) else tuple(s) for s in shards)
        doc["chunk_grid"] = RectilinearChunkGridMetadata(chunk_shapes=shapes).to_dict()
        sync(overlay.set(key, proto.buffer.from_bytes(json.dumps(doc, indent=2).encode())))
        paths[path] = key
    for i, (source, target, region) in enumerate(items):
        if target.path in paths:
            items[i] = (source, zarr.open_array(overlay, path=target.path, mode="r"), region)
    where = (group or "").strip("/")
    root = json.loads(
        sync(overlay.get(f"{where}/zarr.json" if where else "zarr.json", proto)).to_bytes()
    )
    if root.get("consolidated_metadata"):
        with warnings.catch_warnings():  # zarr's note that v3 does not specify it
            warnings.filterwarnings("ignore", "Consolidated metadata", UserWarning)
            zarr.consolidate_metadata(overlay, path=where or None, zarr_format=3)
