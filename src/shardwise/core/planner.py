"""plan_shards: the shard and inner-chunk shapes of an array, chosen from what the caller gives
and explained (:class:`~shardwise.core.geometry.ShardGeometry`). Every default layout of
shardwise comes from here (:func:`default_layout`), and every ``shards=`` accepts its targets:

- ``None`` / ``"auto"``: inner chunks of about 1 MiB, balanced (the largest dimension halved),
  in shards of whole chunks up to 64 MiB (the whole array halved along the dimension with most
  chunks);
- a byte size (``"2GB"``, ``"512MiB"``): the largest shard of whole chunks under it, the
  innermost axes filled first (a plane or volume whole, then as many steps of the axes before
  it as fit), so a shard is one contiguous block of the array;
- axis names (``"XY"``, ``"ZYX"``, any order and case; letters of t, c, z, y, x, matched to
  dimension names, else to the last axes) or ``"one per time step"``: whole along the axes named
  (rounded up to whole chunks), one inner chunk along the others (or the reverse);
- a shape (rounded up to whole chunks) or sizes per dimension name (the others whole).

Inner chunks when only shards are given are compact: one step along the leading axes and whole
planes of the last two axes up to about 4 MiB (a larger plane split evenly, its longest side
first), then as many steps of the leading axes as fit. A map then decodes its own chunks only,
and a full load decodes few chunks of a few MiB rather than thousands of strips. Axes in
``write_axes`` (those separate processes write) are never grown: a shard spans one chunk there.

>>> g = plan_shards((100, 6, 86, 1664, 1193), "uint16", target="2GB",
...                 chunks=(1, 1, 16, 256, 256), write_axes=[1])
>>> g.shards
(4, 1, 96, 1792, 1280)
>>> plan_shards((365, 181, 360), "float32", target={"time": 30},
...             dims=("time", "lat", "lon")).chunks
(15, 181, 360)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidValueError
from .geometry import DIRECT_FACTOR, LevelGeometry, ShardGeometry, human
from .layout import ceildiv
from .pyramid import default_axes, level_layout, pyramid_levels, spatial
from .sizing import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_SHARD_BYTES,
    compact_chunks,
    contiguous_shards,
    default_chunks,
    default_shards,
    divisors,
    shrink_to_fit,
    whole_chunks,
)
from .targets import Target, axis_of, parse_target, positive

__all__ = [
    "COMPACT_CHUNK_BYTES",
    "Target",
    "compact_chunks",
    "default_layout",
    "parse_target",
    "plan_shards",
]


def plan_shards(
    shape: Sequence[int],
    dtype: Any,
    *,
    target: Any = None,
    chunks: Sequence[int] | None = None,
    write_axes: Sequence[int | str] = (),
    memory_per_task: int | str | None = None,
    levels: int = 1,
    rectilinear: Mapping[int | str, Sequence[int]] | Sequence[Sequence[int] | None] | None = None,
    dims: Sequence[str | None] | None = None,
    shard_bytes: int | str | None = None,
) -> ShardGeometry:
    """The shards and inner chunks of an array of ``shape`` and ``dtype``, and why.

    Parameters
    ----------
    shape : sequence of int
        The array's shape.
    dtype : numpy.dtype or str
        The array's data type.
    target : str, tuple, dict or None
        What ``shards=`` takes: None or ``"auto"`` (the default rule), a byte size (``"2GB"``),
        axis names (``"XY"``, ``"ZYX"``, ``"one per time step"``), a shape (rounded up to whole
        chunks) or sizes per dimension name.
    chunks : tuple of int, optional
        The inner chunks (default: chosen, see the module's rules).
    write_axes : sequence of int or str
        Axes (indices, dimension names or letters) that separate processes write: never grown,
        a shard spans one inner chunk along each.
    memory_per_task : int or str, optional
        Bytes one write task may hold (an int or ``"1GiB"``): caps byte targets and the default
        at a third of it (a direct task holds about three shards).
    levels : int, default 1
        Levels of a pyramid (halving the space axes): the report lists each level's shards.
    rectilinear : dict or sequence, optional
        Shard extents along some axes (a mapping of axis to extents, or one entry per axis,
        None for regular ones): inner chunks then divide every extent.
    dims : sequence of str, optional
        Dimension names (for sizes by name, axis letters and the report).
    shard_bytes : int or str, optional
        The default rule's shard size (default 64 MiB).

    Returns
    -------
    ShardGeometry
        ``.shards``, ``.chunks`` and ``print(...)`` for the report.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A target, size or axis that is not accepted (the message says what is), a shape of
        another number of dimensions, shards that would grow a write axis, or inner chunks that
        do not divide rectilinear shards (the message lists the sizes that would).

    Examples
    --------
    >>> import shardwise
    >>> g = shardwise.plan_shards((100_000, 512, 512), "uint16", chunks=(1, 256, 256))
    >>> g.shards[1:], g.chunks
    ((512, 512), (1, 256, 256))
    """
    from .args import byte_size

    itemsize = max(1, np.dtype(dtype).itemsize)
    shape = tuple(int(n) for n in shape)
    names = tuple(dims) if dims is not None else None
    if names is not None and len(names) != len(shape):
        raise InvalidValueError(f"dims {names} must name the {len(shape)} dimension(s) of {shape}")
    budget = (
        byte_size("shard_bytes", shard_bytes) if shard_bytes is not None else DEFAULT_SHARD_BYTES
    )
    memory = None if memory_per_task is None else byte_size("memory_per_task", memory_per_task)
    if memory is not None:
        budget = min(budget, max(1, memory // DIRECT_FACTOR))
    keep = tuple(sorted({_axis(w, len(shape), names) for w in write_axes}))
    given = _chunks_arg(chunks, len(shape))
    t = parse_target(target)
    shards, inner, why_s, why_c = _choose(t, shape, itemsize, given, keep, names, budget, memory)
    _check_keep(shards, inner, keep, names)
    edges, inner = rectilinear_fit(rectilinear, shape, inner, given is not None, names)
    return ShardGeometry(
        shape,
        itemsize,
        shards if edges is None else _nominal(shards, edges),
        inner,
        dims=names,
        shards_reason=why_s,
        chunks_reason=why_c,
        write_axes=keep,
        memory_per_task=memory,
        levels=_levels(levels, shape, inner, shards, names),
        shard_edges=edges,
    )


def default_layout(
    shape: tuple[int, ...],
    itemsize: int,
    chunks: tuple[int, ...] | None = None,
    shards: Any = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    dims: Sequence[str | None] | None = None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(inner chunks, shards)`` completed from what is given, by :func:`plan_shards`: the one
    default rule of ``write_array``, ``to_zarr``, ``write_pyramid`` and ``batch.init``.
    ``shards`` is any target ``shards=`` takes; :func:`plan_shards` gives the reasons too.

    >>> default_layout((2920, 361, 720), 4)
    ((46, 46, 90), (184, 184, 360))
    >>> default_layout((1000, 1000), 4, shards=(300, 300))
    ((300, 300), (300, 300))
    >>> default_layout((1000, 1000), 4, chunks=(32, 32), shards=(100, 64))
    ((32, 32), (128, 64))
    """
    g = plan_shards(
        shape,
        f"V{max(1, itemsize)}",
        target=shards,
        chunks=chunks,
        dims=dims,
        shard_bytes=shard_bytes,
    )
    return g.chunks, g.shards


def _chunks_arg(chunks: Sequence[int] | None, ndim: int) -> tuple[int, ...] | None:
    if chunks is None:
        return None
    out = tuple(positive(c, chunks) for c in chunks)
    if len(out) != ndim:
        raise InvalidValueError(f"chunks {out} must have one size per dimension ({ndim})")
    return out


def _axis(w: int | str, ndim: int, dims: Sequence[str | None] | None) -> int:
    if isinstance(w, str):
        return axis_of(w, ndim, dims)
    if isinstance(w, int | np.integer) and not isinstance(w, bool) and -ndim <= w < ndim:
        return int(w) % ndim
    raise InvalidValueError(f"write_axes must be axes of the {ndim}-d array, got {w!r}")


BALANCED = "about 1 MiB, balanced (the largest dimension halved until under it): no read favoured"
# compact inner chunks are up to this size: plain zarr readers (xr.open_zarr) read one inner
# chunk per dask task, each with its shard index, so compact chunks as large as zarr's own
# default chunks of arrays of 0.1-10 GB (1.5-4 MB) keep their full loads as fast
COMPACT_CHUNK_BYTES = 4 * 2**20
COMPACT = (
    "compact: whole planes of the last two axes up to ~4 MiB, then as many steps of the axes "
    "before as fit (dividing the shards): a map decodes its own chunks, xr.open_zarr loads "
    "about as many chunks as in xarray's own layout (one task and index read each), a time "
    "series decodes every chunk along its axis"
)


def _axes(axes: list[int], dims: tuple[str | None, ...] | None) -> str:
    """Axes by name where they have one, else by number."""
    names = [str(dims[i]) if dims and dims[i] is not None else f"axis {i}" for i in axes]
    return ", ".join(names) if names else "no axis"


def _choose(
    t: Target,
    shape: tuple[int, ...],
    itemsize: int,
    given: tuple[int, ...] | None,
    keep: tuple[int, ...],
    dims: tuple[str | None, ...] | None,
    budget: int,
    memory: int | None,
) -> tuple[tuple[int, ...], tuple[int, ...], str, str]:
    """(shards, chunks, why the shards, why the chunks) for one target."""
    nd = len(shape)
    if not nd:
        return (), (), "a 0-d array is one plain chunk", "a 0-d array is one plain chunk"
    why_c = "as given"
    if t.kind in ("default", "bytes"):
        cap = budget if t.kind == "default" else min(t.nbytes, budget if memory else t.nbytes)
        inner = given or default_chunks(shape, itemsize, min(DEFAULT_CHUNK_BYTES, cap))
        why_c = why_c if given else BALANCED
        if t.kind == "bytes":
            if not given:  # compact, cut evenly: the shards are rounded up to them
                whole = [max(1, n) for n in shape]
                inner = compact_chunks(whole, itemsize, min(COMPACT_CHUNK_BYTES, cap), range(nd))
                why_c = COMPACT
            shards, how = contiguous_shards(shape, inner, itemsize, cap, keep)
            return shards, inner, f"the largest of whole chunks under {t.text}: {how}", why_c
        if keep:
            k = [
                1 if i in keep else ceildiv(max(1, n), c)
                for i, (n, c) in enumerate(zip(shape, inner, strict=True))
            ]
            grown = [i for i in range(nd) if i not in keep]
            fitted = shrink_to_fit(k, math.prod(inner) * itemsize, cap, axes=grown)
            shards = tuple(c * n for c, n in zip(inner, fitted, strict=True))
            why = f"whole chunks up to {human(cap)}, grown along {_axes(grown, dims)} only"
        else:
            shards = default_shards(shape, inner, itemsize, cap)
            why = f"whole chunks up to {human(cap)}: the array halved along its axis of most chunks"
        if all(s >= max(1, n) for s, n in zip(shards, shape, strict=True)):
            why = f"the whole array in one shard: it fits in {human(cap)}"
        return shards, inner, why, why_c
    elems, free, why_s = _extents(t, shape, keep, dims)
    if given is None:
        inner = compact_chunks(elems, itemsize, min(COMPACT_CHUNK_BYTES, budget), free)
        why_c = COMPACT
    else:
        inner = given
    if t.kind == "shape" and given is None:
        return elems, inner, why_s, why_c
    shards = whole_chunks(elems, inner)
    rounded = " (rounded up to whole chunks)" if shards != tuple(elems) else ""
    return shards, inner, why_s + rounded, why_c


def _extents(
    t: Target, shape: tuple[int, ...], keep: tuple[int, ...], dims: tuple[str | None, ...] | None
) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """Shard extents in elements for a shape, sizes by name or axis names, the axes whose
    extents may be rounded up (those not given), and why."""
    nd = len(shape)
    whole = [max(1, n) for n in shape]
    if t.kind == "shape":
        if len(t.shape) != nd:
            raise InvalidValueError(
                f"shards={t.shape} has {len(t.shape)} size(s), but the array has {nd} "
                f"dimension(s) {shape}: give one size per dimension"
            )
        return t.shape, (), "as given"
    if t.kind == "sizes":
        if not dims or not any(dims):
            raise InvalidValueError(
                f"shards={t.text} names dimensions, but the array has none: give a shape"
            )
        fixed = {axis_of(k, nd, dims): n for k, n in t.sizes}
        free = tuple(i for i in range(nd) if i not in fixed)
        elems = tuple(fixed.get(i, whole[i]) for i in range(nd))
        return elems, free, f"{t.text} as given, the other dimensions whole"
    axes = {axis_of(n, nd, dims) for n in t.names}
    spanned = axes if t.kind == "axes" else set(range(nd)) - axes
    if spanned & set(keep):
        raise InvalidValueError(
            f"shards={t.text!r} spans write axis {sorted(spanned & set(keep))}: separate "
            "writers there would share shards"
        )
    elems = tuple(whole[i] if i in spanned else 1 for i in range(nd))
    label = ", ".join(str(dims[i]) if dims and dims[i] else f"axis {i}" for i in sorted(spanned))
    why = f"{t.text!r}: whole along {label or 'no axis'}, one chunk along the others"
    return elems, tuple(sorted(spanned)), why


def _check_keep(
    shards: tuple[int, ...],
    chunks: tuple[int, ...],
    keep: tuple[int, ...],
    dims: tuple[str | None, ...] | None,
) -> None:
    for w in keep:
        if shards[w] > chunks[w]:
            name = dims[w] if dims and dims[w] else f"axis {w}"
            raise InvalidValueError(
                f"shards {shards} span {ceildiv(shards[w], chunks[w])} inner chunks along write "
                f"axis {name!r} (chunks {chunks}): separate writers there would share shards; "
                f"give shards of {chunks[w]} along it"
            )


def rectilinear_fit(
    spec: Any,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    given: bool,
    dims: tuple[str | None, ...] | None,
) -> tuple[tuple[tuple[int, ...] | None, ...] | None, tuple[int, ...]]:
    """Shard extents per axis (None where regular) and inner chunks that divide every extent
    (the given ones checked, else the largest divisor of the extents' common divisor that is
    no larger than the chunk chosen)."""
    if spec is None:
        return None, chunks
    nd = len(shape)
    items = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
    edges: list[tuple[int, ...] | None] = [None] * nd
    for key, ext in items:
        if ext is None:
            continue
        i = _axis(key, nd, dims)
        sizes = tuple(positive(e, ext) for e in ext)
        if sum(sizes) != shape[i]:
            raise InvalidValueError(
                f"rectilinear shards along axis {i} sum to {sum(sizes)}, not its length {shape[i]}"
            )
        edges[i] = sizes
    out = list(chunks)
    for i, extents in enumerate(edges):
        if extents is None:
            continue
        g = math.gcd(*extents)
        if given and g % chunks[i]:
            raise InvalidValueError(
                f"inner chunks of {chunks[i]} along axis {i} do not divide every shard extent "
                f"{sorted(set(extents))}: sizes that would: {divisors(g)}"
            )
        out[i] = chunks[i] if given else max(d for d in divisors(g) if d <= chunks[i])
    return tuple(edges), tuple(out)


def _nominal(shards: tuple[int, ...], edges: tuple[tuple[int, ...] | None, ...]) -> tuple[int, ...]:
    """A rectilinear grid's largest shard (what a task holds)."""
    return tuple(s if e is None else max(e) for s, e in zip(shards, edges, strict=True))


def _levels(
    levels: int,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    shards: tuple[int, ...],
    dims: tuple[str | None, ...] | None,
) -> tuple[LevelGeometry, ...]:
    """Each level of a pyramid halving the space axes (named z, y, x or their aliases; else the
    last two, or three without names), level 0's chunks and shards fitted to it."""
    from .args import positive_int

    n = positive_int("levels", levels)
    if n == 1:
        return ()
    nd = len(shape)
    space: set[int] = set()
    for letter in "zyx":
        with contextlib.suppress(InvalidValueError):
            space.add(axis_of(letter, nd, dims))
    if len(space) < 2:
        if nd < 2:
            raise InvalidValueError("levels > 1 needs an array of two or more dimensions")
        space = (
            set(range(nd - 2, nd))
            if dims
            else {i for i, s in enumerate(spatial(default_axes(nd))) if s}
        )
    factors = tuple(2 if i in space else 1 for i in range(nd))
    out = []
    for lv in pyramid_levels(shape, factors, n, centered=False):
        c, s = level_layout(lv.shape, chunks, shards)
        out.append(LevelGeometry(lv.shape, c, s))
    return tuple(out)
