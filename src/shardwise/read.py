"""Read sharded arrays: only the inner chunks a selection needs, decoded into their place.

``ShardReader`` is the engine under :func:`shardwise.read_array`, :func:`shardwise.open_array`
and the xarray backend. For each shard a selection touches it reads the shard index once (a
suffix request when the index is at the end; validated indexes are cached), then cuts the needed
inner chunks into groups of at most ``GROUP_BYTES`` raw bytes; a pool thread fetches each
group's chunks as coalesced byte ranges (local files: into a buffer the thread reuses) and
decodes them straight into the output. Missing shards and missing inner chunks read as the fill
value.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _pool
from . import store as store_module
from .errors import CorruptShardError
from .layout import Coord, Region, intersect, shift
from .metadata import ArrayInfo
from .shard import MISSING, Fetch, ShardCodec, box_coords, decode_chunks, decode_into, parse_index
from .store import LocalObject, ShardStore

MAX_GAP = 64 * 1024
MAX_RANGE = 32 * 1024 * 1024
# raw bytes of the inner chunks one pool task fetches and decodes at a time (its buffers' size)
GROUP_BYTES = 1024 * 1024
# ... fetched at a time from stores other than local files (fewer requests; more memory per thread)
REMOTE_FETCH_BYTES = 16 * 1024 * 1024


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


def _plan_ranges(entries: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Coalesced ranges for ``(offset, nbytes)`` entries and, per entry, ``(merged index,
    start)`` within them. Entries in increasing order with small gaps (how shards are usually
    laid out) take one vectorized step instead of a Python loop per entry."""
    o, n = entries[:, 0].astype(np.int64), entries[:, 1].astype(np.int64)
    if len(o):
        gaps = o[1:] - (o[:-1] + n[:-1])
        span = int(o[-1] + n[-1] - o[0])
        if bool(((gaps >= 0) & (gaps <= MAX_GAP)).all()) and span <= MAX_RANGE:
            where = np.zeros((len(o), 2), dtype=np.int64)
            where[:, 1] = o - o[0]
            return [(int(o[0]), span)], where
    ranges = [(int(a), int(b)) for a, b in zip(o.tolist(), n.tolist(), strict=True)]
    merged, triples = coalesce(ranges)
    return merged, np.array([(m, a) for m, a, _ in triples], dtype=np.int64).reshape(-1, 2)


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
        out = new_array(tuple(s.stop - s.start for s in region), self.dtype)
        self.read_into(region, out)
        return out

    def read_into(
        self, region: Region, out: np.ndarray, steps: Sequence[int] | None = None
    ) -> None:
        """Fill ``out`` with ``array[region]`` taken every ``steps`` (default 1) along each axis.

        ``region`` holds step-1 slices inside the array starting at the first selected element;
        ``out`` has one element per selected position. Every inner chunk is decoded into its place
        in ``out`` (through a per-thread buffer when it is not a contiguous run of ``out``); the
        work is cut into groups of whole inner chunks of at most ``GROUP_BYTES`` raw bytes, each
        fetched and decoded by one pool thread into buffers it reuses, so memory beyond ``out``
        does not grow with the shard size. Many shards run in parallel, one per pool task; a
        few shards run one after another, their groups in parallel.
        """
        steps = None if steps is None or all(k == 1 for k in steps) else tuple(steps)
        shards = list(self.info.layout.shards_touching(region))
        size = _pool.pool_size() if self.threads is None else max(1, self.threads)
        if len(shards) >= 2 * size > 2:

            def run(batch: Sequence[Coord]) -> list[None]:
                for shard in batch:
                    self._fill_shard(shard, region, steps, out, threads=1)
                return [None] * len(batch)

            # one shard per batch: a thread slowed down holds up at most one shard
            _pool.map_batches(run, shards, self.threads, batches=len(shards))
            return
        for shard in shards:
            self._fill_shard(shard, region, steps, out, threads=self.threads)

    def _fill_shard(
        self,
        shard: Coord,
        region: Region,
        steps: tuple[int, ...] | None,
        out: np.ndarray,
        threads: int | None,
    ) -> None:
        """The part of ``out`` that lies in ``shard``, group by group on the pool."""
        lay, codec = self.info.layout, self.info.codec
        sreg = lay.shard_region(shard)
        part = intersect(sreg, region)
        if part is None:
            return
        if steps is not None:
            part = _selected(part, region, steps)
            if part is None:
                return
        origin = [s.start for s in sreg]
        local = shift(part, origin)
        box = [
            range(sl.start // c, -(-sl.stop // c))
            for sl, c in zip(local, codec.chunk_shape, strict=True)
        ]
        raw = codec.inner.raw_nbytes
        # other stores: fewer, larger requests (each fetched once, decoded group by group)
        small_fetch = self.store.local_root is not None or steps is not None
        fetch_bytes = GROUP_BYTES if small_fetch else REMOTE_FETCH_BYTES
        groups = split_box(box, raw, fetch_bytes)
        key = lay.shard_key(shard)
        full_key = self.store.key(key)
        with self._shard(key) as got:
            if got is None:
                out[_dest(part, region, steps)] = self.info.fill_value
                return
            index, fetch = got

            def run(batch: Sequence[list[range]]) -> list[None]:
                for fbox in batch:
                    once = fetch if small_fetch else _prefetch(codec, index, fbox, fetch)
                    for gbox in split_box(fbox, raw, GROUP_BYTES):
                        self._fill_group(
                            gbox, origin, local, region, steps, out, index, once, full_key
                        )
                return [None] * len(batch)

            _pool.map_batches(run, groups, threads)

    def _fill_group(
        self,
        gbox: list[range],
        origin: Sequence[int],
        local: Region,
        region: Region,
        steps: tuple[int, ...] | None,
        out: np.ndarray,
        index: np.ndarray,
        fetch: Fetch,
        key: str,
    ) -> None:
        """Decode the inner chunks of ``gbox`` (a box of chunk coordinates of one shard) and
        place the selected part of them into ``out``."""
        codec = self.info.codec
        cs = codec.chunk_shape
        glocal = tuple(
            slice(max(sl.start, r.start * c), min(sl.stop, r.stop * c))
            for sl, r, c in zip(local, gbox, cs, strict=True)
        )
        part = tuple(slice(s.start + o, s.stop + o) for s, o in zip(glocal, origin, strict=True))
        if steps is None:
            target = out[_dest(part, region, None)] if part else out
            decode_into(codec, index, gbox, glocal, fetch, key, target, threads=1)
            return
        tight = _selected(part, region, steps)
        if tight is None:
            return
        # only the chunks holding selected positions (a step may skip whole chunks)
        pos = [
            np.arange(t.start - o, t.stop - o, k)
            for t, o, k in zip(tight, origin, steps, strict=True)
        ]
        need = [np.unique(p // c) for p, c in zip(pos, cs, strict=True)]
        coords = np.stack(np.meshgrid(*need, indexing="ij"), -1).reshape(-1, len(need))
        stack = decode_chunks(codec, index, coords, fetch, key, threads=1, reuse=True)
        block = codec.inner.unstack(stack, [len(u) for u in need])
        mapped = [
            np.searchsorted(u, p // c) * c + p % c for u, p, c in zip(need, pos, cs, strict=True)
        ]
        out[_dest(tight, region, steps)] = block[np.ix_(*mapped)]

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
    def _shard(self, key: str) -> Iterator[tuple[np.ndarray, Fetch] | None]:
        """The validated index of shard ``key`` and a fetch over the same version of it.

        Local files: the index cache is checked against the open file's identity (inode, size,
        mtime), so a shard rewritten since is read afresh, never with stale offsets; ranges are
        read into the calling thread's reused buffer. Other stores: the index is fetched with the
        data unless ``cache_indexes`` is set (then the array must not be rewritten while this
        reader is open).
        """
        codec = self.info.codec
        n = codec.index_nbytes
        full_key = self.store.key(key)
        handle = self.store.open_local(key) if self.store.local_root is not None else None
        if handle is not None:
            with handle:
                index = self._cached(key, handle.version)
                if index is False:
                    start = max(0, handle.size - n) if codec.index_location == "end" else 0
                    index = self._parse(key, handle.read(start, min(n, handle.size)), handle.size)
                    self._remember(key, handle.version, index)
                assert isinstance(index, np.ndarray)
                yield index, _local_fetch(handle, full_key)
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
        yield index, _range_fetch(lambda ranges: self.store.get_ranges(key, ranges), full_key)

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
            index, fetch = got
            return decode_chunks(codec, index, coords, fetch, self.store.key(name), self.threads)

    def stored_chunks(self, shard: Coord) -> np.ndarray | None:
        """Boolean grid of the inner chunks stored in ``shard`` (None when the shard is missing)."""
        with self._shard(self.info.layout.shard_key(shard)) as got:
            if got is None:
                return None
            mask: np.ndarray = (got[0][:, 0] != MISSING).reshape(self.info.codec.grid)
            return mask


def _range_fetch(get_ranges: Callable[[list[tuple[int, int]]], list[bytes]], key: str) -> Fetch:
    """A fetch for :func:`decode_chunks`: coalesced range reads of the wanted entries."""

    def fetch(entries: np.ndarray) -> tuple[Any, np.ndarray]:
        merged, where = _plan_ranges(entries)
        blobs = get_ranges(merged)
        for (o, n), blob in zip(merged, blobs, strict=True):
            if len(blob) != n:
                raise CorruptShardError(key, f"range read at {o} returned {len(blob)} of {n} bytes")
        starts = np.cumsum([0, *(len(b) for b in blobs[:-1])])
        return (blobs[0] if len(blobs) == 1 else b"".join(blobs)), _segments(where, starts, entries)

    return fetch


def _prefetch(codec: ShardCodec, index: np.ndarray, box: Sequence[range], fetch: Fetch) -> Fetch:
    """Fetch the stored chunks of ``box`` now, in one go; the returned fetch serves any subset of
    them from that buffer."""
    coords = box_coords(box)
    entries = index[np.ravel_multi_index(tuple(coords.T), codec.grid)] if box else index[:1]
    entries = entries[entries[:, 0] != MISSING]
    if not len(entries):
        return fetch
    buf, segs = fetch(entries)
    order = np.argsort(entries[:, 0], kind="stable")
    offsets = entries[order, 0]

    def sub(wanted: np.ndarray) -> tuple[Any, np.ndarray]:
        return buf, segs[order[np.searchsorted(offsets, wanted[:, 0])]]

    return sub


def _segments(where: np.ndarray, starts: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """``(offset, nbytes)`` of each entry in the fetched buffer (merged ranges laid end to end
    from ``starts``)."""
    segs = np.empty((len(entries), 2), dtype=np.uint64)
    segs[:, 0] = starts.astype(np.int64)[where[:, 0]] + where[:, 1]
    segs[:, 1] = entries[:, 1]
    return segs


def _local_fetch(handle: LocalObject, key: str) -> Fetch:
    """A fetch reading coalesced ranges of a local file into the calling thread's reused buffer
    (valid until that thread's next fetch; the decoders consume it before)."""

    def fetch(entries: np.ndarray) -> tuple[Any, np.ndarray]:
        merged, where = _plan_ranges(entries)
        total = sum(n for _, n in merged)
        if total > store_module.SCRATCH_MAX:
            buf = memoryview(bytearray(total))
        else:
            buf = store_module.scratch(total)
        starts, pos = [], 0
        for o, n in merged:
            got = 0
            while got < n:
                k = os.preadv(handle.fd, [buf[pos + got : pos + n]], o + got)
                if k == 0:
                    raise CorruptShardError(key, f"range read at {o} returned {got} of {n} bytes")
                got += k
            starts.append(pos)
            pos += n
        return buf, _segments(where, np.asarray(starts), entries)

    return fetch


_advice_lock = threading.Lock()


@functools.cache
def _hugepage_switch() -> Callable[[bool], bool] | None:
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        with contextlib.suppress(ImportError):
            switch = getattr(importlib.import_module(name), "_set_madvise_hugepage", None)
            if switch is not None:
                return switch  # type: ignore[no-any-return]
    return None


def new_array(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """``np.empty(shape, dtype)`` in ordinary pages.

    numpy advises the kernel to back large arrays with transparent huge pages. A huge page must be
    found (and zeroed) on first touch, and on virtual machines whose memory is backed lazily that
    often costs far more than the 4 KiB pages it saves faults for: filling a fresh 1 GiB array
    took 0.15-2.5 s of system time with the advice and a steady 0.5 s without, and a 256 MiB read
    0.5-0.8 s against 0.25-0.28 s. Readers fill every byte of the output once, so they skip it.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    switch = _hugepage_switch() if nbytes >= 4 * 2**20 else None
    if switch is None:
        return np.empty(shape, dtype)
    with _advice_lock:
        before = _advice_saved[0] = switch(False)
        try:
            return np.empty(shape, dtype)
        finally:
            switch(before)
            _advice_saved[0] = None


# a fork while another thread held the switch: the child gets a free lock and numpy's setting back
_advice_saved: list[bool | None] = [None]


def _after_fork_in_child() -> None:
    global _advice_lock
    _advice_lock = threading.Lock()
    switch = _hugepage_switch()
    if _advice_saved[0] is not None and switch is not None:
        switch(_advice_saved[0])
    _advice_saved[0] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def split_box(box: Sequence[range], chunk_nbytes: int, budget: int) -> list[list[range]]:
    """Cut a box of inner-chunk coordinates into C-ordered boxes of at most ``budget`` raw
    bytes (one chunk at least), splitting the leading axes first.

    >>> [[(r.start, r.stop) for r in b] for b in split_box([range(0, 4), range(0, 2)], 10, 40)]
    [[(0, 2), (0, 2)], [(2, 4), (0, 2)]]
    >>> len(split_box([range(0, 2), range(0, 4)], 10, 20))
    4
    """
    n = math.prod(len(r) for r in box)
    if not box or n * chunk_nbytes <= budget:
        return [list(box)]
    row = (n // len(box[0])) * chunk_nbytes
    if row <= budget:
        k = max(1, budget // row)
        first = box[0]
        return [
            [range(a, min(a + k, first.stop)), *box[1:]] for a in range(first.start, first.stop, k)
        ]
    return [
        [range(a, a + 1), *sub] for a in box[0] for sub in split_box(box[1:], chunk_nbytes, budget)
    ]


def _selected(part: Region, region: Region, steps: Sequence[int]) -> Region | None:
    """``part`` of ``region`` shrunk to the first and last positions the steps select in it."""
    out = []
    for p, r, k in zip(part, region, steps, strict=True):
        j0 = -(-(p.start - r.start) // k)
        j1 = -(-(p.stop - r.start) // k)
        if j1 <= j0:
            return None
        out.append(slice(r.start + k * j0, r.start + k * (j1 - 1) + 1))
    return tuple(out)


def _dest(part: Region, region: Region, steps: Sequence[int] | None) -> tuple[slice, ...]:
    """Where the selected positions of ``part`` land in the output of ``region``."""
    if steps is None:
        return shift(part, [s.start for s in region])
    return tuple(
        slice(-(-(p.start - r.start) // k), -(-(p.stop - r.start) // k))
        for p, r, k in zip(part, region, steps, strict=True)
    )
