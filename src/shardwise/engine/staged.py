"""The staged write: encode where the data is, then stream each shard from encoded pieces.

Phase 1, one task per dask block (block edges sit on inner-chunk boundaries, see
:func:`shardwise.core.blocks.inner_aligned`): the inner chunks inside the block are encoded on
the pool and, per shard the block touches, stored as ONE staged piece (the encoded chunks one
after the other) under ``.shardwise/staged/<write id>/<shard key>/<block>``. An inner chunk the
write region covers only in part is merged with the stored chunk by the block that holds that part
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
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..codec.metadata import ArrayInfo
from ..codec.shard import MISSING, encode_shard
from ..core.layout import Coord, Region, ceildiv, intersect
from ..core.plan import ShardPlan
from ..errors import CorruptShardError
from ..runtime import pool as _pool
from ..storage.meter import metered
from ..storage.store import JOURNAL, TEMP, ShardStore
from .recorder import ShardRecorder
from .report import WriteReport
from .staged_assembly import Piece, ShardAssembly
from .write import WriteSettings, as_dask

STAGED = f"{JOURNAL}/staged/"


@dataclass(frozen=True)
class StagedWriter(ShardAssembly):
    """Everything the staged tasks need; travels to the workers (configuration only)."""

    info: ArrayInfo
    store: ShardStore
    plan: ShardPlan
    options: WriteSettings
    blocks: tuple[tuple[int, ...], ...]
    write_id: str
    journal: ShardRecorder | None = None
    skip: frozenset[Coord] = field(default_factory=frozenset)

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
                    with metered() as io:
                        piece = self.stage_shard(shard, loc, block, region)
                    piece.report.add_io(io)
                    pieces.append(piece)
        out = np.empty((1,) * block.ndim, dtype=object)
        out.flat[0] = pieces
        return out

    def stage_shard(
        self, shard: Coord, loc: Sequence[int], block: np.ndarray, region: Region
    ) -> Piece:
        started = time.perf_counter()
        lay, codec = self.layout, self.info.shard_codec(shard)
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
        lay, codec = self.layout, self.info.shard_codec(shard)
        inner, cs = codec.inner, lay.chunk_shape
        buf = np.full([b.stop - b.start for b in box], inner.fill_value, dtype=inner.dtype)
        key = lay.shard_key(shard)
        old = None if self.plan.covers(shard) else self._old_index(key, shard)
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
