"""What a write moves, reported by every write and predicted by its plan: requests, bytes read
and bytes written through the store layer, against the bytes the data changed.

A small region of a big shard on local files reads the shard's index and the inner chunks it
merges, and writes those and a new index (the kernel copies the rest: a range merge); a store
that cannot copy ranges (or an S3 shard with no 5 MiB range to copy) reads and writes the shard
whole. The report says so, and the counts are those of the objects really read and stored
(their sizes on disk or on the S3 server), not estimates.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import shardwise
from faultkit import BUCKET, MotoS3, moto_s3, unique

SHAPE, CHUNKS, SHARDS = (256, 256), (16, 16), (256, 256)  # one shard of 256 KiB raw
REGION = (slice(16, 24), slice(32, 40))  # 8 x 8 float32: 256 bytes changed


def source() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(SHAPE).astype("f4")


def files(root: Path) -> dict[str, int]:
    return {
        p.relative_to(root).as_posix(): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "zarr.json"
    }


def test_a_create_reports_the_bytes_it_stored(tmp_path: Path) -> None:
    """Every object a create leaves (the shard, its record, the done marker) is counted in
    ``bytes_written``; what it wrote and removed again (the open marker, the lease) is the
    rest, a few hundred bytes; nothing is read but the journal's few small objects."""
    root = tmp_path / "a.zarr"
    report = shardwise.write_array(source(), root, path="a", chunks=CHUNKS, shards=SHARDS)
    left = files(root / "a")
    assert sum(left.values()) <= report.bytes_written <= sum(left.values()) + 2048, left
    assert report.bytes_read <= 2048
    assert report.requests >= len(left)
    assert report.amplification == pytest.approx(report.bytes_written / SHAPE[0] ** 2 / 4, 0.05)
    assert f"in {report.requests} requests" in str(report)


def chunk_nbytes(shard: Path, chunk: tuple[int, int]) -> int:
    """The stored size of inner ``chunk`` of a shard whose index (little-endian, crc32c) is
    at its end."""
    n = (SHARDS[0] // CHUNKS[0]) * (SHARDS[1] // CHUNKS[1])
    raw = shard.read_bytes()[-(16 * n + 4) : -4]
    entries = np.frombuffer(raw, "<u8").reshape(SHARDS[0] // CHUNKS[0], -1, 2)
    return int(entries[chunk][1])


def test_a_small_region_of_a_big_shard_moves_its_chunk_and_the_index(tmp_path: Path) -> None:
    """An 8 x 8 region of a 256 x 256 shard on local files: a range merge reads the shard's
    index and the one inner chunk the region covers in part, writes that chunk and a new
    index, and the kernel copies the other 255 chunks (``bytes_copied``); the plan, which
    cannot know the stored chunks' sizes, gives the whole shard read and written as its upper
    bound before the write."""
    root = tmp_path / "a.zarr"
    shardwise.write_array(source(), root, path="a", chunks=CHUNKS, shards=SHARDS)
    shard = root / "a" / "c" / "0" / "0"
    index = 16 * (SHARDS[0] // CHUNKS[0]) * (SHARDS[1] // CHUNKS[1]) + 4
    old_chunk = chunk_nbytes(shard, (1, 2))  # REGION lies inside inner chunk (1, 2)
    values = np.ones((8, 8), "f4")
    plan = shardwise.plan_write(values, root, path="a", region=REGION, mode="r+")
    assert plan.requests.bytes_read == plan.requests.bytes_written == SHAPE[0] ** 2 * 4
    assert plan.requests.amplification == 2 * SHAPE[0] ** 2 * 4 / 256
    assert "moves: 256.0 KiB read, 256.0 KiB written" in str(plan)
    report = shardwise.write_array(values, root, path="a", region=REGION, mode="r+")
    new, new_chunk = shard.stat().st_size, chunk_nbytes(shard, (1, 2))
    assert report.raw_bytes == 256 and report.merges == ["local ranges"]
    # the index and the chunk merged, and the journal's small objects
    assert index + old_chunk <= report.bytes_read <= index + old_chunk + 2048
    assert index + new_chunk <= report.bytes_written <= index + new_chunk + 2048
    assert report.bytes_copied == new - index - new_chunk
    moved = report.bytes_read + report.bytes_written
    assert report.amplification == moved / 256 < plan.requests.amplification / 30  # 2048x
    np.testing.assert_array_equal(zarr.open_array(root, path="a")[REGION], values)
    assert shardwise.verify(root, path="a").ok


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


def test_the_region_write_on_s3_counts_the_objects_the_server_holds(s3: MotoS3) -> None:
    """The same on the S3 server: the bytes read are the stored shard's size as the server
    reports it, the bytes written at least the new shard's."""
    prefix = f"amp-{unique()}"
    store: Any = s3.obstore(prefix)
    shardwise.write_array(source(), store, path="a", chunks=CHUNKS, shards=SHARDS)
    key = f"{prefix}/a/c/0/0"
    old = s3.client.head_object(Bucket=BUCKET, Key=key)["ContentLength"]
    report = shardwise.write_array(np.ones((8, 8), "f4"), store, path="a", region=REGION, mode="r+")
    new = s3.client.head_object(Bucket=BUCKET, Key=key)["ContentLength"]
    assert old <= report.bytes_read <= old + 2048
    assert new <= report.bytes_written <= new + 2048
