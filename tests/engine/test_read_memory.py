"""Memory of the reader, measured where it is spent: the peak resident memory of one read in a
fresh process, native allocations (zstd's, numpy's) included (``memkit.peak_rss``).

The array is 32 MiB of compressible uint16 in 32 KiB inner chunks, zstd-compressed, stored in
2 MiB or in 8 MiB shards. A read holds its output and, per decoding thread, a reused buffer of a
few inner chunks: shards 4x larger must cost no more. The budget is a byte count written out
here with its reasoning, not derived from the implementation's constants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import zarr

import shardwise
from faultkit import record_figures
from memkit import MiB, peak_rss, smooth

SHAPE = (4096, 4096)  # 32 MiB of uint16
CHUNKS = (128, 128)  # 32 KiB inner chunks
ZSTD: dict[str, Any] = dict(compressors=[zarr.codecs.ZstdCodec(level=1)])
# beyond the 32 MiB output: per decoding thread (2) a group of inner chunks' stored bytes, their
# decoded stack and one joined copy (about 1 MiB each), the shard indexes, zstd's decompression
# contexts and the threads' malloc arenas; 8 MiB, whatever the shard
FIXED = 8 * MiB


def read_case(root: str, how: str) -> Any:
    """read_array, or the compute() of open_array's lazy array (its default, shard-aligned
    chunks), with two threads; the output is allocated during the read and counted."""
    if how == "read_array":
        return lambda: shardwise.read_array(root, threads=2)
    lazy = shardwise.open_array(root, threads=2)
    return lambda: lazy.compute(scheduler="threads", num_workers=2)


@pytest.mark.parametrize("how", ["read_array", "compute"])
def test_a_read_holds_its_output_and_a_fixed_budget_whatever_the_shard(
    tmp_path: Path, how: str
) -> None:
    x = smooth(SHAPE)
    peaks = {}
    for shards in ((1024, 1024), (2048, 2048)):  # 2 MiB and 8 MiB shards
        root = str(tmp_path / f"s{shards[0]}")
        shardwise.write_array(x, root, chunks=CHUNKS, shards=shards, **ZSTD)
        got = peak_rss(read_case, root=root, how=how)
        assert got.digest == {"shape": list(SHAPE), "sum": float(x.sum(dtype="f8"))}
        peaks[f"shard_{shards[0] * shards[1] * 2 // MiB}MiB"] = got.peak
    record_figures(f"rss-read-{how}", peaks)
    for name, peak in peaks.items():
        assert peak <= x.nbytes + FIXED, (name, peak - x.nbytes, peaks)
    # 4x larger shards cost no more: a buffer the size of a shard would add 6 MiB here
    assert abs(peaks["shard_8MiB"] - peaks["shard_2MiB"]) <= 2 * MiB, peaks
