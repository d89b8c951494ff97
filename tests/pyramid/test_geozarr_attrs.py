"""The GeoZarr spatial and projection attributes of a pyramid's levels: each level's affine
transform, shape and bbox against ones computed by hand for an odd-sized grid (mean and
nearest), every level's coordinates its transform's pixel centres (the last, partial block of
an odd size too), validated by zarr-cm's spatial, proj and
multiscales conventions; the CRS found where rioxarray, CF and attributes put it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
from pyproj import CRS
from zarr_cm import multiscales as zcm_multiscales
from zarr_cm import proj as zcm_proj
from zarr_cm import spatial as zcm_spatial

import shardwise
from faultkit import snapshot
from shardwise.errors import InvalidValueError
from shardwise.pyramid.geo_attrs import crs_attributes

WKT2 = CRS.from_epsg(32632).to_wkt()


def grid(ny: int, nx: int, crs: dict[str, Any] | None = None) -> xr.Dataset:
    """One band over a 10 m grid, north up: y from 5000 down, x from 300 up."""
    band = np.arange(ny * nx, dtype="f8").reshape(ny, nx)
    return xr.Dataset(
        {"b": (("y", "x"), band, {"grid_mapping": "spatial_ref"})},
        coords={
            "y": 5000.0 - 10 * np.arange(ny),
            "x": 300.0 + 10 * np.arange(nx),
            "spatial_ref": ((), np.int64(0), crs if crs is not None else {"crs_wkt": WKT2}),
        },
    )


def doc(root: Path, group: str = "") -> dict[str, Any]:
    out: dict[str, Any] = json.loads((root / group / "zarr.json").read_text())
    return out


# ny, nx = 45, 31 on the 10 m grid whose first pixel's outer corner is (x 295, y 5005):
# level k has ceil(45 / 2**k) x ceil(31 / 2**k) pixels of 10 * 2**k m
HAND = {
    # mean keeps the corner: the first sample is its block's centre
    "mean": [
        ([10.0, 0.0, 295.0, 0.0, -10.0, 5005.0], [45, 31], [295.0, 4555.0, 605.0, 5005.0]),
        ([20.0, 0.0, 295.0, 0.0, -20.0, 5005.0], [23, 16], [295.0, 4545.0, 615.0, 5005.0]),
        ([40.0, 0.0, 295.0, 0.0, -40.0, 5005.0], [12, 8], [295.0, 4525.0, 615.0, 5005.0]),
    ],
    # nearest keeps each block's first sample (x 300, y 5000) as the pixel's centre
    "nearest": [
        ([10.0, 0.0, 295.0, 0.0, -10.0, 5005.0], [45, 31], [295.0, 4555.0, 605.0, 5005.0]),
        ([20.0, 0.0, 290.0, 0.0, -20.0, 5010.0], [23, 16], [290.0, 4550.0, 610.0, 5010.0]),
        ([40.0, 0.0, 280.0, 0.0, -40.0, 5020.0], [12, 8], [280.0, 4540.0, 600.0, 5020.0]),
    ],
}


@pytest.mark.parametrize("method", ["mean", "nearest"])
def test_level_transforms_match_a_hand_computed_odd_grid_and_validate(
    tmp_path: Path, method: str
) -> None:
    root = tmp_path / "g.zarr"
    shardwise.write_pyramid(grid(45, 31), root, levels=3, method=method, layout="geozarr")
    top = doc(root)
    for convention in (zcm_multiscales, zcm_spatial, zcm_proj):
        convention.validate_group_metadata(top)  # raises unless declared and valid
    attrs = top["attributes"]
    assert attrs["proj:code"] == "EPSG:32632" and attrs["proj:wkt2"] == WKT2
    assert attrs["spatial:bbox"] == HAND[method][0][2]
    tree = xr.open_datatree(root, engine="shardwise", consolidated=False)
    for k, (transform, shape, bbox) in enumerate(HAND[method]):
        level = doc(root, str(k))
        zcm_spatial.validate_group_metadata(level)
        zcm_proj.validate_group_metadata(level)
        got = level["attributes"]
        assert got["spatial:transform"] == transform and got["spatial:shape"] == shape
        assert got["spatial:bbox"] == bbox and got["spatial:dimensions"] == ["y", "x"]
        entry = attrs["multiscales"]["layout"][k]
        assert entry["spatial:transform"] == transform and entry["spatial:shape"] == shape
        # the transform places every pixel of a whole block where its reduced coordinate is
        a, _, c, _, e, f = transform
        ds = tree[str(k)].to_dataset()
        assert list(ds["b"].shape) == shape
        whole = (45 // 2**k, 31 // 2**k)
        np.testing.assert_allclose(ds["x"][: whole[1]], c + a * (np.arange(whole[1]) + 0.5))
        np.testing.assert_allclose(ds["y"][: whole[0]], f + e * (np.arange(whole[0]) + 0.5))
    # pyproj reads the CRS back as the source's
    assert CRS.from_user_input(attrs["proj:code"]) == CRS.from_wkt(attrs["proj:wkt2"])


@pytest.mark.parametrize("method", ["mean", "nearest", "mode"])
def test_every_levels_coordinates_are_its_transforms_pixel_centres(
    tmp_path: Path, method: str
) -> None:
    """On an odd grid the last block of a level holds fewer samples: its coordinate is still
    the centre of its pixel under the level's spatial:transform (not the mean of the samples
    present), so both georeferences of every level agree, read by both engines."""
    root = tmp_path / "g.zarr"
    ds = grid(45, 31)
    if method == "mode":
        ds["b"] = ds["b"].astype("i4") % 3
    shardwise.write_pyramid(ds, root, levels=4, method=method, layout="geozarr")
    for engine in ("zarr", "shardwise"):
        tree = xr.open_datatree(root, engine=engine, consolidated=False)
        for k in range(4):
            a, _, c, _, e, f = doc(root, str(k))["attributes"]["spatial:transform"]
            level = tree[str(k)].to_dataset()
            ny, nx = level["b"].shape
            xs, ys = c + (np.arange(nx) + 0.5) * a, f + (np.arange(ny) + 0.5) * e
            if k == 0:  # the source's own coordinates, on its regular grid
                np.testing.assert_allclose(level["x"], xs, rtol=0, atol=1e-9)
                np.testing.assert_allclose(level["y"], ys, rtol=0, atol=1e-9)
            else:
                np.testing.assert_array_equal(level["x"].values, xs)
                np.testing.assert_array_equal(level["y"].values, ys)
                assert level["x"].dtype == level["y"].dtype == np.float64


CASES: dict[str, tuple[xr.Dataset, dict[str, str]]] = {
    # rioxarray's CF grid mapping (crs_wkt and GDAL's spatial_ref, both WKT2)
    "rioxarray": (grid(4, 4), {"proj:code": "EPSG:32632", "proj:wkt2": WKT2}),
    # a grid mapping named "crs" by the data variable, CF's extended form
    "cf-named": (
        grid(4, 4, {})
        .assign_coords(crs=((), 0, {"crs_wkt": WKT2}))
        .pipe(lambda d: d.assign(b=d.b.assign_attrs(grid_mapping="crs: x y"))),
        {"proj:code": "EPSG:32632", "proj:wkt2": WKT2},
    ),
    # WKT1 names its authority but is no proj:wkt2
    "wkt1": (
        grid(4, 4, {"spatial_ref": CRS.from_epsg(4326).to_wkt("WKT1_GDAL")}),
        {"proj:code": "EPSG:4326"},
    ),
    "attrs-code": (grid(4, 4, {}).assign_attrs(crs="EPSG:3035"), {"proj:code": "EPSG:3035"}),
    "none": (grid(4, 4, {}), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_crs_is_found_where_rioxarray_cf_and_attributes_put_it(
    tmp_path: Path, case: str
) -> None:
    ds, want = CASES[case]
    assert crs_attributes(ds) == want
    root = tmp_path / "c.zarr"
    shardwise.write_pyramid(ds, root, levels=2, layout="geozarr")
    for group in ("", "0", "1"):
        got = doc(root, group)
        names = [c["name"] for c in got["attributes"]["zarr_conventions"]]
        assert ("proj" in names) == bool(want)
        assert {k: v for k, v in got["attributes"].items() if k.startswith("proj:")} == want
        if want:
            zcm_proj.validate_group_metadata(got)


def test_an_irregular_grid_gets_no_affine_but_keeps_its_crs(tmp_path: Path) -> None:
    ds = grid(8, 6).assign_coords(x=300.0 + np.array([0, 10, 20, 35, 40, 50]))
    root = tmp_path / "i.zarr"
    shardwise.write_pyramid(ds, root, levels=2, layout="geozarr")
    for group in ("", "0", "1"):
        attrs = doc(root, group)["attributes"]
        assert not [k for k in attrs if k.startswith("spatial:")]
        assert "spatial" not in [c["name"] for c in attrs["zarr_conventions"]]
        assert attrs["proj:code"] == "EPSG:32632"
    assert "spatial:transform" not in doc(root)["attributes"]["multiscales"]["layout"][1]


def test_a_small_variable_that_cannot_be_stored_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    ds = grid(8, 6)
    root = tmp_path / "r.zarr"
    shardwise.write_pyramid(ds, root, levels=2, layout="geozarr")
    before = snapshot(root)
    mixed = ds.assign_coords(label=("x", np.array(["a", 1, "b", 2, "c", 3], dtype=object)))
    with pytest.raises(InvalidValueError, match="'label' of dtype object") as e:
        shardwise.write_pyramid(mixed, root, levels=2, layout="geozarr", mode="w")
    assert isinstance(e.value, ValueError)
    assert snapshot(root) == before


def _gdal_affine(geotransform: str) -> list[float]:
    """A GDAL ``GeoTransform`` ("c a b f d e") as the affine ``[a, b, c, d, e, f]`` a reader
    such as rioxarray builds from it (``Affine.from_gdal``): what ``ds.rio.transform()``
    returns when the grid mapping has one."""
    c, a, b, f, d, e = (float(v) for v in geotransform.split())
    return [a, b, c, d, e, f]


@pytest.mark.parametrize("method", ["mean", "nearest"])
def test_every_levels_grid_mapping_describes_that_level(tmp_path: Path, method: str) -> None:
    """rioxarray's ``spatial_ref`` carries level 0's GDAL ``GeoTransform``, which readers take
    over the coordinates: every reduced level's grid mapping has that level's own (its pixel
    size times the level's factors, its origin where the reduction puts the first pixel), the
    same affine as its ``spatial:transform`` and the hand-computed one, read back by xarray's
    own engine; the other attributes kept. (rioxarray is not installed here: its
    ``rio.transform()`` is ``Affine.from_gdal`` of this string.)"""
    root = tmp_path / "g.zarr"
    crs = {"crs_wkt": WKT2, "spatial_ref": WKT2, "GeoTransform": "295.0 10.0 0.0 5005.0 0.0 -10.0"}
    shardwise.write_pyramid(grid(45, 31, crs), root, levels=3, method=method, layout="geozarr")
    tree = xr.open_datatree(root, engine="zarr", consolidated=False)
    for k, (transform, _, _) in enumerate(HAND[method]):
        level = tree[str(k)].to_dataset()
        mapping = level[level["b"].attrs["grid_mapping"]].attrs
        assert _gdal_affine(mapping["GeoTransform"]) == transform, k
        assert doc(root, str(k))["attributes"]["spatial:transform"] == transform
        assert mapping["crs_wkt"] == mapping["spatial_ref"] == WKT2
        # the first pixel's centre under it is where the level's coordinates put it
        a, _, c, _, e, f = _gdal_affine(mapping["GeoTransform"])
        assert (float(level["x"][0]), float(level["y"][0])) == (c + a / 2, f + e / 2)


def test_a_grid_mapping_on_irregular_coordinates_is_placed_by_its_own_transform(
    tmp_path: Path,
) -> None:
    """Without a regular grid in the coordinates (no ``spatial:`` attributes) a grid mapping's
    own ``GeoTransform`` still says where level 0 lies: a reduced level's is scaled from it by
    the same rule (mean keeps the corner)."""
    root = tmp_path / "g.zarr"
    crs = {"crs_wkt": WKT2, "GeoTransform": "295.0 10.0 0.0 5005.0 0.0 -10.0"}
    ds = grid(8, 6, crs)
    ds = ds.assign_coords(x=ds["x"].values + np.array([0, 1, 0, 0, 0, 0]))  # uneven steps
    shardwise.write_pyramid(ds, root, levels=2, method="mean", layout="geozarr")
    assert "spatial:transform" not in doc(root, "1")["attributes"]
    got = xr.open_datatree(root, engine="zarr", consolidated=False)["1"].to_dataset()
    assert got["spatial_ref"].attrs["GeoTransform"] == "295.0 20.0 0.0 5005.0 0.0 -20.0"
