"""A shard of one inner chunk (``codec/single.py``): the bytes ``encode_shard`` stores are
those of the general path, for every index layout, byte order, chain and fill case, and the
values read back through the shard's index are the block's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shardwise.codec import shard as shard_mod
from shardwise.codec.chunks import ChunkCodec
from shardwise.codec.codecs import Zstd
from shardwise.codec.shard import ShardCodec, decode_shard_bytes, encode_shard
from shardwise.codec.single import NOT_ONE, encode_one

CHUNK = (1, 6, 8)


def make_codec(
    dtype: str, chain: str, location: Any, endian: Any, crc: bool, order: Any = None
) -> ShardCodec:
    codecs = (Zstd(),) if chain == "zstd" else ()
    inner = ChunkCodec(CHUNK, np.dtype(dtype), 0, order=order, endian=endian, bytes_codecs=codecs)
    return ShardCodec(CHUNK, inner, index_location=location, index_endian=endian, index_crc=crc)


def general(codec: ShardCodec, block: np.ndarray, empty: bool, monkeypatch: Any) -> Any:
    """``encode_shard`` by the general path (the one-chunk path turned off)."""
    with monkeypatch.context() as m:
        m.setattr(shard_mod, "encode_one", lambda *a: NOT_ONE)
        return encode_shard(codec, block, write_empty_chunks=empty)


@pytest.mark.parametrize("dtype", ["uint16", "float32", "uint8", "bool"])
@pytest.mark.parametrize("chain", ["raw", "zstd"])
@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("endian", ["little", "big"])
@pytest.mark.parametrize("crc", [True, False])
def test_one_chunk_shards_store_the_general_paths_bytes(
    dtype: str, chain: str, location: Any, endian: Any, crc: bool, monkeypatch: Any
) -> None:
    codec = make_codec(dtype, chain, location, endian, crc)
    rng = np.random.default_rng(3)
    data = rng.integers(0, 5, CHUNK) % 2 if dtype == "bool" else rng.integers(1, 90, CHUNK)
    block = data.astype(dtype)
    for empty in (False, True):
        got = encode_shard(codec, block, write_empty_chunks=empty)
        want = general(codec, block, empty, monkeypatch)
        assert got is not None and want is not None
        assert b"".join(map(bytes, got.parts)) == b"".join(map(bytes, want.parts))
        assert (got.chunks_stored, got.chunks_empty, got.raw_nbytes) == (1, 0, block.nbytes)
        back = decode_shard_bytes(codec, got.data, key="c/0/0/0")
        np.testing.assert_array_equal(back, block)
        # views=True (a caller storing the shard before the block changes): the same bytes;
        # a chain without bytes codecs gives the block's own memory, no copy
        seen = encode_shard(codec, block, write_empty_chunks=empty, views=True)
        assert seen is not None and seen.data == want.data
        chunk = seen.parts[1 if location == "start" else 0]
        as_is = chain == "raw" and block.dtype == codec.inner.stored_dtype  # no byte swap
        assert np.shares_memory(np.asarray(chunk), block) == as_is
    # the first element the fill value, the rest not: stored (the first-element test only
    # rules fill out, never in)
    first = block.copy()
    first.flat[0] = 0
    got = encode_shard(codec, first)
    assert got is not None and got.data == general(codec, first, False, monkeypatch).data
    fill = np.zeros(CHUNK, dtype)
    assert encode_shard(codec, fill) is None  # all fill: nothing stored, as before
    assert encode_shard(codec, fill, views=True) is None
    kept = encode_shard(codec, fill, write_empty_chunks=True)
    assert kept is not None
    assert kept.data == general(codec, fill, True, monkeypatch).data


def test_other_shards_take_the_general_path() -> None:
    """More than one chunk, a block short of the chunk (the array's edge), a transposed chunk
    order: not encoded here."""
    one = make_codec("uint16", "raw", "end", "little", True)
    assert encode_one(one, np.ones((1, 6, 7), "uint16"), False, None) is NOT_ONE
    moved = make_codec("uint16", "raw", "end", "little", True, order=(2, 1, 0))
    assert encode_one(moved, np.ones(CHUNK, "uint16"), False, None) is NOT_ONE
    inner = ChunkCodec((1, 3, 8), np.dtype("uint16"), 0)
    two = ShardCodec(CHUNK, inner)
    assert encode_one(two, np.ones(CHUNK, "uint16"), False, None) is NOT_ONE
