"""``shards="dask"`` and ``shards={"time": "dask"}``: one shard per dask chunk, no rechunk.

Uniform chunks (all equal, the last possibly shorter) keep a regular grid; uneven ones make a
rectilinear grid whose inner chunks divide every shard. Each write is read back by zarr-python
(its rectilinear flag on only for the read) and by shardwise, value for value; its graph holds
one write task per shard and no rechunk; refusals leave nothing behind.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

import shardwise
from shardwise.errors import InvalidValueError

MONTHS_2020 = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def grid_of(path: Path) -> tuple[Any, list[int]]:
    """(the chunk_grid, the inner chunk shape) of the array at ``path``."""
    doc = json.loads((path / "zarr.json").read_text())
    return doc["chunk_grid"], doc["codecs"][0]["configuration"]["chunk_shape"]


def zarr_reads(path: Path) -> np.ndarray:
    with zarr.config.set({"array.rectilinear_chunks": True}):
        return np.asarray(zarr.open_array(path, mode="r")[...])


def graph_counts(delayed: Any) -> tuple[int, int]:
    """(write tasks, rechunk tasks) of a write's graph."""
    keys = [k[0] if isinstance(k, tuple) else k for k in dict(delayed.__dask_graph__())]
    return (
        sum(str(k).startswith("shardwise-write") for k in keys),
        sum("rechunk" in str(k) for k in keys),
    )


def test_uneven_dask_chunks_become_a_rectilinear_grid(tmp_path: Path) -> None:
    x = np.random.default_rng(0).random((366, 6, 10), dtype="f4")
    src = da.from_array(x, chunks=(MONTHS_2020, (4, 2), 10))
    path = tmp_path / "a.zarr"
    job = shardwise.plan_write(src, path, shards="dask")
    assert job.strategy == "direct" and job.bytes_rechunked == 0 and job.tasks == 24
    shardwise.write_array(src, path, shards="dask")
    grid, inner = grid_of(path)
    assert grid["name"] == "rectilinear"
    assert grid["configuration"]["chunk_shapes"] == [
        [31, 29, 31, 30, 31, 30, [31, 2], 30, 31, 30, 31],
        4,  # (4, 2): uniform, a regular axis (its last shard overhangs: a step)
        [10],  # one shard tiling the axis: listed (icechunk reads only grids listed whole)
    ]
    assert inner[0] == 1 and 4 % inner[1] == 0 and 10 % inner[2] == 0
    np.testing.assert_array_equal(zarr_reads(path), x)
    np.testing.assert_array_equal(shardwise.read_array(path), x)
    assert shardwise.open_array(path).chunks == src.chunks
    assert shardwise.verify(path).ok
    assert zarr.config.get("array.rectilinear_chunks") is False


def test_dask_chunks_and_the_same_extents_given_store_one_grid(tmp_path: Path) -> None:
    """One shard per uneven dask chunk, and those chunks given as shard extents, list the same
    grid: the extents where given, a regular axis listed where its shards tile it."""
    x = np.arange(366 * 6 * 8, dtype="i2").reshape(366, 6, 8)
    src = da.from_array(x, chunks=(MONTHS_2020, 3, 8))
    shardwise.write_array(src, tmp_path / "dask.zarr", shards="dask", chunks=(1, 3, 8))
    shardwise.write_array(
        x, tmp_path / "ext.zarr", shards=[list(MONTHS_2020), 3, 8], chunks=(1, 3, 8)
    )
    assert grid_of(tmp_path / "dask.zarr") == grid_of(tmp_path / "ext.zarr")
    shapes = grid_of(tmp_path / "ext.zarr")[0]["configuration"]["chunk_shapes"]
    assert shapes[1:] == [[[3, 2]], [8]]  # regular axes tiled exactly: listed (run-length)
    np.testing.assert_array_equal(zarr_reads(tmp_path / "ext.zarr"), x)


def test_uniform_dask_chunks_keep_a_regular_grid(tmp_path: Path) -> None:
    x = np.arange(1000, dtype="i4").reshape(100, 10)
    path = tmp_path / "a.zarr"
    shardwise.write_array(da.from_array(x, chunks=(30, 10)), path, shards="dask")
    grid, inner = grid_of(path)
    assert grid == {"name": "regular", "configuration": {"chunk_shape": [30, 10]}}
    assert 30 % inner[0] == 0 and 10 % inner[1] == 0
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], x)


def test_inner_chunks_that_divide_no_shard_are_refused_with_sizes_that_would(
    tmp_path: Path,
) -> None:
    src = da.ones((60, 8), chunks=((24, 36), 8), dtype="f4")
    path = tmp_path / "a.zarr"
    with pytest.raises(InvalidValueError, match=r"do not divide.*\[1, 2, 3, 4, 6, 12\]"):
        shardwise.write_array(src, path, shards="dask", chunks=(8, 8))
    with pytest.raises(InvalidValueError, match=r"divide the dask chunks of 24.*\[1, 2, 3, 4, 6"):
        shardwise.write_array(da.ones((60, 8), chunks=(24, 8)), path, shards="dask", chunks=(5, 8))
    with pytest.raises(InvalidValueError, match="has no dask chunks"):
        shardwise.write_array(np.ones((60, 8)), path, shards="dask")
    assert not path.exists()


def monthly(n_days: int = 366) -> xr.Dataset:
    time = pd.date_range("2020-01-01", periods=n_days, freq="D")
    rng = np.random.default_rng(1)
    ds = xr.Dataset(
        {
            "tas": (("time", "y", "x"), rng.random((n_days, 4, 6), dtype="f4")),
            "pr": (("time",), rng.random(n_days)),
        },
        coords={"time": time, "y": np.arange(4), "x": np.arange(6)},
    )
    from xarray.groupers import TimeResampler

    return ds.chunk(time=TimeResampler("ME"))


def test_to_zarr_by_dimension_name_one_shard_per_month(tmp_path: Path) -> None:
    ds = monthly()
    path = tmp_path / "d.zarr"
    delayed = shardwise.to_zarr(ds, path, shards={"time": "dask"}, compute=False)
    assert graph_counts(delayed) == (24, 0)  # 12 shards of each variable, nothing rechunked
    delayed.compute()
    for name in ("tas", "pr"):
        grid, inner = grid_of(path / name)
        assert grid["name"] == "rectilinear" and inner[0] == 1
        assert grid["configuration"]["chunk_shapes"][0][:2] == [31, 29]
    consolidated = json.loads((path / "zarr.json").read_text())["consolidated_metadata"]
    assert consolidated["metadata"]["tas"]["chunk_grid"]["name"] == "rectilinear"
    back = xr.open_dataset(path, engine="shardwise", chunks={})
    assert back["tas"].chunks[0] == MONTHS_2020
    xr.testing.assert_identical(back.compute(), ds.compute())
    with zarr.config.set({"array.rectilinear_chunks": True}):
        xr.testing.assert_identical(xr.open_zarr(path).compute(), ds.compute())
    assert shardwise.verify(path).ok


def test_to_zarr_sizes_beside_dask_are_checked_as_without_it(tmp_path: Path) -> None:
    """A size beside ``"dask"`` takes what a size alone takes (a numpy integer too) and is
    refused in the same words, naming ``"dask"`` where it may stand."""
    ds = monthly(91)  # months of 31, 29 and 31 days: uneven
    shardwise.to_zarr(ds, tmp_path / "a.zarr", shards={"time": "dask", "x": np.int64(3)})
    shardwise.to_zarr(ds, tmp_path / "b.zarr", shards={"time": 31, "x": np.int64(3)})
    rectilinear = grid_of(tmp_path / "a.zarr" / "tas")[0]["configuration"]["chunk_shapes"]
    regular = grid_of(tmp_path / "b.zarr" / "tas")[0]["configuration"]["chunk_shape"]
    assert rectilinear[0] == [31, 29, 31] and rectilinear[2] == [[3, 2]] and regular[2] == 3
    for shards, words in [
        ({"time": "dask", "x": 0}, "a positive int, None or 'dask', got 0"),
        ({"time": 31, "x": 0}, "a positive int or None, got 0"),
        ({"time": 31, "x": True}, "a positive int or None, got True"),
        ({"time": "dask", "day": 3}, "which the data does not have"),
    ]:
        with pytest.raises(InvalidValueError, match=re.escape(words)):
            shardwise.to_zarr(ds, tmp_path / "c.zarr", shards=shards)
    assert not (tmp_path / "c.zarr").exists()


def test_to_zarr_datatree_and_every_dimension(tmp_path: Path) -> None:
    ds = monthly(91)
    other = xr.Dataset({"v": (("day",), np.arange(60.0))}).chunk(day=(10, 50))
    tree = xr.DataTree.from_dict({"/": ds, "/sub": other})
    path = tmp_path / "t.zarr"
    shardwise.to_zarr(tree, path, shards={"time": "dask", "day": "dask"})
    assert grid_of(path / "tas")[0]["configuration"]["chunk_shapes"][0] == [31, 29, 31]
    assert grid_of(path / "sub" / "v")[0]["configuration"]["chunk_shapes"] == [[10, 50]]
    back = xr.open_datatree(path, engine="shardwise", chunks={})
    assert back["sub/v"].chunks == ((10, 50),)
    xr.testing.assert_identical(back.compute(), tree.compute())
    every = tmp_path / "e.zarr"
    shardwise.to_zarr(other.chunk(day=(7, 7, 46)), every, shards="dask")
    assert grid_of(every / "v")[0]["configuration"]["chunk_shapes"] == [[[7, 2], 46]]


def test_convert_takes_dask_as_the_sources_chunks(tmp_path: Path) -> None:
    """A zarr array's dask chunks are its chunks: ``convert(..., shards="dask")`` (and the
    command line's ``--shards time=dask``) makes a shard of each, copied without a re-encode."""
    from shardwise.cli import main

    x = np.arange(6000, dtype="f4").reshape(100, 60)
    src = tmp_path / "v2.zarr"
    a = zarr.create_array(src, shape=x.shape, chunks=(10, 20), dtype="f4", zarr_format=2)
    a[...] = x
    shardwise.convert(src, tmp_path / "a.zarr", shards="dask")
    assert grid_of(tmp_path / "a.zarr") == (
        {"name": "regular", "configuration": {"chunk_shape": [10, 20]}},
        [10, 20],
    )
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "a.zarr"), x)
    y = xr.Dataset({"v": (("time", "x"), x)}).chunk(time=10, x=20)
    y.to_zarr(tmp_path / "x.zarr", zarr_format=3, consolidated=False)
    assert (
        main(
            ["convert", str(tmp_path / "x.zarr"), str(tmp_path / "b.zarr"), "--shards", "time=dask"]
        )
        == 0
    )
    grid, _ = grid_of(tmp_path / "b.zarr" / "v")
    assert grid["configuration"]["chunk_shape"][0] == 10
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "b.zarr", path="v"), x)


def test_icechunk_reads_what_shards_dask_writes_into_a_session(tmp_path: Path) -> None:
    import icechunk

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "r")))
    session = repo.writable_session("main")
    x = np.arange(90 * 6, dtype="f4").reshape(90, 6)
    src = da.from_array(x, chunks=((31, 28, 31), (3, 3)))
    shardwise.write_array(src, session.store, shards="dask", commit="one shard per month")
    read = repo.readonly_session(branch="main")
    with zarr.config.set({"array.rectilinear_chunks": True}):
        z = zarr.open_array(read.store, mode="r")
        assert z.metadata.chunk_grid.to_dict()["configuration"]["chunk_shapes"] == (
            [31, 28, 31],
            [[3, 2]],
        )
        np.testing.assert_array_equal(z[...], x)
    np.testing.assert_array_equal(shardwise.read_array(read.store), x)


def test_region_writes_into_a_rectilinear_array_merge_the_shards_they_cover_in_part(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.zarr"
    x = np.arange(90 * 6, dtype="f4").reshape(90, 6)
    shardwise.write_array(da.from_array(x, chunks=((31, 28, 31), 6)), path, shards="dask")
    inside = (slice(20, 50), slice(1, 4))  # across the first two shards, in part
    job = shardwise.plan_write(np.zeros((30, 3), "f4"), path, region=inside, mode="r+")
    assert (job.plan.ntasks, job.plan.npartial) == (2, 2)
    shardwise.write_array(np.full((30, 3), -1, "f4"), path, region=inside, mode="r+")
    x[inside] = -1
    month = (slice(31, 59), slice(None))  # the second shard, whole
    job = shardwise.plan_write(np.zeros((28, 6), "f4"), path, region=month, mode="r+")
    assert (job.plan.ntasks, job.plan.npartial) == (1, 0)
    shardwise.write_array(np.full((28, 6), 7, "f4"), path, region=month, mode="r+")
    x[month] = 7
    np.testing.assert_array_equal(zarr_reads(path), x)
    np.testing.assert_array_equal(shardwise.read_array(path), x)
    assert shardwise.verify(path).ok
