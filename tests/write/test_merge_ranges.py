"""Merges that move only what changed (issue 44, item 2): on local files and S3 a shard merge
reads the index and the chunks it merges, writes the changed chunks and the new index, and the
store copies the rest (``copy_file_range``; ``UploadPartCopy``); a MemoryStore merges whole
shards, and the report says which way each merge went. Random update sequences equal numpy's
on all three; the meter shows at most 1.1x the touched chunks plus the index read and written;
a merge stopped at any step (an error, a SIGKILL) leaves the previous shard readable and no
temp file or upload behind; a commit of another writer between read and commit is merged
again; moto checks multipart conditions and ranges as S3 does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardwise
import shardwise.storage.conditional as cond
import shardwise.storage.splice as splice
from faultkit import BUCKET, MotoS3, moto_s3
from shardwise.codec.index import ShardIndex, index_slice
from shardwise.storage.nodes import open_info
from shardwise.storage.store import ShardStore

SHAPE, CHUNKS, SHARDS = (24, 30), (4, 5), (12, 15)


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


def store_of(kind: str, s3: MotoS3 | None, tmp: Path) -> Any:
    if kind == "local":
        return tmp / f"{uuid.uuid4().hex}.zarr"
    if kind == "memory":
        return zarr.storage.MemoryStore()
    assert s3 is not None
    return s3.obstore(f"ranges-{uuid.uuid4().hex[:8]}")


EXPECTED = {"local": "local ranges", "memory": "whole", "s3": "s3 ranges"}


@st.composite
def updates(draw: Any) -> list[tuple[tuple[slice, ...], int]]:
    out = []
    for _ in range(draw(st.integers(1, 8))):
        region = []
        for n in SHAPE:
            a = draw(st.integers(0, n - 1))
            region.append(slice(a, draw(st.integers(a + 1, min(n, a + 9)))))
        out.append((tuple(region), draw(st.integers(-3, 3))))
    return out


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_random_update_sequences_equal_numpys(
    kind: str, s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random update sequences, some of them filling chunks with the fill value (0), some
    calls through RegionWriter and some region writes: the values equal numpy's, every merge
    went the store's way, and verify finds every shard sound. (On S3 with parts of 64 bytes,
    the server's smallest part lowered to match: these shards are small.)"""
    import moto.s3.models

    import shardwise.storage.s3_splice as s3_splice

    monkeypatch.setattr(s3_splice, "MIN_PART", 64)
    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 64)

    @settings(
        max_examples=12 if kind == "s3" else 25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(ups=updates(), batch=st.booleans())  # fmt: skip
    def run(ups: list[Any], batch: bool) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            store = store_of(kind, s3, Path(tmp))
            want = np.arange(np.prod(SHAPE), dtype="i4").reshape(SHAPE) % 7
            shardwise.write_array(want, store, path="a", chunks=CHUNKS, shards=SHARDS)
            merges: list[str] = []
            if batch:
                with shardwise.RegionWriter(store, path="a") as w:
                    for region, value in ups:
                        w.write(region, value)
                        want[region] = value
                assert w.report is not None
                merges = w.report.merges
            else:
                for region, value in ups:
                    block = np.full([r.stop - r.start for r in region], value, "i4")
                    rep = shardwise.write_array(block, store, path="a", region=region, mode="r+")
                    want[region] = value
                    merges += rep.merges
            np.testing.assert_array_equal(shardwise.read_array(store, path="a"), want)
            # whole: a shard emptied, or on S3 one without a range worth a copy part
            assert set(merges) <= {EXPECTED[kind], "whole"}
            seen.update(merges)
            assert shardwise.verify(store, path="a").ok

    seen: set[str] = set()
    run()
    assert EXPECTED[kind] in seen


# -- bytes moved -------------------------------------------------------------------------------


def big(kind: str, s3: MotoS3 | None, tmp: Path) -> tuple[Any, np.ndarray, int]:
    """An array of one shard of 4 inner chunks of random (incompressible) bytes: 256 KiB each
    on local files, 6 MiB on S3 (parts other than the last are 5 MiB or more)."""
    n = (6 << 20) if kind == "s3" else (256 << 10)
    store = store_of(kind, s3, tmp)
    values = np.random.default_rng(1).integers(0, 255, 4 * n, dtype="u1")
    shardwise.write_array(values, store, path="a", chunks=(n,), shards=(4 * n,))
    return store, values, n


def chunk_sizes(store: Any) -> tuple[list[int], int]:
    """The stored sizes of the shard's inner chunks and of its index."""
    st_ = ShardStore(zarr.storage.LocalStore(store) if isinstance(store, Path) else store, "a")
    codec = open_info(st_.store, "a").codec
    data = st_.get("c/0")
    assert data is not None
    index = ShardIndex.from_bytes(codec, data[index_slice(codec, len(data))], len(data), "c/0")
    return [int(n) for n in index.lengths], codec.index_nbytes


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_merge_moves_at_most_1_1x_the_touched_chunks_and_the_index(
    kind: str, s3: MotoS3, tmp_path: Path
) -> None:
    """A 10-byte update of chunk 1: the report's bytes read are at most 1.1x (chunk 1 as it
    was + the index) and its bytes written at most 1.1x (chunk 1 as it is + the index), the
    write's markers and records included; the other three chunks are copied by the store."""
    store, values, n = big(kind, s3, tmp_path)
    before, index_nbytes = chunk_sizes(store)
    rep = shardwise.write_array(np.zeros(10, "u1") + 7, store, path="a", mode="r+",
                                region=(slice(n + 5, n + 15),))  # fmt: skip
    values[n + 5 : n + 15] = 7
    after, _ = chunk_sizes(store)
    assert rep.merges == [EXPECTED[kind]]
    assert rep.bytes_read <= 1.1 * (before[1] + index_nbytes)
    assert rep.bytes_written <= 1.1 * (after[1] + index_nbytes)
    assert rep.bytes_copied == before[0] + before[2] + before[3]
    np.testing.assert_array_equal(shardwise.read_array(store, path="a"), values)
    # the shard's record is a spliced one (the ranges written and their crc32c, no
    # whole-object checksum without reading the copies): strict verify matches it
    assert shardwise.verify(store, path="a", strict=True).ok


def test_a_memory_store_merges_whole_shards_and_says_so() -> None:
    store = zarr.storage.MemoryStore()
    shardwise.write_array(np.arange(64, dtype="u1"), store, path="a", chunks=(8,), shards=(64,))
    rep = shardwise.write_array(np.ones(2, "u1"), store, path="a", mode="r+",
                                region=(slice(3, 5),))  # fmt: skip
    assert rep.merges == ["whole"] and rep.bytes_copied == 0
    assert rep.bytes_read >= 64  # the whole shard


# -- a merge stopped at each step ----------------------------------------------------------------

STEPS = {"local": ["temp", "copied", "commit"], "s3": ["part", "complete"]}


def leftovers(kind: str, store: Any, s3: MotoS3) -> list[str]:
    """Temp files beside the shards, or unfinished multipart uploads."""
    if kind == "local":
        return [p.name for p in Path(store).rglob("*.partial")]
    ups = s3.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
    return [u["Key"] for u in ups]


@pytest.mark.parametrize(("kind", "at"), [(k, s) for k, ss in STEPS.items() for s in ss])
def test_a_merge_stopped_at_any_step_leaves_the_previous_shard(
    kind: str, at: str, s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, values, n = big(kind, s3, tmp_path)

    def stop(name: str) -> None:
        if name == at:
            raise RuntimeError(f"stopped at {name}")

    monkeypatch.setattr(splice, "step_hook", stop)
    with (
        pytest.raises(RuntimeError, match=f"stopped at {at}"),
        shardwise.RegionWriter(store, path="a") as w,
    ):
        w.write((slice(n - 4, n + 4),), 9)
    np.testing.assert_array_equal(shardwise.read_array(store, path="a"), values)
    assert leftovers(kind, store, s3) == []
    monkeypatch.setattr(splice, "step_hook", None)
    with shardwise.RegionWriter(store, path="a") as w:  # the update again: it lands
        w.write((slice(n - 4, n + 4),), 9)
    values[n - 4 : n + 4] = 9
    np.testing.assert_array_equal(shardwise.read_array(store, path="a"), values)


KILLED = """
import os, signal, sys
import numpy as np
import shardwise, shardwise.storage.splice as splice
from faultkit import MotoS3
def stop(name):
    if name == sys.argv[3]:
        os.kill(os.getpid(), signal.SIGKILL)
splice.step_hook = stop
where = sys.argv[1] if sys.argv[2] == "local" else MotoS3(sys.argv[2], None).obstore(sys.argv[1])
shardwise.write_array(np.full(4, 9, "u1"), where, path="a", region=(slice(0, 4),), mode="r+")
"""


@pytest.mark.parametrize(
    ("kind", "at"), [(k, s) for k, ss in STEPS.items() for s in [*ss, "committed"]]
)
def test_a_merge_killed_at_any_step_leaves_the_previous_shard(
    kind: str, at: str, s3: MotoS3, tmp_path: Path
) -> None:
    """SIGKILL mid-merge, at each step: before the commit the previous shard reads back
    whole, after it (its record not written yet) the new one; verify finds no shard problem,
    only the write that did not finish and the temp file a local kill left beside the shard
    (which no reader sees); its resume lands the update and removes what the kill left (the
    temp file; on S3 the unfinished multipart upload)."""
    store, values, _ = big(kind, s3, tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    where = [str(store), "local"] if kind == "local" else [str(store.store.prefix), s3.endpoint]
    proc = subprocess.run([sys.executable, "-c", KILLED, *where, at], env=env, check=False)
    assert proc.returncode == -signal.SIGKILL
    landed = values.copy()
    landed[:4] = 9
    want = landed if at == "committed" else values
    np.testing.assert_array_equal(shardwise.read_array(store, path="a"), want)
    report = shardwise.verify(store, path="a")
    kinds = sorted(p.kind for p in report.problems)
    left = ["temp"] if kind == "local" and at != "committed" else []
    assert kinds == sorted(["incomplete", *left]), report.problems
    assert all(p.kind != "corrupt" for p in report.changes)
    assert len(leftovers(kind, store, s3)) == (0 if at == "committed" else 1)
    shardwise.write_array(np.full(4, 9, "u1"), store, path="a", region=(slice(0, 4),),
                          mode="r+", resume=True)  # fmt: skip
    np.testing.assert_array_equal(shardwise.read_array(store, path="a"), landed)
    assert shardwise.verify(store, path="a", strict=True).ok
    assert leftovers(kind, store, s3) == []


def test_another_writers_commit_between_read_and_commit_is_merged_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, values, n = big("local", None, tmp_path)
    seen: list[int] = []

    def other(name: str, attempt: int) -> None:
        seen.append(attempt)
        if attempt == 0:  # another writer's update of the same shard lands first
            monkeypatch.setattr(cond, "before_commit", None)
            shardwise.write_array(np.full(3, 5, "u1"), store, path="a", mode="r+",
                                  region=(slice(2 * n, 2 * n + 3),))  # fmt: skip
            monkeypatch.setattr(cond, "before_commit", other)

    monkeypatch.setattr(cond, "before_commit", other)
    rep = shardwise.write_array(np.full(3, 4, "u1"), store, path="a", mode="r+",
                                region=(slice(5, 8),))  # fmt: skip
    values[5:8], values[2 * n : 2 * n + 3] = 4, 5
    assert seen == [0, 1] and rep.conflicts_retried == 1
    np.testing.assert_array_equal(shardwise.read_array(store, path="a"), values)


# -- what moto checks ----------------------------------------------------------------------------


def test_moto_checks_multipart_conditions_and_ranges_as_s3(s3: MotoS3) -> None:
    """A completion with a stale ``If-Match``, a part copied from a stale version, a copy range
    past the end, and a part under 5 MiB before the last are refused."""
    from botocore.exceptions import ClientError

    c, key = s3.client, f"check-{uuid.uuid4().hex[:8]}"
    old = c.put_object(Bucket=BUCKET, Key=key, Body=b"x" * (6 << 20))["ETag"]
    c.put_object(Bucket=BUCKET, Key=key, Body=b"y" * (6 << 20))

    def attempt(body: bytes, when: dict[str, str], **copy: Any) -> None:
        up = c.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
        where = dict(Bucket=BUCKET, Key=key, UploadId=up)
        try:
            if copy:
                got = c.upload_part_copy(**where, PartNumber=1, CopySource=f"{BUCKET}/{key}",
                                         **copy)["CopyPartResult"]  # fmt: skip
            else:
                got = c.upload_part(**where, PartNumber=1, Body=body)
            last = c.upload_part(**where, PartNumber=2, Body=b"z")
            parts = [{"PartNumber": k, "ETag": p["ETag"]} for k, p in ((1, got), (2, last))]
            c.complete_multipart_upload(**where, MultipartUpload={"Parts": parts}, **when)
        finally:
            c.abort_multipart_upload(**where)

    codes = []
    stale = {"IfMatch": old}
    for body, when, copy in [
        (b"a" * (5 << 20), stale, {}),  # a stale If-Match on the completion
        (b"", {}, {"CopySourceRange": "bytes=0-5242879", "CopySourceIfMatch": old}),
        (b"", {}, {"CopySourceRange": f"bytes=0-{6 << 20}"}),  # one byte past the end
        (b"a" * 100, {}, {}),  # a first part under 5 MiB
    ]:
        with pytest.raises(ClientError) as e:
            attempt(body, when, **copy)
        codes.append(e.value.response["Error"]["Code"])
    assert codes == ["PreconditionFailed", "PreconditionFailed", "InvalidRange", "EntityTooSmall"]


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_shard_zarr_python_wrote_is_merged_by_ranges_and_reads_back_in_zarr(
    where: str, tmp_path: Path
) -> None:
    """Shards written by zarr-python, their index at the start or the end, uncompressed: a
    region across two shards is merged by ranges, and zarr-python reads what numpy has."""
    root = tmp_path / "z.zarr"
    arr = zarr.create_array(
        zarr.storage.LocalStore(root), name="a", shape=(64, 64), dtype="i4", chunks=(32, 32),
        serializer=zarr.codecs.ShardingCodec(chunk_shape=(8, 8), index_location=where),
        compressors=None,
    )  # fmt: skip
    values = np.arange(64 * 64, dtype="i4").reshape(64, 64)
    arr[...] = values
    rep = shardwise.write_array(np.full((3, 3), -1, "i4"), root, path="a", mode="r+",
                                region=(slice(5, 8), slice(30, 33)))  # fmt: skip
    values[5:8, 30:33] = -1
    assert rep.merges == ["local ranges"] * 2 and rep.bytes_copied > 0
    np.testing.assert_array_equal(zarr.open_array(root, path="a")[...], values)


def test_where_the_kernel_cannot_copy_the_ranges_go_through_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``copy_file_range`` (another system, another filesystem): the same shard, its
    ranges read and written by the process, and counted so."""
    store, values, _ = big("local", None, tmp_path)
    before, _ = chunk_sizes(store)
    monkeypatch.delattr(os, "copy_file_range")
    rep = shardwise.write_array(np.full(4, 3, "u1"), store, path="a", mode="r+",
                                region=(slice(5, 9),))  # fmt: skip
    values[5:9] = 3
    assert rep.merges == ["local ranges"] and rep.bytes_copied == 0
    assert rep.bytes_read >= sum(before)  # chunk 0 to merge, chunks 1-3 to copy
    np.testing.assert_array_equal(shardwise.read_array(store, path="a"), values)


def test_on_s3_a_merge_changing_every_chunk_reads_the_shard_once(
    s3: MotoS3, tmp_path: Path
) -> None:
    """Every inner chunk changed: nothing to copy, so after its index the shard is read and
    written whole, once (no chunk read twice)."""
    store, values, n = big("s3", s3, tmp_path)
    size = sum(chunk_sizes(store)[0]) + chunk_sizes(store)[1]
    ups = [(slice(k * n, k * n + 2),) for k in range(4)]
    with shardwise.RegionWriter(store, path="a") as w:
        for reg in ups:
            w.write(reg, 1)
            values[reg] = 1
    assert w.report is not None and w.report.merges == ["whole"]
    assert w.report.bytes_read <= 1.01 * size + 8192  # the index, the shard, the journal
    np.testing.assert_array_equal(shardwise.read_array(store, path="a"), values)
