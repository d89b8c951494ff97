"""Streams into icechunk sessions (real icechunk, local-filesystem repositories).

``stream``, ``stream_pyramid`` and ``stream_dataset`` given a session write each flush's whole
shards into forks of it, merged into the session, the array's shape grown there; the user
commits. No lease or journal goes into the repository; ``resume=True`` in a new session
continues from the length of the last commit. What a session refuses is refused before any
change, and the session is held by the stream (no other thread writes into it) until it closes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from zarr.core.sync import sync

import shardwise
from shardwise.errors import ArrayExistsError, InvalidTypeError, InvalidValueError, TransactionError

icechunk = pytest.importorskip("icechunk")

FRAMES = np.arange(21 * 4 * 6, dtype="u2").reshape(21, 4, 6)


@pytest.fixture
def repo(tmp_path: Path) -> Any:
    return icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "r")))


def keys(store: Any) -> list[str]:
    async def go() -> list[str]:
        return [k async for k in store.list()]

    return sorted(sync(go()))


def main(repo: Any, path: str = "a") -> zarr.Array:
    """The array at ``path`` of the branch's last commit, opened by zarr-python."""
    return zarr.open_array(repo.readonly_session("main").store, path=path, mode="r")


def frames_stream(session: Any, axis: int = 0, **kw: Any) -> Any:
    """A stream of ``FRAMES`` along ``axis``, shard-rows of 4 frames."""
    shape: list[int | None] = [None, 4, 6]
    shape.insert(axis, shape.pop(0))
    chunks = [1, 4, 6]
    chunks.insert(axis, chunks.pop(0))
    shards = [4, 4, 6]
    shards.insert(axis, shards.pop(0))
    names = ["t", "y", "x"]
    names.insert(axis, names.pop(0))
    return shardwise.stream(
        session, shape=tuple(shape), dtype="u2", append_axis=axis, chunks=tuple(chunks),
        shards=tuple(shards), path="a", dimension_names=tuple(names), **kw,
    )  # fmt: skip


@pytest.mark.parametrize("axis", [0, 2])
def test_a_stream_into_a_session_is_read_after_the_commit(repo: Any, axis: int) -> None:
    """Batches crossing shard-rows and a flush of a partial one: the session holds every frame
    (its shape grown), the branch nothing until the commit; then zarr-python and xarray read
    the array through the repository equal to numpy. No lease or journal in the repository."""
    x = np.moveaxis(FRAMES, 0, axis)
    session = repo.writable_session("main")
    with frames_stream(session, axis) as s:
        s.append(np.take(x, 0, axis=axis))
        s.extend(np.take(x, range(1, 7), axis=axis))  # sealed at 4, 6 buffered
        s.flush()
        assert s.stored == 7
        seen = zarr.open_array(session.store, path="a", mode="r")
        np.testing.assert_array_equal(seen[:], np.take(x, range(7), axis=axis))
        s.extend(np.take(x, range(7, 21), axis=axis))
    assert s.report is not None and s.stored == 21
    assert not any(".shardwise" in k for k in keys(session.store))
    session.commit("21 frames")
    np.testing.assert_array_equal(main(repo)[:], x)
    ds = xr.open_zarr(repo.readonly_session("main").store, consolidated=False)
    np.testing.assert_array_equal(ds["a"].values, x)


def test_a_stream_resumes_from_the_last_commit(repo: Any) -> None:
    """A commit at 13 frames (a partial shard-row); a stream in a new session that is never
    committed; ``resume=True`` in a third session reports 13, continues with frame 13 (the
    partial shard-row read back and written whole) and the branch ends equal to numpy."""
    first = repo.writable_session("main")
    with frames_stream(first) as s:
        s.extend(FRAMES[:13])
    first.commit("13 frames")
    lost = repo.writable_session("main")
    with frames_stream(lost, resume=True) as s:
        assert s.resumed_from == 13
        s.extend(FRAMES[13:17])
    assert zarr.open_array(lost.store, path="a", mode="r").shape[0] == 17
    third = repo.writable_session("main")  # the second never committed: the branch has 13
    with frames_stream(third, resume=True) as s:
        assert s.resumed_from == 13
        s.extend(FRAMES[13:])
    third.commit("the rest")
    np.testing.assert_array_equal(main(repo)[:], FRAMES)


def test_a_stream_pyramid_into_a_session_resumed_from_its_commit(repo: Any) -> None:
    """Every level of a pyramid stream committed at 10 frames, resumed in a new session to 15:
    level 0 the frames, level 1 their 2x2 block means, the group's OME attributes there."""
    x = np.random.default_rng(0).integers(0, 1000, (15, 8, 8)).astype("f4")
    kw = {"shape": (None, 8, 8), "dtype": "f4", "levels": 2, "dims": ("t", "y", "x"),
          "chunks": (1, 4, 4), "shards": (4, 8, 8), "path": "p"}  # fmt: skip
    session = repo.writable_session("main")
    with shardwise.stream_pyramid(session, **kw) as p:
        for t in range(10):
            p.append(x[t])
    session.commit("10 frames")
    np.testing.assert_array_equal(main(repo, "p/0")[:], x[:10])
    again = repo.writable_session("main")
    with shardwise.stream_pyramid(again, resume=True, **kw) as p:
        assert p.frames == 10
        p.extend(x[10:])
    again.commit("15 frames")
    np.testing.assert_array_equal(main(repo, "p/0")[:], x)
    mean = x.reshape(15, 4, 2, 4, 2).mean(axis=(2, 4))
    np.testing.assert_allclose(main(repo, "p/1")[:], mean, rtol=1e-6)
    group = zarr.open_group(repo.readonly_session("main").store, path="p", mode="r")
    assert "ome" in group.attrs


def day(i: int, n: int = 1) -> xr.Dataset:
    when = pd.date_range("2024-01-01", periods=n) + pd.Timedelta(days=i)
    t2m = np.arange(i, i + n, dtype="f4")[:, None] * np.ones(3, "f4")
    return xr.Dataset({"t2m": (("time", "x"), t2m)}, coords={"time": when, "x": [10, 20, 30]})


def test_a_dataset_stream_into_a_session_resumed_from_its_commit(repo: Any) -> None:
    """A Dataset stream committed at 6 days, resumed in a new session to 11: xarray reads the
    group through the repository, every variable at every day, its time coordinate too."""
    session = repo.writable_session("main")
    with shardwise.stream_dataset(session, day(0), group="ds", shards=4) as s:
        for i in range(6):
            s.append(day(i))
    session.commit("6 days")
    again = repo.writable_session("main")
    with shardwise.stream_dataset(again, day(0), group="ds", shards=4, resume=True) as s:
        assert s.resumed_from == 6
        s.extend(day(6, 5))
    again.commit("11 days")
    got = xr.open_zarr(repo.readonly_session("main").store, group="ds", consolidated=False)
    xr.testing.assert_equal(got.compute(), day(0, 11))


def test_the_session_is_held_while_the_stream_is_open(repo: Any) -> None:
    """Another thread's write into the session is refused while a stream writes into it (one
    write into a session at a time), and goes on once the stream closed."""
    session = repo.writable_session("main")
    outcome: list[Any] = []

    def other() -> None:
        try:
            shardwise.write_array(np.ones(4), session, path="b")
            outcome.append("written")
        except TransactionError as e:
            outcome.append(e)

    with frames_stream(session) as s:
        s.extend(FRAMES[:5])
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert isinstance(outcome[0], TransactionError)
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert outcome[1] == "written"
    session.commit("both")
    np.testing.assert_array_equal(main(repo)[:], FRAMES[:5])


def test_what_a_session_refuses_is_refused_before_any_change(repo: Any) -> None:
    """A fork, a read-only session, ``lease=True``, an array there in mode "w-", and
    ``stream_geozarr``: each refused, the session's uncommitted changes as they were."""
    first = repo.writable_session("main")
    with frames_stream(first) as s:
        s.extend(FRAMES[:4])
    first.commit("4 frames")
    session = repo.writable_session("main")
    zarr.create_array(session.store, name="b", shape=(2,), dtype="i1")
    before = str(session.status())
    fork = session.fork
    pyramid = {"shape": (None, 8), "dtype": "u1"}
    refusals = [
        (lambda: frames_stream(fork()), InvalidValueError, "ForkSession"),
        (lambda: frames_stream(repo.readonly_session("main")), InvalidValueError, "read-only"),
        (lambda: frames_stream(session, lease=True), InvalidValueError, "lease=True"),
        (lambda: frames_stream(session, resume=False), ArrayExistsError, "already"),
        (lambda: shardwise.stream_pyramid(fork(), **pyramid), InvalidValueError, "ForkSession"),
        (lambda: shardwise.stream_dataset(fork(), day(0)), InvalidValueError, "ForkSession"),
        (lambda: shardwise.stream_geozarr(session, day(0)), InvalidTypeError, "consolidated"),
    ]
    for call, error, words in refusals:
        with pytest.raises(error, match=words):
            call()
        assert str(session.status()) == before
    with frames_stream(session, resume=True) as s:  # nothing held by the refused calls
        assert s.resumed_from == 4


def write_from_another_thread(session: Any, path: str) -> Any:
    """A ``write_array`` into ``session`` run in another thread: "written", or its error."""
    outcome: list[Any] = []

    def other() -> None:
        try:
            shardwise.write_array(np.ones(4), session, path=path)
            outcome.append("written")
        except TransactionError as e:
            outcome.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    return outcome[0]


def between(part: Any, method: str, check: Callable[[], Any], seen: list[Any]) -> None:
    """``part.<method>`` (a later inner stream's ``_finish`` or ``_abandon``) runs ``check``
    first, its outcome kept in ``seen``: the moment the earlier inner streams have ended and
    this one not yet."""
    own = getattr(part, method)

    def hooked(*args: Any) -> Any:
        seen.append(check())
        return own(*args)

    setattr(part, method, hooked)


def test_a_dataset_stream_holds_the_session_until_its_last_variable_ended(repo: Any) -> None:
    """A Dataset stream's variables (``t2m``, then ``time``) close one by one: after the first
    has finished and before the last, another thread's write into the session is refused (the
    Dataset stream still writes into it), and lands once the stream closed. The same when the
    stream is abandoned (an error in the ``with`` block): refused between its variables, then
    given back. The committed Dataset is every day appended."""
    session = repo.writable_session("main")
    seen: list[Any] = []
    with shardwise.stream_dataset(session, day(0), group="ds", shards=4) as s:
        assert list(s.streams) == ["t2m", "time"]
        s.extend(day(0, 6))
        between(s.streams["time"], "_finish", lambda: write_from_another_thread(session, "b"), seen)
        assert not s.streams["t2m"].closed
    assert s.streams["t2m"].closed and s.streams["time"].closed and len(seen) == 1
    assert isinstance(seen[0], TransactionError)
    assert write_from_another_thread(session, "b") == "written"
    with (
        pytest.raises(RuntimeError, match="in the block"),
        shardwise.stream_dataset(session, day(0), group="gone", shards=4) as s,
    ):
        s.extend(day(0, 3))
        between(
            s.streams["time"], "_abandon", lambda: write_from_another_thread(session, "c"), seen
        )
        raise RuntimeError("in the block")
    assert s.streams["t2m"].closed and s.streams["time"].closed and len(seen) == 2
    assert isinstance(seen[1], TransactionError)
    assert write_from_another_thread(session, "c") == "written"
    session.commit("a dataset stream, then the others")
    got = xr.open_zarr(repo.readonly_session("main").store, group="ds", consolidated=False)
    xr.testing.assert_equal(got.compute(), day(0, 6))
    np.testing.assert_array_equal(main(repo, "b")[:], np.ones(4))


def test_a_pyramid_stream_holds_the_session_until_its_last_level_ended(repo: Any) -> None:
    """A pyramid stream's levels close level 0 first, level 1 then fed its last frames and
    closed: between them another thread's write into the session is refused, and lands once
    the pyramid closed; abandoned, the same between its levels, then given back."""
    x = np.random.default_rng(1).integers(0, 1000, (6, 8, 8)).astype("f4")
    kw = {"shape": (None, 8, 8), "dtype": "f4", "levels": 2, "dims": ("t", "y", "x"),
          "chunks": (1, 4, 4), "shards": (4, 8, 8)}  # fmt: skip
    session = repo.writable_session("main")
    seen: list[Any] = []
    with shardwise.stream_pyramid(session, path="p", **kw) as p:
        p.extend(x)
        between(p.levels[1], "_finish", lambda: write_from_another_thread(session, "b"), seen)
    assert len(seen) == 1 and isinstance(seen[0], TransactionError)
    assert write_from_another_thread(session, "b") == "written"
    with (
        pytest.raises(RuntimeError, match="in the block"),
        shardwise.stream_pyramid(session, path="q", **kw) as p,
    ):
        p.extend(x[:3])
        between(p.levels[1], "_abandon", lambda: write_from_another_thread(session, "c"), seen)
        raise RuntimeError("in the block")
    assert all(lv.closed for lv in p.levels) and len(seen) == 2
    assert isinstance(seen[1], TransactionError)
    assert write_from_another_thread(session, "c") == "written"
    session.commit("a pyramid stream, then the others")
    np.testing.assert_array_equal(main(repo, "p/0")[:], x)
    mean = x.reshape(6, 4, 2, 4, 2).mean(axis=(2, 4))
    np.testing.assert_allclose(main(repo, "p/1")[:], mean, rtol=1e-6)
