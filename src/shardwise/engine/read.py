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
import math
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..codec.decode import Fetch, decode_chunks, decode_into, each_chunk
from ..codec.metadata import ArrayInfo
from ..codec.shard import ShardCodec, ShardIndex
from ..core import args
from ..core.layout import Coord, Region, intersect, shift
from ..runtime import pool as _pool
from ..runtime.pool import on_fork
from ..storage.nodes import open_info
from ..storage.store import ShardStore, resolve_store
from .fetch import MAX_GAP as MAX_GAP
from .fetch import MAX_RANGE as MAX_RANGE
from .fetch import coalesce as coalesce
from .fetch import local_fetch, prefetch, range_fetch
from .memory import new_array

# raw bytes of the inner chunks one pool task fetches and decodes at a time (its buffers' size)
GROUP_BYTES = 1024 * 1024
# ... fetched at a time from stores other than local files (fewer requests; more memory per thread)
REMOTE_FETCH_BYTES = 16 * 1024 * 1024

# bumped in a child started with fork: a reader's lock from before the fork may be held by a
# thread the child does not have, so a reader takes a new one (its cached indexes stay valid:
# each entry is checked against the object it was read from)
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1


on_fork(_forked)


@dataclass
class ShardReader:
    """Reads regions of one sharded array. Thread-safe; pickles without its cache."""

    info: ArrayInfo
    store: ShardStore
    threads: int | None = None
    cache_indexes: bool = False
    cache_size: int = 4096
    _cache: OrderedDict[str, tuple[Any, ShardIndex | None]] = field(
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
        from ..core.layout import normalize_region

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
        lay, codec = self.info.layout, self.info.shard_codec(shard)
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
        with self._shard(key, codec) as got:
            if got is None:
                out[_dest(part, region, steps)] = self.info.fill_value
                return
            index, fetch = got
            if small_fetch and steps is None and each_chunk(codec, box):
                # large chunks: one call places every chunk of the shard (their places in
                # ``out`` computed once), fetching GROUP_BYTES of them at a time per pool task
                target = out[_dest(part, region, None)]
                decode_into(codec, index, box, local, fetch, target, threads, GROUP_BYTES)
                return

            def run(batch: Sequence[list[range]]) -> list[None]:
                for fbox in batch:
                    once = fetch if small_fetch else prefetch(codec, index, fbox, fetch)
                    for gbox in split_box(fbox, raw, GROUP_BYTES):
                        self._fill_group(
                            gbox, origin, local, region, steps, out, index, once, codec
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
        index: ShardIndex,
        fetch: Fetch,
        codec: ShardCodec,
    ) -> None:
        """Decode the inner chunks of ``gbox`` (a box of chunk coordinates of one shard) and
        place the selected part of them into ``out``."""
        cs = codec.chunk_shape
        glocal = tuple(
            slice(max(sl.start, r.start * c), min(sl.stop, r.stop * c))
            for sl, r, c in zip(local, gbox, cs, strict=True)
        )
        part = tuple(slice(s.start + o, s.stop + o) for s, o in zip(glocal, origin, strict=True))
        if steps is None:
            target = out[_dest(part, region, None)] if part else out
            decode_into(codec, index, gbox, glocal, fetch, target, threads=1)
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
        stack = decode_chunks(codec, index, coords, fetch, threads=1, reuse=True)
        block = codec.inner.unstack(stack, [len(u) for u in need])
        mapped = [
            np.searchsorted(u, p // c) * c + p % c for u, p, c in zip(need, pos, cs, strict=True)
        ]
        out[_dest(tight, region, steps)] = block[np.ix_(*mapped)]

    def _cached(self, key: str, version: Any) -> ShardIndex | bool | None:
        """The cached index of ``key`` if it was read from ``version``, else False."""
        with self._lock:
            got = self._cache.get(key)
            if got is None or got[0] != version:
                return False
            self._cache.move_to_end(key)
            return got[1]

    def _remember(self, key: str, version: Any, index: ShardIndex | None) -> None:
        with self._lock:
            self._cache[key] = (version, index)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _parse(self, key: str, raw: bytes, size: int, codec: ShardCodec) -> ShardIndex:
        n = codec.index_nbytes
        return ShardIndex.from_bytes(
            codec, raw[-n:] if len(raw) > n else raw, size, self.store.key(key)
        )

    @contextlib.contextmanager
    def _shard(
        self, key: str, codec: ShardCodec | None = None
    ) -> Iterator[tuple[ShardIndex, Fetch] | None]:
        """The validated index of shard ``key`` and a fetch over the same version of it.

        Local files: the index cache is checked against the open file's identity (inode, size,
        mtime), so a shard rewritten since is read afresh, never with stale offsets; ranges are
        read into the calling thread's reused buffer. Other stores: the index is fetched with the
        data unless ``cache_indexes`` is set (then the array must not be rewritten while this
        reader is open). ``codec``: the shard's (:meth:`ArrayInfo.shard_codec`), else the
        array's.
        """
        codec = codec or self.info.codec
        n = codec.index_nbytes
        full_key = self.store.key(key)
        handle = self.store.open_local(key) if self.store.local_root is not None else None
        if handle is not None:
            with handle:
                index = self._cached(key, handle.version)
                if index is False:
                    start = max(0, handle.size - n) if codec.index_location == "end" else 0
                    raw = handle.read(start, min(n, handle.size))
                    index = self._parse(key, raw, handle.size, codec)
                    self._remember(key, handle.version, index)
                assert isinstance(index, ShardIndex)
                yield index, local_fetch(handle, full_key)
            return
        if self.store.local_root is not None:
            yield None
            return
        index = self._cached(key, None) if self.cache_indexes else False
        if index is False:
            if n == 0:  # a plain chunk (a 0-d array): its size is its index
                size = self.store.size(key)
                got = None if size is None else (b"", size)
            elif codec.index_location == "end":
                got = self.store.get_suffix(key, n)
            else:
                got = self.store.get_prefix(key, n)
            index = None if got is None else self._parse(key, *got, codec)
            if self.cache_indexes:
                self._remember(key, None, index)
        if index is None:
            yield None
            return
        assert isinstance(index, ShardIndex)
        yield index, range_fetch(lambda ranges: self.store.get_ranges(key, ranges), full_key)

    def decode_chunks(self, shard: Coord, coords: np.ndarray) -> np.ndarray:
        """A stack of the inner chunks ``coords`` (``(n, ndim)``, relative to ``shard``).

        Reads the shard index, then only the listed chunks as coalesced byte ranges; missing
        shards and chunks hold the fill value.
        """
        codec = self.info.shard_codec(shard)
        inner = codec.inner
        name = self.info.layout.shard_key(shard)
        with self._shard(name, codec) as got:
            if got is None or not len(coords):
                stack = np.empty((len(coords), *inner.stored_shape), dtype=inner.stored_dtype)
                stack[...] = inner.fill_value
                return stack
            index, fetch = got
            return decode_chunks(codec, index, coords, fetch, self.threads)


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


def open_reader(
    store: Any,
    *,
    path: str | None = None,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_indexes: bool = False,
) -> ShardReader:
    """The reader of the array at ``path``; the keywords of every read verb checked first."""
    args.optional_str("path", path)
    threads = args.thread_count("threads", threads)
    args.mapping("storage_options", storage_options)
    args.flags(cache_indexes=cache_indexes)
    zstore = resolve_store(store, mode="r", storage_options=storage_options)
    info = open_info(zstore, path)
    return ShardReader(
        info=info,
        store=ShardStore(zstore, path or ""),
        threads=threads,
        cache_indexes=cache_indexes,
    )
