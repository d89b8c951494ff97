"""HPC batch writes: init, N shard-disjoint parts, finalize.

The split is pure (hypothesis checks it covers the array with disjoint, aligned parts); the
writes go to real local stores. Parts run as separate OS processes in test_cli.py.
"""

from __future__ import annotations

import collections
import itertools
import json
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from zarr.abc.store import Store
from zarr.codecs import ZstdCodec
from zarr.storage import LocalStore, WrapperStore

import shardwise
from faultkit import files, settle, snapshot
from shardwise import (
    InvalidTypeError,
    InvalidValueError,
    LeaseHeldError,
    PlanError,
    VerifyError,
    batch,
)
from shardwise.core.layout import Layout, is_aligned
from shardwise.durability.lease import Lease, part_lease
from shardwise.durability.verify import verify
from shardwise.storage.store import ShardStore

SHAPE = (50, 44)
KW: dict[str, Any] = dict(chunks=(5, 4), shards=(10, 12), fill_value=0)


def data(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 7, SHAPE).astype("uint8")


# -- the split (pure) ----------------------------------------------------------------------------


@st.composite
def layouts_and_n(draw: Any) -> tuple[Layout, int]:
    nd = draw(st.integers(1, 3))
    chunk = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    shard = tuple(c * draw(st.integers(1, 3)) for c in chunk)
    shape = tuple(draw(st.integers(1, 30)) for _ in range(nd))
    lay = Layout(shape, shard, chunk)
    return lay, draw(st.integers(1, lay.nshards))


@given(layouts_and_n())
def test_split_parts_cover_the_array_disjointly_on_shard_boundaries(ln: tuple[Layout, int]) -> None:
    lay, n = ln
    parts = batch.split_parts(lay, n)
    assert len(parts) == n
    owner = np.full(lay.shard_grid, -1)
    for i, r in enumerate(parts):
        assert is_aligned(r, lay)
        for s in lay.shards_touching(r):
            assert owner[s] == -1, "two parts share a shard"
            owner[s] = i
    assert (owner >= 0).all()
    batch.check_parts(lay, parts)  # the explicit-region path accepts them too


def test_too_many_parts() -> None:
    with pytest.raises(PlanError, match="at most 4 parts"):
        batch.split_parts(Layout((20, 20), (10, 10), (5, 5)), 5)


def test_split_is_balanced_slabs() -> None:
    lay = Layout((100, 30), (10, 10), (5, 5))
    sizes = [r[0].stop - r[0].start for r in batch.split_parts(lay, 4)]
    assert sizes == [20, 30, 20, 30] and sum(sizes) == 100
    # more parts than shard rows: rows split along the next axis too
    lay = Layout((20, 30), (10, 10), (5, 5))
    parts = batch.split_parts(lay, 5)
    assert [tuple((s.start, s.stop) for s in r) for r in parts] == [
        ((0, 10), (0, 10)),
        ((0, 10), (10, 20)),
        ((0, 10), (20, 30)),
        ((10, 20), (0, 10)),
        ((10, 20), (10, 30)),
    ]


def test_misaligned_regions_are_refused_with_the_nearest_aligned_split() -> None:
    lay = Layout(SHAPE, KW["shards"], KW["chunks"])
    with pytest.raises(PlanError) as e:
        batch.check_parts(lay, [(slice(0, 26), slice(None)), (slice(26, 50), slice(None))])
    msg = str(e.value)
    assert "part 0 region [0:26, 0:44] would share shards" in msg
    assert "nearest aligned split: [0:30, 0:44]" in msg
    with pytest.raises(PlanError, match=r"nearest aligned split: \[20:50, 0:24\]"):
        batch.check_parts(lay, [(slice(20, 50), slice(0, 22))])
    # the array end counts as a boundary
    batch.check_parts(lay, [(slice(40, 50), slice(36, 44))])
    with pytest.raises(PlanError, match="share shards"):
        batch.check_parts(lay, [(slice(0, 20), slice(None)), (slice(10, 30), slice(None))])


def test_nearest_aligned_never_collapses() -> None:
    lay = Layout((100,), (10,), (5,))
    assert batch.nearest_aligned(lay, (slice(3, 4),)) == (slice(0, 10),)
    assert batch.nearest_aligned(lay, (slice(96, 100),)) == (slice(90, 100),)
    for a, b in itertools.combinations(range(0, 101, 7), 2):
        r = batch.nearest_aligned(lay, (slice(a, b),))
        assert r[0].stop > r[0].start and is_aligned(r, lay)


# -- the three steps -----------------------------------------------------------------------------


@pytest.fixture
def reference(tmp_path: Path) -> dict[str, bytes]:
    root = tmp_path / "ref.zarr"
    shardwise.write_array(data(), root, **KW)
    return files(root)


def test_init_parts_finalize_equals_one_write(tmp_path: Path, reference: dict[str, bytes]) -> None:
    root = tmp_path / "b.zarr"
    plan = batch.init(root, shape=SHAPE, dtype="uint8", parts=3, **KW)
    assert plan.nparts == 3 and batch.open_batch(root) == plan
    computed: list[Any] = []

    def seen(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
        assert block_info is not None
        computed.append(block_info[0]["array-location"][0])
        return block

    lazy = da.from_array(data(), chunks=(10, 44)).map_blocks(
        seen, dtype="uint8", meta=np.empty((0, 0), "uint8")
    )
    for i in (2, 0, 1):
        computed.clear()
        rep = batch.write_part(lazy, root, i)  # the whole array: only part i is computed
        rows = plan.region(i)[0]
        assert all(rows.start <= a < rows.stop for a, _ in computed)
        assert rep.shards_written == len(
            list(Layout(SHAPE, (10, 12), (5, 4)).shards_touching(plan.region(i)))
        )
    report = batch.finalize(root)
    assert report.ok and report.shards_stored == 20
    assert files(root) == reference
    with pytest.raises(FileNotFoundError):
        batch.open_batch(root)
    assert verify(root).ok


def test_finalize_names_missing_parts_and_keeps_the_batch_open(tmp_path: Path) -> None:
    root = tmp_path / "b.zarr"
    plan = batch.init(root, shape=SHAPE, dtype="uint8", parts=4, **KW)
    for i in (0, 3):
        batch.write_part(data()[plan.region(i)], root, i)  # just the part's data also works
    with pytest.raises(VerifyError) as e:
        batch.finalize(root)
    assert "2 of 4 parts not done: [1, 2]" in str(e.value)
    assert batch.open_batch(root) == plan
    for i in (1, 2):
        batch.write_part(data(), root, i)
    assert batch.finalize(root).ok


def test_a_second_copy_of_a_part_is_refused_other_parts_are_not(tmp_path: Path) -> None:
    root = tmp_path / "b.zarr"
    batch.init(root, shape=SHAPE, dtype="uint8", parts=2, **KW)
    sstore = ShardStore(LocalStore(root))
    with Lease.acquire(sstore, name=part_lease(0, 2), purpose="the first copy of part 0"):
        with pytest.raises(LeaseHeldError, match="the first copy of part 0"):
            batch.write_part(data(), root, 0)
        batch.write_part(data(), root, 1)
        with pytest.raises(LeaseHeldError, match="parts still running"):
            batch.finalize(root)
    batch.write_part(data(), root, 0)
    assert batch.finalize(root).ok


def test_whole_array_writes_wait_for_the_batch(tmp_path: Path) -> None:
    root = tmp_path / "b.zarr"
    batch.init(root, shape=SHAPE, dtype="uint8", parts=2, **KW)
    with pytest.raises(LeaseHeldError, match="batch write in progress"):
        shardwise.write_array(data(), root, mode="r+")
    with (
        Lease.acquire(ShardStore(LocalStore(root)), purpose="a whole-array writer"),
        pytest.raises(LeaseHeldError, match="a whole-array writer"),
    ):
        batch.write_part(data(), root, 0)


def test_init_is_idempotent_and_guarded(tmp_path: Path) -> None:
    root = tmp_path / "b.zarr"
    plan = batch.init(root, shape=SHAPE, dtype="uint8", parts=2, **KW)
    assert batch.init(root, shape=SHAPE, dtype="uint8", parts=2, **KW) == plan  # a requeued init
    with pytest.raises(FileExistsError):
        batch.init(root, shape=SHAPE, dtype="uint8", parts=3, **KW)
    replaced = batch.init(root, shape=SHAPE, dtype="uint8", parts=3, mode="w", **KW)
    assert replaced.nparts == 3
    with pytest.raises(InvalidValueError, match=r"parts are 0\.\.2"):
        batch.write_part(data(), root, 3)
    with pytest.raises(PlanError, match="does not fit"):
        batch.write_part(data()[:7], root, 0)


def test_init_over_an_existing_array_with_explicit_regions(tmp_path: Path) -> None:
    root = tmp_path / "b.zarr"
    shardwise.write_array(np.ones(SHAPE, "uint8"), root, **KW)
    regions = [(slice(0, 20), slice(None)), (slice(20, 30), slice(0, 24))]
    plan = batch.init(root, shape=SHAPE, dtype="uint8", parts=regions, mode="r+", **KW)
    for i in range(plan.nparts):
        batch.write_part(data(), root, i)
    assert batch.finalize(root).ok
    expect = np.ones(SHAPE, "uint8")
    for r in regions:
        expect[r] = data()[r]
    np.testing.assert_array_equal(shardwise.open_array(root).compute(), expect)


def test_a_part_resumes(tmp_path: Path) -> None:
    root = tmp_path / "b.zarr"
    plan = batch.init(root, shape=SHAPE, dtype="uint8", parts=2, **KW)

    def fail_last(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
        assert block_info is not None
        if block_info[0]["array-location"][0][0] >= 10:
            settle(root, 4)  # the part's other shard row is stored first
            raise RuntimeError("preempted")
        return block

    lazy = da.from_array(data(), chunks=(10, 44)).map_blocks(
        fail_last, dtype="uint8", meta=np.empty((0, 0), "uint8")
    )
    import dask

    with (
        dask.config.set(scheduler="threads", num_workers=4),
        pytest.raises(RuntimeError, match="preempted"),
    ):
        batch.write_part(lazy, root, 0)
    assert plan.region(0)[0] == slice(0, 20)
    rep = batch.write_part(data(), root, 0, resume=True)
    assert (rep.shards_skipped, rep.shards_written) == (4, 4)
    batch.write_part(data(), root, 1)
    assert batch.finalize(root).ok
    np.testing.assert_array_equal(shardwise.open_array(root).compute(), data())


def test_parts_that_leave_a_gap_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    gap = [(slice(0, 20), slice(None)), (slice(30, 50), slice(None))]  # rows 20:30 in no part
    root = tmp_path / "b.zarr"
    with pytest.raises(PlanError, match=r"leave 4 of 20 shards in no part.*\[20:30, 0:12\]"):
        batch.init(root, shape=SHAPE, dtype="uint8", parts=gap, **KW)
    assert not root.exists()
    # over an existing array (mode "w" would replace it): refused, the store byte-identical
    shardwise.write_array(data(), root, **KW)
    before = files(root, journal=True)
    with pytest.raises(PlanError, match="in no part"):
        batch.init(root, shape=SHAPE, dtype="uint8", parts=gap, mode="w", **KW)
    assert files(root, journal=True) == before
    # mode "r+" rewrites chosen regions of an existing array: a gap keeps the stored rows
    plan = batch.init(root, shape=SHAPE, dtype="uint8", parts=gap, mode="r+", **KW)
    for i in range(plan.nparts):
        batch.write_part(data(1), root, i)
    assert batch.finalize(root).ok
    expect = data(1)
    expect[20:30] = data()[20:30]
    np.testing.assert_array_equal(shardwise.open_array(root).compute(), expect)


def test_rerunning_a_finished_part_with_resume_skips_it(tmp_path: Path) -> None:
    root = tmp_path / "b.zarr"
    batch.init(root, shape=SHAPE, dtype="uint8", parts=2, **KW)
    first = batch.write_part(data(), root, 0)
    assert first.shards_written == 8
    before = files(root)
    records = {k: v for k, v in files(root, journal=True).items() if "/shards/" in k}
    again = batch.write_part(data(), root, 0, resume=True)
    assert (again.shards_skipped, again.shards_written) == (8, 0)
    assert "8 done before (resumed)" in str(again)
    assert files(root) == before
    assert {k: v for k, v in files(root, journal=True).items() if "/shards/" in k} == records
    # a shard lost since is written again, the others skipped
    (root / "c/0/0").unlink()
    third = batch.write_part(data(), root, 0, resume=True)
    assert (third.shards_skipped, third.shards_written) == (7, 1)
    assert files(root) == before
    batch.write_part(data(), root, 1)
    assert batch.finalize(root).ok


class MetadataReads(WrapperStore[Store]):
    """A real store, wrapped: counts the reads of each key (the read-only view zarr opens for
    its reads shares the count)."""

    def __init__(self, store: Store, reads: collections.Counter[str] | None = None) -> None:
        super().__init__(store)
        self.reads = collections.Counter[str]() if reads is None else reads

    def with_read_only(self, read_only: bool = False) -> MetadataReads:
        return MetadataReads(self._store.with_read_only(read_only), self.reads)

    async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self.reads[key] += 1
        return await self._store.get(key, *args, **kwargs)


def test_a_part_is_checked_once_then_written_under_its_lease(tmp_path: Path) -> None:
    """write_part runs the write's checks once (it used to check in a dry run, then again in
    the write): the array's metadata is read as often as by one dry run of the same write, and
    the part's lease is taken by the pipeline, its record written while it is held."""
    root = tmp_path / "b.zarr"
    plan = batch.init(root, shape=SHAPE, dtype="uint8", parts=2, **KW)
    dry = MetadataReads(LocalStore(root))
    shardwise.write_array(
        data()[plan.region(0)], dry, mode="r+", region=plan.region(0), dry_run=True
    )
    once = dry.reads["zarr.json"]
    assert once >= 1  # the dry run reads it: the count sees zarr's reads
    store = MetadataReads(LocalStore(root))
    rep = batch.write_part(data(), store, 0)
    assert store.reads["zarr.json"] == once
    assert store.reads[part_lease(0, 2)] >= 1  # the pipeline took the part's lease
    record = json.loads((root / ".shardwise" / "parts" / "0.json").read_bytes())
    assert (record["part"], record["batch"]) == (0, plan.id)
    assert record["shards_written"] == rep.shards_written == 8  # 2 of 5 shard rows, 4 across
    assert not (root / part_lease(0, 2)).exists()  # released after the record
    batch.write_part(data(), root, 1)
    assert batch.finalize(root).ok
    np.testing.assert_array_equal(shardwise.open_array(root).compute(), data())


def test_a_part_refuses_a_keyword_write_array_does_not_take(tmp_path: Path) -> None:
    """A part's write keywords are checked by write_array's one check (WriteOptions.checked):
    one it does not take is an InvalidTypeError that names it, a wrong value write_array's own
    refusal, both before the part's lease is taken (the store byte-identical)."""
    root = tmp_path / "b.zarr"
    batch.init(root, shape=SHAPE, dtype="uint8", parts=2, **KW)
    before = snapshot(root)
    with pytest.raises(
        InvalidTypeError, match=r"'fsynk' is not a keyword of write_array \(did you mean 'fsync'"
    ):
        batch.write_part(data(), root, 0, fsynk=True)
    with pytest.raises(InvalidTypeError, match="fsync must be True or False, got 'no'"):
        batch.write_part(data(), root, 0, fsync="no")
    assert snapshot(root) == before


def _state(root: Path) -> dict[str, str | None]:
    """Every directory (None) and file (its sha256) under ``root``: a refused call must leave
    both as they were."""
    out: dict[str, str | None] = dict(snapshot(root))
    out.update({str(d.relative_to(root)): None for d in root.rglob("*") if d.is_dir()})
    return out


@pytest.mark.parametrize(
    ("path", "why"),
    [
        (".shardwise/x", "names a node '.shardwise'"),
        ("a/.shardwise", "names a node '.shardwise'"),
        ("a//b", "empty name between two '/'"),
        ("zarr.json", "names a node 'zarr.json'"),
        ("a/zarr.json", "names a node 'zarr.json'"),
        ("a/zarr.json/b", "names a node 'zarr.json'"),
        ("a/../b", "names a node '..'"),
    ],
)
def test_batch_refuses_a_path_every_front_end_refuses(tmp_path: Path, path: str, why: str) -> None:
    """batch.init, write_part, finalize and open_batch check path= by the one check of every
    front end (write_array's path=), before the store is touched: the store byte-identical, no
    directory made."""
    root = tmp_path / "b.zarr"
    shardwise.write_array(data(), root, path="a", **KW)  # a store with an array in it
    before = _state(root)
    with pytest.raises(InvalidValueError, match=rf"path={path!r} .*{why}"):
        shardwise.write_array(data(), root, path=path, **KW)  # the rule batch follows
    with pytest.raises(InvalidValueError, match=rf"path={path!r} .*{why}"):
        batch.init(root, shape=SHAPE, dtype="uint8", parts=2, path=path, **KW)
    assert _state(root) == before
    for step in (
        lambda: batch.write_part(data(), root, 0, path=path),
        lambda: batch.finalize(root, path=path),
        lambda: batch.open_batch(root, path=path),
    ):
        with pytest.raises(InvalidValueError, match=rf"path={path!r} .*{why}"):
            step()
        assert _state(root) == before
    fresh = tmp_path / "new.zarr"
    with pytest.raises(InvalidValueError, match=rf"path={path!r}"):
        batch.init(fresh, shape=SHAPE, dtype="uint8", parts=2, path=path, **KW)
    assert not fresh.exists()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (dict(dtype="uint16"), r'dtype \(data_type\): stored "uint8", asked "uint16"'),
        (dict(chunks=(10, 4)), r"chunks: stored \[5,4\], asked \[10,4\]"),
        (dict(shards=(20, 12)), r"shards: stored \[10,12\], asked \[20,12\]"),
        (dict(fill_value=3), r"fill_value: stored 0, asked 3"),
        (
            dict(compressors=None),
            r'codecs \(compressors, filters, serializer\): stored .*"zstd".*, asked '
            r'\[\{"sharding_indexed":\{"codecs":\[\{"name":"bytes"\}\],',
        ),
        (
            dict(compressors=ZstdCodec(level=9)),
            r'codecs \(compressors.*\): stored .*"level":0.*, asked .*"level":9',
        ),
        (dict(parts=3), r"open batch of other parts: 2 stored .*, 3 asked"),
    ],
)
def test_init_rerun_with_other_arguments_is_refused(
    tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    """init(mode="w-") again returns the open batch for the same arguments only: another dtype,
    chunks, shards, fill value, codecs or parts is an ArrayExistsError naming what differs, the
    store byte-identical; the same arguments still return the batch."""
    root = tmp_path / "b.zarr"
    asked: dict[str, Any] = dict(shape=SHAPE, dtype="uint8", parts=2, **KW)
    plan = batch.init(root, **asked)
    before = _state(root)
    with pytest.raises(shardwise.ArrayExistsError, match=named):
        batch.init(root, **{**asked, **change})
    assert _state(root) == before
    assert batch.init(root, **asked) == plan
    assert _state(root) == before
