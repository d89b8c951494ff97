"""``convert`` of rectilinear sources: ``shards="dask"`` keeps the source's shard grid (one
shard per source shard), ``shards=N`` regularizes it, ``shards=None`` writes plain chunks; a
zarr-python array of rectilinear chunks (no sharding) converts too. Every result is read back
by zarr-python (its rectilinear flag on for the read) and shardwise, equal to the source.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
import zarr

import shardwise
from shardwise.cli import main

MONTHS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
X = np.arange(366 * 4, dtype="f4").reshape(366, 4)


def grid(path: Path) -> Any:
    return json.loads((path / "zarr.json").read_text())["chunk_grid"]


def zarr_reads(path: Path) -> np.ndarray:
    with zarr.config.set({"array.rectilinear_chunks": True}):
        return np.asarray(zarr.open_array(path, mode="r")[...])


def rectilinear(path: Path) -> Path:
    shardwise.write_array(da.from_array(X, chunks=(MONTHS, 4)), path, shards="dask")
    return path


def test_shards_dask_keeps_a_rectilinear_grid(tmp_path: Path) -> None:
    src = rectilinear(tmp_path / "r.zarr")
    rep = shardwise.convert(src, tmp_path / "k.zarr", shards="dask")
    assert rep.arrays[0].method == "reencode" and "rectilinear" in rep.arrays[0].reason
    assert grid(tmp_path / "k.zarr") == grid(src)
    np.testing.assert_array_equal(zarr_reads(tmp_path / "k.zarr"), X)
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "k.zarr"), X)
    assert shardwise.verify(tmp_path / "k.zarr").ok


def test_shards_n_regularizes_and_none_unshards(tmp_path: Path) -> None:
    src = rectilinear(tmp_path / "r.zarr")
    shardwise.convert(src, tmp_path / "g.zarr", shards=(61, 4))
    assert grid(tmp_path / "g.zarr") == {
        "name": "regular",
        "configuration": {"chunk_shape": [61, 4]},
    }
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "g.zarr", mode="r")[...], X)
    shardwise.convert(src, tmp_path / "p.zarr", shards=None)
    assert grid(tmp_path / "p.zarr")["name"] == "regular"
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "p.zarr", mode="r")[...], X)
    assert main(["convert", str(src), str(tmp_path / "c.zarr"), "--shards", "dask"]) == 0
    assert grid(tmp_path / "c.zarr") == grid(src)


def test_a_dataset_by_dimension_name_and_zarr_pythons_rectilinear_chunks(tmp_path: Path) -> None:
    ds = xr.Dataset({"t": (("time", "y"), X)}).chunk(time=MONTHS)
    shardwise.to_zarr(ds, tmp_path / "d.zarr", shards={"time": "dask"})
    shardwise.convert(tmp_path / "d.zarr", tmp_path / "e.zarr", shards={"time": "dask"})
    assert grid(tmp_path / "e.zarr" / "t") == grid(tmp_path / "d.zarr" / "t")
    back = xr.open_dataset(tmp_path / "e.zarr", engine="shardwise", chunks={})
    assert back["t"].chunks[0] == MONTHS
    xr.testing.assert_identical(back.compute(), ds.compute())
    plain = tmp_path / "z.zarr"  # zarr-python's rectilinear chunks, no sharding
    with zarr.config.set({"array.rectilinear_chunks": True}):
        zarr.create_array(plain, data=X, chunks=[list(MONTHS), [4]])
    shardwise.convert(plain, tmp_path / "s.zarr", shards=(61, 4))
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "s.zarr"), X)
