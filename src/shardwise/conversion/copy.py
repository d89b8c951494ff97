"""The copy path of :func:`shardwise.convert`: one task per target shard streams the source's
encoded inner chunks (chunk objects, or ranges of source shards after their index), a window at
a time, and the new index into the shard object through ``stream.commit_shard``. It runs as a
``copy`` write of the write pipeline (:mod:`shardwise.write.pipeline`: lease, marker, per-shard
records, running tasks stopped on failure), so a rerun with ``resume=True`` skips the shards
already committed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..codec.codecs import crc32c
from ..codec.metadata import ArrayInfo, unsharded_info
from ..codec.shard import MISSING, ShardIndex
from ..core.keys import ShardKeys
from ..core.layout import Coord
from ..durability.journal import RECORDS, Journal
from ..durability.shardrecord import Record
from ..engine.fetch import read_index
from ..engine.report import WriteReport
from ..engine.tasks import shard_task
from ..storage.store import ShardStore
from .plan import ArrayPlan, SourceChunks

if TYPE_CHECKING:
    from ..write.options import WriteOptions

WINDOW = 16  # source chunks read ahead by one copy task (bounded memory, overlapped latency)


# -- reading source chunks ------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkReader:
    """Reads a source array's encoded chunks in order; travels to the workers."""

    store: ShardStore
    source: SourceChunks
    # the source shard indexes last read, shared by the tasks of this reader (a copy into plain
    # chunks reads each source shard's chunks in tasks of one chunk): a few, cleared when full
    indexes: dict[str, ShardIndex | None] = field(default_factory=dict, compare=False, repr=False)

    def read(self, chunks: Sequence[Coord]) -> Iterator[bytes | None]:
        """The encoded bytes of each of ``chunks`` (None: missing), ``WINDOW`` at a time."""
        if self.source.shard_codec is None and self.store.local_root is not None:
            # local files: plain reads in the task's thread (threads would only contend)
            yield from map(self.store.get, map(self.source.key, chunks))
            return
        indexes = self.indexes
        with ThreadPoolExecutor(4) as pool:
            for i in range(0, len(chunks), WINDOW):
                window = chunks[i : i + WINDOW]
                if self.source.shard_codec is None:
                    keys = [self.source.key(c) for c in window]
                    yield from pool.map(self.store.get, keys)
                else:
                    yield from self._from_shards(window, indexes)

    def _from_shards(
        self, chunks: Sequence[Coord], indexes: dict[str, ShardIndex | None]
    ) -> Iterator[bytes | None]:
        codec = self.source.shard_codec
        assert codec is not None
        wanted: dict[str, list[int]] = {}
        where = []
        for c in chunks:
            key, flat = self.source.locate(c)
            wanted.setdefault(key, []).append(flat)
            where.append((key, flat))
        got: dict[tuple[str, int], bytes] = {}
        for key, flats in wanted.items():
            try:
                index = indexes[key]
            except KeyError:
                if len(indexes) >= WINDOW:  # the source shards of the last window or so
                    indexes.clear()
                index = indexes[key] = self.shard_index(key)
            if index is None:
                continue
            present = [f for f in flats if not index.is_empty(f)]
            ranges = [(int(o), int(n)) for o, n in index.ranges(present).tolist()]
            for f, b in zip(present, self.store.get_ranges(key, ranges), strict=True):
                got[key, f] = b
        for w in where:
            yield got.get(w)

    def copier(
        self, info: ArrayInfo, store: ShardStore, journal: Journal
    ) -> Callable[[Coord], WriteReport]:
        """The copy task of the write pipeline (``strategy="copy"``): one call per shard."""
        return ShardCopier(info, store, self, journal).task

    def shard_index(self, key: str) -> ShardIndex | None:
        codec = self.source.shard_codec
        assert codec is not None
        found = read_index(self.store, codec, key)
        return None if found is None else found[0]


# -- the copy task --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardCopier:
    """One task per target shard: stream the source's encoded chunks into it, commit once."""

    info: ArrayInfo
    store: ShardStore
    reader: ChunkReader
    journal: Journal | None = None

    def chunk_list(self, shard: Coord) -> tuple[list[int], list[Coord]]:
        """Flat positions in the target shard and array chunk coordinates of its chunks that
        hold array elements, in C order (the order they are stored in)."""
        lay, grid = self.info.layout, self.info.shard_codec(shard).grid
        used = lay.chunks_in_array(shard)
        first = [o // c for o, c in zip(lay.shard_origin(shard), lay.chunk_shape, strict=True)]
        flats, coords = [], []
        for p in itertools.product(*(range(u) for u in used)):
            flats.append(int(np.ravel_multi_index(p, grid)) if grid else 0)
            coords.append(tuple(f + i for f, i in zip(first, p, strict=True)))
        return flats, coords

    def task(self, shard: Coord) -> WriteReport:
        """The shard task: :meth:`copy`, counted as a running task of its write, into a fork
        of its own in an icechunk session (:func:`~shardwise.engine.tasks.shard_task`)."""
        write_id = None if self.journal is None else self.journal.write_id
        # into an icechunk session: a fork of its own (engine/tasks.py)
        return shard_task(self, write_id).run(lambda copier: copier.copy(shard))

    def copy(self, shard: Coord) -> WriteReport:
        from ..engine.stream import commit_shard

        started = time.perf_counter()
        lay, codec = self.info.layout, self.info.shard_codec(shard)
        key = lay.shard_key(shard)
        flats, coords = self.chunk_list(shard)
        rep = WriteReport(
            raw_bytes=int(np.prod([s.stop - s.start for s in lay.shard_region(shard)]))
            * self.info.dtype.itemsize
        )
        got = zip(flats, self.reader.read(coords), strict=True)
        first = next(((f, b) for f, b in got if b is not None), None)
        if first is None:  # every source chunk is missing: the shard stays empty
            rep.shards_empty, rep.chunks_empty = 1, len(flats)
            if self.store.size(key) is not None:
                self.store.delete(key)
                rep.shards_deleted = 1
            if self.journal is not None:
                self.journal.record(key, None)
            rep.seconds = time.perf_counter() - started
            return rep
        entries = np.full((codec.nchunks, 2), MISSING, dtype=np.uint64)
        start = codec.index_nbytes if codec.index_location == "start" else 0
        assert start == 0, "copied shards keep their index at the end"
        tail: list[bytes] = []

        def feed(sink: Callable[[Any], Any]) -> int:
            import crc32c as _crc32c

            crc, pos = 0, 0
            for flat, b in itertools.chain([first], got):
                if b is None:
                    continue
                entries[flat] = (pos, len(b))
                pos += len(b)
                crc = _crc32c.crc32c(b, crc)
                sink(b)
            tail.append(ShardIndex(entries).to_bytes(codec))
            sink(tail[0])
            return int(_crc32c.crc32c(tail[0], crc))

        crc = commit_shard(self.store, key, feed)
        index = ShardIndex(entries)
        total = index.nbytes_total + len(tail[0])
        if self.journal is not None:
            rec = Record(self.journal.write_id, total, crc, crc32c(tail[0]))
            self.store.put(RECORDS + key, rec.to_bytes())
        stored = int(index.stored.sum())
        rep.shards_written, rep.bytes_stored = 1, total
        rep.keys = ShardKeys.of_shard(lay, shard)
        rep.chunks_stored, rep.chunks_empty = stored, len(flats) - stored
        rep.seconds = time.perf_counter() - started
        return rep

    def compare(self, shard: Coord) -> list[str]:
        """Inner chunks of ``shard`` whose stored bytes differ from the source's encoded chunk
        (byte equality of copied chunks: a sound check that decodes nothing)."""
        lay, codec = self.info.layout, self.info.shard_codec(shard)
        key = lay.shard_key(shard)
        flats, coords = self.chunk_list(shard)
        target = ChunkReader(self.store, SourceChunks(codec.chunk_shape, "", "", codec))
        found = target.shard_index(key) if self.store.size(key) is not None else None
        bad = []
        for flat, coord, src in zip(flats, coords, self.reader.read(coords), strict=True):
            if found is None or found.is_empty(flat):
                dst = None
            else:
                o, n = (int(x) for x in found.entries[flat])
                dst = self.store.get_ranges(key, [(o, n)])[0]
            if src != dst:
                bad.append(f"{key} inner chunk {coord}: copied bytes differ from the source")
        return bad


def copy_array(plan: ArrayPlan, zsrc: Any, zdst: Any, how: WriteOptions) -> WriteReport:
    """The copy path: a ``copy`` write through the write pipeline (lease, marker, records,
    running tasks stopped on failure: resumable). What is at the destination and what the write
    does about it is the write policy's (write/intent.py), as for write_array."""
    import zarr

    from ..core.layout import normalize_region
    from ..core.plan import ShardPlan
    from ..storage.nodes import open_info
    from ..write.execute import Target, WriteCall, execute
    from ..write.intent import Mode, array_write, create_metadata, resolve

    # into an icechunk session's store: its shard tasks write into forks, merged back here
    target, _ = Target.open(zdst, None, how)
    probe = zarr.create_array(zarr.storage.MemoryStore(), **plan.create)
    # unsharded: shards of one chunk each, whose object is the chunk (conversion/unshard.py)
    info = open_info(probe.store) if plan.sharded else unsharded_info(probe.metadata)
    assert info is not None
    dpath = plan.dst_path or None
    mode: Mode = "w" if how.mode == "w" else "w-"
    intent = resolve(zdst, dpath, mode, how.resume, lambda: probe)
    lay = info.layout
    region = normalize_region(tuple(slice(None) for _ in lay.shape), lay.shape)
    write = array_write(
        ShardStore(zdst, plan.dst_path, fsync=how.fsync),
        info,
        intent,
        ChunkReader(ShardStore(zsrc, plan.src_path), plan.source),
        plan=ShardPlan(lay, region),
        strategy="copy",
        create=lambda: create_metadata(zdst, dpath, plan.create, probe),
        resume=how.resume,
    )
    # convert re-consolidates once, after every array (convert.py)
    call = WriteCall(
        [write],
        lease=bool(how.lease),
        break_lease=how.break_lease,
        progress=how.progress,
        desc=f"copy {plan.dst_path or '/'}",
        nodes=(),
    )
    report: WriteReport = execute(target, call)
    return report
