"""Misaligned dask sources written without joining their pieces (engine/pieces.py, codec/mosaic.py).

When every source chunk edge falls on an inner-chunk edge, each shard task takes the source
blocks overlapping its shard and encodes the overlaps in place. Checked here: the shard bytes
equal those of the joined block (same codec, any piece layout, edges, transposes, empty chunks),
the stored arrays equal the source as zarr-python reads them (whole writes, region writes that
merge into stored shards, edges), the graph has no rechunk tasks and one task per shard, and
encoding a mosaic allocates no shard-sized array.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import shardwise
from shardwise.codec.chunks import ChunkCodec
from shardwise.codec.codecs import Zstd
from shardwise.codec.mosaic import Mosaic
from shardwise.codec.shard import ShardCodec, encode_shard
from shardwise.core.plan import overlaps


def _cut(block: np.ndarray, cuts: list[list[int]]) -> Mosaic:
    """``block`` as a mosaic cut at ``cuts`` (per axis, interior edges)."""
    edges = [[0, *c, n] for c, n in zip(cuts, block.shape, strict=True)]
    origins, arrays = [], []
    for lo_hi in np.ndindex(*(len(e) - 1 for e in edges)):
        lo = tuple(e[i] for e, i in zip(edges, lo_hi, strict=True))
        hi = tuple(e[i + 1] for e, i in zip(edges, lo_hi, strict=True))
        origins.append(lo)
        arrays.append(block[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))])
    return Mosaic(block.shape, tuple(origins), tuple(arrays))


@st.composite
def mosaics(draw: st.DrawFn) -> tuple[ShardCodec, np.ndarray, Mosaic]:
    nd = draw(st.integers(1, 3))
    chunk = tuple(draw(st.integers(1, 5)) for _ in range(nd))
    grid = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    shard = tuple(c * g for c, g in zip(chunk, grid, strict=True))
    # an edge shard is clipped: its block may end inside a chunk
    shape = tuple(
        draw(st.integers(max(1, s - c + 1), s)) for s, c in zip(shard, chunk, strict=True)
    )
    cuts = []
    for n, c in zip(shape, chunk, strict=True):
        used = -(-n // c)
        picks = draw(st.sets(st.integers(1, used - 1), max_size=3)) if used > 1 else set()
        cuts.append([k * c for k in sorted(picks)])
    order = draw(st.sampled_from([None, tuple(reversed(range(nd)))]))
    inner = ChunkCodec(chunk, np.dtype("uint16"), 7, order=order, bytes_codecs=(Zstd(),))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    block = rng.integers(0, 3, size=shape).astype("uint16")
    if draw(st.booleans()):  # some chunks all fill: not stored
        block[tuple(slice(0, c) for c in chunk)] = 7
    return ShardCodec(shard, inner), block, _cut(block, cuts)


@settings(max_examples=60, deadline=None)
@given(case=mosaics(), threads=st.sampled_from([1, 3]), empty=st.booleans())
def test_a_mosaic_encodes_to_the_bytes_of_its_joined_block(
    case: tuple[ShardCodec, np.ndarray, Mosaic], threads: int, empty: bool
) -> None:
    codec, block, mosaic = case
    np.testing.assert_array_equal(mosaic.join(), block)
    got = encode_shard(codec, mosaic, threads=threads, write_empty_chunks=empty)
    want = encode_shard(codec, block, threads=threads, write_empty_chunks=empty)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert got.data == want.data
    assert (got.chunks_stored, got.chunks_empty, got.raw_nbytes) == (
        want.chunks_stored,
        want.chunks_empty,
        want.raw_nbytes,
    )


def test_encoding_a_mosaic_allocates_no_shard_sized_array() -> None:
    # 8 MiB of uint16 in 64 pieces; a join (rechunk) would allocate all 8 MiB at once
    inner = ChunkCodec((32, 32), np.dtype("uint16"), 0, bytes_codecs=(Zstd(),))
    codec = ShardCodec((2048, 2048), inner)
    block = (np.arange(2048 * 2048, dtype="uint32") % 4093).astype("uint16").reshape(2048, 2048)
    mosaic = _cut(block, [list(range(256, 2048, 256))] * 2)
    encode_shard(codec, mosaic, threads=1)  # the pool's reused buffers exist before tracing
    tracemalloc.start()
    try:
        enc = encode_shard(codec, mosaic, threads=1)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert enc is not None
    # the encoded chunks (kept: bytes) plus small per-unit buffers; nothing near 8 MiB more
    assert peak < enc.nbytes + 2**20, (peak, enc.nbytes)
    assert peak < block.nbytes / 2


def test_overlaps_cut_each_piece_into_its_source_chunks() -> None:
    assert overlaps((4, 4), (4, 4)) == [[(0, slice(0, 4), 0)], [(1, slice(0, 4), 0)]]
    assert overlaps((8,), (3, 3, 2)) == [
        [(0, slice(0, 3), 0), (1, slice(0, 3), 3), (2, slice(0, 2), 6)]
    ]
    # a source chunk larger than the pieces is cut into several
    assert overlaps((2, 2, 1), (5,)) == [
        [(0, slice(0, 2), 0)],
        [(0, slice(2, 4), 0)],
        [(0, slice(4, 5), 0)],
    ]


def _layers(x: da.Array) -> list[str]:
    return list(x.__dask_graph__().layers)


@pytest.mark.parametrize(
    ("shape", "inner", "shard", "src_chunks", "region"),
    [
        ((256, 192), (16, 16), (64, 64), (32, 48), None),  # pieces inside shards
        ((250, 190), (16, 16), (64, 64), (48, 80), None),  # crossing shard edges, clipped edges
        ((64, 64, 40), (8, 8, 8), (32, 32, 16), (16, 48, 8), None),
        ((256, 192), (16, 16), (64, 64), (32, 48), (slice(16, 208), slice(32, 176))),  # merges
    ],
    ids=["inside", "crossing-edges", "3d", "region-merges"],
)
def test_misaligned_sources_on_chunk_edges_are_written_without_rechunk(
    tmp_path: Path,
    shape: tuple[int, ...],
    inner: tuple[int, ...],
    shard: tuple[int, ...],
    src_chunks: tuple[int, ...],
    region: tuple[slice, ...] | None,
) -> None:
    rng = np.random.default_rng(1)
    full = rng.integers(1, 9, size=shape).astype("int32")
    path = str(tmp_path / "a")
    expect = np.zeros(shape, "int32")
    if region is not None:  # a stored array whose edge shards the region write merges into
        base = rng.integers(1, 9, size=shape).astype("int32")
        shardwise.write_array(base, path, chunks=inner, shards=shard, fill_value=0)
        expect = base.copy()
    part = full if region is None else full[region]
    src = da.from_array(part, chunks=src_chunks)
    kwargs = {"mode": "r+", "region": region} if region is not None else {}
    delayed = shardwise.write_array(
        src, path, chunks=inner, shards=shard, fill_value=0, compute=False, **kwargs
    )
    layers = " ".join(str(k) for k in delayed.__dask_graph__().layers)
    assert "rechunk" not in layers
    with dask.config.set(scheduler="threads"):
        report = dask.compute(delayed)[0]
    expect[region or ...] = part
    np.testing.assert_array_equal(zarr.open_array(path)[...], expect)
    sel = region or tuple(slice(0, n) for n in shape)
    touched = np.prod(
        [(r.stop - 1) // s - r.start // s + 1 for r, s in zip(sel, shard, strict=True)]
    )
    assert report.shards_written == touched
    assert shardwise.verify(path).ok
