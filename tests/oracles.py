"""Oracles: independent checks of what shardwise wrote or read, from first principles.

* :func:`bit_equal`, :func:`assert_bit_equal` -- equal shape, dtype and bits (NaN payloads and the
  sign of zero included), the comparison every round-trip test uses;
* :func:`expected_stored` -- per shard, the inner chunks that must be stored;
* :func:`parse_index` -- a shard's index (offsets, sizes) read without shardwise.

The data they judge comes from the hypothesis strategies in ``strategies.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from strategies import Chain, Geometry, fill_array


def bit_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.newbyteorder("=") != b.dtype.newbyteorder("="):
        return False
    na = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("="), copy=False))
    nb = np.ascontiguousarray(b.astype(b.dtype.newbyteorder("="), copy=False))
    return na.tobytes() == nb.tobytes()


def assert_bit_equal(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Assert equal shape, dtype and bits (NaN payloads and the sign of zero included)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype.newbyteorder("=") == want.dtype.newbyteorder("="), (
        f"{what}: dtype {got.dtype} != {want.dtype}"
    )
    if not bit_equal(got, want):
        gb = np.ascontiguousarray(got).view(np.uint8).reshape(*got.shape, -1)
        wb = np.ascontiguousarray(want).view(np.uint8).reshape(*want.shape, -1)
        diff = np.argwhere((gb != wb).any(axis=-1))
        first = tuple(int(i) for i in diff[0]) if diff.size else ()
        raise AssertionError(
            f"{what}: {len(diff)} of {got.size} elements differ bitwise; first at {first}: "
            f"got {got[first]!r}, want {want[first]!r}"
        )


def expected_stored(
    data: np.ndarray, geometry: Geometry, fill: Any, *, write_empty_chunks: bool = False
) -> dict[tuple[int, ...], np.ndarray]:
    """Per shard coordinate, the boolean grid of inner chunks that must be stored.

    An inner chunk is stored when it holds at least one array element and (unless
    ``write_empty_chunks``) is not bit-for-bit all fill value. Shards with nothing stored are left
    out. Computed from first principles, independent of shardwise.
    """
    out = {}
    c, s = geometry.chunk_shape, geometry.shard_shape
    for shard in np.ndindex(*geometry.shard_grid):
        grid = np.zeros(geometry.chunks_per_shard, dtype=bool)
        for inner in np.ndindex(*geometry.chunks_per_shard):
            lo = [i * ss + j * cc for i, j, ss, cc in zip(shard, inner, s, c, strict=True)]
            region = tuple(
                slice(a, min(a + cc, n)) for a, cc, n in zip(lo, c, geometry.shape, strict=True)
            )
            if any(r.stop <= r.start for r in region):
                continue
            block = data[region]
            grid[inner] = write_empty_chunks or not bit_equal(
                block, fill_array(block.shape, data.dtype, fill)
            )
        if grid.any():
            out[tuple(shard)] = grid
    return out


def parse_index(
    blob: bytes, chain: Chain, chunks_per_shard: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, nbytes) of a shard's inner chunks in C order, read from first principles."""
    n = math.prod(chunks_per_shard)
    size = 16 * n + (4 if chain.index_crc else 0)
    raw = blob[:size] if chain.index_location == "start" else blob[len(blob) - size :]
    if chain.index_crc:
        import crc32c

        body, crc = raw[:-4], int.from_bytes(raw[-4:], "little")
        assert crc32c.crc32c(body) == crc, "index checksum mismatch"
        raw = body
    dt = "<u8" if chain.index_endian == "little" else ">u8"
    index = np.frombuffer(raw, dtype=dt).astype(np.uint64).reshape(*chunks_per_shard, 2)
    return index[..., 0], index[..., 1]
