"""Appends along a rectilinear axis: the extents in zarr.json grow by one shard per appended
chunk (``write/appended.py``), through ``write_array(append_dim=)`` and ``to_zarr(append_dim=)``.

Monthly chunks appended to a ``shards="dask"`` array (and Dataset) extend its extents month by
month, one write task per new shard and no rechunk, read back by zarr-python (its rectilinear
flag on for the read), xarray's engine and shardwise, equal to numpy; rows inside a last shard
declared longer than the data merge into it; chunks that cannot be shards are refused with the
store byte-identical. Two appenders at once, the second run whole between the first's
reservation commit and its markers (the rule's hook, no timing), both land once, a Dataset's
variables covering the first's rows by the second's commit as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

import shardwise
import shardwise.write.appends as appends
from faultkit import snapshot
from shardwise.errors import PlanError

MONTHS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def extents(path: Path) -> Any:
    doc = json.loads((path / "zarr.json").read_text())
    assert doc["chunk_grid"]["name"] == "rectilinear"
    return doc["chunk_grid"]["configuration"]["chunk_shapes"][0]


def zarr_reads(path: Path) -> np.ndarray:
    with zarr.config.set({"array.rectilinear_chunks": True}):
        return np.asarray(zarr.open_array(path, mode="r")[...])


def write_tasks(delayed: Any) -> tuple[int, int]:
    """(write tasks, rechunk tasks) of a write's graph."""
    keys = [k[0] if isinstance(k, tuple) else k for k in dict(delayed.__dask_graph__())]
    return (
        sum(str(k).startswith("shardwise-write") for k in keys),
        sum("rechunk" in str(k) for k in keys),
    )


def year(n: int = 366) -> np.ndarray:
    return np.arange(n * 3, dtype="f4").reshape(n, 3)


def months(x: np.ndarray, lo: int, hi: int) -> Any:
    first = sum(MONTHS[:lo])
    return da.from_array(x[first : first + sum(MONTHS[lo:hi])], chunks=(MONTHS[lo:hi], 3))


def assert_reads(path: Path, want: np.ndarray) -> None:
    np.testing.assert_array_equal(zarr_reads(path), want)
    np.testing.assert_array_equal(shardwise.read_array(path), want)
    assert shardwise.verify(path).ok


def test_monthly_appends_add_one_shard_per_month(tmp_path: Path) -> None:
    x, path = year(), tmp_path / "a.zarr"
    shardwise.write_array(months(x, 0, 3), path, shards="dask")
    job = shardwise.plan_write(months(x, 3, 6), path, append_dim=0)  # nothing written
    assert (job.tasks, job.bytes_rechunked) == (3, 0) and extents(path) == [31, 29, 31]
    delayed = shardwise.write_array(months(x, 3, 6), path, append_dim=0, compute=False)
    assert write_tasks(delayed) == (3, 0)  # one task per new shard, nothing rechunked
    delayed.compute()
    assert extents(path) == [31, 29, 31, 30, 31, 30]
    shardwise.write_array(months(x, 6, 12), path, append_dim=0)
    assert extents(path) == [31, 29, 31, 30, 31, 30, [31, 2], 30, 31, 30, 31]
    assert_reads(path, x)
    assert shardwise.open_array(path).chunks[0] == MONTHS


def test_rows_inside_a_last_shard_declared_longer_merge_into_it(tmp_path: Path) -> None:
    """Inner chunks of 10: 5 appended rows make a shard of 10 (declared longer than its rows);
    the next append's first 5 rows merge into it, its other rows become one new shard."""
    path = tmp_path / "a.zarr"
    x = np.arange(75.0)
    shardwise.write_array(da.from_array(x[:50], chunks=((20, 30),)), path, shards="dask")
    assert json.loads((path / "zarr.json").read_text())["codecs"][0]["configuration"][
        "chunk_shape"
    ] == [10]
    shardwise.write_array(x[50:55], path, append_dim=0)  # numpy: one chunk, one shard
    assert extents(path) == [20, 30, 10]
    assert_reads(path, x[:55])
    delayed = shardwise.write_array(
        da.from_array(x[55:], chunks=((5, 15),)), path, append_dim=0, compute=False
    )
    assert write_tasks(delayed)[0] == 2  # the merged shard and the new one
    delayed.compute()
    assert extents(path) == [20, 30, 10, 20]
    assert_reads(path, x)


def test_chunks_that_cannot_be_shards_are_refused_leaving_the_store_unchanged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.zarr"
    shardwise.write_array(da.from_array(np.arange(50.0), chunks=((20, 30),)), path, shards="dask")
    before = snapshot(path)
    with pytest.raises(PlanError, match=r"\[15, 15\].*multiple of 10"):
        shardwise.write_array(da.arange(30.0, chunks=15), path, append_dim=0)
    with pytest.raises(PlanError, match="every other dimension"):
        shardwise.write_array(np.ones((5, 2)), path, append_dim=0)
    assert snapshot(path) == before


def monthly(lo: int, hi: int) -> xr.Dataset:
    first = sum(MONTHS[:lo])
    n = sum(MONTHS[lo:hi])
    time = pd.date_range("2020-01-01", periods=366, freq="D")[first : first + n]
    t = np.arange(first, first + n, dtype="f4")
    ds = xr.Dataset(
        {
            "tas": (("time", "y"), t[:, None] * 10 + np.arange(4, dtype="f4")),
            "pr": (("time",), t.astype("f8") / 7),
        },
        coords={"time": time, "y": np.arange(4)},
    )
    return ds.chunk(time=MONTHS[lo:hi])


def test_to_zarr_appends_monthly_chunks_as_new_shards(tmp_path: Path) -> None:
    path = tmp_path / "d.zarr"
    shardwise.to_zarr(monthly(0, 4), path, shards={"time": "dask"})
    delayed = shardwise.to_zarr(monthly(4, 12), path, append_dim="time", compute=False)
    assert write_tasks(delayed) == (16, 0)  # 8 new shards of each of tas and pr
    delayed.compute()
    whole = xr.concat([monthly(0, 4), monthly(4, 12)], "time").compute()
    for name in ("tas", "pr"):
        assert extents(path / name) == [31, 29, 31, 30, 31, 30, [31, 2], 30, 31, 30, 31]
    meta = json.loads((path / "zarr.json").read_text())["consolidated_metadata"]["metadata"]
    assert (
        meta["tas"]["chunk_grid"]
        == json.loads((path / "tas" / "zarr.json").read_text())["chunk_grid"]
    )
    back = xr.open_dataset(path, engine="shardwise", chunks={})
    assert back["tas"].chunks[0] == MONTHS
    xr.testing.assert_identical(back.compute(), whole)
    with zarr.config.set({"array.rectilinear_chunks": True}):
        xr.testing.assert_identical(xr.open_zarr(path).compute(), whole)
    assert shardwise.verify(path).ok


@pytest.fixture
def hook() -> Iterator[list[Any]]:
    """Calls to run once, at the first append's stop between its reservation commit and its
    markers (``appends.after_claim``)."""
    pending: list[Any] = []

    def run(path: str) -> None:
        while pending:
            pending.pop(0)()

    appends.after_claim = run
    try:
        yield pending
    finally:
        appends.after_claim = None


def test_two_appenders_at_once_both_land(tmp_path: Path, hook: list[Any]) -> None:
    """A reserves months 4-6 and stops; B appends months 7-12 whole meanwhile; A finishes."""
    x, path = year(), tmp_path / "a.zarr"
    shardwise.write_array(months(x, 0, 3), path, shards="dask")
    hook.append(lambda: shardwise.write_array(months(x, 6, 12), path, append_dim=0))
    rep = shardwise.write_array(months(x, 3, 6), path, append_dim=0)
    assert "rows 91:182 reserved" in " ".join(rep.notes)
    assert extents(path) == [31, 29, 31, 30, 31, 30, [31, 2], 30, 31, 30, 31]
    assert_reads(path, np.concatenate([x[:91], x[91:182], x[182:]]))


def test_two_dataset_appenders_at_once_both_land(tmp_path: Path, hook: list[Any]) -> None:
    """A (months 4-6) reserves the time coordinate's rows and stops before growing tas and pr;
    B (months 7-12) grows them past A's rows, which its commit covers with shards of the last
    extent; A writes its rows into those shards. Every value lands once."""
    path = tmp_path / "d.zarr"
    shardwise.to_zarr(monthly(0, 3), path, shards={"time": "dask"})
    later = monthly(6, 12)
    hook.append(lambda: shardwise.to_zarr(later, path, append_dim="time"))
    shardwise.to_zarr(monthly(3, 6), path, append_dim="time")
    back = xr.open_dataset(path, engine="shardwise").compute()
    want = xr.concat([monthly(0, 3), monthly(3, 6), later], "time").compute()
    xr.testing.assert_identical(back, want)
    with zarr.config.set({"array.rectilinear_chunks": True}):
        xr.testing.assert_identical(xr.open_zarr(path).compute(), want)
    # A's rows (91:182) as B's commit covered them, in shards of March's 31; then B's months
    want_grid = [31, 29, [31, 3], 29, [31, 2], 30, 31, 30, 31]  # 31, 29, 31 | 31, 31, 29 | B's
    assert extents(path / "tas") == extents(path / "pr") == want_grid
    assert shardwise.verify(path).ok


def test_inspect_and_the_plan_give_the_smallest_and_largest_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardwise.cli import main

    x, path = year(), tmp_path / "a.zarr"
    plan = shardwise.plan_shards(
        (366, 3), "float32", target=(31, 3), chunks=(1, 3), rectilinear={0: MONTHS}
    )
    assert "shards   (31, 3) (largest; smallest (29, 3)): 12 of 348 B to 372 B" in str(plan)
    assert "(29 to 31 inner chunks, index up to 500 B)" in str(plan)
    assert "aligned to the shard edges write whole shards" in str(plan)
    shardwise.write_array(months(x, 0, 12), path, shards="dask")
    assert main(["inspect", str(path)]) == 0
    assert "= 12 shards of 29 to 31 inner chunks (1, 3)" in capsys.readouterr().out


def test_zarrs_reads_the_appended_rectilinear_array(tmp_path: Path) -> None:
    """zarrs (the Rust codec pipeline of zarr-python, strict: no fallback to zarr-python's
    own) reads a rectilinear array shardwise wrote and appended to, equal to numpy. zarrs is
    installed beside the venv by ``dev.sh`` (its entry point would load it into every process
    that imports zarr), so it runs in a child process with that directory on its path."""
    side = Path(sys.prefix) / "side" / "zarrs"
    assert (side / ".installed").exists(), f"no zarrs at {side}: run `bash dev.sh test` once"
    x, path = year(), tmp_path / "a.zarr"
    shardwise.write_array(months(x, 0, 6), path, shards="dask")
    shardwise.write_array(months(x, 6, 12), path, append_dim=0)
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import numpy as np, zarr
        rust = {{
            "codec_pipeline.path": "zarrs.ZarrsCodecPipeline",
            "codec_pipeline.strict": True,
            "array.rectilinear_chunks": True,
        }}
        x = np.load({str(tmp_path / "x.npy")!r})
        with zarr.config.set(rust):
            arr = zarr.open_array({str(path)!r}, mode="r")
            assert type(arr.async_array.codec_pipeline).__name__ == "ZarrsCodecPipeline"
            np.testing.assert_array_equal(arr[...], x)
            np.testing.assert_array_equal(arr[40:200, 1], x[40:200, 1])
        print("zarrs read it")
    """)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(side), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "zarrs read it", done.stderr


def test_an_append_along_a_listed_axis_of_a_grid_rectilinear_on_another(tmp_path: Path) -> None:
    """Uneven chunks along x make the grid rectilinear; time's uniform shards are listed (the
    form icechunk reads), and an append along time lists its new ones."""
    v = np.arange(40 * 6, dtype="f4").reshape(40, 6)
    ds = xr.Dataset({"v": (("time", "x"), v)}, coords={"time": np.arange(40)})
    path = tmp_path / "d.zarr"
    shardwise.to_zarr(ds.isel(time=slice(0, 20)).chunk(time=10, x=(2, 4)), path, shards="dask")
    more = ds.isel(time=slice(20, 40)).chunk(time=10, x=(2, 4))
    shardwise.to_zarr(more, path, append_dim="time")
    doc = json.loads((path / "v" / "zarr.json").read_text())
    assert doc["chunk_grid"]["configuration"]["chunk_shapes"] == [[[10, 4]], [2, 4]]
    xr.testing.assert_identical(xr.open_dataset(path, engine="shardwise").compute(), ds)
    np.testing.assert_array_equal(zarr_reads(path / "v"), v)
