"""``codec/supersede.py``: a shard that replaces one readers may be reading. Read through its
own index it is the new values; read through the replaced shard's index (a reader that read
that index before the put, then the chunks after it) it is the replaced values; chunks stored
identically are not stored twice. Either index location, with or without its crc32c, zstd or
no compressor."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shardwise.codec.chunks import ChunkCodec
from shardwise.codec.codecs import Zstd
from shardwise.codec.shard import ShardCodec, ShardIndex, encode_shard
from shardwise.codec.supersede import superseding

SHARD, CHUNK = (4, 6), (2, 3)


def values_through(codec: ShardCodec, index: ShardIndex, data: bytes, n: int) -> np.ndarray:
    """The first ``n`` rows of the shard ``index`` describes, its chunks read from ``data``."""
    out = np.zeros(SHARD, "u2")
    for flat in np.flatnonzero(index.stored):
        at, size = (int(v) for v in index.entries[flat])
        i, j = (int(c) for c in np.unravel_index(flat, codec.grid))
        chunk = codec.inner.decode(data[at : at + size])
        out[i * CHUNK[0] : (i + 1) * CHUNK[0], j * CHUNK[1] : (j + 1) * CHUNK[1]] = chunk
    return out[:n]


def encoded(codec: ShardCodec, values: np.ndarray) -> Any:
    enc = encode_shard(codec, values)
    assert enc is not None
    return enc.parts


@given(
    location=st.sampled_from(["start", "end"]),
    crc=st.booleans(),
    zstd=st.booleans(),
    rows=st.integers(1, 4).flatmap(lambda n: st.tuples(st.just(n), st.integers(n, 4))),
    changed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_read_through_either_index_gets_its_own_values(
    location: str, crc: bool, zstd: bool, rows: tuple[int, int], changed: bool, seed: int
) -> None:
    """A shard of ``old`` rows replaced by one of ``new`` rows (the old rows the same, or one
    value of them changed)."""
    old_n, new_n = rows
    inner = ChunkCodec(CHUNK, np.dtype("u2"), 0, bytes_codecs=(Zstd(),) if zstd else ())
    codec = ShardCodec(SHARD, inner, location, "little", crc)  # type: ignore[arg-type]
    values = np.random.default_rng(seed).integers(1, 50, SHARD).astype("u2")
    old = b"".join(encoded(codec, values[:old_n]))
    after = values.copy()
    if changed:
        after[0, 0] += 1
    new = b"".join(superseding(codec, old, encoded(codec, after[:new_n]), "k"))
    now, was = ShardIndex.of_shard(codec, new, "k"), ShardIndex.of_shard(codec, old, "k")
    np.testing.assert_array_equal(values_through(codec, now, new, new_n), after[:new_n])
    np.testing.assert_array_equal(values_through(codec, was, new, old_n), values[:old_n])
    # the replaced shard's data region is the new one's prefix (after the index at the start)
    head = codec.index_nbytes if location == "start" else 0
    kept = len(old) - codec.index_nbytes
    assert new[head : head + kept] == old[head : head + kept]
    # a chunk stored the same in both is stored once, where it was; the others follow
    fresh = b"".join(encoded(codec, after[:new_n]))
    plain = ShardIndex.of_shard(codec, fresh, "k")

    def chunk(index: ShardIndex, data: bytes, f: int) -> bytes:
        return data[int(index.offsets[f]) : int(index.offsets[f] + index.lengths[f])]

    for f in np.flatnonzero(now.stored):
        if was.stored[f] and chunk(was, old, f) == chunk(plain, fresh, f):
            assert now.offsets[f] == was.offsets[f]
        else:
            assert now.offsets[f] >= head + kept


def test_no_stored_shard_and_an_unchanged_one() -> None:
    """Nothing stored: the shard as encoded. The same shard again: its bytes, index included,
    unchanged (every chunk where it was, nothing after)."""
    codec = ShardCodec(SHARD, ChunkCodec(CHUNK, np.dtype("u2"), 0, bytes_codecs=(Zstd(),)))
    values = np.arange(24, dtype="u2").reshape(SHARD)
    parts = encoded(codec, values[:3])
    assert superseding(codec, None, parts, "k") == list(parts)
    old = b"".join(parts)
    assert b"".join(superseding(codec, old, encoded(codec, values[:3]), "k")) == old
