"""GeoZarr's spatial and projection attributes of a pyramid's levels, as the zarr-conventions
GeoZarr composes with ``multiscales``: ``proj`` (the CRS as ``proj:code`` and ``proj:wkt2``,
found on the source's grid-mapping variable or attributes, e.g. rioxarray's ``spatial_ref``)
and ``spatial`` (each level's affine ``spatial:transform``, ``spatial:shape`` and
``spatial:bbox`` over ``spatial:dimensions`` ``["y", "x"]``, pixel registration).

A level's transform follows the grid of its reduced coordinates: level 0's ``y``/``x`` must be
regular (else no ``spatial`` attributes are written: no affine places them), a reduced level's
pixel is ``factor`` times level 0's, and its first sample sits where the reduction puts it (the
centre of its first block for mean and mode, which keeps the grid's corner; the block's first
sample for nearest, which moves it by half a block less half a sample). A reduced level's
``y``/``x`` are then its pixels' centres under that transform (:func:`pixel_centres`), the
last pixel of an odd-sized level too, so both georeferences of a level agree.

>>> level_spatial(Grid(5000.0, -10.0, 300.0, 10.0), (23, 16), (2, 2), "mean")["spatial:transform"]
[20.0, 0.0, 295.0, 0.0, -20.0, 5005.0]
>>> top_level_code('PROJCRS["UTM 32N",BASEGEOGCRS["WGS 84",ID["EPSG",4326]],ID["EPSG",32632]]')
'EPSG:32632'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "PROJ",
    "SPATIAL",
    "Grid",
    "crs_attributes",
    "grid_mapping_of_level",
    "level_attributes",
    "level_spatial",
    "pixel_centres",
    "pyramid_attributes",
    "regular_grid",
    "top_level_code",
]

PROJ = {
    "uuid": "f17cb550-5864-4468-aeb7-f3180cfb622f",
    "schema_url": "https://raw.githubusercontent.com/zarr-conventions/proj/refs/tags/v0.1/schema.json",
    "spec_url": "https://github.com/zarr-conventions/proj/blob/v0.1/README.md",
    "name": "proj",
    "description": "Coordinate reference system information for geospatial data",
}
"""The proj convention's metadata object (zarr-conventions/proj v0.1)."""
SPATIAL = {
    "uuid": "689b58e2-cf7b-45e0-9fff-9cfc0883d6b4",
    "schema_url": "https://raw.githubusercontent.com/zarr-conventions/spatial/refs/tags/v0.1/schema.json",
    "spec_url": "https://github.com/zarr-conventions/spatial/blob/v0.1/README.md",
    "name": "spatial",
    "description": "Spatial coordinate information",
}
"""The spatial convention's metadata object (zarr-conventions/spatial v0.1)."""

# the first keyword of a WKT2 CRS (ISO 19162): a WKT1 one (PROJCS, GEOGCS, ...) is not proj:wkt2
_WKT2 = {
    "BOUNDCRS", "COMPOUNDCRS", "DERIVEDPROJCRS", "ENGCRS", "ENGINEERINGCRS", "GEODCRS",
    "GEODETICCRS", "GEOGCRS", "GEOGRAPHICCRS", "PARAMETRICCRS", "PROJCRS", "PROJECTEDCRS",
    "TIMECRS", "VERTCRS", "VERTICALCRS",
}  # fmt: skip
_CODE = re.compile(r"^[^:\s\[\]\"]+:[^:\s\[\]\"]+$")  # authority:code, as proj:code wants it
_ID = re.compile(r'^"([^"]+)"\s*,\s*"?([^",\]]+)"?')
# a regular grid: every step within this fraction of the mean step
_REGULAR = 1e-6


@dataclass(frozen=True)
class Grid:
    """Level 0's regular grid: the centre of its first sample and the signed step per axis."""

    y0: float
    dy: float
    x0: float
    dx: float


def regular_grid(y: np.ndarray, x: np.ndarray) -> Grid | None:
    """The grid of 1-D coordinates ``y`` and ``x``, or None when they are not regular numbers
    (fewer than two samples, uneven steps, not numbers): no affine places them."""
    steps = []
    for c in (y, x):
        if c.ndim != 1 or c.size < 2 or c.dtype.kind not in "iuf":
            return None
        v = c.astype(np.float64)
        step = (v[-1] - v[0]) / (v.size - 1)
        if step == 0 or not np.isfinite(step):
            return None
        if np.max(np.abs(np.diff(v) - step)) > _REGULAR * abs(step):
            return None
        steps.append((float(v[0]), float(step)))
    return Grid(steps[0][0], steps[0][1], steps[1][0], steps[1][1])


def level_spatial(
    grid: Grid, shape: tuple[int, int], factors: tuple[int, int], method: str
) -> dict[str, Any]:
    """The ``spatial:`` transform, shape and bbox of a level of ``shape`` (y, x), reduced by
    ``factors`` (y, x) from level 0 of ``grid`` by ``method``."""
    e, a = grid.dy * factors[0], grid.dx * factors[1]
    # the centre of the level's first sample
    if method == "nearest":
        cy, cx = grid.y0, grid.x0
    else:
        cy = grid.y0 + grid.dy * (factors[0] - 1) / 2
        cx = grid.x0 + grid.dx * (factors[1] - 1) / 2
    c, f = cx - a / 2, cy - e / 2  # the outer corner of the first pixel
    xs, ys = (c, c + a * shape[1]), (f, f + e * shape[0])
    return {
        "spatial:transform": [a, 0.0, c, 0.0, e, f],
        "spatial:shape": [int(shape[0]), int(shape[1])],
        "spatial:bbox": [min(xs), min(ys), max(xs), max(ys)],
    }


def gdal_grid(attrs: Mapping[str, Any]) -> Grid | None:
    """The grid a grid-mapping variable's GDAL ``GeoTransform`` (``"c a b f d e"``, as
    rioxarray writes it) places level 0 on, when it has no rotation; else None."""
    try:
        c, a, b, f, d, e = (float(v) for v in str(attrs["GeoTransform"]).split())
    except (KeyError, ValueError):
        return None
    if b or d or not a or not e:
        return None
    return Grid(f + e / 2, e, c + a / 2, a)


def grid_mapping_of_level(
    attrs: Mapping[str, Any],
    grid: Grid | None,
    shape: tuple[int, int],
    factors: tuple[int, int],
    method: str,
) -> dict[str, Any]:
    """The attributes of a grid-mapping variable (e.g. rioxarray's ``spatial_ref``) at a
    reduced level: its GDAL ``GeoTransform`` that level's (pixel size times ``factors``, origin
    where the reduction puts the first pixel: its ``spatial:transform``), which readers such as
    rioxarray take over the coordinates; on level 0's ``grid``, else on the grid its own
    ``GeoTransform`` gives (dropped when that has a rotation). Other attributes unchanged."""
    if "GeoTransform" not in attrs:
        return dict(attrs)
    out = {k: v for k, v in attrs.items() if k != "GeoTransform"}
    on = grid if grid is not None else gdal_grid(attrs)
    if on is not None:
        a, b, c, d, e, f = level_spatial(on, shape, factors, method)["spatial:transform"]
        out["GeoTransform"] = " ".join(str(float(v)) for v in (c, a, b, f, d, e))
    return out


def pixel_centres(
    grid: Grid, shape: tuple[int, int], factors: tuple[int, int], method: str
) -> tuple[np.ndarray, np.ndarray]:
    """The ``y`` and ``x`` coordinates of a level (float64): the centres of its pixels as its
    ``spatial:transform`` places them (pixel ``i`` at corner + (i + 0.5) * pixel size), the
    last pixel of an odd-sized level included (a mean of the samples present would put it
    elsewhere)."""
    a, _, c, _, e, f = level_spatial(grid, shape, factors, method)["spatial:transform"]
    ys = f + (np.arange(shape[0], dtype=np.float64) + 0.5) * e
    xs = c + (np.arange(shape[1], dtype=np.float64) + 0.5) * a
    return ys, xs


def crs_attributes(data: Any) -> dict[str, str]:
    """``proj:code`` and/or ``proj:wkt2`` of an xarray Dataset, from the first place that has
    a CRS: the grid-mapping variable its data variables name (``grid_mapping``), a variable
    ``spatial_ref`` or ``crs``, the Dataset's attributes; empty when none says one."""
    names = []
    for var in data.data_vars.values():
        gm = var.attrs.get("grid_mapping")
        if isinstance(gm, str) and gm.split():
            names.append(gm.split()[0].rstrip(":"))  # CF's extended form "crs: x y" too
    names += ["spatial_ref", "crs"]
    places = [data.variables[n].attrs for n in dict.fromkeys(names) if n in data.variables]
    for attrs in [*places, data.attrs]:
        found = _crs_of(attrs)
        if found:
            return found
    return {}


def _crs_of(attrs: Mapping[str, Any]) -> dict[str, str]:
    """The proj attributes one set of attributes says: ``proj:*`` as they are, CF's
    ``crs_wkt`` / GDAL's ``spatial_ref`` WKT, or ``crs`` given as ``"EPSG:32632"`` or WKT."""
    code = attrs.get("proj:code")
    wkt = next(
        (
            attrs[k]
            for k in ("proj:wkt2", "crs_wkt", "spatial_ref")
            if isinstance(attrs.get(k), str)
        ),
        None,
    )
    crs = attrs.get("crs")
    if isinstance(crs, str) and _CODE.match(crs.strip()):
        code = code or crs.strip()
    elif isinstance(crs, str) and wkt is None and "[" in crs:
        wkt = crs
    epsg = attrs.get("proj:epsg")  # the STAC projection extension's older form
    if code is None and isinstance(epsg, int | np.integer) and not isinstance(epsg, bool):
        code = f"EPSG:{int(epsg)}"
    out: dict[str, str] = {}
    if not (isinstance(code, str) and _CODE.match(code)):
        code = top_level_code(wkt) if wkt is not None else None
    if code is not None:
        out["proj:code"] = code
    if wkt is not None and wkt.split("[", 1)[0].strip().upper() in _WKT2:
        out["proj:wkt2"] = wkt
    return out


def top_level_code(wkt: str) -> str | None:
    """``AUTHORITY:CODE`` of a WKT CRS's own identifier (WKT2 ``ID[...]``, WKT1
    ``AUTHORITY[...]`` directly inside the outer keyword; those of its parts do not count)."""
    depth, start, found = 0, 0, None
    quoted = False
    for i, ch in enumerate(wkt):
        if ch == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif ch == "[":
            depth += 1
            if depth == 2:
                start = i
        elif ch == "]":
            if depth == 2:
                keyword = re.split(r"[,\[\]]", wkt[:start])[-1].strip().upper()
                m = _ID.match(wkt[start + 1 : i])
                if keyword in ("ID", "AUTHORITY") and m:
                    found = f"{m.group(1)}:{m.group(2).strip()}"
            depth -= 1
    return found


def level_attributes(crs: Mapping[str, str], spatial: Mapping[str, Any] | None) -> dict[str, Any]:
    """A level group's attributes: its CRS and spatial placement, with the conventions they
    follow (nothing when neither is known)."""
    conventions = ([PROJ] if crs else []) + ([SPATIAL] if spatial else [])
    if not conventions:
        return {}
    out: dict[str, Any] = {"zarr_conventions": conventions, **crs}
    if spatial:
        out.update({"spatial:dimensions": ["y", "x"], **spatial, "spatial:registration": "pixel"})
    return out


def pyramid_attributes(
    attrs: dict[str, Any], crs: Mapping[str, str], spatial: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The pyramid group's ``attrs`` (with ``multiscales``) with the CRS of every level and,
    per layout entry, its ``spatial:shape`` and ``spatial:transform``; the group's
    ``spatial:bbox`` is level 0's."""
    conventions = list(attrs["zarr_conventions"])
    conventions += ([PROJ] if crs else []) + ([SPATIAL] if spatial else [])
    out = {**attrs, "zarr_conventions": conventions, **crs}
    if spatial:
        layout = [
            {
                **entry,
                "spatial:shape": s["spatial:shape"],
                "spatial:transform": s["spatial:transform"],
            }
            for entry, s in zip(attrs["multiscales"]["layout"], spatial, strict=True)
        ]
        out["multiscales"] = {**attrs["multiscales"], "layout": layout}
        out["spatial:dimensions"] = ["y", "x"]
        out["spatial:bbox"] = spatial[0]["spatial:bbox"]
        out["spatial:registration"] = "pixel"
    return out
