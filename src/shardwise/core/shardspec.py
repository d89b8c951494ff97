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
from .extents import grid_of, has_extents, is_extents, parse_extents, split_extents
from .layout import ceildiv
from .planner import default_layout, plan_shards
from .sizing import DEFAULT_SHARD_BYTES, default_shards, divisors, shrink_to_fit, whole_chunks
from .targets import parse_target

__all__ = [
    "ShardSpec",
    "by_source_chunks",
    "check_chunks",
    "check_names",
    "check_shards",
    "dask_layout",
    "extents_layout",
    "parse_shards",
    "shards_for",
    "wants_dask",
]

ShardSpec = tuple[int, ...] | dict[str, int] | str | None
DASK = "dask"  # shards=: one shard per dask chunk (along every axis, or the axes so named)
ACCEPTED = (
    "a shape of positive sizes (256, 256), sizes per dimension name ({'time': 365}), shard "
    "extents for an axis ({'time': [31, 28, 31]}), a byte size ('2GB') or axis names ('XY', "
    "'one per time step')"
)


def parse_shards(text: str) -> Any:
    """Command-line text: ``256,256,64`` (or ``256x256x64``) a shape, ``time=365,lat=90`` sizes
    per dimension name, else a planner target (``2GB``, ``XY``, ``"one per time step"``). A
    size may be shard extents ``31/28/31`` (a rectilinear axis). Only the syntax is checked
    here; :func:`check_shards` checks the sizes.

    >>> parse_shards("time=365, lat=90")
    {'time': 365, 'lat': 90}
    >>> parse_shards("time=31/28/31"), parse_shards("60/40,50")
    ({'time': (31, 28, 31)}, ((60, 40), 50))
    >>> parse_shards("16x20"), parse_shards("2GB"), parse_shards("XYZ"), parse_shards("time=dask")
    ((16, 20), '2GB', 'XYZ', {'time': 'dask'})
    """
    if text.strip() == DASK:  # one shard per dask chunk
        return DASK
    parts = [p.strip() for p in text.replace("x", ",").split(",")] if "=" not in text else None
    try:
        if parts is not None:
            if not all(parts):
                raise ValueError(text)
            shape: tuple[Any, ...] = tuple(parse_extents(p) or int(p) for p in parts)
            return shape
        out: dict[str, Any] = {}
        for part in text.split(","):
            name, sep, size = (s.strip() for s in part.partition("="))
            if not (sep and name) or name in out:
                raise ValueError(part)
            out[name] = DASK if size == DASK else parse_extents(size) or int(size)
        return out
    except ValueError:
        if "=" not in text:
            with contextlib.suppress(InvalidValueError):
                return parse_target(text).text  # a target
        raise InvalidValueError(
            f"shards must be sizes like 256,256,64, name=size pairs like time=365,lat=90 (shard "
            f"extents like time=31/28/31), a byte size like 2GB or axis names like XY, got {text!r}"
        ) from None


def _size(value: object) -> Any:
    if is_extents(value):  # shard extents (checked against the axis when resolved)
        sizes = [_size(v) for v in value]  # type: ignore[attr-defined]
        ok = sizes and all(isinstance(v, int) for v in sizes)
        return tuple(sizes) if ok else None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 1:
        return int(value)
    return None


def check_shards(value: object) -> ShardSpec:
    """``shards=`` as a caller gave it, checked: None, a sequence of sizes or a mapping of
    dimension names to sizes, every size an integer >= 1 or a list of them (shard extents)."""
    if value is None:
        return None
    if isinstance(value, str):  # a planner target: "2GB", "XY", "one per time step"
        return DASK if value == DASK else parse_target(value).text
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise InvalidTypeError(f"shards must be {ACCEPTED}: names are strings, got {value!r}")
        sizes = {k: DASK if v == DASK else _size(v) for k, v in value.items()}
        if any(v is None for v in sizes.values()):
            raise InvalidValueError(f"shards must be {ACCEPTED}, got {dict(value)!r}")
        return {k: v for k, v in sizes.items() if v is not None}  # type: ignore[misc]
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidTypeError(f"shards must be {ACCEPTED}, got {value!r}")
    shape = [_size(v) for v in value]
    if not shape or any(v is None for v in shape):
        raise InvalidValueError(f"shards must be {ACCEPTED}, got {value!r}")
    return tuple(v for v in shape if v is not None)


def check_chunks(value: object) -> tuple[int, ...] | dict[str, int] | None:
    """``chunks=`` of ``convert`` (and ``reshard``): None, a shape or sizes per dimension name,
    in the grammar of ``shards=`` without its planner targets.

    >>> check_chunks({"time": 10}), check_chunks([4, 4])
    ({'time': 10}, (4, 4))
    """
    accepted = "a shape of positive sizes (64, 64) or sizes per dimension name ({'time': 10})"
    if isinstance(value, str):
        raise InvalidTypeError(f"chunks must be {accepted}, got {value!r}")
    try:
        spec = check_shards(value)
    except (InvalidTypeError, InvalidValueError) as e:
        raise type(e)(f"chunks must be {accepted}, got {value!r}") from None
    assert not isinstance(spec, str)
    if has_extents(spec):
        raise InvalidValueError(
            f"chunks must be {accepted} (extents are for shards), got {value!r}"
        )
    return spec


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
        return default_layout(shape, itemsize, chunks, spec, target, dims)[1]
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


def wants_dask(spec: object) -> bool:
    """True when ``shards=`` asks for one shard per dask chunk (``"dask"``, or ``"dask"`` for a
    dimension name)."""
    if isinstance(spec, str):
        return spec == DASK
    return isinstance(spec, Mapping) and any(v == DASK for v in spec.values())


def dask_layout(
    spec: Any,
    shape: tuple[int, ...],
    source: Sequence[Sequence[int]] | None,
    itemsize: int,
    chunks: tuple[int, ...] | None,
    dims: Sequence[str | None] | None,
    shard_bytes: int | None = None,
) -> tuple[tuple[int, ...], list[Any]]:
    """(inner chunks, shards as zarr takes them) for one shard per dask chunk of ``source``
    along the axes ``spec`` names (``"dask"``: all): where the chunks along an axis are uniform
    (all equal, the last possibly shorter) the axis stays regular, else its shards are the
    chunks (a rectilinear grid). Inner chunks divide every shard extent: the planner's, cut to
    a divisor; given ones that do not are refused with the sizes that would.

    >>> dask_layout("dask", (90, 8), ((31, 28, 31), (4, 4)), 4, None, None)
    ((1, 4), [[31, 28, 31], [4, 4]])
    >>> dask_layout({"t": "dask"}, (25, 8), ((10, 10, 5), (8,)), 4, None, ("t", "x"))
    ((10, 8), [10, 8])
    """
    nd = len(shape)
    names = list(dims or ())
    if isinstance(spec, str):
        axes, rest = set(range(nd)), {}
    else:
        check_names({k: 1 for k in spec}, [("the data", names or None)], "the data")
        axes = {i for i, n in enumerate(names) if n is not None and spec.get(n) == DASK}
        rest = {k: v for k, v in spec.items() if v != DASK}
    if source is None:
        raise InvalidValueError(
            f"shards={spec!r} makes a shard of each dask chunk, but the data has no dask "
            "chunks: chunk it (dask.array, .chunk()) or give shard sizes"
        )
    uniform: dict[int, int] = {}
    edges: dict[int | str, Sequence[int]] = {}
    for i in axes:
        sizes = tuple(int(s) for s in source[i]) or (1,)
        head = sizes[0]
        if all(s == head for s in sizes[:-1]) and sizes[-1] <= head:
            uniform[i] = max(1, head)
        else:
            edges[i] = sizes
    nominal = {i: uniform[i] if i in uniform else max(edges[i]) for i in axes}
    if isinstance(spec, str):
        target: Any = tuple(nominal[i] for i in range(nd))
    else:
        target = {**rest, **{names[i]: n for i, n in nominal.items()}}
    g = plan_shards(
        shape,
        f"V{max(1, itemsize)}",
        target=target,
        chunks=chunks,
        dims=dims,
        shard_bytes=shard_bytes,
        rectilinear=edges or None,
    )
    inner = list(g.chunks)
    for i, s in uniform.items():
        if chunks is not None and s % inner[i]:
            raise InvalidValueError(
                f"inner chunks of {inner[i]} along axis {i} do not divide the dask chunks of "
                f"{s} that become its shards: sizes that would: {divisors(s)}"
            )
        inner[i] = max(d for d in divisors(s) if d <= inner[i])
    regular = [uniform.get(i, g.shards[i]) for i in range(nd)]
    if not edges:
        return tuple(inner), regular
    return tuple(inner), grid_of({int(i): e for i, e in edges.items()}, regular, shape)


def extents_layout(
    spec: Any,
    shape: tuple[int, ...],
    itemsize: int,
    chunks: tuple[int, ...] | None,
    dims: Sequence[str | None] | None,
    shard_bytes: int | None = None,
) -> tuple[tuple[int, ...], list[Any]]:
    """(inner chunks, shards as zarr takes them) of ``write_array``'s ``shards=`` with extents
    (:mod:`shardwise.core.extents`): the planner's layout of the largest shards, its inner
    chunks dividing every extent; names checked as :func:`check_names` checks them.

    >>> extents_layout({"t": [31, 28, 31]}, (90, 8), 4, None, ("t", "x"))
    ((1, 8), [[31, 28, 31], [8]])
    >>> extents_layout([[60, 40], 20], (100, 20), 4, (10, 10), None)
    ((10, 10), [[60, 40], [20]])
    """
    names = None if dims is None else tuple(dims)
    check_names(spec, [("the array", names)], "the array")
    nominal, edges = split_extents(spec, shape, names)
    g = plan_shards(
        shape,
        f"V{max(1, itemsize)}",
        target=nominal,
        chunks=chunks,
        dims=names,
        shard_bytes=shard_bytes,
        rectilinear=dict(edges.items()),
    )
    return tuple(g.chunks), grid_of(edges, g.shards, shape)


def by_source_chunks(
    spec: ShardSpec, chunks: Sequence[int], dims: Sequence[str | None] | None
) -> ShardSpec:
    """``spec`` with ``"dask"`` read as the source's own (regular) chunks: a zarr array's dask
    chunks are its chunks, so its shards are those (``convert``).

    >>> by_source_chunks("dask", (10, 20), None)
    (10, 20)
    >>> by_source_chunks({"t": "dask"}, (5, 8), ("t", "x"))
    {'t': 5}
    """
    if not wants_dask(spec):
        return spec
    if isinstance(spec, str):
        return tuple(int(c) for c in chunks)
    assert isinstance(spec, Mapping)
    names = list(dims or ())
    given: Mapping[str, Any] = spec
    return {
        k: int(chunks[names.index(k)]) if v == DASK and k in names else v for k, v in given.items()
    }
