"""Parallel writes: any dask chunking, threads and worker processes, one store set per shard.

The oracle for every write is zarr-python reading the store, and the expected set of stored
shards is computed from the data (a shard holding only fill values is not stored).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from dask.delayed import Delayed
from zarr.abc.store import Store
from zarr.core.buffer import Buffer
from zarr.storage import LocalStore, MemoryStore, WrapperStore

import shardwise
from faultkit import cluster_workers
from fsevents import FileEvents
from shardwise import InvalidValueError, PlanError, WriteReport
from shardwise.core.layout import Layout

SHAPE = (61, 47, 19)
SHARDS = (16, 12, 8)
INNER = (4, 4, 4)
LAYOUT = Layout(SHAPE, SHARDS, INNER)

CHUNKINGS: dict[str, Any] = {
    "shards": SHARDS,
    "smaller": (8, 6, 4),
    "larger": (32, 24, 16),
    "misaligned": (13, 11, 7),
    "irregular": ((5, 20, 36), (1, 30, 16), (3, 3, 13)),
    "inner": INNER,
    "one_block": SHAPE,
}


def make_data(seed: int = 0) -> np.ndarray:
    """int16 data with an all-fill shard, fill inner chunks and a shard with one value only."""
    rng = np.random.default_rng(seed)
    data = rng.integers(-500, 500, SHAPE).astype("int16")
    data[16:32, 12:24, 0:8] = 0  # shard (1, 1, 0) holds only fill
    data[0:4, 0:8, 0:4] = 0  # two fill inner chunks in shard (0, 0, 0)
    data[48:61, 36:47, 16:19] = 0  # the corner edge shard holds only fill
    data[32:48, 36:47, 8:16] = 0
    data[40, 40, 10] = 7  # shard (2, 3, 1) holds fill and one value
    return data


def nonempty_keys(data: np.ndarray, fill: int = 0, layout: Layout = LAYOUT) -> set[str]:
    return {
        layout.shard_key(s) for s in layout.shards() if (data[layout.shard_region(s)] != fill).any()
    }


def stored_inner_chunks(data: np.ndarray, fill: int = 0) -> int:
    n = 0
    grid = [range(0, s, c) for s, c in zip(SHAPE, INNER, strict=True)]
    for lo in itertools.product(*grid):
        sel = tuple(slice(a, a + c) for a, c in zip(lo, INNER, strict=True))
        n += bool((data[sel] != fill).any())
    return n


def zarr_read(store: Any, path: str | None = None) -> np.ndarray:
    return np.asarray(zarr.open_array(store, path=path or "", mode="r")[...])


def mismatches(got: np.ndarray, want: np.ndarray) -> int:
    assert got.shape == want.shape
    return int(np.count_nonzero(got != want))


def write(data: Any, store: Any, **kw: Any) -> Any:
    kw.setdefault("chunks", INNER)
    kw.setdefault("shards", SHARDS)
    kw.setdefault("fill_value", 0)
    return shardwise.write_array(data, store, **kw)


def is_shard_key(key: str) -> bool:
    """Shard objects of the array at the store root (other keys are metadata or bookkeeping)."""
    return key.startswith("c/")


def shard_files(root: Path) -> set[str]:
    """Every file under the array's chunk prefix (temporary files included)."""
    return {str(p.relative_to(root)) for p in (root / "c").rglob("*") if p.is_file()}


class CountingStore(WrapperStore[Store]):
    """A real store that counts ``set`` and ``delete`` calls per key (thread-safe)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.sets: Counter[str] = Counter()
        self.deletes: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def _with_store(self, store: Store) -> CountingStore:
        return self

    async def set(self, key: str, value: Buffer) -> None:
        with self._count_lock:
            self.sets[key] += 1
        await self._store.set(key, value)

    async def delete(self, key: str) -> None:
        with self._count_lock:
            self.deletes[key] += 1
        await self._store.delete(key)

    def shard_sets(self) -> Counter[str]:
        return Counter({k: n for k, n in self.sets.items() if is_shard_key(k)})

    def shard_deletes(self) -> Counter[str]:
        return Counter({k: n for k, n in self.deletes.items() if is_shard_key(k)})


class LoggingStore(WrapperStore[Store]):
    """A store that appends every ``set`` key to a log file: counts sets across worker processes."""

    def __init__(self, store: Store, log: str) -> None:
        super().__init__(store)
        self.log = log

    def _with_store(self, store: Store) -> LoggingStore:
        return LoggingStore(store, self.log)

    async def set(self, key: str, value: Buffer) -> None:
        line = f"{os.getpid()} {key}\n".encode()
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one O_APPEND write per line: lines never interleave
        finally:
            os.close(fd)
        await self._store.set(key, value)

    def entries(self) -> list[tuple[int, str]]:
        with open(self.log) as f:
            return [(int(p), k) for p, k in (line.split() for line in f)]


# -- threaded scheduler -------------------------------------------------------------------------


@pytest.mark.parametrize("chunking", sorted(CHUNKINGS))
def test_any_chunking_threads_one_set_per_shard(chunking: str) -> None:
    data = make_data()
    store = CountingStore(MemoryStore())
    source = da.from_array(data, chunks=CHUNKINGS[chunking])
    with dask.config.set(scheduler="threads", num_workers=4):
        report = write(source, store)
    assert mismatches(zarr_read(store), data) == 0
    assert mismatches(shardwise.open_array(store).compute(scheduler="threads"), data) == 0
    want = nonempty_keys(data)
    assert store.shard_sets() == Counter(dict.fromkeys(want, 1))
    assert store.sets["zarr.json"] == 1
    assert not store.shard_deletes()
    assert report.keys == sorted(want)


@pytest.mark.parametrize("chunking", ["misaligned", "irregular", "inner", "larger"])
def test_region_write_merges_each_touched_shard_once(chunking: str) -> None:
    data = make_data()
    store = CountingStore(MemoryStore())
    write(data, store)
    before = Counter(store.sets)
    region = (slice(5, 50), slice(13, 47), slice(3, 11))
    patch = make_data(seed=1)[: 50 - 5, : 47 - 13, : 11 - 3]
    patch[:20, :10] = 0  # some shards the region covers in part end up holding only fill
    chunks = CHUNKINGS[chunking]
    if chunking == "irregular":
        chunks = ((20, 25), (1, 33), (5, 3))
    with dask.config.set(scheduler="threads", num_workers=4):
        report = write(da.from_array(patch, chunks=chunks), store, mode="r+", region=region)
    expected = data.copy()
    expected[region] = patch
    assert mismatches(zarr_read(store), expected) == 0
    new_sets = Counter({k: n for k, n in (store.sets - before).items() if is_shard_key(k)})
    touched = {LAYOUT.shard_key(s) for s in LAYOUT.shards_touching(region)}
    written = nonempty_keys(expected) & touched
    assert new_sets == Counter(dict.fromkeys(written, 1))
    deleted = nonempty_keys(data) - nonempty_keys(expected)
    assert store.shard_deletes() == Counter(dict.fromkeys(deleted, 1))
    assert report.keys == sorted(written)
    assert report.shards_written + report.shards_empty == len(touched)


def test_overwriting_a_shard_with_fill_removes_it(tmp_path: Path) -> None:
    data = make_data()
    write(data, str(tmp_path))
    assert {"c/0/0/0", "c/0/1/0"} <= shard_files(tmp_path)
    new = data.copy()
    new[:16, :12, :8] = 0
    new[0:16, 12:24, 0:4] = 0  # shard (0, 1, 0) keeps data in its upper half only
    report = write(new, str(tmp_path), mode="r+")
    assert "c/0/0/0" not in shard_files(tmp_path)
    assert shard_files(tmp_path) == nonempty_keys(new)
    assert report.shards_deleted == 1
    assert mismatches(zarr_read(str(tmp_path)), new) == 0
    # a region write covering a shard in part and leaving only fill removes it (merge path)
    region = (slice(0, 16), slice(12, 24), slice(4, 8))
    report = write(np.zeros((16, 12, 4), "int16"), str(tmp_path), mode="r+", region=region)
    new[region] = 0
    assert "c/0/1/0" not in shard_files(tmp_path)
    assert shard_files(tmp_path) == nonempty_keys(new)
    assert (report.shards_written, report.shards_empty, report.shards_deleted) == (0, 1, 1)
    assert mismatches(zarr_read(str(tmp_path)), new) == 0


def test_overwriting_with_fill_in_a_counting_store() -> None:
    data = make_data()
    store = CountingStore(MemoryStore())
    write(data, store)
    store.sets.clear()
    new = data.copy()
    new[:16, :12, :8] = 0
    new[16:32, 12:24, 0:8] = 5  # the all-fill shard gets data
    with dask.config.set(scheduler="threads"):
        report = write(da.from_array(new, chunks=(13, 11, 7)), store, mode="r+")
    assert store.shard_deletes() == Counter({"c/0/0/0": 1})
    assert store.shard_sets() == Counter(dict.fromkeys(nonempty_keys(new), 1))
    assert report.shards_deleted == 1
    assert mismatches(zarr_read(store), new) == 0


# -- the report, compute=False and modes --------------------------------------------------------


def test_write_report_fields(tmp_path: Path) -> None:
    data = make_data()
    report = write(da.from_array(data, chunks=(13, 11, 7)), str(tmp_path))
    assert isinstance(report, WriteReport)
    want = nonempty_keys(data)
    files = shard_files(tmp_path)
    assert files == want
    assert report.keys == sorted(want)
    assert report.shards_written == len(want)
    assert report.shards_empty == LAYOUT.nshards - len(want)
    assert report.shards_deleted == 0
    assert report.bytes_stored == sum((tmp_path / k).stat().st_size for k in files)
    assert report.raw_bytes == data.nbytes
    assert report.chunks_stored == stored_inner_chunks(data)
    n_inner = int(np.prod([-(-s // c) for s, c in zip(SHAPE, INNER, strict=True)]))
    assert report.chunks_stored + report.chunks_empty == n_inner
    # the ratio is over the shards stored (the all-fill shards are not among them)
    held = (
        sum(
            np.prod([r.stop - r.start for r in LAYOUT.shard_region(s)])
            for s in LAYOUT.shards()
            if LAYOUT.shard_key(s) in want
        )
        * data.itemsize
    )
    assert report.stored_raw_bytes == held < data.nbytes
    assert report.compression_ratio == pytest.approx(held / report.bytes_stored)
    assert report.seconds > 0
    text = str(report)
    assert f"{len(want)} shards written" in text
    assert f"{report.chunks_stored} inner chunks stored" in text
    # reports add up
    total = report + report
    assert total.shards_written == 2 * report.shards_written
    assert total.bytes_stored == 2 * report.bytes_stored


def test_region_write_report_counts_the_shards_it_stores(tmp_path: Path) -> None:
    data = make_data()
    write(data, str(tmp_path), mode="w")
    region = (slice(20, 30), slice(14, 22), slice(2, 6))  # inside shard (1, 1, 0), in part
    part = np.full((10, 8, 4), 3, dtype="int16")
    report = write(part, str(tmp_path), mode="r+", region=region)
    key = LAYOUT.shard_key((1, 1, 0))
    assert report.keys == [key]
    assert report.raw_bytes == part.nbytes
    # the shard is stored whole: the ratio compares it with its own raw bytes
    shard_raw = int(np.prod(SHARDS)) * data.itemsize
    assert report.stored_raw_bytes == shard_raw > part.nbytes
    assert report.bytes_stored == (tmp_path / key).stat().st_size
    assert report.compression_ratio == pytest.approx(shard_raw / report.bytes_stored)
    text = str(report)
    assert f"{part.nbytes / 1e6:.1f} MB of data written" in text
    assert f"the shards written hold {shard_raw / 1e6:.1f} MB raw, " in text
    assert f"(ratio {shard_raw / report.bytes_stored:.2f})" in text
    expect = data.copy()
    expect[region] = part
    assert mismatches(zarr_read(str(tmp_path)), expect) == 0


def test_compute_false_returns_delayed(tmp_path: Path) -> None:
    data = make_data()
    delayed = write(da.from_array(data, chunks=(13, 11, 7)), str(tmp_path), compute=False)
    assert isinstance(delayed, Delayed)
    # the metadata is written up front, no shard before the graph runs
    assert (tmp_path / "zarr.json").is_file()
    assert shard_files(tmp_path) == set()
    assert mismatches(zarr_read(str(tmp_path)), np.zeros_like(data)) == 0
    report = delayed.compute(scheduler="threads")
    assert isinstance(report, WriteReport)
    assert report.keys == sorted(nonempty_keys(data))
    assert mismatches(zarr_read(str(tmp_path)), data) == 0


def test_mode_w_minus_refuses_existing(tmp_path: Path) -> None:
    data = make_data()
    write(data, str(tmp_path))
    before = {k: (tmp_path / k).read_bytes() for k in shard_files(tmp_path) | {"zarr.json"}}
    with pytest.raises(FileExistsError):
        write(data + 1, str(tmp_path))  # "w-" is the default
    with pytest.raises(FileExistsError):
        write(data + 1, str(tmp_path), mode="w-")
    after = {k: (tmp_path / k).read_bytes() for k in shard_files(tmp_path) | {"zarr.json"}}
    assert after == before


def test_mode_w_replaces_array_and_old_shards(tmp_path: Path) -> None:
    data = make_data()
    write(data, str(tmp_path))
    # a different shape and chunking; shards that were stored but are now fill must disappear
    new = np.zeros((40, 30), dtype="float32")
    new[:10, :10] = 1.5
    report = shardwise.write_array(new, str(tmp_path), chunks=(5, 5), shards=(10, 10), mode="w")
    assert report.keys == ["c/0/0"]
    assert shard_files(tmp_path) == {"c/0/0"}
    got = zarr_read(str(tmp_path))
    assert got.dtype == np.float32
    assert mismatches(got, new) == 0


def test_mode_a_creates_then_writes_into(tmp_path: Path) -> None:
    data = make_data()
    write(data, str(tmp_path), mode="a")  # creates
    assert mismatches(zarr_read(str(tmp_path)), data) == 0
    patch = np.full((10, 10, 10), 9, dtype="int16")
    write(patch, str(tmp_path), mode="a", region=(slice(10, 20), slice(5, 15), slice(2, 12)))
    expected = data.copy()
    expected[10:20, 5:15, 2:12] = 9
    assert mismatches(zarr_read(str(tmp_path)), expected) == 0
    write(expected * 2, str(tmp_path), mode="a")  # the whole array
    assert mismatches(zarr_read(str(tmp_path)), expected * 2) == 0


def test_mode_r_plus_needs_existing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write(make_data(), str(tmp_path / "nothing"), mode="r+")
    assert not (tmp_path / "nothing" / "zarr.json").exists()
    data = make_data()
    write(data, str(tmp_path))
    write(data - 1, str(tmp_path), mode="r+")
    assert mismatches(zarr_read(str(tmp_path)), data - 1) == 0
    with pytest.raises(PlanError):  # wrong shape for the stored array
        write(data[:10], str(tmp_path), mode="r+")
    with pytest.raises(InvalidValueError, match="mode must be one of"):
        write(data, str(tmp_path), mode="x")  # type: ignore[arg-type]
    assert mismatches(zarr_read(str(tmp_path)), data - 1) == 0


# -- the graph stays O(#shards + #input blocks) ------------------------------------------------


def _graph_size(delayed: Delayed) -> int:
    return len(dict(delayed.__dask_graph__()))


@pytest.mark.slow
def test_graph_size_zep2_example(tmp_path: Path) -> None:
    """uint8 25000x18000x6000, inner 64^3, shards 2048^3, dask chunks 512^3: ~10 M inner chunks."""
    shape, inner, shards = (25000, 18000, 6000), (64,) * 3, (2048,) * 3
    source = da.zeros(shape, dtype="uint8", chunks=512)
    delayed = shardwise.write_array(
        source, str(tmp_path), chunks=inner, shards=shards, compute=False
    )
    assert isinstance(delayed, Delayed)
    assert (tmp_path / "zarr.json").is_file()
    assert shard_files(tmp_path) == set()  # only the metadata was written
    lay = Layout(shape, shards, inner)
    nblocks, nshards = source.npartitions, lay.nshards
    assert (nblocks, nshards) == (49 * 36 * 12, 13 * 9 * 3)
    n_inner = int(np.prod([-(-s // c) for s, c in zip(shape, inner, strict=True)]))
    ntasks = _graph_size(delayed)
    # 8 GiB shards from 128 MiB blocks: staged (shardwise.plan_write says so); source blocks +
    # one stage task per block + one shard task per shard + the reduction
    job = shardwise.plan_write(source, str(tmp_path / "b"), chunks=inner, shards=shards)
    assert job.strategy == "staged" and job.tasks == nblocks + nshards
    assert ntasks <= 2 * nblocks + nshards + 8
    assert ntasks < n_inner // 100
    # the direct strategy: source blocks + one merge and one write task per shard + reduction
    delayed = shardwise.write_array(
        source,
        str(tmp_path / "c"),
        chunks=inner,
        shards=shards,
        compute=False,
        strategy="direct",
        memory_limit=2**40,
    )
    assert _graph_size(delayed) <= nblocks + 3 * nshards + 8


def test_graph_size_misaligned_chunks(tmp_path: Path) -> None:
    shape, inner, shards = (8192, 8192, 4096), (64,) * 3, (2048,) * 3
    source = da.zeros(shape, dtype="uint8", chunks=500)
    delayed = shardwise.write_array(
        source, str(tmp_path), chunks=inner, shards=shards, compute=False
    )
    nblocks, nshards = source.npartitions, Layout(shape, shards, inner).nshards
    ntasks = _graph_size(delayed)
    # staged: block edges move to inner-chunk boundaries, so a block takes pieces of at most 2
    # source blocks per dimension (8 splits and a merge), then one stage task per block
    assert ntasks <= (2**3 + 2) * nblocks + nshards + 8
    # direct: rechunking a misaligned source splits each block at most once per shard boundary
    delayed = shardwise.write_array(
        source,
        str(tmp_path / "d"),
        chunks=inner,
        shards=shards,
        compute=False,
        strategy="direct",
        memory_limit=2**40,
    )
    assert _graph_size(delayed) <= 4 * (nblocks + nshards) + 8
    assert shard_files(tmp_path) == set()


# -- a real cluster with worker processes ---------------------------------------------------------


def _run_on_cluster(client: Any, fn: Any) -> tuple[Any, list[dict[str, Any]]]:
    from distributed import get_task_stream

    with dask.config.set(scheduler=client), get_task_stream(client) as ts:
        result = fn()
    return result, ts.data


def _key_name(key: Any) -> str:
    """The name of a task key: tuple keys (array blocks) or plain string keys (delayed)."""
    return str(key[0] if isinstance(key, tuple) else key)


@pytest.mark.slow
@pytest.mark.parametrize("chunking", ["misaligned", "irregular", "inner", "smaller", "larger"])
def test_any_chunking_on_cluster(client: Any, tmp_path: Path, chunking: str) -> None:
    data = make_data()
    source = da.from_array(data, chunks=CHUNKINGS[chunking])
    report, stream = _run_on_cluster(client, lambda: write(source, str(tmp_path)))
    want = nonempty_keys(data)
    assert mismatches(zarr_read(str(tmp_path)), data) == 0
    assert report.keys == sorted(want)  # one receipt per written shard, no duplicates
    assert shard_files(tmp_path) == want  # no leftover temporary files
    writes = [t for t in stream if _key_name(t["key"]).startswith("shardwise-write")]
    assert len(writes) == LAYOUT.nshards  # one write task per shard (direct or staged)
    assert len({t["key"] for t in writes}) == LAYOUT.nshards
    assert {t["worker"] for t in writes} <= cluster_workers(client)
    # and read back on the cluster
    got, _ = _run_on_cluster(client, lambda: shardwise.open_array(str(tmp_path)).compute())
    assert mismatches(got, data) == 0


@pytest.mark.slow
def test_one_set_per_shard_across_worker_processes(client: Any, tmp_path: Path) -> None:
    data = make_data()
    log = tmp_path / "sets.log"
    store = LoggingStore(LocalStore(tmp_path / "array"), str(log))
    source = da.from_array(data, chunks=CHUNKINGS["misaligned"])
    report, _ = _run_on_cluster(client, lambda: write(source, store))
    entries = store.entries()
    counts = Counter(k for _, k in entries if is_shard_key(k) or k == "zarr.json")
    want = nonempty_keys(data)
    assert counts == Counter({"zarr.json": 1, **dict.fromkeys(want, 1)})
    pids = {p for p, k in entries if is_shard_key(k)}
    assert os.getpid() not in pids  # shards were written by the worker processes
    worker_pids = set(client.run(os.getpid).values())
    assert pids <= worker_pids
    assert report.keys == sorted(want)
    assert mismatches(zarr_read(str(tmp_path / "array")), data) == 0


@pytest.mark.slow
def test_rewrite_on_cluster_replaces_each_shard_once(client: Any, tmp_path: Path) -> None:
    """Each shard of the rewrite is stored exactly once by the worker processes (counted as the
    kernel sees it: one rename into place per store write), the all-fill one deleted once."""
    data = make_data()
    write(data, str(tmp_path))
    inodes = {k: (tmp_path / k).stat().st_ino for k in shard_files(tmp_path)}
    new = data + 1
    new[:16, :12, :8] = 0
    want = nonempty_keys(new)
    dirs = {p for p in (tmp_path / "c").rglob("*") if p.is_dir()}
    assert {(tmp_path / k).parent for k in want} <= dirs  # every shard lands in a watched dir
    source = da.from_array(new, chunks=CHUNKINGS["irregular"])
    with FileEvents(dirs) as seen:
        report, _ = _run_on_cluster(client, lambda: write(source, str(tmp_path), mode="r+"))
        events = seen.read()
    done = Counter(
        (kind, p.relative_to(tmp_path).as_posix())
        for kind, p in events
        if not p.name.endswith(".partial")  # a temp file removed: no store write
    )
    assert done == Counter({("renamed", k): 1 for k in want} | {("deleted", "c/0/0/0"): 1})
    assert report.keys == sorted(want)
    assert report.shards_deleted == 1
    assert shard_files(tmp_path) == want
    # every rewritten shard is a new file (atomic rename), never modified in place
    for k in want & inodes.keys():
        assert (tmp_path / k).stat().st_ino != inodes[k]
    assert mismatches(zarr_read(str(tmp_path)), new) == 0
