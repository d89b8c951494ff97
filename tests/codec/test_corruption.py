"""Bad stored bytes give shardwise's CorruptShardError naming the key (and inner chunk), never
a numpy reshape/overflow/memory error and never silent wrong data where a checksum exists.

Every case is read twice: the whole array (each shard fetched whole and decoded) and a small
window (the shard index fetched on its own, then only the needed inner chunks as byte ranges).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.codecs as zc

import shardwise
from shardwise import CorruptShardError
from shardwise.codec.codecs import crc32c
from shardwise.engine.read import open_reader

PATH = "grp/arr"
SHAPE = (16, 16)
SHARDS = (8, 8)
INNER = (4, 4)
NCHUNKS = 4  # inner chunks per shard
INDEX_NBYTES = 16 * NCHUNKS + 4
MISSING = 2**64 - 1
FILL = -1.5

WHOLE = (slice(None), slice(None))
# a window inside inner chunk (0, 0) of shard (0, 0) and one inside inner chunk (0, 1) of (1, 1)
WINDOW_00 = (slice(1, 3), slice(1, 3))
WINDOW_11 = (slice(9, 11), slice(13, 15))

Fix = Callable[[np.ndarray, int], None]


def _data(dtype: str = "float32") -> np.ndarray:
    return (np.arange(np.prod(SHAPE)).reshape(SHAPE) % 251 + 1).astype(dtype)


def make_array(
    root: Path,
    *,
    location: str = "end",
    compressors: Any = None,
    dtype: str = "float32",
    index_crc: bool = True,
) -> np.ndarray:
    """Write the test array with shardwise into ``root`` at ``PATH``; returns the data."""
    data = _data(dtype)
    if index_crc:
        shardwise.write_array(
            data,
            str(root),
            path=PATH,
            chunks=INNER,
            shards={"shape": SHARDS, "index_location": location},
            compressors=compressors,
            fill_value=FILL,
        )
    else:
        # zarr's create_array always adds crc32c to the index; build the codec by hand
        zarr.create_array(
            zarr.storage.LocalStore(root),
            name=PATH,
            shape=SHAPE,
            dtype=dtype,
            chunks=SHARDS,
            serializer=zc.ShardingCodec(
                chunk_shape=INNER,
                codecs=[zc.BytesCodec()],
                index_codecs=[zc.BytesCodec()],
                index_location=location,  # type: ignore[arg-type]
            ),
            compressors=None,
            filters=None,
            fill_value=FILL,
        )
        shardwise.write_array(data, str(root), path=PATH, mode="r+")
    return data


def shard_file(root: Path, key: str = "c/0/0") -> Path:
    return root / PATH / key


def rewrite_index(path: Path, location: str, fix: Fix) -> None:
    """Change index entries of a stored shard and store the index with a valid checksum."""
    raw = bytearray(path.read_bytes())
    where = slice(0, INDEX_NBYTES) if location == "start" else slice(len(raw) - INDEX_NBYTES, None)
    index = np.frombuffer(bytes(raw[where][:-4]), dtype="<u8").reshape(-1, 2).copy()
    fix(index, len(raw))
    body = index.astype("<u8").tobytes()
    raw[where] = body + crc32c(body).to_bytes(4, "little")
    path.write_bytes(bytes(raw))


def flip(path: Path, pos: int, mask: int = 0x10) -> None:
    raw = bytearray(path.read_bytes())
    raw[pos] ^= mask
    path.write_bytes(bytes(raw))


def expect_corrupt(
    root: Path,
    sel: tuple[slice, ...],
    key: str = "c/0/0",
    chunk: tuple[int, ...] | None = None,
    match: str | None = None,
) -> CorruptShardError:
    reader = open_reader(str(root), path=PATH)
    with pytest.raises(CorruptShardError, match=match) as info:
        reader[sel]
    err = info.value
    assert isinstance(err, ValueError)
    assert err.key == f"{PATH}/{key}"
    assert f"{PATH}/{key}" in str(err)
    if chunk is not None:
        assert err.chunk == chunk
        assert str(chunk) in str(err)
    return err


def both_paths(root: Path, **kw: Any) -> None:
    """The whole-array read and the small-window read both raise CorruptShardError."""
    expect_corrupt(root, WHOLE, **kw)
    expect_corrupt(root, WINDOW_00 if kw.get("key", "c/0/0") == "c/0/0" else WINDOW_11, **kw)


# -- the shard as a whole --------------------------------------------------------------------------


@pytest.mark.parametrize("location", ["end", "start"])
def test_intact_array_reads_back(tmp_path: Path, location: str) -> None:
    data = make_array(tmp_path, location=location)
    reader = open_reader(str(tmp_path), path=PATH)
    np.testing.assert_array_equal(reader[WHOLE], data)
    np.testing.assert_array_equal(reader[WINDOW_00], data[WINDOW_00])
    np.testing.assert_array_equal(reader[WINDOW_11], data[WINDOW_11])


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("index_crc", [True, False])
def test_zero_size_shard(tmp_path: Path, location: str, index_crc: bool) -> None:
    make_array(tmp_path, location=location, index_crc=index_crc)
    shard_file(tmp_path).write_bytes(b"")
    both_paths(tmp_path, chunk=None, match="0 bytes, smaller than")


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("keep", [1, INDEX_NBYTES - 1, INDEX_NBYTES + 10, -1])
def test_truncated_shard(tmp_path: Path, location: str, keep: int) -> None:
    make_array(tmp_path, location=location)
    f = shard_file(tmp_path)
    f.write_bytes(f.read_bytes()[:keep])
    both_paths(tmp_path)


@pytest.mark.parametrize("location", ["end", "start"])
def test_truncated_shard_without_index_checksum(tmp_path: Path, location: str) -> None:
    make_array(tmp_path, location=location, index_crc=False)
    f = shard_file(tmp_path)
    f.write_bytes(f.read_bytes()[:-8])
    both_paths(tmp_path)


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("byte", [0, 17, INDEX_NBYTES - 5, INDEX_NBYTES - 1])
def test_index_checksum_mismatch(tmp_path: Path, location: str, byte: int) -> None:
    make_array(tmp_path, location=location)
    f = shard_file(tmp_path)
    start = 0 if location == "start" else f.stat().st_size - INDEX_NBYTES
    flip(f, start + byte)
    both_paths(tmp_path, chunk=None, match="checksum mismatch")


def _set(row: int, col: int, value: Callable[[int], int]) -> Fix:
    def fix(index: np.ndarray, size: int) -> None:
        index[row, col] = value(size)

    return fix


# (entry, field, value from the object size and location) -> the entry's inner-chunk coordinates
BAD_ENTRIES: dict[str, tuple[int, int, Callable[[int, str], int]]] = {
    "offset_at_end": (0, 0, lambda size, loc: size),
    "offset_past_end": (2, 0, lambda size, loc: size + 1000),
    "nbytes_past_end": (1, 1, lambda size, loc: size),
    "offset_into_index": (3, 0, lambda size, loc: 4 if loc == "start" else size - INDEX_NBYTES + 4),
    "chunk_overlaps_index": (
        3,
        1,
        lambda size, loc: 2 * INDEX_NBYTES if loc == "start" else INDEX_NBYTES,
    ),
    "offset_only_missing": (0, 0, lambda size, loc: MISSING),
    "nbytes_only_missing": (3, 1, lambda size, loc: MISSING),
    "nbytes_2_50": (0, 1, lambda size, loc: 2**50),
    "offset_2_63": (1, 0, lambda size, loc: 2**63),
    "offset_2_64_minus_2": (2, 0, lambda size, loc: MISSING - 1),
    "nbytes_2_64_minus_2": (2, 1, lambda size, loc: MISSING - 1),
}


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("case", sorted(BAD_ENTRIES))
def test_bad_index_entry(tmp_path: Path, location: str, case: str) -> None:
    make_array(tmp_path, location=location)
    row, col, value = BAD_ENTRIES[case]
    rewrite_index(shard_file(tmp_path), location, _set(row, col, lambda s: value(s, location)))
    chunk = tuple(int(x) for x in np.unravel_index(row, (2, 2)))
    both_paths(tmp_path, chunk=chunk)


@pytest.mark.parametrize("location", ["end", "start"])
def test_bad_index_entry_without_index_checksum(tmp_path: Path, location: str) -> None:
    make_array(tmp_path, location=location, index_crc=False)
    f = shard_file(tmp_path)
    raw = bytearray(f.read_bytes())
    start = 0 if location == "start" else len(raw) - 16 * NCHUNKS
    raw[start + 8 : start + 16] = (2**50).to_bytes(8, "little")  # nbytes of chunk (0, 0)
    f.write_bytes(bytes(raw))
    both_paths(tmp_path, chunk=(0, 0))


def test_nbytes_too_small_for_the_chunk(tmp_path: Path) -> None:
    make_array(tmp_path)
    rewrite_index(shard_file(tmp_path), "end", _set(0, 1, lambda size: 60))
    both_paths(tmp_path, chunk=(0, 0), match="expected 64")


def test_both_fields_missing_is_an_empty_chunk(tmp_path: Path) -> None:
    data = make_array(tmp_path)

    def drop(index: np.ndarray, size: int) -> None:
        index[0] = MISSING

    rewrite_index(shard_file(tmp_path), "end", drop)
    expected = data.copy()
    expected[:4, :4] = FILL
    reader = open_reader(str(tmp_path), path=PATH)
    np.testing.assert_array_equal(reader[WHOLE], expected)
    np.testing.assert_array_equal(reader[WINDOW_00], expected[WINDOW_00])


@pytest.mark.parametrize(("written", "declared"), [("end", "start"), ("start", "end")])
def test_index_at_the_wrong_end(tmp_path: Path, written: str, declared: str) -> None:
    make_array(tmp_path, location=written)
    meta = tmp_path / PATH / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["codecs"][0]["configuration"]["index_location"] = declared
    meta.write_text(json.dumps(doc))
    both_paths(tmp_path, chunk=None, match="checksum mismatch")


@pytest.mark.parametrize(
    "compressors",
    [None, [zc.ZstdCodec(level=1)], [zc.BloscCodec(cname="lz4")], [zc.GzipCodec(level=1)]],
    ids=["raw", "zstd", "blosc", "gzip"],
)
@pytest.mark.parametrize(
    ("written", "declared"), [("float32", "float64"), ("float64", "float32"), ("int16", "int8")]
)
def test_metadata_with_wrong_dtype_width(
    tmp_path: Path, compressors: Any, written: str, declared: str
) -> None:
    make_array(tmp_path, compressors=compressors, dtype=written)
    meta = tmp_path / PATH / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["data_type"] = declared
    doc["fill_value"] = -1
    meta.write_text(json.dumps(doc))
    both_paths(tmp_path, chunk=(0, 0))


@pytest.mark.parametrize(
    "compressors",
    [[zc.Crc32cCodec()], [zc.ZstdCodec(level=1), zc.Crc32cCodec()]],
    ids=["crc32c", "zstd+crc32c"],
)
@pytest.mark.parametrize("location", ["end", "start"])
def test_inner_checksum_mismatch(tmp_path: Path, compressors: Any, location: str) -> None:
    data = make_array(tmp_path, compressors=compressors, location=location)
    f = shard_file(tmp_path, "c/1/1")
    index_at = 0 if location == "start" else f.stat().st_size - INDEX_NBYTES
    index = np.frombuffer(f.read_bytes()[index_at : index_at + 16 * NCHUNKS], "<u8").reshape(-1, 2)
    offset, nbytes = (int(x) for x in index[1])  # inner chunk (0, 1)
    flip(f, offset + nbytes // 2)
    both_paths(tmp_path, key="c/1/1", chunk=(0, 1), match="crc32c")
    # the other inner chunks of that shard and the other shards still read
    reader = open_reader(str(tmp_path), path=PATH)
    np.testing.assert_array_equal(reader[8:12, 8:12], data[8:12, 8:12])
    np.testing.assert_array_equal(reader[:8], data[:8])


def test_garbage_compressed_chunk(tmp_path: Path) -> None:
    make_array(tmp_path, compressors=[zc.ZstdCodec(level=1)])
    f = shard_file(tmp_path)
    raw = bytearray(f.read_bytes())
    raw[0:12] = b"\xff" * 12  # destroys the zstd frame header of inner chunk (0, 0)
    f.write_bytes(bytes(raw))
    both_paths(tmp_path, chunk=(0, 0))


@pytest.mark.parametrize("location", ["end", "start"])
def test_missing_shard_reads_as_fill(tmp_path: Path, location: str) -> None:
    data = make_array(tmp_path, location=location)
    shard_file(tmp_path).unlink()
    expected = data.copy()
    expected[:8, :8] = FILL
    reader = open_reader(str(tmp_path), path=PATH)
    np.testing.assert_array_equal(reader[WHOLE], expected)
    np.testing.assert_array_equal(reader[WINDOW_00], expected[WINDOW_00])
    np.testing.assert_array_equal(reader[6:10, 6:10], expected[6:10, 6:10])
    lazy = shardwise.open_array(str(tmp_path), path=PATH, chunks=(3, 5))
    np.testing.assert_array_equal(lazy.compute(), expected)


def test_error_surfaces_through_dask(tmp_path: Path) -> None:
    make_array(tmp_path)
    flip(shard_file(tmp_path), shard_file(tmp_path).stat().st_size - 1)
    lazy = shardwise.open_array(str(tmp_path), path=PATH)
    with pytest.raises(CorruptShardError, match="grp/arr/c/0/0"):
        lazy.compute(scheduler="threads")
    # shards other than the bad one still read
    np.testing.assert_array_equal(lazy[8:].compute(), _data()[8:])


def test_error_pickles_with_key_and_chunk() -> None:
    err = CorruptShardError("a/c/0/1", "crc32c checksum mismatch", chunk=(2, 3))
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, CorruptShardError)
    assert (back.key, back.problem, back.chunk) == ("a/c/0/1", "crc32c checksum mismatch", (2, 3))
    assert str(back) == str(err)


# -- writing over a corrupt shard ------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncate", "index_checksum", "inner_checksum"])
def test_partial_write_over_corrupt_shard_refuses(tmp_path: Path, damage: str) -> None:
    make_array(tmp_path, compressors=[zc.Crc32cCodec()])
    f = shard_file(tmp_path)
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[:-3])
    elif damage == "index_checksum":
        flip(f, f.stat().st_size - 10)
    else:
        flip(f, 5)  # inside inner chunk (0, 0), which the write below covers only in part
    before = f.read_bytes()
    patch = np.full((2, 2), 7.0, dtype="float32")
    with pytest.raises(CorruptShardError, match="grp/arr/c/0/0"):
        shardwise.write_array(
            patch, str(tmp_path), path=PATH, mode="r+", region=(slice(1, 3), slice(1, 3))
        )
    assert f.read_bytes() == before


# -- a long-lived reader after the array was rewritten ---------------------------------------------


def test_reader_opened_before_a_rewrite_sees_new_data(tmp_path: Path) -> None:
    data = make_array(tmp_path)
    lazy = shardwise.open_array(str(tmp_path), path=PATH, chunks=(2, 2))
    np.testing.assert_array_equal(lazy.compute(scheduler="threads"), data)
    new = data.copy()
    new[:4, :4] = FILL  # inner chunk (0, 0) of every first shard now empty: offsets shift
    new[4:8, 4:8] = 3.0
    shardwise.write_array(
        new,
        str(tmp_path),
        path=PATH,
        chunks=INNER,
        shards=SHARDS,
        fill_value=FILL,
        compressors=None,
        mode="w",
    )
    np.testing.assert_array_equal(lazy.compute(scheduler="threads"), new)


def test_reader_on_a_memory_store_sees_a_rewrite() -> None:
    """Without cache_indexes, non-local stores fetch the index with every partial read."""
    store = zarr.storage.MemoryStore()
    data = np.arange(64, dtype="f4").reshape(8, 8)
    shardwise.write_array(data, store, chunks=(2, 2), shards=(8, 8), compressors=None)
    lazy = shardwise.open_array(store, chunks=(2, 2))
    np.testing.assert_array_equal(lazy.compute(scheduler="threads"), data)
    new = data.copy()
    new[:2, :2] = 0  # inner chunk (0, 0) now empty: every later offset shifts
    new[4:6, 4:6] = -1
    shardwise.write_array(new, store, chunks=(2, 2), shards=(8, 8), compressors=None, mode="w")
    np.testing.assert_array_equal(lazy.compute(scheduler="threads"), new)


@pytest.mark.parametrize("compressors", [None, zc.ZstdCodec(level=3)], ids=["raw", "zstd"])
def test_large_chunks_decoded_in_place(tmp_path: Path, compressors: Any) -> None:
    """Chunks of 256 KiB that span the trailing axes decode straight into the output; a
    region cutting chunks and a bad frame take the same care as the stacked path."""
    rng = np.random.default_rng(5)
    data = np.round(rng.normal(size=(24, 128, 128)), 2).astype("float32")
    shardwise.write_array(
        data,
        str(tmp_path),
        path="big",
        chunks=(4, 128, 128),
        shards=(16, 128, 128),
        compressors=compressors,
        fill_value=0,
    )
    arr = shardwise.open_array(str(tmp_path), path="big")
    np.testing.assert_array_equal(arr.compute(), data)
    np.testing.assert_array_equal(arr[3:13, 5:100, 7:9].compute(), data[3:13, 5:100, 7:9])
    if compressors is None:
        return
    shard = tmp_path / "big" / "c" / "0" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(raw[-(16 * 4 + 4) : -4]), dtype="<u8").reshape(-1, 2)
    offset, nbytes = (int(x) for x in index[1])
    raw[offset + nbytes // 2 : offset + nbytes // 2 + 64] = bytes(64)  # garble chunk 1's frame
    shard.write_bytes(bytes(raw))
    with pytest.raises(CorruptShardError) as e:
        shardwise.open_array(str(tmp_path), path="big").compute()
    assert "big/c/0/0/0" in str(e.value) and "(1, 0, 0)" in str(e.value)


# -- the default codecs: every inner chunk carries zstd's frame checksum ---------------------------


def write_default(root: Path, writer: str, shape: tuple[int, int], inner: tuple[int, int]) -> Any:
    """Random float32 data (zstd stores it as raw blocks, so a flipped byte still decompresses)
    written at ``PATH`` with the default codecs; returns the data."""
    data = np.random.default_rng(5).standard_normal(shape).astype("float32")
    shards = (shape[0] // 2, shape[1] // 2)
    if writer == "write_array":
        shardwise.write_array(data, str(root), path=PATH, chunks=inner, shards=shards)
    else:
        import xarray as xr

        ds = xr.Dataset({"arr": (("y", "x"), data)})
        enc = {"arr": {"chunks": inner, "shards": shards}}
        shardwise.to_zarr(ds, str(root), group="grp", encoding=enc)
    return data


def flip_payload(root: Path, chunk: int) -> None:
    """Flip a byte in the middle of inner chunk ``chunk`` (flat) of shard c/1/1."""
    f = shard_file(root, "c/1/1")
    index_at = f.stat().st_size - INDEX_NBYTES
    index = np.frombuffer(f.read_bytes()[index_at : index_at + 16 * NCHUNKS], "<u8").reshape(-1, 2)
    offset, nbytes = (int(x) for x in index[chunk])
    flip(f, offset + nbytes // 2, mask=0x01)


GEOMETRIES = {"small-chunks": ((16, 16), (4, 4)), "large-chunks": ((512, 512), (128, 128))}


@pytest.mark.parametrize("writer", ["write_array", "to_zarr"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_default_codecs_detect_a_flipped_payload_byte(
    tmp_path: Path, writer: str, geometry: str
) -> None:
    shape, inner = GEOMETRIES[geometry]
    data = write_default(tmp_path, writer, shape, inner)
    meta = json.loads((tmp_path / PATH / "zarr.json").read_text())
    inner_codecs = meta["codecs"][0]["configuration"]["codecs"]
    assert inner_codecs[-1] == {"name": "zstd", "configuration": {"level": 0, "checksum": True}}
    # intact: shardwise, zarr-python and tensorstore read it back
    reader = open_reader(str(tmp_path), path=PATH)
    np.testing.assert_array_equal(reader[WHOLE], data)
    np.testing.assert_array_equal(zarr.open_array(tmp_path, path=PATH, mode="r")[...], data)
    np.testing.assert_array_equal(tensorstore_read(tmp_path / PATH), data)

    flip_payload(tmp_path, 1)  # inner chunk (0, 1) of shard (1, 1)
    h, w = shape[0] // 2, shape[1] // 2
    window = (slice(h + 1, h + 3), slice(w + inner[1] + 1, w + inner[1] + 3))
    for sel in (WHOLE, (slice(h, None), slice(w, None)), window):
        expect_corrupt(tmp_path, sel, key="c/1/1", chunk=(0, 1), match="checksum")
    lazy = shardwise.open_array(str(tmp_path), path=PATH)
    with pytest.raises(CorruptShardError, match="checksum"):
        lazy.compute(scheduler="threads")
    np.testing.assert_array_equal(reader[:h], data[:h])  # the other shards still read
    problems = shardwise.verify(str(tmp_path), path=PATH).problems
    assert [(p.kind, p.key, p.chunk) for p in problems] == [("corrupt", f"{PATH}/c/1/1", (0, 1))]
    # the independent readers refuse it too
    with pytest.raises(RuntimeError, match="doesn't match checksum"):
        zarr.open_array(tmp_path, path=PATH, mode="r")[...]
    with pytest.raises(ValueError, match="doesn't match checksum"):
        tensorstore_read(tmp_path / PATH)


@pytest.mark.parametrize("writer", ["write_array", "to_zarr"])
def test_without_checksums_a_flipped_payload_byte_reads_as_wrong_values(
    tmp_path: Path, writer: str
) -> None:
    """Documents the trade-off of turning the checksum off (own ``compressors``): a flipped byte
    inside a stored (incompressible) zstd block is not noticed by the decompressor."""
    data = np.random.default_rng(5).standard_normal(SHAPE).astype("float32")
    if writer == "write_array":
        shardwise.write_array(
            data, str(tmp_path), path=PATH, chunks=INNER, shards=SHARDS, compressors=zc.ZstdCodec()
        )
    else:
        import xarray as xr

        ds = xr.Dataset({"arr": (("y", "x"), data)})
        enc = {"arr": {"chunks": INNER, "shards": SHARDS, "compressors": zc.ZstdCodec()}}
        shardwise.to_zarr(ds, str(tmp_path), group="grp", encoding=enc)
    meta = json.loads((tmp_path / PATH / "zarr.json").read_text())
    assert meta["codecs"][0]["configuration"]["codecs"][-1]["configuration"]["checksum"] is False
    flip_payload(tmp_path, 1)
    got = open_reader(str(tmp_path), path=PATH)[WHOLE]  # no error ...
    wrong = got != data
    assert wrong.sum() == 1 and wrong[8:12, 12:16].any()  # ... one wrong value in chunk (0, 1)
    # only the writer's record notices: a note, since the bytes decode
    report = shardwise.verify(str(tmp_path), path=PATH)
    assert report.ok and [p.kind for p in report.changes] == ["mismatch"]


def tensorstore_read(root: Path) -> np.ndarray:
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root)}}
    out: np.ndarray = ts.open(spec, read=True).result().read().result()
    return out
