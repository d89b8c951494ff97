"""Shard tasks in runs (engine/runs.py): a source without a dask graph is read window by window
inside tasks that each write a run of neighbouring shards, so a write's tasks follow the threads
that run them, not its shard count; every shard still has one writer, one put and one record."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr

import shardwise
from memkit import MiB, peak_rss
from shardwise.core.cost import RUN_FLUSH
from shardwise.core.job import MAX_RUNS, MIN_RUNS, shards_per_task
from shardwise.core.layout import Layout
from shardwise.core.plan import ShardPlan
from shardwise.durability.journal import RECORDS, RUNS
from shardwise.engine.runs import ShardRuns

KW: dict[str, Any] = dict(chunks=(1, 8), shards=(1, 16))  # tiny shards: many of them


def ramp(shape: tuple[int, ...]) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype="i4").reshape(shape)


class Windows:
    """A source with shape, dtype and __getitem__ only (as an h5py or netCDF4 variable): counts
    the windows read, and fails on the ``fail_at``-th read when asked."""

    def __init__(self, values: np.ndarray, fail_at: int | None = None) -> None:
        self.values = values
        self.shape, self.dtype, self.ndim = values.shape, values.dtype, values.ndim
        self.reads: list[tuple[slice, ...]] = []
        self.fail_at = fail_at

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        if self.fail_at is not None and len(self.reads) + 1 == self.fail_at:
            raise OSError("the source went away")
        self.reads.append(key)
        return self.values[key].copy()


def graph_tasks(delayed: Any) -> int:
    return len(dict(delayed.__dask_graph__()))


def test_shards_per_task_follows_the_threads_within_bounds() -> None:
    assert shards_per_task(MIN_RUNS, 2) == 1  # small writes: one task per shard, as before
    assert shards_per_task(MIN_RUNS + 1, 2) == 2
    assert -(-1_000_000 // shards_per_task(1_000_000, 2)) <= MIN_RUNS
    # a large cluster: more tasks, never more than MAX_RUNS
    assert 15 * 256 < -(-1_000_000 // shards_per_task(1_000_000, 256)) <= 16 * 256
    assert -(-(10**7) // shards_per_task(10**7, 10**5)) <= MAX_RUNS


def test_the_graph_does_not_grow_with_the_shards(tmp_path: Path) -> None:
    """The same write of 4x the shards has the same number of graph keys: one per run, one
    holding the source, a few to finish."""
    sizes = {}
    for rows in (2048, 8192):
        x = ramp((rows, 32))  # 2 shards a row
        job = shardwise.plan_write(x, str(tmp_path / f"p{rows}"), **KW)
        assert job.shards == 2 * rows and job.per_task > 1
        assert job.tasks == -(-job.shards // job.per_task) <= MIN_RUNS
        d = shardwise.write_array(x, str(tmp_path / f"w{rows}"), compute=False, **KW)
        sizes[rows] = graph_tasks(d)
        assert sizes[rows] <= job.tasks + 4, (sizes, job)
    assert sizes[2048] == sizes[8192], sizes


def test_runs_store_the_bytes_one_task_per_shard_stores(tmp_path: Path) -> None:
    """Written in runs from a window source, or one task per shard from a dask array with one
    chunk per shard: the same shard objects byte for byte, read back right by zarr-python, and
    verify clean; every window read once, each exactly one shard's piece."""
    x = ramp((1200, 32))
    src = Windows(x)
    with dask.config.set(scheduler="threads"):
        rep = shardwise.write_array(src, str(tmp_path / "runs"), **KW)
        one = shardwise.write_array(da.from_array(x, chunks=(1, 16)), str(tmp_path / "one"), **KW)
    assert rep.shards_written == one.shards_written == 2400
    assert sorted(src.reads, key=repr) == sorted(
        ((slice(r, r + 1), slice(c, c + 16)) for r in range(1200) for c in (0, 16)), key=repr
    )
    a, b = (zarr.open_array(str(tmp_path / n), mode="r") for n in ("runs", "one"))
    np.testing.assert_array_equal(a[...], x)
    sa, sb = a.store, b.store
    for key in ("c/0/0", "c/517/1", "c/1199/1"):
        assert (tmp_path / "runs" / key).read_bytes() == (tmp_path / "one" / key).read_bytes()
    del sa, sb
    assert shardwise.verify(str(tmp_path / "runs")).ok


def test_a_run_stopped_half_way_keeps_its_shards_and_a_resume_writes_only_the_rest(
    tmp_path: Path,
) -> None:
    """A source that fails on its 700th window: the shards written before stay stored and
    recorded; the resume skips exactly them, writes the others, never rewrites one, and
    verify is clean."""
    x = ramp((1100, 32))  # 2200 shards: runs of 3
    path = str(tmp_path / "a")
    with dask.config.set(scheduler="sync"), pytest.raises(OSError, match="went away"):
        shardwise.write_array(Windows(x, fail_at=700), path, **KW)
    stored = {
        p.relative_to(tmp_path / "a").as_posix(): p.stat().st_ino
        for p in (tmp_path / "a" / "c").rglob("*")
        if p.is_file()
    }
    assert len(stored) == 699
    again = Windows(x)
    with dask.config.set(scheduler="sync"):
        rep = shardwise.write_array(again, path, mode="w-", resume=True, **KW)
    assert rep.shards_skipped == 699 and rep.shards_written == 2200 - 699
    assert len(again.reads) == 2200 - 699
    for key, ino in stored.items():  # not rewritten: the same file
        assert (tmp_path / "a" / key).stat().st_ino == ino
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], x)
    assert shardwise.verify(path).ok


def test_resumed_runs_leave_out_runs_whose_shards_are_all_done(tmp_path: Path) -> None:
    x = ramp((1100, 32))
    plan = ShardPlan(Layout((1100, 32), (1, 16), (1, 8)), (slice(0, 1100), slice(0, 32)))
    writer: Any = SimpleNamespace(plan=plan)  # what the runs' bookkeeping reads of it
    keep = np.ones((1100, 2), dtype=bool)
    keep[:10] = False  # the first 20 shards done: the first 6 runs of 3 (18 shards) left out
    runs = ShardRuns(writer, x, per_task=3, keep=keep)
    todo = runs.runs()
    assert todo[0] == 6 and len(todo) == runs.nruns - 6
    assert list(runs.locations(6)) == [(10, 0)]  # (9, 0), (9, 1) of run 6 done
    assert runs.nshards == 2200 - 20


def lazy_case(root: str, src: str) -> Any:
    """write_array of a variable xarray opened without chunks (not loaded): 32 MiB."""
    var = xr.open_zarr(src, chunks=None, consolidated=False)["v"]

    def op() -> None:
        with dask.config.set(scheduler="sync"):
            shardwise.write_array(var, root, chunks=(1, 512), shards=(4, 1024), threads=1)

    return op


def test_a_lazy_xarray_variable_is_read_shard_by_shard(tmp_path: Path) -> None:
    """A 32 MiB variable opened without chunks is written holding a few shards (16 KiB each),
    never the variable: its windows are read by the shard tasks, not loaded first."""
    x = ramp((8192, 1024))
    src = str(tmp_path / "src.zarr")
    xr.Dataset({"v": (("y", "x"), x)}).to_zarr(
        src, zarr_format=3, consolidated=False, encoding={"v": {"chunks": (64, 1024)}}
    )
    root = str(tmp_path / "out")
    peak = peak_rss(lazy_case, root=root, src=src).peak
    np.testing.assert_array_equal(zarr.open_array(root, mode="r")[...], x)
    # 2048 shards of 16 KiB in runs, each window read through xarray and zarr-python (their
    # buffers, a 256 KiB source chunk decoded per window, the report's keys): measured about
    # 9.5 MiB. Loading the variable first would hold all of its 32 MiB.
    assert peak <= 16 * MiB, peak


def test_runs_on_worker_processes(client: Any, tmp_path: Path) -> None:
    """A run graph on a LocalCluster of worker processes: the source travels in one key,
    every shard lands once, verify is clean."""
    x = ramp((1500, 32))
    path = str(tmp_path / "c")
    with dask.config.set(scheduler=client.get):
        job = shardwise.plan_write(x, path, **KW)
        d = shardwise.write_array(x, path, compute=False, **KW)
        assert graph_tasks(d) <= job.tasks + 4
        rep = client.compute(d).result()
    assert rep.shards_written == 3000
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], x)
    assert shardwise.verify(path).ok


def test_runs_into_an_icechunk_session(tmp_path: Path) -> None:
    """Into an icechunk session, each run writes into one fork of its own, merged into the
    session; the commit holds every shard."""
    icechunk = pytest.importorskip("icechunk")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "r")))
    x = ramp((1100, 32))
    with dask.config.set(scheduler="threads"):
        rep = shardwise.write_array(
            Windows(x), repo.writable_session("main"), path="a", commit="runs", **KW
        )
    assert rep.shards_written == 2200
    got = zarr.open_array(repo.readonly_session("main").store, path="a", mode="r")[...]
    np.testing.assert_array_equal(got, x)


def test_the_plan_prints_objects_requests_and_cost(tmp_path: Path) -> None:
    x = ramp((2048, 32))
    job = shardwise.plan_write(x, str(tmp_path / "p"), **KW)
    req = job.requests
    # every shard, a record object a run of 4 (a create), the metadata and the marker
    assert job.per_task == 4 and req.objects == 4096 + 1024 + 2
    assert req.puts >= req.objects and req.gets == 0 and req.parts == 0
    # what the write then stores: exactly those objects
    shardwise.write_array(x, str(tmp_path / "w"), **KW)
    stored = [p for p in (tmp_path / "w").rglob("*") if p.is_file() and "lease" not in p.name]
    assert len(stored) == req.objects
    assert f"PUT {req.puts:,}" in str(job) and "per TiB" in str(job)
    # the graph's memory, from the measured figures per task and per shard
    from shardwise.core.cost import graph_memory

    client, scheduler = graph_memory(job.tasks, job.shards)
    assert scheduler == job.tasks * 8 * 1024 and client > job.tasks * 1000
    assert "on the client" in str(job) and "on the scheduler" in str(job)
    assert req.cost() == pytest.approx((req.puts * 0.005 + req.lists * 0.005) / 1000)
    from shardwise.core.cost import Prices

    assert req.cost(Prices(put=1.0, get=0, list=0)) == pytest.approx(req.puts / 1000)
    # a region covering shards in part reads them first: one GET each
    small = ramp((40, 32))
    shardwise.write_array(small, str(tmp_path / "r"), chunks=(4, 8), shards=(8, 16))
    part = shardwise.plan_write(
        small[:10, :10], str(tmp_path / "r"), region=(slice(3, 13), slice(5, 15)), mode="r+"
    )
    assert part.plan.npartial == 2 and part.requests.gets == 2


# -- the runs' records: one object a run, shard-exact for verify and resume -----------------------


def test_a_create_in_runs_records_each_run_in_one_object(tmp_path: Path) -> None:
    """2200 shards in runs of 3: one record object a run (not one a shard); verify counts every
    shard as recorded, reports a deleted one as missing and a rewritten one as a mismatch."""
    x = ramp((1100, 32))
    path = tmp_path / "a"
    shardwise.write_array(x, str(path), **KW)
    runs = list((path / RUNS).iterdir())
    assert len(runs) == -(-2200 // 3) and not (path / RECORDS).exists()
    report = shardwise.verify(str(path))
    assert report.ok and report.shards_recorded == 2200
    (path / "c/17/1").unlink()
    (path / "c/18/0").write_bytes((path / "c/19/0").read_bytes())
    report = shardwise.verify(str(path))
    assert [(p.kind, p.key.rsplit("/a/", 1)[-1]) for p in report.problems] == [
        ("missing", "c/17/1")
    ]
    assert [(p.kind, p.key.rsplit("/a/", 1)[-1]) for p in report.changes] == [
        ("mismatch", "c/18/0")
    ]


def test_later_writes_over_runs_records_leave_verify_clean(tmp_path: Path) -> None:
    """A region write after a create in runs: the shards it empties are gone without a record
    of their own (the run's record of them no longer stands), those it rewrites have their
    own record (it wins over the run's)."""
    x = ramp((1100, 32))
    path = str(tmp_path / "a")
    shardwise.write_array(x, path, **KW)
    shardwise.write_array(np.zeros((4, 32), "i4"), path, region=(slice(10, 14), ...), mode="r+")
    shardwise.write_array(-ramp((3, 16)), path, region=(slice(20, 23), slice(16, 32)), mode="r+")
    x[10:14] = 0
    x[20:23, 16:] = -ramp((3, 16))
    assert not (tmp_path / "a" / "c/10/0").exists()
    report = shardwise.verify(path)
    assert report.ok, report.problems
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], x)


def test_an_unreadable_run_record_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "a"
    shardwise.write_array(ramp((1100, 32)), str(path), **KW)
    first = sorted((path / RUNS).iterdir())[0]
    first.write_bytes(b"{not json")
    problems = shardwise.verify(str(path)).problems
    assert ("journal", "unreadable run record") in {(p.kind, p.message) for p in problems}
    assert any(p.key.endswith(first.name) for p in problems)


KILLED = """
import sys, threading, pathlib
import numpy as np, dask, shardwise
flag = pathlib.Path(sys.argv[2])

class Held:
    shape, dtype, ndim = (1100, 32), np.dtype("i4"), 2
    reads = 0
    def __getitem__(self, key):
        Held.reads += 1
        if Held.reads == 500:  # shards 0..498 written: say so, then wait to be killed
            flag.write_text("held")
            threading.Event().wait()
        return np.arange(1100 * 32, dtype="i4").reshape(1100, 32)[key]

with dask.config.set(scheduler="sync"):
    shardwise.write_array(Held(), sys.argv[1], chunks=(1, 8), shards=(1, 16))
"""


def test_a_task_killed_outright_loses_at_most_a_flush_of_records(tmp_path: Path) -> None:
    """A writer killed (SIGKILL) inside a run: its runs' records were put every RUN_FLUSH
    shards, so the resume skips all but at most RUN_FLUSH - 1 of the shards written, rewrites
    those, and verify is clean."""
    import subprocess
    import sys

    path, flag = str(tmp_path / "a"), tmp_path / "flag"
    child = subprocess.Popen([sys.executable, "-c", KILLED, path, str(flag)])
    try:
        while not flag.exists():  # the state we need: the writer is held at its 500th read
            if child.poll() is not None:
                raise AssertionError(f"the writer ended first: {child.returncode}")
            threading.Event().wait(0.05)
        child.kill()
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    written = len([p for p in (tmp_path / "a" / "c").rglob("*") if p.is_file()])
    assert written == 499
    x = ramp((1100, 32))
    with dask.config.set(scheduler="sync"):
        rep = shardwise.write_array(x, path, mode="w-", resume=True, **KW)
    assert written - RUN_FLUSH < rep.shards_skipped <= written
    assert rep.shards_skipped + rep.shards_written == 2200
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], x)
    assert shardwise.verify(path).ok


def test_parts_of_runs_and_of_dask_arrays_keep_their_own_reports() -> None:
    """A write's parts computed together, runs (Delayed reports) beside dask arrays of receipts:
    each part's report is its own (dask's compute of Delayed and arrays together returns the
    Delayed results first, whatever their order; every part goes as one Delayed)."""
    from dask.delayed import delayed

    from shardwise.engine.report import WriteReport
    from shardwise.write.compute import compute_parts

    def receipt(key: str) -> np.ndarray:
        out = np.empty((1,), dtype=object)
        out[0] = WriteReport(shards_written=1, keys=[key])
        return out

    arrays = [
        da.from_array(np.zeros(2), chunks=1).map_blocks(
            lambda b, k=k: receipt(k), dtype=object, meta=np.empty((0,), dtype=object)
        )
        for k in ("c/0", "c/1/0")
    ]
    runs = [delayed(WriteReport, pure=False)(shards_written=1, keys=[k]) for k in ("c/7", "c/8")]
    parts = [("a", arrays[0]), ("r", [runs[0]]), ("b", arrays[1]), ("s", [runs[1]])]
    with dask.config.set(scheduler="sync"):
        rep = compute_parts(parts, progress=False)
    assert rep.keys == ["a/c/0", "a/c/0", "b/c/1/0", "b/c/1/0", "r/c/7", "s/c/8"]
