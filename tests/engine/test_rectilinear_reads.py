"""Rectilinear shard grids read: arrays zarr-python writes with
``zarr.config.set({"array.rectilinear_chunks": True})`` (shards of uneven extents, regular inner
chunks), read by ``read_array``, ``open_array`` (one dask chunk per shard), the xarray engine and
``open_datatree``, checked value for value against numpy; ``inspect``, ``verify`` and
``shard_map`` describe them; a small read fetches the shard index and the inner chunks it
touches, nothing more; the zarr flag is left as it was.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

import shardwise
from shardwise.cli.inspection import inspect_array, print_inspect, shard_map

# name -> (shape, shards as zarr takes them, inner chunks)
GRIDS: dict[str, tuple[tuple[int, ...], list[Any], tuple[int, ...]]] = {
    "the spec's example": ((100, 100), [[60, 40], [50, 50]], (10, 10)),
    "edges beyond the array": ((70,), [[30, 30, 40]], (10,)),
    "mixed axes": ((30, 12, 100), [[4, 8, 4, 14], 6, [10, 50, 40]], (2, 3, 10)),
    "one shard": ((7, 9), [[7], [9]], (7, 3)),
}


def zarr_written(store: Any, shape: tuple[int, ...], shards: list[Any], chunks: Any) -> np.ndarray:
    """The array zarr-python writes (its flag on only for the write) and its values; shards
    summing past ``shape`` are written whole, then the array shrunk to ``shape`` (zarr keeps
    the edges)."""
    full = tuple(n if isinstance(s, int) else sum(s) for s, n in zip(shards, shape, strict=True))
    values = np.random.default_rng(len(shape)).integers(-99, 99, full).astype("int32")
    values[tuple(slice(0, 1) for _ in shape)] = 0  # a fill value somewhere
    with zarr.config.set({"array.rectilinear_chunks": True}):
        a = zarr.create_array(
            store, shape=full, shards=shards, chunks=chunks, dtype="int32", fill_value=0
        )
        a[...] = values
        if full != shape:
            a.resize(shape)
    return values[tuple(slice(0, n) for n in shape)]


def sizes_of(shards: list[Any], shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The shard extents per axis, clipped to the array: the dask chunks of one per shard."""
    out = []
    for s, n in zip(shards, shape, strict=True):
        sizes = [s] * -(-n // s) if isinstance(s, int) else list(s)
        edges = np.minimum(np.cumsum([0, *sizes]), n)
        out.append(tuple(int(b - a) for a, b in itertools.pairwise(edges) if b > a))
    return tuple(out)


@pytest.mark.parametrize("name", GRIDS)
def test_zarr_written_rectilinear_arrays_read_exactly(tmp_path: Path, name: str) -> None:
    shape, shards, chunks = GRIDS[name]
    path = tmp_path / "a.zarr"
    values = zarr_written(LocalStore(path), shape, shards, chunks)
    assert json.loads((path / "zarr.json").read_text())["chunk_grid"]["name"] == "rectilinear"
    np.testing.assert_array_equal(shardwise.read_array(path), values)
    lazy = shardwise.open_array(path)
    assert lazy.chunks == sizes_of(shards, shape)
    np.testing.assert_array_equal(lazy.compute(), values)
    rng = np.random.default_rng(7)
    for _ in range(8):  # windows across shard edges, steps, reversed
        sel = []
        for n in shape:
            a, b = sorted(rng.integers(0, n + 1, 2).tolist())
            sel.append(slice(a, b, int(rng.integers(1, 4))))
        sel[0] = slice(sel[0].stop, None, -1) if rng.random() < 0.3 else sel[0]
        np.testing.assert_array_equal(lazy[tuple(sel)].compute(), values[tuple(sel)])
        np.testing.assert_array_equal(shardwise.read_array(path, tuple(sel)), values[tuple(sel)])
    picks = tuple(np.unique(rng.integers(0, n, 5)) for n in shape)
    np.testing.assert_array_equal(lazy.vindex[np.ix_(*picks)].compute(), values[np.ix_(*picks)])
    assert zarr.config.get("array.rectilinear_chunks") is False


def test_the_engine_and_open_datatree_read_them_with_a_chunk_per_shard(tmp_path: Path) -> None:
    path = tmp_path / "t.zarr"
    root = zarr.open_group(LocalStore(path), mode="w")
    days = [31, 28, 31, 30]  # one shard per month of a daily series
    with zarr.config.set({"array.rectilinear_chunks": True}):
        t = root.create_array(
            "t",
            shape=(120, 6),
            shards=[days, [6]],
            chunks=(1, 3),
            dtype="f4",
            dimension_names=("time", "x"),
        )
        values = np.arange(720, dtype="f4").reshape(120, 6)
        t[...] = values
        sub = zarr.open_group(LocalStore(path), path="sub", mode="w")
        u = sub.create_array(
            "u", shape=(10,), shards=[[4, 6]], chunks=(2,), dtype="i2", dimension_names=("y",)
        )
        u[...] = np.arange(10)
    ds = xr.open_dataset(path, engine="shardwise", chunks={})
    assert ds["t"].chunks == ((31, 28, 31, 30), (6,))
    np.testing.assert_array_equal(ds["t"].values, values)
    np.testing.assert_array_equal(ds["t"].isel(time=slice(29, 33)).values, values[29:33])
    tree = xr.open_datatree(path, engine="shardwise", chunks={})
    assert tree["sub/u"].chunks == ((4, 6),)
    np.testing.assert_array_equal(tree["sub/u"].values, np.arange(10))
    assert zarr.config.get("array.rectilinear_chunks") is False


def test_inspect_verify_and_shard_map_describe_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a.zarr"
    zarr_written(LocalStore(path), (100, 100), [[60, 40], [50, 50]], (10, 10))
    d = inspect_array(str(path))
    assert d["shard_sizes"] == [[60, 40], [50, 50]]
    assert d["shard_grid"] == [2, 2] and d["shards_stored"] == 4
    print_inspect(d)
    out = capsys.readouterr().out
    assert "shards   rectilinear ([60, 40], [50, 50]): grid (2, 2) = 4 shards" in out
    report = shardwise.verify(path)
    assert report.ok and "4 shards stored" in str(report)
    assert "100 inner chunks decoded" in str(report)
    picture = shard_map(path).picture
    assert [r.state for r in picture.rects] == ["stored"] * 4
    # drawn to scale: the first row of shards 60 of 100 rows high, the second 40
    heights = [r.h for r in picture.rects]
    assert heights[0] / heights[2] == pytest.approx(60 / 40)
    assert any("shards of extents ([60, 40], [50, 50])" in t.text for t in picture.texts)


class Counting(WrapperStore[Any]):
    """Counts the bytes every get hands back."""

    got = 0

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        buf = await self._store.get(key, prototype, byte_range)
        if buf is not None and not key.endswith("zarr.json"):
            Counting.got += len(buf)
        return buf

    async def getsize(self, key: str) -> int:
        return await self._store.getsize(key)  # a stat, not a get


def test_a_small_read_fetches_the_index_and_the_chunks_it_touches(tmp_path: Path) -> None:
    values = zarr_written(LocalStore(tmp_path), (100, 100), [[60, 40], [50, 50]], (10, 10))
    store = Counting(LocalStore(tmp_path))  # through zarr's store API, as a remote store
    Counting.got = 0
    got = shardwise.read_array(store, (slice(62, 68), slice(51, 59)))
    np.testing.assert_array_equal(got, values[62:68, 51:59])
    # shard (1, 1): 4 x 5 inner chunks, its index 20 entries of 16 bytes and a crc32c;
    # one inner chunk of 10 x 10 int32, compressed
    index = 20 * 16 + 4
    assert index < Counting.got <= index + 400 + 64
