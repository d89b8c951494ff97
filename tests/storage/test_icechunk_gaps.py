"""Writes into icechunk sessions a corrupting change would get wrong, each read back by
zarr-python (and xarray's zarr engine) from the committed snapshot:

* a read-only view of a writable session's store is refused, the session unchanged (written
  through, it would change the session its view came from);
* ``to_icechunk`` of a Dataset on dask's processes scheduler;
* writes at the repository's root (``path=""`` and no path), whose journal keys are
  ``.shardwise/...`` at the top;
* the last check of the forks before they are merged into the session (:meth:`SessionWrite.
  finish`; with ``progress=True`` the forks of the shard tasks reach it unmerged, so it is the
  only check): two forks that wrote one shard are refused, nothing merged; and with a bar on
  threads every shard task's fork is merged, the bar counting forks, then showing the commit;
* the forks merged as a tree of tasks on threads too (seen by a dask callback): 8 merges of 8
  forks then 1 for 64 shard tasks, three levels for 65, one merge for a single shard task;
* ``convert`` of a group holding an empty array (a copy with no shard task) into a session;
* each refusal of a write into a session in full: what does not apply, why, and what to do;
  a commit that conflicts on two shards names both; ``to_icechunk``'s region splitting shards
  written by default, refused (nothing changed) when ``safe_shards=True`` asks it to be;
* a shard object holding only its index (every chunk empty, as another writer may store it)
  read from a session as fill values, as zarr-python reads it.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr

import shardwise
from shardwise.errors import InvalidValueError, TransactionError

icechunk = pytest.importorskip("icechunk")


@pytest.fixture
def repo(tmp_path: Path) -> Any:
    return icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "repo")))


def committed(repo: Any, path: str = "") -> np.ndarray:
    return np.asarray(zarr.open_array(repo.readonly_session("main").store, path=path, mode="r")[:])


def test_a_read_only_view_of_a_writable_session_is_refused(repo: Any) -> None:
    shardwise.write_array(np.ones((8, 8)), repo.writable_session("main"), path="a", commit="1")
    session = repo.writable_session("main")
    view = session.store.with_read_only(True)
    assert view.read_only and not view.session.read_only
    for kwargs in ({"path": "a", "mode": "w"}, {"path": "b"}):
        with pytest.raises(InvalidValueError, match="read-only view"):
            shardwise.write_array(np.zeros((8, 8)), view, chunks=4, shards=8, **kwargs)
    with pytest.raises(InvalidValueError, match="read-only view"):
        shardwise.to_zarr(xr.Dataset({"v": (("y",), np.arange(4.0))}), view, mode="a")
    assert not session.has_uncommitted_changes
    assert str(session.status()) == str(repo.writable_session("main").status())
    np.testing.assert_array_equal(committed(repo, "a"), np.ones((8, 8)))
    # the store of a read-only session is refused as the session is
    with pytest.raises(InvalidValueError, match="store of a read-only session"):
        shardwise.write_array(np.zeros(4), repo.readonly_session("main").store, path="c")


def test_to_icechunk_on_the_processes_scheduler(repo: Any) -> None:
    """A Dataset whose dask chunks split its shards, written by dask's processes scheduler
    (each shard task's fork pickled back to the client): committed, read back exact."""
    v = np.arange(60 * 40, dtype="f4").reshape(60, 40)
    ds = xr.Dataset(
        {"v": (("t", "x"), v), "w": (("t",), np.arange(60, dtype="i8") * 3)},
        coords={"t": np.arange(60)},
        attrs={"title": "processes"},
    ).chunk({"t": 7, "x": 15})
    encoding = {
        "v": {"chunks": (5, 10), "shards": (20, 20)},
        "w": {"chunks": (5,), "shards": (20,)},
    }
    with dask.config.set(scheduler="processes", num_workers=2):
        report = shardwise.to_icechunk(
            ds, repo.writable_session("main"), encoding=encoding, commit="on processes"
        )
    assert report.forks == [] and report.shards_written == 6 + 3 + 1  # v, w and t
    snap = repo.readonly_session("main")
    back = xr.open_dataset(snap.store, engine="zarr", consolidated=False).load()
    xr.testing.assert_identical(back, ds.compute())
    np.testing.assert_array_equal(committed(repo, "v"), v)
    assert zarr.open_array(snap.store, path="v", mode="r").shards == (20, 20)


@pytest.mark.parametrize("path", ["", None], ids=["empty-path", "no-path"])
def test_writes_at_the_repository_root(repo: Any, path: str | None) -> None:
    """An array at the root of the repository: written, then a region of it rewritten, each
    committed; zarr-python and shardwise read the snapshot, and no key of shardwise's journal
    is in it."""
    where = {} if path is None else {"path": path}
    x = np.arange(100.0).reshape(10, 10)
    with dask.config.set(scheduler="threads"):
        shardwise.write_array(
            da.from_array(x, chunks=3),
            repo.writable_session("main"),
            chunks=(5, 5),
            shards=(5, 10),
            commit="root",
            **where,
        )
        shardwise.write_array(
            np.full((3, 10), -1.0),
            repo.writable_session("main"),
            region=(slice(4, 7), slice(None)),
            mode="r+",
            commit="a region of the root",
            **where,
        )
    x[4:7] = -1.0
    np.testing.assert_array_equal(committed(repo), x)
    np.testing.assert_array_equal(shardwise.read_array(repo.readonly_session("main")), x)
    store = repo.readonly_session("main").store

    async def listed() -> list[str]:
        return [k async for k in store.list()]

    from zarr.core.sync import sync

    assert not [k for k in sync(listed()) if ".shardwise" in k]


@pytest.mark.parametrize("progress", [False, True], ids=["merged", "with-a-bar"])
def test_the_last_check_refuses_forks_that_wrote_one_shard(repo: Any, progress: bool) -> None:
    """The forks that reach the session (one per array after the tree of merges, every shard
    task's with a bar) are checked disjoint before the first merge: two that wrote shard [0]
    are a TransactionError naming it, and the session keeps none of their chunks."""
    from shardwise.engine.report import WriteReport
    from shardwise.storage.icechunk import SessionWrite

    session = repo.writable_session("main")
    zarr.create_array(session.store, name="a", shape=(30,), chunks=(5,), shards=(10,), dtype="i2")
    session.commit("empty")
    session = repo.writable_session("main")
    fork = session.fork()
    one, two, three = (pickle.loads(pickle.dumps(fork)) for _ in range(3))
    zarr.open_array(one.store, path="a", mode="r+")[20:30] = 1
    zarr.open_array(two.store, path="a", mode="r+")[10:20] = 2
    zarr.open_array(three.store, path="a", mode="r+")[20:25] = 3
    tx = SessionWrite(session, commit="never")
    with pytest.raises(TransactionError, match=r"shard \[2\] of array '/a'"):
        tx.finish(WriteReport(forks=[one, two, three]), progress=progress)
    assert not session.has_uncommitted_changes
    assert not session.status().updated_chunks
    np.testing.assert_array_equal(committed(repo, "a"), np.zeros(30))
    # disjoint forks are merged and committed
    tx = SessionWrite(session, commit="two forks")
    report = tx.finish(WriteReport(forks=[one, two]), progress=progress)
    assert report.forks == [] and report.notes[-1].startswith("committed snapshot")
    np.testing.assert_array_equal(committed(repo, "a"), [0] * 10 + [2] * 10 + [1] * 10)


def test_progress_on_threads_merges_every_shard_tasks_fork(
    repo: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a bar the forks of the shard tasks reach the session unmerged (no tree): on threads
    too, all 16 are checked, merged and committed under the second bar, nothing lost."""
    x = np.arange(80 * 80, dtype="i4").reshape(80, 80)
    with dask.config.set(scheduler="threads"):
        report = shardwise.write_array(
            da.from_array(x, chunks=(15, 25)),
            repo.writable_session("main"),
            path="a",
            chunks=10,
            shards=20,
            progress=True,
            commit="with a bar on threads",
        )
    assert report.forks == [] and report.shards_written == 16
    err = capsys.readouterr().err.replace("\r", "\n")
    # the bar pads a line with spaces over a longer one before it (its rate's width varies)
    merged = [ln.rstrip() for ln in err.splitlines() if "merge into the session" in ln]
    assert merged and "16/16" in merged[-1]
    # counted in forks, then the commit shown as it runs and the snapshot it made; the rate's
    # unit is fork/s, or s/fork where a merge takes over a second (a loaded machine)
    rate = r"(fork/s|s/fork)"
    assert all(re.search(rate, ln) for ln in merged), merged
    committing = rate + r", committing 'with a bar on threads'\]$"
    assert any(re.search(committing, ln) for ln in merged), merged
    assert re.search(rate + r", committed snapshot [0-9A-Z]{20}\]$", merged[-1]), merged[-1]
    np.testing.assert_array_equal(committed(repo, "a"), x)


@pytest.mark.parametrize(
    ("tasks", "depths"), [(65, "0" * 9 + "112"), (64, "0" * 8 + "1"), (9, "001"), (1, "0")]
)
def test_forks_merged_as_a_tree_on_threads(repo: Any, tasks: int, depths: str) -> None:
    """The shard tasks' forks are merged by a tree of tasks (``FAN_IN`` = 8 forks a merge) on
    dask's threads as on worker processes: the merge tasks dask runs, by their depth in the
    tree (each level's tasks named apart: 65 forks need three levels); every value read back."""
    x = np.arange(tasks * 100, dtype="f8").reshape(tasks * 10, 10)
    with dask.config.set(scheduler="threads"), _Keys() as ran:
        report = shardwise.write_array(
            da.from_array(x, chunks=(10, 10)),
            repo.writable_session("main"),
            path="a",
            chunks=5,
            shards=10,
            commit="tree",
        )
    assert report.shards_written == tasks and report.forks == []
    merges = [k for k in ran if "shardwise-merge-forks" in k]
    assert "".join(sorted(k.rsplit("-", 2)[-2] for k in merges)) == depths
    np.testing.assert_array_equal(committed(repo, "a"), x)


def test_convert_of_a_group_with_an_empty_array_into_a_session(tmp_path: Path, repo: Any) -> None:
    """An empty array is copied with no shard task: its part of the write has nothing to merge,
    and the arrays beside it are copied as well, their copy tasks' forks merged by a task."""
    import numcodecs

    src = zarr.open_group(str(tmp_path / "src"), mode="w", zarr_format=2)
    src.create_array("a", shape=(0, 4), chunks=(2, 4), dtype="f8", compressor=numcodecs.Zstd())
    b = src.create_array("b", shape=(8, 4), chunks=(2, 4), dtype="f8", compressor=numcodecs.Zstd())
    b[...] = np.arange(32.0).reshape(8, 4)
    with dask.config.set(scheduler="threads"), _Keys() as ran:
        shardwise.convert(str(tmp_path / "src"), repo.writable_session("main"), commit="convert")
    assert any("shardwise-merge-forks" in k for k in ran), ran
    assert committed(repo, "a").shape == (0, 4)
    np.testing.assert_array_equal(committed(repo, "b"), np.arange(32.0).reshape(8, 4))


class _Keys:
    """The keys of the tasks dask's local schedulers run inside the ``with`` (a dask callback)."""

    def __enter__(self) -> list[str]:
        from dask.callbacks import Callback

        ran: list[str] = []
        self.callback = Callback(pretask=lambda key, dsk, state: ran.append(str(key)))
        self.callback.__enter__()
        return ran

    def __exit__(self, *exc: object) -> None:
        self.callback.__exit__(*exc)


# each refusal of a write into a session, and its whole message
REFUSALS = {
    "read-only-view": (
        lambda r, s, tmp: shardwise.write_array(
            np.zeros(4), s.store.with_read_only(True), path="b"
        ),
        "the icechunk store is read-only (the store of a read-only session, or a read-only "
        "view): write into repo.writable_session(branch) or its .store; nothing was written",
    ),
    "read-only-session": (
        lambda r, s, tmp: shardwise.write_array(np.zeros(4), r.readonly_session("main"), path="b"),
        "the icechunk session is read-only: write into repo.writable_session(branch)",
    ),
    "fork-session": (
        lambda r, s, tmp: shardwise.write_array(np.zeros(4), s.fork(), path="b"),
        "write into the Session a fork came from, not into a ForkSession: shardwise forks the "
        "session itself, one fork per shard task",
    ),
    "commit-without-a-session": (
        lambda r, s, tmp: shardwise.write_array(np.zeros(4), str(tmp / "x"), commit="m"),
        "commit= applies to writes into an icechunk Session, not to str",
    ),
    "commit-not-a-str": (
        lambda r, s, tmp: shardwise.write_array(np.zeros(4), s, path="b", commit=3),
        "commit must be a str (the commit message), got 3",
    ),
    "lease": (
        lambda r, s, tmp: shardwise.write_array(np.zeros(4), s, path="b", lease=True),
        "lease=True does not apply to an icechunk session: the session's transaction keeps "
        "other writers out",
    ),
    "resume": (
        lambda r, s, tmp: shardwise.write_array(np.zeros(4), s, path="b", resume=True),
        "resume=True does not apply to an icechunk session: an interrupted write leaves the "
        "session uncommitted: rerun it",
    ),
    "compute-false": (
        lambda r, s, tmp: shardwise.write_array(np.zeros(4), s, path="b", compute=False),
        "compute=False does not apply to an icechunk session: the forks of the shard tasks are "
        "merged into it when the write runs",
    ),
    "staged": (
        lambda r, s, tmp: shardwise.write_array(np.zeros(4), s, path="b", strategy="staged"),
        "strategy='staged' does not apply to an icechunk session: each shard task writes its "
        "whole shard into its fork (strategy='direct')",
    ),
    "consolidated": (
        lambda r, s, tmp: shardwise.to_icechunk(
            xr.Dataset({"v": (("y",), np.arange(4.0))}), s, consolidated=True
        ),
        "consolidated=True does not apply to an icechunk session: its store keeps no "
        "consolidated metadata (it lists a group's members itself)",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_each_refusal_of_a_session_says_in_full_what_to_do(
    repo: Any, tmp_path: Path, case: str
) -> None:
    """A write a session cannot take is refused before any change with its whole message: what
    does not apply (or is read-only), why, and what to write into instead."""
    call, says = REFUSALS[case]
    shardwise.write_array(np.ones((8, 8)), repo.writable_session("main"), path="a", commit="1")
    session = repo.writable_session("main")
    with pytest.raises((InvalidValueError, shardwise.InvalidTypeError)) as info:
        call(repo, session, tmp_path)
    assert str(info.value) == says
    assert not session.has_uncommitted_changes


def test_a_commit_conflicting_on_two_shards_names_both(repo: Any) -> None:
    """Two sessions that wrote the same two shards: the second commit's TransactionError names
    the array, both shards and the kind of conflict, and what to do; nothing of it committed."""
    shardwise.write_array(
        np.zeros(40), repo.writable_session("main"), path="v", chunks=5, shards=10, commit="0"
    )
    first, second = repo.writable_session("main"), repo.writable_session("main")
    region = (slice(0, 20),)
    shardwise.write_array(np.ones(20), first, path="v", region=region, mode="r+", commit="a")
    with pytest.raises(TransactionError) as info:
        shardwise.write_array(
            np.full(20, 2.0), second, path="v", region=region, mode="r+", commit="b"
        )
    assert str(info.value) == (
        "the commit of branch 'main' conflicts with another commit: array '/v' shards [0], [1] "
        "(Chunk double update); the session keeps this write uncommitted (nothing of either "
        "write is lost: rerun this one in a new session)"
    )
    assert second.has_uncommitted_changes
    np.testing.assert_array_equal(committed(repo, "v"), [1.0] * 20 + [0.0] * 20)


def test_a_region_splitting_shards_is_refused_in_a_session_only_when_asked(repo: Any) -> None:
    """In a session a region that splits shards is written (its one task merges each split
    shard, and another session's write of it conflicts at commit); ``safe_shards=True`` asks
    for the refusal all the same: a PlanError naming the aligned region, the session unchanged."""
    ds = xr.Dataset({"v": (("t",), np.arange(40.0))})
    encoding = {"v": {"chunks": (5,), "shards": (10,)}}
    shardwise.to_icechunk(ds, repo.writable_session("main"), encoding=encoding, commit="0")
    session = repo.writable_session("main")
    part = xr.Dataset({"v": (("t",), np.ones(5))})
    with pytest.raises(shardwise.PlanError, match=r"\{'t': slice\(0, 10, None\)\}"):
        shardwise.to_icechunk(part, session, region={"t": slice(0, 5)}, safe_shards=True)
    assert not session.has_uncommitted_changes
    shardwise.to_icechunk(part, session, region={"t": slice(0, 5)}, commit="split")
    np.testing.assert_array_equal(committed(repo, "v"), [1.0] * 5 + list(range(5, 40)))


def test_a_shard_of_only_its_index_reads_as_fill_from_a_session(repo: Any) -> None:
    """A shard whose index marks every chunk empty, stored alone (the object is its index): read
    from the session it is in, its chunks are the fill value, as zarr-python reads them."""
    import crc32c
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    session = repo.writable_session("main")
    x = np.arange(64.0).reshape(8, 8)
    shardwise.write_array(x, session, path="a", chunks=4, shards=8)
    entries = b"\xff" * 16 * 4  # 4 chunks, each (offset, nbytes) empty
    index = entries + crc32c.crc32c(entries).to_bytes(4, "little")
    sync(session.store.set("a/c/0/0", default_buffer_prototype().buffer.from_bytes(index)))
    got = shardwise.read_array(session, path="a")
    np.testing.assert_array_equal(got, np.zeros((8, 8)))
    np.testing.assert_array_equal(got, zarr.open_array(session.store, path="a", mode="r")[:])
