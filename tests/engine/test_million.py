"""A million shards from one call, on a LocalCluster of worker processes, into local files: the
graph is about a thousand tasks, every shard lands once, the objects are the shards plus about
one record object a thousand shards, and the values read back right on a sample.

The one test here takes minutes (a million 64-byte shards written and listed); it is slow, and
CI runs it. What it costs as the shards grow is measured by ``benchmarks/million.py``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import zarr

import shardwise
from shardwise.core.job import MIN_RUNS

ROWS, COLS, WIDTH = 1000, 64_000, 64  # 1000 x 1000 shards of one row of 64 bytes


class Grid:
    """A source without a graph: each window computed from its coordinates (never 0, the fill
    value, so every shard is stored)."""

    shape = (ROWS, COLS)
    dtype = np.dtype("u1")
    ndim = 2

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        rows = np.arange(key[0].start, key[0].stop)[:, None]
        cols = np.arange(key[1].start, key[1].stop)[None, :]
        return ((rows * 7 + cols // WIDTH) % 251 + 1).astype("u1")


# the suite's 600 s timeout guards against a hang; a million files took 329 s on a quiet 2-core
# machine and more than 600 s beside other heavy work: this one's guard is larger
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_million_shards_from_one_call_on_worker_processes(client: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "m.zarr")
    kw: dict[str, Any] = dict(chunks=(1, WIDTH // 2), shards=(1, WIDTH))
    with dask.config.set(scheduler=client.get):
        job = shardwise.plan_write(Grid(), path, **kw)
        graph = shardwise.write_array(Grid(), path, compute=False, **kw)
    assert job.shards == 10**6 and job.tasks <= MIN_RUNS < 20_000
    assert len(dict(graph.__dask_graph__())) <= job.tasks + 4
    report = client.compute(graph).result()
    assert report.shards_written == 10**6 and report.shards_empty == 0

    root = tmp_path / "m.zarr"
    rows = [e for e in os.scandir(root / "c") if e.is_dir()]
    assert len(rows) == ROWS
    assert sum(len(os.listdir(e.path)) for e in rows) == 10**6  # every shard, once
    objects = sum(len(files) for _, _, files in os.walk(root))
    # the shards, one record object a run, zarr.json and the write's marker
    assert objects == 10**6 + job.shard_tasks + 2 <= 1.05 * (10**6 + 1)

    rng = np.random.default_rng(7)
    z = zarr.open_array(path, mode="r")
    for r, c in zip(rng.integers(0, ROWS, 20), rng.integers(0, COLS - 300, 20), strict=True):
        window = (slice(int(r), int(r) + 1), slice(int(c), int(c) + 300))
        want = Grid()[window]
        np.testing.assert_array_equal(shardwise.read_array(path, window), want)
        np.testing.assert_array_equal(z[window], want)
    np.testing.assert_array_equal(
        shardwise.read_array(path, (slice(0, 3), ...)), Grid()[0:3, 0:COLS]
    )
