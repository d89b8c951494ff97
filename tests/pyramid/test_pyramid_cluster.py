"""A pyramid on a 2-process LocalCluster whose workers have less memory than one level-0 shard:
level 0 is staged, the write completes with no worker restarted, every level is right."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr

import shardwise
from faultkit import cluster_workers, worker_cluster

SHAPE = (12288, 16384)  # uint16: a 384 MiB shard, more than a worker's 300 MiB
TILE = 64


def tiles(i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The value every 64 x 64 tile holds (before the per-sample pattern)."""
    return (i // TILE * 7 + j // TILE * 3).astype("uint16")


def _block(block_info: Any = None) -> np.ndarray:
    (r0, r1), (c0, c1) = block_info[None]["array-location"]
    i, j = np.ogrid[r0:r1, c0:c1]
    # 0, 4, 8, 12 within each 2 x 2 block: level 1 is the tile's value + 6 exactly, and so is
    # every level after (a tile is 64 samples wide, a level-3 block 8)
    return tiles(i, j) + ((i % 2) * 8 + (j % 2) * 4).astype("uint16")


@pytest.fixture(scope="module")
def small_workers() -> Iterator[Any]:
    # the default client: shardwise reads the workers' memory limit from it
    with worker_cluster("300MiB", set_as_default=True) as c:
        yield c


@pytest.mark.slow
def test_pyramid_with_shards_larger_than_a_worker(small_workers: Any, tmp_path: Path) -> None:
    src = da.map_blocks(_block, chunks=((256,) * 48, (SHAPE[1],)), dtype="uint16")
    root = tmp_path / "big.zarr"
    pids = small_workers.run(os.getpid)
    kw: dict[str, Any] = dict(levels=4, chunks=(256, 256), shards=SHAPE, mode="w")
    delayed = shardwise.write_pyramid(src, root, compute=False, **kw)
    # levels 0 and 1 are staged: level 0's shard exceeds a worker, and level 1's direct task
    # (a 96 MiB shard merged and encoded, 288 MiB) would leave the worker no headroom
    names = {k[0] for k in dict(delayed.dask) if isinstance(k, tuple)}
    assert len({n for n in names if n.startswith("shardwise-stage-")}) == 2
    report = delayed.compute()
    assert report.shards_written == 4
    # the same worker processes: none was killed and restarted for its memory
    assert small_workers.run(os.getpid) == pids
    assert len(cluster_workers(small_workers)) == 2
    level0 = zarr.open_array(root, path="0", mode="r")
    for lo in range(0, SHAPE[0], 4096):  # bands across the shard, every sample of them
        want = _block({None: {"array-location": [(lo, lo + 64), (0, SHAPE[1])]}})
        np.testing.assert_array_equal(level0[lo : lo + 64], want)
    for k in (1, 2, 3):
        got = np.asarray(zarr.open_array(root, path=str(k), mode="r")[...])
        f = 2**k
        i, j = np.ogrid[0 : SHAPE[0] : f, 0 : SHAPE[1] : f]
        np.testing.assert_array_equal(got, tiles(i, j) + 6)
    assert shardwise.verify(root).ok
