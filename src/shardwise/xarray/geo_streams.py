"""A GeoZarr pyramid streamed along time: :func:`stream_geozarr` and its :class:`GeoZarrStream`.

The layout is ``write_pyramid(layout="geozarr")``'s (``pyramid/geozarr.py``): child groups
``0``, ``1``, ... each a Dataset of the data variables reduced in ``y``/``x`` with their
reduced coordinates, the other coordinates and the grid-mapping variable carried over, and the
group's zarr-conventions ``multiscales`` attributes with the ``proj``/``spatial`` conventions.
Each level is a :class:`~shardwise.xarray.streams.DatasetStream` (its group's consolidated
metadata published as its variables seal, its time coordinate growing with them); a slice is
appended to level 0 (checked and encoded there first), then reduced in memory, level by level
(``reduce.py``, each level from the one before), and appended to the levels above. The
pyramid group's and the level groups' attributes name no time length, so they are valid from
the moment the stream opens: every level a reader opens is a consistent Dataset whatever it
has stored (the levels grow one after another, level 0 first).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..compat import consolidated_metadata
from ..core.pyramid import auto_levels, pyramid_levels
from ..engine.report import WriteReport
from ..errors import InvalidTypeError
from ..pyramid import geozarr, options
from ..pyramid.geo_attrs import level_attributes, level_spatial, pyramid_attributes
from ..pyramid.reduce import reduce_block
from ..storage.icechunk import is_icechunk_store, is_session
from ..storage.overlay import read_only
from ..storage.store import ShardStore, resolve_store
from ..write.stream_base import StreamBase
from .streams import DatasetStream, stream_dataset

__all__ = ["GeoZarrStream", "stream_geozarr"]


def stream_geozarr(
    store: Any,
    template: Any,
    *,
    levels: int | str = "auto",
    factors: int | Mapping[str, int] = 2,
    method: str = "mean",
    append_dim: str = "time",
    chunks: Mapping[str, int] | None = None,
    shards: Mapping[str, int] | int | None = None,
    group: str | None = None,
    mode: str = "w-",
    resume: bool = False,
    **kwargs: Any,
) -> GeoZarrStream:
    """Open a stream of slices of a geospatial Dataset into a GeoZarr multiscales pyramid
    (``write_pyramid(layout="geozarr")``'s layout), every level growing along ``append_dim``.

    Parameters
    ----------
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store``, a local path or a URL.
    template : xarray.Dataset
        As :func:`shardwise.stream_dataset` takes it, its data variables over ``(..., "y",
        "x")`` with 1-D ``y``/``x`` coordinates (and a grid-mapping variable, as
        ``write_pyramid`` takes them). It is read whole (its levels reduced from it): a
        frame or two is enough.
    levels : int or "auto", default "auto"
        The number of levels, level 0 included ("auto": until ``y``/``x`` fit an inner chunk).
    factors : int or dict, default 2
        The reduction of ``y`` and ``x`` at each level (a dict: per axis).
    method : {"mean", "nearest", "mode"}, default "mean"
        The reduction, as ``write_pyramid``'s.
    append_dim, chunks, shards : optional
        As :func:`shardwise.stream_dataset` takes them (``chunks``/``shards`` are level 0's:
        the smaller levels clip them to their ``y``/``x``).
    group : str, optional
        The pyramid group's path (levels at ``"<group>/0"``, ``"<group>/1"``, ...).
    mode, resume : optional
        As :func:`shardwise.stream_dataset` takes them, for every level.
    **kwargs
        The other keywords of :func:`shardwise.stream_dataset`, for every level.

    Returns
    -------
    GeoZarrStream
        ``append``, ``extend``, ``flush``, ``close`` (or a ``with`` block).

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A keyword of the wrong type or value, or a template that is no GeoZarr image (data
        variables over ``(..., "y", "x")``, 1-D ``y``/``x``), before the store is touched;
        an icechunk session (the pyramid's group keeps its levels' consolidated metadata,
        which an icechunk store does not: stream each level with ``stream_dataset``).
    ArrayExistsError, LeaseHeldError, PlanError
        As :func:`shardwise.stream_dataset` raises them, for the first level that does.

    Examples
    --------
    >>> import numpy as np, pandas as pd, shardwise, xarray as xr, zarr
    >>> def scene(i):
    ...     when = pd.date_range("2024-01-01", periods=1) + pd.Timedelta(days=i)
    ...     return xr.Dataset({"b": (("time", "y", "x"), np.full((1, 8, 8), i, "f4"))},
    ...                       coords={"time": when, "y": np.arange(8.0), "x": np.arange(8.0)})
    >>> store = zarr.storage.MemoryStore()
    >>> with shardwise.stream_geozarr(store, scene(0), levels=2, shards=4) as s:
    ...     for i in range(6):
    ...         s.append(scene(i))
    >>> xr.open_zarr(store, group="1")["b"].shape
    (6, 4, 4)
    """
    if is_session(store) or is_icechunk_store(store):
        raise InvalidTypeError(
            "stream_geozarr does not take an icechunk session: its pyramid group keeps the "
            "levels' consolidated metadata, which an icechunk store does not (stream_dataset "
            "streams one level group into a session); nothing was written"
        )
    geo = geozarr.geo_inputs(template)
    per_axis = geozarr.geo_factors(factors)
    f = (per_axis.get("y", 1), per_axis.get("x", 1))
    first = next(iter(geo.images.values()))
    how = options.method(method, np.dtype(first.data.dtype))
    yx = (int(template.sizes["y"]), int(template.sizes["x"]))
    given = dict(chunks or {})
    count = options.levels(levels)
    if count is None:
        fits = tuple(min(given.get(a, 256), n) for a, n in zip(("y", "x"), yx, strict=True))
        count = auto_levels(yx, f, fits)
    geometry = pyramid_levels(yx, f, count, centered=how != "nearest")
    extras = geozarr.level_extras(geo.coords, geometry, how, geo.grid)
    spatial = [
        level_spatial(geo.grid, (lv.shape[0], lv.shape[1]), (lv.factors[0], lv.factors[1]), how)
        for lv in geometry
        if geo.grid is not None
    ]
    attrs = geozarr.multiscales_attributes(geometry, how, geo.group_attrs)
    places: list[Any] = list(spatial) or [None] * count
    prefix = f"{group.strip('/')}/" if group and group.strip("/") else ""
    opened: list[DatasetStream] = []
    try:
        level = template
        for k, lv in enumerate(geometry):
            if k:
                level = _reduced(level, append_dim, _steps(geometry, k), how)
            mine = _level(template, level, extras[k], level_attributes(geo.crs, places[k]))
            sized = dict(zip(("y", "x"), lv.shape, strict=True))
            opened.append(stream_dataset(
                store, mine, append_dim=append_dim, chunks=_clip(given, sized),
                shards=_clip_shards(shards, given, sized, append_dim), group=f"{prefix}{k}",
                mode=mode, resume=resume, **kwargs,
            ))  # fmt: skip
        zstore = resolve_store(store, mode="w", storage_options=kwargs.get("storage_options"))
        root = ShardStore(zstore, prefix.rstrip("/"))
        whole = pyramid_attributes(attrs, geo.crs, spatial)
        return GeoZarrStream(opened, geometry, how, append_dim, (zstore, root, whole))
    except BaseException as e:
        for s in opened:
            s.__exit__(type(e), e, e.__traceback__)
        raise


def _steps(geometry: list[Any], k: int) -> tuple[int, int]:
    """The y/x factors reducing level ``k - 1`` into level ``k``."""
    lo, up = geometry[k - 1].factors, geometry[k].factors
    return (up[0] // lo[0], up[1] // lo[1])


def _reduced(ds: Any, dim: str, steps: tuple[int, int], how: str) -> Any:
    """The data variables over (..., y, x) of ``ds`` reduced by ``steps`` (the others, and the
    coordinates, as they are)."""
    import xarray as xr

    out = {}
    for name, var in ds.data_vars.items():
        if var.dims[-2:] == ("y", "x"):
            f = (1,) * (var.ndim - 2) + steps
            var = xr.Variable(var.dims, reduce_block(np.asarray(var.values), f, how), var.attrs)
        out[name] = var
    keep = {n: v for n, v in ds.coords.items() if "y" not in v.dims and "x" not in v.dims}
    return xr.Dataset(out, coords=keep, attrs=ds.attrs)


def _level(template: Any, level: Any, extras: Mapping[str, Any], attrs: dict[str, Any]) -> Any:
    """A level's Dataset: its data variables, its small variables (``y``/``x`` reduced, the
    others carried over) and its group's attributes; the template's encodings kept."""
    import xarray as xr

    coords = {n: xr.Variable(x.dims, x.values, x.attrs) for n, x in extras.items()}
    data = {}
    for name, var in level.data_vars.items():
        if var.dims[-2:] != ("y", "x"):
            continue  # a small variable, in ``extras``
        kept = {k: v for k, v in var.attrs.items() if k != "coordinates"}
        data[name] = xr.Variable(var.dims, var.values, kept)
    ds = xr.Dataset(data, coords=coords, attrs=attrs)
    for name in ds.variables:
        if name in template.variables:
            ds.variables[name].encoding = dict(template.variables[name].encoding)
    return ds


def _clip(given: Mapping[str, int], sized: Mapping[str, int]) -> dict[str, int]:
    return {d: min(n, sized[d]) if d in sized else n for d, n in given.items()}


def _clip_shards(shards: Any, chunks: Mapping[str, int], sized: Mapping[str, int], dim: str) -> Any:
    """Level 0's shards for a smaller level: ``y``/``x`` clipped to its whole inner chunks."""
    if not isinstance(shards, Mapping):
        return shards
    out = {}
    for d, n in shards.items():
        if d in sized:
            c = min(chunks.get(d, sized[d]), max(sized[d], 1))
            n = min(n, -(-max(sized[d], 1) // c) * c)
        out[d] = n
    return out


class GeoZarrStream(StreamBase):
    """An open GeoZarr pyramid stream (made by :func:`stream_geozarr`, never built directly).

    Attributes
    ----------
    levels : list of DatasetStream
        Each level's Dataset stream, level 0 first.
    frames, resumed_from
        Frames appended, and stored when it opened (the fewest of any level).
    report : WriteReport or None
        What every level wrote, once closed.

    Examples
    --------
    >>> import numpy as np, pandas as pd, shardwise, xarray as xr, zarr
    >>> def scene(i):
    ...     when = pd.date_range("2024-01-01", periods=1) + pd.Timedelta(days=i)
    ...     return xr.Dataset({"b": (("time", "y", "x"), np.full((1, 8, 8), i, "f4"))},
    ...                       coords={"time": when, "y": np.arange(8.0), "x": np.arange(8.0)})
    >>> with shardwise.stream_geozarr(zarr.storage.MemoryStore(), scene(0), levels=2,
    ...                               shards=4) as s:
    ...     for i in range(5):
    ...         s.append(scene(i))
    >>> len(s.levels), s.frames, [level.stored for level in s.levels]
    (2, 5, [5, 5])
    """

    def __init__(
        self,
        levels: list[DatasetStream],
        geometry: list[Any],
        method: str,
        dim: str,
        group: tuple[Any, ShardStore, dict[str, Any]],
    ) -> None:
        self._zstore, self._group, self._attrs = group
        lock = threading.Lock()  # one growth of one level at a time, the group's after it
        for s in levels:
            s._lock = lock
            s.after_publish = self._consolidate
        self._consolidate()
        self.levels = levels
        self.geometry = geometry
        self.method = method
        self.append_dim = dim
        self.resumed_from = min(s.resumed_from for s in levels)
        self._skip = [s.resumed_from - self.resumed_from for s in levels]
        self.frames = self.resumed_from
        self.report: WriteReport | None = None

    def _consolidate(self) -> None:
        """The pyramid group's ``zarr.json``: its attributes and, consolidated, every level as
        stored now (after a level's growth, under the lock of every level's growths)."""
        path = self._group.path
        doc: dict[str, Any] = {"zarr_format": 3, "node_type": "group", "attributes": self._attrs}
        doc["consolidated_metadata"] = consolidated_metadata(read_only(self._zstore), path)
        self._group.put("zarr.json", json.dumps(doc, indent=2).encode())

    @property
    def stored(self) -> tuple[int, ...]:
        """Every level's frames readers see, level 0 first."""
        return tuple(s.stored for s in self.levels)

    def __repr__(self) -> str:
        return (
            f"<shardwise.GeoZarrStream {len(self.levels)} levels along {self.append_dim!r}, "
            f"{self.frames} frames, stored {self.stored}>"
        )

    def append(self, ds: Any) -> None:
        """Append a slice (as :meth:`DatasetStream.append` takes it) to level 0, then its
        reductions to the levels above.

        Parameters
        ----------
        ds : xarray.Dataset
            The frames to append, of every variable along the append dimension.
        """
        dim = self.append_dim
        streamed = {n for n, v in self.levels[0]._specs.items() if v.axis is not None}
        ds = ds.drop_vars([n for n in ds.data_vars if n not in streamed])  # written at open
        n = int(ds.sizes[dim]) if dim in ds.dims else 1  # else one step: a scalar coordinate
        for k, s in enumerate(self.levels):
            if k:
                ds = _reduced(ds, dim, _steps(self.geometry, k), self.method)
            skip = min(self._skip[k], n)
            if skip < n or not k:
                s.append(ds.isel({dim: slice(skip, None)}) if skip else ds)
            self._skip[k] -= skip
        self.frames += n

    def extend(self, ds: Any) -> None:
        """Append every frame of ``ds``, a shard-row of level 0 at a time.

        Parameters
        ----------
        ds : xarray.Dataset
            Frames of every variable along the append dimension.
        """
        step = min(s.step for s in self.levels[0].streams.values())
        n = int(ds.sizes[self.append_dim])
        for i in range(0, n, step):
            self.append(ds.isel({self.append_dim: slice(i, i + step)}).compute())

    def flush(self) -> None:
        """Store and publish every level's frames, level 0 first."""
        for s in self.levels:
            s.flush()

    def _parts(self) -> list[DatasetStream]:
        return self.levels
