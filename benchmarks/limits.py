"""The machine's limits for whole-array writes and reads of a workload (``numpy_paths.py``'s
``limit-write`` and ``limit-read`` cases): the codec work every writer and reader of the
workload's shards must do, with as little else as Python allows, on as many threads as cores.

* write: every inner chunk compressed (zstd level 3, content size in the frame, as the stores
  hold them) by shard, each shard's chunks in one call of python-zstandard's
  ``multi_compress_to_buffer`` (a C loop, the GIL released), from stacks of the chunks gathered
  contiguous before the clock; no gather, no file.
* read: the read store's shards loaded and split by their index before the clock; in it, a fresh
  output array (allocated as shardwise's readers allocate theirs: ordinary pages, faulted in
  ahead on as many threads as cores, the cheapest fresh memory this machine gives), every frame
  decompressed and copied into its place by shard on as many threads as cores: a large chunk
  (64 KiB or more) one numcodecs call into the thread's reused buffer, then one numpy copy;
  small chunks by slabs of whole rows of the shard's chunk grid of at most 1 MiB, one
  python-zstandard batch call and one numpy copy each; no file.

Each limit is what the codec library does on this machine, not a bound any library could beat by
choosing another binding: every zstd binding of the package registries compresses and
decompresses these chunks at the same speed (``benchmarks/README.md``).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import workloads

LARGE = 64 * 1024  # chunks of at least this many bytes are decompressed one call each
GROUP = 1024 * 1024  # small chunks are decompressed this many raw bytes a batch, at most
MISSING = np.uint64(2**64 - 1)  # an index entry of a chunk not stored
_local = threading.local()


def _threads() -> int:
    return len(os.sched_getaffinity(0))


def _shards(W: dict[str, Any]) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    shape, shard = W["shape"], W["shard"]
    assert all(s % c == 0 for s, c in zip(shape, shard, strict=True)), "whole shards only"
    assert all(s % c == 0 for s, c in zip(shard, W["inner"], strict=True)), "whole chunks only"
    for pos in itertools.product(*(range(s // c) for s, c in zip(shape, shard, strict=True))):
        yield pos, tuple(slice(p * c, (p + 1) * c) for p, c in zip(pos, shard, strict=True))


def _split(extent: Sequence[int], inner: Sequence[int]) -> tuple[list[int], list[int]]:
    """A box of whole chunks (``extent`` elements per axis) split into (chunk grid, inner) axes,
    and the transposition from those split axes to a stack's (grid axes first)."""
    split = [x for n, c in zip(extent, inner, strict=True) for x in (n // c, c)]
    nd = len(inner)
    return split, [*range(0, 2 * nd, 2), *range(1, 2 * nd, 2)]


def _stack(W: dict[str, Any], block: np.ndarray) -> np.ndarray:
    """A shard's block as a contiguous stack of its inner chunks, C order."""
    split, axes = _split(block.shape, W["inner"])
    n = math.prod(split[0::2])
    return np.ascontiguousarray(block.reshape(split).transpose(axes)).reshape(n, -1)


def _zstd() -> tuple[Any, Any]:
    import zstandard

    if not hasattr(_local, "c"):
        _local.c = zstandard.ZstdCompressor(level=workloads.ZSTD_LEVEL, write_content_size=True)
        _local.d = zstandard.ZstdDecompressor()
    return _local.c, _local.d


def write_limit(W: dict[str, Any], src: np.ndarray | None) -> Callable[[], list[Any]]:
    """Compress every chunk of ``src``: the stacks are gathered here, before the clock."""
    import zstandard

    assert src is not None
    stacks = [_stack(W, src[sl]) for _, sl in _shards(W)]
    raw = stacks[0].shape[1] * src.itemsize
    segs = np.empty((stacks[0].shape[0], 2), dtype=np.uint64)
    segs[:, 0] = np.arange(len(segs), dtype=np.uint64) * np.uint64(raw)
    segs[:, 1] = raw
    segb = segs.tobytes()

    def one(stack: np.ndarray) -> Any:
        items = zstandard.BufferWithSegments(memoryview(stack).cast("B"), segb)
        return _zstd()[0].multi_compress_to_buffer(items, threads=1)

    def run() -> list[Any]:
        with ThreadPoolExecutor(_threads()) as ex:
            return list(ex.map(one, stacks))

    return run


def frames_hold(got: list[Any], W: dict[str, Any], src: np.ndarray) -> bool:
    """Every compressed shard of :func:`write_limit` decompresses to its chunks of ``src``."""
    d = _zstd()[1]
    for coll, (_, sl) in zip(got, _shards(W), strict=True):
        want = _stack(W, src[sl])
        if b"".join(d.decompress(bytes(f)) for f in coll) != want.tobytes():
            return False
    return True


def _load(W: dict[str, Any], path: str) -> list[tuple[tuple[slice, ...], bytes, np.ndarray]]:
    """Each shard's slices, bytes and ``(offset, nbytes)`` index (end index, crc32c last)."""
    n = math.prod(s // c for s, c in zip(W["shard"], W["inner"], strict=True))
    out = []
    for pos, sl in _shards(W):
        with open(os.path.join(path, "c", *map(str, pos)), "rb") as f:
            data = f.read()
        index = np.frombuffer(data, dtype="<u8", count=2 * n, offset=len(data) - 16 * n - 4)
        out.append((sl, data, index.reshape(n, 2)))
    return out


def _chunks(W: dict[str, Any], sl: tuple[slice, ...], index: np.ndarray) -> Iterator[Any]:
    """Work of one shard: for large chunks, ``(place, (offset, nbytes))`` per chunk (None: not
    stored); for
    small ones, ``(place, rows)`` per slab of whole rows of the shard's chunk grid holding about
    ``GROUP`` raw bytes (the slab's chunks, in C order, as index rows)."""
    inner = W["inner"]
    grid = [s // c for s, c in zip(W["shard"], inner, strict=True)]
    size = math.prod(inner) * np.dtype(W["dtype"]).itemsize
    origin = [s.start for s in sl]
    if size >= LARGE:
        for i, q in enumerate(itertools.product(*map(range, grid))):
            place = tuple(
                slice(o + j * c, o + (j + 1) * c) for o, j, c in zip(origin, q, inner, strict=True)
            )
            yield place, None if index[i, 0] == MISSING else (int(index[i, 0]), int(index[i, 1]))
        return
    per_row = math.prod(grid[1:])
    k = max(1, GROUP // (per_row * size))
    for a in range(0, grid[0], k):
        b = min(a + k, grid[0])
        place = (slice(origin[0] + a * inner[0], origin[0] + b * inner[0]), *sl[1:])
        yield place, index[a * per_row : b * per_row]


def _slab(W: dict[str, Any], data: bytes, rows: np.ndarray) -> np.ndarray:
    """A slab's small chunks decompressed in one batch call, as a stack (missing: fill 0)."""
    import zstandard

    size = math.prod(W["inner"]) * np.dtype(W["dtype"]).itemsize
    present = rows[:, 0] != MISSING
    sizes = np.full(int(present.sum()), size, dtype=np.uint64).tobytes()
    items = zstandard.BufferWithSegments(data, rows[present].tobytes())
    coll = _zstd()[1].multi_decompress_to_buffer(items, decompressed_sizes=sizes, threads=1)
    got = np.frombuffer(b"".join(coll), dtype=np.uint8).reshape(-1, size)
    if present.all():
        return got
    stack = np.zeros((len(rows), size), dtype=np.uint8)
    stack[present] = got
    return stack


def _place(W: dict[str, Any], out: np.ndarray, place: tuple[slice, ...], stack: Any) -> None:
    """Copy a stack of chunks (C order over the box ``place``) into ``out[place]``."""
    split, axes = _split([s.stop - s.start for s in place], W["inner"])
    values = np.frombuffer(stack, dtype=out.dtype).reshape([split[a] for a in axes])
    out[place].reshape(split)[...] = values.transpose(np.argsort(axes))


def _fill(W: dict[str, Any], out: np.ndarray | None, shard: Any) -> None:
    """Decompress one shard's frames (into ``out``'s places; None: only decompress)."""
    from numcodecs.zstd import decompress

    sl, data, index = shard
    size = math.prod(W["inner"]) * np.dtype(W["dtype"]).itemsize
    mv = memoryview(data)
    if size >= LARGE:
        chunk = getattr(_local, "chunk", None)
        if chunk is None or len(chunk) != size:
            chunk = _local.chunk = bytearray(size)
        for place, entry in _chunks(W, sl, index):
            if entry is None:  # not stored: the workloads' fill value, 0
                if out is not None:
                    out[place] = 0
                continue
            decompress(mv[entry[0] : entry[0] + entry[1]], chunk)
            if out is not None:
                _place(W, out, place, chunk)
        return
    for place, rows in _chunks(W, sl, index):
        stack = _slab(W, data, rows)
        if out is not None:
            _place(W, out, place, stack)


def read_limit(W: dict[str, Any], path: str) -> Callable[[], np.ndarray]:
    """Decompress every stored frame into place in a fresh array; the shards load here."""
    import numcodecs.zstd  # noqa: F401  (imports before the clock)
    import zstandard  # noqa: F401

    from shardwise.engine.memory import new_array

    shards = _load(W, path)
    dtype = np.dtype(W["dtype"])

    def run() -> np.ndarray:
        out = new_array(tuple(W["shape"]), dtype)
        with ThreadPoolExecutor(_threads()) as ex:
            list(ex.map(lambda s: _fill(W, out, s), shards))
        return out

    return run


def decompress_only(W: dict[str, Any], path: str) -> float:
    """Seconds to decompress every stored frame, on as many threads as cores, into each thread's
    reused stack: zstd alone, no output array."""
    import time

    shards = _load(W, path)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(_threads()) as ex:
        list(ex.map(lambda s: _fill(W, None, s), shards))
    return time.perf_counter() - t0
