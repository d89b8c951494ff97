"""write_pyramid's OME images of a Dataset of several data variables (one OME-Zarr image per
variable in its own subgroup, one graph, each validated by ome-zarr-models) and the OME scale,
translation and units taken from coordinates (uniform spacing; explicit values win; other
coordinates keep the defaults)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import xarray as xr
import zarr
from test_pyramid import CountingSource
from test_pyramid_convert import block_mean, expected_levels, stored

import shardwise
from faultkit import snapshot
from shardwise.errors import InvalidValueError


def transforms(root: Any, path: str = "") -> list[tuple[list[float], list[float]]]:
    """(scale, translation) of every level of the image at ``path``."""
    ms = zarr.open_group(root, path=path, mode="r").attrs["ome"]["multiscales"][0]
    return [
        (
            d["coordinateTransformations"][0]["scale"],
            d["coordinateTransformations"][1]["translation"],
        )
        for d in ms["datasets"]
    ]


def test_each_data_variable_is_its_own_ome_image_in_one_graph(tmp_path: Path) -> None:
    from ome_zarr_models.v05.image import Image

    rng = np.random.default_rng(1)
    cells = CountingSource(rng.random((2, 40, 72, 56)).astype("f4"), (1, 20, 30, 24))
    mask = rng.integers(0, 4, (72, 56)).astype("uint8")
    ds = xr.Dataset(
        {"cells": (("c", "z", "y", "x"), cells.array), "mask": (("y", "x"), mask)},
        coords={"y": 0.5 * np.arange(72), "x": 0.5 * np.arange(56)},
        attrs={"title": "two images"},
    )
    root = tmp_path / "images.zarr"
    with dask.config.set(scheduler="threads", num_workers=2):
        report = shardwise.write_pyramid(ds, root, levels=3, chunks=8, shards=16)
    # one graph: the 4-D variable's source read once for all its levels
    blocks = itertools.product(range(2), range(2), range(3), range(3))
    assert cells.calls == {loc: 1 for loc in blocks}
    top = zarr.open_group(root, mode="r")
    assert "ome" not in top.attrs  # a plain group: OME-Zarr 0.5 has no collection of images
    assert sorted(n for n, _ in top.groups()) == ["cells", "mask"]
    for name, x in (("cells", cells.x), ("mask", mask)):
        model = Image.from_zarr(zarr.open_group(root, path=name, mode="r"))
        ms = model.attributes.ome.multiscales[0]
        assert ms.name == name and [d.path for d in ms.datasets] == ["0", "1", "2"]
        factors = (1, 2, 2, 2) if x.ndim == 4 else (2, 2)  # the channel axis is not reduced
        want = [x]
        for _ in range(2):
            want.append(block_mean(want[-1], factors))
        for k, got in enumerate(stored(root, 3, name)):
            np.testing.assert_allclose(got, want[k], rtol=1e-6, err_msg=f"{name} level {k}")
        # the coordinates of y and x give each image its scale
        assert transforms(root, name)[1][0][-2:] == [1.0, 1.0]
    shards = 0  # every shard of every level of both images, once
    for name in ("cells", "mask"):
        for k in range(3):
            a = zarr.open_array(root, path=f"{name}/{k}", mode="r")
            shards += int(np.prod([-(-n // s) for n, s in zip(a.shape, a.shards, strict=True)]))
    assert report.shards_written == shards


def test_a_variable_that_is_not_an_image_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    ds = xr.Dataset({"image": (("y", "x"), np.ones((32, 32))), "series": (("time",), np.ones(5))})
    root = tmp_path / "p.zarr"
    zarr.open_group(root, mode="w")
    before = snapshot(root)
    with pytest.raises(InvalidValueError, match=r"data variable 'series': dims must be"):
        shardwise.write_pyramid(ds, root, mode="w")
    with pytest.raises(InvalidValueError, match="dims names the axes of one image"):
        shardwise.write_pyramid(ds[["image"]].assign(b=ds.image), root, dims=("y", "x"), mode="w")
    with pytest.raises(InvalidValueError, match=r"scale names \['z'\]"):
        shardwise.write_pyramid(ds[["image"]].assign(b=ds.image), root, scale={"z": 2.0}, mode="w")
    assert snapshot(root) == before


def test_scale_translation_and_units_come_from_uniform_coordinates(tmp_path: Path) -> None:
    from ome_zarr_models.v05.image import Image

    x = np.random.default_rng(2).random((9, 100, 80)).astype("f4")
    image = xr.DataArray(
        x,
        dims=("z", "y", "x"),
        coords={
            "z": ("z", 3.0 * np.arange(9), {"units": "micrometer"}),
            "y": ("y", 100.0 + 0.4 * np.arange(100), {"units": "furlong"}),  # not OME's: none
            "x": ("x", -2.0 + 0.25 * np.arange(80), {"units": "micrometer"}),
        },
    )
    root = tmp_path / "p.zarr"
    shardwise.write_pyramid(image, root, levels=3, chunks=16, shards=32)
    ms = Image.from_zarr(zarr.open_group(root, mode="r")).attributes.ome.multiscales[0]
    assert [a.unit for a in ms.axes] == ["micrometer", None, "micrometer"]
    spacing, first = np.array([3.0, 0.4, 0.25]), np.array([0.0, 100.0, -2.0])
    for k, (scale, shift) in enumerate(transforms(root)):
        f = 2**k  # z has 9 samples: 9 -> 5 -> 3, still reduced by 2 each level
        np.testing.assert_allclose(scale, spacing * f)
        # the OME convention of the mean levels: the centre of each level's first block
        np.testing.assert_allclose(shift, first + spacing * (f - 1) / 2)
    # the coordinates of level k's samples are its block means: the same positions
    np.testing.assert_allclose(
        first[2] + spacing[2] * (4 - 1) / 2, image.x.values[:4].mean(), rtol=1e-12
    )
    for k, (got, want) in enumerate(zip(stored(root, 3), expected_levels(x, 3), strict=True)):
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"level {k}")


def test_explicit_values_win_and_other_coordinates_keep_the_defaults(tmp_path: Path) -> None:
    y = 10.0 + 0.5 * np.arange(64)
    y[40:] += 3.0  # a gap: not uniform
    image = xr.DataArray(
        np.ones((64, 48), "f4"),
        dims=("y", "x"),
        coords={"y": y, "x": ("x", 5.0 + 2.0 * np.arange(48), {"units": "nanometer"})},
    )
    root = tmp_path / "p.zarr"
    shardwise.write_pyramid(image, root, levels=2, scale={"x": 1.5}, units={"x": "micrometer"})
    (s0, t0), (s1, t1) = transforms(root)
    assert (s0, t0) == ([1.0, 1.5], [0.0, 5.0])  # y: scale 1, translation 0; x: its scale given
    assert (s1, t1) == ([2.0, 3.0], [0.5, 5.75])
    axes = zarr.open_group(root, mode="r").attrs["ome"]["multiscales"][0]["axes"]
    assert axes[1]["unit"] == "micrometer" and "unit" not in axes[0]
    # descending coordinates (a north-up raster's y) cannot be an OME scale: the defaults
    down = image.assign_coords(y=100.0 - np.arange(64.0))
    shardwise.write_pyramid(down, root, levels=2, mode="w")
    assert transforms(root)[0] == ([1.0, 2.0], [0.0, 5.0])
