"""A new array's metadata: zarr.create_array's keywords completed (the default layout), built
and checked in memory by zarr-python before any I/O (a refusal names the keyword at fault). It is
stored by the write policy's one create (write/intent.py: again after a transient failure,
one error when another writer was first)."""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr
from zarr.storage import MemoryStore

from ..codec.metadata import default_compressors
from ..compat import with_rectilinear_grids
from ..core.extents import zarrs_form
from ..core.geometry import ShardGeometry
from ..core.planner import plan_shards
from ..errors import InvalidTypeError, InvalidValueError, ShardwiseError


def _create_kwargs(
    shape: tuple[int, ...], dtype: Any, chunks: Any, shards: Any, kwargs: dict[str, Any]
) -> dict[str, Any]:
    return _planned_kwargs(shape, dtype, chunks, shards, kwargs)[0]


def _planned_kwargs(
    shape: tuple[int, ...], dtype: Any, chunks: Any, shards: Any, kwargs: dict[str, Any]
) -> tuple[dict[str, Any], ShardGeometry | None]:
    """The keywords of ``zarr.create_array``, and the planner's geometry where it chose the
    layout (None for zarr's own forms)."""
    g = planned_layout(shape, dtype, chunks, shards, kwargs.get("dimension_names"))
    if g is not None:
        chunks, shards = g.chunks, g.shards
    elif _zarrs_form(shards):  # its inner chunks completed where "auto"
        chunks, shards = _layout(shape, dtype, chunks, shards)
    out = dict(shape=shape, dtype=dtype, chunks=chunks, shards=shards, zarr_format=3)
    # None means "no codecs" for compressors/filters (as in zarr), "default" for the rest
    keep_none = ("compressors", "filters")
    out.update({k: v for k, v in kwargs.items() if v is not None or k in keep_none})
    return out, g


def _probe(
    shape: tuple[int, ...], dtype: Any, chunks: Any, shards: Any, given: dict[str, Any]
) -> tuple[dict[str, Any], Any]:
    """The keywords of ``zarr.create_array`` and the array they create in memory."""
    kwargs, made, _ = planned_probe(shape, dtype, chunks, shards, given)
    return kwargs, made


def planned_probe(
    shape: tuple[int, ...], dtype: Any, chunks: Any, shards: Any, given: dict[str, Any]
) -> tuple[dict[str, Any], Any, ShardGeometry | None]:
    """:func:`_probe`'s keywords and array, and the planner's geometry of the array where it
    chose the layout (its reasons, what a write's plan prints; planned once)."""
    kwargs, g = _planned_kwargs(shape, dtype, chunks, shards, given)
    return kwargs, create_in_memory(kwargs), g


# what a keyword of zarr.create_array falls back to when it is left out
_ZARR_DEFAULTS: dict[str, Any] = {"filters": "auto", "serializer": "auto"}
# the keywords a refusal may be blamed on; the layout (shape, chunks, shards) keeps zarr's words
_BLAMED = (
    "fill_value",
    "compressors",
    "filters",
    "serializer",
    "dimension_names",
    "attributes",
    "chunk_key_encoding",
)


@with_rectilinear_grids
def create_in_memory(kwargs: dict[str, Any]) -> Any:
    """``zarr.create_array(MemoryStore(), **kwargs)``: the metadata built and checked without a
    byte written anywhere. What zarr refuses becomes an :class:`InvalidTypeError` /
    :class:`InvalidValueError` naming the keyword at fault, found by building again without
    each one (only on the error path); ``dtype`` is blamed last, a fill value wrong for the
    dtype being the fill value's fault.

    This is where every new array's metadata is built: a 0-d array (``shape=()``) is made
    without the sharding codec (``kwargs["shards"]`` set to None, in place, so the caller
    stores what was checked), one plain chunk of shape ``()`` that every Zarr reader takes;
    shardwise reads, writes and verifies it as a shard whose object is its one chunk."""
    if tuple(kwargs.get("shape", (0,))) == () and kwargs.get("shards") is not None:
        kwargs["shards"] = None
    try:
        return zarr.create_array(MemoryStore(), **kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ShardwiseError):
            raise
        error = e

    def builds(**changed: Any) -> bool:
        try:
            zarr.create_array(MemoryStore(), **{**kwargs, **changed})
        except (TypeError, ValueError):
            return False
        return True

    def default(name: str) -> Any:
        return default_compressors() if name == "compressors" else _ZARR_DEFAULTS.get(name)

    culprit = next((n for n in _BLAMED if n in kwargs and builds(**{n: default(n)})), None)
    if culprit is None and builds(dtype=np.float64, fill_value=None):
        culprit = "dtype"
    if culprit is None:  # the layout, or a combination: zarr's own words
        raise error
    kind = InvalidTypeError if isinstance(error, TypeError) else InvalidValueError
    raise kind(
        f"{culprit}={kwargs[culprit]!r} is not accepted (as zarr.create_array takes it): {error}"
    ) from None


def _layout(
    shape: tuple[int, ...], dtype: Any, chunks: Any, shards: Any, dims: Any = None
) -> tuple[Any, Any]:
    """Inner chunks and shards for a new array: a missing shard shape or ``chunks="auto"`` is
    completed by the same rule as :func:`shardwise.to_zarr` (inner chunks always divide the
    shards); anything else goes to zarr as given."""
    if _zarrs_form(shards):  # zarr's {"shape": ..., "index_location": ...}
        shape_of = shards.get("shape")
        if shape_of is None or chunks not in ("auto", None):
            return chunks, shards
        inner, _ = _layout(shape, dtype, chunks, tuple(shape_of))
        return inner, shards
    g = planned_layout(shape, dtype, chunks, shards, dims)
    return (chunks, shards) if g is None else (g.chunks, g.shards)


def planned_layout(
    shape: tuple[int, ...], dtype: Any, chunks: Any, shards: Any, dims: Any = None
) -> ShardGeometry | None:
    """The shards and inner chunks the planner gives a new array, with its reasons; None where
    the keywords are zarr's own forms, which go to zarr as given."""
    if _zarrs_form(shards):
        return None
    given_chunks = _shape_or_none(chunks, len(shape))
    given_shards = _shape_or_none(shards, len(shape))
    for name, value, given in (("chunks", chunks, given_chunks), ("shards", shards, given_shards)):
        if given is not None and len(given) != len(shape):
            # zarr would speak of the chunk grid, whichever keyword has the wrong length
            raise InvalidValueError(
                f"{name}={value!r} has {len(given)} size(s), but the array has {len(shape)} "
                f"dimension(s) {shape}: give one size per dimension"
            )
        if given is not None and min(given, default=1) < 1:
            raise InvalidValueError(f"{name}={value!r}: sizes must be positive integers")
    if (chunks not in ("auto", None) and given_chunks is None) or (
        shards is not None and given_shards is None and not isinstance(shards, str | dict)
    ):
        return None  # other forms: zarr validates them
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # a zarr data type object: its numpy form
        itemsize = getattr(dtype, "to_native_dtype", lambda: np.dtype("V8"))().itemsize
    target = shards if given_shards is None else given_shards  # a shape, or "2GB", "XY", ...
    if not (isinstance(dims, list | tuple) and len(dims) == len(shape)):
        dims = None  # not names of these dimensions: zarr's check names the keyword
    # default_layout's rule, with its reasons
    return plan_shards(shape, f"V{max(1, itemsize)}", target=target, chunks=given_chunks, dims=dims)


def _zarrs_form(shards: Any) -> bool:
    """zarr's own dict of ``shards=`` (sizes by dimension name are the planner's)."""
    return zarrs_form(shards)


def _shape_or_none(value: Any, ndim: int) -> tuple[int, ...] | None:
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        return (int(value),) * ndim
    if isinstance(value, tuple | list) and all(
        isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value
    ):
        return tuple(int(v) for v in value)
    return None
