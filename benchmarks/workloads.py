"""The benchmark workloads W1, W2, W3: definitions, seeded synthetic sources, dask/xarray inputs.

Each workload is a deterministic synthetic array with realistic compressibility (smooth fields
plus noise, quantized), generated once from a fixed seed into ``$BENCH_SRC`` (default
``/tmp/bench-src``) as ``.npy`` with its blake2b hash next to it. Two sizes:

* ``full`` (the published figures): W1 uint16 1024³ (2.15 GB), W2 float32 2920x361x720
  (3.04 GB), W3 float32 8192² (0.27 GB); the same seeds and recipes as the anchors' reference
  run, so the sources are bit-identical to it.
* ``small`` (a smoke run in seconds): the same recipes and inner/shard proportions on arrays of
  4-34 MB.

The size is chosen by ``BENCH_SIZE`` (``full`` by default) or :func:`set_size`; it is inherited by
the case subprocesses through the environment.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

SRC_DIR = os.environ.get("BENCH_SRC", "/tmp/bench-src")
SEEDS = {"W1": 1001, "W2": 2002, "W3": 3003}
ZSTD_LEVEL = 3

# name, shape, dtype, inner chunks, shard, dims, variable, dask chunks that divide shards ("mis")
# and dask chunks that cross shard boundaries ("cross")
FULL: dict[str, dict[str, Any]] = {
    "W1": dict(
        name="volume",
        shape=(1024, 1024, 1024),
        dtype="uint16",
        inner=(64, 64, 64),
        shard=(256, 256, 256),
        dims=("z", "y", "x"),
        var="volume",
        misaligned=(128, 128, 128),
        cross=(192, 192, 192),
    ),
    "W2": dict(
        name="climate",
        shape=(2920, 361, 720),
        dtype="float32",
        inner=(8, 361, 720),
        shard=(584, 361, 720),
        dims=("time", "lat", "lon"),
        var="t2m",
        misaligned=(292, 361, 720),
        cross=(200, 361, 720),
    ),
    "W3": dict(
        name="tiny chunks",
        shape=(8192, 8192),
        dtype="float32",
        inner=(32, 32),
        shard=(1024, 1024),
        dims=("y", "x"),
        var="field",
        misaligned=(256, 256),
        cross=(768, 768),
    ),
}
SMALL: dict[str, dict[str, Any]] = {
    "W1": {
        **FULL["W1"],
        "shape": (256, 256, 256),
        "inner": (32, 32, 32),
        "shard": (128, 128, 128),
        "misaligned": (64, 64, 64),
        "cross": (96, 96, 96),
    },
    "W2": {
        **FULL["W2"],
        "shape": (320, 91, 180),
        "inner": (8, 91, 180),
        "shard": (64, 91, 180),
        "misaligned": (32, 91, 180),
        "cross": (40, 91, 180),
    },
    "W3": {
        **FULL["W3"],
        "shape": (1024, 1024),
        "inner": (32, 32),
        "shard": (256, 256),
        "misaligned": (128, 128),
        "cross": (192, 192),
    },
}
SIZES = {"full": FULL, "small": SMALL}

SIZE = "full"
WORKLOADS: dict[str, dict[str, Any]] = {}


def set_size(size: str) -> None:
    """Use the ``full`` or ``small`` workloads (in this process and the subprocesses it starts)."""
    global SIZE
    if size not in SIZES:
        raise SystemExit(f"unknown size {size!r}: one of {sorted(SIZES)}")
    SIZE = size
    os.environ["BENCH_SIZE"] = size
    WORKLOADS.clear()
    WORKLOADS.update(SIZES[size])


set_size(os.environ.get("BENCH_SIZE", "full"))


def tag(wl: str) -> str:
    """The workload's name in file names: ``W3`` or ``W3-small``."""
    return wl if SIZE == "full" else f"{wl}-{SIZE}"


# -- synthetic data (deterministic, seeded) ----------------------------------------------------


def _w1_slab(z0: int, z1: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """3 smooth sinusoidal components + Gaussian noise (sigma 3 counts), rounded to uint16."""
    ny, nx = shape[1], shape[2]
    zz = np.arange(z0, z1, dtype=np.float32)[:, None, None]
    yy = np.arange(ny, dtype=np.float32)[None, :, None]
    xx = np.arange(nx, dtype=np.float32)[None, None, :]
    tau = 2 * np.pi
    a = (700.0 * np.sin(tau * zz / 311.0 + 0.5) * np.cos(tau * yy / 257.0)).astype(np.float32)
    b = (500.0 * np.cos(tau * xx / 197.0 + tau * zz / 613.0)).astype(np.float32)
    c = (2000.0 + 300.0 * np.sin(tau * (xx + yy) / 433.0)).astype(np.float32)
    f = rng.standard_normal(size=(z1 - z0, ny, nx), dtype=np.float32)
    f *= 3.0
    f += a
    f += b
    f += c
    np.rint(f, out=f)
    return f.astype(np.uint16)


def w2_coords(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Latitudes from 90 to -90 and longitudes from 0, evenly spaced (0.5° at full size)."""
    nlat, nlon = shape[1], shape[2]
    return np.linspace(90.0, -90.0, nlat), np.arange(nlon) * (360.0 / nlon)


def _w2_block(t0: int, t1: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Temperature-like: latitude profile + seasonal + diurnal cycle + waves + 0.5 K noise,
    quantized to 1/256 K."""
    lat, lon = w2_coords(shape)
    t = np.arange(t0, t1, dtype=np.float32)[:, None, None]
    la = np.deg2rad(lat).astype(np.float32)[None, :, None]
    lo = np.deg2rad(lon).astype(np.float32)[None, None, :]
    tau = 2 * np.pi
    base = (288.0 - 40.0 * np.sin(la) ** 2 + 6.0 * np.cos(3 * lo) * np.cos(la)).astype(np.float32)
    seas = (12.0 * np.sin(la) * np.cos(tau * t / 1460.0)).astype(np.float32)
    diur = (5.0 * np.cos(la) * np.cos(tau * t / 4.0 + lo)).astype(np.float32)
    wave = (3.0 * np.sin(2 * lo + tau * t / 37.0) * np.cos(2 * la)).astype(np.float32)
    f = rng.standard_normal(size=(t1 - t0, shape[1], shape[2]), dtype=np.float32)
    f *= 0.5
    f += base
    f += seas
    f += diur
    f += wave
    f *= 256.0
    np.rint(f, out=f)
    f /= 256.0
    return f


def _w3_field(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """2 smooth components + noise, quantized to 1/256."""
    yy = np.arange(shape[0], dtype=np.float32)[:, None]
    xx = np.arange(shape[1], dtype=np.float32)[None, :]
    tau = 2 * np.pi
    f = rng.standard_normal(size=shape, dtype=np.float32)
    f *= 0.05
    f += (10 * np.sin(tau * yy / 1500.0) * np.cos(tau * xx / 900.0)).astype(np.float32)
    f += (3 * np.cos(tau * (xx - yy) / 333.0)).astype(np.float32)
    f += 20.0
    f *= 256.0
    np.rint(f, out=f)
    f /= 256.0
    return f


def src_path(wl: str) -> str:
    return os.path.join(SRC_DIR, f"{tag(wl)}.npy")


def gen(wl: str) -> dict[str, Any]:
    """Generate the source of ``wl`` (slab by slab, so memory stays bounded) with its hash."""
    W = WORKLOADS[wl]
    shape = tuple(W["shape"])
    os.makedirs(SRC_DIR, exist_ok=True)
    path = src_path(wl)
    tmp = path + ".tmp"
    t0 = time.perf_counter()
    rng = np.random.default_rng(SEEDS[wl])
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=W["dtype"], shape=shape)
    if wl == "W1":
        for z0 in range(0, shape[0], 64):
            z1 = min(z0 + 64, shape[0])
            out[z0:z1] = _w1_slab(z0, z1, shape, rng)
    elif wl == "W2":
        for t0_ in range(0, shape[0], 146):
            t1_ = min(t0_ + 146, shape[0])
            out[t0_:t1_] = _w2_block(t0_, t1_, shape, rng)
    else:
        out[:] = _w3_field(shape, rng)
    out.flush()
    h = hashlib.blake2b(digest_size=16)
    flat = out.reshape(-1).view(np.uint8)
    for i in range(0, flat.size, 1 << 28):
        h.update(flat[i : i + (1 << 28)])
    del out, flat
    os.replace(tmp, path)
    meta = dict(
        workload=wl,
        size=SIZE,
        seed=SEEDS[wl],
        shape=shape,
        dtype=W["dtype"],
        blake2b=h.hexdigest(),
        gen_s=round(time.perf_counter() - t0, 2),
    )
    with open(path + ".json", "w") as f:
        json.dump(meta, f)
    print(json.dumps(meta), flush=True)
    return meta


def load_src(wl: str, mmap: bool = True) -> np.ndarray:
    if not os.path.exists(src_path(wl)):
        gen(wl)
    return np.load(src_path(wl), mmap_mode="r" if mmap else None)


class NpySource:
    """Picklable lazy source: each block is copied out of the page-cached ``.npy`` (memmap).

    The dask source of every dask/xarray case (threads and distributed): the graph stays small
    and workers load their own blocks (about one memcpy from the page cache each).
    """

    def __init__(self, path: str, shape: tuple[int, ...], dtype: Any) -> None:
        self.path = path
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.ndim = len(shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        mm = np.load(self.path, mmap_mode="r")
        return np.array(mm[key])

    def __dask_tokenize__(self) -> tuple[str, str]:
        return ("NpySource", self.path)


def dask_src(wl: str, chunks: tuple[int, ...]) -> Any:
    import dask.array as da

    W = WORKLOADS[wl]
    load_src(wl)  # generated on first use
    src = NpySource(src_path(wl), W["shape"], W["dtype"])
    name = f"src-{tag(wl)}-" + "x".join(map(str, chunks))
    return da.from_array(
        src,
        chunks=chunks,
        lock=False,
        asarray=False,
        inline_array=True,
        name=name,
        meta=np.empty((0,) * len(chunks), dtype=W["dtype"]),
    )


def make_ds(wl: str, chunks: tuple[int, ...]) -> Any:
    """The workload as an xarray Dataset (W2 with time/lat/lon coordinates)."""
    import pandas as pd
    import xarray as xr

    W = WORKLOADS[wl]
    arr = dask_src(wl, chunks)
    coords: dict[str, Any] = {}
    if wl == "W2":
        lat, lon = w2_coords(W["shape"])
        coords = {
            "time": pd.date_range("2000-01-01", periods=W["shape"][0], freq="6h"),
            "lat": ("lat", lat, {"units": "degrees_north"}),
            "lon": ("lon", lon, {"units": "degrees_east"}),
        }
    units = "K" if wl == "W2" else "1"
    return xr.Dataset({W["var"]: (W["dims"], arr, {"units": units})}, coords=coords)


def shard_slices(W: dict[str, Any]) -> Iterator[tuple[slice, ...]]:
    shape, shard = W["shape"], W["shard"]
    grid = [range(0, s, c) for s, c in zip(shape, shard, strict=True)]
    for starts in itertools.product(*grid):
        yield tuple(
            slice(s0, min(s0 + c, s)) for s0, c, s in zip(starts, shard, shape, strict=True)
        )


def inner_slices_shard_order(
    W: dict[str, Any],
) -> Iterator[tuple[tuple[slice, ...], list[tuple[slice, ...]]]]:
    """Inner chunk slices grouped by shard (shard-major, C order inside a shard)."""
    inner = W["inner"]
    for ssl in shard_slices(W):
        grid = [range(s.start, s.stop, c) for s, c in zip(ssl, inner, strict=True)]
        chunks = [
            tuple(
                slice(s0, min(s0 + c, s.stop)) for s0, c, s in zip(starts, inner, ssl, strict=True)
            )
            for starts in itertools.product(*grid)
        ]
        yield ssl, chunks
