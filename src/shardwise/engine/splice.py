"""A shard merge that moves only what changed: the index and the chunks merged are read, the
changed chunks and the new index are written, the store copies the rest.

:func:`splice_merge` reads the stored shard's index (one range), the inner chunks the updates
cover in part (``codec/splice.py``: :func:`~shardwise.codec.splice.needed`), merges the updates
and commits the new shard as ranges of the old one and new bytes, only if the shard is still
the version read (``storage/splice.py``); another writer's commit meanwhile makes it read and
merge again, as :func:`~shardwise.storage.conditional.read_merge_commit` does. Where the store
cannot copy ranges, or no shard is stored yet, it returns None and the caller merges the whole
shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..codec.index import ShardIndex, index_slice
from ..codec.shard import ShardCodec
from ..codec.splice import Splice, needed, splice_shard, untouched
from ..errors import ShardConflictError
from ..storage import conditional
from ..storage.retry import RetryPolicy
from ..storage.splice import open_source, splice_kind
from ..storage.store import ShardStore

__all__ = ["Spliced", "splice_merge"]

Update = tuple[tuple[slice, ...], np.ndarray]


@dataclass(frozen=True)
class Spliced:
    """The outcome of :func:`splice_merge`."""

    shard: Splice  # the shard stored
    kind: str  # how: "local ranges", "s3 ranges"
    generation: Any  # of the committed shard
    conflicts: int  # rounds lost to another writer's commit


def splice_merge(
    store: ShardStore,
    name: str,
    codec: ShardCodec,
    valid: Sequence[int],
    updates: Sequence[Update],
    *,
    write_empty_chunks: bool = False,
    threads: int | None = None,
) -> Spliced | None:
    """Merge ``updates`` (pieces relative to the shard's origin, applied in order) into the
    stored shard ``name`` by ranges (see the module's docstring); None when this store or this
    shard cannot be merged so (no shard stored, a store without range copies, a 0-d array's
    plain chunk, a merge that leaves every chunk empty, on S3 a shard with no range of a
    part's 5 MiB to copy, or conditional commits switched off: ``conditional.ENABLED``)."""
    if codec.plain or not conditional.ENABLED or splice_kind(store) is None:
        return None  # (ENABLED False: the unchecked control of tests, merged whole unchecked)
    key = store.key(name)
    for attempt in range(conditional.TRIES):
        src = open_source(store, name)
        if src is None:
            return None
        try:
            where = index_slice(codec, src.size)
            short = src.size < codec.index_nbytes  # from_bytes says what is wrong
            (raw,) = [b""] if short else src.read([(where.start, where.stop - where.start)])
            index = ShardIndex.from_bytes(codec, raw, src.size, key)
            if not src.worth_copying(untouched(codec, index, valid, updates)):
                return None  # e.g. every chunk changes: nothing to copy (S3: no 5 MiB range)
            ranges = needed(codec, index, valid, updates)
            stored = dict(zip(ranges, src.read(ranges), strict=True))
            shard = splice_shard(
                codec, index, stored, updates, valid, key,
                write_empty_chunks=write_empty_chunks, threads=threads,
            )  # fmt: skip
            if shard is None or not src.worth(shard.segments):
                return None
            if conditional.before_commit is not None:
                conditional.before_commit(name, attempt)
            new = src.commit(shard.segments)
        finally:
            src.close()
        if new is not conditional.CONFLICT:
            return Spliced(shard, src.kind, new, attempt)
        RetryPolicy(
            backoff=conditional.BACKOFF, backoff_max=conditional.BACKOFF_MAX, jitter=1.0
        ).pause(attempt)
    raise ShardConflictError(key, conditional.TRIES)
