"""The OME-Zarr images of one ``write_pyramid`` call (``layout="ome"``): one image (numpy, dask, a
DataArray, a Dataset of one data variable) at the pyramid group, or one per data variable of a
Dataset, each its own OME-Zarr image in the subgroup named after the variable. Per image, the
OME ``scale``, ``translation`` and ``units`` of its space axes come from uniformly spaced
numeric coordinates where the caller did not give them.

>>> import numpy as np, xarray as xr
>>> x = xr.DataArray([0, 2, 4, 6], dims="x", attrs={"units": "nanometer"})
>>> a = xr.DataArray(np.zeros((3, 4)), dims=("y", "x"), coords={"y": [10.0, 10.5, 11.0], "x": x})
>>> physical(a, ("y", "x"))
({'y': 0.5, 'x': 2.0}, {'y': 10.0, 'x': 0.0}, {'x': 'nanometer'})
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.pyramid import AXIS_TYPES
from ..errors import InvalidValueError
from ..storage.store import ShardStore
from . import options
from .metadata import ome_attributes, put_group

__all__ = ["OME_SPACE_UNITS", "Source", "finish_images", "ome_plan", "physical", "sources"]

_PREFIXES = "atto centi deci exa femto giga hecto kilo mega micro milli nano peta pico tera"
OME_SPACE_UNITS = frozenset(
    [f"{p}meter" for p in ["", *_PREFIXES.split(), "yocto", "yotta", "zepto", "zetta"]]
    + ["angstrom", "foot", "inch", "mile", "parsec", "yard"]
)
"""The units OME-Zarr 0.5 takes for a space axis (its list of UDUNITS-2 names)."""
_TOLERANCE = 1e-6  # relative: float coordinates built by arange/linspace are uniform within it

Given = Callable[..., options.Shape]  # write.py's checks of the keywords against one image


@dataclass(frozen=True)
class Source:
    """One image to write: the subgroup it goes to (None: the pyramid group itself), and its
    scale, translation and units (the caller's, else from coordinates; None: the defaults)."""

    name: str | None
    image: options.Image
    scale: Any
    translation: Any
    units: Any


def sources(data: Any, dims: Any, scale: Any, translation: Any, units: Any) -> list[Source]:
    """The images of ``data`` with their physical keywords; nothing is read from a store."""
    xr = sys.modules.get("xarray")
    if xr is not None and isinstance(data, xr.Dataset) and len(data.data_vars) > 1:
        if dims is not None:
            raise InvalidValueError(
                "dims names the axes of one image; a Dataset's variables are named by their "
                "own dims (rename them with ds.rename)"
            )
        named = {str(d) for v in data.data_vars.values() for d in v.dims}
        for key, value in (("scale", scale), ("translation", translation), ("units", units)):
            unknown = sorted(k for k in value if k not in named) if _mapping(value) else []
            if unknown:
                raise InvalidValueError(
                    f"{key} names {unknown!r}, which are not dims of any data variable"
                )
        return [_variable(str(n), v, scale, translation, units) for n, v in data.data_vars.items()]
    img = options.image(data, dims)
    if xr is not None and isinstance(data, xr.Dataset):
        data = data[next(iter(data.data_vars))]
    if xr is None or not isinstance(data, xr.DataArray):
        return [Source(None, img, scale, translation, units)]
    return [Source(None, img, *_merged(data, img.axes, scale, translation, units))]


def _variable(name: str, var: Any, scale: Any, translation: Any, units: Any) -> Source:
    """One data variable of several as its own image (the subgroup ``name``)."""
    if not name or "/" in name or name.startswith("__") or name in (".", ".."):
        raise InvalidValueError(
            f"data variable {name!r} cannot name a subgroup: its image goes to group {name!r}"
        )
    try:
        img = options.image(var, None)
    except InvalidValueError as e:
        raise InvalidValueError(f"data variable {name!r}: {e}") from None
    mine = [_only(v, img.axes) for v in (scale, translation, units)]
    return Source(name, img, *_merged(var, img.axes, *mine))


def _mapping(value: Any) -> bool:
    return isinstance(value, Mapping)


def _only(value: Any, axes: tuple[str, ...]) -> Any:
    """A per-axis mapping given for several images, restricted to one image's axes."""
    return {k: v for k, v in value.items() if k in axes} if _mapping(value) else value


def _merged(arr: Any, axes: tuple[str, ...], *given: Any) -> tuple[Any, Any, Any]:
    """scale, translation, units: the coordinates' where found, the caller's entries winning
    (a value that is not a mapping is passed on, to be refused by the checks)."""
    found: tuple[dict[str, Any], ...] = physical(arr, axes)
    out = [
        {**f, **g} if isinstance(g, Mapping) else (g if g is not None else (f or None))
        for f, g in zip(found, given, strict=True)
    ]
    return out[0], out[1], out[2]


def physical(
    arr: Any, axes: Sequence[str]
) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """Scale, translation and units of ``arr``'s space axes from its coordinates: a 1-D
    numeric coordinate whose values step uniformly upwards gives the step as the scale and its
    first value as the translation; its ``units`` attribute, when OME-Zarr names that unit.
    Coordinates that are not uniform, descending, not numbers or not finite give nothing (the
    axis keeps scale 1 and translation 0): OME-Zarr's scale and translation cannot say them."""
    scale: dict[str, float] = {}
    shift: dict[str, float] = {}
    units: dict[str, str] = {}
    for axis, dim in zip(axes, arr.dims, strict=True):
        if AXIS_TYPES[axis] != "space" or dim not in arr.coords:
            continue
        c = arr.coords[dim]
        if c.ndim != 1 or c.dtype.kind not in "iuf":
            continue
        v = np.asarray(c.values, dtype=np.float64)
        step = np.diff(v)
        if not np.isfinite(v).all() or (
            len(v) > 1 and not (step[0] > 0 and np.allclose(step, step[0], rtol=_TOLERANCE, atol=0))
        ):
            continue
        if len(v) > 1:
            scale[axis] = float(step[0])
        shift[axis] = float(v[0])
        unit = c.attrs.get("units")
        if isinstance(unit, str) and unit in OME_SPACE_UNITS:
            units[axis] = unit
    return scale, shift, units


def ome_plan(
    found: Sequence[Source],
    given: Sequence[options.Shape],
    plan_image: Callable[..., list[Any]],
    name: str | None,
) -> tuple[list[Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """Every level of every image (an image of a subgroup at ``name/k``), the pyramid group's
    attributes (an image's ``ome``, or none when the images are in subgroups) and each
    subgroup's."""
    plan: list[Any] = []
    images: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for src, shape in zip(found, given, strict=True):
        mine = plan_image(src.image, shape, group=src.name)
        plan.extend(mine)
        axes = src.image.axes
        attrs = ome_attributes(
            axes,
            [lv.geometry for lv in mine],
            shape.method,
            units={a: u for a, u in zip(axes, shape.units, strict=True) if u},
            name=src.name if name is None else name,
        )
        if src.name is None:
            top = attrs
        else:
            images[src.name] = attrs
    return plan, top, images


def finish_images(group: ShardStore, images: Mapping[str, Mapping[str, Any]]) -> None:
    """After every level's data: each image's subgroup ``zarr.json`` with its ``ome``
    attributes (before the pyramid group's own, which comes last)."""
    for name, attrs in images.items():
        put_group(group, f"{name}/zarr.json", attrs)
