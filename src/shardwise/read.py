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

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import store as store_module
from ._pool import on_fork
from .errors import CorruptShardError
from .layout import Coord, Region, intersect, shift
from .metadata import ArrayInfo
from .shard import MISSING, Fetch, decode_chunks, decode_into, index_slice, parse_index
from .store import ShardStore

MAX_GAP = 64 * 1024
MAX_RANGE = 32 * 1024 * 1024

# bumped in a child started with fork: a reader's lock from before the fork may be held by a
# thread the child does not have, so a reader takes a new one (its cached indexes stay valid:
# each entry is checked against the object it was read from)
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1


on_fork(_forked)


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
    cache_indexes: bool = False
    cache_size: int = 4096
    _cache: OrderedDict[str, tuple[Any, np.ndarray | None]] = field(
        default_factory=OrderedDict, repr=False
    )
    _lock_: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _lock_forks: int = field(default=-1, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = OrderedDict()
        del state["_lock_"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock_ = threading.Lock()
        self._lock_forks = _forks

    def __post_init__(self) -> None:
        self._lock_forks = _forks

    @property
    def _lock(self) -> threading.Lock:
        if self._lock_forks != _forks:  # first use in a forked child
            self._lock_ = threading.Lock()
            self._lock_forks = _forks
        return self._lock_

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

    def _cached(self, key: str, version: Any) -> np.ndarray | bool | None:
        """The cached index of ``key`` if it was read from ``version``, else False."""
        with self._lock:
            got = self._cache.get(key)
            if got is None or got[0] != version:
                return False
            self._cache.move_to_end(key)
            return got[1]

    def _remember(self, key: str, version: Any, index: np.ndarray | None) -> None:
        with self._lock:
            self._cache[key] = (version, index)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _parse(self, key: str, raw: bytes, size: int) -> np.ndarray:
        n = self.info.codec.index_nbytes
        return parse_index(
            self.info.codec, raw[-n:] if len(raw) > n else raw, size, self.store.key(key)
        )

    @contextlib.contextmanager
    def _shard(
        self, key: str
    ) -> Iterator[tuple[np.ndarray, Callable[[list[tuple[int, int]]], list[bytes]]] | None]:
        """The validated index of shard ``key`` and a range reader over the same version of it.

        Local files: the index cache is checked against the open file's identity (inode, size,
        mtime), so a shard rewritten since is read afresh, never with stale offsets. Other
        stores: the index is fetched with the data unless ``cache_indexes`` is set (then the
        array must not be rewritten while this reader is open).
        """
        codec = self.info.codec
        n = codec.index_nbytes
        handle = self.store.open_local(key) if self.store.local_root is not None else None
        if handle is not None:
            with handle:
                index = self._cached(key, handle.version)
                if index is False:
                    start = max(0, handle.size - n) if codec.index_location == "end" else 0
                    index = self._parse(key, handle.read(start, min(n, handle.size)), handle.size)
                    self._remember(key, handle.version, index)
                assert isinstance(index, np.ndarray)
                yield index, handle.read_ranges
            return
        if self.store.local_root is not None:
            yield None
            return
        index = self._cached(key, None) if self.cache_indexes else False
        if index is False:
            if codec.index_location == "end":
                got = self.store.get_suffix(key, n)
            else:
                got = self.store.get_prefix(key, n)
            index = None if got is None else self._parse(key, *got)
            if self.cache_indexes:
                self._remember(key, None, index)
        if index is None:
            yield None
            return
        assert isinstance(index, np.ndarray)
        yield index, lambda ranges: self.store.get_ranges(key, ranges)

    def _range_fetch(
        self, get_ranges: Callable[[list[tuple[int, int]]], list[bytes]], key: str
    ) -> Fetch:
        """A fetch for :func:`decode_chunks`: coalesced range reads of the wanted entries."""

        def fetch(entries: np.ndarray) -> tuple[Any, np.ndarray]:
            ranges = [(int(o), int(n)) for o, n in entries.tolist()]
            merged, where = coalesce(ranges)
            blobs = get_ranges(merged)
            for (o, n), blob in zip(merged, blobs, strict=True):
                if len(blob) != n:
                    raise CorruptShardError(
                        key, f"range read at {o} returned {len(blob)} of {n} bytes"
                    )
            starts = np.cumsum([0, *(len(b) for b in blobs[:-1])])
            segs = np.array([(starts[m] + a, b - a) for m, a, b in where], dtype=np.uint64)
            return (blobs[0] if len(blobs) == 1 else b"".join(blobs)), segs.reshape(-1, 2)

        return fetch

    def decode_chunks(self, shard: Coord, coords: np.ndarray) -> np.ndarray:
        """A stack of the inner chunks ``coords`` (``(n, ndim)``, relative to ``shard``).

        Reads the shard index, then only the listed chunks as coalesced byte ranges; missing
        shards and chunks hold the fill value.
        """
        codec = self.info.codec
        inner = codec.inner
        name = self.info.layout.shard_key(shard)
        with self._shard(name) as got:
            if got is None or not len(coords):
                stack = np.empty((len(coords), *inner.stored_shape), dtype=inner.stored_dtype)
                stack[...] = inner.fill_value
                return stack
            index, get_ranges = got
            fetch = self._range_fetch(get_ranges, self.store.key(name))
            return decode_chunks(codec, index, coords, fetch, self.store.key(name), self.threads)

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
        target = out[dest] if dest else out
        if not whole or self._large_local(key):
            with self._shard(key) as got:
                if got is None:
                    target[...] = self.info.fill_value
                    return
                index, get_ranges = got
                fetch = self._range_fetch(get_ranges, full_key)
                decode_into(codec, index, box, local, fetch, full_key, target, self.threads)
            return
        with self._whole(key) as data:
            if data is None:
                target[...] = self.info.fill_value
                return
            mv = memoryview(data)
            index = parse_index(codec, mv[index_slice(codec, len(mv))], len(mv), full_key)
            decode_into(codec, index, box, local, lambda e: (mv, e), full_key, target, self.threads)

    def _large_local(self, key: str) -> bool:
        """A local object too large for the reused buffer: read by ranges on the pool instead."""
        if self.store.local_root is None:
            return False
        size = self.store.size(key)
        return size is not None and size > store_module.SCRATCH_MAX

    @contextlib.contextmanager
    def _whole(self, key: str) -> Iterator[bytes | memoryview | None]:
        """The whole object ``key`` (None when missing); local files are read into a buffer the
        calling thread reuses, valid inside the ``with`` block only."""
        if self.store.local_root is None:
            yield self.store.get(key)
            return
        handle = self.store.open_local(key)
        if handle is None:
            yield None
            return
        with handle:
            yield handle.read_all()

    def stored_chunks(self, shard: Coord) -> np.ndarray | None:
        """Boolean grid of the inner chunks stored in ``shard`` (None when the shard is missing)."""
        with self._shard(self.info.layout.shard_key(shard)) as got:
            if got is None:
                return None
            mask: np.ndarray = (got[0][:, 0] != MISSING).reshape(self.info.codec.grid)
            return mask
