"""Default shard and inner-chunk shapes from byte targets, and the one rule for shard sizes that
are not whole inner chunks: pure shape arithmetic."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .layout import ceildiv

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "compact_chunks",
    "contiguous_shards",
    "DEFAULT_SHARD_BYTES",
    "default_chunks",
    "default_shards",
    "divisors",
    "dividing_chunks",
    "shrink_to_fit",
    "whole_chunks",
]

DEFAULT_SHARD_BYTES = 64 * 2**20
"""Default target size of one shard before compression (64 MiB)."""
DEFAULT_CHUNK_BYTES = 2**20
"""Default target size of one inner chunk before compression (1 MiB)."""


def shrink_to_fit(
    counts: Sequence[int],
    unit_bytes: int,
    target: int,
    *,
    axes: Sequence[int] | None = None,
    step: Callable[[int, int], int] | None = None,
) -> list[int]:
    """The one "halve the largest axis until it fits" rule, for chunk, shard and block shapes.

    ``counts`` are units (elements, chunks) along each axis, ``unit_bytes`` the bytes of one
    unit. While the units' bytes exceed ``target``, the largest count among ``axes`` (default:
    all; the first on ties) becomes ``step(axis, count)`` (default: half, rounded up); it stops
    when those axes are all down to 1.

    >>> shrink_to_fit([8, 4], 1, 10)
    [2, 4]
    >>> shrink_to_fit([8, 4], 1, 10, axes=[1])
    [8, 1]
    """
    c = list(counts)
    free = range(len(c)) if axes is None else axes
    while free and math.prod(c) * unit_bytes > target and max(c[i] for i in free) > 1:
        i = max(free, key=lambda j: c[j])
        c[i] = ceildiv(c[i], 2) if step is None else step(i, c[i])
    return c


def default_chunks(
    shape: tuple[int, ...], itemsize: int, target: int = DEFAULT_CHUNK_BYTES
) -> tuple[int, ...]:
    """Inner chunks for ``shape``: halve the largest dimension until under ``target`` bytes.

    >>> default_chunks((2920, 361, 720), 4)
    (46, 46, 90)
    """
    return tuple(shrink_to_fit([max(1, n) for n in shape], itemsize, target))


def default_shards(
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    itemsize: int,
    target: int = DEFAULT_SHARD_BYTES,
) -> tuple[int, ...]:
    """Shards of whole inner ``chunks``: the whole ``shape``, halved (counted in chunks) along
    the dimension with most chunks until under ``target`` bytes.

    >>> default_shards((2920, 361, 720), (46, 46, 90), 4)
    (184, 184, 360)
    """
    k = [ceildiv(max(1, n), c) for n, c in zip(shape, chunks, strict=True)]
    k = shrink_to_fit(k, math.prod(chunks) * itemsize, target)
    return tuple(c * n for c, n in zip(chunks, k, strict=True))


def whole_chunks(shards: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[int, ...]:
    """The one rule for a shard shape given together with its inner chunks: every size rounded
    up to whole chunks (``write_array``, ``to_zarr``'s sizes by dimension name, ``convert`` and
    the command line all apply it). Shapes that cannot be rounded (sizes below 1, another number
    of dimensions) are returned as given, for the caller's own check to name them.

    >>> whole_chunks((100, 64, 1), (32, 32, 8))
    (128, 64, 8)
    """
    if len(shards) != len(chunks) or min((*shards, *chunks), default=1) < 1:
        return shards
    return tuple(ceildiv(s, c) * c for s, c in zip(shards, chunks, strict=True))


def dividing_chunks(
    shards: tuple[int, ...], itemsize: int, target: int = DEFAULT_CHUNK_BYTES
) -> tuple[int, ...]:
    """Inner chunks that divide ``shards``: the largest dimension is cut to its next smaller
    divisor (at most half) until under ``target`` bytes.

    >>> dividing_chunks((584, 361, 720), 4)
    (146, 19, 90)
    """

    def next_divisor(i: int, n: int) -> int:
        return max(d for d in divisors(shards[i]) if d <= n // 2)

    return tuple(shrink_to_fit(shards, itemsize, target, step=next_divisor))


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, in order.

    >>> divisors(30)
    [1, 2, 3, 5, 6, 10, 15, 30]
    """
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def compact_chunks(
    shards: Sequence[int],
    itemsize: int,
    target: int = DEFAULT_CHUNK_BYTES,
    free: Sequence[int] = (),
) -> tuple[int, ...]:
    """Inner chunks for shards given without them: one step along the leading axes, whole
    planes of the last two axes up to ``target`` bytes (a larger plane cut, its longest side
    first: to a divisor of the shard, or evenly along ``free`` axes, whose shard may then be
    rounded up to whole chunks), then as many steps of the leading axes as fit.

    >>> compact_chunks((30, 181, 360), 4), compact_chunks((30, 721, 1440), 4, free=(1, 2))
    ((3, 181, 360), (1, 361, 720))
    >>> compact_chunks((1024, 1024), 4)
    (512, 512)
    """
    s = [max(1, n) for n in shards]
    nd = len(s)
    lead = range(max(0, nd - 2))
    c = [1 if i in lead else n for i, n in enumerate(s)]

    def fit(i: int, k: int) -> int:  # the largest size <= k a chunk along axis i may take
        if i in free:
            return ceildiv(s[i], ceildiv(s[i], max(1, k)))
        return max(d for d in divisors(s[i]) if d <= max(1, k))

    c = shrink_to_fit(
        c,
        itemsize,
        target,
        axes=range(len(lead), nd),
        step=lambda i, n: fit(i, ceildiv(n, 2) if i in free else n // 2),
    )
    for i in reversed(lead):
        room = target // (math.prod(c) * itemsize)
        c[i] = fit(i, min(s[i], room))
        if c[i] < s[i]:
            break
    return tuple(c)


def contiguous_shards(
    shape: Sequence[int], chunks: Sequence[int], itemsize: int, target: int, keep: Sequence[int]
) -> tuple[tuple[int, ...], str]:
    """The largest shard of whole ``chunks`` under ``target`` bytes, innermost axes first: each
    whole while it fits, then as many chunks of the next as fit, one chunk along the axes before
    and along ``keep``. When one row of chunks along the last axis alone is too large, the
    balanced rule instead (the whole array halved along the axis with most chunks).

    >>> contiguous_shards((10, 6, 86, 1664, 1193), (1, 1, 16, 256, 256), 2, 2 * 10**9, [1])[0]
    (4, 1, 96, 1792, 1280)
    """
    k = [
        1 if i in keep else ceildiv(max(1, n), c)
        for i, (n, c) in enumerate(zip(shape, chunks, strict=True))
    ]
    unit = math.prod(chunks) * itemsize
    out, inner, partial = [1] * len(k), unit, None
    for i in reversed(range(len(k))):
        if i in keep or k[i] == 1:
            continue
        if inner * k[i] <= target:
            out[i], inner = k[i], inner * k[i]
            continue
        if inner == unit:  # not even one row of chunks fits: balanced
            free = [j for j in range(len(k)) if j not in keep]
            out = shrink_to_fit(k, unit, target, axes=free)
            partial = "the balanced rule (one row of chunks exceeds it)"
        else:
            out[i], partial = (
                max(1, target // inner),
                f"{max(1, target // inner)} chunks along axis {i}",
            )
        break
    shards = tuple(c * n for c, n in zip(chunks, out, strict=True))
    how = "the whole array fits" if partial is None else f"innermost axes whole, then {partial}"
    return shards, how
