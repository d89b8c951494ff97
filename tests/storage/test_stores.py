"""Round trips through every kind of store: S3 (moto's server on 127.0.0.1) through zarr's
ObjectStore (obstore) and FsspecStore (s3fs), MemoryStore, LocalStore, paths and URL strings.

zarr-python reading the same store is the oracle; shardwise reads whole arrays and small windows
(the window path fetches the shard index and then byte ranges of the needed inner chunks).
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from zarr.abc.store import Store
from zarr.storage import FsspecStore, LocalStore, MemoryStore, ObjectStore

import shardwise
from shardwise import CorruptShardError
from shardwise.engine.read import open_reader

SHAPE = (45, 38)
INNER = (4, 5)
SHARDS = (16, 15)
FILL = -1.0
BUCKET = "shardwise-test"
CREDS = {"key": "testing", "secret": "testing", "region": "us-east-1"}

WINDOWS = [
    (slice(1, 3), slice(1, 4)),  # inside one inner chunk
    (slice(3, 9), slice(7, 22)),  # across inner chunks and a shard boundary
    (slice(14, 33), slice(0, 38)),  # rows of three shards
    (slice(40, 45), slice(33, 38)),  # the edge shard
    (slice(20, 21), slice(16, 17)),  # one element
]


def make_data(seed: int = 0) -> np.ndarray:
    data = np.random.default_rng(seed).normal(size=SHAPE).astype("float32")
    data[:16, :15] = FILL  # shard (0, 0) holds only fill: not stored
    data[16:20, 15:20] = FILL  # one fill inner chunk
    return data


def write(data: Any, store: Any, **kw: Any) -> Any:
    kw.setdefault("chunks", INNER)
    kw.setdefault("shards", SHARDS)
    kw.setdefault("fill_value", FILL)
    return shardwise.write_array(data, store, **kw)


def check_reads(store: Any, data: np.ndarray, path: str | None = None, **kw: Any) -> None:
    """shardwise (whole, windows, dask) and zarr-python all read ``data`` back."""
    reader = open_reader(store, path=path, **kw)
    np.testing.assert_array_equal(reader[:, :], data)
    for w in WINDOWS:
        np.testing.assert_array_equal(reader[w], data[w])
    lazy = shardwise.open_array(store, path=path, chunks=(10, 9), **kw)
    np.testing.assert_array_equal(lazy.compute(scheduler="threads"), data)
    np.testing.assert_array_equal(lazy[3:9, 7:22].compute(scheduler="threads"), data[3:9, 7:22])


def zarr_read(store: Any, path: str | None = None) -> np.ndarray:
    return np.asarray(zarr.open_array(store, path=path or "", mode="r")[...])


# -- S3 on moto's server -------------------------------------------------------------------------


@dataclass(frozen=True)
class S3:
    endpoint: str
    client: Any  # boto3 S3 client, to look at the bucket independently

    @property
    def storage_options(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint,
            "key": CREDS["key"],
            "secret": CREDS["secret"],
            "client_kwargs": {"region_name": CREDS["region"]},
        }

    def obstore(self, prefix: str) -> ObjectStore[Any]:
        from obstore.store import S3Store

        s3 = S3Store(
            BUCKET,
            prefix=prefix,
            endpoint=self.endpoint,
            access_key_id=CREDS["key"],
            secret_access_key=CREDS["secret"],
            region=CREDS["region"],
            client_options={"allow_http": True},
        )
        return ObjectStore(s3)

    def fsspec(self, prefix: str) -> FsspecStore:
        return FsspecStore.from_url(f"s3://{BUCKET}/{prefix}", storage_options=self.storage_options)

    def keys(self, prefix: str) -> set[str]:
        out: set[str] = set()
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=prefix + "/"
        )
        for page in pages:
            out.update(o["Key"][len(prefix) + 1 :] for o in page.get("Contents", []))
        return out

    def get(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=BUCKET, Key=key, Body=body)


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    from faultkit import moto_s3

    with moto_s3(BUCKET) as server:
        yield S3(server.endpoint, server.client)


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


S3_KINDS = ["obstore", "fsspec"]


def s3_store(s3: S3, kind: str, prefix: str) -> Store:
    return s3.obstore(prefix) if kind == "obstore" else s3.fsspec(prefix)


@pytest.mark.parametrize("kind", S3_KINDS)
def test_s3_round_trip(s3: S3, kind: str, prefix: str) -> None:
    data = make_data()
    store = s3_store(s3, kind, prefix)
    with dask.config.set(scheduler="threads"):
        report = write(da.from_array(data, chunks=(7, 11)), store, path="arr")
    want = {"c/0/1", "c/0/2", "c/1/0", "c/1/1", "c/1/2", "c/2/0", "c/2/1", "c/2/2"}
    assert report.keys == sorted(want)
    # exactly the shards and the metadata are in the bucket: no temporary or partial objects
    arr_keys = {k[len("arr/") :] for k in s3.keys(prefix) if k.startswith("arr/")}
    assert {k for k in arr_keys if k.startswith("c/")} == want
    assert "zarr.json" in arr_keys
    assert report.bytes_stored == sum(len(s3.get(f"{prefix}/arr/{k}")) for k in want)
    np.testing.assert_array_equal(zarr_read(store, "arr"), data)
    check_reads(store, data, path="arr")


def test_s3_obstore_and_fsspec_read_each_other(s3: S3, prefix: str) -> None:
    data = make_data(1)
    write(data, s3.obstore(prefix), path="a")
    write(data * 2, s3.fsspec(prefix), path="b")
    check_reads(s3.fsspec(prefix), data, path="a")
    check_reads(s3.obstore(prefix), data * 2, path="b")


@pytest.mark.parametrize("kind", S3_KINDS)
def test_s3_region_write_and_fill_removes_object(s3: S3, kind: str, prefix: str) -> None:
    data = make_data()
    store = s3_store(s3, kind, prefix)
    write(data, store)
    assert "c/2/2" in s3.keys(prefix)
    patch = np.arange(5 * 9, dtype="float32").reshape(5, 9)
    write(patch, store, mode="r+", region=(slice(12, 17), slice(10, 19)))  # four shards in part
    expected = data.copy()
    expected[12:17, 10:19] = patch
    # shard (2, 2) becomes fill only: its object is deleted
    report = write(
        np.full((13, 8), FILL, "float32"), store, mode="r+", region=(slice(32, 45), slice(30, 38))
    )
    expected[32:45, 30:38] = FILL
    assert report.shards_deleted == 1
    assert "c/2/2" not in s3.keys(prefix)
    np.testing.assert_array_equal(zarr_read(store), expected)
    check_reads(store, expected)


def test_s3_url_strings(s3: S3, prefix: str) -> None:
    data = make_data(2)
    url = f"s3://{BUCKET}/{prefix}/url"
    report = write(data, url, storage_options=s3.storage_options)
    assert report.shards_written == 8
    check_reads(url, data, storage_options=s3.storage_options)
    np.testing.assert_array_equal(zarr_read(s3.obstore(f"{prefix}/url")), data)
    with pytest.raises(FileExistsError):
        write(data, url, storage_options=s3.storage_options)


@pytest.mark.parametrize("kind", S3_KINDS)
@pytest.mark.parametrize("damage", ["empty", "shorter_than_index", "truncated", "flipped"])
def test_s3_corrupt_shard(s3: S3, kind: str, prefix: str, damage: str) -> None:
    data = make_data()
    store = s3_store(s3, kind, prefix)
    write(data, store)
    key = f"{prefix}/c/1/1"
    raw = s3.get(key)
    body = {
        "empty": b"",
        "shorter_than_index": raw[:20],
        "truncated": raw[:-7],
        "flipped": raw[:-1] + bytes([raw[-1] ^ 1]),
    }[damage]
    s3.put(key, body)
    reader = open_reader(store)
    for sel in [(slice(None), slice(None)), (slice(17, 19), slice(16, 18))]:
        with pytest.raises(CorruptShardError) as info:
            reader[sel]
        assert info.value.key == "c/1/1"
    # the other shards still read
    np.testing.assert_array_equal(reader[32:45, :], data[32:45, :])


@pytest.mark.parametrize("kind", S3_KINDS)
def test_s3_missing_shard_reads_as_fill(s3: S3, kind: str, prefix: str) -> None:
    data = make_data()
    store = s3_store(s3, kind, prefix)
    write(data, store)
    s3.client.delete_object(Bucket=BUCKET, Key=f"{prefix}/c/1/1")
    expected = data.copy()
    expected[16:32, 15:30] = FILL
    check_reads(store, expected)


@pytest.mark.parametrize("kind", S3_KINDS)
def test_s3_reader_pickles(s3: S3, kind: str, prefix: str) -> None:
    data = make_data()
    store = s3_store(s3, kind, prefix)
    write(data, store)
    reader = open_reader(store)
    np.testing.assert_array_equal(reader[3:9, 7:22], data[3:9, 7:22])
    clone = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(clone[:, :], data)
    np.testing.assert_array_equal(clone[20:30, 2:31], data[20:30, 2:31])


# -- in memory and local --------------------------------------------------------------------------


def test_memory_store_round_trip() -> None:
    data = make_data()
    store = MemoryStore()
    with dask.config.set(scheduler="threads"):
        report = write(da.from_array(data, chunks=(9, 4)), store, path="g/a")
    assert report.shards_written == 8
    assert sorted(k for k in store._store_dict if k.startswith("g/a/c/")) == [
        f"g/a/{k}" for k in report.keys
    ]
    np.testing.assert_array_equal(zarr_read(store, "g/a"), data)
    check_reads(store, data, path="g/a")


LocalFactory = Callable[[Path], Any]
LOCAL: dict[str, LocalFactory] = {
    "LocalStore": lambda p: LocalStore(p),
    "str": lambda p: str(p),
    "Path": lambda p: p,
    "file_url": lambda p: f"file://{p}",
}


@pytest.mark.parametrize("kind", sorted(LOCAL))
def test_local_round_trip(tmp_path: Path, kind: str) -> None:
    data = make_data()
    root = tmp_path / "store.zarr"
    report = write(data, LOCAL[kind](root), path="arr")
    files = {
        str(p.relative_to(root / "arr")) for p in (root / "arr" / "c").rglob("*") if p.is_file()
    }
    assert files == set(report.keys)
    np.testing.assert_array_equal(zarr_read(str(root), "arr"), data)
    check_reads(LOCAL[kind](root), data, path="arr")


def test_local_write_tensorstore_reads(
    tmp_path: Path, read_tensorstore: Callable[[Path], np.ndarray]
) -> None:
    data = make_data()
    write(data, str(tmp_path))
    np.testing.assert_array_equal(read_tensorstore(tmp_path), data)


def test_open_missing_local_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_reader(str(tmp_path / "absent"))
    assert not (tmp_path / "absent").exists()  # reading never creates a directory


def test_unsupported_store_argument() -> None:
    with pytest.raises(TypeError, match="store"):
        write(make_data(), 42)


@pytest.mark.parametrize("scratch_max", [1, 1 << 30], ids=["fresh-bytes", "reused-buffer"])
def test_local_whole_shard_reads_with_and_without_the_reused_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scratch_max: int
) -> None:
    """Local shards are read by ranges (groups of inner chunks) into a per-thread buffer reused
    from group to group, or, when a fetch is larger than SCRATCH_MAX, into a fresh buffer; either
    way every shard reads back as written."""
    import shardwise.storage.store

    monkeypatch.setattr(shardwise.storage.store, "SCRATCH_MAX", scratch_max)
    rng = np.random.default_rng(3)
    data = rng.integers(0, 1000, size=(40, 36), dtype="int32")
    shardwise.write_array(data, str(tmp_path), chunks=(4, 6), shards=(8, 12), fill_value=0)
    with dask.config.set(scheduler="threads", num_workers=2):
        got = shardwise.open_array(str(tmp_path)).compute()
    np.testing.assert_array_equal(got, data)
    reader = open_reader(str(tmp_path))
    reader.threads = 1  # one thread reads shard after shard through the same buffer
    np.testing.assert_array_equal(reader[:, :], data)
