"""Byte ranges of one shard: coalescing, and fetches of inner chunks into reused buffers.

A *fetch* (:data:`shardwise.codec.shard.Fetch`) takes validated ``(offset, nbytes)`` index entries
and returns a buffer holding them and their segments in it. Local files are read with ``preadv``
into the calling thread's reused buffer; other stores answer coalesced range requests.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..codec.decode import Fetch, box_coords
from ..codec.shard import MISSING, ShardCodec, ShardIndex
from ..errors import CorruptShardError
from ..storage import store as store_module
from ..storage.store import LocalObject, ShardStore

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


def plan_ranges(entries: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
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


def range_fetch(get_ranges: Callable[[list[tuple[int, int]]], list[bytes]], key: str) -> Fetch:
    """A fetch for :func:`decode_chunks`: coalesced range reads of the wanted entries."""

    def fetch(entries: np.ndarray) -> tuple[Any, np.ndarray]:
        merged, where = plan_ranges(entries)
        blobs = get_ranges(merged)
        for (o, n), blob in zip(merged, blobs, strict=True):
            if len(blob) != n:
                raise CorruptShardError(key, f"range read at {o} returned {len(blob)} of {n} bytes")
        starts = np.cumsum([0, *(len(b) for b in blobs[:-1])])
        return (blobs[0] if len(blobs) == 1 else b"".join(blobs)), segments(where, starts, entries)

    return fetch


def read_index(store: ShardStore, codec: ShardCodec, key: str) -> tuple[ShardIndex, int] | None:
    """The validated index of the stored shard ``key`` (one suffix or prefix request) and the
    shard's size; None when there is no such shard."""
    n = codec.index_nbytes
    if n == 0:  # a plain chunk (a 0-d array): no index to fetch, only the object's size
        size = store.size(key)
        found = None if size is None else (b"", size)
    elif codec.index_location == "end":
        found = store.get_suffix(key, n)
    else:
        found = store.get_prefix(key, n)
    if found is None:
        return None
    raw, size = found
    return ShardIndex.from_bytes(codec, raw, size, store.key(key)), size


def prefetch(codec: ShardCodec, index: ShardIndex, box: Sequence[range], fetch: Fetch) -> Fetch:
    """Fetch the stored chunks of ``box`` now, in one go; the returned fetch serves any subset of
    them from that buffer."""
    coords = box_coords(box)
    entries = index.ranges(np.ravel_multi_index(tuple(coords.T), codec.grid) if box else [0])
    entries = entries[entries[:, 0] != MISSING]
    if not len(entries):
        return fetch
    buf, segs = fetch(entries)
    order = np.argsort(entries[:, 0], kind="stable")
    offsets = entries[order, 0]

    def sub(wanted: np.ndarray) -> tuple[Any, np.ndarray]:
        return buf, segs[order[np.searchsorted(offsets, wanted[:, 0])]]

    return sub


def segments(where: np.ndarray, starts: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """``(offset, nbytes)`` of each entry in the fetched buffer (merged ranges laid end to end
    from ``starts``)."""
    segs = np.empty((len(entries), 2), dtype=np.uint64)
    segs[:, 0] = starts.astype(np.int64)[where[:, 0]] + where[:, 1]
    segs[:, 1] = entries[:, 1]
    return segs


def local_fetch(handle: LocalObject, key: str) -> Fetch:
    """A fetch reading coalesced ranges of a local file into the calling thread's reused buffer
    (valid until that thread's next fetch; the decoders consume it before)."""

    def fetch(entries: np.ndarray) -> tuple[Any, np.ndarray]:
        merged, where = plan_ranges(entries)
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
        return buf, segments(where, np.asarray(starts), entries)

    return fetch
