"""The geometry of a multiscale pyramid: axes, level shapes, factors, scales, translations and
the dask chunks each reduction needs. Pure arithmetic, no I/O, no dask.

Odd sizes follow the ceil rule (as ngff-zarr and ome-zarr-py do): a level of ``n`` samples
reduced by ``f`` has ``ceil(n / f)`` samples, the last one reduced over the samples present.
An axis already down to one sample is not reduced again (its factor is 1 from there on).

>>> levels = pyramid_levels((5, 7), (2, 2), 3, centered=True)
>>> [lv.shape for lv in levels]
[(5, 7), (3, 4), (2, 2)]
>>> levels[2].scale, levels[2].translation
((4.0, 4.0), (1.5, 1.5))
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidValueError
from .layout import ceildiv

__all__ = [
    "AXIS_TYPES",
    "MAX_LEVELS",
    "Level",
    "aligned_chunks",
    "auto_levels",
    "check_axes",
    "child_shards",
    "default_axes",
    "level_layout",
    "nests",
    "pyramid_levels",
    "reduced_chunks",
    "spatial",
]

AXIS_TYPES = {"t": "time", "c": "channel", "z": "space", "y": "space", "x": "space"}
"""The axis names a pyramid takes, with their OME-Zarr types, in the order OME-Zarr 0.5 wants
them (time, channel, space)."""
MAX_LEVELS = 32  # a factor of 2 over 32 levels takes any real axis down to one sample
_ORDER = tuple(AXIS_TYPES)


@dataclass(frozen=True)
class Level:
    """One level: its shape, the factor from level 0 per axis, and its OME-Zarr scale and
    translation (physical units per sample, and the position of the first sample's centre)."""

    shape: tuple[int, ...]
    factors: tuple[int, ...]
    scale: tuple[float, ...]
    translation: tuple[float, ...]


def default_axes(ndim: int) -> tuple[str, ...]:
    """The axes of an array whose axes are not named: the last ``ndim`` of (t, c, z, y, x).

    >>> default_axes(3)
    ('z', 'y', 'x')
    """
    if not 2 <= ndim <= 5:
        raise InvalidValueError(f"a pyramid is of 2-D to 5-D data, got {ndim}-D data")
    return _ORDER[5 - ndim :]


def check_axes(axes: Sequence[str]) -> tuple[str, ...]:
    """``axes`` checked: names among t, c, z, y, x, each once, in that order, with y and x (an
    OME-Zarr image has 2 or 3 space axes after its time and channel axes)."""
    out = tuple(axes)
    accepted = "names among 't', 'c', 'z', 'y', 'x', each once and in that order, with 'y', 'x'"
    if (
        not 2 <= len(out) <= 5
        or any(a not in AXIS_TYPES for a in out)
        or list(out) != sorted(out, key=_ORDER.index)
        or len(set(out)) != len(out)
        or out[-2:] not in (("y", "x"),)
    ):
        raise InvalidValueError(f"dims must be {accepted}, got {out!r}")
    return out


def spatial(axes: Sequence[str]) -> tuple[bool, ...]:
    """Which axes are reduced: the space axes (time and channel never are)."""
    return tuple(AXIS_TYPES[a] == "space" for a in axes)


def _step(shape: tuple[int, ...], factors: tuple[int, ...]) -> tuple[int, ...]:
    """The factor of one reduction of ``shape``: 1 where an axis is down to one sample."""
    return tuple(f if n > 1 else 1 for n, f in zip(shape, factors, strict=True))


def auto_levels(shape: tuple[int, ...], factors: tuple[int, ...], fits: tuple[int, ...]) -> int:
    """``levels="auto"``: levels until every reduced axis fits within ``fits`` (level 0's inner
    chunk), or nothing shrinks any more.

    >>> auto_levels((1000, 600), (2, 2), (128, 128))
    4
    """
    n = 1
    axes = [i for i, f in enumerate(factors) if f > 1]
    while n < MAX_LEVELS and any(shape[i] > fits[i] for i in axes):
        step = _step(shape, factors)
        if all(f == 1 for f in step):
            break
        shape = tuple(ceildiv(s, f) for s, f in zip(shape, step, strict=True))
        n += 1
    return n


def pyramid_levels(
    shape: tuple[int, ...],
    factors: tuple[int, ...],
    levels: int,
    *,
    centered: bool,
    scale: tuple[float, ...] | None = None,
    translation: tuple[float, ...] | None = None,
) -> list[Level]:
    """The ``levels`` levels of a pyramid of ``shape`` reduced by ``factors`` at each step.

    ``scale`` and ``translation`` are level 0's (default 1 and 0). ``centered``: a reduced
    sample stands for its whole block (mean, mode), so its centre moves by ``(F - 1) / 2``
    level-0 samples for a cumulative factor ``F``; otherwise (nearest: the block's first
    sample) the translation stays.
    """
    s0 = scale or (1.0,) * len(shape)
    t0 = translation or (0.0,) * len(shape)
    out: list[Level] = []
    total = (1,) * len(shape)
    for _ in range(levels):
        out.append(
            Level(
                shape,
                total,
                tuple(float(s * f) for s, f in zip(s0, total, strict=True)),
                tuple(
                    float(t + (s * (f - 1) / 2 if centered else 0.0))
                    for t, s, f in zip(t0, s0, total, strict=True)
                ),
            )
        )
        step = _step(shape, factors)
        shape = tuple(ceildiv(n, f) for n, f in zip(shape, step, strict=True))
        total = tuple(a * f for a, f in zip(total, step, strict=True))
    return out


def level_layout(
    shape: tuple[int, ...], chunks: tuple[int, ...], shards: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Level 0's inner chunks and shards for a smaller level: chunks no larger than the level,
    shards of whole chunks no larger than the level's whole chunks.

    >>> level_layout((300, 20), (64, 64), (1024, 1024))
    ((64, 20), (320, 20))
    """
    c = tuple(max(1, min(k, n)) for k, n in zip(chunks, shape, strict=True))
    s = tuple(
        max(ck, min(ceildiv(sh, ck) * ck, ceildiv(n, ck) * ck))
        for sh, ck, n in zip(shards, c, shape, strict=True)
    )
    return c, s


def aligned_chunks(chunks: Sequence[int], factor: int) -> tuple[int, ...]:
    """Dask chunks along one axis with every boundary moved to the nearest multiple of
    ``factor``, so that no block of the reduction straddles two chunks (the last chunk keeps
    the partial block).

    >>> aligned_chunks((33, 33, 34), 4)
    (32, 36, 32)
    """
    total = sum(chunks)
    if factor == 1:
        return tuple(chunks)
    edges = [min(total, (e + factor // 2) // factor * factor) for e in _inner_edges(chunks)]
    cuts = sorted({0, total, *(e for e in edges if 0 < e < total)})
    return tuple(b - a for a, b in itertools.pairwise(cuts)) or (total,)


def _inner_edges(chunks: Sequence[int]) -> list[int]:
    return list(itertools.accumulate(chunks))[:-1]


def reduced_chunks(chunks: Sequence[int], factor: int) -> tuple[int, ...]:
    """The chunks of the reduced axis, one per (aligned) chunk: ``ceil(c / factor)``.

    >>> reduced_chunks((32, 36, 32), 4)
    (8, 9, 8)
    """
    return tuple(ceildiv(c, factor) for c in chunks)


def nests(
    shape: Sequence[int],
    shards: Sequence[int],
    next_shards: Sequence[int],
    factors: Sequence[int],
) -> bool:
    """Whether every shard of the next level (``next_shards``, reduced by ``factors`` from a
    level of ``shape`` in ``shards``) is the reduction of whole shards of this level, each
    reduced on its own: no block of the reduction straddles a shard edge, and the next level's
    shard edges fall on this level's. Then a shard's task can hand its reduced block on, and
    the pyramid's graph is a tree of shard tasks.

    >>> nests((512, 300), (128, 128), (128, 128), (2, 2))
    True
    >>> nests((512, 300), (100, 100), (100, 100), (3, 3))  # the edge at 100 splits a block
    False
    """
    for n, s, t, f in zip(shape, shards, next_shards, factors, strict=True):
        if n <= s:  # one shard along the axis: nothing is split
            continue
        if s % f or (ceildiv(n, f) > t and (t * f) % s):
            return False
    return True


def child_shards(
    shard: Sequence[int],
    shape: Sequence[int],
    shards: Sequence[int],
    next_shards: Sequence[int],
    factors: Sequence[int],
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The shards of a level (``shape`` in ``shards``) whose reductions make up ``shard`` of
    the next level (``next_shards``; :func:`nests` holds), each with where its reduced block
    starts inside that shard, in C order.

    >>> child_shards((0, 1), (512, 300), (128, 128), (128, 128), (2, 2))
    [((0, 2), (0, 0)), ((1, 2), (64, 0))]
    """
    per_axis = []
    for i, n, s, t, f in zip(shard, shape, shards, next_shards, factors, strict=True):
        lo = i * t * f  # the first sample of ``shard`` at this level
        first, stop = lo // s, min(ceildiv(n, s), ceildiv((i + 1) * t * f, s))
        per_axis.append([(j, (j * s - lo) // f) for j in range(first, stop)])
    return [
        (tuple(j for j, _ in pick), tuple(at for _, at in pick))
        for pick in itertools.product(*per_axis)
    ]
