"""The write policy's edges that the mode, resume and refusal tests pass through without pinning
them (survivors of the mutation lane, `mutation/run.py write/intent`): a deferred write of a numpy
array writes the array as it was at the call; a write into an existing array ("a", "r+") keeps the
stored layout whatever layout keywords it is given; "w-" over an array refuses with its own advice
before any keyword is looked at; a resumed "w-" finds the write it resumes at a path inside a
store, and refuses when there is none; a resumed region write never replaces the array; resume
with ``compute=False`` finishes the interrupted write when computed; another writer's array
(same metadata) found by the create is refused, while this write's own create whose answer was
lost counts as done; a region write where no array is refused with its advice; to_zarr writes
each of its variables once (`mutation/run.py write/pipeline`); a resumed "r+" over nothing
creates nothing, a resumed "a" over an array without a journal writes it, and over a finished
write rewrites no shard; the plan of a numpy source of many shards runs them in runs (a dask
source and a staged write one per task), and the plan of a write into an icechunk session is
direct and says why. Each test names the mutants it kills. Real stores: local files (and zarr's
own arrays, an icechunk repository on local files)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from zarr.abc.store import Store
from zarr.storage import LocalStore, MemoryStore, WrapperStore

import shardwise
from faultkit import snapshot, wait_until
from shardwise.durability.lease import LEASE, LeaseInfo, read_lease
from shardwise.errors import ArrayExistsError, InvalidValueError, LeaseHeldError
from shardwise.storage.store import ShardStore
from shardwise.write.intent import create_metadata

LAYOUT = dict(chunks=(2, 2), shards=(4, 4))


def data() -> np.ndarray:
    return np.arange(64, dtype=np.int16).reshape(8, 8)


def test_compute_false_writes_the_numpy_array_as_it_was_at_the_call(tmp_path: Path) -> None:
    # kills array_write_54 (the numpy source not copied into the deferred graph)
    x = data()
    want = x.copy()
    delayed = shardwise.write_array(x, tmp_path / "a", compute=False, **LAYOUT)
    x[:] = -1  # the caller reuses its buffer before the write runs
    delayed.compute()
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a")[:], want)


@pytest.mark.parametrize("mode", ["a", "r+"])
def test_a_write_into_an_array_keeps_its_stored_layout(tmp_path: Path, mode: str) -> None:
    # kills resolve_48 (the layout of the keywords, built in memory, taken for the stored one)
    shardwise.write_array(data(), tmp_path / "a", **LAYOUT)
    shardwise.write_array(data() + 1, tmp_path / "a", mode=mode, chunks=(8, 8), shards=(8, 8))
    z = zarr.open_array(tmp_path / "a")
    assert (z.chunks, z.shards) == ((2, 2), (4, 4))
    np.testing.assert_array_equal(z[:], data() + 1)
    assert shardwise.verify(tmp_path / "a").ok


@pytest.mark.parametrize(
    "other", [dict(chunks=(8, 8), shards=(8, 8)), dict(chunks=(3, 3), shards=(4, 4)), LAYOUT]
)
def test_w_minus_over_an_array_refuses_first_with_its_advice(tmp_path: Path, other: dict) -> None:
    # kills resolve_28 (the refusal left to the metadata comparison: another message, and
    # keyword errors of the new layout first)
    shardwise.write_array(data(), tmp_path / "a", **LAYOUT)
    before = snapshot(tmp_path / "a")
    with pytest.raises(ArrayExistsError, match=r"already exists \(use mode='w' to replace it\)"):
        shardwise.write_array(data() + 1, tmp_path / "a", **other)
    assert snapshot(tmp_path / "a") == before


def test_a_resumed_w_minus_with_no_write_to_resume_is_refused(tmp_path: Path) -> None:
    # kills decide_42 (must_adopt never set: the array rewritten instead)
    shardwise.write_array(data(), tmp_path / "a", **LAYOUT)
    shutil.rmtree(tmp_path / "a" / ".shardwise")  # an array without a journal (copied)
    before = snapshot(tmp_path / "a")
    with pytest.raises(ArrayExistsError, match="without an interrupted write"):
        shardwise.write_array(data() + 1, tmp_path / "a", mode="w-", resume=True, **LAYOUT)
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a")[:], data())
    assert {k: v for k, v in snapshot(tmp_path / "a").items() if ".shardwise" not in k} == {
        k: v for k, v in before.items() if ".shardwise" not in k
    }


def test_a_resumed_w_minus_at_a_path_in_a_store_adopts_the_finished_write(
    tmp_path: Path,
) -> None:
    # kills resolve_78 (the stored metadata compared at the store's root, not at the path)
    root = tmp_path / "s.zarr"
    zarr.create_group(root)
    shardwise.write_array(data(), root, path="g/x", **LAYOUT)
    before = snapshot(root / "g" / "x")
    report = shardwise.write_array(data(), root, path="g/x", mode="w-", resume=True, **LAYOUT)
    assert report.shards_written == 0 and report.shards_skipped == 4
    after = snapshot(root / "g" / "x")
    assert {k: after[k] for k in before if ".shardwise" not in k} == {
        k: v for k, v in before.items() if ".shardwise" not in k
    }


def test_a_resumed_region_write_in_mode_w_keeps_the_rest_of_the_array(tmp_path: Path) -> None:
    # kills resolve_58 (the array kept by a resumed region write taken for another's: replaced)
    shardwise.write_array(data(), tmp_path / "a", **LAYOUT)
    region = (slice(0, 4), slice(None))
    shardwise.write_array(data()[:4] + 100, tmp_path / "a", mode="w", resume=True, region=region)
    want = data()
    want[:4] += 100
    z = zarr.open_array(tmp_path / "a")
    assert (z.shape, z.chunks, z.shards) == ((8, 8), (2, 2), (4, 4))
    np.testing.assert_array_equal(z[:], want)


@pytest.mark.parametrize("mode", ["a", "w-", "w"])
def test_a_region_write_where_no_array_is_refused_with_its_advice(
    tmp_path: Path, mode: str
) -> None:
    # kills resolve_66 (the refusal's message)
    region = (slice(0, 4), slice(None))
    with pytest.raises(InvalidValueError) as err:
        shardwise.write_array(data()[:4], tmp_path / "a", mode=mode, resume=True, region=region)
    assert str(err.value) == "region= needs an existing array (mode='r+' or 'a')"
    assert not (tmp_path / "a").exists()


def test_resume_with_compute_false_finishes_the_interrupted_write(tmp_path: Path) -> None:
    """A write whose source fails on its last block, resumed with ``compute=False``: nothing
    runs at the call; the computed graph writes only the shards the failed try left."""
    x = data()
    a = tmp_path / "a"
    stored = lambda: len([k for k in snapshot(a) if k.startswith("c/")]) == 3  # noqa: E731

    def fail_last(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
        assert block_info is not None
        if block_info[0]["chunk-location"] == (1, 1):
            wait_until(stored, "the other three shards stored", 300)
            raise RuntimeError("source failed")
        return block

    src = da.from_array(x, chunks=(4, 4)).map_blocks(fail_last, dtype=x.dtype)
    threads = dask.config.set(scheduler="threads", num_workers=4)
    with threads, pytest.raises(RuntimeError, match="source"):
        shardwise.write_array(src, a, **LAYOUT)
    done = snapshot(tmp_path / "a")
    shards = {k for k in done if k.startswith("c/")}
    assert len(shards) == 3
    delayed = shardwise.write_array(x, tmp_path / "a", resume=True, compute=False, **LAYOUT)
    assert {k for k in snapshot(tmp_path / "a") if k.startswith("c/")} == shards
    report = delayed.compute()
    assert report.shards_written == 1 and report.shards_skipped == 3
    after = snapshot(tmp_path / "a")
    assert {k: after[k] for k in shards} == {k: done[k] for k in shards}  # none written again
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a")[:], x)
    assert shardwise.verify(tmp_path / "a").ok
    # resumed again, deferred, once finished: nothing left to write, every shard done before
    again = shardwise.write_array(x, a, resume=True, compute=False, **LAYOUT).compute()
    assert again.shards_written == 0 and again.shards_skipped == 4
    final = snapshot(a)
    assert {k: v for k, v in final.items() if k.startswith("c/")} == {
        k: v for k, v in after.items() if k.startswith("c/")
    }


def test_create_metadata_refuses_an_array_another_writer_created_first(tmp_path: Path) -> None:
    # kills create_metadata_13 (another writer's array of the same metadata, found on the first
    # try, counted as this write's own)
    kwargs = dict(shape=(8, 8), dtype="int16", **LAYOUT)
    probe = zarr.create_array(MemoryStore(), **kwargs)
    zstore = LocalStore(tmp_path / "s.zarr")
    create_metadata(zstore, "mine", kwargs, probe)  # nothing there: created
    assert zarr.open_array(zstore, path="mine").shape == (8, 8)
    zarr.create_array(zstore, name="theirs", **kwargs)
    with pytest.raises(ArrayExistsError, match="created by another writer"):
        create_metadata(zstore, "theirs", kwargs, probe)


class LostAnswer(WrapperStore[Store]):
    """A store whose first write of an array's ``zarr.json`` is stored but answered with a
    dropped connection (a transient failure: the request went through, its answer was lost)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.lost = 0

    async def set(self, key: str, value: Any) -> None:
        await self._store.set(key, value)
        if key.endswith("zarr.json") and not self.lost:
            self.lost += 1
            raise ConnectionResetError(f"the answer to the write of {key} was lost")


def test_create_metadata_counts_its_own_create_whose_answer_was_lost(tmp_path: Path) -> None:
    # kills create_metadata_17 (the stored metadata compared without the probe) and
    # create_metadata_27 (the first try not remembered: its own array refused as another's)
    kwargs = dict(shape=(8, 8), dtype="int16", **LAYOUT)
    probe = zarr.create_array(MemoryStore(), **kwargs)
    zstore = LostAnswer(LocalStore(tmp_path / "s.zarr"))
    create_metadata(zstore, "mine", kwargs, probe)  # stored, its answer lost, tried again: done
    assert zstore.lost == 1
    z = zarr.open_array(LocalStore(tmp_path / "s.zarr"), path="mine")
    assert (z.shape, z.chunks, z.shards, z.dtype) == ((8, 8), (2, 2), (4, 4), np.int16)


# a LocalCluster on threads (processes=False) starts no process: a fast test (0.3 s), its id
# without the slow word "cluster" (slowmarks.py: "localcluster" is one word)
@pytest.mark.parametrize("where", ["threads", "processes", "LocalCluster-on-threads"])
def test_the_job_asks_the_scheduler_the_write_runs_on(tmp_path: Path, where: str) -> None:
    """A misaligned dask source is rechunked in memory (direct) on this process's threads and on
    a LocalCluster made here, and staged on other schedulers: the job of every front end asks
    dask's default scheduler once (job_for)."""
    # kills job_for_12 (the dask chunks not read: a misaligned source taken for numpy) and
    # job_for_38 and _42 (a LocalCluster taken for a remote cluster)
    source = da.zeros((16, 16), dtype="uint16", chunks=(6, 6))
    if where == "LocalCluster-on-threads":
        from distributed import Client

        with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None):
            plan = shardwise.plan_write(source, tmp_path / "p", chunks=(4, 4), shards=(8, 8))
        assert "LocalCluster" in plan.reason, plan.reason
    else:
        with dask.config.set(scheduler=where):
            plan = shardwise.plan_write(source, tmp_path / "p", chunks=(4, 4), shards=(8, 8))
    assert plan.strategy == ("staged" if where == "processes" else "direct"), plan.reason
    assert plan.source_chunks == ((6, 6, 4), (6, 6, 4))


def test_to_zarr_writes_each_variable_once(tmp_path: Path) -> None:
    # kills Pipeline.parts_3 (every array's part built for each variable asked: each written
    # as many times as there are variables, and counted so)
    import xarray as xr

    ds = xr.Dataset({"a": (("y", "x"), data()), "b": (("y", "x"), data() * 2)})
    enc = {name: dict(LAYOUT) for name in ds.data_vars}
    report = shardwise.to_zarr(ds, tmp_path / "s.zarr", encoding=enc)
    stored = [k for k in snapshot(tmp_path / "s.zarr") if "/c/" in k and ".shardwise" not in k]
    assert report.shards_written == len(stored) == 8, (report, stored)
    with xr.open_zarr(tmp_path / "s.zarr") as got:
        xr.testing.assert_identical(got.load(), ds)


def test_break_lease_reaches_the_write_sessions(tmp_path: Path) -> None:
    # kills Pipeline.__init___6 and __enter___7 (break_lease=True dropped on its way to the
    # sessions: a dead writer's lease refuses the write all the same)
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **LAYOUT)
    st = ShardStore(LocalStore(root))
    st.put(LEASE, LeaseInfo("0" * 32, "a killed write", "elsewhere", 1, "u", "2020").to_bytes())
    with pytest.raises(LeaseHeldError, match="a killed write"):
        shardwise.write_array(data() + 1, root, mode="r+")
    shardwise.write_array(data() + 1, root, mode="r+", break_lease=True)
    np.testing.assert_array_equal(shardwise.read_array(root), data() + 1)
    assert read_lease(st) is None


def _stats(root: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime in ns) of every shard object under ``root``, the journal left out."""
    return {
        p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and ".shardwise" not in p.relative_to(root).parts and p.name != "zarr.json"
    }


@pytest.mark.parametrize("where", ["root", "path"])
def test_a_resumed_r_plus_over_nothing_creates_nothing(tmp_path: Path, where: str) -> None:
    # kills resolve's "r+ and not exists" refusal skipped for a resume (the array created)
    root = tmp_path / "s"
    root.mkdir()
    (root / "other.txt").write_text("kept")
    before = snapshot(root)
    path = None if where == "root" else "g/a"
    with pytest.raises(shardwise.ArrayNotFoundError, match="mode='r\\+'"):
        shardwise.write_array(data(), root, path=path, mode="r+", resume=True, **LAYOUT)
    assert snapshot(root) == before


def test_a_resumed_a_over_an_array_without_a_journal_writes(tmp_path: Path) -> None:
    # kills decide's must_adopt without "mode == 'w-'" (mode "a" refused with nothing to adopt)
    root = tmp_path / "a"
    zarr.create_array(LocalStore(root), shape=(8, 8), dtype="i2", chunks=(2, 2), shards=(4, 4))
    report = shardwise.write_array(data(), root, mode="a", resume=True)
    assert report.shards_written == 4
    np.testing.assert_array_equal(zarr.open_array(root, mode="r")[:], data())
    assert shardwise.verify(root).ok


def test_a_resumed_a_over_a_finished_write_rewrites_no_shard(tmp_path: Path) -> None:
    # kills decide's adopt_done for mode "a" (every shard of a finished write written again)
    root = tmp_path / "a"
    shardwise.write_array(data(), root, **LAYOUT)
    before = _stats(root)
    assert len(before) == 4
    report = shardwise.write_array(data(), root, mode="a", resume=True)
    assert report.shards_written == 0
    assert _stats(root) == before, "a shard object was written again"
    np.testing.assert_array_equal(zarr.open_array(root, mode="r")[:], data())


def test_the_plan_of_many_shards_from_numpy_runs_them_in_runs(tmp_path: Path) -> None:
    """A numpy source of more shards than a write runs tasks for (``MIN_RUNS``) is written by
    tasks of several neighbouring shards each, as many as the threads want; a dask source keeps
    one task per shard, its blocks the graph's, and so does a staged write."""
    # kills job_for's runs dropped for arrays (job_for_104, _114, the role's default) and
    # _runs' choice of direct numpy sources (_runs_2, _5, _12)
    from shardwise.core.job import shards_per_task
    from shardwise.runtime.probes import default_threads

    x = np.zeros((2048, 2048), dtype="i1")  # 4096 shards of 32 x 32
    per = shards_per_task(4096, default_threads(True))
    assert per > 1
    with dask.config.set(scheduler="threads"):
        plan = shardwise.plan_write(x, tmp_path / "a", chunks=32, shards=32)
        assert (plan.strategy, plan.per_task) == ("direct", per), plan.reason
        assert plan.source_chunks is None
        staged = shardwise.plan_write(x, tmp_path / "a", chunks=32, shards=32, strategy="staged")
        assert (staged.strategy, staged.per_task) == ("staged", 1)
        lazy = da.from_array(x, chunks=512)
        plan = shardwise.plan_write(lazy, tmp_path / "a", chunks=32, shards=32)
        assert (plan.strategy, plan.per_task) == ("direct", 1), plan.reason
        assert plan.source_chunks == ((512,) * 4, (512,) * 4)


def test_the_plan_of_a_write_into_a_session_is_direct_and_says_why(tmp_path: Path) -> None:
    """A write into an icechunk session runs direct when asked "auto" (a staged write's pieces
    have no place in the session): its plan says so, and a numpy source of many shards is run in
    runs of neighbouring shards there too."""
    # kills job_for's forks branch (its strategy, reason, what was asked, the runs: job_for_58,
    # _61, _64, _65, _81)
    import icechunk

    from shardwise.core.job import shards_per_task
    from shardwise.runtime.probes import default_threads

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "r")))
    session = repo.writable_session("main")
    x = np.zeros((2048, 2048), dtype="i1")
    with dask.config.set(scheduler="threads"):
        plan = shardwise.plan_write(x, session, path="a", chunks=32, shards=32)
    assert (plan.strategy, plan.requested) == ("direct", "auto")
    assert plan.reason == (
        "into an icechunk session: each shard task writes its whole shards into its fork"
    )
    assert plan.per_task == shards_per_task(4096, default_threads(True)) > 1
    # a dask source's blocks are its graph's: one task per shard there too
    with dask.config.set(scheduler="threads"):
        lazy = shardwise.plan_write(
            da.from_array(x, chunks=512), session, path="a", chunks=32, shards=32
        )
    assert (lazy.strategy, lazy.requested, lazy.per_task) == ("direct", "auto", 1)
    assert not session.has_uncommitted_changes  # a plan writes nothing


def test_each_refusal_of_the_policy_names_the_array_and_what_to_do(tmp_path: Path) -> None:
    """The policy's refusals in full: which array (the store's root, or the path in it), what is
    wrong, and the mode that does what was meant."""
    # kills resolve's messages (the array's name, the path's, the advice: resolve_3, _6, _40,
    # _43, _89) and create_metadata's (_23, _26)
    url = f"file://{tmp_path}"
    shardwise.write_array(data(), tmp_path / "a", **LAYOUT)
    shardwise.write_array(data(), tmp_path / "s", path="g/a", **LAYOUT)
    refusals = [
        (
            lambda: shardwise.write_array(data(), tmp_path / "a", **LAYOUT),
            f"the root array of {url}/a already exists (use mode='w' to replace it)",
        ),
        (
            lambda: shardwise.write_array(data(), tmp_path / "s", path="g/a", **LAYOUT),
            f"array 'g/a' in {url}/s already exists (use mode='w' to replace it)",
        ),
        (
            lambda: shardwise.write_array(data(), tmp_path / "b", mode="r+"),
            "mode='r+' writes into an existing array, and there is none at the root path of "
            f"{url}/b (use mode='a' or 'w-' to create it)",
        ),
        (
            lambda: shardwise.write_array(data(), tmp_path / "s", path="g/b", mode="r+"),
            "mode='r+' writes into an existing array, and there is none at path 'g/b' in "
            f"{url}/s (use mode='a' or 'w-' to create it)",
        ),
        (
            lambda: shardwise.write_array(
                data(), tmp_path / "a", mode="w-", resume=True, chunks=(4, 4), shards=(8, 8)
            ),
            f"the root array of {url}/a exists with other metadata (chunks: stored [2,2], "
            "asked [4,4]; shards: stored [4,4], asked [8,8]): nothing to resume (use mode='w' "
            "to replace it)",
        ),
    ]
    for call, says in refusals:
        before = snapshot(tmp_path)
        with pytest.raises((ArrayExistsError, shardwise.ArrayNotFoundError)) as info:
            call()
        assert str(info.value) == says
        assert snapshot(tmp_path) == before
    kwargs = dict(shape=(8, 8), dtype="int16", **LAYOUT)
    zstore = LocalStore(tmp_path / "z")
    zarr.create_array(zstore, name="theirs", **kwargs)
    with pytest.raises(ArrayExistsError) as info:
        create_metadata(zstore, "theirs", kwargs, zarr.create_array(MemoryStore(), **kwargs))
    assert str(info.value) == (
        f"array 'theirs' in {url}/z was created by another writer while this write started "
        "(use mode='w' to replace it, 'a' or 'r+' to write into it)"
    )


def test_a_resumed_w_over_a_finished_write_replaces_every_shard(tmp_path: Path) -> None:
    """Mode "w" asks to replace the array: resumed over a finished write of the same metadata,
    it adopts none of that write's shards, so new values replace every one of them."""
    # kills decide's adopt_done for mode "w" (the finished write's shards kept: old values)
    shardwise.write_array(data(), tmp_path / "a", **LAYOUT)
    report = shardwise.write_array(data() + 7, tmp_path / "a", mode="w", resume=True, **LAYOUT)
    assert (report.shards_written, report.shards_skipped) == (4, 0)
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a", mode="r")[:], data() + 7)


def test_the_plan_of_a_region_that_splits_shards_says_they_are_shared(tmp_path: Path) -> None:
    """A region of an existing array that splits its shards runs beside other writers: its plan
    says so, whatever its source would choose alone."""
    # kills job_for's shared flag dropped on its way to the job (job_for_28)
    shardwise.write_array(data(), tmp_path / "a", **LAYOUT)
    region = (slice(0, 2), slice(None))
    for source in (data()[:2], da.from_array(data()[:2], chunks=1)):
        plan = shardwise.plan_write(source, tmp_path / "a", mode="r+", region=region)
        assert plan.strategy == "direct"
        assert plan.reason == (
            "direct: shards shared with other writers are merged and committed conditionally"
        )
