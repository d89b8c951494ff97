"""``shardwise.to_zarr`` writes each sharded variable as ``write_array`` writes an array: under
its lease, with a write marker that verify reads, and resumable."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from zarr.storage import LocalStore

import shardwise
from faultkit import settle, snapshot, wait_until
from shardwise.durability.journal import read_markers
from shardwise.errors import LeaseHeldError
from shardwise.storage.store import ShardStore

NT, NX, SHARD_T = 40, 12, 4  # 10 shards per variable along time


def dataset(seed: int = 0, nt: int = NT) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    return xr.Dataset(
        {
            "temp": (("time", "x"), rng.normal(size=(nt, NX)).astype("float32")),
            "count": (("time",), np.arange(nt, dtype="int32") + seed),
        },
        coords={"time": pd.date_range("2000-01-01", periods=nt, freq="D"), "x": np.arange(NX)},
    ).chunk({"time": SHARD_T})


def markers(root: Path, var: str) -> list[str]:
    return sorted(
        m.status for m in read_markers(ShardStore(LocalStore(root), var)).values() if m is not None
    )


def test_a_finished_to_zarr_leaves_done_markers_and_records(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    ds = dataset()
    rep = shardwise.to_zarr(ds, path, shards={"time": SHARD_T})
    # temp, count and the time coordinate in 10 shards each, x in one
    assert rep.shards_written == 31 and rep.shards_skipped == 0
    for var in ("temp", "count"):
        assert markers(path, var) == ["done"]
        v = shardwise.verify(path, path=var)
        assert v.ok and v.shards_recorded == v.shards_stored == 10, v
        assert not (path / var / ".shardwise" / "lease").exists()
    xr.testing.assert_identical(xr.open_zarr(path).load(), ds.load())


class Gate:
    """A source block function that holds every block until ``release`` is set."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, block: np.ndarray) -> np.ndarray:
        if block.size == 0:  # dask's probe for the output type
            return block
        self.entered.set()
        assert self.release.wait(300), "the gate was never opened"
        return block


def test_a_second_writer_is_refused_while_to_zarr_writes(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    shardwise.to_zarr(dataset(1), path, shards={"time": SHARD_T})
    ds = dataset(2)
    gate = Gate()
    held = ds.copy()
    held["temp"] = ds["temp"].copy(data=ds["temp"].data.map_blocks(gate, dtype="float32"))
    errors: list[BaseException] = []

    def first() -> None:
        try:
            shardwise.to_zarr(held, path, mode="w", shards={"time": SHARD_T})
        except BaseException as e:  # reported by the test thread below
            errors.append(e)

    # one dask thread: while the gate holds it, the first writer changes nothing more
    with dask.config.set(scheduler="threads", num_workers=1):
        t = threading.Thread(target=first)
        t.start()
        try:
            assert gate.entered.wait(300)
            before = snapshot(path)
            with pytest.raises(LeaseHeldError):
                shardwise.to_zarr(dataset(3), path, mode="w", shards={"time": SHARD_T})
            with pytest.raises(LeaseHeldError):
                shardwise.write_array(np.zeros((NT, NX), "float32"), path, path="temp", mode="w")
            assert snapshot(path) == before  # the refused calls changed nothing
        finally:
            gate.release.set()
            t.join(300)
    assert not errors, errors
    xr.testing.assert_identical(xr.open_zarr(path).load(), ds.load())
    assert shardwise.verify(path).ok


def failing(ds: xr.Dataset, root: Path, want: int) -> xr.Dataset:
    """``ds`` whose ``temp`` block 5 (shard 5) raises once ``want`` other shards of ``temp`` are
    recorded: an interrupted write with a known amount of finished work."""

    def f(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        assert block_info is not None
        if block_info[0]["chunk-location"][0] == 5:
            settle(root / "temp", want)
            raise RuntimeError("interrupted")
        return block

    out = ds.copy()
    out["temp"] = ds["temp"].copy(data=ds["temp"].data.map_blocks(f, dtype="float32"))
    return out


@pytest.mark.parametrize("mode", ["w-", "w"])
def test_an_interrupted_to_zarr_is_reported_then_resumed(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "a.zarr"
    if mode == "w":  # replacing an older dataset of another length and other values
        shardwise.to_zarr(dataset(7, nt=24), path, shards={"time": 8})
    ds = dataset(4)
    with (
        dask.config.set(scheduler="threads", num_workers=2),
        pytest.raises(RuntimeError, match="interrupted"),
    ):
        shardwise.to_zarr(failing(ds, path, 3), path, mode=mode, shards={"time": SHARD_T})
    # the metadata comes last, so the interrupted array is not there yet; its marker is open
    assert markers(path, "temp") == ["open"]
    assert not shardwise.verify(path, path="temp").ok
    assert not (path / "temp" / ".shardwise" / "lease").exists()  # released on the error
    rep = shardwise.to_zarr(ds, path, mode=mode, shards={"time": SHARD_T}, resume=True)
    assert rep.shards_skipped >= 3, rep
    assert rep.shards_written + rep.shards_skipped == 31
    xr.testing.assert_identical(xr.open_zarr(path).load(), ds.load())
    assert markers(path, "temp") == ["done"]
    v = shardwise.verify(path)
    assert v.ok and not v.changes, v


def test_resume_after_an_interrupted_append(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    first, more = dataset(5).isel(time=slice(0, 20)), dataset(5).isel(time=slice(20, None))
    shardwise.to_zarr(first, path, shards={"time": SHARD_T})
    with (
        dask.config.set(scheduler="threads", num_workers=2),
        pytest.raises(RuntimeError, match="interrupted"),
    ):
        # append blocks are numbered from 0: block 5 is never there, so fail on block 0
        shardwise.to_zarr(failing_first(more), path, append_dim="time")
    assert xr.open_zarr(path).sizes["time"] == 20  # metadata last: the old length
    rep = shardwise.to_zarr(more, path, append_dim="time", resume=True)
    assert rep.shards_written + rep.shards_skipped == 16  # temp, count, time; x again
    xr.testing.assert_identical(xr.open_zarr(path).load(), dataset(5).load())
    assert shardwise.verify(path).ok


def failing_first(ds: xr.Dataset) -> xr.Dataset:
    def f(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        assert block_info is not None
        if block_info[0]["chunk-location"][0] == 0:
            raise RuntimeError("interrupted")
        return block

    out = ds.copy()
    out["temp"] = ds["temp"].copy(data=ds["temp"].data.map_blocks(f, dtype="float32"))
    return out


def test_region_writes_take_shared_leases_and_run_side_by_side(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    shardwise.to_zarr(dataset(1), path, shards={"time": SHARD_T})
    ds = dataset(6)
    gate = Gate()
    part = ds.isel(time=slice(0, 6)).drop_vars("x")
    held = part.copy()
    held["temp"] = part["temp"].copy(data=part["temp"].data.map_blocks(gate, dtype="float32"))
    errors: list[BaseException] = []

    def first() -> None:
        try:
            shardwise.to_zarr(held, path, region={"time": slice(0, 6)})
        except BaseException as e:  # reported by the test thread below
            errors.append(e)

    t = threading.Thread(target=first)
    t.start()
    try:
        assert gate.entered.wait(300)
        leases = path / "temp" / ".shardwise" / "leases"
        wait_until(lambda: leases.exists() and any(leases.iterdir()), "the shared lease")
        # a neighbouring region that shares shard 1 (rows 4-7) runs beside the held one
        shardwise.to_zarr(
            ds.isel(time=slice(6, 13)).drop_vars("x"), path, region={"time": slice(6, 13)}
        )
        with pytest.raises(LeaseHeldError):  # a replace of the whole store is refused
            shardwise.to_zarr(ds, path, mode="w", shards={"time": SHARD_T})
    finally:
        gate.release.set()
        t.join(300)
    assert not errors, errors
    got = xr.open_zarr(path).load()
    xr.testing.assert_identical(got.isel(time=slice(0, 13)), ds.load().isel(time=slice(0, 13)))
    xr.testing.assert_identical(
        got.isel(time=slice(13, None)), dataset(1).load().isel(time=slice(13, None))
    )
    assert shardwise.verify(path).ok


def test_resume_with_mode_w_dash_refuses_what_is_not_its_own(tmp_path: Path) -> None:
    """Resume runs mode "w-" as "w" only over the leftovers of an interrupted write of the same
    variables; anything else in the store keeps "w-"'s refusal and stays untouched."""
    path = tmp_path / "a.zarr"
    path.mkdir()
    (path / "notes.txt").write_text("precious")
    shardwise.write_array(np.full(4, 7, "int32"), path, path="other")
    before = snapshot(path)
    ds = dataset(1)
    with pytest.raises(FileExistsError):
        shardwise.to_zarr(ds, path, shards={"time": SHARD_T}, resume=True)
    assert snapshot(path) == before


def test_resume_with_mode_w_replaces_an_older_array_with_its_own_open_write(
    tmp_path: Path,
) -> None:
    """An older array whose own region write was interrupted is not this call's leftover:
    mode "w" with resume replaces it instead of skipping its shards."""
    path = tmp_path / "a.zarr"
    shardwise.to_zarr(dataset(1), path, shards={"time": SHARD_T})
    with (
        dask.config.set(scheduler="threads", num_workers=2),
        pytest.raises(RuntimeError, match="interrupted"),
    ):
        shardwise.to_zarr(
            failing_first(dataset(2)).drop_vars("x"), path, region={"time": slice(0, NT)}
        )
    assert markers(path, "temp") == ["open"]  # the region write of the older array
    ds = dataset(3)
    rep = shardwise.to_zarr(ds, path, mode="w", shards={"time": SHARD_T}, resume=True)
    assert rep.shards_skipped == 0
    xr.testing.assert_identical(xr.open_zarr(path).load(), ds.load())
    assert shardwise.verify(path).ok


def test_mode_w_refuses_to_delete_a_variable_another_job_writes(tmp_path: Path) -> None:
    from shardwise.durability.lease import Lease

    path = tmp_path / "a.zarr"
    shardwise.to_zarr(dataset(1), path, shards={"time": SHARD_T})
    other = Lease.acquire_shared(ShardStore(LocalStore(path), "count"))  # a region write of count
    before = snapshot(path)
    with pytest.raises(LeaseHeldError, match=r"count/\.shardwise/leases"):
        shardwise.to_zarr(dataset(2).drop_vars("count"), path, mode="w", shards={"time": 4})
    assert snapshot(path) == before
    other.release()
    shardwise.to_zarr(dataset(2).drop_vars("count"), path, mode="w", shards={"time": 4})
    assert not (path / "count").exists()
