"""Phase 2 of the staged write: one task per shard streams the shard object from the pieces
the block tasks staged (and, for a shard the region covers in part, from the untouched inner chunks
of the stored shard, copied as encoded bytes) through :mod:`~shardwise.engine.stream`, commits it
once, records it and deletes its pieces. :class:`ShardAssembly` is the part of
:class:`~shardwise.engine.staged.StagedWriter` that runs it."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..codec.codecs import crc32c
from ..codec.metadata import ArrayInfo
from ..codec.shard import ShardIndex
from ..core.keys import ShardKeys
from ..core.layout import Coord, Layout, Region, ceildiv
from ..core.plan import ShardPlan
from ..storage.store import ShardStore
from .fetch import read_index
from .recorder import ShardRecorder
from .report import WriteReport
from .stream import _coalesce, _stream, commit_shard
from .tasks import shard_task


@dataclass(frozen=True)
class Piece:
    """What one block staged for one shard: the piece's name and its chunks in piece order."""

    shard: Coord
    name: str | None  # None: every chunk of the block in this shard was empty
    ids: np.ndarray  # flat C-order positions of the chunks in the shard's chunk grid
    sizes: np.ndarray  # their encoded sizes (the piece is these chunks back to back)
    report: WriteReport


class ShardAssembly:
    """The shard tasks of a staged write (phase 2), over the writer's configuration."""

    info: ArrayInfo
    store: ShardStore
    plan: ShardPlan
    write_id: str
    journal: ShardRecorder | None

    @property
    def layout(self) -> Layout:
        return self.info.layout

    def _old_index(self, key: str, shard: Coord) -> tuple[ShardIndex, int] | None:
        return read_index(self.store, self.info.shard_codec(shard), key)

    # -- phase 2 --------------------------------------------------------------------------------

    def receipt(self, shard: Coord, receipts: Sequence[Any]) -> np.ndarray:
        """The shard task as an element of the receipts array (like the direct path's)."""
        out = np.empty((1,) * len(shard), dtype=object)
        out.flat[0] = self.assemble(shard, receipts)
        return out

    def assemble(self, shard: Coord, receipts: Sequence[Any]) -> WriteReport:
        """The shard task: stream the staged pieces of ``shard`` into its object, commit once;
        counted as a running task of its write (:func:`~shardwise.engine.tasks.shard_task`)."""
        return shard_task(self, self.write_id).run(lambda task: task._assemble(shard, receipts))

    def _assemble(self, shard: Coord, receipts: Sequence[Any]) -> WriteReport:
        started = time.perf_counter()
        lay, codec = self.layout, self.info.shard_codec(shard)
        key = lay.shard_key(shard)
        pieces = [
            p
            for r in receipts
            for p in np.asarray(r, dtype=object).flat[0]
            if p.shard == tuple(shard)
        ]
        rep = WriteReport()
        for p in pieces:
            rep = rep + p.report
        rep.keys = ShardKeys()
        if self._committed(key):
            # a rerun (the worker died after the commit): the shard is this write's already
            self._drop(pieces)
            n = sum(len(p.ids) for p in pieces)
            used = int(np.prod(lay.chunks_in_array(shard)))
            rep.stored_raw_bytes = self._shard_raw_bytes(shard)
            return self._done_before(rep, shard, used, n, started)
        entries, old_size = self._entries(shard, key, pieces)
        used = int(np.prod(lay.chunks_in_array(shard)))
        if not entries:
            return self._write_empty(rep, key, pieces, used, old_size, started)
        missing = [p.name for p in pieces if p.name is not None and self.store.size(p.name) is None]
        if missing:
            raise FileNotFoundError(
                f"staged pieces {missing[:3]} of shard {key!r} are missing: rerun the write with "
                "resume=True"
            )
        entries.sort(key=lambda e: e[0])
        ids = np.fromiter((e[0] for e in entries), dtype=np.int64, count=len(entries))
        sizes = np.fromiter((e[3] for e in entries), dtype=np.uint64, count=len(entries))
        start = codec.index_nbytes if codec.index_location == "start" else 0
        offsets = np.cumsum(sizes) - sizes + np.uint64(start)
        index_bytes = ShardIndex.build(codec.nchunks, ids, offsets, sizes).to_bytes(codec)
        total = int(sizes.sum()) + len(index_bytes)
        ranges = _coalesce([(e[1], e[2], e[3]) for e in entries])
        head = [index_bytes] if codec.index_location == "start" else []
        tail = [] if head else [index_bytes]
        crc = self._commit(key, total, head, ranges, tail)
        if self.journal is not None:
            self.journal.record_object(key, total, crc, crc32c(index_bytes))
        self._drop(pieces)
        rep.shards_written = 1
        rep.bytes_stored = total
        rep.stored_raw_bytes = self._shard_raw_bytes(shard)
        rep.chunks_stored = len(entries)
        rep.chunks_empty = used - len(entries)
        rep.keys = ShardKeys.of_shard(self.layout, shard)
        rep.seconds = time.perf_counter() - started
        return rep

    def _entries(
        self, shard: Coord, key: str, pieces: Sequence[Piece]
    ) -> tuple[list[tuple[int, str, int, int]], int | None]:
        """(flat id, source name, offset, nbytes) of every chunk the new shard holds: those of
        the pieces, then the stored chunks the write does not touch; and the stored shard's
        size (None: no shard stored)."""
        entries: list[tuple[int, str, int, int]] = []
        for p in pieces:
            if p.name is None:
                continue
            offs = np.concatenate([[0], np.cumsum(p.sizes)[:-1]]).astype(np.int64)
            entries += zip(
                p.ids.tolist(),
                itertools.repeat(p.name),
                offs.tolist(),
                p.sizes.tolist(),
                strict=False,
            )
        old_size = None
        if not self.plan.covers(shard):
            old = self._old_index(key, shard)
            if old is not None:
                index, old_size = old
                touched = self._touched(shard)
                keep = np.flatnonzero(index.stored & ~touched)
                entries += zip(
                    keep.tolist(),
                    itertools.repeat(key),
                    index.offsets[keep].astype(np.int64).tolist(),
                    index.lengths[keep].astype(np.int64).tolist(),
                    strict=False,
                )
        else:
            old_size = self.store.size(key)
        return entries, old_size

    def _write_empty(
        self,
        rep: WriteReport,
        key: str,
        pieces: Sequence[Piece],
        used: int,
        old_size: int | None,
        started: float,
    ) -> WriteReport:
        """A shard left with no chunk: the stored one deleted, recorded as empty."""
        rep.shards_empty = 1
        rep.chunks_stored = 0
        rep.chunks_empty = used
        if old_size is not None:
            self.store.delete(key)
            rep.shards_deleted = 1
        if self.journal is not None:
            self.journal.record(key, None)
        self._drop(pieces)
        rep.seconds = time.perf_counter() - started
        return rep

    def _shard_raw_bytes(self, shard: Coord) -> int:
        extent = [s.stop - s.start for s in self.layout.shard_region(shard)]
        return int(np.prod(extent)) * self.info.dtype.itemsize

    def _done_before(
        self, rep: WriteReport, shard: Coord, used: int, n: int, started: float
    ) -> WriteReport:
        rep.shards_written = 1
        rep.bytes_stored = int(self.store.size(self.layout.shard_key(shard)) or 0)
        rep.chunks_stored = n
        rep.chunks_empty = used - n
        rep.keys = ShardKeys.of_shard(self.layout, shard)
        rep.seconds = time.perf_counter() - started
        return rep

    def _committed(self, key: str) -> bool:
        """True when ``key`` holds the object this write recorded for it (one small get when
        it does not: no record of this write)."""
        return self.journal is not None and self.journal.matches(key)

    def _touched(self, shard: Coord) -> np.ndarray:
        """Mask over the shard's chunk grid: chunks the write region touches (rewritten)."""
        lay, codec = self.layout, self.info.shard_codec(shard)
        mask = np.zeros(codec.grid, dtype=bool)
        box = tuple(slice(a, b) for a, b in _chunk_span(lay, shard, self.plan.region))
        mask[box] = True
        return mask.reshape(-1)

    def _drop(self, pieces: Sequence[Piece]) -> None:
        for p in pieces:
            if p.name is not None:
                self.store.delete(p.name)

    def _commit(
        self,
        key: str,
        total: int,
        head: list[bytes],
        ranges: list[tuple[str, int, int]],
        tail: list[bytes],
    ) -> int:
        """Write the shard object atomically from ``head``, ``ranges`` and ``tail``; its crc32c."""

        def feed(sink: Callable[[Any], Any]) -> int:
            return _stream(self.store, head, ranges, tail, sink)

        return commit_shard(self.store, key, feed, total=total)


def _chunk_span(lay: Layout, shard: Coord, region: Region) -> list[tuple[int, int]]:
    out = []
    origin, extent = lay.shard_origin(shard), lay.shard_extent(shard)
    for o, sl, s, c in zip(origin, region, extent, lay.chunk_shape, strict=True):
        lo = max(sl.start - o, 0)
        hi = min(sl.stop - o, s)
        out.append((lo // c, ceildiv(hi, c)) if hi > lo else (0, 0))
    return out
