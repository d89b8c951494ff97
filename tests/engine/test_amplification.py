"""What a write moves, reported by every write and predicted by its plan: requests, bytes read
and bytes written through the store layer, against the bytes the data changed.

A small region of a big shard reads the stored shard and writes it whole (the merge keeps the
untouched chunks' encoded bytes, but the shard is one object); the report says so, and the
counts are those of the objects really read and stored (their sizes on disk or on the S3
server), not estimates.
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


def test_a_small_region_of_a_big_shard_moves_the_whole_shard(tmp_path: Path) -> None:
    """An 8 x 8 region of a 256 x 256 shard: the shard is read once and written once, about
    (old + new shard) / 256 bytes changed; the plan says the same before the write."""
    root = tmp_path / "a.zarr"
    shardwise.write_array(source(), root, path="a", chunks=CHUNKS, shards=SHARDS)
    old = (root / "a" / "c" / "0" / "0").stat().st_size
    values = np.ones((8, 8), "f4")
    plan = shardwise.plan_write(values, root, path="a", region=REGION, mode="r+")
    assert plan.requests.bytes_read == plan.requests.bytes_written == SHAPE[0] ** 2 * 4
    assert plan.requests.amplification == 2 * SHAPE[0] ** 2 * 4 / 256
    assert "moves: 256.0 KiB read, 256.0 KiB written" in str(plan)
    report = shardwise.write_array(values, root, path="a", region=REGION, mode="r+")
    new = (root / "a" / "c" / "0" / "0").stat().st_size
    assert report.raw_bytes == 256
    assert old <= report.bytes_read <= old + 2048  # the shard, and the journal's small objects
    assert new <= report.bytes_written <= new + 2048
    assert report.amplification > (old + new) / 256 > 1000
    np.testing.assert_array_equal(zarr.open_array(root, path="a")[REGION], values)


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
