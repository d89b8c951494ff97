"""Memory of the direct write path: what a shard task holds beyond its block, and numpy sources
read in place (dask's ``from_array`` would copy the whole array first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import zarr

import shardwise
from faultkit import traced_peak
from shardwise.runtime.units import UNIT_BYTES

ZSTD: dict[str, Any] = dict(compressors=[zarr.codecs.ZstdCodec(level=1)])


def _smooth(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Compressible uint16 data: a slow ramp along every axis plus a little noise."""
    rng = np.random.default_rng(seed)
    ramp = sum(
        np.arange(n).reshape([-1 if i == j else 1 for j in range(len(shape))]) // 8
        for i, n in enumerate(shape)
    )
    return (ramp + rng.integers(0, 2, size=shape)).astype("uint16")


@pytest.mark.parametrize("strategy", ["direct", "staged"])
def test_a_numpy_source_is_written_in_place(tmp_path: Path, strategy: str) -> None:
    """write_array of a 32 MiB numpy array in 2 MiB shards, one task at a time: the peak is one
    shard's worth of buffers, not a copy of the array."""
    x = _smooth((64, 512, 512))
    kw: dict[str, Any] = dict(chunks=(8, 64, 64), shards=(8, 256, 512), strategy=strategy, **ZSTD)
    with dask.config.set(scheduler="sync"):
        shardwise.write_array(x[:8], tmp_path / "warm", **kw)  # lazy imports, pool buffers
        peak = traced_peak(lambda: shardwise.write_array(x, tmp_path / "a", **kw))
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a", mode="r")[...], x)
    shard = 8 * 256 * 512 * 2
    bound = 3 * shard + 2**20  # the block, its encoded chunks, the pool's buffers, slack
    assert bound < x.nbytes / 4
    assert peak <= bound, (peak, x.nbytes)


def test_a_write_computed_later_writes_the_array_as_it_was(tmp_path: Path) -> None:
    """With compute=False the source is copied (as dask does): changing the array before the
    write runs does not change what is written."""
    x = _smooth((32, 64, 64))
    want = x.copy()
    for strategy in ("direct", "staged"):
        root = tmp_path / strategy
        later = shardwise.write_array(
            x, root, chunks=(8, 16, 16), shards=(16, 32, 32), strategy=strategy, compute=False
        )
        x[...] = 7
        later.compute()
        np.testing.assert_array_equal(zarr.open_array(root, mode="r")[...], want)
        x[...] = want


def test_a_shard_task_holds_its_block_and_encoded_chunks_only(tmp_path: Path) -> None:
    """Encoding a 32 MiB shard stacks no shard-sized copy: beyond the (existing) block, the
    peak is the encoded chunks plus a small buffer per encoding thread, whatever the shard."""
    from shardwise.codec.shard import encode_shard
    from shardwise.engine.read import open_reader

    x = _smooth((64, 512, 512))
    shardwise.write_array(x, tmp_path / "a", chunks=(8, 64, 64), shards=(64, 512, 512), **ZSTD)
    codec = open_reader(str(tmp_path / "a")).info.codec
    encode_shard(codec, x, threads=2)  # the pool threads' buffers exist before the count
    encoded: list[Any] = []
    peak = traced_peak(lambda: encoded.append(encode_shard(codec, x, threads=2)))
    (enc,) = encoded
    assert enc.nbytes < x.nbytes / 4  # compressible: the bound below is about the buffers
    assert peak <= enc.nbytes + 2 * x.nbytes // 8 + 4 * UNIT_BYTES + 2**20, (peak, enc.nbytes)


def test_a_merge_holds_one_shard_buffer_beyond_its_block(tmp_path: Path) -> None:
    """Merging a piece into a stored 32 MiB shard (the direct path for shards a region covers in
    part): the overlaid shard is encoded through the units, with no second stacked copy."""
    from shardwise.codec.shard import merge_shard
    from shardwise.engine.read import open_reader

    x = _smooth((64, 512, 512))
    shardwise.write_array(x, tmp_path / "a", chunks=(8, 64, 64), shards=(64, 512, 512), **ZSTD)
    codec = open_reader(str(tmp_path / "a")).info.codec
    old = (tmp_path / "a" / "c" / "0" / "0" / "0").read_bytes()
    piece = (slice(3, 61), slice(0, 512), slice(0, 512))  # cuts the first and last chunk rows
    block = x[piece] + np.uint16(1)

    def merge() -> Any:
        return merge_shard(codec, old, block, piece, x.shape, "c/0/0/0", threads=2)

    merge()  # the pool threads' buffers exist before the count
    merged: list[Any] = []
    peak = traced_peak(lambda: merged.append(merge()))
    (enc,) = merged
    want = x.copy()
    want[piece] = block
    from shardwise.codec.shard import decode_shard_bytes

    np.testing.assert_array_equal(decode_shard_bytes(codec, enc.data, "c/0/0/0"), want)
    # the overlaid shard, its encoded chunks, a decoded chunk at a time and the units' buffers
    assert peak <= x.nbytes + enc.nbytes + 4 * 2**20 < 1.5 * x.nbytes + enc.nbytes, peak
