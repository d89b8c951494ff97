"""Counts in what users read (a write's, a conversion's and a verify's report, ``shardwise
inspect``, a plan) agree with their number: one shard, one write, one array, one problem, one
shard task; several in the plural."""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr

import shardwise
from shardwise.cli import main


def test_a_write_of_one_shard_and_one_all_fill_shard(tmp_path: Path) -> None:
    x = np.zeros((8, 4), "f4")
    x[:4] = 1  # the second shard all fill: not stored
    report = shardwise.write_array(x, tmp_path / "a", chunks=(4, 4), shards=(4, 4), fill_value=0)
    text = str(report)
    assert text.startswith("1 shard written, 1 all-fill shard skipped (0 deleted), ")
    assert ", 1 inner chunk stored, 1 all-fill; " in text
    two = shardwise.write_array(np.ones((8, 8), "f4"), tmp_path / "b", chunks=4, shards=4)
    assert str(two).startswith("4 shards written, 0 all-fill shards skipped (0 deleted), ")
    assert ", 4 inner chunks stored, 0 all-fill; " in str(two)


def test_inspect_and_verify_of_one_shard_written_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "one.zarr"
    shardwise.write_array(np.ones((4, 4), "f4"), store, chunks=(2, 2), shards=(4, 4))
    assert main(["inspect", str(store)]) == 0
    out = capsys.readouterr().out
    assert "grid (1, 1) = 1 shard of 4 inner chunks (2, 2)" in out
    assert "  stored   1 shard (2 objects with the metadata), " in out
    assert "  journal  1 shard record, 1 write done, 0 open" in out
    (store / "c" / "0" / "0").unlink()
    assert main(["verify", str(store)]) == 1
    head = capsys.readouterr().out.splitlines()[0]
    assert "one.zarr: 1 problem; 0 shards stored (1 recorded), 0 inner chunks decoded, " in head


def test_a_conversion_of_one_array(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src.zarr"
    zarr.create_array(src, shape=(8, 8), chunks=(4, 4), dtype="u1", zarr_format=2)[...] = 1
    assert main(["convert", str(src), str(tmp_path / "dst.zarr"), "--shards", "8,8"]) == 0
    out = capsys.readouterr().out
    assert ": 1 array, objects " in out and ": 1 shard written, " in out, out


def test_a_staged_plan_of_one_shard_counts_one_shard_task(tmp_path: Path) -> None:
    big = da.zeros((256, 256), chunks=(64, 256), dtype="f4")
    plan = shardwise.plan_write(
        big, tmp_path / "s", chunks=(64, 64), shards=(256, 256), strategy="staged"
    )
    assert "  tasks: 5 (4 block tasks + 1 shard task)" in str(plan).splitlines()
