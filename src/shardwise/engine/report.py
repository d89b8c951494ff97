"""WriteReport: what a write did, summed over its shard tasks' receipts."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np

from ..core.cost import counted
from ..core.keys import ShardKeys

# the note of a resume that found its write finished and changed nothing (every front end's)
NOTHING_TO_DO = "nothing to do: the write had finished, every shard done before"


@dataclass
class WriteReport:
    """What a write did. Reports add up (``a + b``).

    ``raw_bytes`` counts the data handed to the write; ``bytes_stored`` the encoded shards put
    and ``stored_raw_bytes`` the raw (decoded) bytes those shards hold: for a region write, a
    shard it covers in part is stored whole, untouched chunks included.
    ``compression_ratio`` compares these last two, so it means the same for every write.

    Attributes
    ----------
    shards_written : int
        Shards stored.
    shards_empty : int
        Shards whose values all equal the fill value: not stored.
    shards_deleted : int
        All-fill shards that were stored before and were removed.
    bytes_stored : int
        Encoded bytes of the shards stored.
    raw_bytes : int
        Bytes of the data handed to the write.
    stored_raw_bytes : int
        Raw (decoded) bytes the stored shards hold.
    chunks_stored : int
        Inner chunks stored.
    chunks_empty : int
        Inner chunks equal to the fill value, not stored.
    shards_skipped : int
        Shards a resumed write found done before (``resume=True``).
    conflicts_retried : int
        Merges of shared shards done again because another writer committed the shard first.
    requests : int
        Requests to the store (gets, ranged gets, sizes, puts, multipart parts, deletes,
        lists) through shardwise's store layer, by the shard tasks and around them (leases,
        markers, records); metadata zarr-python writes itself is not counted.
    bytes_read : int
        Bytes those requests read: for a region write, the stored shards it merges with.
    bytes_written : int
        Bytes those requests wrote: shards, staged pieces, journal records.
    bytes_copied : int
        Bytes the store copied from the shards merged into their new versions without them
        passing through the writer (local files: ``copy_file_range``; S3: ``UploadPartCopy``).
    merges : list of str
        How each shard merge moved its shard: ``"local ranges"`` or ``"s3 ranges"`` (the index
        and the chunks merged read, the changed chunks and the new index written, the rest
        copied by the store), ``"whole"`` (the shard read and written whole: a store that
        cannot copy ranges, or a shard not stored yet).
    seconds : float
        The wall time of the write when :func:`shardwise.write_array` computes it, and the
        summed time of the shard tasks when a ``compute=False`` Delayed is computed.
    keys : ShardKeys
        The store keys of the shards stored, read as a sorted sequence of str; held as spans
        of shard indices (a few per task, whatever the shard count), the strings made when
        read.
    notes : list of str
        What the write found and did besides its shards, e.g. a batch part's lease taken over
        from a writer that was gone.
    forks : list
        A write into an icechunk session: the forks its shard tasks wrote into, on their way
        to the session (merged and emptied before the report is returned).

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> report = shardwise.write_array(np.ones((64, 64), "u1"), zarr.storage.MemoryStore(),
    ...                                chunks=(16, 16), shards=(32, 32))
    >>> report.shards_written, report.chunks_stored, report.raw_bytes
    (4, 16, 4096)
    """

    shards_written: int = 0
    shards_empty: int = 0
    shards_deleted: int = 0
    bytes_stored: int = 0
    raw_bytes: int = 0
    stored_raw_bytes: int = 0
    chunks_stored: int = 0
    chunks_empty: int = 0
    shards_skipped: int = 0
    # merges of shared shards done again because another writer committed the shard first
    conflicts_retried: int = 0
    requests: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_copied: int = field(default=0, repr=False)
    merges: list[str] = field(default_factory=list, repr=False)
    seconds: float = 0.0
    keys: ShardKeys = field(default_factory=ShardKeys, repr=False)
    notes: list[str] = field(default_factory=list)
    forks: list[Any] = field(default_factory=list, repr=False)

    @property
    def nothing_to_do(self) -> bool:
        """A resume (``resume=True``) that found its write finished: it wrote nothing and left
        the store as it was (its notes say so)."""
        return NOTHING_TO_DO in self.notes

    @property
    def amplification(self) -> float:
        """Bytes moved (read and written) per byte of data changed (``raw_bytes``): 1.0 or
        less for a write of whole shards that compress, the shard's size over the region's
        for a small region of a big shard (NaN when no data was written)."""
        moved = self.bytes_read + self.bytes_written
        return moved / self.raw_bytes if self.raw_bytes else math.nan

    def add_io(self, meter: Any) -> None:
        """Add what ``meter`` (a :class:`~shardwise.storage.meter.IOMeter`) counted."""
        self.requests += meter.requests
        self.bytes_read += meter.bytes_read
        self.bytes_written += meter.bytes_written
        self.bytes_copied += meter.bytes_copied

    @property
    def compression_ratio(self) -> float:
        """``stored_raw_bytes / bytes_stored`` (NaN when nothing was stored)."""
        return self.stored_raw_bytes / self.bytes_stored if self.bytes_stored else float("nan")

    def __add__(self, other: WriteReport) -> WriteReport:
        out = WriteReport()
        out += self
        out += other
        return out

    def __iadd__(self, other: WriteReport) -> WriteReport:
        # in place: a sum of N reports extends the key lists once each, not N copies of them
        # (one per shard written: the fields' split is looked up once, not per sum)
        # (through the instances' dicts: a sum per shard written, a million at a time)
        mine, theirs = self.__dict__, other.__dict__
        for name in _EXTENDED:
            if theirs[name]:
                mine[name].extend(theirs[name])
        for name in _ADDED:
            mine[name] += theirs[name]
        return self

    def __str__(self) -> str:
        mb = 1e6
        head = (
            f"{counted(self.shards_written, 'shard')} written, "
            f"{counted(self.shards_empty, 'all-fill shard')} skipped "
            f"({self.shards_deleted} deleted)"
        )
        if self.shards_written == 0:
            # no shard stored: no ratio to give, and no data "written"
            what = "nothing stored"
            if self.shards_empty and self.raw_bytes and not self.shards_skipped:
                what = f"the {self.raw_bytes / mb:.1f} MB of data all equal the fill value: {what}"
            body = f"{head}; {what}"
        else:
            if self.stored_raw_bytes == self.raw_bytes:
                sizes = (
                    f"{self.bytes_stored / mb:.1f} MB stored for {self.raw_bytes / mb:.1f} MB raw"
                )
            else:  # all-fill shards not stored, or shards merged with what a region write left
                sizes = (
                    f"{self.raw_bytes / mb:.1f} MB of data written; the shards written hold "
                    f"{self.stored_raw_bytes / mb:.1f} MB raw, {self.bytes_stored / mb:.1f} MB "
                    "stored"
                )
            body = (
                f"{head}, {counted(self.chunks_stored, 'inner chunk')} stored, "
                f"{self.chunks_empty} all-fill; "
                f"{sizes} (ratio {self.compression_ratio:.2f})"
            )
        moved = (
            f"; moved {self.bytes_read / mb:.1f} MB read, {self.bytes_written / mb:.1f} MB "
            f"written in {self.requests} requests ({self.amplification:.2f}x the data)"
            if self.requests and self.raw_bytes
            else ""
        )
        return (
            f"{body}{moved} in {self.seconds:.2f} s"
            + (f"; {self.shards_skipped} done before (resumed)" if self.shards_skipped else "")
            + (
                f"; {counted(self.conflicts_retried, 'shard merge')} redone after another "
                "writer's commit"
                if self.conflicts_retried
                else ""
            )
            + "".join(f"; {n}" for n in self.notes)
        )


# the fields a sum extends (lists, keys: made by a factory) and those it adds (numbers)
_EXTENDED = tuple(f.name for f in fields(WriteReport) if f.default_factory is not MISSING)
_ADDED = tuple(f.name for f in fields(WriteReport) if f.default_factory is MISSING)


def sum_reports(receipts: Any, seconds_since: float | None = None) -> WriteReport:
    total = WriteReport()
    for r in _flat(receipts):
        total += r
    if seconds_since is not None:
        total.seconds = time.perf_counter() - seconds_since
    return total


def _flat(receipts: Any) -> Iterator[Any]:
    """Every receipt in ``receipts``, however nested: a 0-d array's one block comes back from
    its task as a 0-d object array, which numpy keeps as an element of a list of receipts."""
    for r in np.asarray(receipts, dtype=object).flat:
        if isinstance(r, np.ndarray):
            yield from _flat(r.item() if r.ndim == 0 else r)
        else:
            yield r
