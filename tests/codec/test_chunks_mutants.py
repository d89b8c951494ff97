"""Inner chains the mutation lane found untested (``codec/chunks``, ``codec/codecs``), read back by
shardwise and zarr-python:

* chains shardwise does not run itself (a ``numcodecs`` filter, a compressor of zarr-python's
  only) handed to zarr-python's codec objects: written by either and read by both, fill chunks
  left out, a region merged into stored shards, a corrupt chunk refused naming its key, its chunk
  and the codec's error;
* large zstd chunks read with steps, where many large chunks of one shard are decoded in one
  batch call into a stack;
* zstd followed by a codec that bounds its output (gzip): on large chunks of values that do not
  compress the stage before zstd gives more bytes than the chunk, never more than its bound,
  and a stream one byte past the bound is refused even where it holds a valid frame;
* fill chunks found bit for bit: -0.0 is stored where the fill is 0 (16-byte items too), string
  chunks of the fill left out; a 0-d array;
* the batch calls: a shard of two small zstd chunks compressed in one, a shard of 64 read on
  one thread decoded in one, not twice;
* a frame claiming other bytes than its chunk refused from its header, the error saying what it
  claims; each codec's diagnosis of a corrupt chunk in words; a gzip bomb refused without
  inflating it;
* each native codec (zstd, gzip, blosc, crc32c) stores the bytes zarr-python stores with the
  same configuration, and its zarr.json entry is zarr-python's.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zstandard
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec
from zarr.codecs import numcodecs as nc

import shardwise
from oracles import assert_bit_equal
from shardwise.codec.batches import batch_counts

# -- chains run through zarr-python's codec objects --------------------------------------------

FOREIGN = {
    "delta+bz2": dict(filters=[nc.Delta(dtype="<i4")], compressors=[nc.BZ2(level=1)]),
    "zlib": dict(compressors=[nc.Zlib(level=1)]),
}


def _values(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = (np.arange(np.prod(shape)).reshape(shape) * 7 % 1009 + rng.integers(1, 4, shape)).astype(
        "<i4"
    )
    out[:8, :16] = 5  # one inner chunk of the fill value: not stored
    return out


@pytest.mark.parametrize("chain", sorted(FOREIGN))
def test_a_chain_zarr_python_runs_round_trips_both_ways(
    tmp_path: Path, chain: str, read_zarr: Any
) -> None:
    data = _values((96, 64))
    geometry = dict(chunks=(8, 16), shards=(32, 32), fill_value=5)
    mine, theirs = tmp_path / "shardwise", tmp_path / "zarr"
    shardwise.write_array(data, str(mine), **geometry, **FOREIGN[chain])
    assert_bit_equal(read_zarr(str(mine)), data, "zarr-python reads shardwise's")
    assert_bit_equal(shardwise.read_array(str(mine)), data, "shardwise reads its own")
    z = zarr.create_array(
        str(theirs), shape=data.shape, dtype=data.dtype, **geometry, **FOREIGN[chain]
    )
    z[...] = data
    assert_bit_equal(shardwise.read_array(str(theirs)), data, "shardwise reads zarr-python's")
    part = (slice(5, 77), slice(3, 61))
    assert_bit_equal(shardwise.read_array(str(theirs), part), data[part], "a part")
    lazy = shardwise.open_array(str(theirs), chunks=(32, 32))
    assert_bit_equal(lazy[part].compute(), data[part], "open_array, a part")
    # a region merged into stored shards (the chunks around it decoded and encoded again)
    new = data.copy()
    new[10:30, 20:50] = -np.arange(600, dtype="<i4").reshape(20, 30)
    region = (slice(10, 30), slice(20, 50))
    shardwise.write_array(new[region], str(theirs), region=region, mode="r+")
    assert_bit_equal(read_zarr(str(theirs)), new, "zarr-python after a region write")
    assert_bit_equal(shardwise.read_array(str(theirs)), new, "shardwise after a region write")


def test_a_corrupt_chunk_of_a_chain_zarr_python_runs_names_the_codecs_error(
    tmp_path: Path,
) -> None:
    data = _values((64, 64), seed=1)
    root = tmp_path / "a"
    shardwise.write_array(
        data, str(root), chunks=(8, 16), shards=(32, 32), fill_value=5, **FOREIGN["delta+bz2"]
    )
    shard = root / "c" / "0" / "1"
    blob = bytearray(shard.read_bytes())
    blob[20] ^= 0xFF  # inside the first chunk's bz2 stream
    shard.write_bytes(bytes(blob))
    with pytest.raises(shardwise.CorruptShardError) as info:
        shardwise.read_array(str(root))
    assert info.value.key == "c/0/1" and info.value.chunk == (0, 0)
    # the codec's own complaint, by the name of its exception
    assert re.search(r"cannot decode: \w+Error: \w", str(info.value)), str(info.value)
    good = shardwise.read_array(str(root), (slice(None), slice(0, 32)))
    assert_bit_equal(good, data[:, :32], "the shard beside it")


# -- large zstd chunks decoded into a stack ------------------------------------------------------


@pytest.mark.parametrize(
    "compressors",
    [[ZstdCodec(level=1)], [ZstdCodec(level=1), Crc32cCodec()]],
    ids=["zstd", "zstd+crc32c"],
)
def test_large_chunks_read_with_steps(tmp_path: Path, compressors: Any) -> None:
    """128 KiB chunks, 8 to a shard: a stepped read decodes many of one shard's chunks at once
    (into a stack, not straight into place): the values are numpy's."""
    data = np.random.default_rng(2).random((512, 512))
    data[:128, 128:256] = 0  # a fill chunk among them
    root = str(tmp_path / "a")
    shardwise.write_array(data, root, chunks=(128, 128), shards=(256, 512), compressors=compressors)
    steps = (slice(None, None, 3), slice(5, None, 7))
    assert_bit_equal(shardwise.read_array(root, steps), data[steps], "steps")
    assert_bit_equal(shardwise.read_array(root, steps, threads=1), data[steps], "steps, 1 thread")
    lazy = shardwise.open_array(root, chunks=(256, 512))[steps]
    assert_bit_equal(lazy.compute(), data[steps], "open_array, steps")


def test_zstd_then_gzip_on_large_chunks_that_do_not_compress(
    tmp_path: Path, read_zarr: Any
) -> None:
    """Random 64-bit chunks of 128 KiB: zstd's frames are a little larger than the chunk, and
    gzip's output (those frames) is bounded by twice the chunk, not by the chunk."""
    data = np.random.default_rng(3).integers(0, 2**64, (512, 256), dtype="<u8")
    root = str(tmp_path / "a")
    chain = [ZstdCodec(level=1), GzipCodec(level=1)]
    shardwise.write_array(data, root, chunks=(128, 128), shards=(256, 256), compressors=chain)
    frame = zlib.decompress(_chunk_bytes(tmp_path / "a", "c/0/0", 4)[0], wbits=31)
    assert len(frame) > 128 * 128 * 8  # the stage before zstd gives more than the chunk
    assert_bit_equal(shardwise.read_array(root), data, "shardwise")
    assert_bit_equal(read_zarr(root), data, "zarr-python")
    theirs = str(tmp_path / "zarr")
    z = zarr.create_array(
        theirs, shape=data.shape, dtype=data.dtype, chunks=(128, 128), shards=(256, 256),
        compressors=chain,
    )  # fmt: skip
    z[...] = data
    assert_bit_equal(shardwise.read_array(theirs), data, "shardwise reads zarr-python's")


def _padded_frame(payload: bytes, size: int) -> bytes:
    """A valid zstd frame of exactly ``size`` bytes holding ``payload``: its content size in the
    header, empty raw blocks, then one raw block of the payload (RFC 8878)."""
    head = b"\x28\xb5\x2f\xfd" + bytes([0xA0]) + len(payload).to_bytes(4, "little")
    last = (1 | len(payload) << 3).to_bytes(3, "little") + payload
    empty, rest = divmod(size - len(head) - len(last), 3)
    assert rest == 0
    return head + b"\0\0\0" * empty + last


def test_a_stage_expanding_past_its_bound_is_refused(tmp_path: Path) -> None:
    """zstd then gzip, small chunks of 4 KiB: a gzip stream expanding to 2 * 4096 + 4097 bytes
    (one past the most a stage before zstd may give, twice the chunk and 4 KiB) is refused, even
    though what it holds is a valid zstd frame of the chunk's 4096 bytes."""
    data = np.arange(512 * 64, dtype="<f8") % 251 + 1
    root = tmp_path / "a"
    chain = [ZstdCodec(level=1), GzipCodec(level=1)]
    shardwise.write_array(data, str(root), chunks=512, shards=512 * 8, compressors=chain)
    payload = data[:512].tobytes()
    frame = _padded_frame(payload, 2 * 4096 + 4097)
    assert zstandard.ZstdDecompressor().decompress(frame) == payload  # a frame zstd reads
    gz = zlib.compress(frame, 1, wbits=31)
    shard = root / "c" / "0"
    shard.write_bytes(_with_first_chunk(shard.read_bytes(), 8, gz))
    for threads in (None, 1):
        with pytest.raises(shardwise.CorruptShardError) as info:
            shardwise.read_array(str(root), threads=threads)
        assert info.value.key == "c/0" and info.value.chunk == (0,)
        assert "gzip stream is truncated or longer than 12288 bytes" in str(info.value)


@pytest.mark.parametrize("dtype", ["<f8", "<c8", "<c16", ">f4"])
def test_a_chunk_equal_to_the_fill_value_but_not_bit_for_bit_is_stored(
    tmp_path: Path, dtype: str, read_zarr: Any
) -> None:
    """Fill value 0: a chunk of -0.0 equals it as a number, not bit for bit, so it is stored
    and reads back -0.0 (16-byte complex items included, compared byte by byte); a chunk of
    +0.0 is left out and reads back as the fill."""
    data = np.full((32, 32), 1.5, dtype=dtype)
    data[:8, :8] = -0.0
    data[8:16, :8] = 0.0
    root = str(tmp_path / "a")
    shardwise.write_array(data, root, chunks=(8, 8), shards=(16, 32), fill_value=0)
    for got in (shardwise.read_array(root), read_zarr(root)):
        assert_bit_equal(got, data, "read")
        assert np.signbit(got[:8, :8].real).all() and not np.signbit(got[8:16, :8].real).any()
    index = np.frombuffer((tmp_path / "a" / "c" / "0" / "0").read_bytes()[-4 - 16 * 8 : -4], "<u8")
    assert index.reshape(8, 2)[4, 0] == np.iinfo(np.uint64).max  # chunk (1, 0): not stored
    assert index.reshape(8, 2)[0, 0] != np.iinfo(np.uint64).max  # chunk (0, 0): stored


# -- small zstd chunks: one batch call per shard -------------------------------------------------


def test_a_shard_of_two_small_chunks_is_compressed_in_one_batch_call(tmp_path: Path) -> None:
    """Two chunks of 4 KiB a shard are enough for a batch: one call per shard compresses both."""
    data = np.arange(512 * 8, dtype="f8") % 251 + 1
    root = str(tmp_path / "a")
    before = batch_counts()
    shardwise.write_array(data, root, chunks=512, shards=1024, compressors=[ZstdCodec()], threads=1)
    after = batch_counts()
    assert after.encodes - before.encodes == 4  # four shards
    assert_bit_equal(shardwise.read_array(root), data, "read")


def test_a_shard_of_small_chunks_is_decoded_in_one_batch_call(tmp_path: Path) -> None:
    """On one thread, each shard's 64 chunks of 4 KiB are decoded by one batch call: a batch
    whose values are right is not decoded a second time."""
    data = np.arange(512 * 256, dtype="f8") % 251 + 1
    root = str(tmp_path / "a")
    shardwise.write_array(data, root, chunks=512, shards=512 * 64, compressors=[ZstdCodec()])
    before = batch_counts()
    got = shardwise.read_array(root, threads=1)
    after = batch_counts()
    assert_bit_equal(got, data, "read")
    assert (after.decodes - before.decodes, after.fallbacks - before.fallbacks) == (4, 0)


# -- frames claiming more than their chunk ------------------------------------------------------


@pytest.mark.parametrize(
    ("chunks", "claim"),
    [((8, 16), 1.5), ((128, 128), 1.5), ((128, 128), 0)],
    ids=["small-chunks", "large-chunks", "large-chunks-empty-frame"],
)
def test_a_frame_claiming_other_bytes_than_its_chunk_is_refused_unread(
    tmp_path: Path, chunks: tuple[int, int], claim: float
) -> None:
    """A zstd frame stating a content size larger than the chunk (or, for a chunk decoded
    straight into place, any other size: an empty frame) is refused from its header, nothing
    decompressed, the error saying what the frame claims."""
    data = np.arange(256 * 256, dtype="<f4").reshape(256, 256) + 1
    root = tmp_path / "a"
    shardwise.write_array(
        data, str(root), chunks=chunks, shards=(256, 256), compressors=[ZstdCodec()]
    )
    claims = int(chunks[0] * chunks[1] * 4 * claim)
    shard = root / "c" / "0" / "0"
    other = zstandard.ZstdCompressor(level=1).compress(b"\x01" * claims)
    assert zstandard.frame_content_size(other) == claims
    n = (256 // chunks[0]) * (256 // chunks[1])
    shard.write_bytes(_with_first_chunk(shard.read_bytes(), n, other))
    with pytest.raises(shardwise.CorruptShardError) as info:
        shardwise.read_array(str(root))
    assert info.value.chunk == (0, 0)
    assert f"zstd frame claims {claims} bytes" in str(info.value), str(info.value)


def _with_first_chunk(shard: bytes, n: int, frame: bytes) -> bytes:
    """``shard`` of ``n`` stored chunks (index at the end, with its crc32c) with the bytes of
    chunk (0, 0) replaced by ``frame``: the chunks laid out again, the index rewritten."""
    import crc32c

    index = np.frombuffer(shard[-4 - 16 * n : -4], dtype="<u8").reshape(n, 2)
    blobs = [shard[o : o + k] for o, k in index.tolist()]
    blobs[0] = frame
    offsets = np.cumsum([0] + [len(b) for b in blobs[:-1]])
    table = np.stack([offsets, [len(b) for b in blobs]], axis=1).astype("<u8").tobytes()
    return b"".join(blobs) + table + crc32c.crc32c(table).to_bytes(4, "little")


# -- the native bytes codecs ---------------------------------------------------------------------

NATIVE = {
    "zstd-1-checksum": [ZstdCodec(level=1, checksum=True)],
    "gzip-1": [GzipCodec(level=1)],
    "blosc-lz4-shuffle": [BloscCodec(cname="lz4", clevel=3, shuffle="shuffle", typesize=4)],
    "blosc-zstd-bitshuffle-blocks": [
        BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle", typesize=8, blocksize=1024)
    ],
    "zstd-crc32c": [ZstdCodec(level=1), Crc32cCodec()],
}


def _chunk_bytes(root: Path, key: str, n: int) -> list[bytes]:
    """The stored bytes of the ``n`` inner chunks of shard ``key`` (index at the end)."""
    shard = (root / key).read_bytes()
    index = np.frombuffer(shard[-4 - 16 * n : -4], dtype="<u8").reshape(n, 2)
    return [shard[o : o + k] for o, k in index.tolist()]


@pytest.mark.parametrize("chain", sorted(NATIVE))
def test_native_codecs_store_the_bytes_zarr_python_stores(tmp_path: Path, chain: str) -> None:
    """Each chunk shardwise compresses is the chunk zarr-python compresses from the same values
    with the same codec configuration (level, shuffle, type size, block size), and shardwise's
    entry for the codec is the one zarr-python wrote in zarr.json."""
    from shardwise.codec.metadata import info_from_metadata

    data = (np.arange(64 * 64).reshape(64, 64) % 97 * 1.5).astype("<f8")
    geometry = dict(chunks=(16, 16), shards=(32, 64), compressors=NATIVE[chain])
    mine, theirs = tmp_path / "shardwise", tmp_path / "zarr"
    shardwise.write_array(data, str(mine), **geometry)
    z = zarr.create_array(str(theirs), shape=data.shape, dtype=data.dtype, **geometry)
    z[...] = data
    for key in ("c/0/0", "c/1/0"):
        got, want = _chunk_bytes(mine, key, 8), _chunk_bytes(theirs, key, 8)
        if chain.startswith("gzip"):  # zarr-python's gzip header holds the time it was written
            got, want = [b[10:] for b in got], [b[10:] for b in want]
        assert got == want, key
    entries = [c.to_dict() for c in info_from_metadata(z.metadata).codec.inner.bytes_codecs]
    assert entries == json.loads(
        json.dumps(z.metadata.to_dict()["codecs"][0]["configuration"]["codecs"][1:])
    )


def _blosc_claiming(chunk: bytes, nbytes: int) -> bytes:
    """A blosc frame whose header claims ``nbytes`` decompressed bytes."""
    return chunk[:4] + nbytes.to_bytes(4, "little") + chunk[8:]


# chain, a change of the first chunk's stored bytes, what the error must say
CORRUPT = {
    "crc32c-too-short": ("zstd-crc32c", lambda b: b[:2], "2 bytes is too short to hold a crc32c"),
    "blosc-no-header": ("blosc-lz4-shuffle", lambda b: b[:6], "blosc frame of 6 bytes is shorter"),
    "blosc-claims-more": (
        "blosc-lz4-shuffle",
        lambda b: _blosc_claiming(b, 4 * 2048),
        "blosc frame claims 8192 bytes, at most 2048 expected",
    ),
    "blosc-bad-blocks": (
        "blosc-lz4-shuffle",
        lambda b: b[:16] + bytes([b[16] ^ 0xFF]) + b[17:],
        "blosc: error during blosc decompression",
    ),
    "zstd-not-a-frame": ("zstd-1-checksum", lambda b: b"\0" * len(b), "zstd: "),
    "zstd-checksum": (
        "zstd-1-checksum",
        lambda b: b[:-5] + bytes([b[-5] ^ 0xFF]) + b[-4:],
        "zstd: ",
    ),
    "gzip-without-trailer": ("gzip-1", lambda b: b[:-8], "gzip stream is truncated"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_corrupt_chunk_is_refused_saying_what_is_wrong(tmp_path: Path, case: str) -> None:
    """One chunk's stored bytes changed: the read raises CorruptShardError naming the shard and
    chunk, and the codec's diagnosis in words (a gzip stream cut before its trailer, which holds
    its CRC32, is refused even where what it holds has the chunk's size)."""
    chain, change, says = CORRUPT[case]
    data = (np.arange(64 * 64).reshape(64, 64) % 97 * 1.5).astype("<f8")
    root = tmp_path / "a"
    shardwise.write_array(
        data, str(root), chunks=(16, 16), shards=(32, 64), compressors=NATIVE[chain]
    )
    shard = root / "c" / "0" / "0"
    first = _chunk_bytes(root, "c/0/0", 8)[0]
    shard.write_bytes(_with_first_chunk(shard.read_bytes(), 8, change(first)))
    for threads in (None, 1):
        with pytest.raises(shardwise.CorruptShardError) as info:
            shardwise.read_array(str(root), threads=threads)
        assert info.value.key == "c/0/0" and info.value.chunk == (0, 0)
        assert says in str(info.value), str(info.value)
    assert_bit_equal(shardwise.read_array(str(root), (slice(32, 64),)), data[32:], "shard c/1/0")


def test_a_decompression_bomb_is_refused_without_inflating_it(tmp_path: Path) -> None:
    """A gzip chunk of 2 KiB raw replaced by 64 MiB of zeros in 64 KiB of gzip: refused as
    longer than the chunk, having inflated no more than its bound (memory traced by Python's
    allocator: far below the 64 MiB)."""
    import tracemalloc

    data = (np.arange(64 * 64).reshape(64, 64) % 97 * 1.5).astype("<f8")
    root = tmp_path / "a"
    shardwise.write_array(
        data, str(root), chunks=(16, 16), shards=(32, 64), compressors=NATIVE["gzip-1"]
    )
    packer = zlib.compressobj(1, wbits=31)
    zeros = bytes(2**20)
    bomb = b"".join(packer.compress(zeros) for _ in range(64)) + packer.flush()
    shard = root / "c" / "0" / "0"
    shard.write_bytes(_with_first_chunk(shard.read_bytes(), 8, bomb))
    tracemalloc.start()
    try:
        with pytest.raises(shardwise.CorruptShardError) as info:
            shardwise.read_array(str(root), threads=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "gzip stream is truncated or longer than 2048 bytes" in str(info.value)
    assert peak < 8 * 2**20, peak


@pytest.mark.parametrize("kind", ["variable-length", "fixed-length"])
def test_string_chunks_equal_to_the_fill_value_are_left_out(
    tmp_path: Path, kind: str, read_zarr: Any
) -> None:
    """Strings with the fill value "": the chunk of "" only is not stored, the others are, and
    every chunk reads back as written."""
    values = ["a", "bb", "x", "ccc"] * 2 + [""] * 4 + ["q", ""] * 2
    data = np.array(values, dtype=object if kind == "variable-length" else "<U3")
    root = tmp_path / "a"
    as_str = dict(dtype=str) if kind == "variable-length" else {}  # else fixed_length_utf32
    shardwise.write_array(data, str(root), chunks=4, shards=8, fill_value="", **as_str)
    kept = json.loads((root / "zarr.json").read_text())["data_type"]
    assert (kept == "string") == (kind == "variable-length"), kept
    for got in (shardwise.read_array(str(root)), read_zarr(str(root))):
        assert got.tolist() == values
    index = np.frombuffer((root / "c" / "1").read_bytes()[-4 - 32 : -4], "<u8").reshape(2, 2)
    assert index[0, 0] == np.iinfo(np.uint64).max  # chunk 2, all "": not stored
    assert index[1, 0] != np.iinfo(np.uint64).max  # chunk 3


@pytest.mark.parametrize("compressors", [None, [ZstdCodec()]], ids=["raw", "zstd"])
def test_a_zero_dimensional_array_round_trips(
    tmp_path: Path, compressors: Any, read_zarr: Any
) -> None:
    for value in (3.5, 0.0):
        root = str(tmp_path / f"a{value}")
        shardwise.write_array(np.array(value), root, compressors=compressors)
        assert shardwise.read_array(root).shape == ()
        assert float(shardwise.read_array(root)) == value
        assert float(read_zarr(root)) == value
