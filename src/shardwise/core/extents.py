"""Shard extents given explicitly: an axis of ``shards=`` as a list of shard lengths (a
rectilinear grid, zarr's ``rectilinear`` chunk grid with regular inner chunks), by position
(``[[31, 28, 31], 181, 360]``) or by dimension name (``{"time": [31, 28, 31]}``); on the
command line ``time=31/28/31`` or ``31/28/31,181,360``.

The extents along an axis are positive integers summing to its length (else refused, naming
the axis, the sum and the length); inner chunks divide every extent: given ones that do not are
refused with the sizes that would, else the planner's are cut to a divisor (the rule of
``shards="dask"``, :func:`~shardwise.core.planner.plan_shards`' ``rectilinear=``). Pure.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidValueError
from .planner import rectilinear_fit

__all__ = [
    "fit_extents",
    "has_extents",
    "is_extents",
    "parse_extents",
    "zarrs_form",
]

MAX_LISTED = 100_000  # shards along a regular axis a rectilinear grid lists one by one


def is_extents(value: object) -> bool:
    """True for one axis given as shard extents: a list or tuple of sizes."""
    return isinstance(value, list | tuple)


def zarrs_form(spec: object) -> bool:
    """True for zarr's own dict of ``shards=`` (``{"shape": ..., "index_location": ...}``),
    which is no sizes by dimension name.

    >>> zarrs_form({"shape": (4,), "index_location": "start"}), zarrs_form({"time": 30})
    (True, False)
    """
    return isinstance(spec, Mapping) and bool(spec) and {"shape", "index_location"} >= set(spec)


def has_extents(spec: object) -> bool:
    """True when ``shards=`` gives some axis as a list of extents (zarr's own dict form,
    whose ``shape`` is a list, does not).

    >>> has_extents({"time": [31, 28]}), has_extents([[60, 40], 50]), has_extents((60, 50))
    (True, True, False)
    >>> has_extents({"shape": [4, 4], "index_location": "start"})
    False
    """
    if zarrs_form(spec):
        return False
    if isinstance(spec, Mapping):
        return any(is_extents(v) for v in spec.values())
    if isinstance(spec, list | tuple):
        return any(is_extents(v) for v in spec)
    return False


def parse_extents(text: str) -> tuple[int, ...] | None:
    """Command-line extents ``31/28/31`` (None for text without ``/``); ValueError when a
    part is not an integer.

    >>> parse_extents("31/28/31"), parse_extents("365")
    ((31, 28, 31), None)
    """
    if "/" not in text:
        return None
    parts = [p.strip() for p in text.split("/")]
    if not all(parts):
        raise ValueError(text)
    return tuple(int(p) for p in parts)


def check_extents(value: Sequence[Any], where: str) -> tuple[int, ...]:
    """One axis' extents, every one an integer >= 1."""
    out = []
    for v in value:
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or int(v) < 1:
            raise InvalidValueError(
                f"shard extents {where} must be positive integers, got {list(value)!r}"
            )
        out.append(int(v))
    if not out:
        raise InvalidValueError(f"shard extents {where} must list at least one shard")
    return tuple(out)


def split_extents(
    spec: Any, shape: Sequence[int], dims: Sequence[str | None] | None, name: str = "the array"
) -> tuple[Any, dict[int, tuple[int, ...]]]:
    """``spec`` with each list of extents replaced by its largest extent (a regular spec, the
    shard a task holds), and the extents by axis, checked against ``shape``.

    >>> split_extents({"t": [3, 2]}, (5, 4), ("t", "x"))
    ({'t': 3}, {0: (3, 2)})
    """
    names = list(dims or ())
    if isinstance(spec, Mapping):
        at = {k: names.index(k) for k in spec if k in names and is_extents(spec[k])}
        keys: list[Any] = list(at)
    else:
        if len(spec) != len(shape):
            raise InvalidValueError(
                f"{name} has {len(shape)} dimension(s) {tuple(shape)}, but shards {list(spec)} "
                f"has {len(spec)}: give one entry per dimension"
            )
        at = {i: i for i, v in enumerate(spec) if is_extents(v)}
        keys = list(at)
    edges: dict[int, tuple[int, ...]] = {}
    for k in keys:
        i = at[k]
        label = f"along axis {i}" + (f" ({names[i]!r})" if i < len(names) and names[i] else "")
        ext = check_extents(spec[k], label)
        if sum(ext) != shape[i]:
            raise InvalidValueError(
                f"shard extents {label} of {name} sum to {sum(ext)}, not its length {shape[i]}: "
                "the extents must tile the axis"
            )
        edges[i] = ext
    if isinstance(spec, Mapping):
        return {k: max(v) if is_extents(v) else v for k, v in spec.items()}, edges
    return tuple(max(v) if is_extents(v) else v for v in spec), edges


def fit_extents(
    edges: Mapping[int, Sequence[int]],
    shape: Sequence[int],
    chunks: Sequence[int],
    given: bool,
    dims: Sequence[str | None] | None,
) -> tuple[int, ...]:
    """Inner chunks dividing every extent: ``given`` ones checked (refused with the sizes that
    would), else each cut to the largest divisor no larger.

    >>> fit_extents({0: (31, 28, 31)}, (90, 8), (10, 8), False, None)
    (1, 8)
    """
    _, inner = rectilinear_fit(
        dict(edges), tuple(shape), tuple(chunks), given, None if dims is None else tuple(dims)
    )
    return inner


def grid_of(
    edges: Mapping[int, Sequence[int]], shards: Sequence[int], shape: Sequence[int]
) -> list[Any]:
    """``shards=`` as zarr takes it: the extents where given, the regular sizes elsewhere
    (listed where they tile the axis exactly: icechunk 2.3 reads only grids listed whole)."""
    out: list[Any] = []
    for i, s in enumerate(shards):
        if i in edges:
            out.append(list(edges[i]))
        elif shape[i] % s == 0 and 0 < shape[i] // s <= MAX_LISTED:
            out.append([int(s)] * (shape[i] // s))
        else:
            out.append(int(s))
    return out
