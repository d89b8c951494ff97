"""The batched zstd path (small chunks compressed and decompressed many to one call) is taken,
seen through its per-process counts (``shardwise.codec.batches``), and its fallback is right.

A batch decode that fails falls back to decoding its chunks one by one, with the same values:
a change that made every batch call fail, or that stopped taking the batch path, would change
no value read. The counts tell: a read of small zstd chunks must make batch calls and fall back
none; a write must compress in batches. With a batch call that fails (injected), the values
are still right and every fallback is counted.

And the batch sizes themselves: shards of 1 to 150 small chunks (the encode groups about
256 KiB of them per call, the reader cuts boxes into slabs per thread), some left as the fill,
zstd alone or with crc32c, big- or little-endian: written by shardwise and read back by
shardwise, zarr-python and tensorstore; written by zarr-python and read by shardwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

import shardwise
from oracles import assert_bit_equal
from shardwise.codec.batches import BatchCounts, batch_counts
from shardwise.codec.codecs import Zstd
from strategies import examples


def _since(before: BatchCounts) -> BatchCounts:
    now = batch_counts()
    return BatchCounts(
        now.encodes - before.encodes,
        now.decodes - before.decodes,
        now.fallbacks - before.fallbacks,
    )


def _data(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (np.arange(n) % 251 + rng.integers(1, 4, n)).astype("f8")


CHAINS = {
    "zstd": [ZstdCodec(level=1)],
    "zstd+crc32c": [ZstdCodec(level=1), Crc32cCodec()],
}


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_small_zstd_chunks_are_compressed_and_decoded_in_batches(
    tmp_path: Path, chain: str
) -> None:
    """64 chunks of 4 KiB per shard: the write compresses them in batch calls, every read
    (whole, one thread, a part, lazily) decodes them in batch calls and falls back none."""
    x = _data(512 * 256)
    root = str(tmp_path / "a")
    before = batch_counts()
    shardwise.write_array(x, root, chunks=512, shards=512 * 64, compressors=CHAINS[chain])
    wrote = _since(before)
    assert wrote.encodes >= 4 and wrote.fallbacks == 0  # one call (at least) per shard
    part = slice(1000, 90000)
    reads = [
        (lambda: shardwise.read_array(root), x),
        (lambda: shardwise.read_array(root, threads=1), x),
        (lambda: shardwise.read_array(root, part), x[part]),
        (lambda: shardwise.open_array(root, chunks=512 * 64).compute(), x),
    ]
    for read, want in reads:
        before = batch_counts()
        got = read()
        seen = _since(before)
        assert seen.decodes >= 1, "the batched decode was not taken"
        assert seen.fallbacks == 0, "a batch decode fell back on good chunks"
        assert seen.encodes == 0
        assert_bit_equal(got, want, "read")


def test_large_chunks_take_no_batch(tmp_path: Path) -> None:
    """Chunks of 64 KiB and more are compressed and decoded one call each: no batch counted."""
    x = _data(8192 * 8)
    root = str(tmp_path / "a")
    before = batch_counts()
    shardwise.write_array(x, root, chunks=8192, shards=8192 * 4, compressors=CHAINS["zstd"])
    assert_bit_equal(shardwise.read_array(root), x, "read")
    assert _since(before) == BatchCounts()


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_a_failing_batch_decode_falls_back_to_the_right_values(
    tmp_path: Path, chain: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every batch decode made to fail: each read still gives the stored values, decoded one by
    one, and each fallback is counted; no batch decode is."""
    x = _data(512 * 128, seed=1)
    x[512 * 3 : 512 * 5] = 0  # two fill chunks among stored ones
    root = str(tmp_path / "a")
    shardwise.write_array(x, root, chunks=512, shards=512 * 64, compressors=CHAINS[chain])

    def failing(self: Zstd, buf: Any, segs: Any, size: int) -> Any:
        raise ValueError("zstd: injected batch failure")

    monkeypatch.setattr(Zstd, "multi_decode", failing)
    for read in (
        lambda: shardwise.read_array(root),
        lambda: shardwise.read_array(root, threads=1),
        lambda: shardwise.open_array(root, chunks=512 * 64).compute(),
    ):
        before = batch_counts()
        assert_bit_equal(read(), x, "read through the fallback")
        seen = _since(before)
        assert seen.fallbacks >= 2 and seen.decodes == 0


@examples(25)
@given(
    chunks_per_shard=st.integers(1, 150),
    shards=st.integers(1, 3),
    tail=st.integers(0, 511),
    fill_every=st.sampled_from([0, 2, 3, 7]),
    chain=st.sampled_from(sorted(CHAINS)),
    endian=st.sampled_from(["little", "big"]),
    threads=st.sampled_from([None, 1, 3]),
)
def test_every_batch_size_round_trips(
    fresh_dir: Any,
    read_zarr: Any,
    read_tensorstore: Any,
    chunks_per_shard: int,
    shards: int,
    tail: int,
    fill_every: int,
    chain: str,
    endian: str,
    threads: int | None,
) -> None:
    c = 512  # 4 KiB of f8 per chunk: 64 chunks per encode batch
    per_shard = chunks_per_shard * c
    # a last shard of ``tail`` elements (a partial chunk among them), else whole shards
    n = (shards - 1) * per_shard + tail if tail else shards * per_shard
    x = _data(n, seed=chunks_per_shard)
    if fill_every:
        for i in range(0, -(-n // c), fill_every):
            x[i * c : (i + 1) * c] = 0
    root = fresh_dir("batches")
    codecs = CHAINS[chain]
    serializer = BytesCodec(endian=endian)  # type: ignore[arg-type]
    kw = dict(chunks=c, shards=c * chunks_per_shard, compressors=codecs, serializer=serializer)
    shardwise.write_array(x, str(root / "sw"), **kw)
    assert_bit_equal(shardwise.read_array(str(root / "sw"), threads=threads), x, "shardwise")
    assert_bit_equal(read_zarr(str(root / "sw")), x, "zarr-python")
    assert_bit_equal(read_tensorstore(root / "sw"), x, "tensorstore")
    z = zarr.create_array(str(root / "zp"), shape=x.shape, dtype=x.dtype, fill_value=0, **kw)
    z[...] = x
    assert_bit_equal(shardwise.read_array(str(root / "zp"), threads=threads), x, "of zarr-python")
    part = slice(n // 3, n - n // 4)
    lazy = shardwise.open_array(str(root / "zp"), chunks=c * 7)
    assert_bit_equal(lazy[part].compute(), x[part], "of zarr-python, part")
