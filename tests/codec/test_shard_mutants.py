"""Tests for survivors of the mutation lane on codec/shard (``mutation/run.py codec/shard``):
the encoding of whole shards, the merge of a region into a stored shard, the units of encode work
and the codec's zarr.json entry, each checked against what a user of the stored shard sees:
the values read back by the format's rules, and the bytes of chunks a merge must not rewrite.
"""

from __future__ import annotations

import json
import threading
import warnings
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.codecs as zc

from shardwise.codec.chunks import ChunkCodec
from shardwise.codec.codecs import Zstd
from shardwise.codec.metadata import info_from_metadata
from shardwise.codec.shard import (
    EncodedShard,
    ShardCodec,
    ShardIndex,
    decode_shard_bytes,
    empty_shard,
    encode_chunks,
    encode_shard,
    merge_shard,
    units,
)
from shardwise.errors import CorruptShardError
from shardwise.runtime import pool
from shardwise.runtime.units import SMALL_CHUNK, UNIT_BYTES

KEY = "arr/c/0/0"
SHARD = (8, 12)
CHUNK = (4, 4)  # a grid of (2, 3) inner chunks per shard
FILL = -7


def make_codec(
    location: str = "end", order: tuple[int, ...] | None = None, *, checksum: bool = False
) -> ShardCodec:
    """The shard codec of these tests; ``checksum``: the zstd frames carry their checksum, as
    another writer of the same array may store them (every zstd decoder reads both)."""
    zstd = Zstd(checksum=checksum)
    inner = ChunkCodec(CHUNK, np.dtype("int32"), FILL, order=order, bytes_codecs=(zstd,))
    return ShardCodec(SHARD, inner, index_location=location)  # type: ignore[arg-type]


def joined(enc: EncodedShard | None) -> bytes:
    assert enc is not None
    return b"".join(bytes(p) for p in enc.parts)


def chunk_bytes(codec: ShardCodec, data: bytes) -> dict[tuple[int, ...], bytes]:
    """The stored bytes of each stored inner chunk by grid position, found through the index."""
    index = ShardIndex.of_shard(codec, data, KEY)
    out = {}
    for flat, pos in enumerate(np.ndindex(*codec.grid)):
        if not index.is_empty(flat):
            o, n = (int(x) for x in index.entries[flat])
            out[pos] = data[o : o + n]
    return out


def values(shape: tuple[int, ...] = SHARD) -> np.ndarray:
    return np.arange(1, 1 + np.prod(shape), dtype="int32").reshape(shape)


# -- merge_shard -----------------------------------------------------------------------------------


@pytest.mark.parametrize("order", [None, (1, 0)], ids=["C", "transposed"])
@pytest.mark.parametrize("location", ["end", "start"])
def test_a_merge_overlays_its_piece_and_keeps_the_other_chunks_as_stored(
    location: str, order: tuple[int, ...] | None
) -> None:
    """A region write into a stored shard: the chunks it cuts are decoded, overlaid and
    re-encoded, the one it covers whole is encoded from the new values, and the chunks it does
    not touch keep their stored bytes (the old frames carry zstd's checksum, which this codec
    does not write: a chunk merged when it should not be gets other bytes). Kills the mutants
    that lose a cut chunk's old values (decode, unstack, region), misplace the new ones, drop or
    misplace an untouched chunk, count a chunk bordering the region as touched, or miscount:
    wrong values around the region, data lost outside it, another tool's chunks rewritten."""
    codec = make_codec(location, order)
    old_values = values()
    old = joined(encode_shard(make_codec(location, order, checksum=True), old_values))
    # cuts chunk (0, 1), covers chunk (1, 1); borders (0, 0), (1, 0) and (0, 2), (1, 2)
    piece = (slice(2, 8), slice(4, 8))
    block = -values((6, 4))
    enc = merge_shard(codec, old, block, piece, SHARD, KEY)
    assert enc is not None
    new = joined(enc)
    want = old_values.copy()
    want[piece] = block
    np.testing.assert_array_equal(decode_shard_bytes(codec, new, KEY), want)
    before, after = chunk_bytes(codec, old), chunk_bytes(codec, new)
    assert set(after) == set(before) == set(np.ndindex(2, 3))
    for pos in [(0, 0), (0, 2), (1, 0), (1, 2)]:
        assert after[pos] == before[pos], f"untouched chunk {pos} was rewritten"
    assert (enc.chunks_stored, enc.chunks_empty, enc.raw_nbytes) == (6, 0, block.nbytes)
    assert enc.nbytes == len(new)


def test_a_merge_into_no_shard_stores_only_the_chunks_it_touches() -> None:
    """The first write of a region into a shard not stored yet: the touched chunks hold the new
    values and the fill value around them, no other chunk is stored. Kills mutants that store
    the untouched (all-fill) chunks, skip the fill of the merge buffer, or miscount the empty
    chunks the write report gives the user."""
    codec = make_codec()
    piece = (slice(1, 3), slice(3, 9))  # inside chunk row 0: cuts (0, 0), (0, 1), (0, 2)
    block = values((2, 6))
    enc = merge_shard(codec, None, block, piece, SHARD, KEY)
    assert enc is not None
    data = joined(enc)
    want = np.full(SHARD, FILL, dtype="int32")
    want[piece] = block
    np.testing.assert_array_equal(decode_shard_bytes(codec, data, KEY), want)
    assert set(chunk_bytes(codec, data)) == {(0, 0), (0, 1), (0, 2)}
    assert (enc.chunks_stored, enc.chunks_empty) == (3, 3)


def test_a_merge_cutting_an_empty_chunk_fills_the_rest_of_it() -> None:
    """A region cutting an empty (not stored) chunk leaves the rest of it at the fill value.
    Kills the mutants of the skip of an empty index entry (a read at offset 2**64-1)."""
    codec = make_codec()
    old_values = values()
    old_values[4:8, 8:12] = FILL
    old = joined(encode_shard(codec, old_values))
    assert (1, 2) not in chunk_bytes(codec, old)
    piece = (slice(5, 6), slice(6, 10))  # cuts (1, 1) and the empty (1, 2)
    block = np.array([[100, 101, 102, 103]], dtype="int32")
    enc = merge_shard(codec, old, block, piece, SHARD, KEY)
    want = old_values.copy()
    want[piece] = block
    np.testing.assert_array_equal(decode_shard_bytes(codec, joined(enc), KEY), want)


def test_a_merge_of_fill_values_empties_what_it_covers() -> None:
    """Fill written over a stored chunk removes it (the space is freed); over every stored chunk,
    no shard is left (None: the engine deletes it); with ``write_empty_chunks`` the covered
    chunks are stored and the untouched one kept as it was. Kills mutants that keep a covered
    chunk's old bytes, drop ``write_empty_chunks`` or ignore the mask of touched chunks."""
    codec = make_codec()
    old_values = np.full(SHARD, FILL, dtype="int32")
    old_values[0:4, 0:4] = 5
    old_values[4:8, 8:12] = 6
    old = joined(encode_shard(codec, old_values))
    piece = (slice(0, 4), slice(0, 8))  # covers (0, 0) and the empty (0, 1)
    block = np.full((4, 8), FILL, dtype="int32")
    enc = merge_shard(codec, old, block, piece, SHARD, KEY)
    assert enc is not None
    assert set(chunk_bytes(codec, joined(enc))) == {(1, 2)}
    assert (enc.chunks_stored, enc.chunks_empty) == (1, 5)
    kept = merge_shard(codec, old, block, piece, SHARD, KEY, write_empty_chunks=True)
    assert set(chunk_bytes(codec, joined(kept))) == {(0, 0), (0, 1), (1, 2)}
    everything = (slice(0, 8), slice(0, 12))
    blank = np.full(SHARD, FILL, dtype="int32")
    assert merge_shard(codec, old, blank, everything, SHARD, KEY) is None


def test_a_merge_into_an_edge_shard_places_chunks_in_the_full_grid() -> None:
    """A shard at the array's edge (valid extent (5, 7) of the (8, 12) shard): its chunks sit in
    a (2, 2) part of the shard's (2, 3) grid, and the index must name them at their place in the
    full grid, as zarr and every other reader look them up. Kills mutants that index the used
    grid instead of the shard's, or pad the edge with anything but the fill value."""
    codec = make_codec()
    valid = (5, 7)
    old_values = values(valid)
    old = joined(encode_shard(codec, old_values))
    piece = (slice(4, 5), slice(2, 7))  # cuts the edge chunks (1, 0) and (1, 1)
    block = -values((1, 5))
    enc = merge_shard(codec, old, block, piece, valid, KEY)
    assert enc is not None
    data = joined(enc)
    assert set(chunk_bytes(codec, data)) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for pos in [(0, 0), (0, 1)]:
        assert chunk_bytes(codec, data)[pos] == chunk_bytes(codec, old)[pos]
    want = np.full(SHARD, FILL, dtype="int32")
    want[:5, :7] = old_values
    want[piece] = block
    np.testing.assert_array_equal(decode_shard_bytes(codec, data, KEY), want)
    assert (enc.chunks_stored, enc.chunks_empty) == (4, 0)


def test_a_merge_that_covers_a_damaged_chunk_whole_replaces_it_unread() -> None:
    """A region write that covers a damaged chunk whole repairs it: the chunk is encoded from
    the new values, its old bytes never decoded (only the chunks the region cuts are read).
    Kills the mutants of ``covered`` that count a chunk whose edge meets the region's as cut:
    the user's overwrite of the bad chunk would fail with CorruptShardError."""
    codec = make_codec()
    old_values = values()
    old = bytearray(joined(encode_shard(codec, old_values)))
    o = int(ShardIndex.of_shard(codec, bytes(old), KEY).entries[4, 0])  # chunk (1, 1)
    old[o : o + 4] = b"\0\0\0\0"  # the zstd frame's magic number
    piece = (slice(4, 8), slice(4, 10))  # covers (1, 1) from its edges, cuts (1, 2)
    block = -values((4, 6))
    enc = merge_shard(codec, bytes(old), block, piece, SHARD, KEY)
    want = old_values.copy()
    want[piece] = block
    np.testing.assert_array_equal(decode_shard_bytes(codec, joined(enc), KEY), want)


def test_a_merge_keeps_fixed_width_strings_whole() -> None:
    """The merge buffer holds the array's own dtype: in a ``<U6`` array whose fill value is the
    empty string, the strings of the chunk a region cuts, old and new, keep all six characters.
    Kills the mutant that builds the buffer without ``dtype`` (numpy makes it ``<U1`` from the
    fill value: every string of the chunk would be cut to its first character)."""
    inner = ChunkCodec(CHUNK, np.dtype("<U6"), np.str_(""), bytes_codecs=(Zstd(),))
    codec = ShardCodec(SHARD, inner)
    old_values = np.array([f"s{i:05d}" for i in range(96)]).reshape(SHARD)
    old = joined(encode_shard(codec, old_values))
    piece = (slice(0, 1), slice(0, 2))
    block = np.array([["abcdef", "uvwxyz"]])
    enc = merge_shard(codec, old, block, piece, SHARD, KEY)
    want = old_values.copy()
    want[piece] = block
    np.testing.assert_array_equal(decode_shard_bytes(codec, joined(enc), KEY), want)


def test_a_merge_of_large_chunks_encodes_each_chunk_it_cuts() -> None:
    """Large chunks (64 KiB) are encoded one a pool unit; a region that cuts only the third
    chunk of the shard must have that unit encode it, by its own place in the mask of touched
    chunks. Kills the mutant that reads every unit's mask from the shard's first chunk (untouched
    here): the merged chunk would be dropped and the user's region, with the rest of that
    chunk, would read as the fill value."""
    inner = ChunkCodec((128, 128), np.dtype("int32"), 0, bytes_codecs=(Zstd(),))
    assert inner.raw_nbytes >= SMALL_CHUNK
    codec = ShardCodec((128, 384), inner)
    old_values = values((128, 384))
    old = joined(encode_shard(codec, old_values))
    piece = (slice(10, 20), slice(300, 310))
    block = -values((10, 10))
    enc = merge_shard(codec, old, block, piece, (128, 384), KEY, threads=1)
    want = old_values.copy()
    want[piece] = block
    np.testing.assert_array_equal(decode_shard_bytes(codec, joined(enc), KEY), want)


def test_a_merge_over_a_chunk_that_cannot_be_decoded_names_it() -> None:
    """A cut chunk whose stored bytes are damaged: the merge refuses with CorruptShardError
    naming the shard's key and the chunk (the user learns what to repair) instead of writing
    its garbage back. Kills mutants of the error's key and chunk coordinates."""
    codec = make_codec()
    old = bytearray(joined(encode_shard(codec, values())))
    index = ShardIndex.of_shard(codec, bytes(old), KEY)
    o = int(index.entries[4, 0])  # chunk (1, 1)
    old[o : o + 4] = b"\0\0\0\0"  # the zstd frame's magic number
    with pytest.raises(CorruptShardError) as err:
        merge_shard(codec, bytes(old), values((2, 2)), (slice(5, 7), slice(5, 7)), SHARD, KEY)
    assert err.value.key == KEY
    assert err.value.chunk == (1, 1)
    assert "cannot decode" in str(err.value)


# -- encode_shard and empty_shard -----------------------------------------------------------------


def test_an_edge_shard_counts_only_its_chunks_inside_the_array() -> None:
    """encode_shard of a block clipped at the array's edge: the chunks outside the array are
    neither stored nor counted empty (the write report sums these counts over shards), and the
    stored ones sit at their place in the shard's full grid."""
    codec = make_codec()
    block = values((5, 7))
    block[0:4, 4:7] = FILL  # chunk (0, 1) all fill
    enc = encode_shard(codec, block)
    assert enc is not None
    assert (enc.chunks_stored, enc.chunks_empty, enc.raw_nbytes) == (3, 1, block.nbytes)
    assert set(chunk_bytes(codec, joined(enc))) == {(0, 0), (1, 0), (1, 1)}
    want = np.full(SHARD, FILL, dtype="int32")
    want[:5, :7] = block
    np.testing.assert_array_equal(decode_shard_bytes(codec, joined(enc), KEY), want)


def test_an_edge_shard_keeps_fixed_width_strings_whole() -> None:
    """A shard of ``<U6`` strings clipped at the array's edge is padded to whole chunks in the
    array's dtype: the strings keep all six characters. Kills the mutant that pads without
    ``dtype`` (``<U1`` from the empty fill string: the edge chunks' strings cut to one)."""
    inner = ChunkCodec(CHUNK, np.dtype("<U6"), np.str_(""), bytes_codecs=(Zstd(),))
    codec = ShardCodec(SHARD, inner)
    block = np.array([f"s{i:05d}" for i in range(35)]).reshape(5, 7)
    got = decode_shard_bytes(codec, joined(encode_shard(codec, block)), KEY)
    np.testing.assert_array_equal(got[:5, :7], block)


def test_a_damaged_nested_shard_is_named_in_the_error() -> None:
    """A nested shard whose own index is damaged: the error names the stored shard's key and the
    outer chunk, and says the fault is in the nested shard (``'<nested>'``), so the user knows
    which level to look at. Kills the mutant of that name."""
    nested = ShardCodec((4, 4), ChunkCodec((2, 2), np.dtype("uint8"), 0))
    codec = ShardCodec((4, 8), ChunkCodec((4, 4), np.dtype("uint8"), 0, nested=nested))
    data = bytearray(joined(encode_shard(codec, values((4, 8)).astype("uint8"))))
    o, n = (int(x) for x in ShardIndex.of_shard(codec, bytes(data), KEY).entries[1])
    data[o + n - 1] ^= 0xFF  # the last byte of outer chunk (0, 1): its nested index's crc32c
    with pytest.raises(CorruptShardError, match="shard '<nested>': shard index checksum") as err:
        decode_shard_bytes(codec, bytes(data), KEY)
    assert (err.value.key, err.value.chunk) == (KEY, (0, 1))


def test_encode_chunks_leaves_fill_chunks_out_unless_asked() -> None:
    """encode_chunks (this module's API) by default leaves a chunk all of the fill value out
    (None: sparse arrays stay small). Kills the mutant of its ``write_empty_chunks`` default."""
    codec = make_codec()
    block = values()
    block[0:4, 4:8] = FILL  # chunk (0, 1)
    got = encode_chunks(codec, block)
    assert [p is None for p in got] == [False, True, False, False, False, False]
    assert all(p is not None for p in encode_chunks(codec, block, write_empty_chunks=True))


@pytest.mark.parametrize("location", ["end", "start"])
def test_an_empty_shard_is_its_index_of_empty_chunks(location: str) -> None:
    """empty_shard: the index alone, every entry empty, reading as the fill value."""
    codec = make_codec(location)
    (data,) = empty_shard(codec)
    assert len(data) == codec.index_nbytes
    assert chunk_bytes(codec, data) == {}
    np.testing.assert_array_equal(
        decode_shard_bytes(codec, data, KEY), np.full(SHARD, FILL, dtype="int32")
    )


# -- units --------------------------------------------------------------------------------------


def _flat(box: tuple[tuple[int, int], ...], used: tuple[int, ...]) -> list[int]:
    ids = np.arange(int(np.prod(used))).reshape(used)  # the C-order position of each chunk
    return [int(i) for i in ids[tuple(slice(a, b) for a, b in box)].ravel()]


@pytest.mark.parametrize(
    ("used", "raw", "count"),
    [
        ((3, 5, 7), 4096, 3),  # 5 * 7 chunks of 4 KiB: 140 KiB per unit, one per plane
        ((3, 100), 4096, 6),  # rows of 100: 64 chunks a unit, then the rest of the row
        ((2, 4, 4), 16384, 2),  # exactly 256 KiB a plane: one plane a unit
        ((4, 3), SMALL_CHUNK, 12),  # large chunks: one a unit
        ((5,), 1024, 1),
    ],
)
def test_units_split_the_grid_once_in_c_order(used: tuple[int, ...], raw: int, count: int) -> None:
    """The encode tasks' units: together every chunk once, each unit's chunks consecutive in C
    order (encode_chunks joins their results in that order into the shard), small chunks
    batched up to UNIT_BYTES and large ones alone. Kills mutants of the axis the boxes split,
    of the step along it and of the boxes' bounds: a chunk encoded twice, or never (a hole in
    the user's data), or a thread's buffer far beyond its budget."""
    boxes = units(used, raw)
    assert len(boxes) == count
    order = [i for box in boxes for i in _flat(box, used)]
    assert order == list(range(int(np.prod(used))))
    for box in boxes:
        n = int(np.prod([b - a for a, b in box]))
        assert (n == 1) if raw >= SMALL_CHUNK else (n * raw <= UNIT_BYTES)


# -- ShardCodec -----------------------------------------------------------------------------------


def _normal(entry: Any) -> Any:
    """A zarr.json codec entry as JSON, an empty configuration the same as none."""
    if isinstance(entry, dict):
        return {k: _normal(v) for k, v in entry.items() if not (k == "configuration" and not v)}
    if isinstance(entry, list | tuple):
        return [_normal(v) for v in entry]
    return entry


def _arrays() -> list[Any]:
    store = zarr.storage.MemoryStore()
    nested = zc.ShardingCodec(
        chunk_shape=(2, 2), codecs=[zc.BytesCodec(endian="big")], index_location="start"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr warns that nested sharding reads shards whole
        return [
            zarr.create_array(
                store,
                name="t",
                shape=(8, 8),
                dtype="int16",
                chunks=(2, 4),
                shards=(4, 8),
                filters=[zc.TransposeCodec(order=(1, 0))],
                compressors=[zc.ZstdCodec(level=3, checksum=True)],
            ),
            zarr.create_array(
                store,
                name="n",
                shape=(8, 8),
                dtype="uint8",
                chunks=(4, 8),
                compressors=None,
                serializer=zc.ShardingCodec(
                    chunk_shape=(4, 8),
                    codecs=[nested, zc.ZstdCodec(level=1), zc.Crc32cCodec()],
                    index_codecs=[zc.BytesCodec(endian="big")],
                    index_location="start",
                ),
            ),
        ]


@pytest.mark.parametrize("which", [0, 1], ids=["transposed-zstd", "nested-big-endian-index"])
def test_the_codec_entry_is_what_zarr_wrote(which: int) -> None:
    """ShardCodec.to_dict (the serializer entry of a nested chain) is the entry zarr wrote for
    the same codec: a transpose, a nested shard, a big-endian index without crc32c at the start.
    Kills the mutants of each key and value: metadata no reader parses, or parses wrongly."""
    arr = _arrays()[which]
    codec = info_from_metadata(arr.metadata).codec
    want = json.loads(json.dumps(arr.metadata.to_dict()["codecs"][0]))
    assert _normal(json.loads(json.dumps(codec.to_dict()))) == _normal(want)


def test_nested_shards_of_incompressible_data_read_back() -> None:
    """Nested sharding with zstd around the nested shards, on random bytes: each nested shard
    holds 2048 chunks of (2, 2) bytes, so it is its 8 KiB of data plus a 32 KiB index, and the
    outer chain's decode must allow that much (``max_encoded_nbytes``, the most a zstd frame
    may claim). Kills the mutants that shrink that bound below what a nested shard can be (one
    that subtracts the index, one that divides by the raw size): the data would not read back."""
    nested = ShardCodec((64, 128), ChunkCodec((2, 2), np.dtype("uint8"), 0))
    inner = ChunkCodec((64, 128), np.dtype("uint8"), 0, nested=nested, bytes_codecs=(Zstd(),))
    codec = ShardCodec((64, 256), inner)  # two outer chunks side by side: stacked by copy
    data = np.random.default_rng(3).integers(1, 256, (64, 256), dtype="uint8")
    shard = joined(encode_shard(codec, data, threads=1))
    assert len(nested.encode_chunk(data[:, :128])) == 8192 + nested.index_nbytes
    np.testing.assert_array_equal(decode_shard_bytes(codec, shard, KEY), data)


def test_a_nested_shard_of_a_single_threaded_write_stays_in_its_thread() -> None:
    """A write with ``threads=1`` encodes nested shards in the calling thread too, not over the
    shared pool behind the caller's back (a user bounds a write's threads to share a machine);
    the nested shard's two large chunks would go to two pool threads. Kills the mutant of
    ``encode_chunk`` that drops its ``threads=1``."""
    pool.after_fork()  # no pool threads yet: any started below would be this encode's
    try:
        chunk = (256, 256)  # uint8: 64 KiB, a large chunk (one pool unit each)
        nested = ShardCodec((512, 256), ChunkCodec(chunk, np.dtype("uint8"), 0))
        assert nested.inner.raw_nbytes >= SMALL_CHUNK
        outer = ShardCodec((512, 512), ChunkCodec((512, 256), np.dtype("uint8"), 0, nested=nested))
        data = np.random.default_rng(5).integers(1, 256, (512, 512), dtype="uint8")
        before = set(threading.enumerate())
        shard = joined(encode_shard(outer, data, threads=1))
        started = [t.name for t in set(threading.enumerate()) - before]
        assert not [n for n in started if n.startswith("shardwise")], started
        np.testing.assert_array_equal(decode_shard_bytes(outer, shard, KEY), data)
    finally:
        pool.after_fork()  # the tests after this one start from a fresh pool, as alone


def test_small_zstd_chunks_reach_the_shard_one_part_per_unit() -> None:
    """A shard of many small zstd chunks is stored from one part per unit of chunks (plus the
    index), not one per chunk; its bytes are those of the chunks encoded one by one, in C order."""
    inner = ChunkCodec((8, 8), np.dtype("float32"), 0, bytes_codecs=(Zstd(level=3),))
    codec = ShardCodec((256, 256), inner)
    block = np.random.default_rng(9).standard_normal((256, 256)).astype("float32")
    block[:8, :16] = 0  # two chunks of the fill value: not stored
    enc = encode_shard(codec, block, threads=1)
    assert enc is not None
    nunits = len(units(codec.grid, inner.raw_nbytes))
    assert nunits < codec.nchunks // 8
    assert len(enc.parts) == nunits + 1
    chunks = [
        inner.encode(block[i : i + 8, j : j + 8].copy())
        for i in range(0, 256, 8)
        for j in range(0, 256, 8)
    ]
    stored = [bytes(p) for p in chunks[2:]]
    assert enc.chunks_stored == len(stored) and enc.chunks_empty == 2
    assert enc.data[: -codec.index_nbytes] == b"".join(stored)
