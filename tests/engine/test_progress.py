"""Progress bars count shards (and bytes), on the local schedulers and on a distributed client;
off by default in library calls, on by default in the CLI commands that do long work."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import shardwise
from shardwise.cli import main

KW: dict[str, Any] = dict(chunks=(8, 8), shards=(16, 16), fill_value=0)
NSHARDS = 4 * 3


def data() -> np.ndarray:
    return np.random.default_rng(8).integers(1, 100, (64, 48)).astype("int32")


def source() -> da.Array:
    # more dask tasks than shards (blocks that cut shards): the bar must count shards, not tasks
    return da.from_array(data(), chunks=(10, 7))


def final_count(err: str) -> tuple[int, int]:
    """The last ``n/total`` a tqdm bar printed over shards."""
    found = re.findall(r"(\d+)/(\d+) \[[^\]]*shard", err)
    assert found, f"no shard progress bar in {err!r}"
    n, total = found[-1]
    return int(n), int(total)


@pytest.mark.parametrize("scheduler", ["threads", "synchronous"])
def test_write_progress_counts_shards_on_local_schedulers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scheduler: str
) -> None:
    assert len(source().__dask_graph__()) > 2 * NSHARDS
    with dask.config.set(scheduler=scheduler):
        report = shardwise.write_array(source(), tmp_path / "a.zarr", progress=True, **KW)
    err = capsys.readouterr().err
    assert report.shards_written == NSHARDS
    assert final_count(err) == (NSHARDS, NSHARDS)
    assert f"{report.bytes_stored / 1e6:.1f} MB stored" in err
    assert "shardwise: 100%|" in err  # the bar's label (mutation lane: Pipeline.run_62)


def test_write_progress_counts_shards_on_a_distributed_client(
    client: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with dask.config.set(scheduler=client):
        report = shardwise.write_array(source(), str(tmp_path / "a.zarr"), progress=True, **KW)
    err = capsys.readouterr().err
    assert report.shards_written == NSHARDS
    assert final_count(err) == (NSHARDS, NSHARDS)
    np.testing.assert_array_equal(shardwise.open_array(tmp_path / "a.zarr").compute(), data())


def test_to_zarr_progress_counts_the_shards_of_every_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = xr.Dataset(
        {"a": (("y", "x"), data()), "b": (("y", "x"), data() * 2)},
        coords={"y": np.arange(64), "x": np.arange(48)},
    ).chunk({"y": 10, "x": 7})
    with dask.config.set(scheduler="threads"):
        report = shardwise.to_zarr(
            ds, tmp_path / "d.zarr", shards={"y": 16, "x": 16}, progress=True
        )
    err = capsys.readouterr().err
    n, total = final_count(err)
    assert n == total == report.shards_written + report.shards_empty
    assert n >= 2 * NSHARDS  # a and b (and their coordinates)


def test_no_progress_output_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shardwise.write_array(source(), tmp_path / "a.zarr", **KW)
    ds = xr.Dataset({"a": (("y", "x"), data())}).chunk({"y": 10})
    shardwise.to_zarr(ds, tmp_path / "d.zarr", shards={"y": 16, "x": 16})
    shardwise.verify(tmp_path / "a.zarr")
    assert capsys.readouterr().err == ""


def test_cli_shows_progress_when_asked_and_not_with_no_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bars count every shard (by default they show only when stderr is a terminal:
    integration/test_cli.py::test_progress_bars_only_on_a_terminal_unless_asked)."""
    src = tmp_path / "src.zarr"
    shardwise.write_array(data(), src, chunks=(8, 8), shards=(64, 48))
    args = ["reshard", str(src), str(tmp_path / "a.zarr"), "--shards", "16,16", "--progress"]
    assert main(args) == 0
    assert final_count(capsys.readouterr().err) == (NSHARDS, NSHARDS)
    assert main(["verify", str(tmp_path / "a.zarr"), "--progress"]) == 0
    assert final_count(capsys.readouterr().err) == (NSHARDS, NSHARDS)

    args = ["reshard", str(src), str(tmp_path / "b.zarr"), "--shards", "16,16", "--no-progress"]
    assert main(args) == 0
    assert main(["verify", str(tmp_path / "b.zarr"), "--no-progress"]) == 0
    assert "shard" not in capsys.readouterr().err
