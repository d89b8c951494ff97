"""The memory a pyramid's write holds does not grow with the image (issue #20 items 3 and 5).

Two images of the same shards, one 8 times the other, written on one thread (dask's synchronous
scheduler: the order of the tasks, and so what is held at the peak, is the same every run):

* what dask holds between tasks (every block in its cache, counted by a callback) stays within a
  fixed number of shards at both sizes, and at most one block of the source is alive at a time;
* the peak resident memory of the whole write, native allocations included (a fresh process,
  ``memkit.peak_rss``), stays within a fixed budget at both sizes.

Before the levels were a tree of shard tasks, level k+1 was a ``map_blocks`` over level k's
blocks: each block had two consumers (its write and its reduction) and dask ran the reductions
far ahead of the writes, so the reduced blocks waiting for their shard grew with the image
(uint16, 64³ shards: 3.4 MiB held in dask's cache at 256³, 26 MiB at 512³; 40 MiB resident
above the baseline at 512³).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from dask.callbacks import Callback

import shardwise
from memkit import MiB, peak_rss
from shardwise.core.pyramid import child_shards, level_layout, nests

LEVELS = 5
# test_pyramid's helpers are imported inside the tests that use them: memkit's fresh process
# loads this module (for pyramid_write) with tests/ on its path, not tests/pyramid/


def generated(n: int, shard: int) -> Any:
    """A uint16 cube of side ``n`` as a dask array of one block per level-0 shard, each block
    made by its own task (nothing of the image is in memory before its block is computed)."""

    def block(block_info: Any = None) -> np.ndarray:
        loc = block_info[None]["array-location"]
        rng = np.random.default_rng([a for a, _ in loc])
        return rng.integers(0, 4000, size=tuple(b - a for a, b in loc), dtype="uint16")

    chunks = ((shard,) * (n // shard),) * 3
    return da.map_blocks(block, chunks=chunks, dtype="uint16", meta=np.empty((0,) * 3, "uint16"))


def _bytes(value: Any) -> int:
    """The array bytes a task's result holds (a block, or a shard task's receipt and reduced
    block)."""
    if isinstance(value, np.ndarray):
        return 0 if value.dtype == object else value.nbytes
    if isinstance(value, tuple | list):
        return sum(_bytes(v) for v in value)
    return 0


class Held(Callback):  # type: ignore[misc]
    """After every task: the bytes of the blocks in dask's cache and how many blocks of the
    source are among them; the peak of each."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source
        self.peak = 0
        self.sources = 0

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        cache = state["cache"]
        self.peak = max(self.peak, sum(_bytes(v) for v in cache.values()))
        alive = sum(isinstance(k, tuple) and k[0] == self.source for k in cache)
        self.sources = max(self.sources, alive)


@pytest.mark.parametrize("n", [128, 256])
def test_blocks_held_between_tasks_do_not_grow_with_the_image(tmp_path: Path, n: int) -> None:
    shard = 32
    shard_bytes = shard**3 * 2
    data = generated(n, shard)
    held = Held(data.name)
    root = tmp_path / "p.zarr"
    with dask.config.set(scheduler="synchronous"), held:
        report = shardwise.write_pyramid(
            data, root, levels=LEVELS, chunks=16, shards=shard, threads=1
        )
    # one level-0 block and the block a shard's task assembles, and below the top level at
    # most 7 reduced blocks (1/8 of a shard each) waiting for their last sibling per level:
    # 2 + 4 * 7/8 shards, whatever the image (measured 2.75 shards at 128³, 3.6 at 256³; the
    # map_blocks levels held 8 at 128³, 52 at 256³)
    assert held.peak <= 5.5 * shard_bytes, (held.peak / shard_bytes, n)
    # a source block is dropped once its shard is written and reduced
    assert held.sources == 1
    shards = [max(1, -(-(n >> k) // shard)) ** 3 for k in range(LEVELS)]
    assert report.shards_written == sum(shards)
    if n == 128:  # every level right (the larger image: the same graph, more of it)
        from test_pyramid import coarsened  # see the note at LEVELS

        image = data.compute()
        for k in range(LEVELS):
            got = zarr.open_array(root, path=str(k), mode="r")[...]
            np.testing.assert_array_equal(got, coarsened(image, (2, 2, 2), k))


def pyramid_write(n: int, root: str) -> Callable[[], np.ndarray]:
    """The measured operation of the native test: a 5-level pyramid of a generated cube in 64³
    shards (512 KiB), 16³ inner chunks, on one thread."""
    data = generated(n, 64)

    def write() -> np.ndarray:
        with dask.config.set(scheduler="synchronous"):
            report = shardwise.write_pyramid(
                data, root, levels=LEVELS, chunks=16, shards=64, threads=1
            )
        return np.array([report.shards_written])

    return write


def test_peak_resident_memory_does_not_grow_with_the_image(tmp_path: Path) -> None:
    # the blocks held (a few 512 KiB shards, see above), a task's encoded shard, and the
    # graph, scheduler state and receipts of up to 1,750 tasks (what grows with the image:
    # a few KiB a task); measured 5.5 MiB at 256³ and 12 MiB at 512³ (the map_blocks
    # levels: 9.5 and 40 MiB)
    budget = 24 * MiB
    for n in (256, 512):
        got = peak_rss(pyramid_write, n=n, root=str(tmp_path / f"{n}.zarr"))
        shards = sum(max(1, -(-(n >> k) // 64)) ** 3 for k in range(LEVELS))
        assert got.digest == {"shape": [1], "sum": float(shards)}
        assert got.peak <= budget, (n, got.mib)


def test_child_shards_tile_every_shard_of_the_next_level() -> None:
    """Wherever the shards nest, the reduced blocks of a shard's children cover it exactly
    once, each where the whole level's reduction puts it (shards as level_layout clips them)."""
    cases = 0
    for n, chunk, shard, f in itertools.product(
        (1, 5, 31, 64, 100), (4, 8), (8, 16, 24, 48), (1, 2, 3, 4)
    ):
        if shard % chunk:
            continue
        shards = level_layout((n,), (chunk,), (shard,))[1]
        up_n = -(-n // f)
        up_shards = level_layout((up_n,), (chunk,), (shard,))[1]
        if not nests((n,), shards, up_shards, (f,)):
            assert shards[0] % f and n > shards[0]  # refused only where a block straddles
            continue
        cases += 1
        for t in range(-(-up_n // up_shards[0])):
            lo, hi = t * up_shards[0], min((t + 1) * up_shards[0], up_n)
            covered = []
            for (j,), (at,) in child_shards((t,), (n,), shards, up_shards, (f,)):
                start, stop = j * shards[0], min((j + 1) * shards[0], n)
                assert start % f == 0  # the child's first block starts at a block edge
                covered += range(lo + at, lo + at + -(-(stop - start) // f))
                assert start // f == lo + at  # where the whole level's reduction puts it
            assert covered == list(range(lo, hi))
    assert cases > 50


@pytest.mark.parametrize(("factor", "nested"), [(2, True), (3, False)])
def test_levels_whose_shards_do_not_nest_are_written_from_map_blocks(
    tmp_path: Path, factor: int, nested: bool
) -> None:
    """32-sample shards nest under a factor 2 (a tree of shard tasks from level 0) and not
    under 3 (a reduction block straddles a shard edge): those levels stay map_blocks arrays,
    each level still right and the source read once."""
    from test_pyramid import CountingSource, coarsened  # see the note at LEVELS

    x = np.random.default_rng(5).integers(0, 1000, (150, 100)).astype("u2")
    src = CountingSource(x, (32, 32))
    root = tmp_path / "p.zarr"
    kw: dict[str, Any] = dict(levels=3, factors=factor, chunks=16, shards=32, strategy="direct")
    delayed = shardwise.write_pyramid(src.array, root, compute=False, **kw)
    names = {k[0] for k in dict(delayed.dask) if isinstance(k, tuple)}
    assert any(name.startswith("shardwise-receipt-") for name in names) == nested
    with dask.config.set(scheduler="threads", num_workers=2):
        delayed.compute()
    assert set(src.calls.values()) == {1} and len(src.calls) == 5 * 4
    for k in range(3):
        got = zarr.open_array(root, path=str(k), mode="r")[...]
        np.testing.assert_array_equal(got, coarsened(x, (factor, factor), k))
