"""The staged write: encode where the data is, then stream each shard from encoded pieces.

Phase 1, one task per dask block (block edges sit on inner-chunk boundaries, see
:func:`shardwise.core.job.inner_aligned`): the inner chunks inside the block are encoded on the pool
and, per shard the block touches, stored as ONE staged piece (the encoded chunks one after the
other) under ``.shardwise/staged/<write id>/<shard key>/<block>``. An inner chunk the write
region covers only in part is merged with the stored chunk by the block that holds that part
(the region's edges are the only places this happens). The task returns a small receipt.

Phase 2, one task per shard, depending only on the receipts of the blocks that touch it: the
shard object is streamed from the pieces (and, for a shard the region covers in part, from the
untouched inner chunks of the stored shard, copied as encoded bytes by range reads) through a
fixed buffer: to a temp file renamed into place (local), to one multipart upload completed once
(S3), or joined in memory (other stores). Then the shard's record is written and its pieces
deleted. Encoded bytes travel through the store; only receipts travel between workers.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..codec.codecs import crc32c
from ..codec.metadata import ArrayInfo
from ..codec.shard import MISSING, ShardIndex, encode_shard
from ..core.job import PART_BYTES, STREAM_BUFFER
from ..core.layout import Coord, Layout, Region, ceildiv, intersect
from ..core.plan import ShardPlan
from ..errors import CorruptShardError
from ..runtime import pool as _pool
from ..storage.s3 import multipart_client
from ..storage.store import JOURNAL, PARTIAL_SUFFIX, TEMP, ShardStore
from .fetch import read_index
from .recorder import ShardRecorder
from .report import WriteReport
from .write import WriteSettings, as_dask

STAGED = f"{JOURNAL}/staged/"


@dataclass(frozen=True)
class Piece:
    """What one block staged for one shard: the piece's name and its chunks in piece order."""

    shard: Coord
    name: str | None  # None: every chunk of the block in this shard was empty
    ids: np.ndarray  # flat C-order positions of the chunks in the shard's chunk grid
    sizes: np.ndarray  # their encoded sizes (the piece is these chunks back to back)
    report: WriteReport


@dataclass(frozen=True)
class StagedWriter:
    """Everything the staged tasks need; travels to the workers (configuration only)."""

    info: ArrayInfo
    store: ShardStore
    plan: ShardPlan
    options: WriteSettings
    blocks: tuple[tuple[int, ...], ...]
    write_id: str
    journal: ShardRecorder | None = None
    skip: frozenset[Coord] = field(default_factory=frozenset)

    @property
    def layout(self) -> Layout:
        return self.info.layout

    def block_region(self, loc: Sequence[int]) -> Region:
        """The array region of block ``loc``."""
        out = []
        for i, chunks, sl in zip(loc, self.blocks, self.plan.region, strict=True):
            lo = sl.start + sum(chunks[:i])
            out.append(slice(lo, lo + chunks[i]))
        return tuple(out)

    def piece_name(self, shard: Coord, loc: Sequence[int]) -> str:
        key = self.layout.shard_key(shard)
        return f"{STAGED}{self.write_id}/{key}/b{'.'.join(map(str, loc)) or '0'}"

    # -- phase 1 --------------------------------------------------------------------------------

    def stage(self, block: np.ndarray, block_info: Mapping[Any, Any] | None = None) -> np.ndarray:
        """The ``map_blocks`` function: stage the encoded chunks of one block; returns a receipt."""
        assert block_info is not None
        loc = tuple(block_info[0]["chunk-location"])
        block = np.asarray(block)
        region = self.block_region(loc)
        pieces = []
        with _pool.running(self.write_id):
            for shard in self.layout.shards_touching(region):
                if shard not in self.skip:
                    pieces.append(self.stage_shard(shard, loc, block, region))
        out = np.empty((1,) * block.ndim, dtype=object)
        out.flat[0] = pieces
        return out

    def stage_shard(
        self, shard: Coord, loc: Sequence[int], block: np.ndarray, region: Region
    ) -> Piece:
        started = time.perf_counter()
        lay, codec = self.layout, self.info.codec
        cs = lay.chunk_shape
        shard_box = lay.shard_region(shard)
        part = intersect(region, shard_box)
        assert part is not None
        origin = [s.start for s in shard_box]
        # the inner chunks holding ``part``, in chunk coordinates inside the shard
        lo = [(p.start - o) // c for p, o, c in zip(part, origin, cs, strict=True)]
        hi = [ceildiv(p.stop - o, c) for p, o, c in zip(part, origin, cs, strict=True)]
        box = tuple(
            slice(o + a * c, min(o + b * c, n))
            for o, a, b, c, n in zip(origin, lo, hi, cs, lay.shape, strict=True)
        )
        data = block[
            tuple(
                slice(p.start - r.start, p.stop - r.start)
                for p, r in zip(part, region, strict=True)
            )
        ]
        if box != part:
            data = self._merge_edges(shard, box, part, data, lo, hi)
        sub = replace(
            codec,
            shard_shape=tuple((b - a) * c for a, b, c in zip(lo, hi, cs, strict=True)),
            index_location="end",
            index_endian="little",
            index_crc=False,
        )
        opts = self.options
        enc = encode_shard(
            sub, data, write_empty_chunks=opts.write_empty_chunks, threads=opts.threads
        )
        rep = WriteReport(raw_bytes=int(np.prod([p.stop - p.start for p in part])) * data.itemsize)
        if enc is None:
            rep.chunks_empty = int(np.prod([b - a for a, b in zip(lo, hi, strict=True)]))
            rep.seconds = time.perf_counter() - started
            return Piece(shard, None, np.zeros(0, np.int64), np.zeros(0, np.int64), rep)
        index = np.frombuffer(enc.parts[-1], dtype="<u8").reshape(-1, 2)
        present = np.flatnonzero(index[:, 0] != MISSING)
        coords = np.unravel_index(present, sub.grid)
        ids = np.ravel_multi_index(
            tuple(c + a for c, a in zip(coords, lo, strict=True)), codec.grid
        ).astype(np.int64)
        sizes = index[present, 1].astype(np.int64)
        name = self.piece_name(shard, loc)
        # pieces need no fsync: a resume redoes them all, only the shard objects must last
        replace(self.store, fsync=False).put(name, enc.parts[:-1])
        rep.chunks_stored = enc.chunks_stored
        rep.chunks_empty = enc.chunks_empty
        rep.seconds = time.perf_counter() - started
        return Piece(shard, name, ids, sizes, rep)

    def _merge_edges(
        self,
        shard: Coord,
        box: Region,
        part: Region,
        data: np.ndarray,
        lo: Sequence[int],
        hi: Sequence[int],
    ) -> np.ndarray:
        """``data`` (the array's ``part``) grown to whole chunks ``box``, outside ``part`` the
        stored chunks' values (the region's edge cuts these chunks)."""
        lay, codec = self.layout, self.info.codec
        inner, cs = codec.inner, lay.chunk_shape
        buf = np.full([b.stop - b.start for b in box], inner.fill_value, dtype=inner.dtype)
        key = lay.shard_key(shard)
        old = None if self.plan.covers(shard) else self._old_index(key)
        if old is not None:
            index, _ = old
            origin = [s.start for s in lay.shard_region(shard)]
            wanted, where = [], []
            for chunk in itertools.product(*(range(a, b) for a, b in zip(lo, hi, strict=True))):
                c_lo = [o + i * c for o, i, c in zip(origin, chunk, cs, strict=True)]
                c_box = tuple(
                    slice(a, min(a + c, n)) for a, c, n in zip(c_lo, cs, lay.shape, strict=True)
                )
                covered = intersect(c_box, part)
                if covered == c_box:
                    continue
                flat = int(np.ravel_multi_index(chunk, codec.grid)) if chunk else 0
                o, n = index.entries[flat]
                if o == MISSING:
                    continue
                wanted.append((int(o), int(n)))
                where.append((chunk, c_box))
            raws = self.store.get_ranges(key, wanted) if wanted else []
            for raw, (chunk, c_box) in zip(raws, where, strict=True):
                try:
                    stored = inner.decode(raw)
                except (ValueError, CorruptShardError) as e:
                    raise CorruptShardError(key, f"cannot decode: {e}", chunk=chunk) from None
                values = inner.unstack(stored[None], (1,) * len(cs))
                dst = tuple(
                    slice(c.start - b.start, c.stop - b.start)
                    for c, b in zip(c_box, box, strict=True)
                )
                buf[dst] = values[tuple(slice(0, c.stop - c.start) for c in c_box)]
        buf[
            tuple(
                slice(p.start - b.start, p.stop - b.start) for p, b in zip(part, box, strict=True)
            )
        ] = data
        return buf

    def _old_index(self, key: str) -> tuple[ShardIndex, int] | None:
        return read_index(self.store, self.info.codec, key)

    # -- phase 2 --------------------------------------------------------------------------------

    def receipt(self, shard: Coord, receipts: Sequence[Any]) -> np.ndarray:
        """The shard task as an element of the receipts array (like the direct path's)."""
        out = np.empty((1,) * len(shard), dtype=object)
        out.flat[0] = self.assemble(shard, receipts)
        return out

    def assemble(self, shard: Coord, receipts: Sequence[Any]) -> WriteReport:
        """The shard task: stream the staged pieces of ``shard`` into its object, commit once."""
        with _pool.running(self.write_id):
            return self._assemble(shard, receipts)

    def _assemble(self, shard: Coord, receipts: Sequence[Any]) -> WriteReport:
        started = time.perf_counter()
        lay, codec = self.layout, self.info.codec
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
        rep.keys = []
        if self._committed(key):
            # a rerun (the worker died after the commit): the shard is this write's already
            self._drop(pieces)
            n = sum(len(p.ids) for p in pieces)
            used = int(np.prod(lay.chunks_in_array(shard)))
            rep.stored_raw_bytes = self._shard_raw_bytes(shard)
            return self._done_before(rep, key, used, n, started)
        # (flat id, source name, offset, nbytes) of every chunk the new shard holds
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
            old = self._old_index(key)
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
        used = int(np.prod(lay.chunks_in_array(shard)))
        if not entries:
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
        rep.keys = [key]
        rep.seconds = time.perf_counter() - started
        return rep

    def _shard_raw_bytes(self, shard: Coord) -> int:
        extent = [s.stop - s.start for s in self.layout.shard_region(shard)]
        return int(np.prod(extent)) * self.info.dtype.itemsize

    def _done_before(
        self, rep: WriteReport, key: str, used: int, n: int, started: float
    ) -> WriteReport:
        rep.shards_written = 1
        rep.bytes_stored = int(self.store.size(key) or 0)
        rep.chunks_stored = n
        rep.chunks_empty = used - n
        rep.keys = [key]
        rep.seconds = time.perf_counter() - started
        return rep

    def _committed(self, key: str) -> bool:
        """True when ``key`` holds the object this write recorded for it (one small get when
        it does not: no record of this write)."""
        return self.journal is not None and self.journal.matches(key)

    def _touched(self, shard: Coord) -> np.ndarray:
        """Mask over the shard's chunk grid: chunks the write region touches (rewritten)."""
        lay, codec = self.layout, self.info.codec
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


Feed = Callable[[Callable[[Any], Any]], int]
"""Gives an object's bytes, in order, to the sink it is called with; returns their crc32c."""


def commit_shard(store: ShardStore, key: str, feed: Feed, *, total: int | None = None) -> int:
    """Store the object ``feed`` produces under ``key`` in one atomic commit; its crc32c.

    Local files: a temp file renamed into place. S3: one multipart upload completed once, when
    the object is larger than one part or its size (``total``) is not known ahead. Elsewhere:
    joined in memory, one put. Memory stays one buffer whatever the object's size.
    """
    if store.local_root is not None:
        return _commit_local(store, key, feed)
    s3 = multipart_client(store) if total is None or total > PART_BYTES else None
    if s3 is not None:
        return _commit_multipart(store, s3, key, feed)
    parts: list[Any] = []
    crc = feed(parts.append)
    store.put(key, parts)
    return crc


def _chunk_span(lay: Layout, shard: Coord, region: Region) -> list[tuple[int, int]]:
    out = []
    for i, sl, s, c in zip(shard, region, lay.shard_shape, lay.chunk_shape, strict=True):
        lo = max(sl.start - i * s, 0)
        hi = min(sl.stop - i * s, s)
        out.append((lo // c, ceildiv(hi, c)) if hi > lo else (0, 0))
    return out


def _coalesce(ranges: Sequence[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Merge ranges that continue each other in the same object."""
    out: list[tuple[str, int, int]] = []
    for name, off, n in ranges:
        if out and out[-1][0] == name and out[-1][1] + out[-1][2] == off:
            out[-1] = (name, out[-1][1], out[-1][2] + n)
        else:
            out.append((name, off, n))
    return out


def _stream(
    store: ShardStore,
    head: Sequence[bytes],
    ranges: Sequence[tuple[str, int, int]],
    tail: Sequence[bytes],
    sink: Callable[[Any], Any],
) -> int:
    """Feed ``head``, the bytes of ``ranges`` (read ``STREAM_BUFFER`` at a time) and ``tail`` to
    ``sink`` in order; returns their crc32c. The sink must copy what it keeps."""
    import crc32c as _crc32c

    crc = 0
    for b in head:
        crc = _crc32c.crc32c(b, crc)
        sink(b)
    local = store.local_root is not None
    fds: dict[str, int] = {}
    batch: list[tuple[str, int, int]] = []
    filled = 0

    def flush() -> None:
        nonlocal crc, filled
        if not batch:
            return
        if local:
            view = _buffer(filled)
            pos = 0
            for name, off, n in batch:
                fd = fds.get(name)
                if fd is None:
                    fd = fds[name] = os.open(store._file(name), os.O_RDONLY)
                got = 0
                while got < n:
                    k = os.preadv(fd, [view[pos + got : pos + n]], off + got)
                    if k == 0:
                        raise OSError(f"{store.key(name)!r} ended before offset {off + n}")
                    got += k
                pos += n
            crc = _crc32c.crc32c(view[:filled], crc)
            sink(view[:filled])
        else:
            by_name: dict[str, list[tuple[int, int]]] = {}
            for name, off, n in batch:
                by_name.setdefault(name, []).append((off, n))
            got_by = {name: iter(store.get_ranges(name, rs)) for name, rs in by_name.items()}
            for name, _, _ in batch:
                b = next(got_by[name])
                crc = _crc32c.crc32c(b, crc)
                sink(b)
        batch.clear()
        filled = 0

    try:
        for name, off, n in ranges:
            while n > 0:
                take = min(n, STREAM_BUFFER - filled)
                batch.append((name, off, take))
                filled += take
                off += take
                n -= take
                if filled == STREAM_BUFFER:
                    flush()
        flush()
    finally:
        for fd in fds.values():
            os.close(fd)
    for b in tail:
        crc = _crc32c.crc32c(b, crc)
        sink(b)
    return int(crc)


_bufs = threading.local()


def _buffer(n: int) -> memoryview:
    """The calling thread's streaming buffer (fixed size, reused)."""
    buf: bytearray | None = getattr(_bufs, "buf", None)
    if buf is None:
        buf = _bufs.buf = bytearray(STREAM_BUFFER)
    return memoryview(buf)[:n]


def _commit_local(store: ShardStore, key: str, feed: Feed) -> int:
    path = store._file(key)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:

            def write(b: Any) -> None:
                view = memoryview(b).cast("B")
                while view:
                    view = view[os.write(fd, view) :]

            crc = feed(write)
            if store.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if store.fsync:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return crc


def _commit_multipart(store: ShardStore, s3: tuple[Any, str, str], key: str, feed: Feed) -> int:
    """One multipart upload for the shard, parts of ``PART_BYTES`` (the last may be shorter),
    completed once; aborted when anything fails, so no part of the shard ever becomes visible."""
    call, bucket, prefix = s3
    full = "/".join(p for p in (prefix, store.key(key)) if p)
    upload = call("create_multipart_upload", Bucket=bucket, Key=full)["UploadId"]
    done: list[dict[str, Any]] = []
    buf = bytearray()

    def send(data: bytes | bytearray) -> None:
        n = len(done) + 1
        got = call(
            "upload_part", Bucket=bucket, Key=full, UploadId=upload, PartNumber=n, Body=bytes(data)
        )
        done.append({"ETag": got["ETag"], "PartNumber": n})

    def sink(b: Any) -> None:
        buf.extend(b)
        if len(buf) >= PART_BYTES:
            send(buf[:PART_BYTES])
            del buf[:PART_BYTES]

    try:
        crc = feed(sink)
        if buf or not done:
            send(buf)
        call(
            "complete_multipart_upload",
            Bucket=bucket,
            Key=full,
            UploadId=upload,
            MultipartUpload={"Parts": done},
        )
    except BaseException:
        try:
            call("abort_multipart_upload", Bucket=bucket, Key=full, UploadId=upload)
        finally:
            raise
    return crc


# -- the graph ------------------------------------------------------------------------------------


def remove_staged(store: ShardStore, write_id: str | None = None) -> int:
    """Delete the staged pieces (of one write, or all); returns how many were removed."""
    prefix = STAGED + (f"{write_id}/" if write_id else "")
    root = store.local_root
    names = store.list(prefix.rstrip("/"))
    if root is not None:
        top = root / store.key(prefix.rstrip("/"))
        if top.is_dir():
            shutil.rmtree(top, ignore_errors=True)
        with contextlib.suppress(OSError):  # the staging directory itself, once empty
            (root / store.key(STAGED.rstrip("/"))).rmdir()
        return len(names)
    for name in names:
        store.delete(name)
    return len(names)


def staged_leftovers(store: ShardStore) -> list[str]:
    """Names of staged pieces still stored (a write that did not finish)."""
    return [n for n in store.list(STAGED.rstrip("/")) if not TEMP.match(n)]


def build_staged(writer: StagedWriter, source: Any, *, copy: bool = True) -> Any:
    """The dask array of receipts (one element per shard task, as the direct path's) for
    ``source``: block tasks, then shard tasks that each depend on the blocks touching them
    (``copy``: see :func:`~shardwise.engine.write.as_dask`)."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    plan, lay = writer.plan, writer.layout
    out_chunks = tuple((1,) * len(c) for c in plan.task_chunks)
    meta = np.empty((0,) * len(plan.task_chunks), dtype=object)
    source = as_dask(source, writer.blocks, copy=copy)
    token = uuid.uuid4().hex
    stage = f"shardwise-stage-{token}"
    # block_id, not block_info: dask builds block_info as one nested dict per block, which
    # costs seconds to materialise for tens of thousands of blocks; block_id is a lazy dependency
    receipts = source.map_blocks(
        _stage_block,
        writer,
        dtype=object,
        chunks=tuple((1,) * len(c) for c in writer.blocks),
        meta=np.empty((0,) * source.ndim, dtype=object),
        name=stage,
    )
    edges = [
        list(itertools.accumulate(c, initial=sl.start))
        for c, sl in zip(writer.blocks, plan.region, strict=True)
    ]
    name = f"shardwise-write-{token}"
    dsk: dict[Any, Any] = {}
    for t in itertools.product(*(range(len(c)) for c in plan.task_chunks)):
        shard = plan.shard_of_task(t)
        ranges = []
        for e, sl in zip(edges, lay.shard_region(shard), strict=True):
            lo = int(np.searchsorted(e, sl.start, side="right")) - 1
            hi = min(int(np.searchsorted(e, sl.stop, side="left")), len(e) - 1)
            ranges.append(range(max(lo, 0), hi))
        deps = [(stage, *i) for i in itertools.product(*ranges)]
        dsk[(name, *t)] = (writer.receipt, shard, deps)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[receipts])
    return da.Array(graph, name, chunks=out_chunks, meta=meta)


def _stage_block(block: np.ndarray, writer: StagedWriter, block_id: Any = None) -> np.ndarray:
    """The block task of :func:`build_staged`: :meth:`StagedWriter.stage` at ``block_id``."""
    return writer.stage(block, {0: {"chunk-location": block_id}})
