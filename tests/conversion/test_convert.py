"""shardwise.convert: v2 and v3 arrays and groups into sharded v3, copying encoded chunks when the
chunk grid and codecs carry over (checked byte for byte), re-encoding otherwise; resume, verify,
the CLI, S3, refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

import shardwise
from faultkit import BUCKET, files, moto_s3, temp_files
from oracles import assert_bit_equal
from shardwise.cli import main
from shardwise.errors import InvalidValueError, PlanError
from strategies import arrays, dtypes, examples, geometries

SHAPE = (37, 50)
CHUNKS = (8, 10)


def smooth(shape: tuple[int, ...] = SHAPE, dtype: str = "<u2") -> np.ndarray:
    rng = np.random.default_rng(7)
    grid = np.indices(shape).sum(axis=0)
    return (grid * 3 + rng.integers(0, 9, shape)).astype(dtype)


def make_v2(
    root: Path,
    *,
    compressor: Any = None,
    dtype: str = "<u2",
    order: str = "C",
    separator: str = ".",
    filters: Any = None,
) -> np.ndarray:
    """A v2 array with one chunk left missing (it must stay empty) and one equal to the fill."""
    x = smooth(dtype=dtype)
    z = zarr.create_array(
        root,
        shape=SHAPE,
        chunks=CHUNKS,
        dtype=dtype,
        zarr_format=2,
        compressors=compressor,
        filters=filters,
        order=order,  # type: ignore[arg-type]
        fill_value=5,
        chunk_key_encoding={"name": "v2", "separator": separator},  # type: ignore[arg-type]
        attributes={"units": "K"},
    )
    z[...] = x
    (root / separator.join(["1", "2"])).unlink()
    x[8:16, 20:30] = 5
    return x


def target_chunks(root: Path, shards: tuple[int, ...], chunks: tuple[int, ...]) -> dict:
    """{array chunk coords: encoded bytes} sliced out of every stored shard via its index,
    parsed with numpy here (independent of shardwise's index code); crc32c index at the end."""
    grid = [s // c for s, c in zip(shards, chunks, strict=True)]
    n = int(np.prod(grid))
    out = {}
    for path in sorted((root / "c").rglob("*")):
        if not path.is_file():
            continue
        shard = [int(p) for p in path.relative_to(root / "c").parts]
        raw = path.read_bytes()
        index = np.frombuffer(raw[-(16 * n + 4) : -4], "<u8").reshape(-1, 2)
        for flat, (off, nb) in enumerate(index):
            if off == 2**64 - 1:
                continue
            inside = np.unravel_index(flat, grid)
            coord = tuple(int(s * g + i) for s, g, i in zip(shard, grid, inside, strict=True))
            out[coord] = raw[int(off) : int(off + nb)]
    return out


def v2_chunks(root: Path, separator: str) -> dict:
    out = {}
    for path in root.rglob("*"):
        rel = str(path.relative_to(root))
        if path.is_file() and not rel.startswith(".z"):
            out[tuple(int(p) for p in rel.replace("/", ".").split("."))] = path.read_bytes()
    return out


V2_CASES = {
    "zstd": dict(compressor=numcodecs.Zstd(level=3)),
    "blosc": dict(compressor=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.BITSHUFFLE)),
    "gzip": dict(compressor=numcodecs.GZip(level=1)),
    "none": dict(compressor=None),
    "big-endian-zstd": dict(compressor=numcodecs.Zstd(level=1), dtype=">u2"),
    "big-endian-none": dict(compressor=None, dtype=">f8"),
    "F-order": dict(compressor=numcodecs.Zstd(), order="F", dtype=">i4"),
    "slash-separator": dict(compressor=numcodecs.Zstd(), separator="/"),
}


@pytest.mark.parametrize("case", V2_CASES)
def test_v2_chunks_are_copied_byte_for_byte(
    case: str,
    tmp_path: Path,
    read_zarr: Callable[..., np.ndarray],
    read_tensorstore: Callable[[Path], np.ndarray],
) -> None:
    kw = V2_CASES[case]
    src, dst = tmp_path / "v2.zarr", tmp_path / "out.zarr"
    x = make_v2(src, **kw)
    rep = shardwise.convert(src, dst, shards=(16, 30), verify=True)
    (arr,) = rep.arrays
    assert arr.method == "copy", arr.reason
    assert rep.ok and arr.verified
    # every stored inner chunk is the source chunk object, byte for byte; the missing one and
    # the chunks past the array's edge are empty
    copied = target_chunks(dst, (16, 30), CHUNKS)
    assert copied == v2_chunks(src, kw.get("separator", "."))
    assert (1, 2) not in copied
    np.testing.assert_array_equal(read_zarr(dst), x)
    np.testing.assert_array_equal(read_tensorstore(dst), x)
    z = zarr.open_array(dst, mode="r")
    assert z.shards == (16, 30) and z.chunks == CHUNKS and z.fill_value == 5
    want = np.dtype(kw.get("dtype", "<u2"))
    assert dict(z.attrs) == {"units": "K"} and z.dtype.str[1:] == want.str[1:]
    endian = z.metadata.to_dict()["codecs"][0]["configuration"]["codecs"][
        -2 if kw["compressor"] else -1
    ]
    assert endian["configuration"]["endian"] == ("big" if want.byteorder == ">" else "little")
    # 3 x 2 shards + zarr.json, from 5 x 5 - 1 chunks + .zarray + .zattrs
    assert (arr.objects_before, arr.objects_after, arr.shards_written) == (26, 7, 6)


@examples(25)
@given(
    geometry=geometries(max_ndim=3),
    dtype=dtypes(),
    order=st.sampled_from(["C", "F"]),
    big=st.booleans(),
    data=st.data(),
)
def test_any_v2_geometry_copies_to_the_same_values(
    fresh_dir: Callable[..., Path],
    geometry: Any,
    dtype: np.dtype[Any],
    order: str,
    big: bool,
    data: st.DataObject,
) -> None:
    """Any shape, chunking and shard multiple, every numeric dtype, both orders and byte orders:
    the copy reads back bit for bit (zarr-python), chunks stored only where the source had one."""
    if big and dtype.itemsize > 1:
        dtype = dtype.newbyteorder(">")
    fill = np.zeros((), dtype)[()]
    x = data.draw(arrays(geometry, np.dtype(dtype.newbyteorder("=")), fill))
    root = fresh_dir("conv")
    src, dst = root / "v2.zarr", root / "out.zarr"
    z = zarr.create_array(
        src,
        shape=geometry.shape,
        chunks=geometry.chunk_shape,
        dtype=dtype,
        zarr_format=2,
        compressors=numcodecs.Zstd(),
        order=order,  # type: ignore[arg-type]
        fill_value=fill,
    )
    z[...] = x
    rep = shardwise.convert(src, dst, shards=geometry.shard_shape)
    assert rep.arrays[0].method == "copy", rep
    # the source as zarr reads it (zarr-python drops chunks equal to the fill by value, -0.0 too)
    assert_bit_equal(zarr.open_array(dst, mode="r")[...], z[...])
    copied = target_chunks(dst, geometry.shard_shape, geometry.chunk_shape)
    assert copied == v2_chunks(src, ".")


def test_v2_filters_are_reencoded_and_said_so(tmp_path: Path) -> None:
    src, dst = tmp_path / "v2.zarr", tmp_path / "out.zarr"
    x = make_v2(src, compressor=numcodecs.Zstd(), filters=[numcodecs.Delta("<u2")])
    rep = shardwise.convert(src, dst, shards=(16, 20), verify=True)
    (arr,) = rep.arrays
    assert arr.method == "reencode" and "delta" in arr.reason and arr.verified
    np.testing.assert_array_equal(zarr.open_array(dst, mode="r")[...], x)


@pytest.mark.parametrize("sharded", [False, True])
def test_v3_sources_are_copied(
    sharded: bool, tmp_path: Path, read_tensorstore: Callable[[Path], np.ndarray]
) -> None:
    src, dst = tmp_path / "v3.zarr", tmp_path / "out.zarr"
    x = smooth().astype("float32")
    x[:8, :10] = np.nan
    if sharded:
        shardwise.write_array(x, src, chunks=CHUNKS, shards=(8, 20), fill_value=np.nan)
    else:
        zarr.create_array(src, shape=SHAPE, chunks=CHUNKS, dtype="float32", fill_value=np.nan)[
            ...
        ] = x
    rep = shardwise.convert(src, dst, shards=(24, 50), verify=True)
    (arr,) = rep.arrays
    assert arr.method == "copy" and arr.verified, arr
    np.testing.assert_array_equal(read_tensorstore(dst), x)
    if sharded:
        assert target_chunks(dst, (24, 50), CHUNKS) == target_chunks(src, (8, 20), CHUNKS)
    else:
        source = {
            tuple(int(p) for p in f.relative_to(src / "c").parts): f.read_bytes()
            for f in (src / "c").rglob("*")
            if f.is_file()
        }
        assert target_chunks(dst, (24, 50), CHUNKS) == source
    assert (0, 0) not in target_chunks(dst, (24, 50), CHUNKS)  # the NaN chunk stays empty


def test_shard_shapes_by_dimension_name_and_by_bytes(tmp_path: Path) -> None:
    src = tmp_path / "v3.zarr"
    shardwise.write_array(
        smooth(), src, chunks=CHUNKS, shards=(8, 10), dimension_names=("time", "x")
    )
    rep = shardwise.convert(src, tmp_path / "a.zarr", shards={"time": 20})
    assert rep.arrays[0].shards == (24, 50)  # rounded up to whole chunks; x: all of it fits
    rep = shardwise.convert(src, tmp_path / "b.zarr", shard_bytes=4 * 8 * 10 * 2)
    assert rep.arrays[0].shards in ((16, 20), (8, 40), (32, 10))
    assert zarr.open_array(tmp_path / "b.zarr").shards == rep.arrays[0].shards


# xarray's own to_zarr writes consolidated metadata (its default), and zarr warns about it
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
@pytest.mark.parametrize("fmt", [2, 3])
def test_xarray_dataset_groups_are_identical(fmt: int, tmp_path: Path) -> None:
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(0)
    t2m = rng.standard_normal((20, 9, 12)).astype("f4")
    t2m[3, 2, 2] = np.nan
    ds = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), t2m, {"units": "K", "long_name": "2 m temperature"}),
            "count": (("time",), np.arange(20, dtype="i4")),
            "level": ((), 850.0, {"units": "hPa"}),
        },
        coords={
            "time": pd.date_range("2000-01-01", periods=20),
            "lat": np.linspace(-80, 80, 9),
            "lon": np.arange(12.0),
        },
        attrs={"title": "test"},
    )
    src, dst = tmp_path / "ds.zarr", tmp_path / "out.zarr"
    ds.chunk({"time": 5, "lat": 3, "lon": 4}).to_zarr(src, zarr_format=fmt)
    rep = shardwise.convert(src, dst, shards={"time": 10}, verify=True)
    assert rep.ok
    assert {a.path for a in rep.arrays} == {"t2m", "count", "level", "time", "lat", "lon"}
    assert all(a.method == "copy" for a in rep.arrays)
    a, b = xr.open_zarr(src), xr.open_zarr(dst)
    assert b.identical(a)
    np.testing.assert_array_equal(b.t2m.values, t2m)
    t = zarr.open_array(dst, path="t2m", mode="r")
    assert t.metadata.dimension_names == ("time", "lat", "lon")
    assert t.shards == (10, 9, 12) and "_ARRAY_DIMENSIONS" not in t.attrs
    # the metadata is what xarray itself writes in v3 (attributes with _FillValue, dimension
    # names, fill value), apart from the layout and the codecs
    native = tmp_path / "native.zarr"
    ds.chunk({"time": 5, "lat": 3, "lon": 4}).to_zarr(native, zarr_format=3)
    for name in ds.variables:
        got = json.loads((dst / str(name) / "zarr.json").read_text())
        want = json.loads((native / str(name) / "zarr.json").read_text())
        for doc in (got, want):
            del doc["codecs"], doc["chunk_grid"]
        assert got == want, name


def test_copy_memory_does_not_grow_with_the_shard(tmp_path: Path) -> None:
    """Peak traced memory of the copy: one chunk at a time and the index, whatever the shard."""
    import tracemalloc

    src = tmp_path / "v2.zarr"
    x = np.random.default_rng(0).integers(0, 2**16, (1024, 1024), dtype="uint16")
    zarr.create_array(
        src, shape=x.shape, chunks=(64, 64), dtype="uint16", zarr_format=2, compressors=None
    )[...] = x
    peaks = {}
    shardwise.convert(src, tmp_path / "warm.zarr", shards=(128, 128))  # imports, pools
    for shards in [(128, 128), (1024, 1024)]:  # 32 KiB chunks in 256 KiB or 2 MiB shards
        with dask.config.set(scheduler="synchronous"):
            tracemalloc.start()
            try:
                shardwise.convert(src, tmp_path / f"{shards[0]}.zarr", shards=shards)
                peaks[shards[0]] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        got = zarr.open_array(tmp_path / f"{shards[0]}.zarr", mode="r")[...]
        np.testing.assert_array_equal(got, x)
    # the whole-array shard is 2 MiB: a copy that held it would peak above that
    assert peaks[1024] < 1.5 * 2**20, peaks
    assert peaks[1024] < peaks[128] + 2**18, peaks


def test_verify_compares_copied_chunks_with_the_source(tmp_path: Path) -> None:
    src, dst = tmp_path / "v2.zarr", tmp_path / "out.zarr"
    make_v2(src, compressor=None)
    assert shardwise.convert(src, dst, shards=(16, 20), verify=True).ok
    # the source changes after the conversion (same length): verify sees the copied chunk differ
    chunk = src / "2.3"
    raw = bytearray(chunk.read_bytes())
    raw[0] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    rep = shardwise.convert(src, dst, shards=(16, 20), resume=True, verify=True)
    assert rep.arrays[0].shards_written == 0 and rep.arrays[0].shards_skipped == 9
    assert not rep.ok and rep.arrays[0].verified is False
    assert any("(2, 3)" in p and "differ" in p for p in rep.problems), rep.problems


# xarray's own to_zarr writes consolidated metadata (its default), and zarr warns about it
@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning")
@pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning")
@pytest.mark.parametrize("fmt", [2, 3])
def test_fixed_width_string_coordinates_are_copied(fmt: int, tmp_path: Path) -> None:
    import xarray as xr

    ds = xr.Dataset(
        {"v": (("station",), np.arange(4.0))},
        coords={
            "station": ["a", "bb", "ccc", "d"],
            "code": ("station", np.array([b"x", b"yy", b"z", b"w"])),
        },
    )
    src, dst = tmp_path / "ds.zarr", tmp_path / "out.zarr"
    ds.to_zarr(src, zarr_format=fmt)
    rep = shardwise.convert(src, dst, verify=True)
    assert rep.ok and all(a.method == "copy" for a in rep.arrays), rep
    assert xr.open_zarr(dst).identical(xr.open_zarr(src))


# -- resume ---------------------------------------------------------------------------------------


class FailingGets(WrapperStore[Store]):
    """Raises on every chunk ``get`` after ``allowed`` of them (metadata reads pass)."""

    def __init__(self, store: Store, allowed: int, state: dict[str, int] | None = None) -> None:
        super().__init__(store)
        self.state = state if state is not None else {"left": allowed}

    def _with_store(self, store: Store) -> FailingGets:
        return FailingGets(store, 0, self.state)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if not key.rsplit("/", 1)[-1].startswith((".z", "zarr.json")):
            if self.state["left"] <= 0:
                raise OSError(f"source went away reading {key}")
            self.state["left"] -= 1
        return await self._store.get(key, prototype, byte_range)


@pytest.mark.parametrize("method", ["copy", "reencode"])
def test_an_interrupted_conversion_resumes(method: str, tmp_path: Path) -> None:
    src, dst, ref = tmp_path / "v2.zarr", tmp_path / "out.zarr", tmp_path / "ref.zarr"
    # a Delta filter has no v3 codec: that array is decoded and re-encoded (write_array)
    filters = [numcodecs.Delta("<u2")] if method == "reencode" else None
    x = make_v2(src, compressor=numcodecs.Zstd(), filters=filters)
    shardwise.convert(src, ref, shards=(8, 20))
    flaky = FailingGets(LocalStore(src, read_only=True), allowed=12)
    # one task at a time: the shards whose chunks came within the first gets are committed
    with dask.config.set(scheduler="synchronous"), pytest.raises(OSError, match="went away"):
        shardwise.convert(flaky, dst, shards=(8, 20))
    done = [p for p in (dst / "c").rglob("*") if p.is_file()]
    assert 1 <= len(done) < 15 and not temp_files(dst)
    with pytest.raises(FileExistsError):
        shardwise.convert(src, dst, shards=(8, 20))
    rep = shardwise.convert(src, dst, shards=(8, 20), resume=True, verify=True)
    (arr,) = rep.arrays
    assert arr.method == method
    assert (arr.shards_skipped, arr.shards_written) == (len(done), 15 - len(done))
    assert arr.verified
    np.testing.assert_array_equal(zarr.open_array(dst, mode="r")[...], x)
    assert files(dst) == files(ref)  # shards (and metadata) as an uninterrupted conversion
    assert shardwise.verify(dst).ok


# -- refusals leave the destination as it was --------------------------------------------------


def test_refusals_leave_the_destination_byte_identical(tmp_path: Path) -> None:
    src, dst = tmp_path / "v2.zarr", tmp_path / "out.zarr"
    make_v2(src, compressor=numcodecs.Zstd())
    shardwise.convert(src, dst, shards=(16, 20))
    before = files(dst, journal=True)
    with pytest.raises(FileExistsError, match="mode='w'"):
        shardwise.convert(src, dst, shards=(16, 20))
    with pytest.raises(InvalidValueError, match="positive sizes"):
        shardwise.convert(src, dst, shards=(0, 20), mode="w")
    with pytest.raises(InvalidValueError, match="mode"):
        shardwise.convert(src, dst, mode="a")
    assert files(dst, journal=True) == before
    fresh = tmp_path / "never.zarr"
    with pytest.raises(InvalidValueError):
        shardwise.convert(src, fresh, shards=(7,))
    assert not fresh.exists() or not any(fresh.rglob("*"))


def test_a_group_is_refused_whole_before_anything_is_written(tmp_path: Path) -> None:
    src, dst = tmp_path / "g.zarr", tmp_path / "out.zarr"
    g = zarr.open_group(src, mode="w", zarr_format=2)
    g.create_array("a", shape=(10,), chunks=(5,), dtype="f4")[...] = np.arange(10.0)
    g.create_array("names", shape=(3,), chunks=(3,), dtype=str)[...] = ["x", "yy", "z"]
    with pytest.raises(PlanError, match="'names'"):
        shardwise.convert(src, dst)
    assert not dst.exists()
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    zarr.open_group(dst, mode="w", zarr_format=3)
    before = files(dst, journal=True)
    with pytest.raises(PlanError):
        shardwise.convert(src, dst, mode="w")
    with pytest.raises(FileExistsError):
        shardwise.convert(src, dst, path="a", dst_path="")
    assert files(dst, journal=True) == before


def test_a_held_lease_refuses_the_group_before_any_byte(tmp_path: Path) -> None:
    from shardwise.durability.lease import Lease
    from shardwise.errors import LeaseHeldError
    from shardwise.storage.store import ShardStore

    src, dst = tmp_path / "g.zarr", tmp_path / "out.zarr"
    g = zarr.open_group(src, mode="w", zarr_format=2)
    for name in ("a", "b"):
        g.create_array(name, shape=(10,), chunks=(5,), dtype="f4")[...] = np.arange(10.0)
    (dst / "b").mkdir(parents=True)
    with Lease.acquire(ShardStore(LocalStore(dst), "b"), purpose="a job that died"):
        before = files(dst, journal=True)
        with pytest.raises(LeaseHeldError, match=r"'b'.*break_lease"):
            shardwise.convert(src, dst, resume=True)
        assert files(dst, journal=True) == before
    rep = shardwise.convert(src, dst, resume=True, verify=True)
    assert rep.ok and [a.shards_written for a in rep.arrays] == [1, 1]


def test_inspect_a_converted_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = tmp_path / "g.zarr", tmp_path / "out.zarr"
    g = zarr.open_group(src, mode="w", zarr_format=2)
    g.create_array("a", shape=(40,), chunks=(5,), dtype="f4")[...] = np.arange(40.0)
    g.create_array("b", shape=(6, 8), chunks=(2, 2), dtype="i2")[...] = 1
    with pytest.raises(InvalidValueError, match=r"array 'b' has 2 dimension\(s\)"):
        shardwise.convert(src, dst, shards=(20,))  # a 1-d shape cannot apply to the 2-d "b"
    assert not dst.exists()
    rep = shardwise.convert(src, dst, shard_bytes=80)  # 4 chunks of "a", 6 of "b"
    assert [(a.objects_before, a.objects_after) for a in rep.arrays] == [(10, 3), (14, 3)]
    assert [a.shards for a in rep.arrays] == [(20,), (6, 4)]
    assert main(["inspect", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "a group of 2 arrays, 6 objects" in out
    assert "a  (40,) float32, shards (20,)" in out and "b  (6, 8) int16, shards (6, 4)" in out
    assert main(["inspect", str(dst), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [a["objects"] for a in d["arrays"]] == [3, 3]


# -- CLI, inspect, reshard ------------------------------------------------------------------------


def test_cli_convert_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = tmp_path / "v2.zarr", tmp_path / "out.zarr"
    x = make_v2(src, compressor=numcodecs.Blosc())
    args = ["convert", str(src), str(dst), "--shards", "16,20", "--verify", "--json"]
    assert main([*args, "--no-progress"]) == 0
    out = capsys.readouterr().out
    got = json.loads(out[: out.rindex("}") + 1])
    assert got["ok"] and got["arrays"][0]["method"] == "copy"
    assert (got["arrays"][0]["objects_before"], got["arrays"][0]["objects_after"]) == (26, 10)
    assert main(args) == 3  # exists
    assert "ArrayExistsError" in capsys.readouterr().err
    assert main(["inspect", str(dst), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["shards_stored"] == 9 and d["shards_recorded"] == 9
    np.testing.assert_array_equal(zarr.open_array(dst, mode="r")[...], x)
    # reshard is convert: same copy, its flags still work
    assert main(["reshard", str(src), str(tmp_path / "r.zarr"), "--shards", "16,20"]) == 0
    assert "copy (" in capsys.readouterr().out
    assert files(tmp_path / "r.zarr") == files(dst)


def test_cli_shards_by_dimension_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = tmp_path / "v3.zarr", tmp_path / "out.zarr"
    shardwise.write_array(smooth(), src, chunks=CHUNKS, shards=(8, 10), dimension_names=("y", "x"))
    assert main(["convert", str(src), str(dst), "--shards", "y=16", "--shard-bytes", "1MiB"]) == 0
    assert zarr.open_array(dst).shards == (16, 50)
    with pytest.raises(SystemExit) as e:
        main(["convert", str(src), str(dst), "--shards", "y=a"])
    assert e.value.code == 2


# -- S3 -------------------------------------------------------------------------------------------


def test_convert_to_s3(tmp_path: Path) -> None:
    src = tmp_path / "v2.zarr"
    x = make_v2(src, compressor=numcodecs.Zstd())
    with moto_s3() as s3:
        store = s3.obstore("conv")
        rep = shardwise.convert(src, store, shards=(16, 20), verify=True)
        assert rep.ok and rep.arrays[0].method == "copy"
        np.testing.assert_array_equal(zarr.open_array(store, mode="r")[...], x)
        open_uploads = s3.client.list_multipart_uploads(Bucket=BUCKET, Prefix="conv/")
        assert open_uploads.get("Uploads", []) == []
        assert len([k for k in s3.keys("conv") if k.startswith("c/")]) == 9
        # and back from S3: a sharded v3 source read by ranges after its index
        back = tmp_path / "back.zarr"
        rep = shardwise.convert(store, back, shards=(8, 50), verify=True)
        assert rep.ok and rep.arrays[0].method == "copy"
        np.testing.assert_array_equal(zarr.open_array(back, mode="r")[...], x)
        assert target_chunks(back, (8, 50), CHUNKS) == v2_chunks(src, ".")


# -- progress and a cluster -----------------------------------------------------------------------


def test_progress_counts_shards_and_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "v2.zarr", tmp_path / "out.zarr"
    make_v2(src, compressor=numcodecs.Zstd())
    rep = shardwise.convert(src, dst, shards=(16, 20), progress=True)
    err = capsys.readouterr().err
    # 9 shards (no other task), and the bytes stored
    assert "9/9" in err and "shard/s" in err
    assert f"{rep.arrays[0].bytes_stored / 1e6:.1f} MB" in err


def test_convert_on_a_cluster(
    tmp_path: Path, client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "v2.zarr", tmp_path / "out.zarr"
    x = make_v2(src, compressor=numcodecs.Zstd(), dtype=">u2")
    with dask.config.set(scheduler=client):
        rep = shardwise.convert(src, dst, shards=(16, 20), verify=True, progress=True)
    assert rep.ok and rep.arrays[0].method == "copy" and rep.arrays[0].shards_written == 9
    assert "9/9" in capsys.readouterr().err  # the bar counts shards on the cluster too
    np.testing.assert_array_equal(zarr.open_array(dst, mode="r")[...], x)


def test_index_at_the_start_into_a_memory_store(tmp_path: Path) -> None:
    """A v3 source with its shard index first, copied into a store that is neither local nor S3
    (the shard joined in memory, one put)."""
    from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec
    from zarr.storage import MemoryStore

    src = tmp_path / "s.zarr"
    x = smooth().astype("i4")
    sharding = ShardingCodec(
        chunk_shape=CHUNKS, codecs=[BytesCodec(), ZstdCodec()], index_location="start"
    )
    z = zarr.create_array(
        src, shape=SHAPE, chunks=(16, 20), dtype="i4", serializer=sharding, compressors=None
    )
    z[...] = x
    dst = MemoryStore()
    rep = shardwise.convert(src, dst, shards=(24, 50), verify=True)
    assert rep.ok and rep.arrays[0].method == "copy"
    np.testing.assert_array_equal(zarr.open_array(dst, mode="r")[...], x)


def test_nested_groups_keep_their_attributes(tmp_path: Path) -> None:
    """An image pyramid with a labels subgroup (the OME-Zarr 0.4 layout): every array of every
    group converted, group attributes carried over as they are."""
    src, dst = tmp_path / "img.zarr", tmp_path / "out.zarr"
    g = zarr.open_group(src, mode="w", zarr_format=2, attributes={"multiscales": [{"v": 1}]})
    for level, n in (("0", 64), ("1", 32)):
        g.create_array(level, shape=(n, n), chunks=(16, 16), dtype="u1", compressors=None)[...] = 1
    labels = g.create_group("labels", attributes={"labels": ["cells"]})
    labels.create_array("cells", shape=(8, 8), chunks=(4, 4), dtype="u4")[...] = 3
    rep = shardwise.convert(src, dst, verify=True)
    assert rep.ok and [a.path for a in rep.arrays] == ["0", "1", "labels/cells"]
    assert (rep.objects_before, rep.objects_after) == (30, 6)
    out = zarr.open_group(dst, mode="r")
    assert out.metadata.zarr_format == 3
    assert dict(out.attrs) == {"multiscales": [{"v": 1}]}
    assert dict(out["labels"].attrs) == {"labels": ["cells"]}
    assert int(out["labels/cells"][...].sum()) == 3 * 64 and out["0"].shards == (64, 64)
