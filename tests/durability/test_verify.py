"""verify(): every shard's index, ranges, checksums and inner chunks, and the writer's records.

Each kind of problem is made for real in a stored array (bytes flipped, objects deleted, replaced,
truncated, temp files, stray keys, an interrupted write) and must be reported with its key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
from zarr.storage import LocalStore, MemoryStore

import shardwise
from faultkit import BUCKET, MotoS3, moto_s3, unique
from shardwise.durability.journal import RECORDS
from shardwise.durability.lease import Lease
from shardwise.durability.verify import verify
from shardwise.storage.store import ShardStore

SHAPE = (30, 26)
KW: dict[str, Any] = dict(
    chunks=(4, 4), shards=(8, 8), fill_value=0, compressors=[ZstdCodec(level=1), Crc32cCodec()]
)


def data(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 9, SHAPE).astype("int32")


@pytest.fixture
def arr(tmp_path: Path) -> Path:
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **KW)
    return root


def kinds(root: Any, **kw: Any) -> list[tuple[str, str]]:
    return sorted((p.kind, p.key) for p in verify(root, **kw).problems)


def changes(root: Any, **kw: Any) -> list[tuple[str, str]]:
    return sorted((p.kind, p.key) for p in verify(root, **kw).changes)


def flip(path: Path, at: int) -> None:
    b = bytearray(path.read_bytes())
    b[at] ^= 0x10
    path.write_bytes(bytes(b))


def test_a_clean_array_verifies(arr: Path) -> None:
    report = verify(arr)
    assert report.ok, str(report)
    assert report.shards_stored == report.shards_recorded == 16
    assert report.chunks_checked == sum(
        len(range(0, min(8, 30 - 8 * i), 4)) * len(range(0, min(8, 26 - 8 * j), 4))
        for i in range(4)
        for j in range(4)
    )
    assert report.bytes_read == sum(p.stat().st_size for p in (arr / "c").rglob("*") if p.is_file())
    assert "OK" in str(report) and json.loads(report.to_json())["ok"] is True


def test_corrupt_inner_chunk_names_the_chunk(arr: Path) -> None:
    flip(arr / "c/1/2", 3)  # inside the first stored inner chunk
    report = verify(arr)
    assert [(p.kind, p.key) for p in report.problems] == [("corrupt", "c/1/2")]
    # a problem only: never also a note of a sound shard not as the writer recorded it
    assert report.changes == [] and "sound but not" not in str(report)
    corrupt = report.problems[0]
    assert corrupt.chunk == (0, 0) and "crc32c" in corrupt.message.lower()


@pytest.mark.parametrize("how", ["index", "truncate", "empty", "append"])
def test_broken_index_is_reported(arr: Path, how: str) -> None:
    p = arr / "c/2/2"
    raw = p.read_bytes()
    if how == "index":
        flip(p, len(raw) - 10)
    elif how == "truncate":
        p.write_bytes(raw[: len(raw) // 2])
    elif how == "empty":
        p.write_bytes(b"")
    else:
        p.write_bytes(raw + b"\x00" * 7)
    assert kinds(arr) == [("corrupt", "c/2/2")]
    assert changes(arr) == []  # corrupt: a problem, not a sound shard rewritten
    assert kinds(arr, strict=True) == [("corrupt", "c/2/2")]


def test_a_deleted_shard_is_missing_not_fill(arr: Path) -> None:
    (arr / "c/3/0").unlink()
    report = verify(arr)
    assert [(p.kind, p.key) for p in report.problems] == [("missing", "c/3/0")]
    assert "fill" in report.problems[0].message
    # a reader would silently see fill values there: that is why verify reports it
    assert (shardwise.open_array(arr)[24:30, 0:8].compute() == 0).all()
    assert kinds(arr, strict=True) == [("missing", "c/3/0")]


def test_valid_bytes_that_are_not_the_writers_are_a_mismatch(arr: Path, tmp_path: Path) -> None:
    other = tmp_path / "b.zarr"
    shardwise.write_array(data(1), other, **KW)
    (arr / "c/0/1").write_bytes((other / "c/0/1").read_bytes())
    # sound bytes: a note, not a problem, unless strict
    report = verify(arr)
    assert report.ok and [(p.kind, p.key) for p in report.changes] == [("mismatch", "c/0/1")]
    assert "OK" in str(report) and "mismatch   c/0/1" in str(report)
    assert kinds(arr, strict=True) == [("mismatch", "c/0/1")]
    assert not verify(arr, strict=True).ok and verify(arr, strict=True).changes == []


def test_shards_the_writer_did_not_record(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    x = data()
    x[:8, :8] = 0
    shardwise.write_array(x, root, **KW)
    assert not (root / "c/0/0").exists()
    zarr.open_array(root, mode="r+")[0:8, 0:8] = 5  # another tool writes a shard
    assert kinds(root) == [] and changes(root) == [("unrecorded", "c/0/0")]
    assert kinds(root, strict=True) == [("unrecorded", "c/0/0")]


def test_temp_stray_and_unreadable_journal(arr: Path) -> None:
    (arr / "c/0/0.00112233445566778899aabbccddeeff.partial").write_bytes(b"x")
    (arr / "c/9").mkdir()
    (arr / "c/9/9").write_bytes(b"outside the grid")
    (arr / "notes.txt").write_text("hello")
    (arr / RECORDS / "c/1/1").write_bytes(b"{not json")
    assert kinds(arr) == [
        ("journal", ".shardwise/shards/c/1/1"),
        ("stray", "c/9/9"),
        ("stray", "notes.txt"),
        ("temp", "c/0/0.00112233445566778899aabbccddeeff.partial"),
    ]


def test_an_interrupted_write_and_an_open_batch(tmp_path: Path) -> None:
    from shardwise import batch

    root = tmp_path / "b.zarr"
    batch.init(root, shape=SHAPE, dtype="int32", parts=2, **KW)
    batch.write_part(data(), root, 0)
    report = verify(root)
    assert [p.kind for p in report.problems] == ["batch"]
    assert "1 of 2 parts done" in report.problems[0].message
    with Lease.acquire(ShardStore(LocalStore(root)), purpose="somebody"):
        assert any("somebody" in n for n in verify(root).notes)


def test_a_stopped_batch_part_is_advised_as_a_batch_part(tmp_path: Path) -> None:
    """A batch part whose source failed half-way: verify names the part and the command line
    that finishes it (``batch part ... --resume``), not the keyword of a Python call, and that
    rerun leaves the array clean once finalized."""
    import dask.array as da

    from shardwise import batch

    root = tmp_path / "b.zarr"
    batch.init(root, shape=SHAPE, dtype="int32", parts=2, **KW)

    def fail_second_block(b: np.ndarray, block_info: Any = None) -> np.ndarray:
        if block_info[None]["chunk-location"][0] == 3:  # rows 24:30, in the last part
            raise RuntimeError("the source failed")
        return b

    good = da.from_array(data(), chunks=(8, 26))
    with pytest.raises(RuntimeError, match="the source failed"):
        batch.write_part(good.map_blocks(fail_second_block, dtype="int32"), root, 1)
    report = verify(root)
    (stopped,) = [p for p in report.problems if p.kind == "incomplete"]
    assert "batch part 1 stopped: rerun it with --resume (shardwise batch part <store> " in (
        stopped.message
    )
    assert "--part 1 --resume" in stopped.message and "batch.write_part(" in stopped.message
    batch.write_part(good, root, 0)
    batch.write_part(good, root, 1, resume=True)
    batch.finalize(root)
    assert verify(root).ok and (shardwise.read_array(root) == data()).all()


def test_arrays_from_other_writers_get_integrity_checks(tmp_path: Path) -> None:
    import tensorstore as ts

    root = tmp_path / "ts.zarr"
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(root)},
        "metadata": {
            "shape": list(SHAPE),
            "data_type": "int32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [4, 4],
                        "codecs": [{"name": "bytes"}, {"name": "crc32c"}],
                    },
                }
            ],
        },
        "create": True,
    }
    t = ts.open(spec).result()
    t[...] = data()
    report = verify(root)
    assert report.ok and report.shards_recorded is None and report.shards_stored == 16
    assert "no writer records" in report.notes[0]
    flip(root / "c/1/1", 5)
    assert kinds(root) == [("corrupt", "c/1/1")]


def test_index_at_start_in_a_memory_store() -> None:
    store = MemoryStore()
    codec = ShardingCodec(
        chunk_shape=(4, 4),
        codecs=[BytesCodec(), ZstdCodec(), Crc32cCodec()],
        index_location="start",
    )
    zarr.create_array(
        store,
        name="g/x",
        shape=SHAPE,
        dtype="int32",
        chunks=(8, 8),
        serializer=codec,
        compressors=None,
        filters=None,
    )
    shardwise.write_array(data(), store, path="g/x", mode="r+")
    assert verify(store, path="g/x").ok
    key = "g/x/c/1/1"
    raw = bytearray(store._store_dict[key].to_bytes())
    raw[3] ^= 1  # inside the index, which is at the start
    store._store_dict[key] = store._store_dict[key].from_bytes(bytes(raw))
    assert kinds(store, path="g/x") == [("corrupt", key)]
    assert changes(store, path="g/x") == []  # corrupt: a problem only


def test_missing_metadata_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    report = verify(tmp_path / "x")
    assert [p.kind for p in report.problems] == ["metadata"]


# -- S3 -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


def test_verify_on_s3(s3: MotoS3) -> None:
    prefix = unique()
    store = s3.obstore(prefix)
    shardwise.write_array(data(), store, **KW)
    assert verify(store).ok
    s3.client.delete_object(Bucket=BUCKET, Key=f"{prefix}/c/1/1")
    body = s3.client.get_object(Bucket=BUCKET, Key=f"{prefix}/c/2/3")["Body"].read()
    s3.client.put_object(Bucket=BUCKET, Key=f"{prefix}/c/2/3", Body=body[:-3])
    assert kinds(store) == [("corrupt", "c/2/3"), ("missing", "c/1/1")]


def test_verify_a_dataset_group_written_by_to_zarr(tmp_path: Path) -> None:
    """A Dataset store is a group: every sharded variable is checked, appends are recorded."""
    import dask.array as da
    import xarray as xr

    path = tmp_path / "ds.zarr"
    ds = xr.Dataset({"v": (("t", "x"), da.random.random((100, 50), chunks=(30, 50)))})
    shardwise.to_zarr(ds, path, shards={"t": 40}, encoding={"v": {"chunks": (10, 50)}})
    shardwise.to_zarr(ds.isel(t=slice(0, 10)), path, append_dim="t")
    report = shardwise.verify(path)
    assert report.ok, str(report)
    assert report.shards_stored == report.shards_recorded == 3
    shard = path / "v" / "c" / "1" / "0"
    shard.write_bytes(shard.read_bytes()[:-3])
    report = shardwise.verify(path)
    assert not report.ok
    assert any("v/c/1/0" in p.key for p in report.problems)


def test_a_dataset_write_that_failed_before_its_metadata_is_advised_to_resume(
    tmp_path: Path,
) -> None:
    """A Dataset write stores its metadata after its data: one that failed before (or was
    killed) leaves journals and shards without any zarr.json. verify finds their open markers
    from the root and advises resume=True; the advised call finishes it and verify is clean."""
    import dask.array as da
    import xarray as xr

    def fail_at_block_1(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        if block_info is not None and block_info[0]["chunk-location"][0] == 1:
            raise RuntimeError("source block 1 failed")
        return block

    v = np.arange(60, dtype="int64").reshape(10, 6)
    src = da.from_array(v, chunks=(3, 6))
    ds = xr.Dataset({"v": (("t", "x"), src.map_blocks(fail_at_block_1, dtype=src.dtype))})
    enc = {"v": {"chunks": (2, 6), "shards": (4, 6)}}
    path = tmp_path / "ds.zarr"
    with pytest.raises(RuntimeError, match="source block 1"):
        shardwise.to_zarr(ds, path, encoding=enc)
    assert not (path / "zarr.json").exists() and not (path / "v" / "zarr.json").exists()
    report = shardwise.verify(path)
    assert [(p.kind, p.key.split("/")[0]) for p in report.problems] == [("incomplete", "v")]
    assert "rerun it with resume=True" in report.problems[0].message
    shardwise.to_zarr(ds.copy(data={"v": src}), path, encoding=enc, resume=True)
    assert shardwise.verify(path).ok
    np.testing.assert_array_equal(xr.open_zarr(path)["v"].values, v)


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_verify_lists_arrays_missing_from_consolidated_metadata(tmp_path: Path) -> None:
    """verify walks the stored nodes, not the root's consolidated listing: an array another
    writer added without re-consolidating is still checked."""
    import xarray as xr

    path = tmp_path / "ds.zarr"
    xr.Dataset({"a": ("t", np.arange(8))}).to_zarr(path, zarr_format=3, consolidated=True)
    shardwise.write_array(data(), LocalStore(path), path="b", mode="w-", **KW)
    shard = path / "b" / "c" / "1" / "1"
    shard.write_bytes(shard.read_bytes()[:-3])
    assert [p.key for p in shardwise.verify(path).problems] == ["b/c/1/1"]


# -- stores another tool wrote to: sound shards are notes, not problems ----------------------------


# xarray's own to_zarr writes consolidated metadata (its default), and zarr warns about it
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
def test_a_plain_xarray_append_is_a_note(tmp_path: Path) -> None:
    """``Dataset.to_zarr(append_dim=...)`` rewrites the last shard and adds new ones: all sound."""
    import xarray as xr

    path = tmp_path / "ds.zarr"
    rng = np.random.default_rng(0)
    ds = xr.Dataset({"v": (("t", "x"), rng.random((100, 50)))})
    shardwise.to_zarr(ds, path, shards={"t": 40}, encoding={"v": {"chunks": (10, 50)}})
    more = xr.Dataset({"v": (("t", "x"), rng.random((30, 50)))})
    more.to_zarr(path, append_dim="t", mode="a", zarr_format=3)
    report = verify(path)
    assert report.ok, str(report)
    assert sorted((p.kind, p.key) for p in report.changes) == [
        ("mismatch", "v/c/2/0"),  # the partial last shard, rewritten by the append
        ("unrecorded", "v/c/3/0"),
    ]
    assert "note:" in str(report) and "v/c/3/0" in str(report)
    assert json.loads(report.to_json())["changes"][0]["key"] == "v/c/2/0"
    strict = verify(path, strict=True)
    assert not strict.ok and {p.kind for p in strict.problems} == {"mismatch", "unrecorded"}
    # integrity still counts: damage in a shard the other tool wrote is a problem
    shard = path / "v" / "c" / "3" / "0"
    shard.write_bytes(shard.read_bytes()[:-5])
    assert [(p.kind, p.key) for p in verify(path).problems] == [("corrupt", "v/c/3/0")]


def test_a_zarr_region_write_is_a_note(arr: Path) -> None:
    """zarr-python rewrites recorded shards in place: they decode, so they are notes."""
    z = zarr.open_array(arr, mode="r+")
    z[8:16, 0:16] = 7
    report = verify(arr)
    assert report.ok, str(report)
    assert sorted((p.kind, p.key) for p in report.changes) == [
        ("mismatch", "c/1/0"),
        ("mismatch", "c/1/1"),
    ]
    assert report.chunks_checked > 0
    assert kinds(arr, strict=True) == [("mismatch", "c/1/0"), ("mismatch", "c/1/1")]
    # a deleted recorded shard stays a problem, strict or not
    (arr / "c/0/0").unlink()
    assert kinds(arr) == [("missing", "c/0/0")]
