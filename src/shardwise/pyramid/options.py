"""The checks of :func:`shardwise.write_pyramid`'s arguments, before the store is looked at:
the image (numpy, dask, a DataArray, a Dataset of one data variable) and its axes, the
factors, the number of levels, the method and the per-axis mappings."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compat import classic_dask
from ..core import args
from ..core.pyramid import MAX_LEVELS, Level, check_axes, default_axes, spatial
from ..core.targets import parse_target
from ..errors import InvalidTypeError, InvalidValueError
from .reduce import METHODS


@dataclass(frozen=True)
class Image:
    """The image to reduce: its data (numpy or dask) and the names of its axes."""

    data: Any
    axes: tuple[str, ...]


@dataclass(frozen=True)
class Shape:
    """The checked pyramid keywords: per axis where they are per axis."""

    factors: tuple[int, ...]
    levels: int | None  # None: "auto"
    method: str
    scale: tuple[float, ...]
    translation: tuple[float, ...]
    units: tuple[str, ...]  # "" where none is given
    chunks: tuple[int, ...] | None
    shards: tuple[int, ...] | None


def image(data: Any, dims: Sequence[str] | None) -> Image:
    """``data`` as an :class:`Image`: a DataArray's dims name its axes, a Dataset must hold one
    data variable (its image); ``dims`` overrides the names; unnamed axes are the last of
    (t, c, z, y, x)."""
    xr = sys.modules.get("xarray")
    named: tuple[str, ...] | None = None
    if xr is not None and isinstance(data, xr.Dataset):
        names = [str(n) for n in data.data_vars]
        if len(names) != 1:  # several are one image each (images.py): here none
            raise InvalidValueError(
                "write_pyramid writes a Dataset's data variables as images, and this one has "
                f"{len(names)} data variables {names}"
            )
        data = data[names[0]]
    if xr is not None and isinstance(data, xr.DataArray):
        named = tuple(str(d) for d in data.dims)
        data = data.data
    data = classic_dask(data)  # a dask_array array: its own graph, as a dask.array.Array
    if not hasattr(data, "shape") or not hasattr(data, "dtype") or isinstance(data, str):
        raise InvalidTypeError(
            "data must be a numpy or dask array, an xarray DataArray or a Dataset of one data "
            f"variable, got {type(data).__name__}"
        )
    if dims is not None:
        if isinstance(dims, str) or not isinstance(dims, Sequence):
            raise InvalidTypeError(f"dims must be a sequence of axis names, got {dims!r}")
        if len(dims) != len(data.shape):
            raise InvalidValueError(
                f"dims must name each of the data's {len(data.shape)} axes, got {tuple(dims)!r}"
            )
        named = tuple(str(d) for d in dims)
    axes = check_axes(named) if named is not None else default_axes(len(data.shape))
    return Image(data, axes)


def factors(value: Any, axes: tuple[str, ...]) -> tuple[int, ...]:
    """``factors=`` per axis: an int for every space axis, a mapping of space axis names, or a
    sequence with one entry per axis (1 on time and channel axes)."""
    reduced = spatial(axes)
    accepted = "an int >= 2, a mapping {axis: int}, or one int per axis (1 on t and c)"
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in axes or not reduced[axes.index(k)]]
        if unknown:
            raise InvalidValueError(
                f"factors names {unknown!r}, which are not space axes of the data {axes!r}"
            )
        given = {k: args.positive_int(f"factors[{k!r}]", v) for k, v in value.items()}
        out = tuple(given.get(a, 1) if r else 1 for a, r in zip(axes, reduced, strict=True))
    elif isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != len(axes):
            raise InvalidValueError(f"factors must be {accepted}, got {value!r} for {axes!r}")
        out = tuple(args.positive_int("factors", v) for v in value)
        if any(f != 1 and not r for f, r in zip(out, reduced, strict=True)):
            raise InvalidValueError(f"factors={value!r} reduces a time or channel axis {axes!r}")
    else:
        f = args.positive_int("factors", value)
        out = tuple(f if r else 1 for r in reduced)
    if all(f == 1 for f in out):
        raise InvalidValueError(f"factors must be {accepted}, got {value!r}: nothing reduces")
    return out


def levels(value: Any) -> int | None:
    """``levels=``: a count including level 0 (up to 32), or "auto" (None here)."""
    if isinstance(value, str):
        args.choice("levels", value, ("auto",))
        return None
    n = args.positive_int("levels", value)
    if n > MAX_LEVELS:
        raise InvalidValueError(f"levels must be 'auto' or 1 to {MAX_LEVELS}, got {n}")
    return n


def method(value: Any, dtype: np.dtype[Any]) -> str:
    """``method=`` checked, and taking the dtype: ``mean`` needs numbers."""
    args.choice("method", value, tuple(METHODS))
    if value == "mean" and dtype.kind not in "iufc":
        raise InvalidValueError(
            f"method='mean' averages numbers, and the data is {dtype}: use 'nearest' or 'mode'"
        )
    return str(value)


def per_axis(
    name: str, value: Any, axes: tuple[str, ...], kind: type, default: Any
) -> tuple[Any, ...]:
    """A mapping {axis name: value} (``scale``, ``translation``, ``units``) as one value per
    axis, ``default`` for axes not named; numbers must be finite (scales positive)."""
    if value is None:
        return (default,) * len(axes)
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"{name} must be a mapping {{axis: value}}, got {value!r}")
    unknown = [k for k in value if k not in axes]
    if unknown:
        raise InvalidValueError(f"{name} names {unknown!r}, which are not axes of {axes!r}")
    out = []
    for a in axes:
        v = value.get(a, default)
        if kind is str and not isinstance(v, str):
            raise InvalidTypeError(f"{name}[{a!r}] must be a str, got {v!r}")
        if kind is float:
            if isinstance(v, bool) or not isinstance(v, int | float | np.number):
                raise InvalidTypeError(f"{name}[{a!r}] must be a number, got {v!r}")
            if not np.isfinite(v) or (name == "scale" and v <= 0):
                what = "a positive number" if name == "scale" else "a finite number"
                raise InvalidValueError(f"{name}[{a!r}] must be {what}, got {v!r}")
            v = float(v)
        out.append(v)
    return tuple(out)


def shape_of(name: str, value: Any, ndim: int) -> tuple[int, ...] | None:
    """``chunks=`` / ``shards=`` of level 0: None ("auto" for chunks), an int for every axis or
    one positive int per axis."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return None
    accepted = "'auto' or None, an int, or one positive int per axis"
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != ndim:
            raise InvalidValueError(f"{name} must be {accepted} ({ndim} axes), got {value!r}")
        return tuple(args.positive_int(name, v) for v in value)
    if isinstance(value, str) and name == "shards":  # a target: "2GB", "XY" (the planner's)
        return parse_target(value).text  # type: ignore[return-value]
    if isinstance(value, str):
        raise InvalidValueError(f"{name} must be {accepted}, got {value!r}")
    return (args.positive_int(name, value),) * ndim


def steps(geometry: Sequence[Level]) -> list[tuple[int, ...]]:
    """The factors reducing each level of a pyramid's ``geometry`` into the next."""
    return [
        tuple(b // a for a, b in zip(lo.factors, up.factors, strict=True))
        for lo, up in itertools.pairwise(geometry)
    ]
