"""``shards=`` given as a shape, as sizes per dimension name or as a planner target (a byte size
``"2GB"``, axis names ``"XY"``, ``"one per time step"``: :mod:`shardwise.core.planner`): parsed
(command-line text), checked, and resolved to one array's shard shape.

A setting is applied or refused, never dropped: sizes must be positive integers, a shape must have
the array's number of dimensions, a name must be a dimension of the data, and sizes by name need
arrays with dimension names. Sizes that are not whole inner chunks are rounded up to whole chunks
(:func:`~shardwise.core.sizing.whole_chunks`, the rule ``write_array`` and ``to_zarr`` apply too).
Pure: no store, dask or zarr.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import InvalidTypeError, InvalidValueError
from .layout import ceildiv
from .planner import plan_shards
from .sizing import DEFAULT_SHARD_BYTES, default_shards, shrink_to_fit, whole_chunks
from .targets import parse_target

__all__ = ["ShardSpec", "check_names", "check_shards", "parse_shards", "shards_for"]

ShardSpec = tuple[int, ...] | dict[str, int] | str | None
ACCEPTED = (
    "a shape of positive sizes (256, 256), sizes per dimension name ({'time': 365}), a byte "
    "size ('2GB') or axis names ('XY', 'one per time step')"
)


def parse_shards(text: str) -> tuple[int, ...] | dict[str, int] | str:
    """Command-line text: ``256,256,64`` (or ``256x256x64``) a shape, ``time=365,lat=90`` sizes
    per dimension name, else a planner target (``2GB``, ``XY``, ``"one per time step"``). Only
    the syntax is checked here; :func:`check_shards` checks the sizes.

    >>> parse_shards("time=365, lat=90")
    {'time': 365, 'lat': 90}
    >>> parse_shards("16x20"), parse_shards("2GB"), parse_shards("XYZ")
    ((16, 20), '2GB', 'XYZ')
    """
    parts = [p.strip() for p in text.replace("x", ",").split(",")] if "=" not in text else None
    try:
        if parts is not None:
            if not all(parts):
                raise ValueError(text)
            return tuple(int(p) for p in parts)
        out: dict[str, int] = {}
        for part in text.split(","):
            name, sep, size = (s.strip() for s in part.partition("="))
            if not (sep and name) or name in out:
                raise ValueError(part)
            out[name] = int(size)
        return out
    except ValueError:
        if "=" not in text:
            with contextlib.suppress(InvalidValueError):
                return parse_target(text).text  # a target
        raise InvalidValueError(
            f"shards must be sizes like 256,256,64, name=size pairs like time=365,lat=90, a "
            f"byte size like 2GB or axis names like XY, got {text!r}"
        ) from None


def _size(value: object) -> int | None:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 1:
        return int(value)
    return None


def check_shards(value: object) -> ShardSpec:
    """``shards=`` as a caller gave it, checked: None, a sequence of sizes or a mapping of
    dimension names to sizes, every size an integer >= 1."""
    if value is None:
        return None
    if isinstance(value, str):  # a planner target: "2GB", "XY", "one per time step"
        return parse_target(value).text
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise InvalidTypeError(f"shards must be {ACCEPTED}: names are strings, got {value!r}")
        sizes = {k: _size(v) for k, v in value.items()}
        if any(v is None for v in sizes.values()):
            raise InvalidValueError(f"shards must be {ACCEPTED}, got {dict(value)!r}")
        return {k: v for k, v in sizes.items() if v is not None}
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidTypeError(f"shards must be {ACCEPTED}, got {value!r}")
    shape = [_size(v) for v in value]
    if not shape or any(v is None for v in shape):
        raise InvalidValueError(f"shards must be {ACCEPTED}, got {value!r}")
    return tuple(v for v in shape if v is not None)


def check_names(
    spec: ShardSpec, arrays: Sequence[tuple[str, Sequence[str | None] | None]], where: str
) -> None:
    """Refuse sizes by name that no array of ``arrays`` (``(name, dimension names)``) has, and
    arrays of one or more dimensions without names for them to apply to."""
    if not isinstance(spec, Mapping):
        return
    known = {d for _, dims in arrays for d in dims or () if d is not None}
    if not known and arrays:
        raise InvalidValueError(
            f"shards={spec} names dimensions, but {where} has no dimension names: give a "
            "shape of sizes instead (e.g. shards=(256, 256))"
        )
    unknown = sorted(set(spec) - known)
    if unknown:
        raise InvalidValueError(
            f"shards names dimension(s) {unknown} that {where} does not have (dimensions: "
            f"{sorted(known)}): sizes by name apply to the dimensions of the data"
        )


def shards_for(
    spec: ShardSpec,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    itemsize: int,
    dims: Sequence[str | None] | None,
    shard_bytes: int | None,
    *,
    name: str,
) -> tuple[int, ...]:
    """The shard shape of array ``name``: from ``spec`` rounded up to whole ``chunks``, else of
    about ``shard_bytes`` (default 64 MiB). With sizes by name, the dimensions not named get as
    many chunks as fit ``shard_bytes``.

    >>> shards_for({"t": 25}, (100, 40), (10, 10), 4, ("t", "x"), None, name="a")
    (30, 40)
    >>> shards_for((25, 40), (100, 40), (10, 10), 4, None, None, name="a")
    (30, 40)
    """
    target = shard_bytes or DEFAULT_SHARD_BYTES
    if isinstance(spec, str):  # the planner's, around the inner chunks
        return plan_shards(
            shape, f"V{max(1, itemsize)}", target=spec, chunks=chunks, dims=dims, shard_bytes=target
        ).shards
    if spec is None:
        return default_shards(shape, chunks, itemsize, target)
    if not isinstance(spec, Mapping):
        if len(spec) != len(shape):
            raise InvalidValueError(
                f"array {name!r} has {len(shape)} dimension(s) {shape}, but shards {spec} has "
                f"{len(spec)}: give a shape per array (path=), or sizes per dimension name"
            )
        return whole_chunks(tuple(spec), chunks)
    if shape and not any(dims or ()):
        raise InvalidValueError(
            f"array {name!r} has no dimension names, so shards={spec} cannot apply to it: "
            f"give a shape of {len(shape)} sizes instead"
        )
    names = list(dims or ())
    fixed = {i: spec[n] for i, n in enumerate(names) if n is not None and n in spec}
    named = whole_chunks(tuple(fixed.get(i, c) for i, c in enumerate(chunks)), chunks)
    k = [
        named[i] // c if i in fixed else ceildiv(max(1, n), c)
        for i, (n, c) in enumerate(zip(shape, chunks, strict=True))
    ]
    free = [i for i in range(len(shape)) if i not in fixed]
    # halve the free dimension with most chunks until the shard fits the byte target
    k = shrink_to_fit(k, math.prod(chunks) * itemsize, target, axes=free)
    return tuple(c * n for c, n in zip(chunks, k, strict=True))


def target_shape(shards: Any, shape: Sequence[int], dtype: Any, chunks: Any) -> Any:
    """``shards=`` of a verb that takes a shape: a planner target (``"2GB"``, ``"XY"``)
    resolved around ``chunks`` to a shape, anything else as given (for the verb to check)."""
    if not isinstance(shards, str):
        return shards
    return plan_shards(shape, dtype, target=shards, chunks=chunks).shards
