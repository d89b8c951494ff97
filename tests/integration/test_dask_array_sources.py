"""Arrays of the expression-based ``dask_array`` package (pip name ``dask-array``) as sources:
``write_array``, ``to_zarr`` of a Dataset whose variables hold them (xarray's chunk manager for
them) and ``write_pyramid`` take them as they take ``dask.array`` arrays.

Oracles: the values read back by zarr-python and xarray against numpy, the tasks dask ran (one
``shardwise-write`` task per shard, no task of a rechunk) and ``plan_write``'s account (no byte
rechunked).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import dask.array as da
import dask_array as dxa
import numpy as np
import xarray as xr
import zarr
from dask.callbacks import Callback

import shardwise
from oracles import assert_bit_equal

DATA = np.arange(64 * 40 * 6, dtype="float32").reshape(64, 40, 6)


class Tasks(Callback):  # type: ignore[misc]
    """The task keys a local scheduler ran."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[Hashable] = []

    def _pretask(self, key: Any, dsk: Any, state: Any) -> None:
        self.keys.append(key)

    def blocks(self, layer: str) -> int:
        """Distinct blocks of the tasks whose name holds ``layer`` (fused tasks keep names)."""
        return len({k[1:] for k in self.keys if isinstance(k, tuple) and layer in str(k[0])})

    def rechunked(self) -> bool:
        return any("rechunk" in str(k[0] if isinstance(k, tuple) else k) for k in self.keys)


def _source() -> Any:
    x = dxa.from_array(DATA, chunks=(16, 20, 6))
    assert type(x).__module__.startswith("dask_array")  # the package's own array, not dask's
    return x


def test_write_array_takes_a_dask_array_array_one_task_per_shard(tmp_path: Path) -> None:
    source = _source()
    layout: dict[str, Any] = dict(shards=(16, 20, 6), chunks=(8, 10, 6))
    plan = shardwise.plan_write(source, tmp_path / "a.zarr", **layout)
    # its dask graph is the source: the dask chunks are the shards, nothing rechunked
    assert plan.bytes_rechunked == 0 and plan.reason == "direct: dask chunks are the shard pieces"
    with Tasks() as seen:
        report = shardwise.write_array(source, tmp_path / "a.zarr", **layout)
    assert report.shards_written == 8
    assert seen.blocks("shardwise-write") == 8 and not seen.rechunked()
    assert_bit_equal(zarr.open_array(tmp_path / "a.zarr", mode="r")[...], DATA)
    assert_bit_equal(shardwise.read_array(tmp_path / "a.zarr"), DATA)


def test_to_zarr_of_a_dataset_of_dask_array_variables(tmp_path: Path) -> None:
    ds = xr.Dataset({"v": (("t", "y", "b"), _source())}, coords={"t": np.arange(64)})
    assert type(ds.v.data).__module__.startswith("dask_array")  # xarray kept it lazy
    with Tasks() as seen:
        shardwise.to_zarr(ds, tmp_path / "d.zarr", shards={"t": 16, "y": 20})
    # the variable's dask chunks are its shards: one task per shard, nothing rechunked
    assert seen.blocks("shardwise-write") == 8 and not seen.rechunked()
    meta = zarr.open_array(tmp_path / "d.zarr", path="v", mode="r")
    assert meta.shards == (16, 20, 6)
    back = xr.open_zarr(tmp_path / "d.zarr")
    assert_bit_equal(back.v.values, DATA)
    assert_bit_equal(back.t.values, np.arange(64))


def test_write_pyramid_of_a_dask_array_array(tmp_path: Path) -> None:
    source = _source()[:, :, 0]
    with Tasks() as seen:
        shardwise.write_pyramid(source, tmp_path / "p.zarr", levels=2, dims=("y", "x"))
    with Tasks() as classic:
        shardwise.write_pyramid(
            da.from_array(DATA, chunks=(16, 20, 6))[:, :, 0], tmp_path / "c.zarr", levels=2,
            dims=("y", "x"),
        )  # fmt: skip
    # the same graph as from a dask.array array: its blocks, not reads of a numpy-like source
    assert seen.blocks("shardwise-write") == classic.blocks("shardwise-write") > 0
    assert not any("shardwise-source" in str(k) for k in seen.keys)
    level0 = zarr.open_array(tmp_path / "p.zarr", path="0", mode="r")[...]
    level1 = zarr.open_array(tmp_path / "p.zarr", path="1", mode="r")[...]
    assert_bit_equal(level0, DATA[:, :, 0])
    assert level1.shape == (32, 20)
    want = DATA[:, :, 0].reshape(32, 2, 20, 2).mean(axis=(1, 3))
    np.testing.assert_allclose(level1, want, rtol=1e-6)


def test_to_zarr_with_dask_array_as_xarray_chunk_manager(tmp_path: Path) -> None:
    """``dask_array.xarray.register()`` makes ``Dataset.chunk`` give dask_array arrays (for
    the whole process: a process of its own here)."""
    script = textwrap.dedent(
        f"""
        import numpy as np, xarray as xr, dask_array.xarray, shardwise
        from dask.callbacks import Callback

        class Tasks(Callback):
            def __init__(self):
                super().__init__()
                self.keys = []

            def _pretask(self, key, dsk, state):
                self.keys.append(key)

        dask_array.xarray.register()
        data = np.arange(64 * 40, dtype="float32").reshape(64, 40)
        ds = xr.Dataset({{"v": (("t", "y"), data)}}).chunk(t=16)
        assert type(ds.v.data).__module__.startswith("dask_array"), type(ds.v.data)
        with Tasks() as seen:
            shardwise.to_zarr(ds, {str(tmp_path / "r.zarr")!r}, shards={{"t": 16}})
        writes = {{k[1:] for k in seen.keys if isinstance(k, tuple) and "shardwise-write" in k[0]}}
        rechunks = [k for k in seen.keys if "rechunk" in str(k)]
        back = xr.open_zarr({str(tmp_path / "r.zarr")!r})
        np.testing.assert_array_equal(back.v.values, data)
        print(len(writes), len(rechunks), back.v.encoding["shards"])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["4", "0", "(16,", "40)"]  # four write tasks, no rechunk, shards (16, 40)
