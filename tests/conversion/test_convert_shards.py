"""Shard settings are applied or refused, never dropped: through ``shardwise.convert`` and the
``shardwise convert`` command, every bad ``shards``/``shard_bytes`` is refused before a byte is
written, naming the array; sizes that are not whole chunks are rounded up to whole chunks by the
one rule that ``write_array``, ``to_zarr`` and the command line share."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr

import shardwise
from faultkit import exe, files
from shardwise.errors import InvalidValueError

CHUNKS = (8, 10)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """named: 2-d v3 (time, x); bare: 2-d v3 without names; line: 1-d v2; group: a v2 xarray
    dataset (3-d t2m, 1-d coordinates)."""
    root = tmp_path_factory.mktemp("sources")
    x = np.arange(37 * 50, dtype="<u2").reshape(37, 50)
    shardwise.write_array(
        x, root / "named", chunks=CHUNKS, shards=(8, 20), dimension_names=("time", "x")
    )
    shardwise.write_array(x, root / "bare", chunks=CHUNKS, shards=(8, 20))
    zarr.create_array(root / "line", shape=(40,), chunks=(8,), dtype="f4", zarr_format=2)[...] = 1
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), np.ones((10, 4, 6), "f4"))},
        coords={"time": np.arange(10), "lat": np.arange(4.0), "lon": np.arange(6.0)},
    )
    ds.chunk({"time": 5, "lat": 2, "lon": 3}).to_zarr(root / "group", zarr_format=2)
    return {p.name: p for p in root.iterdir()}


# (source, keyword arguments, CLI flags, error type, message, exit status: sizes the command
# line cannot take are usage errors, 2, before any store is opened; refusals of the array, 3)
REFUSALS: list[tuple[str, dict[str, Any], list[str], type, str, int]] = [
    ("named", {"shards": {"tme": 365}}, ["--shards", "tme=365"], InvalidValueError,
     r"dimension\(s\) \['tme'\] that array '/' does not have \(dimensions: \['time', 'x'\]\)", 3),
    ("bare", {"shards": {"time": 365}}, ["--shards", "time=365"], InvalidValueError,
     "array '/' has no dimension names", 3),
    ("line", {"shards": (4, 4)}, ["--shards", "4,4"], InvalidValueError,
     r"array '/' has 1 dimension\(s\) \(40,\), but shards \(4, 4\) has 2", 3),
    ("named", {"shards": (16,)}, ["--shards", "16"], InvalidValueError,
     r"array '/' has 2 dimension\(s\)", 3),
    ("group", {"shards": (5, 2, 3)}, ["--shards", "5,2,3"], InvalidValueError,
     r"array 'lat' has 1 dimension\(s\) \(4,\), but shards \(5, 2, 3\) has 3", 3),
    ("group", {"shards": {"tme": 5}}, ["--shards", "tme=5"], InvalidValueError,
     r"\['tme'\] that the group does not have", 3),
    ("named", {"shards": (16, 0)}, ["--shards", "16,0"], InvalidValueError,
     r"shards must be a shape of positive sizes .* got \(16, 0\)", 2),
    ("named", {"shards": (-8, 10)}, ["--shards=-8,10"], InvalidValueError,
     r"got \(-8, 10\)", 2),
    ("named", {"shards": {"time": 0}}, ["--shards", "time=0"], InvalidValueError,
     r"got \{'time': 0\}", 2),
    ("named", {"shard_bytes": 0}, ["--shard-bytes", "0"], InvalidValueError,
     "shard_bytes must be a positive number of bytes", 2),
    ("named", {"shard_bytes": -5}, ["--shard-bytes=-5"], InvalidValueError,
     "shard_bytes must be a positive number of bytes", 2),
    ("named", {"shard_bytes": "lots"}, ["--shard-bytes", "lots"], InvalidValueError,
     "shard_bytes must be a positive number of bytes", 2),
    ("named", {"shards": "time=a"}, ["--shards", "time=a"], InvalidValueError,
     "shards must be", 2),  # a string is a target ("2GB", "XY"): this one is none
]  # fmt: skip
IDS = [
    "misspelt-name",
    "names-without-dimension-names",
    "2-d-shape-for-1-d",
    "1-d-shape-for-2-d",
    "3-d-shape-in-a-group-of-1-d-coordinates",
    "misspelt-name-in-a-group",
    "zero-size",
    "negative-size",
    "zero-size-by-name",
    "shard-bytes-0",
    "shard-bytes-negative",
    "shard-bytes-unparsable",
    "unparsable-size",
]


@pytest.mark.parametrize(
    ("src", "kwargs", "flags", "error", "message", "status"), REFUSALS, ids=IDS
)
def test_bad_shard_settings_are_refused_before_any_byte(
    sources: dict[str, Path],
    tmp_path: Path,
    src: str,
    kwargs: dict[str, Any],
    flags: list[str],
    error: type,
    message: str,
    status: int,
) -> None:
    source_files = files(sources[src], journal=True)
    dst = tmp_path / "out.zarr"
    with pytest.raises(error, match=message):
        shardwise.convert(sources[src], dst, **kwargs)
    assert not dst.exists()
    # an existing destination with mode="w" stays byte-identical too
    shardwise.write_array(np.zeros(3), dst)
    before = files(dst, journal=True)
    with pytest.raises(error, match=message):
        shardwise.convert(sources[src], dst, mode="w", **kwargs)
    assert files(dst, journal=True) == before
    proc = subprocess.run(
        [*exe(), "convert", str(sources[src]), str(tmp_path / "cli.zarr"), *flags],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == status, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    if status == 3:  # the same refusal, one line; usage errors (2) are argparse's
        assert type(error("")).__name__ in proc.stderr
        assert re.search(message, proc.stderr), proc.stderr
    assert not (tmp_path / "cli.zarr").exists()
    assert files(sources[src], journal=True) == source_files


# -- one rounding rule everywhere -----------------------------------------------------------------


def test_shard_sizes_round_up_to_whole_chunks_everywhere(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    """(12, 25) with (8, 10) chunks is (16, 30) in convert, the CLI, write_array and to_zarr."""
    named = sources["named"]
    x = zarr.open_array(named, mode="r")[...]
    got = {
        "convert shape": shardwise.convert(named, tmp_path / "a", shards=(12, 25)).arrays[0].shards,
        "convert names": shardwise.convert(named, tmp_path / "b", shards={"time": 12, "x": 25})
        .arrays[0]
        .shards,
    }
    for flag, out in (("12,25", "c"), ("time=12,x=25", "d")):
        proc = subprocess.run(
            [*exe(), "convert", str(named), str(tmp_path / out), "--shards", flag, "--no-progress"],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        got[f"cli {flag}"] = zarr.open_array(tmp_path / out, mode="r").shards
    shardwise.write_array(x, tmp_path / "e", chunks=CHUNKS, shards=(12, 25))
    got["write_array"] = zarr.open_array(tmp_path / "e", mode="r").shards
    ds = xr.Dataset({"v": (("time", "x"), x)})
    shardwise.to_zarr(
        ds, tmp_path / "f", shards={"time": 12, "x": 25}, encoding={"v": {"chunks": CHUNKS}}
    )
    got["to_zarr names"] = zarr.open_array(tmp_path / "f", path="v", mode="r").shards
    assert got == dict.fromkeys(got, (16, 30))
    for out in "abcdef":
        root = tmp_path / out
        arr = zarr.open_array(root, path=None if out != "f" else "v", mode="r")
        np.testing.assert_array_equal(arr[...], x)


def test_sizes_by_name_apply_per_array_of_a_group(sources: dict[str, Path], tmp_path: Path) -> None:
    rep = shardwise.convert(sources["group"], tmp_path / "o", shards={"time": 7}, verify=True)
    assert rep.ok
    shards = {a.path: a.shards for a in rep.arrays}
    # time rounded up to whole chunks (5): 10; the others whole (they fit 64 MiB)
    assert shards == {"lat": (4,), "lon": (6,), "t2m": (10, 4, 6), "time": (10,)}
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "o"), xr.open_zarr(sources["group"]))


def test_to_zarr_encoding_chunks_and_shards_still_follow_xarray(tmp_path: Path) -> None:
    """Both in `encoding` is xarray's vocabulary: chunks that split shards are refused there."""
    ds = xr.Dataset({"v": (("t",), np.arange(20))})
    with pytest.raises(
        InvalidValueError, match=r"inner chunks \(3,\) must divide the shard shape \(8,\)"
    ):
        shardwise.to_zarr(ds, tmp_path / "a", encoding={"v": {"chunks": (3,), "shards": (8,)}})
    assert not (tmp_path / "a").exists()
