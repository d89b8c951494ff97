"""Write numpy or dask arrays into sharded Zarr v3 arrays: one task per shard, one put per shard.

The source is rechunked (public dask API) so that its chunks are exactly the pieces of the write
region cut at shard boundaries; ``map_blocks`` then runs one task per piece (a source whose chunk
edges fall on inner-chunk edges is not rechunked: each task takes the blocks overlapping its
shard, see :mod:`.pieces`). Each task encodes its
shard (merging with the stored shard when it covers it only in part), stores it with one atomic
put, and returns a small receipt. Metadata is written once, on the client, before the graph runs.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..codec.frames import borrowed as borrowed_frames
from ..codec.metadata import ArrayInfo
from ..codec.mosaic import Mosaic, fits
from ..codec.shard import EncodedShard, ShardCodec, empty_shard, encode_shard, merge_shard
from ..codec.splice import Splice
from ..codec.supersede import superseding
from ..core.keys import ShardKeys
from ..core.layout import Layout
from ..core.plan import ShardPlan
from ..runtime.units import SMALL_CHUNK
from ..storage.conditional import UNCHECKED, read_merge_commit
from ..storage.meter import metered
from ..storage.replace import replace_whole
from ..storage.store import ShardStore
from .pieces import PieceSpec, pieces_graph
from .recorder import ShardRecorder
from .report import WriteReport
from .splice import splice_merge
from .tasks import shard_task

Mode = Literal["w", "w-", "a", "r+"]


@dataclass(frozen=True)
class WriteSettings:
    """What travels to the workers with every shard task (configuration only, a few bytes
    pickled): whether inner chunks equal to the fill value are stored, the threads that
    encode them, and whether a shard replaced keeps the stored one's chunk bytes in place
    (``supersede``: readers may be part-way through reading it, see codec/supersede.py).
    ``fsync`` travels in the task's ``ShardStore``; what the call decided on the
    client (mode, lease, resume, ...) is :class:`~shardwise.write.options.WriteOptions`."""

    write_empty_chunks: bool = False
    threads: int | None = None
    supersede: bool = False


@dataclass(frozen=True)
class ShardWriter:
    """Everything a shard task needs; travels to the workers (configuration only)."""

    info: ArrayInfo
    store: ShardStore
    plan: ShardPlan
    options: WriteSettings
    # records each stored shard (and forgets emptied ones) for verify and resume
    journal: ShardRecorder | None = None
    # other writers may merge into this array's shards meanwhile (region writes, appends)
    shared: bool = False

    @property
    def layout(self) -> Layout:
        return self.info.layout

    def write_piece(self, shard: Sequence[int], block: np.ndarray | Mosaic) -> WriteReport:
        """Write ``block`` into ``shard``: the whole body of one shard task.

        A shard the write covers whole is encoded and put as it is (in a shared write, through
        the conditional commit others merge by: storage/replace.py). A shard covered in part
        may be shared with other writers: it is read, merged and committed only if unchanged
        since the read (:func:`~shardwise.storage.conditional.read_merge_commit`).
        """
        lay, codec = self.layout, self.info.shard_codec(shard)
        key = lay.shard_key(shard)
        region = lay.shard_region(shard)
        valid = tuple(s.stop - s.start for s in region)
        opts = self.options
        covers = self.plan.covers(shard, region)
        if isinstance(block, Mosaic):
            # encoded piece by piece; a merge works on the joined block
            block = block if covers and fits(codec.chunk_shape, block.origins) else block.join()
        else:
            block = np.asarray(block)
        rep = WriteReport(raw_bytes=block.nbytes)
        if covers:
            # the compressed chunks live in a borrowed arena until the shard is stored and
            # recorded (no fresh pages per shard); nothing keeps them past this block
            with borrowed_frames(block.nbytes) as frames:
                enc = encode_shard(
                    codec,
                    block,
                    write_empty_chunks=opts.write_empty_chunks,
                    threads=opts.threads,
                    frames=frames,
                    views=True,  # stored below, while the block is still here
                )
                stored, exists, generation = self._put_whole(key, enc, rep)
                if self.journal is not None:
                    self.journal.record(key, stored, generation)
                put = None if stored is None else sum(memoryview(p).nbytes for p in stored)
            deleted = exists and stored is None
        else:
            assert isinstance(block, np.ndarray)
            piece = (self.plan.piece_in_shard(shard), block)
            merged, deleted = self._merge(key, valid, [piece], rep, codec)
            return self._counted(shard, valid, merged, deleted, rep)
        rep = self._counted(shard, valid, enc, deleted, rep)
        if put is not None:  # the object put: a superseding shard keeps the stored chunks too
            rep.bytes_stored = put
        return rep

    def write_updates(
        self, shard: Sequence[int], updates: Sequence[tuple[tuple[slice, ...], np.ndarray]]
    ) -> WriteReport:
        """Merge ``updates`` (pieces relative to the shard's origin and their values, applied
        in order) into ``shard``: one read, one conditional commit, one record, however many
        updates; untouched inner chunks keep their encoded bytes."""
        lay = self.layout
        key, valid = lay.shard_key(shard), tuple(s.stop - s.start for s in lay.shard_region(shard))
        rep = WriteReport(raw_bytes=sum(v.nbytes for _, v in updates))
        enc, deleted = self._merge(key, valid, updates, rep, self.info.shard_codec(shard))
        return self._counted(shard, valid, enc, deleted, rep)

    def _merge(
        self,
        key: str,
        valid: tuple[int, ...],
        updates: Sequence[tuple[tuple[slice, ...], np.ndarray]],
        rep: WriteReport,
        codec: ShardCodec,
    ) -> tuple[EncodedShard | Splice | None, bool]:
        """The stored shard read, ``updates`` merged in order and committed only if it is
        unchanged since the read (:func:`~shardwise.storage.conditional.read_merge_commit`);
        recorded. Returns the shard stored (None: all fill) and whether one was deleted.

        Where the store copies byte ranges itself (local files, S3), only the index and the
        chunks merged are read and only the changed chunks and the index written
        (:func:`.splice.splice_merge`); ``rep.merges`` says which way the shard went."""
        opts = self.options
        spliced = splice_merge(
            self.store, key, codec, valid, updates,
            write_empty_chunks=opts.write_empty_chunks, threads=opts.threads,
        )  # fmt: skip
        if spliced is not None:
            rep.conflicts_retried, rep.merges = spliced.conflicts, [spliced.kind]
            if self.journal is not None:
                # no whole-object checksum without reading the copied ranges: a record of the
                # ranges written (durability/shardrecord.py)
                self.journal.record_spliced(key, spliced.shard.segments, spliced.generation)
            return spliced.shard, False
        rep.merges = ["whole"]

        def merge(old: bytes | None) -> tuple[EncodedShard | None, list[Any] | None]:
            enc: EncodedShard | None = None
            for n, (piece, block) in enumerate(updates):
                if n:  # the previous update's shard, joined (None: all fill so far)
                    old = None if enc is None else enc.data
                enc = merge_shard(
                    codec,
                    old,
                    block,
                    piece,
                    valid,
                    self.store.key(key),
                    write_empty_chunks=opts.write_empty_chunks,
                    threads=opts.threads,
                )
            return enc, None if enc is None else _parts(enc)

        done = read_merge_commit(self.store, key, merge, empty=empty_shard(codec))
        rep.conflicts_retried = done.conflicts
        if self.journal is not None:
            self.journal.record(key, done.stored, done.generation)
        return done.result, done.existed and done.stored is None

    def _counted(
        self,
        shard: Sequence[int],
        valid: tuple[int, ...],
        enc: EncodedShard | Splice | None,
        deleted: bool,
        rep: WriteReport,
    ) -> WriteReport:
        """``rep`` with the shard stored (``enc``; None: all fill, ``deleted`` if it was
        there)."""
        codec = self.info.codec
        if enc is None:
            rep.shards_empty = 1
            # inner chunks inside the array only, as encode_shard/merge_shard count them
            used = [-(-v // c) for v, c in zip(valid, codec.chunk_shape, strict=True)]
            rep.chunks_empty = math.prod(used)
            rep.shards_deleted = int(deleted)
            return rep
        rep.shards_written = 1
        rep.bytes_stored = enc.nbytes
        rep.stored_raw_bytes = math.prod(valid) * self.info.dtype.itemsize
        rep.chunks_stored = enc.chunks_stored
        rep.chunks_empty = enc.chunks_empty
        rep.keys = ShardKeys.of_shard(self.info.layout, shard)  # the coordinate, not re-parsed
        return rep

    def _put_whole(
        self, key: str, enc: EncodedShard | None, rep: WriteReport
    ) -> tuple[Sequence[Any] | None, bool, Any]:
        """Store (or delete, when empty) a shard the write covers whole; returns what was
        stored, whether a shard existed before, and the commit's generation."""
        stored: Sequence[Any] | None = None if enc is None else _parts(enc)
        if self.shared:  # others may be merging into it: through their check (replace.py)
            whole = replace_whole(self.store, key, stored)
            rep.conflicts_retried = whole.conflicts
            return whole.stored, whole.existed, whole.generation
        if stored is not None:
            if self.options.supersede:
                old = self.store.get(key)
                stored = superseding(self.info.codec, old, stored, self.store.key(key))
            self.store.put(key, stored)
            return stored, False, UNCHECKED
        if self.store.size(key) is not None:
            self.store.delete(key)
            return None, True, UNCHECKED
        return None, False, UNCHECKED

    def task(self, block: np.ndarray, block_info: Mapping[Any, Any] | None = None) -> np.ndarray:
        """The ``map_blocks`` function: one call per shard piece, returns a receipt."""
        assert block_info is not None
        return self._receipt(block_info[0]["chunk-location"], block)

    def pieces_task(self, spec: PieceSpec, blocks: Sequence[np.ndarray]) -> np.ndarray:
        """The task of :func:`.pieces.pieces_graph`: the shard piece from the source ``blocks``
        that overlap it, encoded without joining them; returns a receipt."""
        views = tuple(b[s] for b, s in zip(blocks, spec.slices, strict=True))
        return self._receipt(spec.loc, Mosaic(spec.shape, spec.origins, views))

    def _receipt(self, loc: Sequence[int], block: np.ndarray | Mosaic) -> np.ndarray:
        out = np.empty((1,) * block.ndim, dtype=object)
        out.flat[0] = self.run_task(loc, block)
        return out

    def run_task(self, loc: Sequence[int], block: np.ndarray | Mosaic) -> WriteReport:
        """The shard task at ``loc`` of the task grid with its piece ``block``, on a dask
        worker or this process's threads (``inprocess.py``): its report."""
        return self.run_shards([(loc, lambda: block)])

    def run_shards(
        self, pieces: Iterable[tuple[Sequence[int], Callable[[], np.ndarray | Mosaic]]]
    ) -> WriteReport:
        """One task writing shards one after another: each ``(loc, read)`` of ``pieces`` is the
        task grid's location and a function giving its piece (read only when its turn comes,
        so the task holds one shard's piece at a time). Each shard counts as a running task of
        its write (:func:`~shardwise.runtime.pool.running`): a write stopped meanwhile starts no
        further shard of it, the shards written before stay written and recorded."""
        started = time.perf_counter()
        # into an icechunk session: the task writes into a fork of its own, handed back
        task = shard_task(self, None if self.journal is None else self.journal.write_id)
        total = WriteReport()
        with metered() as io:
            for loc, read in pieces:
                with task.running():
                    total += task.owner.write_piece(self.plan.shard_of_task(loc), read())
        total.add_io(io)
        task.done(total)
        total.seconds = time.perf_counter() - started
        return total


def _parts(enc: EncodedShard) -> list[Any]:
    # many small parts are joined first (one memcpy beats a system call and a checksum call
    # per part); large parts go out as they are (no extra pass over the shard's memory)
    return [enc.data] if enc.nbytes < len(enc.parts) * SMALL_CHUNK else enc.parts


class _Uncopied:
    """An array given to ``dask.array.from_array`` without the whole copy dask makes of anything
    with a ``copy`` method (a second array in memory and a pass over it before any task runs);
    its blocks are views of the array."""

    def __init__(self, array: Any) -> None:
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self.ndim = len(array.shape)

    def __getitem__(self, key: Any) -> Any:
        return self.array[key]


def as_dask(source: Any, chunks: Any, *, copy: bool) -> Any:
    """``source`` as a dask array of ``chunks``. Arrays that are not dask's are read in place
    unless ``copy`` (a write computed later, e.g. ``compute=False``, must not see changes made
    to the array in between); their graph is named, not tokenized, because dask would hash every
    byte of the array for a name a graph run once does not need."""
    import dask.array as da

    if isinstance(source, da.Array):
        return source if source.chunks == chunks else source.rechunk(chunks)
    name = f"shardwise-source-{uuid.uuid4().hex}"
    if copy:
        return da.from_array(source, chunks=chunks, asarray=True, name=name)
    meta = np.empty((0,) * len(source.shape), dtype=source.dtype)
    return da.from_array(_Uncopied(source), chunks=chunks, asarray=True, name=name, meta=meta)


def build_graph(writer: ShardWriter, source: Any, *, copy: bool = True) -> Any:
    """The dask array of receipts (one element per shard task) for ``source`` (``copy``: see
    :func:`as_dask`)."""
    import dask.array as da

    plan = writer.plan
    if plan.ntasks == 0:
        # a zero-length dimension: no shard to write (and no shard-aligned chunking of it)
        return da.empty((0,) * len(plan.task_chunks), dtype=object, chunks=1)
    if (
        isinstance(source, da.Array)
        and source.chunks != plan.task_chunks
        and plan.on_inner_edges(source.chunks)
    ):
        # misaligned dask chunks on inner-chunk edges: no join of the pieces (pieces.py)
        return pieces_graph(writer.pieces_task, plan, source)
    source = as_dask(source, plan.task_chunks, copy=copy)
    return source.map_blocks(
        writer.task,
        dtype=object,
        chunks=tuple((1,) * len(c) for c in plan.task_chunks),
        meta=np.empty((0,) * source.ndim, dtype=object),
        # unique per call: two writes computed in one graph must not share task keys
        name=f"shardwise-write-{uuid.uuid4().hex}",
    )


def lazy_call(func: Callable[..., Any], arg: Any, dep: Any) -> Any:
    """A Delayed of ``func(arg)`` (``arg``: a key of ``dep``'s graph or a list of them; ``dep``
    a dask collection or a list of them), built as one more layer over their graphs:
    ``dask.delayed(func)(...)`` would materialise every task of them (seconds for tens of
    thousands of blocks)."""
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    name = f"shardwise-{getattr(func, '__name__', 'call')}-{uuid.uuid4().hex}"
    deps = list(dep) if isinstance(dep, list | tuple) else [dep]
    graph = HighLevelGraph.from_collections(name, {name: (func, arg)}, dependencies=deps)
    return Delayed(name, graph)
