"""Read sharded arrays: shard-aligned, range reads of only the inner chunks a selection needs.

``ShardReader`` is the engine under :func:`shardwise.open_array` and the xarray backend. For each
shard a selection touches it reads

* the whole object in one request when the selection needs every inner chunk of the shard;
* otherwise the shard index with one request (a suffix request when the index is at the end; the
  validated index is cached per reader), then the needed inner chunks as coalesced byte ranges.

Inner chunks are decoded in parallel on the shared pool. Missing shards and missing inner chunks
read as the fill value.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import CorruptShardError
from .layout import Coord, Region, intersect, shift
from .metadata import ArrayInfo
from .shard import MISSING, decode_box, index_slice, parse_index, scatter
from .store import ShardStore

MAX_GAP = 64 * 1024
MAX_RANGE = 32 * 1024 * 1024


def coalesce(
    ranges: Sequence[tuple[int, int]], max_gap: int = MAX_GAP, max_len: int = MAX_RANGE
) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """Merge nearby ``(offset, nbytes)`` ranges.

    Returns the merged ranges and, for each input range, ``(merged index, start, stop)`` within it.

    >>> coalesce([(0, 10), (12, 5), (1000000, 4)], max_gap=8)
    ([(0, 17), (1000000, 4)], [(0, 0, 10), (0, 12, 17), (1, 0, 4)])
    """
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    merged: list[list[int]] = []
    where: list[tuple[int, int, int]] = [(0, 0, 0)] * len(ranges)
    for i in order:
        o, n = ranges[i]
        if merged:
            mo, mn = merged[-1]
            if o >= mo and o - (mo + mn) <= max_gap and o + n - mo <= max_len:
                merged[-1][1] = max(mn, o + n - mo)
                where[i] = (len(merged) - 1, o - mo, o - mo + n)
                continue
        merged.append([o, n])
        where[i] = (len(merged) - 1, 0, n)
    return [(o, n) for o, n in merged], where


@dataclass
class ShardReader:
    """Reads regions of one sharded array. Thread-safe; pickles without its cache."""

    info: ArrayInfo
    store: ShardStore
    threads: int | None = None
    cache_size: int = 4096
    _cache: OrderedDict[str, np.ndarray | None] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = OrderedDict()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # array-like protocol for dask.array.from_array
    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.layout.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.info.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        from .layout import normalize_region

        if not isinstance(key, tuple):
            key = (key,)
        key = key + (slice(None),) * (self.ndim - len(key))
        return self.read(normalize_region(key, self.shape))

    # -- reading --------------------------------------------------------------------------------

    def read(self, region: Region) -> np.ndarray:
        """The array values in ``region`` (slices with step 1)."""
        lay = self.info.layout
        out = np.empty(tuple(s.stop - s.start for s in region), dtype=self.dtype)
        for shard in lay.shards_touching(region):
            self.read_shard_into(shard, region, out)
        return out

    def _index(self, key: str) -> np.ndarray | None:
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        codec = self.info.codec
        n = codec.index_nbytes
        if codec.index_location == "end":
            got = self.store.get_suffix(key, n)
        else:
            got = self.store.get_prefix(key, n)
        if got is None:
            index = None
        else:
            raw, size = got
            index = parse_index(
                codec, raw if len(raw) == n else raw[-n:], size, self.store.key(key)
            )
        with self._lock:
            self._cache[key] = index
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return index

    def read_shard_into(self, shard: Coord, region: Region, out: np.ndarray) -> None:
        """Fill the part of ``out`` (which holds ``region``) that lies in ``shard``."""
        lay, codec = self.info.layout, self.info.codec
        sreg = lay.shard_region(shard)
        part = intersect(sreg, region)
        if part is None:
            return
        origin = [s.start for s in sreg]
        local = shift(part, origin)
        box = [
            range(sl.start // c, -(-sl.stop // c))
            for sl, c in zip(local, codec.chunk_shape, strict=True)
        ]
        dest = shift(part, [s.start for s in region])
        key = lay.shard_key(shard)
        full_key = self.store.key(key)
        whole = all(
            len(b) == -(-(s.stop - s.start) // c)
            for b, s, c in zip(box, sreg, codec.chunk_shape, strict=True)
        )
        if whole:
            data = self.store.get(key)
            if data is None:
                out[dest] = self.info.fill_value
                return
            index = parse_index(
                codec, memoryview(data)[index_slice(codec, len(data))], len(data), full_key
            )

            def fetch(entries: np.ndarray) -> tuple[Any, np.ndarray]:
                return data, entries
        else:
            idx = self._index(key)
            if idx is None:
                out[dest] = self.info.fill_value
                return
            index = idx

            def fetch(entries: np.ndarray) -> tuple[Any, np.ndarray]:
                ranges = [(int(o), int(n)) for o, n in entries.tolist()]
                merged, where = coalesce(ranges)
                blobs = self.store.get_ranges(key, merged)
                for (o, n), blob in zip(merged, blobs, strict=True):
                    if len(blob) != n:
                        raise CorruptShardError(
                            full_key, f"range read at {o} returned {len(blob)} of {n} bytes"
                        )
                starts = np.cumsum([0, *(len(b) for b in blobs[:-1])])
                segs = np.array(
                    [(starts[m] + a, b - a) for m, a, b in where], dtype=np.uint64
                ).reshape(-1, 2)
                return (blobs[0] if len(blobs) == 1 else b"".join(blobs)), segs

        stack = decode_box(codec, index, box, fetch, full_key, self.threads)
        scatter(codec, stack, box, local, out[dest] if dest else out)

    def stored_chunks(self, shard: Coord) -> np.ndarray | None:
        """Boolean grid of the inner chunks stored in ``shard`` (None when the shard is missing)."""
        index = self._index(self.info.layout.shard_key(shard))
        if index is None:
            return None
        mask: np.ndarray = (index[:, 0] != MISSING).reshape(self.info.codec.grid)
        return mask
