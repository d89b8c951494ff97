"""A write's report names every shard it stored (``WriteReport.keys``) at a cost that does not
grow with its shards: spans of shard indices, a few per task, spelled as the sorted store keys
only when read. Oracles: the shard objects on disk, and the key list a report held before."""

from __future__ import annotations

import pickle
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr

import shardwise
from shardwise.core.keys import ShardKeys
from shardwise.core.layout import Layout

KW = dict(chunks=(1, 8), shards=(1, 16))  # tiny shards: many of them


def stored_keys(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "c").rglob("*") if p.is_file())


def test_the_keys_of_a_write_in_runs_are_the_shards_stored_in_a_few_spans(
    tmp_path: Path,
) -> None:
    sizes = {}
    for rows in (1024, 4096):
        x = np.arange(rows * 32, dtype="i4").reshape(rows, 32)
        rep = shardwise.write_array(x, tmp_path / f"a{rows}", **KW)
        job = shardwise.plan_write(x, tmp_path / f"b{rows}", **KW)
        assert rep.shards_written == len(rep.keys) == 2 * rows
        assert rep.keys.spans <= job.tasks  # one span a run of neighbours at most
        assert list(rep.keys) == stored_keys(tmp_path / f"a{rows}")  # sorted as strings
        assert rep.keys[0] == "c/0/0" and "c/10/1" in rep.keys and "c/0/2" not in rep.keys
        sizes[rows] = len(pickle.dumps(rep))
    # 4x the shards, not 4x the report: what a task sends back and the client keeps
    assert sizes[4096] < 1.5 * sizes[1024], sizes


def test_one_task_per_shard_and_a_dataset_report_their_keys_with_their_paths(
    tmp_path: Path,
) -> None:
    x = da.from_array(np.arange(64 * 32, dtype="i4").reshape(64, 32), chunks=(8, 16))
    rep = shardwise.write_array(x, tmp_path / "d.zarr", **KW)
    assert rep.keys == stored_keys(tmp_path / "d.zarr") and len(rep.keys) == 128
    assert rep.keys.spans < 128  # neighbours joined as the receipts are summed
    ds = xr.Dataset({"v": (("y", "x"), x), "w": (("y", "x"), x + 1)})
    rep = shardwise.to_zarr(ds, tmp_path / "ds.zarr", shards={"y": 1, "x": 16}, mode="w")
    want = sorted(f"{v}/{k}" for v in "vw" for k in stored_keys(tmp_path / "ds.zarr" / v))
    assert list(rep.keys) == want and len(want) == 256


def test_shard_keys_spell_every_grid_as_the_layout_does() -> None:
    for lay in (
        Layout((10, 7), (4, 4), (2, 2)),
        Layout((10, 7, 3), (4, 4, 1), (2, 2, 1), separator="."),
        Layout((10, 7), (4, 4), (2, 2), key_encoding="v2"),
        Layout.rectilinear((10, 7), ([3, 5, 2], 4), (1, 2)),
        Layout((), (), ()),
    ):
        keys = ShardKeys()
        coords = list(lay.shards())
        for c in reversed(coords):  # out of order: no span joins, still sorted when read
            one = ShardKeys.of_shard(lay, c)  # the writers' key of a shard: its coordinate's
            assert one == [lay.shard_key(c)]
            keys.extend(one)
        assert list(keys) == sorted(lay.shard_key(c) for c in coords)
        assert pickle.loads(pickle.dumps(keys)) == keys
    mixed = ShardKeys(["z/loose"])
    mixed.extend(ShardKeys.of_shard(Layout((4,), (2,), (1,)), (1,), prefix="a"))
    assert mixed == ["a/c/1", "z/loose"] and mixed.with_prefix("g") == ["g/a/c/1", "g/z/loose"]
