"""``strategy="auto"`` on real writes: a source whose dask chunks do not line up with the shards
is rechunked in memory (direct) on dask's threads in this process and on a LocalCluster made in
this process, and staged on a cluster it did not make.

Oracles: the staged write of the same source (the same files, byte for byte), zarr-python's
read of the store, the tasks dask ran (their key names: ``shardwise-stage-...`` are the staged
block tasks) and the resident memory of the write in a fresh process (``memkit.peak_rss``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from dask.callbacks import Callback

import shardwise
from faultkit import files, record_figures
from memkit import MiB, peak_rss, smooth
from oracles import assert_bit_equal

ZSTD: dict[str, Any] = dict(compressors=[zarr.codecs.ZstdCodec(level=1)])
SHAPE = (40, 96, 80)
LAYOUT: dict[str, Any] = dict(chunks=(8, 16, 20), shards=(16, 32, 40), **ZSTD)
CHUNKINGS = {
    "inside": (8, 16, 20),  # every block inside one shard, four to eight per shard
    "crossing": (12, 24, 30),  # blocks crossing shard edges and inner-chunk edges
    "irregular": (7, 50, 33),  # crossing shard and inner-chunk edges
}


class TaskNames(Callback):  # type: ignore[misc]
    """The tasks a local scheduler runs: a real observation of the path a write took."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[Any] = []

    def _pretask(self, key: Any, dsk: Any, state: Any) -> None:
        self.keys.append(key)

    def count(self, layer: str) -> int:
        """Block tasks of ``layer`` (``shardwise-write``, ``shardwise-stage``) that ran: dask may
        fuse a task into the next one (the fused key keeps both names, and the original key
        stays as an alias of it), so blocks are told apart by their index."""
        blocks = {k[1:] for k in self.keys if isinstance(k, tuple) and f"{layer}-" in k[0]}
        return len(blocks)


def _write(source: Any, root: Path, **kw: Any) -> TaskNames:
    with TaskNames() as seen:
        shardwise.write_array(source, root, **LAYOUT, **kw)
    return seen


@pytest.mark.parametrize("chunking", sorted(CHUNKINGS))
def test_misaligned_auto_on_threads_writes_direct_the_bytes_staged_writes(
    tmp_path: Path, chunking: str
) -> None:
    data = smooth(SHAPE)
    source = da.from_array(data, chunks=CHUNKINGS[chunking]) * np.uint16(1)
    plan = shardwise.plan_write(source, tmp_path / "plan", **LAYOUT)
    assert plan.strategy == "direct" and plan.bytes_rechunked == data.nbytes
    assert plan.reason.startswith("direct: misaligned, rechunked in memory on local threads")
    plan_staged = shardwise.plan_write(source, tmp_path / "plan", strategy="staged", **LAYOUT)
    auto = _write(source, tmp_path / "auto")
    staged = _write(source, tmp_path / "staged", strategy="staged")
    # auto ran one write task per shard (3 x 3 x 2) and no staged block task; staged ran both
    # (TaskNames is an active dask callback: a watched local scheduler is still local)
    assert auto.count("shardwise-write") == 18 and auto.count("shardwise-stage") == 0
    assert staged.count("shardwise-stage") == plan_staged.block_tasks > 0
    assert staged.count("shardwise-write") == 18
    assert files(tmp_path / "auto") == files(tmp_path / "staged")
    assert_bit_equal(zarr.open_array(tmp_path / "auto", mode="r")[...], data)
    # a region write over both, cutting shards and inner chunks: the same bytes again
    region = (slice(3, 37), slice(10, 90), slice(0, 80))
    new = da.from_array(np.flip(data[region]).copy(), chunks=CHUNKINGS[chunking])
    for name, kw in (("auto", {}), ("staged", dict(strategy="staged"))):
        shardwise.write_array(new, tmp_path / name, mode="r+", region=region, **kw)
    assert files(tmp_path / "auto") == files(tmp_path / "staged")
    want = data.copy()
    want[region] = np.flip(data[region])
    assert_bit_equal(zarr.open_array(tmp_path / "auto", mode="r")[...], want)


def test_xarray_writes_misaligned_variables_direct_on_threads(tmp_path: Path) -> None:
    data = smooth(SHAPE)
    ds = xr.Dataset({"v": (("z", "y", "x"), data)}).chunk(z=12, y=24, x=30)
    enc = {"v": {"chunks": LAYOUT["chunks"], "shards": LAYOUT["shards"]}}
    with TaskNames() as seen:
        shardwise.to_zarr(ds, tmp_path / "a.zarr", encoding=enc)
    assert seen.count("shardwise-stage") == 0 and seen.count("shardwise-write") == 18
    assert_bit_equal(zarr.open_array(tmp_path / "a.zarr", path="v", mode="r")[...], data)


def test_plan_write_asks_the_scheduler_the_write_will_run_on(tmp_path: Path) -> None:
    source = da.zeros(SHAPE, dtype="uint16", chunks=CHUNKINGS["crossing"])
    for scheduler, strategy in (("sync", "direct"), ("threads", "direct"), ("processes", "staged")):
        with dask.config.set(scheduler=scheduler):
            assert shardwise.plan_write(source, tmp_path / "p", **LAYOUT).strategy == strategy


# -- memory: what plan_write says a misaligned direct task holds, measured --------------------

MEM_SHAPE = (64, 512, 512)  # 32 MiB of uint16
MEM_SHARDS = (16, 512, 512)  # 8 MiB shards


# the budget auto plans these writes with: given, not probed from the machine's available
# memory, which the other jobs of a loaded machine move
AUTO_LIMIT = 2**30


def misaligned_write_case(root: str, blocks: list[int]) -> Any:
    """write_array with auto on the synchronous scheduler (one task at a time: the peak is the
    largest task's) of a dask array whose tasks make their blocks (as a real source does)."""
    x = smooth(MEM_SHAPE)
    src = da.from_array(x, chunks=tuple(blocks)) * np.uint16(1)

    def op() -> None:
        with dask.config.set(scheduler="sync"):
            shardwise.write_array(
                src,
                root,
                chunks=(8, 64, 64),
                shards=MEM_SHARDS,
                threads=2,
                memory_limit=AUTO_LIMIT,
                **ZSTD,
            )

    return op


# a direct task holds its shard's block, the encoded chunks and the joined shard (3 x 8 MiB:
# incompressible data at worst) and the source blocks its rechunk joins, whole:
# * blocks of (8, 256, 256), inside the shards: a shard's eight blocks, 8 MiB -> 32 MiB
# * blocks of (24, 384, 384): shard rows 16:32 touch block rows 0:24 and 24:48 (48 rows), and
#   rows and columns 0:512 blocks of 384 and 128: 48 x 512 x 512 x 2 bytes, 24 MiB -> 48 MiB
MEM_BUDGETS = {(8, 256, 256): 32 * MiB, (24, 384, 384): 48 * MiB}


@pytest.mark.parametrize("blocks", sorted(MEM_BUDGETS))
def test_a_misaligned_direct_write_holds_what_plan_write_says(
    tmp_path: Path, blocks: tuple[int, ...]
) -> None:
    root = tmp_path / "a.zarr"
    source = da.zeros(MEM_SHAPE, dtype="uint16", chunks=blocks)
    with dask.config.set(scheduler="sync"):
        plan = shardwise.plan_write(
            source, root, chunks=(8, 64, 64), shards=MEM_SHARDS, memory_limit=AUTO_LIMIT
        )
    assert plan.strategy == "direct" and plan.peak_per_task == MEM_BUDGETS[blocks]
    peak = peak_rss(misaligned_write_case, root=str(root), blocks=list(blocks)).peak
    record_figures(f"rss-auto-direct-{'x'.join(map(str, blocks))}", {"peak": peak})
    np.testing.assert_array_equal(zarr.open_array(root, mode="r")[...], smooth(MEM_SHAPE))
    assert peak <= MEM_BUDGETS[blocks], (peak, plan.peak_per_task)


# -- clusters: direct on a LocalCluster, staged across machines -----------------------------------


def _stream_names(stream: list[dict[str, Any]]) -> Counter[str]:
    names = (str(t["key"][0] if isinstance(t["key"], tuple) else t["key"]) for t in stream)
    return Counter(n.rsplit("-", 1)[0] for n in names)


@pytest.mark.slow
def test_auto_writes_misaligned_sources_direct_on_a_local_cluster(
    client: Any, tmp_path: Path
) -> None:
    from distributed import get_task_stream

    data = smooth(SHAPE)
    source = da.from_array(data, chunks=CHUNKINGS["crossing"]) * np.uint16(1)
    # no fusion of tasks: the task stream then names each task by its own layer
    with dask.config.set({"scheduler": client, "optimization.fuse.active": False}):
        plan = shardwise.plan_write(source, tmp_path / "plan", **LAYOUT)
        assert plan.strategy == "direct" and plan.block_tasks == 0
        assert "LocalCluster" in plan.reason, plan.reason
        with get_task_stream(client) as ts:
            shardwise.write_array(source, tmp_path / "cluster", **LAYOUT)
        with get_task_stream(client) as xs:
            ds = xr.Dataset({"v": (("z", "y", "x"), source)})
            enc = {"v": {"chunks": LAYOUT["chunks"], "shards": LAYOUT["shards"]}}
            shardwise.to_zarr(ds, tmp_path / "ds.zarr", encoding=enc)
        # staged when asked: its block tasks, then one write task per shard
        staged = shardwise.plan_write(source, tmp_path / "plan", strategy="staged", **LAYOUT)
        with get_task_stream(client) as ss:
            shardwise.write_array(source, tmp_path / "staged", strategy="staged", **LAYOUT)
        # blocks inside the shards, their edges on inner-chunk edges: each shard task takes its
        # blocks from the workers, no rechunk (engine/pieces.py)
        inside = da.from_array(data, chunks=CHUNKINGS["inside"]) * np.uint16(1)
        with get_task_stream(client) as ps:
            shardwise.write_array(inside, tmp_path / "inside", **LAYOUT)
    # both auto writes direct: one write task per shard (3 x 3 x 2), no staged block task
    for seen in (_stream_names(ts.data), _stream_names(xs.data)):
        assert (seen["shardwise-stage"], seen["shardwise-write"]) == (0, 18), seen
    seen = _stream_names(ps.data)
    assert (seen["shardwise-stage"], seen["shardwise-write"]) == (0, 18), seen
    assert not any("rechunk" in name for name in seen), seen
    assert files(tmp_path / "inside") == files(tmp_path / "cluster")
    seen = _stream_names(ss.data)
    assert (seen["shardwise-stage"], seen["shardwise-write"]) == (staged.block_tasks, 18), seen
    _write(source, tmp_path / "threads")  # auto on threads: direct
    assert files(tmp_path / "cluster") == files(tmp_path / "threads") == files(tmp_path / "staged")
    assert_bit_equal(zarr.open_array(tmp_path / "ds.zarr", path="v", mode="r")[...], data)


@pytest.mark.slow
def test_auto_stages_misaligned_sources_on_a_cluster_it_did_not_make(
    client: Any, tmp_path: Path
) -> None:
    """A client connected by address (its workers may be on other machines, as with a scheduler
    started by a batch system) stages: only receipts travel between workers."""
    from distributed import Client, get_task_stream

    data = smooth(SHAPE)
    source = da.from_array(data, chunks=CHUNKINGS["crossing"]) * np.uint16(1)
    with Client(client.scheduler.address, set_as_default=False) as remote:
        assert remote.cluster is None  # what a client of a scheduler started elsewhere has
        with dask.config.set({"scheduler": remote, "optimization.fuse.active": False}):
            plan = shardwise.plan_write(source, tmp_path / "plan", **LAYOUT)
            # block edges moved to inner-chunk edges: (16, 8, 16) x (32, 16, 32, 16) x (40, 20, 20)
            assert plan.strategy == "staged" and plan.block_tasks == 3 * 4 * 3
            assert plan.reason == "staged: distributed scheduler, staging moves less"
            with get_task_stream(remote) as ts:
                shardwise.write_array(source, tmp_path / "cluster", **LAYOUT)
    seen = _stream_names(ts.data)
    assert (seen["shardwise-stage"], seen["shardwise-write"]) == (plan.block_tasks, 18), seen
    assert_bit_equal(zarr.open_array(tmp_path / "cluster", mode="r")[...], data)
