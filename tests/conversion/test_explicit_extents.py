"""Shard extents given explicitly (``shards={"time": [31, 29, ...]}``, ``[[...], 4, 8]``,
``--shards time=31/29/...``): a regular array converted to a rectilinear shard grid by
``convert`` (Python and command line), a Dataset by ``to_zarr`` and a group by ``convert`` by
dimension name, ``write_array`` of a DataArray by name. The grid in zarr.json is the one given;
zarr-python (its flag on) and shardwise read back the source's values. Refusals (extents not
summing to the axis, inner chunks dividing no extent, unknown names) come before any byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

import shardwise
from shardwise.cli import main
from shardwise.errors import InvalidValueError

# the month lengths of a leap year, as pandas gives them
MONTHS = [int(n) for n in pd.date_range("2020-01-01", "2020-12-31", freq="MS").days_in_month]
X = np.arange(366 * 4 * 8, dtype="f4").reshape(366, 4, 8)


def meta(path: Path) -> Any:
    return json.loads((path / "zarr.json").read_text())


def extents(path: Path) -> list[list[int]]:
    """The grid's extents per axis, zarr's run-length encoding expanded."""
    grid = meta(path)["chunk_grid"]
    assert grid["name"] == "rectilinear"
    out = []
    for axis in grid["configuration"]["chunk_shapes"]:
        out.append([n for e in axis for n in ([e] if isinstance(e, int) else [e[0]] * e[1])])
    return out


def inner(path: Path) -> list[int]:
    return list(meta(path)["codecs"][0]["configuration"]["chunk_shape"])


def zarr_reads(path: Path) -> np.ndarray:
    with zarr.config.set({"array.rectilinear_chunks": True}):
        return np.asarray(zarr.open_array(path, mode="r")[...])


def regular(path: Path) -> Path:
    a = zarr.create_array(
        path, shape=X.shape, chunks=(6, 4, 8), dtype="f4", dimension_names=("time", "y", "x")
    )
    a[...] = X
    return path


def files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_monthly_extents_by_name_and_by_position(tmp_path: Path) -> None:
    assert sum(MONTHS) == 366 and MONTHS[1] == 29
    src = regular(tmp_path / "src.zarr")
    rep = shardwise.convert(src, tmp_path / "m.zarr", shards={"time": MONTHS})
    assert rep.arrays[0].method == "reencode" and "extents" in rep.arrays[0].reason
    assert extents(tmp_path / "m.zarr") == [MONTHS, [4], [8]]
    # the source's 6 divides no month: the largest divisor of every month length (1) is taken
    assert inner(tmp_path / "m.zarr") == [1, 4, 8]
    np.testing.assert_array_equal(zarr_reads(tmp_path / "m.zarr"), X)
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "m.zarr"), X)
    assert shardwise.verify(tmp_path / "m.zarr").ok
    # by position, with inner chunks that divide every extent
    shardwise.convert(src, tmp_path / "p.zarr", shards=[[183, 183], 4, 8], chunks=(61, 2, 8))
    assert extents(tmp_path / "p.zarr") == [[183, 183], [4], [8]]
    assert inner(tmp_path / "p.zarr") == [61, 2, 8]
    np.testing.assert_array_equal(zarr_reads(tmp_path / "p.zarr"), X)
    # and back to a regular grid
    shardwise.convert(tmp_path / "p.zarr", tmp_path / "r.zarr", shards=(122, 4, 8))
    assert meta(tmp_path / "r.zarr")["chunk_grid"]["name"] == "regular"
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "r.zarr"), X)


def test_command_line_extents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = regular(tmp_path / "src.zarr")
    months = "/".join(map(str, MONTHS))
    assert main(["convert", str(src), str(tmp_path / "c.zarr"), "--shards", f"time={months}"]) == 0
    assert extents(tmp_path / "c.zarr") == [MONTHS, [4], [8]]
    np.testing.assert_array_equal(zarr_reads(tmp_path / "c.zarr"), X)
    argv = ["convert", str(src), str(tmp_path / "s.zarr"), "--shards", "100/266,4,8"]
    assert main([*argv, "--chunks", "2,4,8"]) == 0
    assert extents(tmp_path / "s.zarr") == [[100, 266], [4], [8]]
    assert inner(tmp_path / "s.zarr") == [2, 4, 8]
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "s.zarr"), X)
    # reshard takes the same grammar
    assert main(["reshard", str(src), str(tmp_path / "h.zarr"), "--shards", "300/66,4,8"]) == 0
    assert extents(tmp_path / "h.zarr") == [[300, 66], [4], [8]]
    assert not zarr.config.get("array.rectilinear_chunks")  # zarr's flag set only inside
    capsys.readouterr()
    # extents that do not tile the axis: refused (exit 3), nothing written
    bad = ["convert", str(src), str(tmp_path / "b.zarr"), "--shards", "time=100/200"]
    assert main(bad) == 3
    assert "sum to 300, not its length 366" in capsys.readouterr().err
    assert not (tmp_path / "b.zarr").exists()
    # text that is not extents: a usage error
    with pytest.raises(SystemExit) as e:
        main(["convert", str(src), str(tmp_path / "u.zarr"), "--shards", "time=31/x"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    assert "time=31/28/31" in capsys.readouterr().out


def test_a_dataset_and_a_group_by_dimension_name(tmp_path: Path) -> None:
    time = pd.date_range("2020-01-01", periods=366, freq="D")
    ds = xr.Dataset(
        {"tas": (("time", "y", "x"), X), "mask": (("y", "x"), np.ones((4, 8), "i1"))},
        coords={"time": time},
    )
    shardwise.to_zarr(ds, tmp_path / "d.zarr", shards={"time": MONTHS})
    assert extents(tmp_path / "d.zarr" / "tas") == [MONTHS, [4], [8]]
    back = xr.open_dataset(tmp_path / "d.zarr", engine="shardwise", chunks={})
    assert back["tas"].chunks[0] == tuple(MONTHS)
    xr.testing.assert_identical(back.compute(), ds)
    # a regular store of the Dataset, converted by name: every array along time
    shardwise.to_zarr(ds, tmp_path / "g.zarr", shards={"time": 61})
    shardwise.convert(tmp_path / "g.zarr", tmp_path / "h.zarr", shards={"time": MONTHS})
    assert extents(tmp_path / "h.zarr" / "tas") == [MONTHS, [4], [8]]
    assert meta(tmp_path / "h.zarr" / "mask")["chunk_grid"]["name"] == "regular"
    xr.testing.assert_identical(xr.open_dataset(tmp_path / "h.zarr", engine="shardwise"), ds)
    # a DataTree by name: every node with the dimension
    tree = xr.DataTree.from_dict({"/": ds[["mask"]], "/daily": ds[["tas"]]})
    shardwise.to_zarr(tree, tmp_path / "t.zarr", shards={"time": MONTHS})
    assert extents(tmp_path / "t.zarr" / "daily" / "tas") == [MONTHS, [4], [8]]
    got = xr.open_datatree(tmp_path / "t.zarr", engine="shardwise")["daily"]["tas"]
    np.testing.assert_array_equal(got.values, X)
    # write_array of a DataArray by its dimension names
    shardwise.write_array(ds["tas"], tmp_path / "a.zarr", shards={"time": MONTHS})
    assert extents(tmp_path / "a.zarr") == [MONTHS, [4], [8]]
    np.testing.assert_array_equal(zarr_reads(tmp_path / "a.zarr"), X)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(shards={"time": [100, 200]}), "sum to 300, not its length 366"),
        (dict(shards={"time": MONTHS}, chunks={"time": 2}), "sizes that would: [1]"),
        (dict(shards=[[183, 183], 4, 8], chunks=(5, 4, 8)), "sizes that would: [1, 3, 61, 183]"),
        (dict(shards={"day": MONTHS}), "does not have"),
        (dict(shards={"time": [366, 0]}), "positive sizes"),
        (dict(shards=[[183, 183], 4]), "has 3 dimension(s)"),
        (dict(shards={"time": MONTHS}, pyramid=True), "not extents"),
    ],
)
def test_refusals_leave_the_destination(tmp_path: Path, kw: dict[str, Any], message: str) -> None:
    src = regular(tmp_path / "src.zarr")
    with pytest.raises(InvalidValueError) as e:
        shardwise.convert(src, tmp_path / "new.zarr", **kw)
    assert message in str(e.value)
    assert not (tmp_path / "new.zarr").exists()
    shardwise.convert(src, tmp_path / "old.zarr", shards=(61, 4, 8))
    before = files(tmp_path / "old.zarr")
    with pytest.raises(InvalidValueError):
        shardwise.convert(src, tmp_path / "old.zarr", mode="w", **kw)
    assert files(tmp_path / "old.zarr") == before


def test_write_array_and_to_zarr_refusals(tmp_path: Path) -> None:
    da_ = xr.DataArray(X, dims=("time", "y", "x"))
    with pytest.raises(InvalidValueError, match="sum to 365, not its length 366"):
        shardwise.write_array(da_, tmp_path / "a.zarr", shards={"time": [*MONTHS[:-1], 30]})
    with pytest.raises(InvalidValueError, match="sizes that would"):
        shardwise.write_array(da_, tmp_path / "a.zarr", shards={"time": MONTHS}, chunks=(7, 4, 8))
    with pytest.raises(InvalidValueError, match="no dimension names"):
        shardwise.write_array(X, tmp_path / "a.zarr", shards={"time": MONTHS})
    assert not (tmp_path / "a.zarr").exists()
    ds = da_.to_dataset(name="tas")
    with pytest.raises(InvalidValueError, match="sum to 365, not its length 366"):
        shardwise.to_zarr(ds, tmp_path / "d.zarr", shards={"time": [*MONTHS[:-1], 30]})
    with pytest.raises(InvalidValueError, match="does not have"):
        shardwise.to_zarr(ds, tmp_path / "d.zarr", shards={"day": MONTHS})
    assert not (tmp_path / "d.zarr").exists()
