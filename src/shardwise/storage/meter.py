"""What a write moves: the requests and bytes of every object read and written through
shardwise's store layer (:class:`~shardwise.storage.store.ShardStore`), counted per task.

A shard task counts its own I/O (``with metered() as m:`` around it; the write's report adds
the counts up) and the client counts what it does around the tasks (leases, markers, records,
the merges of a resume); a meter counts only what runs in its own thread and context, so a task
run in the client's thread is counted once, by the task. Metadata written by zarr-python itself
(``zarr.json``) does not pass through this layer and is not counted: a few small objects per
array.

>>> with metered() as m:
...     count("get", 100)
...     count("put", 40)
>>> (m.requests, m.bytes_read, m.bytes_written)
(2, 100, 40)
>>> count("get", 1)  # outside a meter: not counted anywhere
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["IOMeter", "count", "count_put", "metered"]


@dataclass
class IOMeter:
    """Requests (gets, ranged gets, sizes, puts, deletes, lists, copies) and the bytes they
    moved; ``bytes_copied``: bytes the store copied from one object into another without them
    passing through the writer (the kernel's ``copy_file_range``, S3's ``UploadPartCopy``)."""

    requests: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_copied: int = 0


_current: contextvars.ContextVar[IOMeter | None] = contextvars.ContextVar(
    "shardwise_io_meter", default=None
)


def count(kind: str, nbytes: int = 0) -> None:
    """One request of ``kind`` moving ``nbytes`` (read for gets, written for puts, copied in
    the store for copies), on the meter of this context, if any."""
    m = _current.get()
    if m is None:
        return
    m.requests += 1
    if kind == "put":
        m.bytes_written += nbytes
    elif kind == "copy":
        m.bytes_copied += nbytes
    else:
        m.bytes_read += nbytes


def count_put(parts: Sequence[Any] | None) -> None:
    """One put of ``parts`` (bytes-like), or a delete when ``parts`` is None."""
    if parts is None:
        count("delete")
    else:
        count("put", sum(memoryview(p).nbytes for p in parts))


@contextmanager
def metered() -> Iterator[IOMeter]:
    """A new meter counting the I/O of this context until the block ends (an outer meter
    counts none of it)."""
    m = IOMeter()
    token = _current.set(m)
    try:
        yield m
    finally:
        _current.reset(token)
