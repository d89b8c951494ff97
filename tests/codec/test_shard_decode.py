"""decode_into, the read path's decoder of one shard's box of chunks, on regions that start and
stop inside chunks: for large chunks (each decoded straight into the output) and for small ones
(the box cut into slabs of chunk rows decoded by several threads).

The shard is encoded by shardwise and the expected values are the array itself; the region's
edges fall inside chunks on both axes, so every clipping of a chunk is exercised. The slabs are
counted through the fetch calls: each slab fetches its own chunks.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from shardwise.codec.chunks import SMALL_CHUNK, ChunkCodec
from shardwise.codec.codecs import Zstd
from shardwise.codec.decode import decode_into
from shardwise.codec.shard import ShardCodec, ShardIndex, encode_shard
from shardwise.runtime import pool

KEY = "arr/c/0/0"


@pytest.fixture(autouse=True)
def _pool_as_it_was() -> Any:
    """These tests ask for more threads than the machine's cores, which grows the shared pool
    for the rest of the process (and later default reads then spread over its extra threads);
    a fresh pool afterwards keeps the tests after them as they would run alone."""
    yield
    pool.after_fork()


class Shard:
    """A shard of ``values`` encoded by shardwise, and a counting fetch of its chunks."""

    def __init__(self, codec: ShardCodec, values: np.ndarray) -> None:
        encoded = encode_shard(codec, values)
        assert encoded is not None
        self.codec, self.values = codec, values
        self.data = memoryview(b"".join(bytes(p) for p in encoded.parts))
        self.index = ShardIndex.of_shard(codec, self.data, KEY)
        self.fetches: list[int] = []
        self._lock = threading.Lock()

    def fetch(self, entries: np.ndarray) -> tuple[Any, np.ndarray]:
        with self._lock:
            self.fetches.append(len(entries))
        return self.data, entries

    def decode(
        self, local: Sequence[slice], threads: int | None, fetch_bytes: int | None = None
    ) -> np.ndarray:
        cs = self.codec.chunk_shape
        box = [range(s.start // c, -(-s.stop // c)) for s, c in zip(local, cs, strict=True)]
        out = np.full([s.stop - s.start for s in local], -1, self.values.dtype)
        self.fetches.clear()
        more = {} if fetch_bytes is None else {"fetch_bytes": fetch_bytes}
        decode_into(self.codec, self.index, box, local, self.fetch, out, threads, **more)
        return out


def _values(shape: tuple[int, ...], chunk: tuple[int, ...], empty: tuple[int, ...]) -> np.ndarray:
    """Distinct values everywhere but in chunk ``empty``, left at the fill value 0."""
    values = np.arange(1, 1 + np.prod(shape), dtype="int32").reshape(shape)
    values[tuple(slice(i * c, i * c + c) for i, c in zip(empty, chunk, strict=True))] = 0
    return values


# regions of a (192, 96) shard: inside one chunk, across chunk edges, the whole shard, one row
REGIONS = [
    (slice(10, 150), slice(5, 90)),
    (slice(65, 70), slice(33, 34)),
    (slice(0, 192), slice(0, 96)),
    (slice(63, 129), slice(31, 65)),
    (slice(100, 101), slice(0, 96)),
]


@pytest.mark.parametrize("order", [None, (1, 0)], ids=["C", "transposed"])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("local", REGIONS, ids=str)
def test_large_chunks_decode_a_region_starting_inside_a_chunk(
    local: tuple[slice, ...], threads: int, order: tuple[int, ...] | None
) -> None:
    chunk = (64, 256)  # int32: 64 KiB, decoded chunk by chunk straight into the output
    inner = ChunkCodec(chunk, np.dtype("int32"), 0, order=order, bytes_codecs=(Zstd(),))
    assert inner.raw_nbytes >= SMALL_CHUNK
    shard = Shard(ShardCodec((192, 512), inner), _values((192, 512), chunk, empty=(1, 0)))
    wide = (local[0], slice(local[1].start * 5, local[1].stop * 5 + 3))
    np.testing.assert_array_equal(shard.decode(wide, threads), shard.values[wide])


@pytest.mark.parametrize("chunk", [(64, 256), (32, 512)], ids=["strided", "contiguous"])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("local", REGIONS, ids=str)
def test_large_chunks_are_fetched_a_few_at_a_time(
    local: tuple[slice, ...], threads: int, chunk: tuple[int, int]
) -> None:
    # the read path decodes a whole shard in one call (the chunks' places in the output found
    # once) and bounds each fetch by fetch_bytes: here two 64 KiB chunks at most; a chunk
    # spanning the trailing axis whole ("contiguous") is decoded straight into the output
    inner = ChunkCodec(chunk, np.dtype("int32"), 0, bytes_codecs=(Zstd(),))
    shard = Shard(ShardCodec((192, 512), inner), _values((192, 512), chunk, empty=(1, 0)))
    wide = (local[0], slice(local[1].start * 5, local[1].stop * 5 + 3))
    got = shard.decode(wide, threads, fetch_bytes=2 * inner.raw_nbytes + 1)
    np.testing.assert_array_equal(got, shard.values[wide])
    assert max(shard.fetches, default=0) <= 2


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("local", REGIONS, ids=str)
def test_small_chunks_decode_in_parallel_slabs(local: tuple[slice, ...], threads: int) -> None:
    chunk = (8, 32)  # 1 KiB: the box is cut into slabs of chunk rows, one stack per slab
    inner = ChunkCodec(chunk, np.dtype("int32"), 0, bytes_codecs=(Zstd(),))
    shard = Shard(ShardCodec((192, 96), inner), _values((192, 96), chunk, empty=(9, 1)))
    got = shard.decode(local, threads)
    np.testing.assert_array_equal(got, shard.values[local])
    rows = -(-local[0].stop // 8) - local[0].start // 8
    # one fetch per slab: at most four slabs per thread, never more slabs than chunk rows
    expected = 1 if rows < 2 else min(rows, 4 * threads)
    assert len(shard.fetches) == expected
    box = [
        (local[0].start // 8, -(-local[0].stop // 8)),
        (local[1].start // 32, -(-local[1].stop // 32)),
    ]
    stored = [
        (i, j)
        for i in range(*box[0])
        for j in range(*box[1])
        if not shard.index.is_empty(i * 3 + j)
    ]
    assert sum(shard.fetches) == len(stored)  # every stored chunk of the box fetched once


@pytest.mark.parametrize("local", REGIONS, ids=str)
def test_small_chunks_on_one_thread_decode_one_stack(local: tuple[slice, ...]) -> None:
    inner = ChunkCodec((8, 32), np.dtype("int32"), 0, bytes_codecs=(Zstd(),))
    shard = Shard(ShardCodec((192, 96), inner), _values((192, 96), (8, 32), empty=(0, 0)))
    np.testing.assert_array_equal(shard.decode(local, 1), shard.values[local])
    assert len(shard.fetches) <= 1  # the whole box at once (none when every chunk is empty)
