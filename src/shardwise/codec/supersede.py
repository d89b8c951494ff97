"""A shard that replaces one readers may be reading, laid out so that a read spanning the
replacement still decodes: the stored shard's chunk bytes stay where they were.

A reader that reads part of a shard in separate requests (its index, then the chunks it
needs: zarr-python does, for a selection that does not take the whole shard) can get the
index of the stored version and the chunk bytes of the one that replaced it. A shard written
by :func:`superseding` begins with the stored shard's data region, byte for byte at the same
offsets, so the old index still points at the old chunks; the new shard's chunks that are
stored identically keep their old place, the others follow, then the new index. A stream's
shard-row that ``flush`` showed is written so when it seals (``write/streams.py``); the
superseded chunks stay in the shard as bytes no index points at (at most the changed chunks
of each earlier version).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .index import ShardFormat, ShardIndex


def superseding(codec: ShardFormat, old: bytes | None, parts: Sequence[Any], key: str) -> list[Any]:
    """The parts of the shard ``parts`` (an encoded shard) laid out to replace ``old`` (the
    stored shard, None when there is none): ``old``'s data region first, unchanged, then the
    chunks of ``parts`` that ``old`` does not store identically, with an index pointing at
    each chunk's bytes (an unchanged chunk at its old place).

    >>> from shardwise.codec.chunks import ChunkCodec
    >>> from shardwise.codec.shard import ShardCodec, encode_shard
    >>> codec = ShardCodec((4,), ChunkCodec((2,), np.dtype("<u2"), 0))
    >>> def shard(*values):
    ...     return encode_shard(codec, np.array(values, "u2")).parts
    >>> old = b"".join(shard(1, 2, 3))  # chunks [1 2] and [3 fill]
    >>> new = b"".join(superseding(codec, old, shard(1, 2, 3, 4), ""))
    >>> new[:8] == old[:8], len(new) - len(old)  # [1 2] and [3 fill] in place, [3 4] after
    (True, 4)
    """
    if old is None or codec.plain:
        return list(parts)
    new = memoryview(b"".join(parts))
    was = ShardIndex.of_shard(codec, old, key)
    now = ShardIndex.of_shard(codec, new, key)
    before = memoryview(old)
    n = codec.index_nbytes
    start = n if codec.index_location == "start" else 0
    data = before[start : len(before) - n + start]  # the stored data region, kept as it is
    end = start + len(data)  # where the chunks that follow it begin
    entries = now.entries.copy()
    follow: list[Any] = []
    for i in np.flatnonzero(now.stored):
        at, size = int(now.offsets[i]), int(now.lengths[i])
        chunk = new[at : at + size]
        if was.stored[i] and int(was.lengths[i]) == size:
            kept = int(was.offsets[i])
            if before[kept : kept + size] == chunk:
                entries[i, 0] = kept
                continue
        entries[i, 0] = end
        end += size
        follow.append(chunk)
    index = ShardIndex(entries).to_bytes(codec)
    if codec.index_location == "start":
        return [index, data, *follow]
    return [data, *follow, index]
