"""``convert(shards=None)``: plain (unsharded) Zarr v3 arrays, one object per chunk.

Where a source's encoded chunks already are the target's chunks (the same chunk shape and a
codec chain the target declares equivalently: inner chunks of a sharded array, or chunk objects
of a v2 or v3 one), the copy path of :mod:`shardwise.conversion.copy` runs on the target read as
shards of one chunk each whose object is the chunk itself
(:func:`~shardwise.codec.metadata.unsharded_info`): every chunk's bytes are copied, never
decoded, through the write pipeline (lease, marker, records: ``resume=True`` skips the chunks
already committed). Other arrays are decoded from the source as a dask array and stored in
blocks of whole target chunks of about a source block each (memory: a few blocks per task).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from ..codec.metadata import ArrayInfo, unsharded_info
from ..core.sizing import whole_chunks
from ..engine.report import WriteReport
from ..errors import InvalidValueError
from ..storage.store import ShardStore

if TYPE_CHECKING:
    from ..write.options import WriteOptions
    from .plan import ArrayPlan


def check_unsharded(
    shards: Any, shard_bytes: Any, pyramid: Any, session: Any, resume: bool
) -> bool:
    """Whether ``convert`` writes shards (``shards`` not None); ``shards=None`` with what
    only shards take (``shard_bytes``, ``pyramid``), or into an icechunk session, refused.
    ``shards="auto"`` (the default) is the default shards (None for the planner)."""
    if shards is not None:
        return True
    for given, name in ((shard_bytes, "shard_bytes"), (pyramid, "pyramid")):
        if given not in (None, False):
            raise InvalidValueError(
                f"shards=None writes unsharded arrays, which {name}= does not apply to: pass "
                f"shards (or leave it 'auto') with {name}="
            )
    if session is not None:
        raise InvalidValueError(
            "shards=None writes unsharded arrays, which shardwise writes into stores only: "
            "convert into a store, or keep shards into an icechunk session"
        )
    return False


def target_info(zstore: Any, path: str | None) -> ArrayInfo:
    """The converted array's :class:`ArrayInfo`: sharded, or unsharded as shards of one
    chunk."""
    from ..storage.nodes import open_info, open_zarr_array

    info = unsharded_info(open_zarr_array(zstore, path).metadata)
    return info if info is not None else open_info(zstore, path)


def reencode_unsharded(plan: ArrayPlan, zsrc: Any, zdst: Any, how: WriteOptions) -> WriteReport:
    """The source decoded (as a dask array) and stored as plain chunks, in blocks of whole
    target chunks of about a source block: tasks never share a chunk. Resumed, it writes every
    block again (a plain array keeps no records of its chunks)."""
    import dask.array as da
    import zarr

    started = time.perf_counter()
    from .source import source_array

    source = source_array(plan, zsrc)
    block = tuple(
        min(n, b) if n else 1
        for n, b in zip(
            plan.shape,
            whole_chunks(tuple(max(c) if c else 1 for c in source.chunks), plan.chunks),
            strict=True,
        )
    )
    if source.ndim and source.chunksize != block:
        source = source.rechunk(block)
    overwrite = how.mode == "w" or how.resume
    target = zarr.create_array(zdst, name=plan.dst_path or None, overwrite=overwrite, **plan.create)
    with _threads(how):
        da.store(source, target, lock=False)  # type: ignore[arg-type]
    return _stored(ShardStore(zdst, plan.dst_path), plan, started)


def _threads(how: WriteOptions) -> Any:
    """dask's local threads capped at ``threads=``, as the other writes cap theirs."""
    import contextlib

    import dask

    n = how.settings.threads
    return dask.config.set(num_workers=n) if n else contextlib.nullcontext()


def _stored(store: ShardStore, plan: ArrayPlan, started: float) -> WriteReport:
    """What a plain array holds: its chunk objects and their bytes."""
    from ..core.layout import Layout

    lay = Layout(plan.shape, plan.chunks, plan.chunks)
    keys = [n for n in store.list("") if lay.parse_shard_key(n) is not None]
    rep = WriteReport(raw_bytes=math.prod(plan.shape) * plan.dtype.itemsize)
    rep.shards_written = len(keys)
    rep.bytes_stored = sum(store.size(k) or 0 for k in keys)
    rep.seconds = time.perf_counter() - started
    return rep
