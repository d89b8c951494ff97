"""The GeoZarr multiscales layout of a pyramid (``layout="geozarr"``): a group whose child
groups ``0``, ``1``, ... are the levels, each a Dataset holding the data variables with their
reduced ``y``/``x`` coordinates, the other coordinates and the grid-mapping (CRS) variable
carried over, and the group's ``multiscales`` attributes as the zarr-conventions multiscales
convention (which GeoZarr and EOPF GeoZarr use): one ``layout`` entry per level, each derived
from the one before with its relative ``scale`` and ``translation``, composed with the ``proj``
and ``spatial`` conventions (:mod:`.geo_attrs`: the CRS, and each level's affine transform,
shape and bbox, on the pyramid group's layout entries and on each level group).

Every array is one ``ArrayWrite`` of the pyramid's pipeline: the data variables' levels and
each level's small variables (:class:`Small`: the reduced ``y``/``x``, the other coordinates,
the grid-mapping variable), so that these too are leased, recorded and skipped on resume; the
level groups' and the pyramid group's ``zarr.json`` are written after all of them
(:func:`finish`).

>>> from shardwise.core.pyramid import pyramid_levels
>>> attrs = multiscales_attributes(pyramid_levels((4, 4), (2, 2), 2, centered=True), "mean", {})
>>> attrs["multiscales"]["layout"][1]["transform"]
{'scale': [2.0, 2.0], 'translation': [0.5, 0.5]}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..codec.metadata import ArrayInfo, default_compressors
from ..core import args
from ..core.job import WritePlan
from ..core.plan import ShardPlan
from ..core.planner import default_layout
from ..core.pyramid import Level
from ..errors import InvalidTypeError, InvalidValueError
from ..storage.nodes import open_info
from ..storage.store import ShardStore
from . import options
from .geo_attrs import (
    Grid,
    crs_attributes,
    grid_mapping_of_level,
    level_attributes,
    level_spatial,
    pixel_centres,
    pyramid_attributes,
    regular_grid,
)
from .metadata import put_group
from .options import Image
from .reduce import reduce_block

__all__ = [
    "CONVENTION",
    "Extra",
    "Geo",
    "Small",
    "finish",
    "geo_factors",
    "geo_inputs",
    "geo_plan",
    "level_extras",
    "multiscales_attributes",
    "plan_small",
]

CONVENTION = {
    "uuid": "d35379db-88df-4056-af3a-620245f8e347",
    "schema_url": "https://raw.githubusercontent.com/zarr-conventions/multiscales/refs/tags/v0.1/schema.json",
    "spec_url": "https://github.com/zarr-conventions/multiscales/blob/v0.1/README.md",
    "name": "multiscales",
    "description": "Multiscale layout of zarr datasets",
}
"""The multiscales convention's metadata object (zarr-conventions/multiscales v0.1)."""
# the multiscales convention's names of the reductions
_RESAMPLING = {"mean": "average", "nearest": "nearest", "mode": "mode"}


@dataclass(frozen=True)
class Extra:
    """A small variable of a level, its values in memory: a coordinate or the grid-mapping
    variable (written whole, by one task: :class:`Small`)."""

    values: np.ndarray
    dims: tuple[str, ...]
    attrs: dict[str, Any]


@dataclass(frozen=True)
class Geo:
    """A geospatial Dataset checked: its data variables over ``y``/``x`` (each an image), the
    variables carried to every level, and the group's attributes."""

    images: dict[str, Image]
    attrs: dict[str, dict[str, Any]]  # per data variable, for its arrays
    coords: dict[str, Extra]  # y/x and the rest, at level 0
    group_attrs: dict[str, Any]
    crs: dict[str, str]  # proj:code / proj:wkt2, when the Dataset says its CRS
    grid: Grid | None  # level 0's regular y/x grid, when they are one


@dataclass(frozen=True)
class Small:
    """A level's small variable planned as :mod:`.write` plans a level (the same fields), so
    that it is one more ``ArrayWrite`` of the pyramid's pipeline: one shard task, its metadata
    created with the others', its shard recorded and skipped on resume."""

    path: str
    source: np.ndarray
    create: dict[str, Any]  # the zarr.create_array keywords
    probe: Any  # the array built in memory from them
    info: ArrayInfo
    job: WritePlan
    tree: None = None  # written alone, never in a tree of shard tasks


def geo_inputs(data: Any, ome_only: Sequence[Any] = ()) -> Geo:
    """``data`` (an xarray Dataset or DataArray whose data variables end in dims ``y``, ``x``)
    checked for the GeoZarr layout; ``ome_only``: the values of ``dims``, ``scale``,
    ``translation``, ``units`` and ``name``, which this layout refuses."""
    import xarray as xr

    if any(v is not None for v in ome_only):
        raise InvalidValueError(
            "dims, scale, translation, units and name are of layout='ome'; "
            "layout='geozarr' takes them from the Dataset's coordinates"
        )
    if isinstance(data, xr.DataArray):
        data = data.to_dataset(name=str(data.name) if data.name is not None else "data")
    if not isinstance(data, xr.Dataset):
        raise InvalidTypeError(
            f"layout='geozarr' writes an xarray Dataset or DataArray, got {type(data).__name__}"
        )
    images: dict[str, Image] = {}
    attrs: dict[str, dict[str, Any]] = {}
    coords: dict[str, Extra] = {}
    for name, var in data.variables.items():
        dims = tuple(str(d) for d in var.dims)
        if name in data.data_vars and dims[-2:] == ("y", "x"):
            images[str(name)] = Image(var.data, dims)
            attrs[str(name)] = _json(dict(var.attrs))
        elif ("y" in dims or "x" in dims) and dims not in (("y",), ("x",)):
            raise InvalidValueError(
                f"layout='geozarr' reduces variables whose last dims are ('y', 'x') and 1-D y/x "
                f"coordinates; {name!r} has dims {dims}"
            )
        else:
            coords[str(name)] = Extra(np.asarray(var.values), dims, _json(dict(var.attrs)))
    if not images or "y" not in coords or "x" not in coords:
        raise InvalidValueError(
            "layout='geozarr' needs data variables over dims (..., 'y', 'x') with 1-D 'y' and "
            f"'x' coordinates; the Dataset has data variables {list(data.data_vars)} and "
            f"coordinates {list(data.coords)}"
        )
    others = sorted(str(c) for c in data.coords if str(c) not in ("y", "x") and str(c) in coords)
    for name in images:
        if others:
            attrs[name]["coordinates"] = " ".join(others)
    grid = regular_grid(coords["y"].values, coords["x"].values)
    return Geo(images, attrs, coords, _json(dict(data.attrs)), crs_attributes(data), grid)


def geo_factors(value: Any) -> dict[str, int]:
    """``factors=`` of the GeoZarr layout: an int for y and x, or a mapping of them."""
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in ("y", "x")]
        if unknown:
            raise InvalidValueError(f"factors names {unknown!r}; layout='geozarr' reduces y, x")
        out = {k: args.positive_int(f"factors[{k!r}]", v) for k, v in value.items()}
    else:
        f = args.positive_int("factors", value)
        out = {"y": f, "x": f}
    if all(out.get(a, 1) == 1 for a in ("y", "x")):
        raise InvalidValueError(f"factors must reduce y or x, got {value!r}: nothing reduces")
    return out


def level_extras(
    coords: Mapping[str, Extra], levels: Sequence[Level], method: str, grid: Grid | None = None
) -> list[dict[str, Extra]]:
    """The small variables of every level: ``y``/``x`` reduced as the data are (the mean of
    each block of coordinates for mean and mode, so a sample sits at its block's centre; the
    first of each block for nearest), the others unchanged. On a regular ``grid`` a reduced
    level's ``y``/``x`` are its pixel centres under its ``spatial:transform`` (the same for
    whole blocks; the last, partial block of an odd size is placed on the grid, not at the
    mean of the samples it has). A grid mapping with a GDAL ``GeoTransform`` (rioxarray's
    ``spatial_ref``) gets each level's own (:func:`~.geo_attrs.grid_mapping_of_level`)."""
    out: list[dict[str, Extra]] = []
    how = "nearest" if method == "nearest" else "mean"
    for k, lv in enumerate(levels):
        here = dict(out[-1]) if out else dict(coords)
        for name, c in coords.items() if k else ():
            if "GeoTransform" in c.attrs:  # a grid mapping: placed on this level's grid
                mine = grid_mapping_of_level(c.attrs, grid, _pair(lv.shape), _pair(lv.factors), how)
                here[name] = Extra(here[name].values, c.dims, mine)
        if k and grid is not None:
            centres = pixel_centres(grid, _pair(lv.shape), _pair(lv.factors), how)
            for axis, v in zip(("y", "x"), centres, strict=True):
                c = coords[axis]
                keep = c.values.dtype if how == "nearest" else np.dtype(np.float64)
                v = np.rint(v) if keep.kind in "iu" else v
                here[axis] = Extra(v.astype(keep), c.dims, c.attrs)
        elif k:
            for axis, i in (("y", -2), ("x", -1)):
                step = lv.factors[i] // levels[k - 1].factors[i]
                c = here[axis]
                v = c.values if how == "nearest" else c.values.astype(np.float64)
                here[axis] = Extra(reduce_block(v, (step,), how), c.dims, c.attrs)
        out.append(here)
    return out


def multiscales_attributes(
    levels: Sequence[Level], method: str, attrs: Mapping[str, Any]
) -> dict[str, Any]:
    """The pyramid group's attributes: the source's, the convention and the ``multiscales``
    layout (each level's transform relative to the level it derives from, in its samples)."""
    layout: list[dict[str, Any]] = [{"asset": "0"}]
    for k in range(1, len(levels)):
        step = [
            b // a for a, b in zip(levels[k - 1].factors[-2:], levels[k].factors[-2:], strict=True)
        ]
        shift = [0.0 if method == "nearest" else (s - 1) / 2 for s in step]
        layout.append(
            {
                "asset": str(k),
                "derived_from": str(k - 1),
                "transform": {"scale": [float(s) for s in step], "translation": shift},
                "resampling_method": _RESAMPLING[method],
            }
        )
    multiscales = {"layout": layout, "resampling_method": _RESAMPLING[method]}
    return {**attrs, "zarr_conventions": [CONVENTION], "multiscales": multiscales}


def geo_plan(
    geo: Geo,
    factors: Any,
    levels: Any,
    method: Any,
    chunks: Any,
    shards: Any,
    create: dict[str, Any],
    plan_var: Callable[..., list[Any]],
) -> tuple[list[Any], dict[str, Any], list[dict[str, Any]]]:
    """Every array of a GeoZarr pyramid: every level of every data variable (paths
    ``"k/name"``; as many levels for each as for the first) and every level's small variables
    (:class:`Small`), listed level by level; the pyramid group's attributes and each level
    group's."""
    per_axis = geo_factors(factors)
    plan: list[Any] = []
    count = options.levels(levels)
    for var, img in geo.images.items():
        f = tuple(per_axis.get(a, 1) if a in ("y", "x") else 1 for a in img.axes)
        given = options.Shape(
            factors=f,
            levels=count,
            method=options.method(method, np.dtype(img.data.dtype)),
            scale=(1.0,) * len(f),
            translation=(0.0,) * len(f),
            units=("",) * len(f),
            chunks=options.shape_of("chunks", _yx(chunks, len(f)), len(f)),
            shards=options.shape_of("shards", _yx(shards, len(f)), len(f)),
        )
        mine = plan_var(img, given, {**create, "attributes": geo.attrs[var]}, var=var)
        count = len(mine)
        plan.extend(mine)
    geometry = [lv.geometry for lv in plan[:count]]
    for k, small in enumerate(level_extras(geo.coords, geometry, str(method), geo.grid)):
        plan.extend(plan_small(f"{k}/{name}", x, create) for name, x in small.items())
    # level by level, so that a level's variables are listed together
    plan.sort(key=lambda lv: int(lv.path.split("/")[0]))
    spatial = [
        level_spatial(geo.grid, _pair(lv.shape), _pair(lv.factors), str(method))
        for lv in geometry
        if geo.grid is not None
    ]
    attrs = multiscales_attributes(geometry, str(method), geo.group_attrs)
    places: list[dict[str, Any] | None] = list(spatial) or [None] * len(geometry)
    groups = [level_attributes(geo.crs, s) for s in places]
    return plan, pyramid_attributes(attrs, geo.crs, spatial), groups


def plan_small(path: str, x: Extra, create: Mapping[str, Any]) -> Small:
    """A small variable's array (default chunks and shards: one shard but for the largest),
    built and checked in memory, and its validated job (written whole, from numpy)."""
    from ..write.create import create_in_memory
    from ..write.intent import job_for

    values = x.values
    if values.dtype == object:
        if not all(isinstance(v, str) for v in values.flat):
            raise InvalidValueError(
                f"layout='geozarr' stores the variable {path.split('/', 1)[1]!r} of dtype "
                "object only when it holds Python strings: convert it first"
            )
        values = values.astype(np.dtypes.StringDType())
    dtype: Any = str if values.dtype.kind == "T" else values.dtype
    shape = tuple(int(n) for n in values.shape)
    chunks, shards = default_layout(shape, values.dtype.itemsize)
    comp = create["compressors"]
    kwargs: dict[str, Any] = dict(
        shape=shape,
        dtype=dtype,
        chunks=chunks,
        shards=shards,
        zarr_format=3,
        compressors=default_compressors() if isinstance(comp, str) and comp == "auto" else comp,
        dimension_names=list(x.dims) if x.dims else None,
        attributes=x.attrs,
    )
    probe = create_in_memory(kwargs)
    info = open_info(probe.store)
    region = tuple(slice(0, n) for n in shape)
    job = job_for(ShardPlan(info.layout, region), values, info.dtype, role="whole")
    job.validate()
    return Small(path, values, kwargs, probe, info, job)


def finish(
    group: ShardStore, levels: Sequence[Mapping[str, Any]], attrs: Mapping[str, Any]
) -> None:
    """After every array's data: a GeoZarr pyramid's level groups (``levels``: their
    attributes; none for OME-Zarr), then the pyramid group's ``zarr.json`` (last: a pyramid
    cut short is not advertised as one)."""
    for k, level in enumerate(levels):
        put_group(group, f"{k}/zarr.json", level)
    put_group(group, "zarr.json", attrs)


def _pair(values: Sequence[int]) -> tuple[int, int]:
    """The (y, x) of a level's shape or factors (the last two axes)."""
    return int(values[-2]), int(values[-1])


def _yx(value: Any, ndim: int) -> Any:
    """A (y, x) pair of ``chunks=`` / ``shards=`` for a variable with more axes: one sample
    along the others (variables of different dims share the keyword)."""
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        return (1,) * (ndim - 2) + tuple(value)
    return value


def _json(value: Any) -> Any:
    """Attributes as JSON values (xarray attributes may hold numpy scalars and arrays)."""
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return _json(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value
