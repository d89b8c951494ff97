"""Pyramids follow their level 0 (``shardwise.update_pyramid``): after any sequence of region
writes into level 0, each followed by ``update_pyramid`` over its region, every level equals
``write_pyramid`` of the updated level 0 written fresh (each method, odd shapes, regions
drawn by hypothesis); writers in two processes updating their own regions of one shard lose
nothing, their commits made to collide; what is not a pyramid is refused."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardwise
from faultkit import forkserver

SHAPE = (45, 38)
KW: dict[str, Any] = dict(levels=4, dims=("y", "x"), chunks=(4, 4), shards=(8, 12))


def levels(root: Any) -> list[np.ndarray]:
    return [shardwise.read_array(root, path=str(k)) for k in range(KW["levels"])]


def fresh(values: np.ndarray, method: str) -> list[np.ndarray]:
    with tempfile.TemporaryDirectory(prefix="fresh-") as tmp:
        root = Path(tmp) / "p.zarr"
        shardwise.write_pyramid(values, root, method=method, **KW)
        return levels(root)


def region_of(draw: Any) -> tuple[slice, slice]:
    out = []
    for n in SHAPE:
        a = draw(st.integers(0, n - 1))
        out.append(slice(a, draw(st.integers(a + 1, n))))
    return out[0], out[1]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(method=st.sampled_from(["mean", "nearest", "mode"]), data=st.data())
def test_every_level_equals_a_fresh_pyramid_of_the_updated_level_0(method: str, data: Any) -> None:
    with tempfile.TemporaryDirectory(prefix="pyr-") as tmp:
        updated(Path(tmp) / "p.zarr", method, data)


def updated(root: Path, method: str, data: Any) -> None:
    """A pyramid written, updated by drawn regions, compared with a fresh one."""
    rng = np.random.default_rng(data.draw(st.integers(0, 99), label="seed"))
    values = rng.integers(0, 5, SHAPE).astype("u2")
    shardwise.write_pyramid(values, root, method=method, **KW)
    for _ in range(data.draw(st.integers(1, 3), label="updates")):
        region = region_of(data.draw)
        patch = rng.integers(0, 5, (region[0].stop - region[0].start,
                                    region[1].stop - region[1].start)).astype("u2")  # fmt: skip
        shardwise.write_array(patch, root, path="0", region=region, mode="r+")
        values[region] = patch
        report = shardwise.update_pyramid(root, region)
        assert [n.split(":")[0] for n in report.notes if n.startswith("level")] == [
            "level 1", "level 2", "level 3"
        ]  # fmt: skip
    for k, (got, want) in enumerate(zip(levels(root), fresh(values, method), strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"level {k}")
    assert shardwise.verify(root, path="1").ok


def test_an_update_reads_and_writes_only_its_windows(tmp_path: Path) -> None:
    """A 2 x 2 change in a 45 x 38 pyramid rewrites one shard per level and reads only the
    windows above it (the report's bytes are a few shards', not the levels')."""
    values = np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE)
    root = tmp_path / "p.zarr"
    shardwise.write_pyramid(values, root, **KW)
    shardwise.write_array(np.zeros((2, 2), "f4"), root, path="0", region=(slice(4, 6), slice(4, 6)),
                          mode="r+")  # fmt: skip
    report = shardwise.update_pyramid(root, (slice(4, 6), slice(4, 6)))
    assert report.shards_written == 3  # one shard of each level above
    assert report.notes[:3] == ["level 1: 2:3, 2:3", "level 2: 1:2, 1:2", "level 3: 0:1, 0:1"]
    values[4:6, 4:6] = 0
    for got, want in zip(levels(root), fresh(values, "mean"), strict=True):
        np.testing.assert_array_equal(got, want)


def _update(root: str, k: int, meet: Any, out: Any) -> None:
    """Writer ``k``: its own 4 x 4 block of level 0's first shard, then the levels above; held
    at its first commit until the other has merged too."""
    from shardwise.storage import conditional as cond

    state = {"armed": True, "redone": 0}

    def hold(name: str, attempt: int) -> None:
        if attempt:
            state["redone"] += 1
        elif state["armed"]:
            state["armed"] = False
            meet.wait(timeout=300)

    cond.before_commit = hold
    region = (slice(0, 4), slice(4 * k, 4 * k + 4))
    try:
        shardwise.write_array(np.full((4, 4), 100.0 + k, "f4"), root, path="0", region=region,
                              mode="r+")  # fmt: skip
        shardwise.update_pyramid(root, region)
        out.put((k, state["redone"], ""))
    except Exception as e:  # reported, and fails the test
        out.put((k, -1, f"{type(e).__name__}: {e}"))


def test_two_processes_updating_one_shard_lose_nothing(tmp_path: Path) -> None:
    values = np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE)
    root = tmp_path / "p.zarr"
    shardwise.write_pyramid(values, root, **KW)
    ctx = forkserver()
    meet, out = ctx.Barrier(2), ctx.Queue()
    jobs = [ctx.Process(target=_update, args=(str(root), k, meet, out)) for k in range(2)]
    for j in jobs:
        j.start()
    results = sorted(out.get(timeout=600) for _ in range(2))
    for j in jobs:
        j.join(timeout=60)
    assert all(err == "" for *_, err in results), results
    assert sum(redone for _, redone, _ in results) >= 1, results  # the commits collided
    for k in range(2):
        values[0:4, 4 * k : 4 * k + 4] = 100.0 + k
    for got, want in zip(levels(root), fresh(values, "mean"), strict=True):
        np.testing.assert_array_equal(got, want)


def test_what_is_not_a_pyramid_is_refused(tmp_path: Path) -> None:
    shardwise.write_array(np.zeros(SHAPE, "f4"), tmp_path / "a.zarr", path="0")
    with pytest.raises(shardwise.InvalidValueError, match="no OME-Zarr or GeoZarr multiscales"):
        shardwise.update_pyramid(tmp_path / "a.zarr", ...)


def test_a_geozarr_pyramid_follows_every_data_variable(tmp_path: Path) -> None:
    """layout="geozarr": each data variable's levels (their last dims y, x) updated above the
    region, equal to a fresh GeoZarr pyramid of the updated Dataset."""
    import xarray as xr

    rng = np.random.default_rng(3)
    coords = {"y": np.arange(60.0) * 10, "x": np.arange(50.0) * 10, "t": [0, 1]}
    ds = xr.Dataset(
        {
            "b1": (("y", "x"), rng.random((60, 50)).astype("f4")),
            "b2": (("t", "y", "x"), rng.random((2, 60, 50)).astype("f4")),
        },
        coords=coords,
        attrs={"crs": "EPSG:32632"},
    )
    kw: dict[str, Any] = dict(layout="geozarr", levels=3, chunks=(8, 8), shards=(16, 16))
    root = tmp_path / "g.zarr"
    shardwise.write_pyramid(ds, root, **kw)
    rows, cols = slice(5, 20), slice(3, 30)
    for name in ("b1", "b2"):
        ds[name][..., rows, cols] = 9.0
        patch = ds[name].values[..., rows, cols]
        shardwise.write_array(patch, root, path=f"0/{name}", region=(..., rows, cols), mode="r+")
    report = shardwise.update_pyramid(root, (..., rows, cols))
    assert [n.split(":")[0] for n in report.notes] == [
        "level 1/b1", "level 2/b1", "level 1/b2", "level 2/b2"
    ]  # fmt: skip
    want = tmp_path / "fresh.zarr"
    shardwise.write_pyramid(ds, want, **kw)
    for k in range(3):
        for name in ("b1", "b2"):
            np.testing.assert_array_equal(
                shardwise.read_array(root, path=f"{k}/{name}"),
                shardwise.read_array(want, path=f"{k}/{name}"),
                err_msg=f"{k}/{name}",
            )


@pytest.mark.parametrize("rows", [3, 4, 1])
def test_appends_to_level_0_along_t_grow_every_level(tmp_path: Path, rows: int) -> None:
    """Rows appended to level 0 along ``t`` (into its last shard or new ones): update_pyramid
    over them appends the reduced rows to every level above, each level then equal to a fresh
    ``write_pyramid`` of the grown level 0, and ome-zarr-models still validates the group."""
    from ome_zarr_models.v05.image import Image

    kw: dict[str, Any] = dict(levels=3, dims=("t", "y", "x"), chunks=(1, 4, 4), shards=(2, 8, 12))
    rng = np.random.default_rng(rows)
    values = rng.integers(0, 100, (5, 21, 18)).astype("f4")
    root = tmp_path / "p.zarr"
    shardwise.write_pyramid(values, root, **kw)
    more = rng.integers(0, 100, (rows, 21, 18)).astype("f4")
    shardwise.write_array(more, root, path="0", append_dim="t")
    report = shardwise.update_pyramid(root, (slice(5, 5 + rows), slice(None), slice(None)))
    grown = np.concatenate([values, more])
    with tempfile.TemporaryDirectory() as tmp:
        shardwise.write_pyramid(grown, Path(tmp) / "f.zarr", **kw)
        fresh_levels = [shardwise.read_array(Path(tmp) / "f.zarr", path=str(k)) for k in range(3)]
    for k, want in enumerate(fresh_levels):
        got = shardwise.read_array(root, path=str(k))
        assert got.shape == want.shape, (k, got.shape, want.shape)
        np.testing.assert_array_equal(got, want, err_msg=f"level {k}")
    assert next(n for n in report.notes if n.startswith("level")).startswith(
        f"level 1: 5:{5 + rows}"
    )
    Image.from_zarr(zarr.open_group(root, mode="r"))
    assert shardwise.verify(root, path="2").ok


def test_appends_to_a_geozarr_level_0_are_refused_by_update_pyramid(tmp_path: Path) -> None:
    """A GeoZarr pyramid's levels carry coordinates: a level 0 grown along time is refused,
    naming the level, and nothing is written."""
    import xarray as xr

    ds = xr.Dataset(
        {"v": (("time", "y", "x"), np.ones((2, 16, 16), "f4"))},
        coords={"time": [0, 1], "y": np.arange(16.0), "x": np.arange(16.0)},
    )
    root = tmp_path / "g.zarr"
    shardwise.write_pyramid(
        ds, root, layout="geozarr", levels=2, chunks=(1, 8, 8), shards=(1, 16, 16)
    )
    level0 = next(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith("0"))
    shardwise.write_array(np.ones((1, 16, 16), "f4"), root, path=f"{level0}/v", append_dim=0)
    before = sorted((p.relative_to(root), p.stat().st_mtime_ns) for p in root.rglob("*"))
    with pytest.raises(
        shardwise.errors.InvalidValueError, match="GeoZarr pyramid's levels carry coordinates"
    ):
        shardwise.update_pyramid(root, (slice(2, 3), slice(None), slice(None)))
    assert sorted((p.relative_to(root), p.stat().st_mtime_ns) for p in root.rglob("*")) == before
