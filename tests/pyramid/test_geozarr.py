"""write_pyramid(layout="geozarr"): a geospatial Dataset's pyramid as a DataTree of levels with
their reduced coordinates and CRS variable, the zarr-conventions multiscales attributes
(validated by zarr-cm, the conventions package eopf-geozarr builds them with), every level
equal to xarray's coarsen, the source read once, refusals leaving the store untouched."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import xarray as xr
from test_pyramid import CountingSource
from zarr_cm import multiscales as zcm

import shardwise
from shardwise.errors import InvalidTypeError, InvalidValueError

WKT = 'PROJCS["WGS 84 / UTM zone 32N",GEOGCS["WGS 84"]]'


def geo_dataset(b1: Any, b2: Any, ny: int, nx: int) -> xr.Dataset:
    """Two bands over y/x (one with a time axis too), projected coordinates, a CRS variable."""
    return xr.Dataset(
        {
            "b1": (("y", "x"), b1, {"grid_mapping": "spatial_ref", "units": "K"}),
            "b2": (("time", "y", "x"), b2, {"grid_mapping": "spatial_ref"}),
        },
        coords={
            "y": ("y", 5000.0 - 10 * np.arange(ny), {"units": "m", "axis": "Y"}),
            "x": ("x", 300.0 + 10 * np.arange(nx), {"units": "m", "axis": "X"}),
            "time": ("time", np.array([1, 2], dtype="int64"), {"units": "days"}),
            "spatial_ref": ((), np.int64(0), {"crs_wkt": WKT, "grid_mapping_name": "utm"}),
        },
        attrs={"title": "a scene"},
    )


def test_geozarr_levels_match_coarsen_and_the_multiscales_validate(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    ny, nx = 96, 64
    b1 = rng.random((ny, nx)).astype("f4")
    src = CountingSource(rng.random((2, ny, nx)), (1, 40, 24))  # chunks that split shards
    ds = geo_dataset(b1, src.array, ny, nx)
    root = tmp_path / "g.zarr"
    kw: dict[str, Any] = dict(levels=4, chunks=(8, 8), shards=(16, 16), layout="geozarr")
    with dask.config.set(scheduler="threads", num_workers=2):
        report = shardwise.write_pyramid(ds, root, **kw)
    # the source read once for all four levels of b2
    assert src.calls == {loc: 1 for loc in itertools.product(range(2), range(3), range(3))}
    shards = [-(-ny // (16 * 2**k)) * -(-nx // (16 * 2**k)) for k in range(3)] + [1]
    # b1 once, b2 twice (time) per shard; per level y, x and time (the CRS variable holds the
    # fill value: an all-fill shard, not stored)
    assert report.shards_written == 3 * sum(shards) + 3 * 4 and report.shards_empty == 4
    document = json.loads((root / "zarr.json").read_text())
    zcm.validate_group_metadata(document)  # raises unless the convention is declared and valid
    attrs = document["attributes"]
    zcm.validate(attrs["multiscales"])
    layout = attrs["multiscales"]["layout"]
    assert [lv["asset"] for lv in layout] == ["0", "1", "2", "3"]
    assert layout[2]["derived_from"] == "1" and layout[2]["resampling_method"] == "average"
    assert layout[2]["transform"] == {"scale": [2.0, 2.0], "translation": [0.5, 0.5]}
    assert attrs["title"] == "a scene"
    reference = ds.compute()
    for engine in ("zarr", "shardwise"):
        tree = xr.open_datatree(root, engine=engine, consolidated=False)
        assert set(tree.children) == {"0", "1", "2", "3"}
        for k in range(4):
            got = tree[str(k)].to_dataset().compute()
            f = 2**k
            ref = reference.coarsen(y=f, x=f).mean(keep_attrs=True) if k else reference
            for v in ("b1", "b2"):
                np.testing.assert_allclose(got[v], ref[v], rtol=1e-6)
                assert got[v].attrs["grid_mapping"] == "spatial_ref"
            np.testing.assert_allclose(got["y"], ref["y"])
            np.testing.assert_allclose(got["x"], ref["x"])
            assert got["x"].attrs["units"] == "m" and list(got["time"].values) == [1, 2]
            assert got["spatial_ref"].attrs["crs_wkt"] == WKT
            assert "spatial_ref" in got.coords


def test_geozarr_nearest_takes_each_blocks_first_sample_odd_sizes(tmp_path: Path) -> None:
    ny, nx = 45, 31  # odd: the ceil rule, the last block the samples present
    labels = np.arange(ny * nx, dtype="int32").reshape(ny, nx)
    ds = geo_dataset(labels, np.stack([labels, labels]), ny, nx)
    root = tmp_path / "n.zarr"
    shardwise.write_pyramid(ds, root, levels=3, method="nearest", layout="geozarr")
    tree = xr.open_datatree(root, engine="shardwise", consolidated=False)
    attrs = json.loads((root / "zarr.json").read_text())["attributes"]
    assert attrs["multiscales"]["layout"][1]["transform"]["translation"] == [0.0, 0.0]
    for k in range(3):
        got = tree[str(k)].to_dataset().compute()
        ref = ds.isel(y=slice(None, None, 2**k), x=slice(None, None, 2**k))
        assert got["b1"].shape == (-(-ny // 2**k), -(-nx // 2**k))
        np.testing.assert_array_equal(got["b1"], ref["b1"])
        np.testing.assert_array_equal(got["b2"], ref["b2"])
        np.testing.assert_array_equal(got["x"], ref["x"])
        np.testing.assert_array_equal(got["y"], ref["y"])


def listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_geozarr_refusals_name_the_problem_and_leave_the_store_unchanged(tmp_path: Path) -> None:
    ny, nx = 8, 6
    ds = geo_dataset(np.zeros((ny, nx), "f4"), np.zeros((2, ny, nx)), ny, nx)
    root = tmp_path / "r.zarr"
    shardwise.write_pyramid(ds, root, levels=2, layout="geozarr")
    before = listing(root)
    lat = ds.assign_coords(lat=(("y", "x"), np.zeros((ny, nx))))
    with pytest.raises(InvalidValueError, match="'lat' has dims"):
        shardwise.write_pyramid(lat, root, layout="geozarr", mode="w")
    with pytest.raises(InvalidValueError, match="layout='geozarr' takes them"):
        shardwise.write_pyramid(ds, root, layout="geozarr", scale={"x": 2.0}, mode="w")
    with pytest.raises(InvalidValueError, match="layout") as e:
        shardwise.write_pyramid(ds, root, layout="cog", mode="w")
    assert isinstance(e.value, ValueError)
    with pytest.raises(InvalidValueError, match="factors names \\['time'\\]"):
        shardwise.write_pyramid(ds, root, layout="geozarr", factors={"time": 2}, mode="w")
    with pytest.raises(InvalidTypeError, match="Dataset or DataArray"):
        shardwise.write_pyramid(np.zeros((4, 4)), root, layout="geozarr", mode="w")
    with pytest.raises(InvalidValueError, match="needs data variables"):
        shardwise.write_pyramid(ds.drop_vars("x"), root, layout="geozarr", mode="w")
    assert listing(root) == before


def test_cli_inspect_and_verify_walk_every_level_of_both_layouts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardwise.cli import main

    ny, nx = 64, 48
    ds = geo_dataset(np.ones((ny, nx), "f4"), np.ones((2, ny, nx)), ny, nx)
    geo, ome = tmp_path / "geo.zarr", tmp_path / "ome.zarr"
    kw: dict[str, Any] = dict(levels=3, chunks=(16, 16), shards=(32, 32))
    shardwise.write_pyramid(ds, geo, layout="geozarr", **kw)
    shardwise.write_pyramid(np.ones((ny, nx), "f4"), ome, **kw)
    capsys.readouterr()
    for root, names in (
        (geo, [f"{k}/{v}" for k in range(3) for v in ("b1", "b2")]),
        (ome, ["0", "1", "2"]),
    ):
        assert main(["inspect", str(root)]) == 0
        shown = capsys.readouterr().out
        for name in names:  # every level's arrays, with their shards
            assert f"  {name}  " in shown and "shards stored" in shown.split(f"  {name}  ")[1]
        assert main(["verify", str(root), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        # the GeoZarr levels' small arrays too: y, x and time of each (not the all-fill CRS)
        assert report["ok"] and report["shards_stored"] == (18 + 9 if root == geo else 6)
    # a damaged shard of a reduced level is found by verifying the pyramid group
    shard = geo / "2" / "b2" / "c" / "1" / "0" / "0"
    shard.write_bytes(b"\0" * len(shard.read_bytes()))
    assert main(["verify", str(geo)]) == 1
    assert "2/b2" in capsys.readouterr().out
