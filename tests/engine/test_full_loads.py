"""Full loads through every door read each array once, straight into one output.

``xr.open_dataset(p, engine="shardwise", chunks={})`` builds plain dask arrays (one getter task
per shard); ``shardwise.engine.whole`` rewrites the graph of a whole load of one into one read.
What a door did is seen where the data is read: every read of the xarray engine's backend array
and of open_array's view is recorded (the real methods run): a whole load is one read of the
whole array, the block graph one read per shard. Values are compared with xarray's own ``zarr``
engine. Slices and reductions keep their block tasks (and a slice reads a small part of a shard:
``rchar``). Under a dask callback (a progress bar) the graph keeps its tasks. Peak memory of a
full load is measured in a fresh process (``memkit.peak_rss``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import xarray as xr
from dask.callbacks import Callback

import shardwise
from memkit import MiB, peak_rss, smooth
from shardwise.engine.lazy import ShardView
from shardwise.xarray.backend import ShardwiseBackendArray

SHAPE, SHARDS = (256, 384), {"y": 64, "x": 96}  # 4 x 4 shards per variable
NSHARDS = 16


def dataset() -> xr.Dataset:
    rng = np.random.default_rng(21)
    a = rng.normal(size=SHAPE).astype("float32")
    b = rng.integers(-1000, 1000, size=SHAPE).astype("int16")
    return xr.Dataset({"a": (("y", "x"), a), "b": (("y", "x"), b)})


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("loads") / "d.zarr")
    inner = {"chunks": (16, 24)}  # 16 inner chunks per shard
    shardwise.to_zarr(dataset(), path, shards=SHARDS, encoding={"a": inner, "b": inner})
    return path


@pytest.fixture(scope="module")
def expected(root: str) -> xr.Dataset:
    with xr.open_dataset(root, engine="zarr") as ds:
        return ds.load()


def opened(root: str) -> xr.Dataset:
    return xr.open_dataset(root, engine="shardwise", chunks={})


class Reads(list[bool]):
    """One entry per read of a shardwise array: True when it read the whole array."""

    @property
    def wholes(self) -> int:
        return sum(self)

    @property
    def parts(self) -> int:
        return len(self) - self.wholes


def _is_whole(key: tuple[Any, ...], shape: tuple[int, ...]) -> bool:
    return all(
        isinstance(k, slice) and range(n)[k] == range(n) for k, n in zip(key, shape, strict=True)
    )


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    """Records every read the backend array (xarray engine) and open_array's view serve."""
    seen = Reads()
    basic, view = ShardwiseBackendArray._basic, ShardView.__getitem__

    def read_basic(self: ShardwiseBackendArray, key: tuple[Any, ...]) -> Any:
        seen.append(_is_whole(key, self.shape))
        return basic(self, key)

    def read_view(self: ShardView, key: tuple[Any, ...]) -> Any:
        seen.append(_is_whole(key + (slice(None),) * (self.ndim - len(key)), self.shape))
        return view(self, key)

    monkeypatch.setattr(ShardwiseBackendArray, "_basic", read_basic)
    monkeypatch.setattr(ShardView, "__getitem__", read_view)
    return seen


# door -> (what it computes from a freshly opened dataset, as {variable: values}; arrays loaded)
DOORS: dict[str, tuple[Callable[[xr.Dataset], dict[str, Any]], int]] = {
    "Dataset.load": (lambda ds: {k: v.values for k, v in ds.load().items()}, 2),
    "Dataset.compute": (lambda ds: {k: v.values for k, v in ds.compute().items()}, 2),
    "values": (lambda ds: {"a": ds.a.values}, 1),
    "np.asarray": (lambda ds: {"b": np.asarray(ds.b)}, 1),
    "DataArray.load": (lambda ds: {"a": ds.a.load().values}, 1),
    "DataArray.compute": (lambda ds: {"b": ds.b.compute().values}, 1),
    "dask.compute of two": (
        lambda ds: dict(zip("ab", dask.compute(ds.a.data, ds.b.data), strict=True)),
        2,
    ),
    "dask.compute of two DataArrays": (
        lambda ds: {k: v.values for k, v in zip("ab", dask.compute(ds.a, ds.b), strict=True)},
        2,
    ),
}


@pytest.mark.parametrize("door", list(DOORS))
@pytest.mark.parametrize("scheduler", ["threads", "sync"])
def test_every_door_reads_each_array_whole_once(
    root: str, expected: xr.Dataset, reads: Reads, door: str, scheduler: str
) -> None:
    compute, arrays = DOORS[door]
    ds = opened(root)
    assert all(ds[k].chunks for k in "ab")  # lazy: dask arrays of one chunk per shard
    assert ds.a.data.npartitions == NSHARDS
    with dask.config.set(scheduler=scheduler):
        got = compute(ds)
    for name, values in got.items():
        assert isinstance(values, np.ndarray) and values.dtype == expected[name].dtype
        np.testing.assert_array_equal(values, expected[name].values, err_msg=name)
    # one read of each whole array, no block read: nothing for dask to concatenate
    assert reads.wholes == arrays and reads.parts == 0, reads


def test_open_array_of_two_arrays_in_one_compute_reads_each_whole(
    root: str, expected: xr.Dataset, reads: Reads
) -> None:
    """dask.compute of two open_array arrays (not their own compute(), which reads directly)."""
    a = shardwise.open_array(root, path="a")
    b = shardwise.open_array(root, path="b")
    ga, gb = dask.compute(a, b)
    np.testing.assert_array_equal(ga, expected.a.values)
    np.testing.assert_array_equal(gb, expected.b.values)
    assert reads.wholes == 2 and reads.parts == 0, reads


def test_a_whole_read_through_xarray_postcompute_is_handed_over_once(
    root: str, expected: xr.Dataset
) -> None:
    """dask.compute of a DataArray: the one output becomes the result without a copy (dask's
    finalize asks for one); a copy the caller then asks for is a copy."""
    from shardwise.engine.whole import Fresh

    (got,) = dask.compute(opened(root).a)
    values = got.values
    assert type(values) is np.ndarray and not isinstance(values, Fresh)
    assert not values.flags.owndata and isinstance(values.base, np.ndarray)  # a view of it
    mine = values.copy()
    mine[0, 0] += 1
    assert values[0, 0] == expected.a.values[0, 0]
    fresh = np.zeros(3).view(Fresh)
    assert np.shares_memory(fresh.copy(), fresh) and not np.shares_memory(fresh.copy(), fresh)


# -- what stays lazy and per shard ----------------------------------------------------------------


def rchar() -> int:
    """Bytes this process has passed through read()/preadv() so far."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar")).split()[1])


def test_slices_and_reductions_keep_their_shard_tasks(
    root: str, expected: xr.Dataset, reads: Reads
) -> None:
    ds = opened(root)
    window = np.s_[70:75, 100:110]  # inside one shard
    _ = ds.a[window].values  # warm-up: imports and first uses out of the count
    reads.clear()
    before = rchar()
    got = ds.a[window].values
    used = rchar() - before
    np.testing.assert_array_equal(got, expected.a.values[window])
    assert reads == [False], reads  # one read, of the window (dask fuses getitem into the getter)
    assert used < 64 * 96 * 4 / 4, used  # one inner chunk and the index, not the shard

    reads.clear()
    total = ds.a.sum().values
    assert total == pytest.approx(expected.a.values.sum(dtype="f8"), rel=1e-5)
    assert reads.parts == NSHARDS and reads.wholes == 0, reads  # a read per shard

    # the array and something derived from its blocks, in one compute: the blocks serve both
    reads.clear()
    whole, mean = dask.compute(ds.b.data, ds.b.data.mean())
    np.testing.assert_array_equal(whole, expected.b.values)
    assert mean == pytest.approx(expected.b.values.mean())
    assert reads.parts == NSHARDS and reads.wholes == 0, reads


class Ran(Callback):  # type: ignore[misc]
    """A callback, as a progress bar is: it counts the tasks dask runs."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks = 0

    def _pretask(self, key: Any, dsk: Any, state: Any) -> None:
        self.tasks += 1


def test_progress_bars_and_a_configured_optimization_see_the_block_graph(
    root: str, expected: xr.Dataset, reads: Reads
) -> None:
    """Under a dask callback the full load runs its block tasks (a progress bar counts them);
    a user's own ``array_optimize`` is left alone (the block graph runs)."""
    from dask.array.optimization import optimize

    ds = opened(root)
    with Ran() as ran:
        got = ds.a.values
    np.testing.assert_array_equal(got, expected.a.values)
    assert ran.tasks >= NSHARDS and reads.parts == NSHARDS and reads.wholes == 0, reads
    reads.clear()
    with dask.config.set(array_optimize=optimize):
        got = opened(root).b.values
    np.testing.assert_array_equal(got, expected.b.values)
    assert reads.parts == NSHARDS and reads.wholes == 0, reads


# -- a cluster ------------------------------------------------------------------------------------


def test_full_loads_on_a_cluster(root: str, expected: xr.Dataset, client: Any) -> None:
    """Default client: the per-shard graph runs on the workers. Computed on a client that is
    not the default: the rewritten graph runs there. Both give the stored values."""
    with dask.config.set(scheduler=client):
        ds = opened(root).load()
        both = dask.compute(opened(root).a.data, opened(root).b.data)
    for name, values in zip("ab", both, strict=True):
        np.testing.assert_array_equal(values, expected[name].values)
        np.testing.assert_array_equal(ds[name].values, expected[name].values)
    got = client.compute(opened(root).b.data).result()
    np.testing.assert_array_equal(got, expected.b.values)


# -- memory ---------------------------------------------------------------------------------------

MEM_SHAPE = (4096, 4096)  # 32 MiB of uint16
# beyond the 32 MiB output: per decoding thread (2) a group of inner chunks' stored and decoded
# bytes (about 1 MiB each), shard indexes, zstd contexts, the threads' malloc arenas. The block
# graph would hold the 16 blocks (32 MiB) and then their concatenation (32 MiB more).
FIXED = 10 * MiB


def load_case(root: str, door: str) -> Any:
    ds = xr.open_dataset(root, engine="shardwise", chunks={}, threads=2)
    if door == "values":
        return lambda: ds.v.values
    if door == "dask.compute":  # of a DataArray: xarray's postcompute, not dask's finalize
        # a first compute imports what dask loads lazily (the dask-array package's modules,
        # where it is installed: a few MiB): before the measured load, as no part of it
        dask.compute(xr.DataArray(np.zeros(2)).chunk(1))
        return lambda: dask.compute(ds.v)[0].values
    return lambda: ds.load().v.values


@pytest.mark.parametrize("door", ["values", "load", "dask.compute"])
def test_a_full_load_holds_about_its_output(tmp_path: Path, door: str) -> None:
    x = smooth(MEM_SHAPE)
    root = str(tmp_path / "m.zarr")
    ds = xr.Dataset({"v": (("y", "x"), x)})
    shardwise.to_zarr(
        ds, root, shards={"y": 1024, "x": 1024}, encoding={"v": {"chunks": (128, 128)}}
    )
    got = peak_rss(load_case, root=root, door=door)
    assert got.digest == {"shape": list(MEM_SHAPE), "sum": float(x.sum(dtype="f8"))}
    assert got.peak <= x.nbytes + FIXED, (got.mib, x.nbytes // MiB)


# -- the benchmark --------------------------------------------------------------------------------


def test_full_loads_benchmark_runs_small_in_fresh_processes(tmp_path: Path) -> None:
    """benchmarks/full_loads.py: gen, a run of a few doors (each in a fresh process) and the
    report; every case loads the source's values."""
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "full_loads.py"
    env = {**os.environ, "BENCH_SRC": str(tmp_path / "src")}
    env.pop("BENCH_SIZE", None)
    common = ["--small", "--dir", str(tmp_path / "data"), "--workloads", "W3"]
    out = tmp_path / "loads.jsonl"
    cases = "ts,ts-2,values,dask.compute-2,blocks"
    for args in (
        ["gen", *common],
        ["run", *common, "--reps", "1", "--cases", cases, "--out", str(out)],
        ["report", str(out)],
    ):
        got = subprocess.run(
            [sys.executable, str(script), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    assert sorted(r["case"] for r in rows) == sorted(cases.split(","))
    assert all(r["ok"] and r["wl"] == "W3" and r["s_whole"] > r["s_in"] > 0 for r in rows), rows
    assert "| W3 | dask.compute-2 | 1 |" in got.stdout
