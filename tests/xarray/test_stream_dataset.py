"""``shardwise.stream_dataset``: a Dataset whose time coordinate grows, streamed.

Slices appended (one step, batches crossing shard-rows, ``flush``, ``extend`` of a dask-backed
Dataset, a variable whose time axis is not its first) read back by xarray's own engine and
shardwise's equal to ``xr.concat`` of them, the time coordinate CF-encoded with the units fixed
at open; readers mid-stream with the writer held between sealing and publishing, and between
growing the arrays and the consolidated metadata, see one length for every variable; a child
SIGKILLed at those points and after a drawn number of slices resumed after the frames stored,
verified clean; a second writer refused by the lease; slices that do not fit refused before any
byte, the store byte-identical."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import shardwise
from faultkit import forkserver
from shardwise.xarray import streams

STEP = 4  # frames of a shard-row
TOTAL = 14


def day(i: int, n: int = 1) -> xr.Dataset:
    """Slice ``i`` (``n`` steps of 6 hours): a data variable over (time, y, x), one over
    (z, time) (time not its first axis), and variables without time (written once)."""
    rng = np.random.default_rng(i)
    t = pd.date_range("2024-01-01", periods=n, freq="6h") + i * pd.Timedelta("6h")
    return xr.Dataset(
        {
            "t2m": (("time", "y", "x"), rng.random((n, 5, 3)).astype("f4")),
            "profile": (("z", "time"), rng.integers(0, 1000, (2, n)).astype("i2")),
            "land": (("y", "x"), np.arange(15, dtype="u1").reshape(5, 3)),
        },
        coords={"time": t, "y": np.arange(5.0), "x": np.arange(3.0), "z": [10, 20]},
        attrs={"title": "streamed"},
    )


def days(start: int, stop: int) -> xr.Dataset:
    """Slices ``start`` to ``stop`` concatenated along time, as xarray concatenates them."""
    if start == stop:
        return day(0).isel(time=slice(0, 0))
    return xr.concat([day(i) for i in range(start, stop)], "time", data_vars="minimal",
                     coords="minimal", compat="override", join="override")  # fmt: skip


def template() -> xr.Dataset:
    return days(0, 2)  # two steps: xarray chooses hours for the time units


def opened(root: Any, **kw: Any) -> shardwise.DatasetStream:
    return shardwise.stream_dataset(root, template(), shards=STEP, **kw)


def read(root: Any, engine: str = "zarr", **kw: Any) -> xr.Dataset:
    with xr.open_dataset(root, engine=engine, **kw) as ds:
        return ds.load()


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_slices_streamed_read_back_as_xr_concat_of_them(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    with opened(root) as s:
        assert s.resumed_from == 0 and s.stored == 0
        for i in range(5):
            s.append(day(i))
        s.append(days(5, 11))  # a batch crossing two shard-rows
        s.flush()  # the partial shard-row published too
        assert s.stored == s.frames == 11
        assert read(root).sizes["time"] == 11
        s.append(day(11).squeeze("time"))  # one step as a scalar coordinate
        s.extend(days(12, TOTAL).chunk({"time": 1}))  # dask-backed
    want = days(0, TOTAL)
    for engine in ("zarr", "shardwise"):
        got = read(root, engine=engine)
        xr.testing.assert_identical(got.drop_encoding(), want)
        assert got.time.encoding["units"] == "hours since 2024-01-01"
    assert s.report is not None and f"stream: {TOTAL} frames" in s.report.notes
    assert shardwise.verify(root).ok


def test_readers_mid_stream_see_every_variable_at_one_length(tmp_path: Path) -> None:
    """Held with every variable sealed to 8 but nothing grown, then with the arrays grown to
    12 but not the consolidated metadata: xarray's engine (consolidated or not) and shardwise's
    read one length for every variable, the slices stored before."""
    root = tmp_path / "a.zarr"
    reached, go = threading.Event(), threading.Event()
    hold = {"publish": 2 * STEP, "consolidate": 3 * STEP}
    seen: list[tuple[str, int]] = []

    def held(stage: str) -> Any:
        def hook(end: int) -> None:
            if end == hold[stage]:
                seen.append((stage, end))
                reached.set()
                assert go.wait(120)
                go.clear()

        return hook

    streams.before_publish = held("publish")
    streams.before_consolidate = held("consolidate")
    try:
        s = opened(root)
        s.extend(days(0, STEP))
        s.flush()  # the first shard-row published: the next seal publishes 8, not 0 to 8
        for stage, end, consolidated, unconsolidated in (
            ("publish", 2 * STEP, STEP, STEP),
            ("consolidate", 3 * STEP, 2 * STEP, 3 * STEP),
        ):
            s.extend(days(s.frames, end))
            assert reached.wait(120)
            reached.clear()
            assert seen[-1] == (stage, end) and s.stored == end - STEP
            for ds in (read(root), read(root, "shardwise"), read(root, consolidated=True)):
                xr.testing.assert_identical(ds.drop_encoding(), days(0, consolidated))
            got = read(root, consolidated=False)
            xr.testing.assert_identical(got.drop_encoding(), days(0, unconsolidated))
            go.set()
        s.close()
    finally:
        streams.before_publish = streams.before_consolidate = None
        go.set()
    xr.testing.assert_identical(read(root).drop_encoding(), days(0, 3 * STEP))


# -- killed and resumed ----------------------------------------------------------------------------


def stop_here() -> None:
    """Stop this process, the calling thread first (see tests/write/test_stream.py)."""
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def killed_stream(root: str, stage: str, at: int, said: Any) -> None:
    """A child appending the slices one at a time, telling ``said`` the frames published after
    each; at ``stage`` "publish" or "consolidate" it stops itself on the writer thread when
    the common length reaches ``at``, at "appended" once ``at`` slices are appended."""
    from shardwise.xarray import streams as child

    lock = threading.Lock()

    def tell(*what: Any) -> None:
        with lock:
            said.send(what)

    def hook(end: int) -> None:
        if end >= at:
            tell("held", end)
            stop_here()

    if stage == "publish":
        child.before_publish = hook
    elif stage == "consolidate":
        child.before_consolidate = hook
    s = opened(root, pending=1)
    for i in range(TOTAL):
        s.append(day(i))
        tell(s.frames, s.stored)
        if stage == "appended" and i + 1 == at:
            tell("held", s.stored)
            stop_here()
    s.flush()
    stop_here()


def kill_at(root: str, stage: str, at: int) -> int:
    """Run :func:`killed_stream` until it is held, SIGKILL it; the frames it had published."""
    ctx = forkserver()
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=killed_stream, args=(root, stage, at, theirs))
    proc.start()
    published = 0
    while True:
        assert ours.poll(300)
        got = ours.recv()
        if got[0] == "held":
            break
        published = got[1]
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    return published


@pytest.mark.parametrize(
    ("stage", "at", "kept"),
    [("publish", 2 * STEP, STEP), ("consolidate", 2 * STEP, 2 * STEP), ("appended", 7, None)],
)
def test_a_dataset_stream_killed_resumes_after_the_frames_stored(
    tmp_path: Path, stage: str, at: int, kept: int | None
) -> None:
    """Killed with every variable sealed but nothing grown (resumes from the length before),
    with the arrays grown but not the consolidated metadata (from the grown length), or after
    7 slices (wherever its writer threads were): a consolidated reader saw one length, the
    resume starts at or after it, and nothing published is lost."""
    root = str(tmp_path / "a.zarr")
    published = kill_at(root, stage, at)
    before = read(root)  # through the consolidated metadata: one length (a kill during a
    # growth may leave the arrays' own documents at two lengths, see xarray/streams.py)
    report = shardwise.verify(root)
    assert not report.ok and any("resume=True" in p.message for p in report.problems)
    with opened(root, resume=True) as s:
        got = s.resumed_from
        assert got == kept if kept is not None else got % STEP == 0 and got <= at
        assert got >= published
        xr.testing.assert_identical(read(root).drop_encoding(), days(0, got))
        seen = before.sizes["time"]
        assert published <= seen <= got
        xr.testing.assert_identical(before.drop_encoding(), days(0, seen))
        xr.testing.assert_identical(read(root, consolidated=False).drop_encoding(), days(0, got))
        s.extend(days(got, TOTAL))
    xr.testing.assert_identical(read(root).drop_encoding(), days(0, TOTAL))
    xr.testing.assert_identical(read(root, "shardwise").drop_encoding(), days(0, TOTAL))
    assert shardwise.verify(root).ok


# -- one writer, refusals --------------------------------------------------------------------------


def test_a_second_writer_is_refused_while_the_stream_is_open(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    s = opened(root)
    s.append(days(0, 6))
    s.flush()
    before = snapshot(root)
    for kw in ({"resume": True}, {"mode": "w"}):
        with pytest.raises(shardwise.LeaseHeldError):
            opened(root, **kw)
    with pytest.raises(shardwise.ArrayExistsError):
        opened(root)
    assert snapshot(root) == before
    s.append(days(6, 9))
    s.close()
    xr.testing.assert_identical(read(root).drop_encoding(), days(0, 9))


def wrong_dtype() -> xr.Dataset:
    return day(3).assign(profile=day(3).profile.astype("f8") + 0.5)


def wrong_shape() -> xr.Dataset:
    return day(3).isel(y=slice(0, 4))


def wrong_variables() -> xr.Dataset:
    return day(3).drop_vars("profile")


def extra_variable() -> xr.Dataset:
    return day(3).assign(rain=day(3).t2m * 2)


def finer_time() -> xr.Dataset:
    return day(3).assign_coords(time=day(3).time + pd.Timedelta("90s"))


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (wrong_dtype, "cannot take it without loss"),
        (wrong_shape, "has shape"),
        (wrong_variables, "missing ['profile']"),
        (extra_variable, "not in the store ['rain']"),
        (finer_time, "'time'"),
    ],
)
def test_slices_that_do_not_fit_are_refused_before_any_byte(
    tmp_path: Path, bad: Any, says: str
) -> None:
    root = tmp_path / "a.zarr"
    with opened(root) as s:
        s.append(days(0, 3))
        s.flush()
        before = snapshot(root)
        with pytest.raises(shardwise.PlanError) as e:
            s.append(bad())
        assert says in str(e.value) and "Nothing was appended" in str(e.value)
        s.flush()
        assert snapshot(root) == before and s.frames == 3
        s.append(day(3))
    xr.testing.assert_identical(read(root).drop_encoding(), days(0, 4))


def test_bad_keywords_are_refused_before_the_store_is_touched(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    for call, error in (
        (lambda: shardwise.stream_dataset(root, day(0).t2m), shardwise.InvalidTypeError),
        (
            lambda: shardwise.stream_dataset(root, day(0), append_dim="t"),
            shardwise.InvalidValueError,
        ),
        (
            lambda: shardwise.stream_dataset(root, day(0), shards={"time": 0}),
            shardwise.InvalidValueError,
        ),
        (lambda: shardwise.stream_dataset(root, day(0), chunks=4), shardwise.InvalidTypeError),
        (lambda: shardwise.stream_dataset(root, day(0), mode="a"), shardwise.InvalidValueError),
    ):
        with pytest.raises(error):
            call()
    assert not root.exists()
