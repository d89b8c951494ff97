"""Memory of the writers, measured where it is spent: the peak resident memory of one write in a
fresh process, native allocations (zstd's, numpy's) included (``memkit.peak_rss``).

Every write here is of 32 MiB of compressible uint16 in 64 KiB inner chunks, zstd-compressed, on
dask's synchronous scheduler (one task at a time, so the peak is the largest task's) with two
encoding threads. The budgets are byte counts written out here, each with its reasoning: they do
not follow the implementation's constants, so raising one of those fails a test instead of
loosening it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

import shardwise
from faultkit import record_figures
from memkit import MiB, peak_rss, smooth

SHAPE = (64, 512, 512)  # 32 MiB of uint16
CHUNKS = (8, 64, 64)  # 64 KiB inner chunks
ZSTD: dict[str, Any] = dict(compressors=[zarr.codecs.ZstdCodec(level=1)])


# -- the operations, run in the measuring process (top-level: memkit imports them by name) -------


def write_case(root: str, strategy: str, shards: list[int], blocks: list[int] | None) -> Any:
    """write_array of the 32 MiB array: the numpy array itself (``blocks`` None), or a dask
    array of ``blocks`` computed from it (each task makes its block, as a real source does). The
    numpy array is resident before the baseline."""
    x = smooth(SHAPE)
    src = x if blocks is None else da.from_array(x, chunks=tuple(blocks)) * np.uint16(1)

    def op() -> None:
        with dask.config.set(scheduler="sync"):
            shardwise.write_array(
                src, root, chunks=CHUNKS, shards=tuple(shards), strategy=strategy, threads=2, **ZSTD
            )

    return op


def merge_case(root: str, lo: int, hi: int) -> Any:
    """A region write of rows ``lo:hi`` into the stored array: the shards it covers in part are
    read, merged with the new rows and stored again."""
    block = smooth(SHAPE)[lo:hi] + np.uint16(1)

    def op() -> None:
        with dask.config.set(scheduler="sync"):
            shardwise.write_array(block, root, region=(slice(lo, hi), ...), mode="r+", threads=2)

    return op


def encode_case(root: str) -> Any:
    """encode_shard of one whole 32 MiB shard (the block a direct task holds, resident before)."""
    from shardwise.codec.shard import encode_shard
    from shardwise.engine.read import open_reader

    x = smooth(SHAPE)
    codec = open_reader(root).info.codec
    return lambda: encode_shard(codec, x, threads=2).data


# -- the tests -----------------------------------------------------------------------------------


def _write(tmp_path: Path, name: str, strategy: str, shards: tuple[int, ...], blocks: Any) -> int:
    root = str(tmp_path / name)
    peak = peak_rss(write_case, root=root, strategy=strategy, shards=shards, blocks=blocks).peak
    np.testing.assert_array_equal(zarr.open_array(root, mode="r")[...], smooth(SHAPE))
    return peak


def test_a_direct_task_holds_at_most_three_shards(tmp_path: Path) -> None:
    """The direct writer by design holds a shard's block, its encoded chunks and, for small
    chunks, the joined shard: its budget is in shard multiples, for shards 4x larger too."""
    peaks = {}
    for shards in ((8, 256, 512), (16, 512, 512)):  # 2 MiB and 8 MiB shards, one block each
        shard = int(np.prod(shards)) * 2
        peaks[shard] = _write(tmp_path, f"d{shards[0]}", "direct", shards, list(shards))
    record_figures("rss-direct-write", {f"shard_{s // MiB}MiB": p for s, p in peaks.items()})
    for shard, peak in peaks.items():
        # the block (1x), its encoded chunks and the joined shard (up to 1x each: incompressible
        # data); 2 MiB for the encoding threads' buffers, zstd's contexts and the index
        assert peak <= 3 * shard + 2 * MiB, (shard, peak, peaks)


def test_a_numpy_source_is_written_in_place(tmp_path: Path) -> None:
    """A numpy source is read in place: the direct task of an 8 MiB shard holds its encoded
    chunks, not a copy of its block (dask's from_array, or any copy, would add 8 to 32 MiB)."""
    peak = _write(tmp_path, "n", "direct", (16, 512, 512), None)
    record_figures("rss-direct-write-numpy", {"shard_8MiB": peak})
    # the encoded chunks and the joined shard (about 1.5 MiB each: this data compresses about
    # 5x); 2 MiB for the encoding threads' buffers, zstd's contexts and the index
    assert peak <= 5 * MiB + 2 * MiB, peak


def test_a_staged_write_holds_the_same_whatever_the_shard(tmp_path: Path) -> None:
    """The staged writer's task holds one 4 MiB dask block and its encoded chunks, or the
    streaming buffer while it assembles a shard: shards 4x larger stay in the same budget."""
    peaks = {}
    for shards in ((16, 512, 512), (64, 512, 512)):  # 8 MiB and 32 MiB shards
        peaks[shards[0] // 2] = _write(tmp_path, f"s{shards[0]}", "staged", shards, [8, 512, 512])
    record_figures("rss-staged-write", {f"shard_{s}MiB": p for s, p in peaks.items()})
    # a 4 MiB block and its encoded chunks (about 1 MiB), and the 8 MiB streaming buffer each
    # thread keeps once it has assembled a shard; 5 MiB of zstd contexts and thread arenas
    # (measured with a 64 KiB array), 4 MiB of slack
    budget = 22 * MiB
    assert max(peaks.values()) <= budget < 32 * MiB, peaks  # never a whole large shard
    # 4x larger shards cost no more: a shard-sized buffer would add 24 MiB here
    assert abs(peaks[32] - peaks[8]) <= 2 * MiB, peaks


def test_a_region_merge_holds_its_shard_and_the_new_rows(tmp_path: Path) -> None:
    """A region write of rows 3:61 into an array of two 16 MiB shards covers both in part: each
    is read, decoded, overlaid and encoded again, one at a time."""
    root = str(tmp_path / "m")
    x = smooth(SHAPE)
    shardwise.write_array(x, root, chunks=CHUNKS, shards=(32, 512, 512), **ZSTD)
    got = peak_rss(merge_case, root=root, lo=3, hi=61)
    want = x.copy()
    want[3:61] += np.uint16(1)
    np.testing.assert_array_equal(zarr.open_array(root, mode="r")[...], want)
    record_figures("rss-region-merge", {"shard_16MiB": got.peak})
    shard = 16 * MiB
    # the decoded shard with the new rows laid over it (1x), its stored and its new encoded
    # bytes (up to 1x together: incompressible data); 2 MiB for the encoding threads' buffers,
    # zstd's contexts and the index
    assert got.peak <= 2 * shard + 2 * MiB, got


def test_encoding_a_shard_stacks_no_shard_sized_copy(tmp_path: Path) -> None:
    """encode_shard of a 32 MiB block (what a direct task calls): beyond the block (resident
    before), the encoded chunks and a few small buffers per thread."""
    root = str(tmp_path / "a")
    shardwise.write_array(smooth(SHAPE), root, chunks=CHUNKS, shards=SHAPE, **ZSTD)
    got = peak_rss(encode_case, root=root)
    stored = (tmp_path / "a" / "c" / "0" / "0" / "0").stat().st_size
    record_figures("rss-encode-shard", {"peak": got.peak, "encoded": stored})
    assert stored < 16 * MiB  # compressible: the budget below is not a shard in disguise
    # the encoded shard (its chunks, then joined: 2x); 3 MiB for the encoding threads' buffers
    # and zstd's contexts
    assert got.peak <= 2 * stored + 3 * MiB < 32 * MiB, (got, stored)


def test_a_write_computed_later_writes_the_array_as_it_was(tmp_path: Path) -> None:
    """With compute=False the source is copied (as dask does): changing the array before the
    write runs does not change what is written."""
    x = smooth((32, 64, 64))
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
