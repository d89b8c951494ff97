"""The staged write strategy: blocks encode their inner chunks, one task per shard streams them.

Oracles: the direct strategy (same bytes), numpy, zarr-python and tensorstore. Memory is measured
(tracemalloc in process; worker processes with a memory limit smaller than one shard).
"""

from __future__ import annotations

import functools
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from zarr.abc.store import Store
from zarr.core.buffer import Buffer
from zarr.storage import MemoryStore, WrapperStore

import shardwise
from faultkit import (
    BUCKET,
    TEMP,
    files,
    forkserver,
    hold_block,
    moto_s3,
    record_figures,
    temp_files,
    torn_shards,
    traced_peak,
    wait_until,
    worker_cluster,
)
from oracles import assert_bit_equal
from shardwise import InvalidValueError, PlanError, WritePlan, verify
from shardwise.engine.staged import STAGED
from strategies import cases, dask_chunkings, examples, regions, write

ZSTD: dict[str, Any] = dict(compressors=[zarr.codecs.ZstdCodec(level=1)])


def smooth_noise(shape: tuple[int, ...], origin: tuple[int, ...] = (), seed: int = 0) -> np.ndarray:
    """uint16 data: a smooth ramp plus noise, the same values for a block wherever it is made."""
    origin = origin or (0,) * len(shape)
    grids = np.ogrid[tuple(slice(o, o + n) for o, n in zip(origin, shape, strict=True))]
    ramp = sum(((g * (7 + 3 * i)) % 2048).astype("uint16") for i, g in enumerate(grids))
    rng = np.random.default_rng([seed, *origin])
    return np.asarray(ramp + rng.integers(0, 64, shape, dtype="uint16"), dtype="uint16")


def _gen(block_info: Any = None) -> np.ndarray:
    info = block_info[None]
    origin = tuple(lo for lo, _ in info["array-location"])
    return smooth_noise(tuple(info["chunk-shape"]), origin)


def generated(shape: tuple[int, ...], chunks: tuple[int, ...]) -> da.Array:
    """A dask array of :func:`smooth_noise` made inside the tasks (never held whole)."""
    return da.map_blocks(
        _gen,
        dtype="uint16",
        chunks=da.core.normalize_chunks(chunks, shape),
        meta=np.empty((0,) * len(shape), "uint16"),
    )


def expected(
    shape: tuple[int, ...], chunks: tuple[int, ...], region: tuple[slice, ...]
) -> np.ndarray:
    return np.asarray(generated(shape, chunks)[region].compute(scheduler="sync"))


# -- the job: a value you can look at ----------------------------------------------------------


def test_plan_write_shows_the_job_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    kw: dict[str, Any] = dict(chunks=(16, 16), shards=(64, 64), memory_limit=2**30)
    aligned = shardwise.plan_write(
        da.zeros((256, 128), dtype="uint16", chunks=(64, 64)), root, **kw
    )
    assert isinstance(aligned, WritePlan)
    assert (aligned.strategy, aligned.tasks, aligned.bytes_to_move) == ("direct", 8, 0)
    small = shardwise.plan_write(
        da.zeros((256, 128), dtype="uint16", chunks=(30, 64)), root, strategy="staged", **kw
    )
    assert small.strategy == "staged"
    # block edges moved to the nearest inner-chunk boundary: 30 -> 32, ..., 150 -> 144, ...
    assert small.blocks == ((32, 32, 32, 32, 16, 32, 32, 32, 16), (64, 64))
    assert small.tasks == 18 + 8
    text = str(small)
    for part in ("staged", "shards: 8", "tasks: 26", "peak memory per task", "bytes to move"):
        assert part in text
    assert "staged" in repr(small)
    forced = shardwise.plan_write(
        da.zeros((256, 128), dtype="uint16", chunks=(30, 64)), root, strategy="direct", **kw
    )
    assert forced.strategy == "direct" and forced.bytes_rechunked == 256 * 128 * 2
    assert not root.exists()


def test_a_job_over_the_memory_limit_is_refused_before_any_byte(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    shardwise.write_array(np.ones((256, 256), "uint16"), root, chunks=(16, 16), shards=(128, 128))
    before = files(root, journal=True)
    src = da.ones((256, 256), dtype="uint16", chunks=(128, 128))
    with pytest.raises(PlanError, match=r"memory_limit is 64\.0 KiB.*strategy='staged'"):
        shardwise.write_array(src, root, mode="r+", strategy="direct", memory_limit=64 * 2**10)
    with pytest.raises(PlanError, match="rechunk the source into smaller dask chunks"):
        shardwise.write_array(src, root, mode="r+", strategy="staged", memory_limit=64 * 2**10)
    with pytest.raises(InvalidValueError, match="strategy must be one of"):
        shardwise.write_array(src, root, mode="r+", strategy="fast")  # type: ignore[arg-type]
    assert files(root, journal=True) == before


def test_auto_keeps_shard_aligned_writes_direct(tmp_path: Path) -> None:
    src = da.from_array(smooth_noise((128, 128)), chunks=(64, 64))
    job = shardwise.plan_write(src, tmp_path / "a", chunks=(16, 16), shards=(64, 64))
    assert job.strategy == "direct" and job.tasks == 4
    # numpy data that fits: direct too
    job = shardwise.plan_write(
        smooth_noise((128, 128)), tmp_path / "a", chunks=(16, 16), shards=(64, 64)
    )
    assert job.strategy == "direct"
    # numpy data whose shards do not fit the budget: staged, in blocks of whole inner chunks
    job = shardwise.plan_write(
        smooth_noise((2048, 2048)),  # one 8 MiB shard: a direct task needs ~24 MiB
        tmp_path / "a",
        chunks=(16, 16),
        shards=(2048, 2048),
        memory_limit=20 * 2**20,
    )
    assert job.strategy == "staged" and job.peak_per_task <= 20 * 2**20
    assert all(c % 16 == 0 for dim in job.blocks for c in dim)


# -- same result as the direct strategy, numpy and zarr-python ------------------------------------


@examples(25)
@given(data=st.data())
def test_staged_and_direct_store_the_same_bytes(data: st.DataObject, fresh_dir: Any) -> None:
    case = data.draw(cases(max_ndim=3, index_codecs=True), label="case")
    chunks = data.draw(dask_chunkings(case.geometry), label="dask chunks")
    roots = {s: fresh_dir() for s in ("direct", "staged")}
    for s, root in roots.items():
        write(case, str(root), chunks, strategy=s)
    got = {s: files(root) for s, root in roots.items()}
    assert got["direct"] == got["staged"]
    assert_bit_equal(zarr.open_array(str(roots["staged"]), mode="r")[...], case.data)
    # then a region write over it (partial shards, partial inner chunks)
    region = data.draw(regions(case.geometry.shape, allow_empty=False), label="region")
    new = np.flip(case.data[region]).copy() if case.data[region].size else case.data[region]
    new_chunks = data.draw(
        dask_chunkings(
            type(case.geometry)(new.shape, case.geometry.chunk_shape, case.geometry.shard_shape)
        ),
        label="region chunks",
    )
    for s, root in roots.items():
        shardwise.write_array(
            da.from_array(new, chunks=new_chunks), str(root), mode="r+", region=region, strategy=s
        )
    got = {s: files(root) for s, root in roots.items()}
    assert got["direct"] == got["staged"]
    want = case.data.copy()
    want[region] = new
    assert_bit_equal(zarr.open_array(str(roots["staged"]), mode="r")[...], want)
    assert verify(roots["staged"]).ok


def test_region_write_merges_partial_inner_chunks(tmp_path: Path, read_tensorstore: Any) -> None:
    base = smooth_noise((100, 90))
    root = tmp_path / "a.zarr"
    shardwise.write_array(base, root, chunks=(8, 8), shards=(32, 32), fill_value=0, **ZSTD)
    region = (slice(13, 77), slice(5, 89))  # cuts inner chunks and shards on every side
    new = smooth_noise((64, 84), seed=5)
    rep = shardwise.write_array(
        da.from_array(new, chunks=(10, 13)), root, mode="r+", region=region, strategy="staged"
    )
    want = base.copy()
    want[region] = new
    np.testing.assert_array_equal(read_tensorstore(root), want)
    assert rep.shards_written == 9
    assert not (root / STAGED).exists()
    assert verify(root).ok


# -- one commit per shard ------------------------------------------------------------------------


class CountingStore(WrapperStore[Store]):
    """Counts ``set`` calls per key (a real MemoryStore underneath)."""

    def __init__(self, store: Store, counts: Counter[str]) -> None:
        super().__init__(store)
        self.counts = counts

    def _with_store(self, store: Store) -> CountingStore:
        return CountingStore(store, self.counts)

    async def set(self, key: str, value: Buffer) -> None:
        self.counts[key] += 1
        await self._store.set(key, value)


def test_one_commit_per_shard_key_and_no_staged_piece_left() -> None:
    counts: Counter[str] = Counter()
    store = CountingStore(MemoryStore(), counts)
    x = smooth_noise((96, 80))
    x[:32, :40] = 0  # one shard of fill: never stored
    with dask.config.set(scheduler="threads", num_workers=4):
        rep = shardwise.write_array(
            da.from_array(x, chunks=(20, 24)),
            store,
            chunks=(8, 8),
            shards=(32, 40),
            fill_value=0,
            strategy="staged",
        )
    shards = {k: n for k, n in counts.items() if k.startswith("c/")}
    assert len(shards) == rep.shards_written == 5
    assert set(shards.values()) == {1}
    pieces = {k for k in counts if k.startswith(STAGED)}
    assert pieces  # blocks staged their chunks through the store ...
    assert all(n == 1 for k, n in counts.items() if k in pieces)
    # ... and the shard tasks removed them
    assert not [k for k in _keys(store) if k.startswith(STAGED)]
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[...], x)


def _keys(store: Store) -> list[str]:
    from zarr.core.sync import sync

    async def go() -> list[str]:
        return [k async for k in store.list()]

    return sync(go())


def test_a_shard_task_run_again_after_its_commit_commits_nothing() -> None:
    """As when dask reruns a shard task whose worker died after the commit: the record of this
    write matches the object, so the rerun returns the result without writing again."""
    from shardwise.core.job import make_job
    from shardwise.core.plan import ShardPlan
    from shardwise.durability.journal import Journal
    from shardwise.engine.staged import StagedWriter
    from shardwise.engine.write import WriteSettings
    from shardwise.storage.nodes import open_info
    from shardwise.storage.store import ShardStore

    counts: Counter[str] = Counter()
    store = CountingStore(MemoryStore(), counts)
    x = smooth_noise((64, 40))
    shardwise.write_array(x, store, chunks=(8, 8), shards=(32, 40), fill_value=0)
    info = open_info(store)
    plan = ShardPlan(info.layout, (slice(0, 64), slice(0, 40)))
    job = make_job(plan, ((16,) * 4, (40,)), 2, strategy="staged", memory_limit=2**30)
    sstore = ShardStore(store)
    codec = info.codec
    journal = Journal(sstore, "w1", codec.index_nbytes, codec.index_location == "end")
    writer = StagedWriter(info, sstore, plan, WriteSettings(), job.blocks, "w1", journal)
    new = x[::-1].copy()
    receipts = [
        writer.stage(new[16 * i : 16 * i + 16], {0: {"chunk-location": (i, 0)}}) for i in range(2)
    ]
    counts.clear()
    first = writer.assemble((0, 0), receipts)
    again = writer.assemble((0, 0), receipts)
    assert counts["c/0/0"] == 1
    assert first.shards_written == again.shards_written == 1
    assert first.bytes_stored == again.bytes_stored
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[:32], new[:32])


# -- memory: one block plus a buffer, whatever the shard size ------------------------------------


def test_peak_memory_per_task_does_not_grow_with_the_shard(tmp_path: Path) -> None:
    """The writer's own allocations (the source is in memory before the count starts): one task
    at a time, so the peak of the whole write is the peak of its largest task."""
    shape, chunks = (64, 512, 512), (8, 512, 512)  # 32 MiB of uint16 in 4 MiB blocks
    x = smooth_noise(shape)
    block = 8 * 512 * 512 * 2
    kw: dict[str, Any] = dict(chunks=(8, 64, 64), **ZSTD)
    peaks = {}
    with dask.config.set(scheduler="sync"):
        # first use: lazy imports and this thread's streaming buffer (a fixed cost) outside
        warm = da.from_array(x[:8, :64, :64], chunks=(8, 32, 64))
        shardwise.write_array(warm, tmp_path / "warm", shards=(8, 64, 64), strategy="staged", **kw)
        for shards in ((16, 512, 512), (64, 512, 512)):  # 8 MiB and 32 MiB shards
            root = tmp_path / f"s{shards[0]}.zarr"
            src = da.from_array(x, chunks=chunks)
            peaks[shards] = traced_peak(
                lambda src=src, root=root, shards=shards: shardwise.write_array(
                    src, root, shards=shards, strategy="staged", **kw
                )
            )
            np.testing.assert_array_equal(zarr.open_array(root, mode="r")[...], x)
        src = da.from_array(x, chunks=chunks)
        direct = traced_peak(
            lambda: shardwise.write_array(
                src, tmp_path / "d.zarr", shards=(64, 512, 512), strategy="direct", **kw
            )
        )
    # Python's allocations (test_write_memory.py measures resident memory): a 4 MiB block and
    # its encoded chunks, or the 8 MiB streaming buffer and what it hands to the store
    bound = 24 * 2**20
    record_figures(
        "staged-peak-memory",
        {
            "block_bytes": block,
            "staged_peak_8MiB_shards": peaks[(16, 512, 512)],
            "staged_peak_32MiB_shards": peaks[(64, 512, 512)],
            "direct_peak_32MiB_shards": direct,
            "direct_shard_bytes": (tmp_path / "d.zarr" / "c" / "0" / "0" / "0").stat().st_size,
            "bound": bound,
        },
    )
    assert max(peaks.values()) <= bound, (peaks, bound)
    # a 16x larger shard costs no more (staged); the direct strategy holds at least its whole
    # encoded shard until the put (its source blocks are views of ``x``, encoded in place:
    # engine/pieces.py), beyond the staged bound
    assert peaks[(64, 512, 512)] <= 1.25 * peaks[(16, 512, 512)], peaks
    shard_bytes = (tmp_path / "d.zarr" / "c" / "0" / "0" / "0").stat().st_size
    assert direct >= shard_bytes > bound, (direct, shard_bytes, peaks)


# -- interrupted and resumed ---------------------------------------------------------------------


def _fail_block(root: Path, block: np.ndarray, block_info: Any = None) -> np.ndarray:
    """Block (3, 1) fails once block (2, 1) staged its piece of shard (2, 1), which then can
    never be assembled: the write stops with staged pieces left behind."""
    if tuple(block_info[0]["chunk-location"]) == (3, 1):
        deadline = time.monotonic() + 120
        while not list((root / STAGED).glob("*/c/2/1/b2.1")):
            assert time.monotonic() < deadline, "block (2, 1) never staged its piece"
            time.sleep(0.01)
        raise RuntimeError("interrupted")
    return block


def test_interrupted_staged_write_is_reported_then_resumed(tmp_path: Path) -> None:
    x = smooth_noise((96, 80))
    kw: dict[str, Any] = dict(chunks=(8, 8), shards=(32, 40), fill_value=0, **ZSTD)
    ref = tmp_path / "ref.zarr"
    shardwise.write_array(x, ref, **kw)
    root = tmp_path / "a.zarr"
    fail = functools.partial(_fail_block, root)
    src = da.from_array(x, chunks=(24, 40)).map_blocks(fail, meta=x[:0, :0])
    with (
        dask.config.set(scheduler="threads", num_workers=4),
        pytest.raises(RuntimeError, match="interrupted"),
    ):
        shardwise.write_array(src, root, strategy="staged", **kw)
    kinds = Counter(p.kind for p in verify(root).problems)
    assert kinds["staged"] == 1 and kinds["incomplete"] == 1
    rep = shardwise.write_array(
        da.from_array(x, chunks=(24, 40)), root, resume=True, strategy="staged", **kw
    )
    assert rep.shards_written + rep.shards_skipped == 6
    assert files(root) == files(ref)
    assert not (root / STAGED).exists()
    assert verify(root).ok


KILL_KW: dict[str, Any] = dict(chunks=(16, 16), shards=(128, 128), fill_value=0, strategy="staged")
KILL_HOLD = (12, 7)  # the source block of the last shard, c/3/3: held until the writer is killed


def kill_writer(root: str, started: Any) -> None:
    """The writer that gets SIGKILLed: a staged write from small dask blocks that cannot finish
    (block ``KILL_HOLD`` waits until the kill), on threads enough that the held task stops no
    other."""
    src = da.from_array(smooth_noise((512, 512)), chunks=(40, 72))
    src = src.map_blocks(hold_block, KILL_HOLD, meta=src._meta)
    started.set()
    with dask.config.set(scheduler="threads", num_workers=4):
        shardwise.write_array(src, root, **KILL_KW)


def _shards_stored(root: Path) -> int:
    """Shard objects visible under ``root`` (names only: a writer is busy there)."""
    return sum(p.is_file() and not TEMP.search(p.name) for p in (root / "c").rglob("*"))


@pytest.mark.slow
def test_sigkill_of_a_staged_writer_then_resume(tmp_path: Path) -> None:
    """SIGKILL after a random number of stored shards (0 = during the first phase), never after
    the end: the held block keeps the write from finishing, so every trial is a kill mid-write."""
    ctx = forkserver()
    ref = tmp_path / "ref.zarr"
    shardwise.write_array(smooth_noise((512, 512)), ref, **{**KILL_KW, "strategy": "direct"})
    reference = files(ref)
    free = 15  # the shards that do not wait for the held block
    rng = random.Random(11)
    fig: Counter[str] = Counter()
    for trial in range(8):
        root = tmp_path / f"k{trial}.zarr"
        started = ctx.Event()
        p = ctx.Process(target=kill_writer, args=(str(root), started))
        p.start()
        assert started.wait(120)
        want = rng.randrange(free)
        wait_until(
            lambda r=root, n=want: _shards_stored(r) >= n, f"trial {trial}: {want} shards", 300
        )
        p.kill()
        p.join(120)
        fig["killed"] += p.exitcode == -signal.SIGKILL
        if (root / "zarr.json").exists():
            assert torn_shards(root) == []
        rep = shardwise.write_array(
            da.from_array(smooth_noise((512, 512)), chunks=(40, 72)),
            root,
            resume=True,
            break_lease=True,
            **KILL_KW,
        )
        fig["skipped"] += rep.shards_skipped
        assert files(root) == reference, f"trial {trial}"
        assert temp_files(root) == [] and not (root / STAGED).exists()
        assert verify(root).ok
    assert fig["killed"] == 8, fig
    assert fig["skipped"] > 0, fig


# -- S3: one multipart upload per shard --------------------------------------------------------


def test_staged_write_to_s3_goes_through_multipart() -> None:
    with moto_s3() as s3:
        prefix = uuid.uuid4().hex[:12]  # the server is shared with other tests
        store = s3.obstore(prefix)
        x = np.random.default_rng(1).integers(0, 2**16, (2048, 4096), dtype="uint16")
        src = da.from_array(x, chunks=(256, 4096))  # 16 MiB shard, incompressible, 2 MiB blocks
        rep = shardwise.write_array(
            src, store, chunks=(256, 256), shards=(2048, 4096), compressors=None, strategy="staged"
        )
        assert rep.shards_written == 1
        head = s3.client.head_object(Bucket=BUCKET, Key=f"{prefix}/c/0/0")
        # a multipart object's ETag ends in "-<parts>": 16 MiB in 8 MiB parts
        assert head["ETag"].strip('"').endswith("-3"), head["ETag"]
        assert (
            s3.client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix + "/").get("Uploads", [])
            == []
        )
        assert not [k for k in s3.keys(prefix) if k.startswith(STAGED)]
        np.testing.assert_array_equal(zarr.open_array(store, mode="r")[...], x)
        assert verify(store).ok


# -- worker processes with less memory than one shard ---------------------------------------------


@pytest.fixture(scope="module")
def small_workers() -> Iterator[Any]:
    # the default client: shardwise reads the workers' limit
    with worker_cluster("350MiB", set_as_default=True) as c:
        yield c


@pytest.mark.slow
def test_shards_larger_than_a_worker_on_memory_limited_workers(
    small_workers: Any, tmp_path: Path, read_tensorstore: Any
) -> None:
    shape, chunks = (256, 1024, 1024), (64, 128, 1024)  # 512 MiB shard, 16 MiB blocks
    root = tmp_path / "big.zarr"
    kw: dict[str, Any] = dict(chunks=(64, 64, 64), shards=shape, **ZSTD)
    src = generated(shape, chunks)
    with pytest.raises(PlanError, match="dask workers"):  # direct cannot run here
        shardwise.plan_write(src, root, strategy="direct", **kw)
    job = shardwise.plan_write(src, root, **kw)
    assert job.strategy == "staged" and job.peak_per_task < 350 * 2**20 // 2
    small_workers.run(_start_rss_sampler)
    rep = shardwise.write_array(src, root, **kw)
    assert rep.shards_written == 1
    peak_rss = small_workers.run(_stop_rss_sampler)
    record_figures(
        "staged-small-workers",
        {
            "shard_raw_bytes": 2 * np.prod(shape),
            "worker_memory_limit": 350 * 2**20,
            "worker_peak_rss": sorted(peak_rss.values()),
            "job": repr(job),
            "seconds": round(rep.seconds, 2),
        },
    )
    assert max(peak_rss.values()) < 350 * 2**20
    for lo in range(0, shape[0], 64):
        sl = (slice(lo, lo + 64), slice(None), slice(None))
        want = expected(shape, chunks, sl)
        np.testing.assert_array_equal(zarr.open_array(root, mode="r")[sl], want)
    np.testing.assert_array_equal(
        read_tensorstore(root)[::17, ::31, ::29],
        expected(shape, chunks, (slice(None),) * 3)[::17, ::31, ::29],
    )
    assert verify(root).ok and temp_files(root) == []


@pytest.mark.slow
def test_the_workers_limit_is_read_when_the_clients_refresh_runs_after_the_fetch(
    small_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's periodic refresh caches an identity without workers; when it lands between
    a fetch and the read of the cache (a loaded machine), ``scheduler_info()`` has no workers.
    Made to happen here on every fetch: the probe still finds the workers' limit."""
    from shardwise.runtime.probes import default_memory_limit

    fetch = small_workers._update_scheduler_info

    async def fetch_then_refresh(n_workers: int = 0) -> None:
        await fetch(n_workers=n_workers)
        await fetch(n_workers=0)  # what the periodic refresh fetches

    monkeypatch.setattr(small_workers, "_update_scheduler_info", fetch_then_refresh)
    assert small_workers.scheduler_info()["workers"] == {}  # the race, shown
    assert default_memory_limit() == (350 * 2**20, "dask workers' memory_limit / nthreads")


def _start_rss_sampler(dask_worker: Any) -> None:
    """Sample this worker's resident memory every 5 ms until stopped (``ru_maxrss`` would
    include the peak of the process it was started from)."""
    import threading

    import psutil

    proc, done = psutil.Process(), threading.Event()
    peak = [int(proc.memory_info().rss)]

    def loop() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], int(proc.memory_info().rss))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    dask_worker._test_rss = (done, thread, peak)


def _stop_rss_sampler(dask_worker: Any) -> int:
    done, thread, peak = dask_worker._test_rss
    done.set()
    thread.join()
    return int(peak[0])


def test_job_doctests() -> None:
    import doctest

    import shardwise.core.job

    result = doctest.testmod(shardwise.core.job)
    assert result.attempted > 0 and result.failed == 0


def test_one_large_dask_chunk_is_split_into_blocks_that_fit(tmp_path: Path) -> None:
    x = smooth_noise((2048, 2048))  # 8 MiB in one dask chunk, one shard
    src = da.from_array(x, chunks=x.shape)
    kw: dict[str, Any] = dict(chunks=(64, 64), shards=(2048, 2048), memory_limit=20 * 2**20)
    job = shardwise.plan_write(src, tmp_path / "a", strategy="auto", **kw)
    assert job.strategy == "staged" and job.block_tasks > 1
    assert all(c % 64 == 0 for dim in job.blocks for c in dim)
    assert job.peak_per_task <= 20 * 2**20
    shardwise.write_array(src, tmp_path / "a", **kw)
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a", mode="r")[...], x)
