"""Resume: an interrupted write rerun with resume=True skips what it stored, ends byte-identical.

Interruptions here are deterministic (a source block that raises, temp files a killed writer
leaves, a multipart upload abandoned on S3); random SIGKILLs of the whole writer are in
test_faults.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

import shardwise
from faultkit import (
    BUCKET,
    MotoS3,
    files,
    moto_s3,
    records,
    settle,
    snapshot,
    stored_without,
    temp_files,
    unique,
    wait_until,
)
from shardwise.durability.journal import RECORDS
from shardwise.durability.records import read_records
from shardwise.durability.verify import verify
from shardwise.storage.store import ShardStore

SHAPE = (40, 36)
KW: dict[str, Any] = dict(chunks=(4, 4), shards=(8, 12), fill_value=0)
NSHARDS = 5 * 3


def data(seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).integers(1, 50, SHAPE).astype("int16")
    x[:8, :12] = 0  # one shard of fill: never stored
    return x


def failing(
    x: np.ndarray,
    chunks: Any,
    bad: tuple[int, int],
    root: Any,
    region: tuple[slice, ...] | None = None,
) -> Any:
    """``x`` as dask, with block ``bad`` raising once every other shard task is done.

    ``region``: where ``x`` goes in the array (default: all of it).
    """
    src = da.from_array(x, chunks=chunks)
    origin = [0] * x.ndim if region is None else [r.start for r in region]
    lo = [sum(c[:b]) + o for c, b, o in zip(src.chunks, bad, origin, strict=True)]
    block = tuple(slice(a, a + c[b]) for a, c, b in zip(lo, src.chunks, bad, strict=True))
    if region is None:
        want = stored_without(x, KW["shards"], block)
    else:  # every shard the region touches is rewritten (the array holds no fill)
        covered = np.zeros(SHAPE, "int8")
        covered[region] = 1
        want = stored_without(covered, KW["shards"], block)
    # records from before this write (a region write into an existing array) do not count
    before = records(root) if isinstance(root, Path) else {}

    def f(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
        assert block_info is not None
        if tuple(block_info[0]["chunk-location"]) == bad:
            if isinstance(root, Path):
                settle(root, want, before)
            else:  # a remote store: its record objects
                store = ShardStore(root)
                wait_until(
                    lambda: len(store.list(RECORDS)) >= want,
                    f"{want} shard records on {root}",
                    every=0.1,
                )
            raise RuntimeError("interrupted")
        return block

    return src.map_blocks(f, dtype=x.dtype, meta=x[:0, :0])


def interrupted(
    root: Any, x: np.ndarray, chunks: Any = (8, 12), bad: Any = (4, 1), **kw: Any
) -> None:
    # the failing block stops exactly the shard tasks it feeds (the direct strategy's shape;
    # staged writes are interrupted in test_staged.py)
    kw = {"strategy": "direct", **kw}
    with dask.config.set(scheduler="threads", num_workers=4), pytest.raises(RuntimeError):
        shardwise.write_array(failing(x, chunks, bad, root), root, **{**KW, **kw})


@pytest.fixture
def reference(tmp_path: Path) -> dict[str, bytes]:
    root = tmp_path / "ref.zarr"
    shardwise.write_array(data(), root, **KW)
    return files(root)


@pytest.mark.parametrize(
    "chunks", [(8, 12), (7, 5), (20, 36)], ids=["aligned", "misaligned", "two"]
)
def test_resume_skips_stored_shards_and_ends_identical(
    tmp_path: Path, reference: dict[str, bytes], chunks: Any
) -> None:
    root = tmp_path / "a.zarr"
    bad = (len(range(0, 40, chunks[0])) - 1, 0)
    interrupted(root, data(), chunks=chunks, bad=bad)
    stored = {k for k in files(root) if k != "zarr.json"}
    assert stored and stored < set(reference)
    # what a killed writer leaves: its temp file and a zarr-style one
    (root / "c/4/2.0123456789abcdef0123456789abcdef.partial").parent.mkdir(exist_ok=True)
    (root / "c/4/2.0123456789abcdef0123456789abcdef.partial").write_bytes(b"half a shard")
    (root / "zarr.fedcba9876543210fedcba9876543210.partial").write_bytes(b"")
    assert [p.kind for p in verify(root).problems].count("temp") == 2

    report = shardwise.write_array(data(), root, resume=True, **KW)
    assert report.shards_skipped == len(stored)
    assert report.shards_written + report.shards_skipped == NSHARDS - 1
    assert files(root) == reference
    assert temp_files(root) == []
    assert verify(root).ok


def test_resume_of_a_finished_write_skips_every_stored_shard(
    tmp_path: Path, reference: dict[str, bytes]
) -> None:
    """Nothing to do: every stored shard skipped, the all-fill one found absent again, the
    store (journal included: marker, records) byte-identical, the report saying so."""
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **KW)
    before = snapshot(root)
    report = shardwise.write_array(data(), root, resume=True, **KW)
    assert (report.shards_skipped, report.shards_written) == (NSHARDS - 1, 0)
    assert files(root) == reference
    assert snapshot(root) == before
    assert report.nothing_to_do and "nothing to do: the write had finished" in str(report)


def test_a_shard_changed_since_is_rewritten(tmp_path: Path, reference: dict[str, bytes]) -> None:
    root = tmp_path / "a.zarr"
    interrupted(root, data())
    other = tmp_path / "other.zarr"
    shardwise.write_array(data(7), other, **KW)
    (root / "c/1/1").write_bytes((other / "c/1/1").read_bytes())  # valid, but not ours
    (root / "c/2/0").unlink()  # recorded, then lost
    assert {p.kind for p in verify(root, strict=True).problems} == {
        "mismatch",
        "missing",
        "incomplete",
    }
    report = shardwise.write_array(data(), root, resume=True, **KW)
    assert "c/1/1" in report.keys and "c/2/0" in report.keys
    assert files(root) == reference


def test_resume_of_a_region_write_merges_once(tmp_path: Path) -> None:
    base = np.full(SHAPE, 3, "int16")
    region = (slice(5, 37), slice(2, 30))  # cuts shards: partial shards are merged
    new = data()[region]
    ref, root = tmp_path / "ref.zarr", tmp_path / "a.zarr"
    for r in (ref, root):
        shardwise.write_array(base, r, **KW)
    shardwise.write_array(new, ref, mode="r+", region=region)

    with dask.config.set(scheduler="threads", num_workers=4), pytest.raises(RuntimeError):
        shardwise.write_array(
            failing(new, (8, 8), (3, 2), root, region),
            root,
            mode="r+",
            region=region,
            strategy="direct",
        )
    report = shardwise.write_array(new, root, mode="r+", region=region, resume=True)
    assert report.shards_skipped > 0
    assert files(root) == files(ref)
    expect = base.copy()
    expect[region] = new
    np.testing.assert_array_equal(zarr.open_array(root)[...], expect)
    assert verify(root).ok


def test_resume_onto_other_metadata(tmp_path: Path, reference: dict[str, bytes]) -> None:
    root = tmp_path / "a.zarr"
    interrupted(root, data())
    other = {**KW, "chunks": (2, 2)}
    with pytest.raises(FileExistsError, match="nothing to resume"):
        shardwise.write_array(data(), root, resume=True, **other)
    # mode 'w' replaces an array it cannot resume
    shardwise.write_array(data(), root, mode="w", resume=True, **other)
    assert verify(root).ok
    assert files(root) != reference


def test_resume_needs_a_write_to_resume_in_mode_w_minus(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    z = zarr.create_array(root, shape=SHAPE, dtype="int16", **KW)
    z[...] = data()
    with pytest.raises(FileExistsError):
        shardwise.write_array(data(), root, resume=True, **KW)


def test_resume_in_mode_w_without_an_interrupted_write_rewrites(
    tmp_path: Path, reference: dict[str, bytes]
) -> None:
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(5), root, **KW)
    report = shardwise.write_array(data(), root, mode="w", resume=True, **KW)
    assert report.shards_skipped == 0  # other data, other region write: nothing adopted
    assert files(root) == reference


def test_records_follow_the_shards(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **KW)
    recs = read_records(ShardStore(zarr.storage.LocalStore(root)))
    assert set(recs) == {k for k in files(root) if k != "zarr.json"}
    assert all(r is not None and r.size == (root / k).stat().st_size for k, r in recs.items())
    # a shard rewritten as all fill is deleted, and so is its record
    shardwise.write_array(
        np.zeros((8, 12), "int16"), root, mode="r+", region=(slice(8, 16), slice(0, 12))
    )
    assert not (root / "c/1/0").exists() and not (root / RECORDS / "c/1/0").exists()
    assert verify(root).ok


# -- S3: abandoned multipart uploads -------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


def test_a_direct_write_leaves_multipart_uploads_alone(s3: MotoS3) -> None:
    """A direct write stores each shard with one put, never in parts: its finish looks for no
    multipart uploads, and an upload open at one of its shards' keys is not its to abort (the
    mutation lane's write/pipeline: ``_Finish.__call__``'s ``multipart=kind != "direct"``)."""
    prefix = unique()
    store = s3.obstore(prefix)
    upload = s3.client.create_multipart_upload(Bucket=BUCKET, Key=f"{prefix}/c/1/1")["UploadId"]
    report = shardwise.write_array(data(), store, **KW)
    assert report.shards_written == NSHARDS - 1
    parts = s3.client.list_parts(Bucket=BUCKET, Key=f"{prefix}/c/1/1", UploadId=upload)
    assert parts.get("Parts", []) == []  # still open: not aborted
    s3.client.abort_multipart_upload(Bucket=BUCKET, Key=f"{prefix}/c/1/1", UploadId=upload)
    np.testing.assert_array_equal(shardwise.open_array(store).compute(), data())


def test_resume_aborts_abandoned_multipart_uploads(s3: MotoS3) -> None:
    prefix, neighbour = unique(), unique()
    store = s3.obstore(prefix)
    interrupted(store, data())
    # a killed writer's upload of a shard, and someone else's upload next door
    mine = s3.client.create_multipart_upload(Bucket=BUCKET, Key=f"{prefix}/c/4/1")["UploadId"]
    theirs = s3.client.create_multipart_upload(Bucket=BUCKET, Key=f"{neighbour}/c/4/1")

    def uploads() -> set[str]:  # of these two prefixes: the server is shared with other tests
        page = s3.client.list_multipart_uploads(Bucket=BUCKET)
        keys = {u["Key"] for u in page.get("Uploads", [])}
        return {k for k in keys if k.split("/", 1)[0] in (prefix, neighbour)}

    assert uploads() == {f"{prefix}/c/4/1", f"{neighbour}/c/4/1"}
    report = shardwise.write_array(data(), store, resume=True, **KW)
    assert report.shards_skipped > 0
    assert uploads() == {f"{neighbour}/c/4/1"}
    with pytest.raises(s3.client.exceptions.NoSuchUpload):
        s3.client.list_parts(Bucket=BUCKET, Key=f"{prefix}/c/4/1", UploadId=mine)
    s3.client.abort_multipart_upload(
        Bucket=BUCKET, Key=f"{neighbour}/c/4/1", UploadId=theirs["UploadId"]
    )
    np.testing.assert_array_equal(shardwise.open_array(store).compute(), data())
    assert verify(store).ok


def test_resume_of_a_finished_write_in_runs_changes_nothing(tmp_path: Path) -> None:
    """A write of more shards than tasks records them per run (``.shardwise/runs/``): resumed
    once finished it finds every shard done there (the all-fill ones stored nowhere), writes
    nothing, leaves every file as it was and says so."""
    root = tmp_path / "runs.zarr"
    values = np.arange(64 * 128, dtype="f4").reshape(64, 128)
    values[:2] = 0  # one row of all-fill shards: stored nowhere, recorded nowhere
    first = shardwise.write_array(values, root, chunks=(1, 2), shards=(2, 2), fill_value=0)
    assert (first.shards_written, first.shards_empty) == (2048 - 64, 64)
    assert list((root / ".shardwise" / "runs").iterdir())  # recorded per run
    before = snapshot(root)
    again = shardwise.write_array(
        values, root, chunks=(1, 2), shards=(2, 2), fill_value=0, resume=True
    )
    assert snapshot(root) == before
    assert (again.shards_written, again.shards_skipped) == (0, 2048 - 64)
    assert again.nothing_to_do
    assert verify(root).ok


# -- the temp files of tasks cut off in other processes, at the end of a write --------------------

LEFT = "c/1/0.0123456789abcdef0123456789abcdef.partial"  # a worker's put cut off by its end


def test_a_write_on_other_workers_removes_a_dead_workers_temp_file(tmp_path: Path) -> None:
    """Tasks that may run in other processes: one such ended mid-put leaves its temp file,
    which the write's end removes (it lists the shards' directories)."""
    root = tmp_path / "a.zarr"

    def elsewhere(dsk: Any, keys: Any, **kw: Any) -> Any:  # as a worker process would
        (root / LEFT).parent.mkdir(parents=True, exist_ok=True)
        (root / LEFT).write_bytes(b"half a shard")
        return dask.threaded.get(dsk, keys, **kw)

    with dask.config.set(scheduler=elsewhere):
        shardwise.write_array(da.from_array(data(), chunks=(8, 12)), root, **KW)
    assert temp_files(root) == []
    assert verify(root).ok


@pytest.mark.parametrize("scheduler", ["threads", "synchronous", "numpy"])
def test_a_write_on_this_process_lists_no_directory_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheduler: str
) -> None:
    """Every task ran here (dask's threads, its synchronous scheduler, a numpy source's
    threads): each put removed its own temp file on any error, so the end of the write lists
    no directory, and leaves no temp file."""
    import shardwise.write.session as session

    listed: list[Any] = []
    real = session.remove_temp_files

    def spy(*a: Any, **k: Any) -> list[str]:
        listed.append(a)
        return real(*a, **k)

    monkeypatch.setattr(session, "remove_temp_files", spy)
    root = tmp_path / "a.zarr"
    x = data()
    source = x if scheduler == "numpy" else da.from_array(x, chunks=(7, 5))
    with dask.config.set(scheduler="threads" if scheduler == "numpy" else scheduler):
        report = shardwise.write_array(source, root, **KW)
    assert report.shards_written == NSHARDS - 1
    assert listed == [] and temp_files(root) == []
    assert verify(root).ok
    # a rerun with resume=True still removes what a killed run of it left (it lists)
    (root / LEFT).write_bytes(b"half a shard")
    shardwise.write_array(source, root, resume=True, **KW)
    assert len(listed) == 1 and temp_files(root) == []
