"""A shard's block given as the source pieces it is cut from, encoded without joining them.

When a dask source's chunks do not line up with the shards, each shard task gets the pieces of
the source blocks that fall in its shard. Joining them (what ``rechunk`` does) copies the whole
shard into fresh memory only for the encoder to copy every inner chunk out again. When every
piece starts on an inner-chunk boundary of the shard, each inner chunk lies in one piece, and the
encoder gathers it from there (:func:`~shardwise.codec.shard.encode_chunks`): one copy, no
fresh pages.

>>> a, b = np.zeros((4, 2), "u1"), np.ones((4, 2), "u1")
>>> m = Mosaic((4, 4), ((0, 0), (0, 2)), (a, b))
>>> m.join()[0].tolist(), m.nbytes, fits((4, 2), m.origins)
([0, 0, 1, 1], 16, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Mosaic:
    """The block of ``shape`` made of ``arrays``, each at its ``origins`` (element offsets in
    the block); together they cover it exactly, without overlap."""

    shape: tuple[int, ...]
    origins: tuple[tuple[int, ...], ...]
    arrays: tuple[np.ndarray, ...]

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.arrays[0].dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def join(self) -> np.ndarray:
        """The block as one array (for the merges of shards a write covers in part)."""
        out = np.empty(self.shape, dtype=self.dtype)
        for origin, arr in zip(self.origins, self.arrays, strict=True):
            out[tuple(slice(o, o + n) for o, n in zip(origin, arr.shape, strict=True))] = arr
        return out

    def work(
        self, chunk_shape: Sequence[int], cut: Callable[[Sequence[int]], list[Box]]
    ) -> list[tuple[np.ndarray, Box, np.ndarray]]:
        """The encoder's units piece by piece: ``(piece, box in the piece's chunk grid, C-order
        positions of the box's chunks in the block's grid)``; ``cut`` splits a piece's grid
        into boxes (:func:`~shardwise.codec.shard.units`)."""
        used = tuple(-(-n // c) for n, c in zip(self.shape, chunk_shape, strict=True))
        ids = np.arange(math.prod(used)).reshape(used)
        out = []
        for origin, arr in zip(self.origins, self.arrays, strict=True):
            start = [o // c for o, c in zip(origin, chunk_shape, strict=True)]
            grid = [-(-n // c) for n, c in zip(arr.shape, chunk_shape, strict=True)]
            for box in cut(grid):
                where = tuple(slice(s + a, s + b) for s, (a, b) in zip(start, box, strict=True))
                out.append((arr, box, ids[where].ravel()))
        return out


def fits(chunk_shape: Sequence[int], origins: Sequence[Sequence[int]]) -> bool:
    """Whether every piece starts on an inner-chunk boundary (each chunk then lies in one)."""
    return all(o % c == 0 for origin in origins for o, c in zip(origin, chunk_shape, strict=True))
