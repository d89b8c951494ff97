"""The inner chunk chain on its own (codec/chunks.py): stacks, encode and decode of one chunk,
decoding into place, and refusals of bad bytes, without shards or stores."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardwise.codec.chunks import ChunkCodec
from shardwise.codec.codecs import Blosc, Crc32c, Gzip, Zstd
from strategies import examples

CHAINS: dict[str, tuple[Any, ...]] = {
    "bytes": (),
    "zstd": (Zstd(level=1),),
    "zstd-checksum": (Zstd(level=0, checksum=True),),
    "gzip": (Gzip(level=1),),
    "blosc": (Blosc(cname="lz4", clevel=3, shuffle="shuffle", typesize=4),),
    "crc32c": (Crc32c(),),
    "zstd+crc32c": (Zstd(level=1), Crc32c()),
}


def codec(chain: str, order: tuple[int, ...] | None = None, endian: Any = "little") -> ChunkCodec:
    return ChunkCodec(
        chunk_shape=(4, 6, 2),
        dtype=np.dtype("float32"),
        fill_value=0,
        order=order,
        endian=endian,
        bytes_codecs=CHAINS[chain],
    )


def chunk(c: ChunkCodec, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=c.stored_shape).astype(c.stored_dtype)


@pytest.mark.parametrize("chain", sorted(CHAINS))
@pytest.mark.parametrize("endian", ["little", "big"])
def test_encode_then_decode_is_the_chunk(chain: str, endian: str) -> None:
    c = codec(chain, endian=endian)
    item = chunk(c)
    data = c.encode(item)
    got = c.decode(data)
    assert got.dtype == c.stored_dtype and got.shape == c.stored_shape
    np.testing.assert_array_equal(got, item)
    if chain == "bytes":  # the serializer alone: the raw bytes in the stored byte order
        assert data == item.astype(c.stored_dtype).tobytes()


@pytest.mark.parametrize("chain", ["bytes", "zstd", "zstd-checksum"])
def test_decode_straight_into_place(chain: str) -> None:
    c = codec(chain)
    item = chunk(c, 1)
    dest = np.zeros(c.chunk_shape, c.stored_dtype)
    assert c.decode_to(c.encode(item), dest) is True
    np.testing.assert_array_equal(dest, item)


@pytest.mark.parametrize(
    "c",
    [codec("zstd", order=(2, 0, 1)), codec("zstd+crc32c"), codec("gzip")],
    ids=["transposed", "two-codecs", "gzip"],
)
def test_decode_into_place_declines_and_writes_nothing(c: ChunkCodec) -> None:
    dest = np.full(c.chunk_shape, 7, c.stored_dtype)
    assert c.decode_to(c.encode(chunk(c)), dest) is False
    assert (dest == 7).all()


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_damaged_bytes_are_refused_not_misread(chain: str) -> None:
    c = codec(chain)
    item = chunk(c, 2)
    data = bytearray(c.encode(item))
    with pytest.raises(ValueError):
        c.decode(bytes(data[: len(data) // 2]))  # truncated
    if chain in ("bytes", "zstd", "gzip", "blosc"):
        return  # without a checksum, a flipped payload byte can decode to other values
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(ValueError):
        c.decode(bytes(data))


@examples(40)
@given(
    grid=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    order=st.permutations([0, 1, 2]),
)
def test_stack_then_unstack_is_the_block(grid: list[int], order: list[int]) -> None:
    c = codec("bytes", order=None if order == [0, 1, 2] else tuple(order))
    shape = tuple(g * n for g, n in zip(grid, c.chunk_shape, strict=True))
    block = np.arange(math.prod(shape), dtype="float32").reshape(shape)
    stack = c.stack(block, grid)
    assert stack.shape == (math.prod(grid), *c.stored_shape)
    np.testing.assert_array_equal(c.unstack(stack, grid), block)
    # the first stacked chunk is the block's first chunk, in the stored (transposed) order
    first = block[tuple(slice(0, n) for n in c.chunk_shape)]
    want = first if c.order is None else first.transpose(c.order)
    np.testing.assert_array_equal(stack[0], want)


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_a_run_is_the_chunks_encoded_one_by_one(chain: str) -> None:
    """encode_run gives the sizes and bytes of encoding the chunks one by one; small zstd-only
    chunks come back as one joined part (no object per chunk), other chains one part each."""
    c = codec(chain)
    rng = np.random.default_rng(5)
    stack = rng.standard_normal((12, *c.stored_shape)).astype(c.stored_dtype)
    rows = np.array([0, 2, 3, 7, 11])
    sizes, parts = c.encode_run(stack, rows)
    one_by_one = [bytes(c.encode(stack[i])) for i in rows.tolist()]
    assert sizes.tolist() == [len(b) for b in one_by_one]
    assert b"".join(bytes(p) for p in parts) == b"".join(one_by_one)
    assert len(parts) == (1 if chain in ("zstd", "zstd-checksum") else len(rows))
    # unjoined, for callers that reorder the chunks: one part per chunk, the same bytes
    _, each = c.encode_run(stack, rows, join=False)
    assert [bytes(p) for p in each] == one_by_one
