"""Default shard and inner-chunk shapes from byte targets, and the one rule for shard sizes that
are not whole inner chunks: pure shape arithmetic."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .layout import ceildiv

__all__ = [
    "DEFAULT_CHUNK_BYTES",
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
