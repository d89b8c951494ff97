"""``shardwise.stream``: frames in, whole shard-rows out, through one open write call.

Frames of several dtypes along the first and another axis, shard boundaries inside a batch,
unbounded and known lengths, ``flush`` of the partial last shard-row; the lifecycle held once
(one lease, one marker); readers (shardwise, xarray's engine, zarr-python, another process)
seeing stored frames only; a second writer refused; backpressure and bounded memory; and
SIGKILLed streams (at a hook of the seal and at random points chosen by hypothesis) resumed
with ``resume=True``, nothing stored lost, compared with numpy and verified clean."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.abc.store import Store
from zarr.storage import WrapperStore

import shardwise
from faultkit import forkserver, wait_until
from memkit import MiB, peak_rss
from shardwise.durability.journal import read_markers
from shardwise.durability.lease import LEASE, read_lease
from shardwise.storage.store import ShardStore
from shardwise.write import streams

FRAME = (6, 5)
STEP = 4  # frames of a shard-row


def layout(axis: int) -> dict[str, Any]:
    """Shape, chunks and shards of a stream of FRAME frames along ``axis`` (unbounded)."""
    shape: list[int | None] = list(FRAME)
    chunks, shards = [3, 5], [6, 5]
    shape.insert(axis, None)
    chunks.insert(axis, 2)
    shards.insert(axis, STEP)
    return dict(shape=tuple(shape), chunks=tuple(chunks), shards=tuple(shards), append_axis=axis)


def frames(n: int, dtype: Any = "u2", seed: int = 0) -> np.ndarray:
    """``n`` frames stacked along axis 0, values of ``dtype``."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 100, size=(n, *FRAME))
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return raw % 2 == 1
    if dt.kind == "c":
        return (raw + 1j * raw[::-1]).astype(dt)
    return raw.astype(dt)


def along(x: np.ndarray, axis: int) -> np.ndarray:
    """Frames stacked along axis 0, moved to ``axis``."""
    return np.moveaxis(x, 0, axis)


def stored(root: Any, path: str | None = None) -> np.ndarray:
    return np.asarray(zarr.open_array(root, path=path, mode="r")[...])


# -- frames in, shard-rows out ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["u1", "i2", "u2", "i4", "f4", "f8", "c8", "bool"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_frames_of_every_dtype_along_any_axis_round_trip(
    tmp_path: Path, dtype: str, axis: int
) -> None:
    """Single frames and batches whose shard boundaries fall inside them (3, 5, then 7 frames
    from frame 1: boundaries at 4, 8, 12, 16): the array holds every frame, verify is clean."""
    x = frames(23, dtype)
    root = tmp_path / "a.zarr"
    with shardwise.stream(root, dtype=dtype, **layout(axis)) as s:
        s.append(x[0])  # one frame: no append axis
        for a, b in ((1, 4), (4, 9), (9, 16), (16, 23)):
            s.append(along(x[a:b], axis))
    assert s.report is not None and s.stored == 23
    np.testing.assert_array_equal(stored(root), along(x, axis))
    assert zarr.open_array(root, mode="r").dtype == np.dtype(dtype)
    assert shardwise.verify(root).ok


def test_a_known_length_seals_its_last_partial_shard_row_and_refuses_more(tmp_path: Path) -> None:
    x = frames(10)
    root = tmp_path / "a.zarr"
    lay = layout(0) | {"shape": (10, *FRAME)}
    s = shardwise.stream(root, dtype="u2", **lay)
    s.append(x[:9])
    assert s.stored <= 8  # the partial third shard-row waits
    with pytest.raises(shardwise.InvalidValueError, match="past the stream's length 10"):
        s.append(x[:2])
    s.append(x[9])  # the 10th frame: the last shard-row is full for this length
    s.close()
    np.testing.assert_array_equal(stored(root), x)
    assert shardwise.verify(root).ok


def test_flush_shows_the_partial_shard_row_whose_shard_is_written_whole_when_it_seals(
    tmp_path: Path,
) -> None:
    x = frames(12)
    root = tmp_path / "a.zarr"
    s = shardwise.stream(root, dtype="u2", **layout(0))
    s.append(x[:6])
    s.flush()
    assert s.stored == 6 and zarr.open_array(root, mode="r").shape == (6, *FRAME)
    np.testing.assert_array_equal(stored(root), x[:6])
    s.append(x[6:12])  # shard-row 1 seals from the buffered frames 4:6 and these
    s.close()
    np.testing.assert_array_equal(stored(root), x)
    report = shardwise.verify(root)
    assert report.ok and report.shards_stored == 3


def test_extend_takes_numpy_and_dask_arrays_shard_row_by_shard_row(tmp_path: Path) -> None:
    import dask.array as da

    x = frames(30, "f4")
    root = tmp_path / "a.zarr"
    with shardwise.stream(root, dtype="f4", path="cam", **layout(0)) as s:
        s.extend(x[:11])
        s.extend(da.from_array(x[11:], chunks=(5, 6, 5)))
    np.testing.assert_array_equal(stored(root, "cam"), x)


def test_frames_that_do_not_fit_are_refused_before_the_buffer_changes(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    with shardwise.stream(root, dtype="u1", **layout(0)) as s:
        with pytest.raises(shardwise.PlanError, match="do not fit"):
            s.append(np.zeros((5, 6), "u1"))
        with pytest.raises(shardwise.PlanError, match="without loss"):
            s.append(np.zeros(FRAME, "f4"))
        s.append(np.ones(FRAME, "u1"))
    assert stored(root).shape == (1, *FRAME)
    with pytest.raises(shardwise.ArrayExistsError):
        shardwise.stream(root, dtype="u1", **layout(0))


def test_a_stream_holds_one_lease_and_one_marker_and_finishes_once(tmp_path: Path) -> None:
    """The one write call held open: the same lease token through every seal, one open
    marker whose region grows with the stored frames, done at close."""
    x = frames(20)
    root = tmp_path / "a.zarr"
    array = ShardStore(zarr.storage.LocalStore(root), "")
    tokens, regions = set(), []
    with shardwise.stream(root, dtype="u2", **layout(0)) as s:
        for i in range(0, 20, STEP):
            s.append(x[i : i + STEP])
            s.flush()
            lease = read_lease(array, LEASE)
            assert lease is not None
            tokens.add(lease.token)
            markers = [m for m in read_markers(array).values() if m is not None]
            assert [m.status for m in markers] == ["open"]
            regions.append(markers[0].region[0])
    assert len(tokens) == 1 and read_lease(array, LEASE) is None
    assert regions == [[0, n] for n in range(4, 24, 4)]
    assert [m.status for m in read_markers(array).values() if m is not None] == ["done"]


# -- readers while writing -------------------------------------------------------------------------


def test_readers_see_the_stored_frames_between_appends(tmp_path: Path) -> None:
    import xarray as xr

    x = frames(21)
    root = str(tmp_path / "a.zarr")
    zarr.open_group(root, mode="w", zarr_format=3)
    s = shardwise.stream(root, dtype="u2", path="v", dimension_names=("t", "y", "x"), **layout(0))
    for i in range(21):
        s.append(x[i])
        if i % 5 == 4:
            s.flush()  # the partial shard-row shown too: every frame so far
        for got in (
            shardwise.open_array(root, path="v")[...],
            stored(root, "v"),
            xr.open_dataset(root, engine="shardwise")["v"].values,
        ):
            n = len(got)  # what this reader found (seals run in the background)
            assert n <= i + 1 and (n % STEP == 0 or n in (5, 10, 15, 20)), n
            np.testing.assert_array_equal(got, x[:n])
            if i % 5 == 4:
                assert n == i + 1
    s.close()
    np.testing.assert_array_equal(xr.open_dataset(root, engine="shardwise")["v"].values, x)


class ThenReplaced(WrapperStore[Store]):
    """A store whose first read of ``key`` runs ``then()`` before it returns: a reader that
    reads the shard's index, then its chunks in another request, finds the shard replaced in
    between (the interleaving a seal running beside a reader can take)."""

    def __init__(self, store: Store, key: str, then: Any, fired: list[str] | None = None) -> None:
        super().__init__(store)
        self.key, self.then = key, then
        self.fired = [] if fired is None else fired  # shared with the copies zarr makes

    def _with_store(self, store: Store) -> ThenReplaced:
        return ThenReplaced(store, self.key, self.then, self.fired)

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        got = await self._store.get(key, prototype, byte_range)
        if key.endswith(self.key) and not self.fired:
            self.fired.append(key)
            await asyncio.to_thread(self.then)  # zarr's loop stays free for the seal's puts
        return got


@pytest.mark.parametrize("reader", ["zarr-python, local files", "shardwise, a memory store"])
def test_a_read_of_a_flushed_shard_spanning_its_seal_gets_the_stored_frames(
    tmp_path: Path, reader: str
) -> None:
    """A flush shows frame 4 (shard-row 1 partial); a reader of the array at 5 frames reads
    that shard's index, then the seal of shard-row 1 replaces the shard, then the reader reads
    the chunk the index names: it gets frame 4 (the replaced shard keeps the flushed chunks in
    place), not bytes of the new shard (a zstd error, or other values)."""
    x = frames(8)
    local = reader.startswith("zarr")
    root: Any = tmp_path / "a.zarr" if local else zarr.storage.MemoryStore()
    s = shardwise.stream(root, dtype="u2", **layout(0))
    s.append(x[:5])
    s.flush()

    def seal() -> None:
        s.append(x[5:8])
        s.flush()  # the seal stored and the shape grown (no partial shard-row left)
        assert s.stored == 8

    inner = zarr.storage.LocalStore(root, read_only=True) if local else root
    store = ThenReplaced(inner, "c/1/0/0", seal)
    if local:
        got = np.asarray(zarr.open_array(store, mode="r")[:5])
    else:
        got = np.asarray(shardwise.open_array(store)[:5])
    assert store.fired  # the reader's first request of the shard, then the seal
    np.testing.assert_array_equal(got, x[:5])
    s.close()
    np.testing.assert_array_equal(stored(root), x)
    report = shardwise.verify(root)
    assert report.ok and report.shards_stored == 2


def read_elsewhere(root: str, out: Any) -> None:
    """Another process: what zarr-python, tensorstore and xarray read of the array now."""
    import tensorstore as ts
    import xarray as xr

    a = np.asarray(zarr.open_array(root, path="v", mode="r")[...])
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{root}/v"}}
    t = ts.open(spec, read=True).result().read().result()
    ds = xr.open_dataset(root, engine="zarr", consolidated=False)
    out.put([a.tolist(), np.asarray(t).tolist(), ds["v"].values.tolist()])


def test_another_process_reads_the_stored_frames_while_a_seal_is_held(tmp_path: Path) -> None:
    """The writer holds the seal that reaches frame 12 after its shards are stored, before the
    shape grows: another process reads exactly the frames stored before it (none of the held
    seal's) with three unmodified readers."""
    x = frames(16)
    root = str(tmp_path / "a.zarr")
    zarr.open_group(root, mode="w", zarr_format=3)
    reached, go = threading.Event(), threading.Event()
    held: list[int] = []

    def hold(end: int) -> None:
        if end >= 3 * STEP and not held:
            held.append(end)
            reached.set()
            go.wait()

    streams.after_store = hold
    try:
        s = shardwise.stream(
            root, dtype="u2", path="v", dimension_names=("t", "y", "x"), **layout(0)
        )
        s.append(x[:14])  # shard-rows 0-2 seal in the background; the one reaching 12 is held
        assert reached.wait(120)
        before = s.stored  # the worker is held: nothing more is stored until go
        ctx = forkserver()
        out = ctx.Queue()
        reader = ctx.Process(target=read_elsewhere, args=(root, out))
        reader.start()
        got = out.get(timeout=300)
        reader.join(60)
        go.set()
        s.close()
    finally:
        streams.after_store = None
        go.set()
    assert before < held[0] == 3 * STEP
    for values in got:
        np.testing.assert_array_equal(np.asarray(values).reshape(-1, *FRAME), x[:before])
    np.testing.assert_array_equal(stored(root, "v"), x[:14])


def held_batch(root: Path, stop: type[BaseException] | None = None) -> tuple[Any, list[Any]]:
    """A stream whose writer is held in its first seal (shard-row 0) while shard-rows 1-3
    seal, so that they are written together, in one write; at that write's hook (its shards
    stored, the shape not grown yet) what zarr-python reads is kept, and ``stop`` raised."""
    x = frames(4 * STEP + 1)
    reached, go = threading.Event(), threading.Event()
    seen: list[Any] = []

    def hold(end: int) -> None:
        if end == STEP:
            reached.set()
            go.wait()
        else:
            a = zarr.open_array(root, mode="r")
            seen.append((end, a.shape, np.asarray(a[...])))
            if stop is not None:
                raise stop("stopped after the batch's shards, before its shape")

    streams.after_store = hold
    try:
        s = shardwise.stream(root, dtype="u2", pending=4, **layout(0))
        s.append(x[:STEP])
        assert reached.wait(120)
        s.append(x[STEP:])  # shard-rows 1-3 sealed, waiting for the writer; 16 buffered
        go.set()
        if stop is None:
            s.close()
        else:
            with pytest.raises(stop):
                s.close()
    finally:
        streams.after_store = None
        go.set()
    return x, seen


def test_shard_rows_written_together_show_readers_only_the_grown_shape(tmp_path: Path) -> None:
    """Shard-rows sealed while the writer is busy are written in one write (their records
    in one object): at its hook, every shard stored, a reader still sees the shape before it
    and those frames only; after it the array is every frame, verified clean."""
    root = tmp_path / "a.zarr"
    x, seen = held_batch(root)
    (end, shape, values), *_ = seen
    assert end == 4 * STEP and shape == (STEP, *FRAME)  # shard-rows 1-3 stored, not shown
    np.testing.assert_array_equal(values, x[:STEP])
    assert all((root / "c" / str(r) / "0" / "0").exists() for r in (1, 2, 3))
    assert not (root / ".shardwise" / "shards" / "c" / "1").exists()  # one record object
    assert any((root / ".shardwise" / "runs").iterdir())
    np.testing.assert_array_equal(stored(root), x)
    assert shardwise.verify(root).ok


def test_a_resume_after_a_batch_stopped_before_its_shape_removes_it_and_its_records(
    tmp_path: Path,
) -> None:
    """A stream stopped after a batch's shards were stored, before its shape grew: the resume
    reports the frames shown, removes the batch's shards and their records, and a stream
    closed before writing those rows again leaves a clean array of what it was given."""
    root = tmp_path / "a.zarr"
    x, _ = held_batch(root, stop=RuntimeError)
    assert zarr.open_array(root, mode="r").shape[0] == STEP
    with shardwise.stream(root, dtype="u2", resume=True, **layout(0)) as s:
        assert s.resumed_from == STEP
        s.append(x[STEP : STEP + 2])
    assert not any((root / "c" / str(r) / "0" / "0").exists() for r in (2, 3))
    np.testing.assert_array_equal(stored(root), x[: STEP + 2])
    assert shardwise.verify(root).ok


# -- one writer ------------------------------------------------------------------------------------


def test_a_second_writer_is_refused_while_the_stream_is_open(tmp_path: Path) -> None:
    x = frames(8)
    root = tmp_path / "a.zarr"
    s = shardwise.stream(root, dtype="u2", **layout(0))
    s.append(x[:5])
    s.flush()
    for kw in ({"resume": True}, {"mode": "w"}):
        with pytest.raises(shardwise.LeaseHeldError):
            shardwise.stream(root, dtype="u2", **layout(0), **kw)
    with pytest.raises(shardwise.LeaseHeldError):
        shardwise.write_array(x[:1], root, append_dim=0)
    s.append(x[5:])
    s.close()
    np.testing.assert_array_equal(stored(root), x)  # nothing the refused writers did
    with shardwise.stream(root, dtype="u2", resume=True, **layout(0)) as again:
        assert again.resumed_from == 8
        again.append(x[:3])
    np.testing.assert_array_equal(stored(root), np.concatenate([x, x[:3]]))
    assert shardwise.verify(root).ok


def test_append_waits_for_a_buffer_while_the_seals_fall_behind(tmp_path: Path) -> None:
    """pending=1: two shard-row buffers. With the first seal held, the appender fills the
    second and waits there; the memory stated up front is the two buffers."""
    x = frames(16)
    root = tmp_path / "a.zarr"
    reached, go = threading.Event(), threading.Event()

    def hold(end: int) -> None:
        if not reached.is_set():  # the first seal (of one or both buffers)
            reached.set()
            go.wait()

    streams.after_store = hold
    try:
        s = shardwise.stream(root, dtype="u2", pending=1, **layout(0))
        assert s.memory == 2 * STEP * int(np.prod(FRAME)) * 2
        assert "memory" in repr(s)
        appender = threading.Thread(target=s.append, args=(x,))
        appender.start()
        assert reached.wait(120)
        wait_until(lambda: s.frames == 2 * STEP, "the second shard-row sealed")
        assert s.stored == 0 and appender.is_alive()  # 2 of 4 shard-rows taken: it waits
        go.set()
        appender.join()
        s.close()
    finally:
        streams.after_store = None
        go.set()
    np.testing.assert_array_equal(stored(root), x)


def streaming_case(root: str, rows: int) -> Any:
    """A stream of ``rows`` frames of 256x256 uint16 in shard-rows of 16 frames (2 MiB)."""
    frame = np.arange(256 * 256, dtype="u2").reshape(256, 256)

    def op() -> None:
        kw = dict(chunks=(1, 128, 128), shards=(16, 256, 256), threads=1)
        with shardwise.stream(root, shape=(None, 256, 256), dtype="u2", **kw) as s:
            for t in range(rows):
                s.append(frame + t)

    return op


def test_memory_is_bounded_by_the_shard_row_buffers(tmp_path: Path) -> None:
    """512 frames (64 MiB) streamed through 2 MiB shard-rows: the peak is the buffers stated
    up front (5 shard-rows, 10 MiB) and the encoding (measured 17.2 MiB for 128 frames, 17.3
    MiB for 512), whatever the length."""
    root = str(tmp_path / "a.zarr")
    peak = peak_rss(streaming_case, root=root, rows=512).peak
    a = zarr.open_array(root, mode="r")
    assert a.shape == (512, 256, 256) and int(a[511, 0, 1]) == 512
    assert peak <= 32 * MiB, peak


# -- killed and resumed ----------------------------------------------------------------------------

TOTAL = 40


def stop_here() -> None:
    """Stop this process, the calling thread first: a SIGSTOP sent to the process
    (``os.kill``) is taken by its main thread, and a writer thread calling it runs on (its
    seal grows the shape) until the main thread has stopped the others; one sent to the
    thread stops it before the call returns."""
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def killed_stream(root: str, stop_at: int | None, said: Any) -> None:
    """A child streaming TOTAL frames, one at a time, telling ``said`` (frames, stored) after
    each; with ``stop_at`` it stops itself inside the seal that stores frames up to it, after
    the shards are put, before the shape grows."""
    from shardwise.write import streams as child

    lock = threading.Lock()  # the writer's thread says "held", the appender the rest

    def tell(*what: Any) -> None:
        with lock:
            said.send(what)

    if stop_at is not None:

        def hold(end: int) -> None:
            if end >= stop_at:  # the seal reaching it (rows waiting are written together)
                tell("held", end, s.stored)
                stop_here()

        child.after_store = hold
    x = frames(TOTAL, seed=7)
    s = shardwise.stream(root, dtype="u2", pending=1, **layout(0))  # paced by its seals
    for i in range(TOTAL):
        s.append(x[i])
        tell(s.frames, s.stored)
    if stop_at is not None:
        s.flush()  # the seals reach the hook (the appender may be done before them)
    tell("end", s.stored)
    stop_here()  # the killed stream never closes


def kill_after(root: str, messages: int, stop_at: int | None = None) -> tuple[int, int]:
    """Run :func:`killed_stream`, SIGKILL it once it said ``messages`` things (or reached
    ``stop_at``); the last (frames, stored) it said."""
    ctx = forkserver()
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=killed_stream, args=(root, stop_at, theirs))
    proc.start()
    last = (0, 0)
    said = 0
    while said < messages or stop_at is not None:  # with stop_at: until it is held
        assert ours.poll(300)
        got, said = ours.recv(), said + 1
        if got[0] == "held":
            last = got[1:]
            break
        last = got if got[0] != "end" else (TOTAL, got[1])
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    return last


def resume_and_finish(root: str, at_least: int) -> int:
    """Resume: the frames stored are reported (no fewer than the child saw stored), equal
    the numpy frames; the rest is appended; the array is every frame, verified clean."""
    x = frames(TOTAL, seed=7)
    report = shardwise.verify(root)
    assert not report.ok and any("resume=True" in p.message for p in report.problems)
    with shardwise.stream(root, dtype="u2", resume=True, **layout(0)) as s:
        kept = s.resumed_from
        assert at_least <= kept <= TOTAL
        np.testing.assert_array_equal(stored(root), x[:kept])
        s.extend(x[kept:])
    np.testing.assert_array_equal(stored(root), x)
    assert shardwise.verify(root).ok
    return kept


def test_a_stream_killed_after_storing_a_shard_row_resumes_at_the_last_grown_shape(
    tmp_path: Path,
) -> None:
    """Killed inside the seal reaching frame 12 (its shards stored, the shape not grown): the
    resume reports the frames stored before it, removes the shards no reader saw and writes
    them again."""
    root = str(tmp_path / "a.zarr")
    end, before = kill_after(root, 0, stop_at=3 * STEP)
    assert before < end and zarr.open_array(root, mode="r").shape[0] == before
    assert (Path(root) / "c" / str(end // STEP - 1) / "0" / "0").exists()  # the held seal's
    assert resume_and_finish(root, before) == before


@settings(max_examples=6)
@given(st.integers(1, TOTAL + 1))
def test_a_stream_killed_at_any_point_loses_nothing_stored(
    tmp_path_factory: Any, said: int
) -> None:
    root = str(tmp_path_factory.mktemp("killed") / "a.zarr")
    _, seen_stored = kill_after(root, said)
    kept = resume_and_finish(root, seen_stored)
    assert kept % STEP == 0  # whole shard-rows: no flush, so nothing partial was ever shown


def test_the_report_counts_every_shard_put_a_superseding_one_as_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flushed shard-row sealed is written over the flushed shard with its chunks kept in
    place (larger than the shard alone): ``bytes_stored`` is the bytes of every shard put, that
    one as stored."""
    x = frames(12)
    sizes: dict[str, list[int]] = {}
    put = ShardStore.put

    def counted(self: ShardStore, name: str, data: Any) -> None:
        if name.startswith("c/"):
            parts = [data] if isinstance(data, bytes | bytearray | memoryview) else list(data)
            sizes.setdefault(name, []).append(sum(memoryview(p).nbytes for p in parts))
        put(self, name, data)

    monkeypatch.setattr(ShardStore, "put", counted)
    root, fresh = tmp_path / "a.zarr", tmp_path / "fresh.zarr"
    with shardwise.stream(root, dtype="u2", **layout(0)) as s:
        s.append(x[:5])
        s.flush()  # shard-row 1 shown in part: frame 4 in a chunk of 2 frames
        s.append(x[5:12])  # sealed: written over the flushed shard, that chunk kept too
    monkeypatch.undo()
    with shardwise.stream(fresh, dtype="u2", **layout(0)) as again:
        again.append(x[:12])
    superseding = (root / "c" / "1" / "0" / "0").stat().st_size
    assert superseding > (fresh / "c" / "1" / "0" / "0").stat().st_size
    assert sizes["c/1/0/0"][-1] == superseding and len(sizes["c/1/0/0"]) == 2
    assert s.report is not None
    assert s.report.bytes_stored == sum(sum(v) for v in sizes.values())
