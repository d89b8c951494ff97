"""Unsharded arrays as outputs and inputs: ``convert(shards=None)`` (``--shards none``) writes
plain Zarr v3 chunks, copying a sharded source's encoded inner chunks as chunk objects where the
chunks and codecs match; ``inspect`` shows an unsharded array's layout, ``verify`` checks its
chunks; ``reshard`` takes ``convert``'s grammar (dimension names, groups).

Oracles: zarr-python's and tensorstore's reads against numpy, xarray's ``Dataset.equals``, the
bytes of each chunk object against the source shard's bytes at its index entry (the index parsed
here from the spec's layout), and the command's output and exit status.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts
import xarray as xr
import zarr

import shardwise
from faultkit import exe
from shardwise.cli import main
from shardwise.errors import InvalidValueError

DATA = np.random.default_rng(7).standard_normal((50, 37, 6)).astype("float32")
CHUNKS, SHARDS = (10, 8, 3), (20, 16, 6)


def _sharded(root: Path) -> Path:
    shardwise.write_array(
        DATA, root, shards=SHARDS, chunks=CHUNKS, dimension_names=("time", "y", "x")
    )
    return root


def _inner_chunk(shard: bytes, flat: int, nchunks: int) -> bytes | None:
    """Inner chunk ``flat`` of a shard, by its index at the end (bytes + crc32c, the spec's)."""
    index = np.frombuffer(shard[-(16 * nchunks + 4) : -4], dtype="<u8").reshape(nchunks, 2)
    offset, nbytes = (int(v) for v in index[flat])
    return None if offset == 2**64 - 1 else shard[offset : offset + nbytes]


def _tensorstore(root: Path) -> np.ndarray:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root)}}
    return np.asarray(ts.open(spec).result().read().result())


def test_unshard_copies_each_inner_chunk_as_a_chunk_object(tmp_path: Path) -> None:
    src = _sharded(tmp_path / "s.zarr")
    report = shardwise.convert(src, tmp_path / "u.zarr", shards=None, verify=True)
    (entry,) = report.arrays
    assert report.ok and entry.method == "copy" and entry.shards is None
    assert entry.shards_written == 5 * 5 * 2  # every chunk of the array, one object each
    out = zarr.open_array(tmp_path / "u.zarr", mode="r")
    inner = zarr.open_array(src, mode="r").metadata.codecs[0].codecs
    assert out.shards is None and out.chunks == CHUNKS
    assert out.metadata.codecs == inner  # the inner codecs, at the top level
    assert out.metadata.dimension_names == ("time", "y", "x")
    np.testing.assert_array_equal(out[...], DATA)
    np.testing.assert_array_equal(_tensorstore(tmp_path / "u.zarr"), DATA)
    # copied, not re-encoded: each chunk object is the bytes of its inner chunk in the shard
    grid = tuple(s // c for s, c in zip(SHARDS, CHUNKS, strict=True))
    for coords in np.ndindex(5, 5, 2):
        shard = tuple(c // g for c, g in zip(coords, grid, strict=True))
        within = tuple(c % g for c, g in zip(coords, grid, strict=True))
        data = (src / "c" / "/".join(map(str, shard))).read_bytes()
        want = _inner_chunk(data, int(np.ravel_multi_index(within, grid)), int(np.prod(grid)))
        assert (tmp_path / "u.zarr/c" / "/".join(map(str, coords))).read_bytes() == want


def test_unshard_reencodes_other_chunks_and_shards_back(tmp_path: Path) -> None:
    src = _sharded(tmp_path / "s.zarr")
    report = shardwise.convert(src, tmp_path / "u.zarr", shards=None, chunks={"time": 5})
    assert report.arrays[0].method == "reencode" and report.arrays[0].shards is None
    assert "unsharded, chunks (5, 8, 3)" in str(report)
    out = zarr.open_array(tmp_path / "u.zarr", mode="r")
    assert out.shards is None and out.chunks == (5, 8, 3)
    np.testing.assert_array_equal(_tensorstore(tmp_path / "u.zarr"), DATA)
    # and back: the plain chunks copied into shards (the other direction of the copy)
    back = shardwise.convert(tmp_path / "u.zarr", tmp_path / "b.zarr", shards={"time": 25})
    assert back.arrays[0].method == "copy" and back.arrays[0].shards == (25, 40, 6)
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "b.zarr"), DATA)
    assert shardwise.verify(tmp_path / "u.zarr").ok


def test_unshard_a_dataset_group(tmp_path: Path) -> None:
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), DATA), "n": (("time",), np.arange(50.0))},
        coords={"time": np.arange(50), "lat": np.arange(37.0), "lon": np.arange(6.0)},
    )
    shardwise.to_zarr(ds.chunk(time=10), tmp_path / "s.zarr", shards={"time": 20})
    report = shardwise.convert(tmp_path / "s.zarr", tmp_path / "u.zarr", shards=None)
    assert all(a.shards is None for a in report.arrays) and len(report.arrays) == 5
    group = zarr.open_group(tmp_path / "u.zarr", mode="r")
    assert all(a.shards is None for _, a in group.arrays())
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "u.zarr").load(), ds)


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"shard_bytes": "2MB"}, "shard_bytes= does not apply"),
        ({"pyramid": True}, "pyramid= does not apply"),
        ({"chunks": "10"}, "chunks must be a shape"),
        ({"chunks": {"tme": 5}}, r"dimension\(s\) \['tme'\]"),
    ],
)
def test_unshard_refusals_before_anything_is_written(
    tmp_path: Path, kw: dict[str, object], words: str
) -> None:
    src = _sharded(tmp_path / "s.zarr")
    with pytest.raises((InvalidValueError, TypeError), match=words):
        shardwise.convert(src, tmp_path / "u.zarr", shards=None, **kw)  # type: ignore[arg-type]
    assert not (tmp_path / "u.zarr").exists()


def test_cli_unshard_inspect_and_verify_name_a_corrupt_chunk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _sharded(tmp_path / "s.zarr")
    dst = tmp_path / "u.zarr"
    assert main(["convert", str(src), str(dst), "--shards", "none", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "chunks   (10, 8, 3): grid (5, 5, 2) = 50 chunks, not sharded" in out
    assert "codecs   bytes -> zstd" in out and "stored   50 chunk objects" in out
    assert f"shardwise convert {dst} DST --shards SHARDS" in out
    assert main(["verify", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "OK; 50 shards stored" in out and "not sharded: each chunk object checked" in out
    chunk = dst / "c/2/1/0"
    chunk.write_bytes(chunk.read_bytes()[:-3])
    assert main(["verify", str(dst), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["problems"]
    assert [(p["kind"], p["key"]) for p in found] == [("corrupt", "c/2/1/0")]


def test_cli_inspect_of_a_zarr_python_unsharded_array(tmp_path: Path) -> None:
    """An unsharded array another tool wrote: its layout, exit 0, as a separate process."""
    a = zarr.create_array(tmp_path / "z.zarr", shape=(10, 7), chunks=(4, 3), dtype="i4")
    a[...] = np.arange(70).reshape(10, 7)
    done = subprocess.run(
        [*exe(), "inspect", str(tmp_path / "z.zarr")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "grid (3, 3) = 9 chunks, not sharded" in done.stdout


def test_cli_reshard_a_group_by_dimension_names(tmp_path: Path) -> None:
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), DATA)},
        coords={"time": np.arange(50), "lat": np.arange(37.0), "lon": np.arange(6.0)},
    )
    ds.to_zarr(
        tmp_path / "x.zarr",
        zarr_format=3,
        consolidated=False,
        encoding={"t2m": {"chunks": (10, 37, 6)}},
    )
    args = ["reshard", str(tmp_path / "x.zarr"), str(tmp_path / "r.zarr"), "--no-progress"]
    done = subprocess.run(
        [*exe(), *args, "--shards", "time=20", "--chunks", "time=5"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    t2m = zarr.open_array(tmp_path / "r.zarr", path="t2m", mode="r")
    assert t2m.shards == (20, 37, 6) and t2m.chunks == (5, 37, 6)
    assert zarr.open_array(tmp_path / "r.zarr", path="time", mode="r").chunks == (5,)
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "r.zarr", consolidated=False).load(), ds)


def test_unshard_copy_resumes_and_verify_checks_its_records(tmp_path: Path) -> None:
    """The copy runs as a write of the pipeline: a record per chunk object, a resume of a
    finished unshard has nothing to do, and ``verify`` checks the records it left."""
    src = _sharded(tmp_path / "s.zarr")
    shardwise.convert(src, tmp_path / "u.zarr", shards=None)
    again = shardwise.convert(src, tmp_path / "u.zarr", shards=None, resume=True)
    assert again.nothing_to_do and again.arrays[0].shards_skipped == 50
    checked = shardwise.verify(tmp_path / "u.zarr")
    assert checked.ok and checked.shards_stored == checked.shards_recorded == 50
    assert checked.chunks_checked == 50
