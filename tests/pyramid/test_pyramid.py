"""``shardwise.write_pyramid``: every level against an independent reduction (xarray's
``coarsen``, exact integer sums, loops), read back by zarr-python, tensorstore, ngff-zarr and
ome-zarr-py, OME-Zarr 0.5 metadata validated by ome-zarr-models; the source read once, one
task per shard per level, resume after a failure mid-pyramid, refusals that change nothing."""

from __future__ import annotations

import collections
import itertools
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.storage import MemoryStore

import shardwise
from faultkit import (
    BUCKET,
    MotoS3,
    files,
    forkserver,
    hold_block,
    moto_s3,
    snapshot,
    temp_files,
    unique,
    wait_until,
)
from shardwise.errors import ArrayExistsError, InvalidTypeError, InvalidValueError, ShardwiseError


def coarsened(x: np.ndarray, factors: tuple[int, ...], k: int) -> np.ndarray:
    """Level ``k`` by xarray: ``coarsen(boundary="pad").mean()`` level after level (pads with
    NaN and skips it: the mean over the samples present, the ceil rule), each level back in
    the data's dtype (integers rounded to nearest, halves to even)."""
    a = xr.DataArray(x, dims=[f"d{i}" for i in range(x.ndim)])
    for _ in range(k):
        windows = {d: f for d, f, n in zip(a.dims, factors, a.shape, strict=True) if n > 1}
        a = a.astype("f8").coarsen(windows, boundary="pad").mean()  # type: ignore[arg-type]
        # each level is stored in the data's dtype, and the next reduced from it
        a = np.rint(a).astype(x.dtype) if x.dtype.kind in "iu" else a.astype(x.dtype)
    return np.asarray(a.values)


def exact_mean(x: np.ndarray, factors: tuple[int, ...]) -> np.ndarray:
    """One level by Python integers: every block's exact sum, rounded half to even."""
    shape = tuple(-(-n // f) for n, f in zip(x.shape, factors, strict=True))
    out = np.empty(shape, dtype=x.dtype)
    for idx in np.ndindex(*shape):
        block = x[tuple(slice(i * f, (i + 1) * f) for i, f in zip(idx, factors, strict=True))]
        q, r = divmod(sum(int(v) for v in block.ravel()), block.size)
        out[idx] = q + (2 * r > block.size or (2 * r == block.size and q % 2 == 1))
    return out


def block_mode(x: np.ndarray, factors: tuple[int, ...]) -> np.ndarray:
    """One level by counting: each block's most frequent value, the smallest on ties."""
    shape = tuple(-(-n // f) for n, f in zip(x.shape, factors, strict=True))
    out = np.empty(shape, dtype=x.dtype)
    for idx in np.ndindex(*shape):
        block = x[tuple(slice(i * f, (i + 1) * f) for i, f in zip(idx, factors, strict=True))]
        counts = collections.Counter(block.ravel().tolist())
        out[idx] = min(counts, key=lambda v: (-counts[v], v))
    return out


def levels_of(root: Any, n: int, path: str = "") -> list[np.ndarray]:
    """Levels 0 to n - 1 as zarr-python reads them."""
    return [
        np.asarray(zarr.open_array(root, path=f"{path}/{k}".lstrip("/"), mode="r")[...])
        for k in range(n)
    ]


def shard_keys(root: Path) -> list[str]:
    """The shard objects of every level (names only: a writer may be busy there; not their
    journal records, staged pieces or temp files)."""
    found = (p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    return sorted(
        k for k in found if "/c/" in k and ".shardwise" not in k and not k.endswith(".partial")
    )


def multiscale(root: Any) -> dict[str, Any]:
    ms: dict[str, Any] = zarr.open_group(root, mode="r").attrs["ome"]["multiscales"][0]
    return ms


CASES = {
    # shape, dims, dask chunks (splitting the shards), factors, chunks, shards
    "2d-odd": ((301, 203), ("y", "x"), (47, 33), (2, 2), (32, 32), (64, 64)),
    "3d-odd": ((37, 50, 61), ("z", "y", "x"), (10, 13, 17), (2, 2, 2), (8, 8, 8), (16, 16, 32)),
    "5d-tczyx": ((2, 3, 9, 21, 17), ("t", "c", "z", "y", "x"), (1, 2, 4, 8, 5), 2, 4, 8),
    "2d-factor-3": ((100, 80), ("y", "x"), (30, 30), (3, 3), (16, 16), (32, 32)),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("dtype", ["float32", "uint16"])
def test_every_level_equals_xarray_coarsen(
    tmp_path: Path, case: str, dtype: str, read_tensorstore: Any
) -> None:
    shape, dims, dchunks, factors, chunks, shards = CASES[case]
    rng = np.random.default_rng(7)
    x = (rng.random(shape) * 60000).astype(dtype)
    root = tmp_path / "p.zarr"
    report = shardwise.write_pyramid(
        da.from_array(x, chunks=dchunks), root, levels=4, factors=factors, dims=dims,
        chunks=chunks, shards=shards,
    )  # fmt: skip
    per_axis = factors if isinstance(factors, tuple) else tuple(
        factors if d in "zyx" else 1 for d in dims
    )  # fmt: skip
    stored = levels_of(root, 4)
    for k, got in enumerate(stored):
        want = coarsened(x, per_axis, k)
        assert got.shape == want.shape
        if dtype == "float32":
            np.testing.assert_allclose(got, want, rtol=1e-6)
        else:
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(read_tensorstore(root / str(k)), got)
        np.testing.assert_array_equal(shardwise.read_array(root, path=str(k)), got)
    assert len(multiscale(root)["datasets"]) == 4
    assert not (root / "4").exists()
    shard_files = shard_keys(root)
    assert report.shards_written == len(shard_files)
    assert sorted(report.keys) == sorted(shard_files)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16", "int32", "uint64", "int64"])
def test_integer_means_are_exact_at_the_extremes(dtype: str) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    # the extremes, and values near them, in odd shapes (partial edge blocks)
    extremes = np.array([info.max, info.max - 1, info.min, info.min + 1], dtype=dtype)
    x = extremes[rng.integers(0, 4, size=(13, 11))]
    store = MemoryStore()
    shardwise.write_pyramid(x, store, levels=3, chunks=(4, 4), shards=(8, 8))
    level = x
    for k, got in enumerate(levels_of(store, 3)):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, level, err_msg=f"level {k}")
        level = exact_mean(level, (2, 2))
    full = np.full((9, 7), info.max, dtype=dtype)  # a sum far past the dtype's range
    shardwise.write_pyramid(full, store, path="full", levels=3, chunks=(2, 2), shards=(4, 4))
    for got in levels_of(store, 3, "full"):
        assert (got == info.max).all()


def test_nearest_and_mode_keep_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 4, size=(45, 38)).astype("uint32")
    src = da.from_array(labels, chunks=(10, 9))
    shardwise.write_pyramid(src, tmp_path / "n", levels=4, method="nearest", chunks=8, shards=16)
    shardwise.write_pyramid(src, tmp_path / "m", levels=4, method="mode", chunks=8, shards=16)
    mode = labels
    for k, (near, got) in enumerate(
        zip(levels_of(tmp_path / "n", 4), levels_of(tmp_path / "m", 4), strict=True)
    ):
        np.testing.assert_array_equal(near, labels[:: 2**k, :: 2**k])
        np.testing.assert_array_equal(got, mode, err_msg=f"level {k}")
        assert set(np.unique(got)) <= {0, 1, 2, 3}
        mode = block_mode(mode, (2, 2))
    # nearest takes a block's first sample: its translation stays; mode's centre moves
    near_t = [d["coordinateTransformations"][1] for d in multiscale(tmp_path / "n")["datasets"]]
    mode_t = [d["coordinateTransformations"][1] for d in multiscale(tmp_path / "m")["datasets"]]
    assert near_t[3]["translation"] == [0.0, 0.0]
    assert mode_t[3]["translation"] == [3.5, 3.5]


class CountingSource:
    """A dask array whose blocks count how often each is computed."""

    def __init__(self, x: np.ndarray, chunks: tuple[int, ...]) -> None:
        self.x = x
        self.calls: collections.Counter[tuple[int, ...]] = collections.Counter()
        self.lock = threading.Lock()
        self.array = da.map_blocks(
            self._block, chunks=da.core.normalize_chunks(chunks, x.shape), dtype=x.dtype
        )

    def _block(self, block_info: Any = None) -> np.ndarray:
        loc = block_info[None]["array-location"]
        with self.lock:
            self.calls[tuple(block_info[None]["chunk-location"])] += 1
        return self.x[tuple(slice(a, b) for a, b in loc)].copy()


@pytest.mark.parametrize("strategy", ["auto", "direct", "staged"])
def test_source_read_once_and_one_task_per_shard_per_level(tmp_path: Path, strategy: str) -> None:
    x = np.random.default_rng(1).random((200, 150)).astype("f4")
    src = CountingSource(x, (30, 40))
    root = tmp_path / "p.zarr"
    kw: dict[str, Any] = dict(levels=4, chunks=16, shards=64, strategy=strategy)
    delayed = shardwise.write_pyramid(src.array, root, compute=False, **kw)
    assert not src.calls and "ome" not in zarr.open_group(root, mode="r").attrs
    # the graph: shard tasks named shardwise-write-<token>, one name per level
    keys = [k for k in dict(delayed.dask) if isinstance(k, tuple)]
    per_level = collections.Counter(k[0] for k in keys if k[0].startswith("shardwise-write-"))
    shapes = [(200, 150), (100, 75), (50, 38), (25, 19)]
    expected = [-(-a // 64) * -(-b // 64) for a, b in shapes]
    assert sorted(per_level.values()) == sorted(expected)
    # auto: level 0 as write_array writes the same source on threads (its dask blocks are
    # not the shard pieces, and direct tasks fit the budget: direct), the reduced levels
    # direct (their shard tasks fit the memory budget)
    staged = {k[0] for k in keys if k[0].startswith("shardwise-stage-")}
    assert len(staged) == {"auto": 0, "direct": 0, "staged": 4}[strategy]
    with dask.config.set(scheduler="threads", num_workers=4):
        report = delayed.compute()
    # every block of the source computed exactly once, for all four levels
    assert src.calls == {loc: 1 for loc in itertools.product(range(7), range(4))}
    assert report.shards_written == sum(expected)
    for k, got in enumerate(levels_of(root, 4)):
        np.testing.assert_allclose(got, coarsened(x, (2, 2), k), rtol=1e-6)


def test_ome_metadata_validates_and_the_ecosystem_reads_every_level(tmp_path: Path) -> None:
    from ngff_zarr import from_ngff_zarr
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader
    from ome_zarr_models.v05.image import Image

    x = np.random.default_rng(2).integers(0, 4000, size=(2, 17, 45, 33)).astype("uint16")
    image = xr.DataArray(x, dims=("c", "z", "y", "x"))
    root = tmp_path / "img.zarr"
    shardwise.write_pyramid(
        image, root, levels=3, chunks=(1, 8, 16, 16), shards=(1, 16, 32, 32),
        scale={"z": 2.0, "y": 0.5, "x": 0.5}, translation={"z": 10.0},
        units={"z": "micrometer", "y": "micrometer", "x": "micrometer"}, name="cells",
    )  # fmt: skip
    model = Image.from_zarr(zarr.open_group(root, mode="r"))
    ms = model.attributes.ome.multiscales[0]
    assert [a.type for a in ms.axes] == ["channel", "space", "space", "space"]
    assert [d.path for d in ms.datasets] == ["0", "1", "2"]
    stored = levels_of(root, 3)
    ngff = from_ngff_zarr(str(root))
    for k, img in enumerate(ngff.images):
        f = 2**k
        assert img.dims == ("c", "z", "y", "x")
        assert img.scale == {"c": 1.0, "z": 2.0 * f, "y": 0.5 * f, "x": 0.5 * f}
        want_t = {"c": 0.0, "z": 10.0 + (f - 1), "y": 0.25 * (f - 1), "x": 0.25 * (f - 1)}
        assert img.translation == want_t
        assert img.axes_units["x"] == "micrometer"
        np.testing.assert_array_equal(np.asarray(img.data), stored[k])
    nodes = list(Reader(parse_url(str(root)))())
    assert len(nodes[0].data) == 3
    for k, level in enumerate(nodes[0].data):
        np.testing.assert_array_equal(np.asarray(level), stored[k])
    transforms = nodes[0].metadata["coordinateTransformations"]
    assert transforms[2][0] == {"type": "scale", "scale": [1.0, 8.0, 2.0, 2.0]}
    for k in range(3):  # the channel axis is never reduced
        assert stored[k].shape[0] == 2
        np.testing.assert_array_equal(stored[k], coarsened(x, (1, 2, 2, 2), k))


def test_a_dataset_of_one_variable_and_auto_levels(tmp_path: Path) -> None:
    x = np.random.default_rng(4).random((130, 70)).astype("f4")
    ds = xr.Dataset({"image": (("y", "x"), x)})
    report = shardwise.write_pyramid(ds, tmp_path / "p", chunks=(32, 32), shards=(64, 64))
    # auto: until every space axis fits one inner chunk: 130 -> 65 -> 33 -> 17
    paths = [d["path"] for d in multiscale(tmp_path / "p")["datasets"]]
    assert paths == ["0", "1", "2", "3"]
    assert zarr.open_array(tmp_path / "p", path="3").shape == (17, 9)
    assert report.shards_written == 6 + 2 + 1 + 1
    two = xr.Dataset({"a": ("x", [1.0]), "b": ("x", [2.0])})
    # several variables are one image each (test_pyramid_images.py): here not images at all
    with pytest.raises(InvalidValueError, match=r"data variable 'a': dims must be"):
        shardwise.write_pyramid(two, tmp_path / "q")
    assert not (tmp_path / "q").exists()


def failing(x: np.ndarray, chunks: tuple[int, ...], bad: tuple[int, ...], ready: Any = None) -> Any:
    """``x`` as dask whose block ``bad`` raises, once ``ready()`` holds (the state to fail in:
    e.g. every shard not waiting for that block stored)."""

    def f(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        if tuple(block_info[0]["chunk-location"]) == bad:
            if ready is not None:
                wait_until(ready, "the shards before the failure stored", 300)
            raise RuntimeError("interrupted")
        return block

    return da.from_array(x, chunks=chunks).map_blocks(f, dtype=x.dtype)


def test_resume_after_a_failure_mid_pyramid_rewrites_no_finished_shard(tmp_path: Path) -> None:
    x = np.random.default_rng(6).random((256, 192)).astype("f4")
    kw: dict[str, Any] = dict(levels=3, chunks=16, shards=64)
    reference = tmp_path / "ref.zarr"
    shardwise.write_pyramid(x, reference, **kw)
    root = tmp_path / "p.zarr"
    # every shard not waiting for the failing block: 11 of level 0, 3 of level 1, none of 2
    ready = lambda: len(shard_keys(root)) >= 14  # noqa: E731
    threads = dask.config.set(scheduler="threads", num_workers=4)
    with threads, pytest.raises(RuntimeError, match="interr"):
        shardwise.write_pyramid(failing(x, (64, 64), (3, 2), ready), root, **kw)
    done = {k: (root / k).stat().st_ino for k in shard_keys(root)}
    assert {k.split("/")[0] for k in done} == {"0", "1"} and len(done) == 14
    # an interrupted pyramid is not advertised as one: no multiscales yet
    assert "ome" not in zarr.open_group(root, mode="r").attrs
    with pytest.raises(ArrayExistsError):
        shardwise.write_pyramid(x, root, **kw)  # "w-" without resume refuses it
    report = shardwise.write_pyramid(x, root, resume=True, **kw)
    assert report.shards_skipped == len(done)
    assert {k: (root / k).stat().st_ino for k in done} == done  # none written again
    journal_free = {k: v for k, v in files(root).items() if ".shardwise" not in k}
    assert journal_free == {k: v for k, v in files(reference).items() if ".shardwise" not in k}
    for k in range(3):
        assert shardwise.verify(root, path=str(k)).ok


KILL_KW: dict[str, Any] = dict(levels=3, chunks=16, shards=64)
KILL_HOLD = (3, 2)  # the source block of level 0's last shard: held until the writer is killed


def kill_data() -> np.ndarray:
    return np.random.default_rng(8).random((256, 192)).astype("f4")


def kill_pyramid(root: str, started: Any) -> None:
    """The writer that gets SIGKILLed: a pyramid whose held source block keeps it from ever
    finishing (every other shard task can run: threads enough)."""
    src = da.from_array(kill_data(), chunks=(64, 64))
    src = src.map_blocks(hold_block, KILL_HOLD, dtype=src.dtype, meta=src._meta)
    started.set()
    with dask.config.set(scheduler="threads", num_workers=4):
        shardwise.write_pyramid(src, root, **KILL_KW)


def test_a_killed_pyramid_resumes_without_rewriting_a_finished_shard(tmp_path: Path) -> None:
    reference = tmp_path / "ref.zarr"
    shardwise.write_pyramid(kill_data(), reference, **KILL_KW)
    root = tmp_path / "p.zarr"
    ctx = forkserver()
    started = ctx.Event()
    p = ctx.Process(target=kill_pyramid, args=(str(root), started))
    p.start()
    assert started.wait(120)
    # every shard not waiting for the held block: 11 of level 0, 3 of level 1, none of level 2
    wait_until(lambda: len(shard_keys(root)) >= 14, "14 shards of two levels stored", 300)
    p.kill()
    p.join(120)
    assert p.exitcode == -signal.SIGKILL
    done = {k: (root / k).stat().st_ino for k in shard_keys(root)}
    assert {k.split("/")[0] for k in done} == {"0", "1"}
    # resume takes over the lease of the writer that is gone
    report = shardwise.write_pyramid(kill_data(), root, resume=True, **KILL_KW)
    assert report.shards_skipped == len(done) == 14
    assert {k: (root / k).stat().st_ino for k in done} == done
    assert temp_files(root) == []
    journal_free = {k: v for k, v in files(root).items() if ".shardwise" not in k}
    assert journal_free == {k: v for k, v in files(reference).items() if ".shardwise" not in k}


def test_mode_w_replaces_a_larger_pyramid(tmp_path: Path) -> None:
    root = tmp_path / "p"
    x = np.arange(64 * 64, dtype="u2").reshape(64, 64)
    shardwise.write_pyramid(x, root, levels=4, chunks=8, shards=16)
    shardwise.write_pyramid(x[:40, :40], root, levels=2, chunks=8, shards=16, mode="w")
    assert [d["path"] for d in multiscale(root)["datasets"]] == ["0", "1"]
    assert not (root / "2").exists() and not (root / "3").exists()
    np.testing.assert_array_equal(levels_of(root, 1)[0], x[:40, :40])


BAD: list[tuple[dict[str, Any], type, str]] = [
    (dict(factors=0), InvalidValueError, "factors must be a positive integer"),
    (dict(factors=1), InvalidValueError, "nothing reduces"),
    (dict(factors={"t": 2}), InvalidValueError, "not space axes"),
    (dict(factors="2"), InvalidTypeError, "factors must be a positive integer"),
    (dict(levels=0), InvalidValueError, "levels must be a positive integer"),
    (dict(levels=33), InvalidValueError, "'auto' or 1 to 32"),
    (dict(levels="all"), InvalidValueError, "levels must be one of 'auto'"),
    (dict(method="max"), InvalidValueError, "method must be one of 'mean', 'nearest', 'mode'"),
    (dict(dims=("x", "y")), InvalidValueError, "dims must be names among"),
    (dict(dims=("y", "x", "z")), InvalidValueError, "each of the data's 2 axes"),
    (dict(mode="a"), InvalidValueError, "mode must be one of 'w-', 'w'"),
    (dict(scale={"x": -1.0}), InvalidValueError, "scale['x'] must be a positive number"),
    (dict(units={"q": "m"}), InvalidValueError, "units names ['q']"),
    (dict(chunks=(8,)), InvalidValueError, "chunks must be"),
    (dict(compressors="zstd"), InvalidTypeError, "compressors='zstd'"),
    (dict(memory_limit="lots"), InvalidValueError, "memory_limit"),
    (dict(memory_limit=1000), shardwise.PlanError, "level 0"),
    (dict(resume="yes"), InvalidTypeError, "resume must be True or False"),
    (dict(path="p"), ArrayExistsError, "level 0 of the pyramid"),
]


@pytest.mark.parametrize("kw,error,words", BAD, ids=[str(k)[:40] for k, _, _ in BAD])
def test_a_refused_call_leaves_the_store_byte_identical(
    tmp_path: Path, kw: dict[str, Any], error: type, words: str
) -> None:
    x = np.arange(40 * 30, dtype="f4").reshape(40, 30)
    shardwise.write_pyramid(x, tmp_path, path="p", levels=2, chunks=8, shards=16)
    before = snapshot(tmp_path)
    target = kw.pop("path", "new")
    with pytest.raises(error, match=None) as caught:
        shardwise.write_pyramid(x, tmp_path, path=target, **{"levels": 2, **kw})
    assert isinstance(caught.value, ShardwiseError)
    assert words in str(caught.value), str(caught.value)
    assert snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


def test_a_pyramid_on_s3_resumes_and_reads_back(s3: MotoS3) -> None:
    x = np.random.default_rng(9).integers(0, 60000, (150, 130)).astype("u2")
    kw: dict[str, Any] = dict(levels=3, chunks=16, shards=32)
    prefix = unique()
    store = s3.obstore(prefix)

    def stored() -> int:  # shard objects of every level (names only)
        page = s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")
        keys = [o["Key"] for o in page.get("Contents", [])]
        return sum("/c/" in k and ".shardwise" not in k for k in keys)

    threads = dask.config.set(scheduler="threads", num_workers=4)
    with threads, pytest.raises(RuntimeError, match="interr"):
        # block (2, 1) feeds 6 of level 0's 25 shards: fail once 10 shards are stored
        shardwise.write_pyramid(failing(x, (50, 65), (2, 1), lambda: stored() >= 10), store, **kw)
    report = shardwise.write_pyramid(da.from_array(x, chunks=(50, 65)), store, resume=True, **kw)
    assert report.shards_skipped >= 10
    assert report.shards_written + report.shards_skipped == 5 * 5 + 3 * 3 + 2 * 2
    for k, got in enumerate(levels_of(store, 3)):
        np.testing.assert_array_equal(got, coarsened(x, (2, 2), k))
    assert [d["path"] for d in multiscale(store)["datasets"]] == ["0", "1", "2"]


def test_compute_false_writes_the_numpy_array_as_it_was_when_called() -> None:
    x = np.arange(90 * 70, dtype="f4").reshape(90, 70)
    store = MemoryStore()
    delayed = shardwise.write_pyramid(x, store, levels=2, chunks=16, shards=32, compute=False)
    want = x.copy()
    x[:] = -1  # changed after the call, before the compute: not seen
    report = delayed.compute()
    assert report.shards_written == 3 * 3 + 2 * 2
    np.testing.assert_array_equal(levels_of(store, 1)[0], want)
    assert [d["path"] for d in multiscale(store)["datasets"]] == ["0", "1"]
