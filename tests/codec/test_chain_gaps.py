"""Inner chains whose bytes a corrupting change would get wrong, read back by every reader.

Each case is written by shardwise (or spelled out by hand where other writers store otherwise)
and read back by shardwise (``read_array`` whole and in parts, ``open_array``), zarr-python and
tensorstore, bit for bit:

* zstd then crc32c on large inner chunks (>= 64 KiB raw, compressed one call each) in shards of
  1 MiB and more, where the encoder keeps frames in an arena: each chunk must still carry its
  checksum;
* big-endian arrays with small zstd chunks (decoded in batches), some chunks left as the fill;
* nested sharding followed by zstd;
* zstd frames that do not state their content size (as ``zstandard.ZstdCompressor(
  write_content_size=False)`` writes them), small and large; and frames that claim fewer bytes
  than the chunk, which must raise ``CorruptShardError`` naming the key.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest
import zarr
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec

import shardwise
from oracles import assert_bit_equal
from strategies import examples

NESTED_WARNING = "ignore:Combining a `sharding_indexed` codec:UserWarning"


def _read_all(root: Path, want: np.ndarray, read_zarr: Any, read_tensorstore: Any | None) -> None:
    """Every reader gives ``want``: shardwise whole (pool and one thread), in a part, lazily,
    and zarr-python and tensorstore (unless None) on the same bytes."""
    assert_bit_equal(shardwise.read_array(str(root)), want, "read_array")
    assert_bit_equal(shardwise.read_array(str(root), threads=1), want, "read_array, 1 thread")
    sel = tuple(slice(n // 3, n - n // 5) for n in want.shape)
    assert_bit_equal(shardwise.read_array(str(root), sel), want[sel], "read_array, part")
    lazy = shardwise.open_array(str(root), chunks=tuple(max(1, n // 2) for n in want.shape))
    assert_bit_equal(lazy.compute(), want, "open_array")
    assert_bit_equal(lazy[sel].compute(), want[sel], "open_array, part")
    assert_bit_equal(read_zarr(str(root)), want, "zarr-python")
    if read_tensorstore is not None:
        assert_bit_equal(read_tensorstore(root), want, "tensorstore")


def _smooth(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Compressible values, all distinct from the fill value 0 (none of them is 0)."""
    rng = np.random.default_rng(seed)
    base = np.arange(math.prod(shape)).reshape(shape) % 997 + 1
    noise = rng.integers(0, 3, size=shape)
    return (base * 3 + noise).astype(dtype)


# -- zstd then crc32c on large chunks ---------------------------------------------------------


@pytest.mark.parametrize(
    ("chunks", "shards"),
    [((128, 128), (512, 256)), ((256, 256), (512, 512))],
    ids=["128KiB-chunks-1MiB-shards", "512KiB-chunks-2MiB-shards"],
)
def test_zstd_then_crc32c_on_large_chunks_keeps_every_checksum(
    tmp_path: Path, chunks: Any, shards: Any, read_zarr: Any, read_tensorstore: Any
) -> None:
    data = _smooth((1024, 768), "f8")
    data[0 : chunks[0], 0 : chunks[1]] = 0  # one chunk left as the fill
    root = tmp_path / "a"
    shardwise.write_array(
        data, str(root), chunks=chunks, shards=shards, compressors=[ZstdCodec(), Crc32cCodec()]
    )
    _read_all(root, data, read_zarr, read_tensorstore)
    # each stored chunk ends in the crc32c of the zstd frame before it (the spec's layout)
    blob = (root / "c" / "0" / "0").read_bytes()
    n = math.prod(s // c for s, c in zip(shards, chunks, strict=True))
    index = np.frombuffer(blob[-(16 * n + 4) : -4], dtype="<u8").reshape(n, 2)
    stored = [(int(o), int(k)) for o, k in index if o != 2**64 - 1]
    assert len(stored) == n - 1
    for o, k in stored:
        frame, crc = blob[o : o + k - 4], blob[o + k - 4 : o + k]
        assert int.from_bytes(crc, "little") == crc32c.crc32c(frame)
        assert zstandard.frame_content_size(frame) == math.prod(chunks) * 8


# -- big-endian with small zstd chunks ---------------------------------------------------------


@pytest.mark.parametrize("dtype", ["i4", "f8", "u2", "i8"])
def test_big_endian_small_zstd_chunks_with_fill_chunks(
    tmp_path: Path, dtype: str, read_zarr: Any, read_tensorstore: Any
) -> None:
    """Big-endian arrays (the ``bytes`` codec's ``endian="big"``) with small zstd chunks, the
    batched decode's path; some shards whole, some with chunks left as the fill."""
    data = _smooth((48, 40), dtype)
    data[0:4, 0:8] = 0  # chunk (0, 0): fill, so shard (0, 0) is decoded chunk by chunk
    data[24:28, 8:24] = 0  # two fill chunks in shard (1, 0)
    root = tmp_path / "a"
    shardwise.write_array(
        data,
        str(root),
        chunks=(4, 8),
        shards=(24, 40),
        serializer=BytesCodec(endian="big"),
        compressors=[ZstdCodec(level=1)],
    )
    doc = json.loads((root / "zarr.json").read_text())
    inner = doc["codecs"][0]["configuration"]["codecs"]
    assert inner[0] == {"name": "bytes", "configuration": {"endian": "big"}}
    _read_all(root, data, read_zarr, read_tensorstore)
    # a whole shard of stored chunks through the lazy reader, one chunk per dask block
    lazy = shardwise.open_array(str(root), chunks=(24, 40), threads=1)
    assert_bit_equal(lazy.compute(), data, "open_array, shard blocks")


@pytest.mark.parametrize("crc", [False, True], ids=["zstd", "zstd+crc32c"])
def test_big_endian_batched_decode_of_partial_shards(
    tmp_path: Path, crc: bool, read_zarr: Any, read_tensorstore: Any
) -> None:
    """Many small big-endian chunks per shard, every other one fill: the rows decoded in one
    batch are copied into their places among the fill rows."""
    data = _smooth((64, 64), "i4", seed=3)
    for i in range(0, 64, 4):
        for j in range(0, 64, 4):
            if (i // 4 + j // 4) % 2:
                data[i : i + 4, j : j + 4] = 0
    root = tmp_path / "a"
    chain: list[Any] = [ZstdCodec(level=1)] + ([Crc32cCodec()] if crc else [])
    shardwise.write_array(
        data,
        str(root),
        chunks=(4, 4),
        shards=(32, 64),
        serializer=BytesCodec(endian="big"),
        compressors=chain,
    )
    _read_all(root, data, read_zarr, read_tensorstore)


# -- nested sharding then zstd -----------------------------------------------------------------


@pytest.mark.filterwarnings(NESTED_WARNING)
def test_nested_sharding_then_zstd_round_trips(tmp_path: Path, read_zarr: Any) -> None:
    data = _smooth((32, 24), "i2")
    data[0:4, 0:4] = 0  # an empty chunk inside a nested shard
    data[16:32, 12:24] = 0  # an empty nested shard
    root = tmp_path / "a"
    shardwise.write_array(
        data,
        str(root),
        chunks=(8, 6),
        shards=(16, 12),
        serializer=ShardingCodec(chunk_shape=(4, 3)),
        compressors=[ZstdCodec(level=1, checksum=True)],
    )
    doc = json.loads((root / "zarr.json").read_text())
    inner = [c["name"] for c in doc["codecs"][0]["configuration"]["codecs"]]
    assert inner == ["sharding_indexed", "zstd"]
    # tensorstore refuses bytes-to-bytes codecs after a nested sharding codec
    _read_all(root, data, read_zarr, None)


# -- frames as other writers store them --------------------------------------------------------


def _hand_made(
    root: Path,
    data: np.ndarray,
    chunks: tuple[int, int],
    shards: tuple[int, int],
    frame: Any,
) -> None:
    """A zarr.json made by shardwise, and every shard rebuilt by hand from the spec: each
    chunk compressed by ``frame(raw_bytes)``, the index at the end with its crc32c."""
    shardwise.write_array(
        data,
        str(root),
        chunks=chunks,
        shards=shards,
        compressors=[ZstdCodec(level=1)],
        write_empty_chunks=True,
    )
    grid = [s // c for s, c in zip(shards, chunks, strict=True)]
    for si in range(data.shape[0] // shards[0]):
        for sj in range(data.shape[1] // shards[1]):
            body, entries = b"", []
            for ci in range(grid[0]):
                for cj in range(grid[1]):
                    r0, c0 = si * shards[0] + ci * chunks[0], sj * shards[1] + cj * chunks[1]
                    block = data[r0 : r0 + chunks[0], c0 : c0 + chunks[1]]
                    blob = frame(np.ascontiguousarray(block).astype(block.dtype.newbyteorder("<")))
                    entries.append((len(body), len(blob)))
                    body += blob
            index = b"".join(o.to_bytes(8, "little") + n.to_bytes(8, "little") for o, n in entries)
            index += crc32c.crc32c(index).to_bytes(4, "little")
            (root / "c" / str(si) / str(sj)).write_bytes(body + index)


SIZELESS = zstandard.ZstdCompressor(level=3, write_content_size=False)


@pytest.mark.parametrize(
    ("chunks", "shards"),
    [((8, 16), (32, 64)), ((128, 128), (256, 256))],
    ids=["small-chunks", "large-chunks"],
)
def test_frames_without_content_size_decode(
    tmp_path: Path, chunks: Any, shards: Any, read_zarr: Any, read_tensorstore: Any
) -> None:
    data = _smooth((512, 256), "f4", seed=7)
    root = tmp_path / "a"
    _hand_made(root, data, chunks, shards, lambda b: SIZELESS.compress(b.tobytes()))
    blob = (root / "c" / "0" / "0").read_bytes()
    assert zstandard.frame_content_size(blob) == -1  # the first frame states no size
    _read_all(root, data, read_zarr, read_tensorstore)
    # reads into memory that held other values: nothing of it may show through
    out = np.full(data.shape, 12345.0, dtype="f4")
    shardwise.read_array(str(root), out=out)
    assert_bit_equal(out, data, "read_array into a used buffer")


@pytest.mark.parametrize(
    ("chunks", "shards"),
    [((8, 16), (32, 64)), ((128, 128), (256, 256))],
    ids=["small-chunks", "large-chunks"],
)
@pytest.mark.parametrize("sized", [True, False], ids=["sized", "sizeless"])
@pytest.mark.parametrize("longer", [False, True], ids=["shorter", "longer"])
def test_a_frame_of_other_bytes_than_its_chunk_is_corrupt(
    tmp_path: Path, chunks: Any, shards: Any, sized: bool, longer: bool
) -> None:
    """One chunk of shard (0, 1) compressed from half its bytes (or one and a half times
    them): every read of it raises CorruptShardError naming that shard and chunk, never
    reads past what the frame held nor takes part of it."""
    data = _smooth((256, 512), "f4", seed=8)
    root = tmp_path / "a"
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=sized)
    calls = {"n": 0}
    bad_call = math.prod(s // c for s, c in zip(shards, chunks, strict=True)) + 1

    def frame(block: np.ndarray) -> bytes:
        calls["n"] += 1
        raw = block.tobytes()
        if calls["n"] != bad_call:
            return cctx.compress(raw)
        return cctx.compress(raw + raw[: len(raw) // 2] if longer else raw[: len(raw) // 2])

    _hand_made(root, data, chunks, shards, frame)
    key = "c/0/1"
    reads = [
        lambda: shardwise.read_array(str(root)),
        lambda: shardwise.read_array(str(root), threads=1),
        lambda: shardwise.read_array(str(root), (slice(0, chunks[0]), slice(shards[1], None))),
        lambda: shardwise.open_array(str(root), chunks=shards).compute(),
    ]
    for read in reads:
        with pytest.raises(shardwise.CorruptShardError) as info:
            read()
        assert info.value.key == key
        assert info.value.chunk == (0, 0)
    # the shards around it read right
    got = shardwise.read_array(str(root), (slice(None), slice(0, shards[1])))
    assert_bit_equal(got, data[:, : shards[1]], "the good shard")


@pytest.mark.filterwarnings(NESTED_WARNING)
@examples(15)
@given(
    nest=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    per_chunk=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    per_shard=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    tail=st.tuples(st.integers(0, 5), st.integers(0, 5)),
    empty=st.integers(0, 4),
    crc=st.booleans(),
)
def test_nested_sharding_then_zstd_agrees_with_zarr_python(
    fresh_dir: Any,
    read_zarr: Any,
    nest: tuple[int, int],
    per_chunk: tuple[int, int],
    per_shard: tuple[int, int],
    tail: tuple[int, int],
    empty: int,
    crc: bool,
) -> None:
    """Nested sharding then zstd (and crc32c) over drawn geometries, edge shards and empty
    nested chunks included: shardwise's bytes read by zarr-python, zarr-python's by shardwise."""
    chunk = tuple(n * k for n, k in zip(nest, per_chunk, strict=True))
    shard = tuple(c * k for c, k in zip(chunk, per_shard, strict=True))
    shape = tuple(2 * s + t for s, t in zip(shard, tail, strict=True))
    x = _smooth(shape, "i4", seed=sum(shape))
    x[: nest[0] * empty, : nest[1] * empty] = 0  # some nested chunks, or more, left as fill
    compressors: list[Any] = [ZstdCodec(level=1)] + ([Crc32cCodec()] if crc else [])
    kw = dict(chunks=chunk, shards=shard, serializer=ShardingCodec(chunk_shape=nest))
    root = fresh_dir("nested")
    shardwise.write_array(x, str(root / "sw"), compressors=compressors, fill_value=0, **kw)
    assert_bit_equal(read_zarr(str(root / "sw")), x, "zarr-python of shardwise's")
    z = zarr.create_array(
        str(root / "zp"), shape=shape, dtype=x.dtype, compressors=compressors, fill_value=0, **kw
    )
    z[...] = x
    assert_bit_equal(shardwise.read_array(str(root / "zp")), x, "shardwise of zarr-python's")
    part = tuple(slice(n // 3, n - n // 4) for n in shape)
    got = shardwise.open_array(str(root / "zp"), chunks=chunk)[part].compute()
    assert_bit_equal(got, x[part], "shardwise of zarr-python's, part")


@examples(15)
@given(
    per_shard=st.tuples(st.integers(1, 12), st.integers(1, 12)),
    shards=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    dtype=st.sampled_from(["f4", "i8", "u2"]),
    threads=st.sampled_from([None, 1, 3]),
)
def test_sizeless_frames_of_every_batch_size_decode(
    fresh_dir: Any,
    read_zarr: Any,
    per_shard: tuple[int, int],
    shards: tuple[int, int],
    dtype: str,
    threads: int | None,
) -> None:
    """Shards of 1 to 144 small chunks whose zstd frames state no content size (spelled out by
    hand): shardwise reads what zarr-python reads, whatever the batch and the threads."""
    chunks = (4, 8)
    shard = (4 * per_shard[0], 8 * per_shard[1])
    shape = (shard[0] * shards[0], shard[1] * shards[1])
    x = _smooth(shape, dtype, seed=sum(per_shard))
    root = fresh_dir("sizeless") / "a"
    _hand_made(root, x, chunks, shard, lambda b: SIZELESS.compress(b.tobytes()))
    want = read_zarr(str(root))
    assert_bit_equal(want, x, "zarr-python")
    out = np.full(shape, 77, dtype=dtype)
    shardwise.read_array(str(root), out=out, threads=threads)
    assert_bit_equal(out, x, "shardwise")
