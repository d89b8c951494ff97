"""Write graphs of huge arrays are built lazily and stay O(blocks + shards).

The ZEP 2 example: uint8 25000x18000x6000 (2.5 TiB), 64^3 inner chunks, 2048^3 shards (351 of
8 GiB), dask chunks 512^3 (21,168 blocks): a staged write. Sizes are counted from the graph's
layers (``len`` of a layer does not build its tasks), never timed.
"""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import numpy as np

import shardwise
from shardwise.core.layout import Layout

SHAPE, INNER, SHARDS = (25000, 18000, 6000), (64,) * 3, (2048,) * 3


def test_zep2_write_graph_is_lazy_and_linear(tmp_path: Path) -> None:
    source = da.zeros(SHAPE, dtype="uint8", chunks=512)
    nblocks, nshards = source.npartitions, Layout(SHAPE, SHARDS, INNER).nshards
    assert (nblocks, nshards) == (21168, 351)
    job = shardwise.plan_write(source, str(tmp_path / "p"), chunks=INNER, shards=SHARDS)
    assert job.strategy == "staged"
    assert f"{nblocks} block tasks + {nshards} shard tasks" in str(job)
    delayed = shardwise.write_array(
        source, str(tmp_path / "a"), chunks=INNER, shards=SHARDS, compute=False
    )
    graph = delayed.__dask_graph__()
    layers = graph.layers
    # source blocks, one stage task per block, one task per shard, the report: layers that are
    # still lazy (a Blockwise layer is not materialised until the graph is)
    assert len(layers) <= 6, list(layers)
    assert not all(layer.is_materialized() for layer in layers.values())
    assert sum(len(layer) for layer in layers.values()) <= 2 * nblocks + nshards + 4
    n_inner = int(np.prod([-(-s // c) for s, c in zip(SHAPE, INNER, strict=True)]))
    assert sum(len(layer) for layer in layers.values()) < n_inner // 100
