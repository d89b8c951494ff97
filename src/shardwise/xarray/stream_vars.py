"""The variables of a Dataset stream (``xarray/streams.py``): what the store takes, read off the
template, and each appended slice checked and encoded before any byte is written.

The template is encoded by xarray itself: its first frame along the append dimension (or the
template as given, when it has none) is written with ``to_zarr`` into a throwaway memory
store, and each variable's array there gives what the stream's arrays take: dtype, fill value,
attributes (CF encoding: a time coordinate's ``units`` and ``calendar``, ``_FillValue``,
``coordinates``) and dimension names, as ``to_zarr`` would store them. A slice is encoded with
the same encoding (``encode_zarr_variable``, what ``to_zarr`` runs): a time that the stored
units cannot hold is refused, as are variables missing or extra, other dimensions, other sizes
across the append dimension and a dtype the stored one cannot take without loss.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidTypeError, InvalidValueError, PlanError

DEFAULT_FRAMES = 16  # frames of a shard-row when ``shards`` does not say
CF_KEYS = ("units", "calendar", "dtype", "_FillValue", "scale_factor", "add_offset")


@dataclass
class Spec:
    """One variable of the stored Dataset: its dimensions, stored dtype and shape (0 along the
    append dimension), fill value and attributes, the append axis (None: written once at open)
    and the encoding each slice is encoded with."""

    name: str
    dims: tuple[str, ...]
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    fill_value: Any
    attributes: dict[str, Any]
    axis: int | None
    encoding: dict[str, Any] = field(default_factory=dict)
    values: np.ndarray | None = None  # a variable without the append dimension: its values


def capture(template: Any, dim: str) -> tuple[dict[str, Spec], dict[str, Any]]:
    """Every variable of ``template`` as it is stored (by xarray's own encoding), and the group
    attributes."""
    import xarray as xr
    import zarr

    if not isinstance(template, xr.Dataset):
        raise InvalidTypeError(f"template must be an xarray.Dataset, got {type(template).__name__}")
    if not isinstance(dim, str) or dim not in template.dims:
        raise InvalidValueError(
            f"append_dim={dim!r} is not a dimension of the template "
            f"({', '.join(map(str, template.dims))})"
        )
    first = template.isel({dim: slice(0, 1)}) if template.sizes[dim] else template
    first = first.drop_encoding().copy(deep=False)  # no chunks or codecs of a source
    for name, v in template.variables.items():  # the CF encoding a user gave is kept
        enc = {k: v.encoding[k] for k in CF_KEYS if k in v.encoding}
        if v.dtype.kind in "mM" and "units" not in enc:  # units for every template frame
            enc.update(_time_units(v, str(name)))
        first.variables[name].encoding = enc
    mem = zarr.storage.MemoryStore()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first.to_zarr(mem, zarr_format=3, consolidated=False)
    group = zarr.open_group(mem, mode="r")
    specs = {}
    for name in template.variables:
        arr = group[str(name)]
        assert isinstance(arr, zarr.Array)
        dims = tuple(getattr(arr.metadata, "dimension_names", None) or ())
        axis = dims.index(dim) if dim in dims else None
        attrs = dict(arr.attrs.asdict())
        src = template.variables[name]
        enc = {k: src.encoding[k] for k in CF_KEYS if k in src.encoding}
        if src.dtype.kind in "mM":  # the units xarray chose (or was given), kept for every slice
            enc.update({k: attrs[k] for k in ("units", "calendar") if k in attrs})
            enc["dtype"] = arr.dtype
        shape = tuple(0 if i == axis else int(n) for i, n in enumerate(arr.shape))
        values = None if axis is not None else np.asarray(arr[...])
        specs[str(name)] = Spec(str(name), dims, np.dtype(arr.dtype), shape, arr.fill_value,
                                attrs, axis, enc, values)  # fmt: skip
    return specs, dict(group.attrs.asdict())


def _time_units(var: Any, name: str) -> dict[str, Any]:
    """The units (and calendar) xarray encodes every frame of a time variable with."""
    from xarray.backends.zarr import encode_zarr_variable

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attrs = encode_zarr_variable(var.copy(deep=False), name=name).attrs
    return {k: attrs[k] for k in ("units", "calendar") if k in attrs}


def _same_units(a: str, b: str) -> bool:
    """CF time units alike (``days since 2024-01-01`` is ``days since 2024-01-01 00:00:00``)."""
    import pandas as pd

    try:
        (ua, ra), (ub, rb) = (u.split(" since ", 1) for u in (a, b))
        return bool(ua.strip() == ub.strip() and pd.Timestamp(ra) == pd.Timestamp(rb))
    except (ValueError, TypeError):
        return a == b


def layouts(
    specs: Mapping[str, Spec], dim: str, chunks: Any, shards: Any
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Inner chunks and shards of each streamed variable: by dimension name, the append
    dimension's shard size the frames of a shard-row (``shards`` an int: that size alone);
    other dimensions whole unless named."""
    if isinstance(shards, int) and not isinstance(shards, bool):
        shards = {dim: shards}
    for key, given in (("chunks", chunks), ("shards", shards)):
        if given is not None and not isinstance(given, Mapping):
            raise InvalidTypeError(
                f"{key} must be a dict of sizes by dimension name, got {given!r}"
            )
        for d, n in (given or {}).items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InvalidValueError(f"{key}[{d!r}] must be a positive int, got {n!r}")
    chunks, shards = dict(chunks or {}), dict(shards or {})
    c_dim = chunks.get(dim, 1)
    shards.setdefault(dim, -(-max(DEFAULT_FRAMES, c_dim) // c_dim) * c_dim)
    out = {}
    for s in specs.values():
        if s.axis is None:
            continue
        cs, ss = [], []
        for d, n in zip(s.dims, s.shape, strict=True):
            c = chunks.get(d, c_dim if d == dim else max(n, 1))
            cs.append(c)
            ss.append(shards.get(d, -(-max(n, 1) // c) * c))
        out[s.name] = (tuple(cs), tuple(ss))
    return out


def encode_slice(specs: Mapping[str, Spec], dim: str, ds: Any) -> tuple[int, dict[str, Any]]:
    """The frames of ``ds`` (a Dataset of the stored variables along ``dim``) as each
    streamed variable stores them, every variable checked first: their count and values."""
    import xarray as xr
    from xarray.backends.zarr import encode_zarr_variable

    if not isinstance(ds, xr.Dataset):
        raise InvalidTypeError(f"append takes an xarray.Dataset, got {type(ds).__name__}")
    streamed = {n for n, s in specs.items() if s.axis is not None}
    found = {str(n): v for n, v in ds.variables.items()}
    if dim not in ds.dims and dim in ds.coords:  # one step: a scalar coordinate
        found = {
            n: v.set_dims({dim: 1, **v.sizes}) if n in streamed else v for n, v in found.items()
        }
    given = {n for n, v in found.items() if dim in v.dims}
    if given != streamed:
        missing, extra = sorted(streamed - given), sorted(given - streamed)
        raise PlanError(
            f"the slice's variables along {dim!r} are not the stream's: missing {missing}, "
            f"not in the store {extra}. Nothing was appended"
        )
    n = int(found[next(iter(given))].sizes[dim])
    out = {}
    for name in sorted(streamed):
        out[name] = _encoded(specs[name], found[name], dim, n, encode_zarr_variable)
    return n, out


def _encoded(s: Spec, var: Any, dim: str, n: int, encode: Any) -> np.ndarray:
    """One variable of a slice, checked against ``s`` and encoded as the store holds it."""
    if set(var.dims) != set(s.dims) or len(var.dims) != len(s.dims):
        raise PlanError(
            f"{s.name!r} has dimensions {var.dims}, the store {s.dims}. Nothing was appended"
        )
    var = var.transpose(*s.dims).copy(deep=False)
    want = tuple(n if i == s.axis else m for i, m in enumerate(s.shape))
    if tuple(var.shape) != want:
        raise PlanError(
            f"{s.name!r} has shape {var.shape}, the store takes {want} ({dim!r} along axis "
            f"{s.axis}). Nothing was appended"
        )
    var.encoding = dict(s.encoding)
    try:
        with warnings.catch_warnings():  # a change of units or dtype is refused below
            warnings.simplefilter("ignore")
            enc = encode(var, name=s.name)
    except (ValueError, OverflowError, TypeError) as e:
        raise PlanError(
            f"{s.name!r} cannot be encoded as the store holds it ({s.encoding}): {e}. "
            "Nothing was appended"
        ) from e
    unit = s.encoding.get("units")
    if unit is not None and not _same_units(str(enc.attrs.get("units", unit)), str(unit)):
        raise PlanError(
            f"{s.name!r} needs units {enc.attrs.get('units')!r}, the store's are {unit!r}. "
            "Nothing was appended"
        )
    values = np.asarray(enc.values)
    if not np.can_cast(values.dtype, s.dtype, casting="same_kind"):
        why = f" (times the store's units {unit!r} cannot hold)" if unit else ""
        raise PlanError(
            f"{s.name!r} is {values.dtype}{why}, the store's {s.dtype} cannot take it without "
            "loss. Nothing was appended"
        )
    return values
