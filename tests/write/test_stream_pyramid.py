"""``shardwise.stream_pyramid``: every level of an OME-Zarr 0.5 pyramid growing as frames
arrive, each reduced from the frames of the level below in memory.

Levels against numpy block reductions (mean, nearest, mode) along a time append axis (frames
reduced one by one), a space append axis (pairs of frames reduced together, first or last
axis), batches crossing shard boundaries; equal to a fresh ``write_pyramid`` of the final level
0 (values, layout, group attributes); the group validated by ome-zarr-models at several points
of a stream; readers (zarr-python, ``open_array``) mid-stream seeing every level consistent
with level 0; a flush storing every whole group of every level; a child SIGKILLed after a
number of frames it reports, resumed with nothing stored lost and the upper levels made again
from stored frames."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from ome_zarr_models.v05.image import Image

import shardwise
from faultkit import forkserver
from memkit import MiB, peak_rss

FRAME = (12, 10)
CHUNKS, SHARDS = (2, 4, 4), (4, 8, 8)  # 4 frames a shard-row at level 0


def frames(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, size=(n, *FRAME)).astype("u2")


def block(x: np.ndarray, f: tuple[int, ...], method: str) -> np.ndarray:
    """The numpy oracle of one reduction: each block of ``f`` (the last one partial) by the
    mean (rounded half to even), its first sample or its most frequent value (ties to the
    smallest)."""
    out = np.empty(tuple(-(-n // k) for n, k in zip(x.shape, f, strict=True)), x.dtype)
    for idx in np.ndindex(out.shape):
        b = x[tuple(slice(i * k, (i + 1) * k) for i, k in zip(idx, f, strict=True))].ravel()
        if method == "mean":
            out[idx] = np.rint(b.astype(np.float64).mean())
        elif method == "nearest":
            out[idx] = b[0]
        else:
            values, counts = np.unique(b, return_counts=True)
            out[idx] = values[np.argmax(counts)]
    return out


def oracle(x: np.ndarray, f: tuple[int, ...], n: int, method: str) -> list[np.ndarray]:
    out = [x]
    for _ in range(n - 1):
        out.append(block(out[-1], f, method))
    return out


def level(root: Any, k: int) -> np.ndarray:
    return np.asarray(zarr.open_array(root, path=str(k), mode="r")[...])


CASES = {  # dims, append axis, factors (per axis)
    "time first": (("t", "y", "x"), 0, (1, 2, 2)),
    "space first": (("z", "y", "x"), 0, (2, 2, 2)),
    "space last": (("z", "y", "x"), 2, (2, 2, 2)),
}


def layout(axis: int, n: int | None) -> dict[str, Any]:
    """Level 0's shape (``n`` frames along ``axis``), chunks and shards."""
    shape: list[int | None] = list(FRAME)
    chunks, shards = list(CHUNKS[1:]), list(SHARDS[1:])
    shape.insert(axis, n)
    chunks.insert(axis, CHUNKS[0])
    shards.insert(axis, SHARDS[0])
    return dict(shape=tuple(shape), chunks=tuple(chunks), shards=tuple(shards), append_axis=axis)


@pytest.mark.parametrize("method", ["mean", "nearest", "mode"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("known", [True, False])
def test_levels_are_block_reductions_equal_to_a_fresh_write_pyramid(
    case: str, method: str, known: bool
) -> None:
    dims, axis, f = CASES[case]
    n = 23  # odd: the last group of frames is partial (the ceil rule)
    x = frames(n)
    store = zarr.storage.MemoryStore()
    with shardwise.stream_pyramid(
        store, dtype="u2", levels=3, dims=dims, method=method, **layout(axis, n if known else None)
    ) as s:
        for i in range(0, n, 3):  # batches of 3: shard-rows of 4 end inside them
            s.append(np.moveaxis(x[i : i + 3], 0, axis))
    want = oracle(np.moveaxis(x, 0, axis), f, 3, method)
    for k in range(3):
        np.testing.assert_array_equal(level(store, k), want[k], err_msg=f"level {k}")
    ref = zarr.storage.MemoryStore()
    shardwise.write_pyramid(
        want[0], ref, levels=3, dims=dims, method=method,
        chunks=layout(axis, 0)["chunks"], shards=layout(axis, 0)["shards"],
    )  # fmt: skip
    for k in range(3):
        a = zarr.open_array(store, path=str(k), mode="r")
        b = zarr.open_array(ref, path=str(k), mode="r")
        assert (a.shape, a.chunks, a.shards) == (b.shape, b.chunks, b.shards)
        np.testing.assert_array_equal(a[...], b[...])
    got = zarr.open_group(store, mode="r").attrs.asdict()
    assert got == zarr.open_group(ref, mode="r").attrs.asdict()
    Image.from_zarr(zarr.open_group(store, mode="r"))


def test_the_group_validates_and_readers_see_consistent_levels_mid_stream(
    tmp_path: Path,
) -> None:
    """After every batch (whatever its seals stored yet), every other one flushed: the group is
    an OME-Zarr 0.5 image, and each level read by zarr-python and ``open_array`` up to its stored
    length is the reduction of level 0's first frames."""
    root = str(tmp_path / "img.zarr")
    n, f = 40, (2, 2, 2)
    x = frames(n, seed=3)
    want = oracle(x, f, 3, "mean")
    seen = []
    with shardwise.stream_pyramid(root, shape=(None, *FRAME), dtype="u2", levels=3,
                                  chunks=CHUNKS, shards=SHARDS, pending=1) as s:  # fmt: skip
        for i in range(0, n, 5):
            s.append(x[i : i + 5])
            if i % 10 == 5:
                s.flush()
                assert s.stored[0] == i + 5
            lengths = []
            for k in range(3):
                a = zarr.open_array(root, path=str(k), mode="r")
                got = a[...]
                lengths.append(got.shape[0])
                np.testing.assert_array_equal(got, want[k][: got.shape[0]])
                mine = shardwise.open_array(root, path=str(k))[...]  # read later: maybe more
                assert mine.shape[0] >= got.shape[0]
                np.testing.assert_array_equal(mine, want[k][: mine.shape[0]])
            # a level never holds frames of a group its source has not stored
            assert all(lengths[k + 1] * 2 <= lengths[k] for k in range(2)), lengths
            seen.append(tuple(lengths))
            Image.from_zarr(zarr.open_group(root, mode="r"))
    assert seen[-1][2] > 0  # the top level grew mid-stream
    for k in range(3):
        np.testing.assert_array_equal(level(root, k), want[k])
    assert s.memory > 0 and "3 levels" in repr(s)


@pytest.mark.parametrize("n", [4, 6, 12])
def test_a_flush_stores_every_whole_group_of_every_level(tmp_path: Path, n: int) -> None:
    """``flush`` reduces into each level every whole group the level below holds, those its
    gathering kept back too: level 1's frames reduced from level 0's group go on into level 2."""
    root = str(tmp_path / "img.zarr")
    x = frames(n, seed=5)
    want = oracle(x, (2, 2, 2), 3, "mean")
    with shardwise.stream_pyramid(root, shape=(None, *FRAME), dtype="u2", levels=3,
                                  chunks=CHUNKS, shards=SHARDS) as s:  # fmt: skip
        s.append(x)
        s.flush()
        assert s.stored == (n, n // 2, n // 4), s.stored
        for k in range(3):
            np.testing.assert_array_equal(level(root, k), want[k][: s.stored[k]])


# -- killed and resumed ----------------------------------------------------------------------------

TOTAL = 37
KW: dict[str, Any] = dict(shape=(None, *FRAME), dtype="u2", levels=3, chunks=CHUNKS, shards=SHARDS)


def stop_here() -> None:
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def killed_pyramid(root: str, appends: int, said: Any) -> None:
    """A child streaming ``appends`` batches of 3 frames, telling the stored frames of each
    level after each, then stopping itself (never closing)."""
    x = frames(TOTAL, seed=5)
    s = shardwise.stream_pyramid(root, pending=1, **KW)
    for i in range(appends):
        s.append(x[3 * i : 3 * i + 3])
        said.send(s.stored)
    stop_here()


@pytest.mark.parametrize("appends", [2, 5, 9])
def test_a_pyramid_stream_killed_resumes_with_every_level_consistent(
    tmp_path: Path, appends: int
) -> None:
    root = str(tmp_path / "img.zarr")
    ctx = forkserver()
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=killed_pyramid, args=(root, appends, theirs))
    proc.start()
    last: tuple[int, ...] = ()
    for _ in range(appends):
        assert ours.poll(300)
        last = ours.recv()
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    x = frames(TOTAL, seed=5)
    want = oracle(x, (2, 2, 2), 3, "mean")
    with shardwise.stream_pyramid(root, resume=True, **KW) as s:
        kept = s.resumed_from
        assert last[0] <= kept <= 3 * appends
        assert all(a >= b for a, b in zip(s.stored, last, strict=True))  # nothing stored lost
        for k in range(3):  # every level consistent with level 0 as resumed
            got = level(root, k)
            np.testing.assert_array_equal(got, want[k][: got.shape[0]])
        Image.from_zarr(zarr.open_group(root, mode="r"))
        s.extend(x[kept:])
    ref = zarr.storage.MemoryStore()
    shardwise.write_pyramid(x, ref, levels=3, chunks=CHUNKS, shards=SHARDS)
    for k in range(3):
        np.testing.assert_array_equal(level(root, k), level(ref, k))
    assert all(shardwise.verify(f"{root}/{k}").ok for k in range(3))


def held_in_top_seal(root: str, said: Any) -> None:
    """A child streaming every frame then flushing, stopped inside the first seal of the top
    level (its shards put, its shape not grown), after telling what each level stored."""
    from shardwise.write import streams as child

    x = frames(TOTAL, seed=5)
    s = shardwise.stream_pyramid(root, pending=1, **KW)

    def hold(end: int) -> None:
        if threading.current_thread() is s.levels[2]._writer._thread:
            said.send(("held", end, s.stored))
            stop_here()

    child.after_store = hold
    s.extend(x)
    s.flush()
    said.send(("end", 0, s.stored))


def test_a_pyramid_stream_killed_inside_a_seal_of_its_top_level_resumes(tmp_path: Path) -> None:
    """The top level's shards stored, its shape not grown: the resume removes them, reduces
    the frames again from level 1's stored frames and ends equal to ``write_pyramid``."""
    root = str(tmp_path / "img.zarr")
    ctx = forkserver()
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=held_in_top_seal, args=(root, theirs))
    proc.start()
    assert ours.poll(300)
    what, end, seen = ours.recv()
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert what == "held" and end > seen[2] == 0
    assert zarr.open_array(root, path="2", mode="r").shape[0] == 0
    x = frames(TOTAL, seed=5)
    want = oracle(x, (2, 2, 2), 3, "mean")
    with shardwise.stream_pyramid(root, resume=True, **KW) as s:
        assert all(a >= b for a, b in zip(s.stored, seen, strict=True))
        s.extend(x[s.resumed_from :])
    for k in range(3):
        np.testing.assert_array_equal(level(root, k), want[k])
    assert all(shardwise.verify(f"{root}/{k}").ok for k in range(3))


def pyramid_case(root: str, rows: int) -> Any:
    """A 3-level pyramid stream of ``rows`` frames of 256x256 uint16 (time append axis),
    shard-rows of 16 frames (2 MiB at level 0)."""
    frame = np.arange(256 * 256, dtype="u2").reshape(256, 256)

    def op() -> None:
        kw = dict(chunks=(1, 128, 128), shards=(16, 256, 256), threads=1, pending=2)
        with shardwise.stream_pyramid(root, shape=(None, 256, 256), dtype="u2", levels=3,
                                      dims=("t", "y", "x"), **kw) as s:  # fmt: skip
            for t in range(rows):
                s.append(frame + t)

    return op


def test_memory_is_bounded_by_the_levels_buffers(tmp_path: Path) -> None:
    """512 frames (64 MiB at level 0, 85 MiB in all levels) through a 3-level pyramid: the
    peak is the buffers stated up front (``memory``: 10.9 MiB, three levels of 3 shard-rows,
    the reduced frames waiting and the frames gathered) and the encoding and reductions
    (measured 32-38 MiB in all; 29-33 MiB for 128 frames, 36 MiB for 2048), whatever the
    length."""
    root = str(tmp_path / "img.zarr")
    peak = peak_rss(pyramid_case, root=root, rows=512).peak
    with shardwise.stream_pyramid(
        str(tmp_path / "other.zarr"), shape=(None, 256, 256), dtype="u2", levels=3,
        dims=("t", "y", "x"), chunks=(1, 128, 128), shards=(16, 256, 256), pending=2,
    ) as s:  # fmt: skip
        stated = s.memory
    assert stated < 16 * MiB, stated
    assert zarr.open_array(root, path="2", mode="r").shape == (512, 64, 64)
    assert peak <= 48 * MiB, (peak, stated)


def upto_axis(axis: int, n: int) -> tuple[slice, ...]:
    return tuple(slice(0, n) if i == axis else slice(None) for i in range(3))


@pytest.mark.parametrize("parts", [(5, 6), (7, 1, 3), (1, 1, 1, 8)])
@pytest.mark.parametrize("case", list(CASES))
def test_a_closed_stream_ending_in_a_partial_group_goes_on_equal_to_a_fresh_write_pyramid(
    tmp_path: Path, case: str, parts: tuple[int, ...]
) -> None:
    """Closed after each part (its last, partial groups reduced by the ceil rule), resumed and
    continued: readers see every level as closed, the frames reduced from a partial group are
    reduced again as it fills, and after each close every level equals a fresh
    ``write_pyramid`` of the frames so far, ``verify`` clean."""
    dims, axis, f = CASES[case]
    x = np.moveaxis(frames(sum(parts), seed=9), 0, axis)

    def upto(a: int, b: int) -> np.ndarray:
        return x[tuple(slice(a, b) if i == axis else slice(None) for i in range(3))]

    root = str(tmp_path / "img.zarr")
    kw = dict(layout(axis, None), dtype="u2", levels=3, dims=dims)
    done = 0
    for i, m in enumerate(parts):
        with shardwise.stream_pyramid(root, resume=i > 0, **kw) as s:
            assert s.resumed_from == done
            # the frames of partial groups taken back: each level the reduction of whole
            # groups of the level below, as readers see it
            lengths = [level(root, k).shape[axis] for k in range(3)]
            assert all(lengths[k + 1] * f[axis] <= lengths[k] for k in range(2)), lengths
            assert lengths == [s.stored[k] for k in range(3)]
            want = oracle(upto(0, done), f, 3, "mean")
            for k in range(3):
                got = level(root, k)
                np.testing.assert_array_equal(got, want[k][upto_axis(axis, got.shape[axis])])
            s.append(upto(done, done + m))
            s.flush()  # every level consistent with level 0 mid-stream
            want = oracle(upto(0, done + m), f, 3, "mean")
            for k in range(3):
                got = level(root, k)
                np.testing.assert_array_equal(got, want[k][upto_axis(axis, got.shape[axis])])
        done += m
        ref = zarr.storage.MemoryStore()
        shardwise.write_pyramid(upto(0, done), ref, levels=3, dims=dims, chunks=kw["chunks"],
                                shards=kw["shards"])  # fmt: skip
        for k in range(3):
            np.testing.assert_array_equal(level(root, k), level(ref, k), err_msg=f"level {k}")
            assert shardwise.verify(f"{root}/{k}").ok
    Image.from_zarr(zarr.open_group(root, mode="r"))


def test_a_stream_that_reached_its_known_length_resumes_to_nothing_more(tmp_path: Path) -> None:
    done = dict(KW, shape=(5, *FRAME))
    other = str(tmp_path / "done.zarr")
    with shardwise.stream_pyramid(other, **done) as s:
        s.append(frames(3))
        with pytest.raises(shardwise.InvalidValueError, match="past the stream's length"):
            s.append(frames(9))  # two shard-rows of level 0: refused whole
        assert s.frames == 3
        s.append(frames(5)[3:])
    with shardwise.stream_pyramid(other, resume=True, **done) as s:
        assert s.stored == (5, 3, 2)
    np.testing.assert_array_equal(level(other, 2), oracle(frames(5), (2, 2, 2), 3, "mean")[2])


@pytest.mark.parametrize(
    ("bad", "error", "words"),
    [
        (dict(levels=0), shardwise.InvalidValueError, "levels"),
        (dict(levels="many"), shardwise.InvalidValueError, "levels"),
        (dict(factors={"t": 2}), shardwise.InvalidValueError, "factors"),
        (dict(method="median"), shardwise.InvalidValueError, "method"),
        (dict(dims=("x", "y", "z")), shardwise.InvalidValueError, "dims"),
        (dict(scale={"y": -1.0}), shardwise.InvalidValueError, "scale"),
        (dict(append_axis=3), shardwise.InvalidValueError, "append_axis"),
        (dict(resume=True, mode="w"), shardwise.InvalidValueError, "resume"),
    ],
)
def test_bad_keywords_are_refused_before_the_store_is_touched(
    tmp_path: Path, bad: dict[str, Any], error: type, words: str
) -> None:
    root = tmp_path / "img.zarr"
    kw = {**KW, "dims": ("t", "y", "x"), **bad}
    with pytest.raises(error, match=words):
        shardwise.stream_pyramid(str(root), **kw)
    assert not root.exists()
