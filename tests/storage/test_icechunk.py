"""Writes into and reads from icechunk sessions (real icechunk, local-filesystem repositories).

A write into a session forks it once, each shard task writes its whole shards into a fork of its
own, and the forks, checked disjoint, are merged back: whatever the dask chunking, on threads and
on worker processes, nothing is lost (icechunk's own ``store_dask`` loses three quarters of the
same array on the same chunks). No lease or journal goes into the repository; a refused call
leaves the session without a change.
"""

from __future__ import annotations

import itertools
import pickle
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.core.sync import sync

import shardwise
from faultkit import cluster_workers
from shardwise.errors import InvalidTypeError, InvalidValueError, TransactionError

icechunk = pytest.importorskip("icechunk")


def new_repo(root: Path) -> Any:
    return icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)))


@pytest.fixture
def repo(tmp_path: Path) -> Any:
    return new_repo(tmp_path / "repo")


def keys(store: Any) -> list[str]:
    async def go() -> list[str]:
        return [k async for k in store.list()]

    return sorted(sync(go()))


def committed(repo: Any, path: str = "a") -> np.ndarray:
    """The array at ``path`` of the branch's last commit, read by zarr-python."""
    return np.asarray(zarr.open_array(repo.readonly_session("main").store, path=path, mode="r")[:])


@st.composite
def split_cases(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], Any]:
    """A 2-d array, its inner chunks, shards of whole inner chunks and dask chunks that split
    the shards (sizes drawn freely, so most shards are cut by several blocks)."""
    chunks = tuple(draw(st.integers(2, 6)) for _ in range(2))
    shards = tuple(c * draw(st.integers(1, 3)) for c in chunks)
    shape = tuple(draw(st.integers(1, 3 * s + 3)) for s in shards)
    blocks = []
    for n in shape:
        cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=4))) if n > 1 else []
        edges = [0, *cuts, n]
        blocks.append(tuple(b - a for a, b in itertools.pairwise(edges)))
    return shape, chunks, shards, tuple(blocks)


def write_and_check(
    root: Path, case: tuple[Any, ...], scheduler: Any
) -> tuple[Any, np.ndarray, Any]:
    shape, chunks, shards, blocks = case
    x = np.arange(int(np.prod(shape)), dtype="f8").reshape(shape) + 1
    repo = new_repo(root)
    session = repo.writable_session("main")
    with dask.config.set(scheduler=scheduler):
        report = shardwise.write_array(
            da.from_array(x, chunks=blocks),
            session,
            path="a",
            chunks=chunks,
            shards=shards,
            dimension_names=("y", "x"),
            commit="one task per shard",
        )
    assert report.forks == []
    assert report.notes and report.notes[-1].startswith("committed snapshot")
    np.testing.assert_array_equal(committed(repo), x)
    return repo, x, report


@settings(max_examples=6)
@given(case=split_cases())
def test_split_shards_on_threads(case: tuple[Any, ...]) -> None:
    """Dask chunks that split shards, written on threads: every value read back by zarr-python,
    by xarray's own zarr engine and by shardwise; nothing of shardwise's in the repository."""
    with tempfile.TemporaryDirectory() as d:
        repo, x, report = write_and_check(Path(d), case, "threads")
        snap = repo.readonly_session("main")
        ds = xr.open_dataset(snap.store, engine="zarr", consolidated=False)
        np.testing.assert_array_equal(ds["a"].values, x)
        np.testing.assert_array_equal(shardwise.read_array(snap, path="a"), x)
        stored = keys(snap.store)
        assert not [k for k in stored if ".shardwise" in k]
        assert len([k for k in stored if k.startswith("a/c/")]) == report.shards_written


@settings(max_examples=3)
@given(case=split_cases())
def test_split_shards_on_worker_processes(client: Any, case: tuple[Any, ...]) -> None:
    """The same on a LocalCluster of 2 worker processes: the forks travel to the workers and
    back pickled."""
    with tempfile.TemporaryDirectory() as d:
        write_and_check(Path(d), case, client)


def test_four_blocks_per_shard_on_worker_processes(client: Any, tmp_path: Path) -> None:
    """Four dask blocks per shard, and blocks across shard edges, on worker processes."""
    for i, blocks in enumerate([((25,) * 4, (25,) * 4), ((13, 30, 40, 17), (7, 50, 43))]):
        write_and_check(tmp_path / str(i), ((100, 100), (10, 10), (50, 50), blocks), client)


def test_icechunk_store_dask_on_processes_loses_what_shardwise_keeps(
    repo: Any, tmp_path: Path
) -> None:
    """The point: icechunk's own store_dask, four tasks per shard on worker processes, keeps
    one task's quarter of each shard (the last fork merged wins); shardwise keeps every value."""
    from icechunk.dask import store_dask

    x = np.arange(100 * 100, dtype="f8").reshape(100, 100) + 1
    source = da.from_array(x, chunks=25)
    session = repo.writable_session("main")
    target = zarr.create_array(
        session.store, name="a", shape=x.shape, dtype=x.dtype, chunks=(10, 10), shards=(50, 50)
    )
    fork = session.fork()
    target = zarr.open_array(fork.store, path="a", mode="a")
    with dask.config.set(scheduler="processes", num_workers=2):
        session.merge(store_dask(sources=[source], targets=[target]))
    session.commit("store_dask")
    lost = int((committed(repo) != x).sum())
    assert lost == 7500  # of 10,000: three of the four quarters of every shard

    other = new_repo(tmp_path / "shardwise")
    with dask.config.set(scheduler="processes", num_workers=2):
        shardwise.write_array(
            source,
            other.writable_session("main"),
            path="a",
            chunks=(10, 10),
            shards=(50, 50),
            commit="shardwise",
        )
    np.testing.assert_array_equal(committed(other), x)


def test_region_merges_partial_shards_from_the_base(repo: Any) -> None:
    """A region write whose edges split shards, in a later session: each partial shard is read
    from the session's base and merged by its one task; the rest of the array is kept."""
    x = np.arange(60 * 60, dtype="i4").reshape(60, 60)
    shardwise.write_array(
        x, repo.writable_session("main"), path="a", chunks=(5, 5), shards=(20, 20), commit="base"
    )
    session = repo.writable_session("main")
    y = -np.arange(33 * 27, dtype="i4").reshape(33, 27)
    region = (slice(7, 40), slice(21, 48))
    with dask.config.set(scheduler="threads"):
        shardwise.write_array(
            da.from_array(y, chunks=(11, 9)),
            session,
            path="a",
            region=region,
            mode="r+",
            progress=True,  # the bar's graph hands the forks back too
        )
    assert session.has_uncommitted_changes  # the caller commits
    session.commit("region")
    x[region] = y
    np.testing.assert_array_equal(committed(repo), x)


def test_all_fill_region_deletes_its_shards(repo: Any) -> None:
    """A region write of fill values over whole shards deletes them in the session."""
    x = np.ones((40, 40), dtype="f4")
    shardwise.write_array(
        x, repo.writable_session("main"), path="a", chunks=(10, 10), shards=(20, 20), commit="1"
    )
    session = repo.writable_session("main")
    shardwise.write_array(
        np.zeros((20, 40), dtype="f4"),
        session,
        path="a",
        region=(slice(0, 20), slice(None)),
        mode="r+",
    )
    session.commit("2")
    x[:20] = 0
    np.testing.assert_array_equal(committed(repo), x)
    assert [k for k in keys(repo.readonly_session("main").store) if "/c/" in k] == [
        "a/c/1/0",
        "a/c/1/1",
    ]


def test_mode_w_replaces_the_array_in_the_session(repo: Any) -> None:
    shardwise.write_array(
        np.ones((30, 30)), repo.writable_session("main"), path="a", shards=(10, 10), commit="1"
    )
    shardwise.write_array(
        np.full((12,), 2.0), s := repo.writable_session("main"), path="a", mode="w", commit="2"
    )
    assert s.read_only  # committed
    np.testing.assert_array_equal(committed(repo), np.full((12,), 2.0))


def test_reads_from_a_session(repo: Any) -> None:
    """open_array, read_array and the shardwise engine read a session (a branch's, or a
    snapshot's), selections through byte ranges of the stored shards."""
    x = np.arange(64 * 48, dtype="f8").reshape(64, 48)
    snapshot = (
        shardwise.write_array(
            x,
            repo.writable_session("main"),
            path="v",
            chunks=(8, 8),
            shards=(32, 24),
            dimension_names=("y", "x"),
            commit="v",
        )
        .notes[-1]
        .split()[-1]
    )
    for session in (repo.readonly_session("main"), repo.readonly_session(snapshot_id=snapshot)):
        arr = shardwise.open_array(session, path="v")
        np.testing.assert_array_equal(arr[5:40, 9:30].compute(), x[5:40, 9:30])
        np.testing.assert_array_equal(shardwise.read_array(session, path="v"), x)
        ds = xr.open_dataset(session.store, engine="shardwise")
        np.testing.assert_array_equal(ds["v"][3:50, 1:47].values, x[3:50, 1:47])
    # a writable session reads its uncommitted changes
    session = repo.writable_session("main")
    shardwise.write_array(
        np.zeros((32, 24)), session, path="v", region=(slice(0, 32), slice(0, 24)), mode="r+"
    )
    x[:32, :24] = 0
    np.testing.assert_array_equal(shardwise.read_array(session, path="v"), x)


def test_forks_that_wrote_one_shard_are_refused(repo: Any) -> None:
    """Two forks that wrote one chunk (a shard) are refused before any merge: icechunk would
    keep the last one's, silently."""
    from shardwise.storage.icechunk import check_disjoint

    session = repo.writable_session("main")
    zarr.create_array(session.store, name="a", shape=(20,), chunks=(5,), shards=(10,), dtype="i2")
    fork = session.fork()
    one, two, three = (pickle.loads(pickle.dumps(fork)) for _ in range(3))
    zarr.open_array(one.store, path="a", mode="r+")[:10] = 1
    zarr.open_array(two.store, path="a", mode="r+")[10:] = 2
    zarr.open_array(three.store, path="a", mode="r+")[:5] = 3
    check_disjoint([one, two])
    with pytest.raises(TransactionError, match=r"shard \[0\] of array '/a'"):
        check_disjoint([one, two, three])


@pytest.fixture
def fresh_session(repo: Any) -> Iterator[Any]:
    shardwise.write_array(np.ones((8, 8)), repo.writable_session("main"), path="a", commit="1")
    session = repo.writable_session("main")
    yield session
    assert not session.has_uncommitted_changes


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"threads": "many"}, InvalidTypeError, "threads"),
        ({"mode": "x"}, InvalidValueError, "mode"),
        ({"lease": True}, InvalidValueError, "lease=True"),
        ({"resume": True}, InvalidValueError, "resume=True"),
        ({"compute": False}, InvalidValueError, "compute=False"),
        ({"strategy": "staged"}, InvalidValueError, "staged"),
        ({"commit": 3}, InvalidTypeError, "commit"),
        ({"mode": "w-"}, shardwise.ArrayExistsError, "exists"),
        ({"region": (slice(0, 3), slice(None)), "mode": "r+"}, shardwise.PlanError, "region"),
    ],
)
def test_refused_calls_leave_the_session_unchanged(
    fresh_session: Any, kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        shardwise.write_array(np.zeros((8, 8)), fresh_session, path="a", **{"mode": "w", **kwargs})


def test_sessions_that_cannot_be_written_are_refused(repo: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match="read-only"):
        shardwise.write_array(np.ones(3), repo.readonly_session("main"), path="a")
    session = repo.writable_session("main")
    with pytest.raises(InvalidValueError, match="ForkSession"):
        shardwise.write_array(np.ones(3), session.fork(), path="a")
    with pytest.raises(InvalidValueError, match="commit= applies"):
        shardwise.write_array(np.ones(3), tmp_path / "plain", commit="no session")
    assert not (tmp_path / "plain").exists()
    assert not session.has_uncommitted_changes


def dataset() -> xr.Dataset:
    """Two dask-backed variables whose blocks split their shards, coordinates, a 0-d one."""
    v = np.arange(60 * 40, dtype="f4").reshape(60, 40)
    return xr.Dataset(
        {
            "v": (("t", "x"), v),
            "w": (("t",), np.arange(60, dtype="i8") * 3),
            "scalar": ((), 7.5),
        },
        coords={"t": np.arange(60), "x": np.linspace(0, 1, 40)},
        attrs={"title": "into a session"},
    ).chunk({"t": 7, "x": 15})


ENCODING = {"v": {"chunks": (5, 10), "shards": (20, 20)}, "w": {"chunks": (5,), "shards": (20,)}}


@pytest.mark.parametrize("where", ["threads", "cluster"])
def test_to_icechunk_dataset(repo: Any, where: str, request: pytest.FixtureRequest) -> None:
    """A Dataset whose dask chunks split its shards, into a session on threads and on worker
    processes: read back identical by xarray's own zarr engine and by shardwise's."""
    scheduler = request.getfixturevalue("client") if where == "cluster" else "threads"
    ds = dataset()
    with dask.config.set(scheduler=scheduler):
        report = shardwise.to_icechunk(
            ds, repo.writable_session("main"), encoding=ENCODING, commit="dataset"
        )
    assert report.forks == [] and report.shards_written >= 6
    snap = repo.readonly_session("main")
    for engine in ("zarr", "shardwise"):
        back = xr.open_dataset(
            snap.store, engine=engine, consolidated=False if engine == "zarr" else None
        )
        xr.testing.assert_identical(back.load(), ds.compute())
    assert zarr.open_array(snap.store, path="v", mode="r").shards == (20, 20)


def test_to_icechunk_mode_w_into_a_new_repository(repo: Any) -> None:
    """mode="w" of a Dataset into a repository that has none of its variables (icechunk lists
    only under a group or an array, and refuses a name it does not hold): written, then
    replaced by a second mode="w" with other values, read back by xarray's zarr engine."""
    ds = dataset()
    with dask.config.set(scheduler="threads"):
        shardwise.to_icechunk(
            ds, repo.writable_session("main"), encoding=ENCODING, mode="w", commit="1"
        )
        shardwise.to_zarr(ds * 2, repo.writable_session("main"), mode="w", commit="2")
    back = xr.open_dataset(repo.readonly_session("main").store, engine="zarr", consolidated=False)
    xr.testing.assert_identical(back.load(), (ds * 2).compute())


def test_absent_keys_of_a_session_are_answers_not_retried(
    repo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a session does not hold (a chunk: icechunk's NotFoundError; a listing under a name
    that is no node: its InvalidInputError) is an answer: no store request is retried (each
    retry waits its backoff) by a new write_array, a mode="w" one, or a mode="w" to_zarr."""
    from shardwise.storage.retry import RetryPolicy

    waits: list[int] = []
    monkeypatch.setattr(RetryPolicy, "pause", lambda self, attempt: waits.append(attempt))
    x = da.from_array(np.arange(100.0).reshape(10, 10), chunks=3)
    with dask.config.set(scheduler="threads"):
        shardwise.write_array(x, repo.writable_session("main"), path="a", shards=(5, 5), commit="1")
        shardwise.write_array(x, repo.writable_session("main"), path="b", mode="w", commit="2")
        shardwise.to_zarr(dataset(), repo.writable_session("main"), mode="w", commit="3")
    assert waits == []


def test_to_icechunk_region_and_group(repo: Any) -> None:
    """A region of a group's variable, split shards merged from the base; the caller commits."""
    ds = dataset()
    shardwise.to_icechunk(
        ds, repo.writable_session("main"), group="g", encoding=ENCODING, commit="1"
    )
    part = (ds[["v"]].isel(t=slice(13, 38)) * -1).chunk({"t": 6, "x": 11})
    session = repo.writable_session("main")
    with dask.config.set(scheduler="threads"):
        shardwise.to_icechunk(
            part.drop_vars(["t", "x"]), session, group="g", region={"t": slice(13, 38)}
        )
    session.commit("region")
    want = ds["v"].values.copy()
    want[13:38] *= -1
    back = xr.open_dataset(
        repo.readonly_session("main").store, group="g", engine="zarr", consolidated=False
    )
    np.testing.assert_array_equal(back["v"].values, want)


def test_to_icechunk_refuses_other_stores(tmp_path: Path) -> None:
    with pytest.raises(InvalidTypeError, match="icechunk Session"):
        shardwise.to_icechunk(dataset(), tmp_path / "plain")
    assert not (tmp_path / "plain").exists()


def test_to_icechunk_datatree(repo: Any) -> None:
    """Every group of a DataTree in one session, one commit: read back identical by both
    engines."""
    root = xr.Dataset({"v": (("y", "x"), np.arange(400.0).reshape(20, 20))}).chunk(7)
    child = xr.Dataset({"u": (("z",), np.arange(30))}).chunk(4)
    tree = xr.DataTree.from_dict({"/": root, "/child": child})
    with dask.config.set(scheduler="threads"):
        shardwise.to_icechunk(
            tree, repo.writable_session("main"), shards={"y": 10, "x": 10, "z": 10}, commit="t"
        )
    snap = repo.readonly_session("main")
    for engine in ("zarr", "shardwise"):
        kw = {"consolidated": False} if engine == "zarr" else {}
        back = xr.open_datatree(snap.store, engine=engine, **kw)
        xr.testing.assert_identical(back.load(), tree.compute())


def test_to_icechunk_refusals_leave_the_session_unchanged(fresh_session: Any) -> None:
    for kwargs, error in [
        ({"consolidated": True}, InvalidValueError),
        ({"compute": False}, InvalidValueError),
        ({"mode": "q"}, InvalidValueError),
        ({"threads": "many"}, InvalidTypeError),
        ({"region": {"nope": slice(0, 1)}, "mode": "r+"}, InvalidValueError),
    ]:
        with pytest.raises(error):
            shardwise.to_icechunk(dataset(), fresh_session, **{"mode": "w", **kwargs})


def test_split_shards_into_a_repository_on_s3(client: Any) -> None:
    """The same write into a repository on S3 (moto), on worker processes: every value there,
    read back by zarr-python from a new repository handle."""
    from faultkit import BUCKET, CREDS, moto_s3

    with moto_s3() as s3:

        def storage() -> Any:
            return icechunk.s3_storage(
                bucket=BUCKET,
                prefix="repo",
                region=CREDS["region"],
                endpoint_url=s3.endpoint,
                allow_http=True,
                force_path_style=True,
                access_key_id=CREDS["key"],
                secret_access_key=CREDS["secret"],
            )

        repo = icechunk.Repository.create(storage())
        x = np.arange(90 * 70, dtype="i4").reshape(90, 70)
        with dask.config.set(scheduler=client):
            shardwise.write_array(
                da.from_array(x, chunks=(17, 23)),
                repo.writable_session("main"),
                path="a",
                chunks=(10, 10),
                shards=(30, 30),
                commit="on S3",
            )
        np.testing.assert_array_equal(committed(icechunk.Repository.open(storage())), x)


def test_to_icechunk_append(repo: Any) -> None:
    """An append along a dimension into a session: the new rows and the shard it completes."""
    ds = dataset()
    shardwise.to_icechunk(
        ds.isel(t=slice(0, 25)), repo.writable_session("main"), encoding=ENCODING, commit="1"
    )
    with dask.config.set(scheduler="threads"):
        shardwise.to_icechunk(
            ds.isel(t=slice(25, None)), repo.writable_session("main"), append_dim="t", commit="2"
        )
    back = xr.open_dataset(repo.readonly_session("main").store, engine="zarr", consolidated=False)
    xr.testing.assert_identical(back.load(), ds.compute())


def test_sessions_on_one_shard_conflict_at_commit(repo: Any) -> None:
    """Two sessions that wrote one shard: the second commit is a TransactionError naming the
    array and the shard, its session keeps the write; a session on other shards is rebased."""
    x = np.arange(40 * 10, dtype="f8").reshape(40, 10)
    shardwise.write_array(x, repo.writable_session("main"), path="v", shards=(10, 10), commit="0")
    first, second, other = (repo.writable_session("main") for _ in range(3))

    def write(session: Any, a: int, b: int, value: float) -> None:
        shardwise.write_array(
            np.full((b - a, 10), value),
            session,
            path="v",
            region=(slice(a, b), slice(None)),
            mode="r+",
            commit=f"rows {a}:{b}",
        )

    write(first, 0, 5, 1.0)
    with pytest.raises(TransactionError, match=r"array '/v' shards \[0, 0\]"):
        write(second, 5, 10, 2.0)
    assert second.has_uncommitted_changes  # kept, to rerun in a new session
    write(other, 30, 35, 3.0)
    x[0:5] = 1.0
    x[30:35] = 3.0
    np.testing.assert_array_equal(committed(repo, "v"), x)


def test_a_session_store_stands_for_its_session(repo: Any) -> None:
    """``session.store`` (as xarray users pass it) is written as its session: forked, merged."""
    session = repo.writable_session("main")
    x = np.arange(100.0).reshape(10, 10)
    with dask.config.set(scheduler="threads"):
        shardwise.write_array(da.from_array(x, chunks=3), session.store, path="a", shards=(5, 5))
    session.commit("through the store")
    np.testing.assert_array_equal(committed(repo), x)


def changes(session: Any) -> str:
    """What a session changed and has not committed, as icechunk's status lists it."""
    return str(session.status())


def block_mean(x: np.ndarray, f: int) -> np.ndarray:
    """``x`` (2-d, each side a multiple of ``f``) reduced by means of ``f`` x ``f`` blocks."""
    return x.reshape(x.shape[0] // f, f, x.shape[1] // f, f).mean(axis=(1, 3))


@pytest.mark.parametrize("where", ["threads", "cluster"])
def test_write_pyramid_into_a_session(
    repo: Any, where: str, request: pytest.FixtureRequest
) -> None:
    """An OME pyramid whose dask chunks split its shards, every level into forks of the session
    (on threads and on worker processes), one commit: zarr-python reads every level."""
    scheduler = request.getfixturevalue("client") if where == "cluster" else "threads"
    x = np.arange(80 * 120, dtype="f4").reshape(80, 120)
    image = xr.DataArray(da.from_array(x, chunks=(23, 31)), dims=("y", "x"))
    with dask.config.set(scheduler=scheduler):
        report = shardwise.write_pyramid(
            image, repo.writable_session("main"), levels=3, chunks=10, shards=20, commit="pyr"
        )
    assert report.forks == [] and report.notes[-1].startswith("committed snapshot")
    group = zarr.open_group(repo.readonly_session("main").store, mode="r")
    assert [d["path"] for d in group.attrs["ome"]["multiscales"][0]["datasets"]] == ["0", "1", "2"]
    np.testing.assert_array_equal(group["0"][:], x)
    np.testing.assert_allclose(group["1"][:], block_mean(x, 2), rtol=1e-6)
    np.testing.assert_allclose(group["2"][:], block_mean(x, 4), rtol=1e-6)
    assert group["0"].shards == (20, 20)
    assert not [k for k in keys(repo.readonly_session("main").store) if ".shardwise" in k]


def test_write_pyramid_geozarr_into_a_session(repo: Any) -> None:
    """A GeoZarr pyramid (a DataTree of levels) into a session: xarray's own zarr engine reads
    every level back, level 1 the block means of level 0."""
    y, x = np.arange(64.0), np.arange(48.0)
    values = np.arange(64 * 48, dtype="f8").reshape(64, 48)
    ds = xr.Dataset({"b": (("y", "x"), values)}, coords={"y": 1000 - 10 * y, "x": 10 * x}).chunk(
        {"y": 13, "x": 17}
    )
    session = repo.writable_session("main")
    with dask.config.set(scheduler="threads"):
        shardwise.write_pyramid(ds, session, levels=2, chunks=8, shards=16, layout="geozarr")
    assert session.has_uncommitted_changes
    session.commit("geozarr")
    tree = xr.open_datatree(repo.readonly_session("main").store, engine="zarr", consolidated=False)
    np.testing.assert_array_equal(tree["0"]["b"].values, values)
    np.testing.assert_allclose(tree["1"]["b"].values, block_mean(values, 2))


def v2_dataset(root: Path) -> xr.Dataset:
    ds = xr.Dataset(
        {"v": (("y", "x"), np.arange(60 * 40, dtype="f4").reshape(60, 40))},
        coords={"y": np.arange(60), "x": np.arange(40) * 0.5},
        attrs={"title": "converted"},
    )
    ds.to_zarr(root, zarr_format=2, encoding={"v": {"chunks": (10, 10)}}, consolidated=True)
    return ds


@pytest.mark.parametrize("where", ["threads", "cluster"])
def test_convert_into_a_session(
    repo: Any, tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """convert of a v2 dataset store into a session (encoded chunks copied, then re-encoded
    with another compressor), one commit each: xarray's own zarr engine reads it identical."""
    scheduler = request.getfixturevalue("client") if where == "cluster" else "threads"
    ds = v2_dataset(tmp_path / "src.zarr")
    with dask.config.set(scheduler=scheduler):
        copied = shardwise.convert(
            tmp_path / "src.zarr", repo.writable_session("main"), shards={"y": 30}, commit="1"
        )
        again = shardwise.convert(
            tmp_path / "src.zarr",
            repo.writable_session("main"),
            dst_path="again",
            compressors=zarr.codecs.GzipCodec(),
            commit="2",
        )
    assert {a.method for a in copied.arrays} == {"copy"} and copied.snapshot
    assert {a.method for a in again.arrays} == {"reencode"} and again.snapshot
    assert "icechunk session of branch 'main'" in str(copied)
    snap = repo.readonly_session("main")
    for group in (None, "again"):
        back = xr.open_dataset(snap.store, group=group, engine="zarr", consolidated=False)
        xr.testing.assert_identical(back.load(), ds)
    assert zarr.open_array(snap.store, path="v", mode="r").shards == (30, 40)
    gz = zarr.open_array(snap.store, path="again/v", mode="r").compressors
    assert isinstance(gz[0], zarr.codecs.GzipCodec)


def test_convert_a_pyramid_into_a_session(repo: Any, tmp_path: Path) -> None:
    """convert(pyramid=...) into a session, verified; the caller commits."""
    ds = v2_dataset(tmp_path / "src.zarr")
    session = repo.writable_session("main")
    report = shardwise.convert(
        tmp_path / "src.zarr", session, path="v", dst_path="p", pyramid={"levels": 2}, verify=True
    )
    assert report.ok and report.snapshot is None and session.has_uncommitted_changes
    session.commit("pyramid")
    group = zarr.open_group(repo.readonly_session("main").store, path="p", mode="r")
    np.testing.assert_array_equal(group["0"][:], ds["v"].values)
    np.testing.assert_allclose(group["1"][:], block_mean(ds["v"].values, 2))


@pytest.fixture
def dirty_session(repo: Any) -> Iterator[Any]:
    """A session with a change of its own not committed yet: a refused call must leave its
    status exactly as it was."""
    shardwise.write_array(np.ones((8, 8)), repo.writable_session("main"), path="a", commit="1")
    session = repo.writable_session("main")
    zarr.open_array(session.store, path="a", mode="r+")[:2] = 5
    before = changes(session)
    yield session
    assert changes(session) == before


SESSION_REFUSALS = [
    ({"compute": False}, InvalidValueError, "compute=False"),
    ({"strategy": "staged"}, InvalidValueError, "staged"),
    ({"lease": True}, InvalidValueError, "lease=True"),
    ({"resume": True}, InvalidValueError, "resume=True"),
    ({"commit": 3}, InvalidTypeError, "commit"),
]


@pytest.mark.parametrize(("kwargs", "error", "words"), SESSION_REFUSALS)
def test_every_writer_refuses_before_any_change(
    dirty_session: Any,
    tmp_path: Path,
    kwargs: dict[str, Any],
    error: type[Exception],
    words: str,
) -> None:
    """compute=False (the forks could not be merged into the caller's session from a Delayed
    computed elsewhere), staged writes (their staging objects would go into the repository),
    leases and resume: refused by every writer with a clear error, the session's uncommitted
    changes as they were (the fixture compares its status)."""
    image = xr.DataArray(da.ones((64, 64), chunks=16), dims=("y", "x"))
    src = tmp_path / "src.zarr"
    zarr.create_array(src, shape=(4,), chunks=(2,), dtype="i1")
    calls = [
        lambda kw: shardwise.write_array(image.data, dirty_session, path="b", **kw),
        lambda kw: shardwise.to_icechunk(image.to_dataset(name="b"), dirty_session, **kw),
        lambda kw: shardwise.write_pyramid(image, dirty_session, path="p", **kw),
        lambda kw: shardwise.convert(src, dirty_session, dst_path="c", **kw),
    ]
    for i, call in enumerate(calls):
        if i == 3 and set(kwargs) & {"compute", "strategy"}:
            continue  # convert takes neither keyword
        with pytest.raises(error, match=words):
            call(kwargs)


def test_forks_merged_as_a_tree_on_worker_processes(client: Any, repo: Any) -> None:
    """64 shard tasks on 2 worker processes: their forks are merged by a tree of tasks on the
    workers (8 merges of 8 forks, then 1 of those 8), not 64 merges in the client; every value
    read back."""
    from distributed import get_task_stream

    x = np.arange(160 * 160, dtype="f8").reshape(160, 160)
    workers = cluster_workers(client)
    with dask.config.set(scheduler=client), get_task_stream(client) as stream:
        report = shardwise.write_array(
            da.from_array(x, chunks=(15, 25)),
            repo.writable_session("main"),
            path="a",
            chunks=10,
            shards=20,
            commit="tree",
        )
    assert report.shards_written == 64 and report.forks == []
    merges = [t for t in stream.data if "shardwise-merge-forks" in str(t["key"])]
    depths = sorted(str(t["key"]).rsplit("-", 2)[-2] for t in merges)
    assert depths == ["0"] * 8 + ["1"]
    assert {t["worker"] for t in merges} <= workers
    np.testing.assert_array_equal(committed(repo), x)


def test_progress_on_worker_processes_shows_the_merges_and_the_commit(
    client: Any, repo: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """progress=True on worker processes: the shard bar counts the 64 shard tasks and closes
    when they are done, but the data is not in the session yet (with a bar the forks come to
    the client, no tree of merges): a second bar counts the forks merged into the session and
    shows the commit, and closes only after it, at the snapshot the branch is at."""
    x = np.arange(160 * 160, dtype="f8").reshape(160, 160)
    with dask.config.set(scheduler=client):
        report = shardwise.write_array(
            da.from_array(x, chunks=(15, 25)),
            repo.writable_session("main"),
            path="a",
            chunks=10,
            shards=20,
            progress=True,
            commit="with a bar",
        )
    lines = [ln.strip() for ln in capsys.readouterr().err.replace("\r", "\n").splitlines()]
    # by description, not by the rate's unit (shard/s, or s/shard when the machine is slow)
    merge_bar = [i for i, ln in enumerate(lines) if "merge into the session" in ln]
    shard_bar = [
        i
        for i, ln in enumerate(lines)
        if ln.startswith("shardwise:") and "/64" in ln and i not in merge_bar
    ]
    assert shard_bar and merge_bar and max(shard_bar) < min(merge_bar)
    assert "64/64" in lines[max(shard_bar)]
    snapshot = repo.lookup_branch("main")
    assert report.notes[-1] == f"committed snapshot {snapshot}"
    last = lines[max(merge_bar)]
    assert "64/64" in last and f"committed snapshot {snapshot}" in last, last
    np.testing.assert_array_equal(committed(repo), x)


def test_a_merge_of_the_tree_refuses_forks_that_wrote_one_shard(repo: Any) -> None:
    """A merge task of the tree checks its inputs' forks disjoint before it merges them: two
    that wrote one shard are a TransactionError naming it; disjoint ones become one fork."""
    from shardwise.engine.forks import merge_forks
    from shardwise.engine.report import WriteReport

    session = repo.writable_session("main")
    zarr.create_array(session.store, name="a", shape=(30,), chunks=(5,), shards=(10,), dtype="i2")
    fork = session.fork()
    one, two, three = (pickle.loads(pickle.dumps(fork)) for _ in range(3))
    zarr.open_array(one.store, path="a", mode="r+")[:10] = 1
    zarr.open_array(two.store, path="a", mode="r+")[10:20] = 2
    zarr.open_array(three.store, path="a", mode="r+")[5:10] = 3
    merged = merge_forks(WriteReport(forks=[one]), WriteReport(forks=[two]))
    assert len(merged.forks) == 1
    with pytest.raises(TransactionError, match=r"shard \[0\] of array '/a'"):
        merge_forks(merged, WriteReport(forks=[three]))
    session.merge(*merged.forks)
    session.commit("two forks")
    np.testing.assert_array_equal(committed(repo)[:20], [1] * 10 + [2] * 10)


KILL_HOLD = (3, 2)  # the source block that never comes: the write cannot reach its merge


def kill_session_writer(root: str, started: Any) -> None:
    """The writer that gets SIGKILLed: faultkit's kill data into a session of the repository at
    ``root`` with ``commit=``, one source block held until the kill."""
    from faultkit import KILL_KW, hold_block, kill_data

    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(root))
    src = da.from_array(kill_data(5), chunks=(200, 300))
    src = src.map_blocks(hold_block, KILL_HOLD, dtype=src.dtype, meta=src._meta)
    started.set()
    with dask.config.set(scheduler="threads", num_workers=4):
        shardwise.write_array(
            src, repo.writable_session("main"), path="a", mode="w", commit="killed", **KILL_KW
        )


def test_a_killed_write_leaves_the_branch_unchanged_and_a_rerun_writes_it(
    tmp_path: Path,
) -> None:
    """SIGKILL of a write into a session while its shard tasks write into their forks (chunk
    objects already in the repository's storage): the branch keeps its last commit, the array
    as it was; the rerun docs/guides/icechunk.md prescribes (the same call in a new session)
    writes every value, and garbage collection can remove what the killed write left
    unreferenced."""
    import datetime

    from faultkit import KILL_KW, KILL_SHAPE, forkserver, kill_data, wait_until

    root = tmp_path / "repo"
    repo = new_repo(root)
    before = np.full(KILL_SHAPE, 7.0, dtype="f4")
    shardwise.write_array(before, repo.writable_session("main"), path="a", commit="1", **KILL_KW)
    head = repo.lookup_branch("main")
    chunks_dir = root / "chunks"
    stored = len(list(chunks_dir.iterdir()))
    ctx = forkserver()
    started = ctx.Event()
    p = ctx.Process(target=kill_session_writer, args=(str(root), started))
    p.start()
    assert started.wait(120)
    # mid-write: shard tasks of the new write stored chunk objects (their forks' changes)
    wait_until(lambda: len(list(chunks_dir.iterdir())) >= stored + 4, "4 shards in forks", 300)
    p.kill()
    p.join(120)
    assert p.exitcode == -9
    again = icechunk.Repository.open(icechunk.local_filesystem_storage(str(root)))
    assert again.lookup_branch("main") == head
    np.testing.assert_array_equal(committed(again), before)
    # the rerun: the same write in a new session
    x = kill_data(5)
    shardwise.write_array(
        da.from_array(x, chunks=(200, 300)),
        again.writable_session("main"),
        path="a",
        mode="w",
        commit="rerun",
        **KILL_KW,
    )
    np.testing.assert_array_equal(committed(again), x)
    future = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    assert again.garbage_collect(future).chunks_deleted > 0
    np.testing.assert_array_equal(committed(again), x)


def test_convert_in_place_inside_one_session_is_refused_before_any_change(
    dirty_session: Any,
) -> None:
    """convert from a session into the same session where the destination is the source,
    lies inside it or contains it: refused as on a store (mode "w" would clear the source
    before the copy reads it), the session's changes as they were (the fixture compares)."""
    ds = dirty_session
    for src, dst, path, dst_path in [
        (ds, ds, "a", "a"),  # the session itself on both sides
        (ds.store, ds, "a", "a"),  # its store as the source: the same objects
        (ds, ds.store, "a", "a/inner"),
        (ds, ds, "a", ""),
    ]:
        with pytest.raises(shardwise.PlanError, match="never writes over its own source"):
            shardwise.convert(
                src, dst, path=path, dst_path=dst_path, mode="w", shards=(4, 4), commit="x"
            )
    assert not dirty_session.read_only  # not committed


def test_convert_from_another_session_of_the_same_snapshot_reshards_it(repo: Any) -> None:
    """The way to reshard an array of a repository: read it from a read-only session (the
    branch's last commit) and write it with mode "w" into a writable session of the same
    branch; every value comes back in the new shards."""
    x = np.arange(24 * 24, dtype="f8").reshape(24, 24)
    shardwise.write_array(x, repo.writable_session("main"), path="a", shards=(6, 6), commit="1")
    shardwise.convert(
        repo.readonly_session("main"),
        repo.writable_session("main"),
        path="a",
        dst_path="a",
        mode="w",
        shards=(12, 24),
        commit="resharded",
    )
    arr = zarr.open_array(repo.readonly_session("main").store, path="a", mode="r")
    assert arr.shards == (12, 24)
    np.testing.assert_array_equal(arr[:], x)


def test_mode_w_replaces_a_committed_pyramid(repo: Any, tmp_path: Path) -> None:
    """write_pyramid and convert(pyramid=) with mode "w" over a pyramid already committed in
    the repository: the new pyramid replaces it, the levels it no longer has are gone."""
    x = np.arange(64 * 64, dtype="f4").reshape(64, 64)
    for path in ("pyr", ""):
        shardwise.write_pyramid(
            x,
            repo.writable_session("main"),
            path=path,
            mode="w",
            levels=3,
            chunks=8,
            shards=16,
            commit="1",
        )
        shardwise.write_pyramid(
            2 * x,
            repo.writable_session("main"),
            path=path,
            mode="w",
            levels=2,
            chunks=8,
            shards=16,
            commit="2",
        )
        group = zarr.open_group(repo.readonly_session("main").store, path=path, mode="r")
        assert sorted(group.array_keys()) == ["0", "1"]
        np.testing.assert_array_equal(group["0"][:], 2 * x)
        np.testing.assert_allclose(group["1"][:], block_mean(2 * x, 2))
    ds = v2_dataset(tmp_path / "src.zarr")
    shardwise.convert(
        tmp_path / "src.zarr",
        repo.writable_session("main"),
        path="v",
        dst_path="pyr",
        mode="w",
        pyramid={"levels": 2},
        commit="3",
    )
    group = zarr.open_group(repo.readonly_session("main").store, path="pyr", mode="r")
    assert sorted(group.array_keys()) == ["0", "1"]
    np.testing.assert_array_equal(group["0"][:], ds["v"].values)
    np.testing.assert_allclose(group["1"][:], block_mean(ds["v"].values, 2))


def test_every_reader_takes_a_session(repo: Any) -> None:
    """xr.open_dataset / open_datatree / open_groups with the shardwise engine,
    shardwise.open_dataset / open_datatree, open_array and read_array take a Session
    (read-only or writable, a writable one with its uncommitted changes) as xarray's own zarr
    engine reads its store."""
    x = np.arange(32 * 24, dtype="f8").reshape(32, 24)
    shardwise.to_icechunk(
        xr.Dataset({"v": (("y", "x"), x)}, attrs={"t": 1}),
        repo.writable_session("main"),
        encoding={"v": {"chunks": (8, 8), "shards": (16, 24)}},
        commit="v",
    )
    writable = repo.writable_session("main")
    zarr.open_array(writable.store, path="v", mode="r+")[:8] = -1
    for session in (repo.readonly_session("main"), writable):
        oracle = xr.open_dataset(session.store, engine="zarr", consolidated=False).load()
        for ds in (
            xr.open_dataset(session, engine="shardwise"),
            shardwise.open_dataset(session),
            xr.open_datatree(session, engine="shardwise").to_dataset(),
            shardwise.open_datatree(session).to_dataset(),
            xr.open_groups(session, engine="shardwise")["/"],
        ):
            xr.testing.assert_identical(ds.load(), oracle)
        np.testing.assert_array_equal(shardwise.read_array(session, path="v"), oracle["v"])
        arr = shardwise.open_array(session, path="v")
        np.testing.assert_array_equal(arr[3:20].compute(), oracle["v"][3:20])
    assert (oracle["v"][:8] == -1).all()  # the writable session's change was read


def test_a_read_only_sessions_store_is_refused_by_every_writer(repo: Any, tmp_path: Path) -> None:
    """The store of a read-only session given to a writer: a shardwise error saying to write
    into a writable session, nothing written (icechunk's own would name a lease key)."""
    shardwise.write_array(np.ones((8, 8)), repo.writable_session("main"), path="a", commit="1")
    head = repo.lookup_branch("main")
    store = repo.readonly_session("main").store
    image = xr.DataArray(np.ones((16, 16)), dims=("y", "x"))
    src = tmp_path / "src.zarr"
    zarr.create_array(src, shape=(4,), chunks=(2,), dtype="i1")
    calls = [
        lambda: shardwise.write_array(image.data, store, path="b"),
        lambda: shardwise.to_zarr(image.to_dataset(name="b"), store, mode="a"),
        lambda: shardwise.write_pyramid(image, store, path="p", levels=2),
        lambda: shardwise.convert(src, store, dst_path="c"),
        lambda: shardwise.write_array(image.data, store, path="b", commit="c"),
    ]
    for call in calls:
        with pytest.raises(InvalidValueError, match=r"read-only.*writable_session"):
            call()
    for one in (store, repo.writable_session("main").store):  # a batch takes neither
        with pytest.raises(InvalidValueError, match="batch does not write into an icechunk"):
            shardwise.batch.init(
                one, path="b", shape=(8, 8), dtype="f8", chunks=(4, 4), shards=(4, 4), parts=2
            )
    assert repo.lookup_branch("main") == head
    assert sorted(zarr.open_group(store, mode="r").array_keys()) == ["a"]


def test_commit_of_a_write_that_changed_nothing_says_so(repo: Any) -> None:
    """commit= on a write that changed nothing in the session (the values it wrote were stored
    already): a TransactionError saying so and what to do, the branch unchanged."""
    shardwise.write_array(np.zeros((8, 8)), repo.writable_session("main"), path="a", commit="1")
    head = repo.lookup_branch("main")
    session = repo.writable_session("main")
    with pytest.raises(TransactionError, match=r"changed nothing.*allow_empty=True") as info:
        shardwise.write_array(np.zeros((8, 8)), session, path="a", mode="r+", commit="again")
    assert str(info.value) == (
        "commit='again': the write changed nothing in the session of branch 'main' (what it "
        "wrote was stored already), and icechunk makes no empty commit; nothing was committed. "
        "Write without commit=, or commit the session yourself (session.commit(message, "
        "allow_empty=True))"
    )
    assert repo.lookup_branch("main") == head and not session.read_only
    session.commit("empty on purpose", allow_empty=True)  # what the message says works
    assert repo.lookup_branch("main") != head


class Held:
    """A source whose blocks wait, inside the shard tasks of a write, until :meth:`release`:
    the write is running (its metadata and fork in the session) while ``inside`` is set."""

    def __init__(self) -> None:
        self.inside, self.go = threading.Event(), threading.Event()

    def hold(self, block: np.ndarray) -> np.ndarray:
        self.inside.set()
        assert self.go.wait(120), "never released"
        return block

    def array(self, x: np.ndarray) -> Any:
        a = da.from_array(x, chunks=x.shape)
        return a.map_blocks(self.hold, dtype=a.dtype, meta=np.empty((0,) * a.ndim, a.dtype))

    def release(self) -> None:
        self.go.set()


class Running:
    """``call`` run in a thread of its own; :meth:`result` its value, or raises its error.
    ``held``: its :class:`Held` source, whose ``inside`` is set when the call ends too (a
    call that fails before its shard tasks does not leave the test waiting)."""

    def __init__(self, call: Any, held: Held | None = None) -> None:
        self.out: list[Any] = []
        self.held = held
        self.thread = threading.Thread(target=self._run, args=(call,))
        self.thread.start()

    def _run(self, call: Any) -> None:
        try:
            self.out.append(call())
        except BaseException as e:
            self.out.append(e)
        finally:
            if self.held is not None:
                self.held.inside.set()

    def wait_inside(self) -> None:
        """Until the call is inside its shard tasks, held there (its error if it ended)."""
        assert self.held is not None and self.held.inside.wait(120)
        if self.out:
            self.result()
            raise AssertionError("the write ended before its shard tasks were held")

    def result(self) -> Any:
        self.thread.join(120)
        assert not self.thread.is_alive() and len(self.out) == 1
        if isinstance(self.out[0], BaseException):
            raise self.out[0]
        return self.out[0]


ONE_WRITE = "another shardwise write into this icechunk session"
# the whole refusal: why two writes in one session at once are refused, and what to do instead
ONE_WRITE_IN_FULL = (
    "another shardwise write into this icechunk session (branch 'main') is running, in another "
    "thread: two writes in one session at once would lose one's changes (each merges forks made "
    "before the other's rows and shards); nothing of this one was written. Run them one after "
    "the other, or each in a session of its own (repo.writable_session(branch)), committed one "
    "by one (commits that share shards conflict instead of losing data)"
)


def test_a_second_write_into_a_session_while_one_runs_is_refused(repo: Any, tmp_path: Path) -> None:
    """Two region writes sharing a shard in one session at once: the second merged forks made
    before the first's change, and one of them was lost. Now, while a write runs (held inside
    its shard tasks), every writer's call into the same session from another thread is a
    TransactionError before any change; the running write lands alone, and the same second
    write run after it lands too: both regions are there."""
    x = np.arange(20 * 4, dtype="f8").reshape(20, 4)
    shardwise.write_array(x, repo.writable_session("main"), path="v", shards=(10, 4), commit="0")
    session = repo.writable_session("main")
    held = Held()

    def first() -> Any:
        with dask.config.set(scheduler="threads"):
            return shardwise.write_array(
                held.array(np.full((5, 4), 1.0)),
                session,
                path="v",
                region=(slice(0, 5), ...),
                mode="r+",
            )

    def second(store: Any) -> Any:  # rows 5:10, in the first's shard
        return shardwise.write_array(
            np.full((5, 4), 2.0), store, path="v", region=(slice(5, 10), ...), mode="r+"
        )

    src = tmp_path / "src.zarr"
    zarr.create_array(src, shape=(4,), chunks=(2,), dtype="i1")
    image = xr.DataArray(np.ones((16, 16)), dims=("y", "x"))
    others = [
        lambda: second(session),
        lambda: second(session.store),
        lambda: shardwise.to_icechunk(image.to_dataset(name="b"), session, group="g"),
        lambda: shardwise.to_zarr(image.to_dataset(name="b"), session.store, group="g"),
        lambda: shardwise.write_pyramid(image, session, path="p", levels=2),
        lambda: shardwise.convert(src, session, dst_path="c"),
    ]
    running = Running(first, held)
    running.wait_inside()  # the first write is inside its shard tasks
    for call in others:
        with pytest.raises(TransactionError, match=ONE_WRITE):
            Running(call).result()
    assert running.thread.is_alive()  # the race happened: the first was running all along
    held.release()
    running.result()
    x[0:5] = 1.0
    np.testing.assert_array_equal(shardwise.read_array(session, path="v"), x)
    assert sorted(zarr.open_group(session.store, mode="r").keys()) == ["v"]  # nothing else
    second(session)  # the claim was given back (this thread is not the first's): it lands now
    session.commit("both")
    x[5:10] = 2.0
    np.testing.assert_array_equal(committed(repo, "v"), x)


def test_a_second_append_into_a_session_while_one_runs_is_refused(repo: Any) -> None:
    """Two appends along one dimension into one session at once (one append's rows could be
    lost: no conditional commit of the lead array inside a session): the second, called while
    the first runs, is refused before any change; run after it, both appends land in order,
    read back by xarray's own zarr engine identical to the whole dataset."""
    ds = dataset().compute()
    shardwise.to_icechunk(
        ds.isel(t=slice(0, 20)), repo.writable_session("main"), encoding=ENCODING, commit="0"
    )
    session = repo.writable_session("main")
    held = Held()
    part = ds.isel(t=slice(20, 40)).copy()
    part["v"] = (("t", "x"), held.array(part["v"].values))

    def append(what: xr.Dataset) -> Any:
        with dask.config.set(scheduler="threads"):
            return shardwise.to_icechunk(what, session, append_dim="t")

    running = Running(lambda: append(part), held)
    running.wait_inside()
    with pytest.raises(TransactionError, match=ONE_WRITE) as refused:
        Running(lambda: append(ds.isel(t=slice(40, None)))).result()
    assert str(refused.value) == ONE_WRITE_IN_FULL
    assert running.thread.is_alive()
    held.release()
    running.result()
    append(ds.isel(t=slice(40, None)))  # in this thread, not the first's
    session.commit("two appends")
    back = xr.open_dataset(repo.readonly_session("main").store, engine="zarr", consolidated=False)
    xr.testing.assert_identical(back.load(), ds)


def test_a_refused_or_failed_write_gives_its_session_back(repo: Any) -> None:
    """A call that claimed the session and then failed (refused after its claim, or its source
    raising in a shard task) gives the claim back: a write from another thread goes on (the
    failed calls run in this thread, alive all along: the other's is not one of theirs)."""
    shardwise.write_array(np.ones((8, 8)), repo.writable_session("main"), path="a", commit="1")
    session = repo.writable_session("main")

    def boom(block: np.ndarray) -> np.ndarray:
        raise RuntimeError("the source failed")

    failing = da.ones((8, 8), chunks=4).map_blocks(boom, dtype="f8", meta=np.empty((0, 0)))
    with pytest.raises(shardwise.ArrayExistsError):
        shardwise.write_array(np.ones(3), session, path="a", mode="w-")
    with dask.config.set(scheduler="threads"), pytest.raises(RuntimeError, match="the source"):
        shardwise.write_array(failing, session, path="b")
    Running(lambda: shardwise.write_array(np.zeros((8, 8)), session, path="a", mode="r+")).result()
    np.testing.assert_array_equal(shardwise.read_array(session, path="a"), np.zeros((8, 8)))
