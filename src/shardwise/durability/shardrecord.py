"""One shard's record in the writer's journal (:class:`Record`) and whether a stored object is
the one it describes.

A shard stored whole is recorded by its size and the crc32c of the whole object (and of its
index). A shard a range merge built (``engine/splice.py``: the untouched inner chunks copied by
the store from the shard it replaced, never read by the writer) has no whole-object crc32c the
writer could give without reading the copied bytes back; its record is of the kind
``"spliced"``: the object's size, the ranges of the new object the merge wrote (the changed
chunks and the index) and their crc32c, and the index's crc32c. It is matched by reading those
ranges only (the index pins where every inner chunk lies and how long it is; the ranges the
merge wrote pin the new chunks' bytes); verify, which reads every shard whole, checks the same
ranges of what it read, and every inner chunk decodes (their own checksums where the chain has
them).

>>> segments = [(0, 6), b"new", (9, 4), b"index"]  # 6 and 4 bytes copied, 8 written
>>> rec = Record.spliced_of("w1", segments, 5, True)
>>> rec.size, rec.written
(18, ((6, 3), (13, 5)))
>>> rec.holds(b"oldold" + b"new" + b"keep" + b"index")
True
>>> rec.holds(b"oldold" + b"NEW" + b"keep" + b"index")
False
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import crc32c as _crc32c

from ..codec.codecs import crc32c
from ..storage.store import ShardStore

__all__ = ["SPLICED", "Record", "object_crc32c", "stored_matches"]

SPLICED = "spliced"  # the kind of record of a shard a range merge built
Range = tuple[int, int]  # (offset, nbytes)


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Record:
    """What the writer stored for one shard: ``crc32c`` of the whole object, or None for a
    spliced shard, whose ``written`` ranges (offset, nbytes) have the crc32c
    ``written_crc32c``."""

    write: str
    size: int
    crc32c: int | None
    index_crc32c: int
    written: tuple[Range, ...] = ()
    written_crc32c: int = 0

    @property
    def kind(self) -> str:
        """``"whole"`` or ``"spliced"`` (:data:`SPLICED`)."""
        return "whole" if self.crc32c is not None else SPLICED

    @classmethod
    def of(cls, write: str, parts: Sequence[Any], index_nbytes: int, index_at_end: bool) -> Record:
        """The record of an object stored as ``parts`` (bytes-like, in order)."""
        views = [memoryview(p).cast("B") for p in parts]
        n = sum(len(v) for v in views)
        crc = 0
        for v in views:
            crc = _crc32c.crc32c(v, crc)
        return cls(
            write,
            n,
            int(crc),
            crc32c(_span(views, n - index_nbytes if index_at_end else 0, index_nbytes)),
        )

    @classmethod
    def spliced_of(
        cls, write: str, segments: Sequence[Any], index_nbytes: int, index_at_end: bool
    ) -> Record:
        """The record of an object a range merge built from ``segments`` (in order:
        ``(offset, nbytes)`` ranges copied from the object it replaced, or bytes-like parts
        written; the index is among the parts written)."""
        written: list[Range] = []
        views: list[memoryview] = []
        crc, pos = 0, 0
        for seg in segments:
            if isinstance(seg, tuple):
                pos += int(seg[1])
                continue
            v = memoryview(seg).cast("B")
            crc = _crc32c.crc32c(v, crc)
            if written and sum(written[-1]) == pos:
                written[-1] = (written[-1][0], written[-1][1] + len(v))
            else:
                written.append((pos, len(v)))
            views.append(v)
            pos += len(v)
        at = pos - index_nbytes if index_at_end else 0
        # the index lies in the written ranges: its offset among the bytes written
        before = sum(n for o, n in written if o + n <= at) + next(
            (at - o for o, n in written if o <= at < o + n), 0
        )
        index_crc = crc32c(_span(views, before, index_nbytes))
        return cls(write, pos, None, index_crc, tuple(written), int(crc))

    def holds(self, data: Any) -> bool:
        """Whether ``data`` (a whole stored object) is the object recorded."""
        view = memoryview(data).cast("B")
        if len(view) != self.size:
            return False
        if self.crc32c is not None:
            return crc32c(view) == self.crc32c
        return _ranges_crc32c([view[o : o + n] for o, n in self.written]) == self.written_crc32c

    def describe(self) -> str:
        """What the record says of the object, for a report."""
        if self.crc32c is not None:
            return f"{self.size} bytes, crc32c {self.crc32c:#010x}"
        return (
            f"{self.size} bytes, of which the {len(self.written)} range(s) its merge wrote "
            f"have crc32c {self.written_crc32c:#010x}"
        )

    def to_bytes(self) -> bytes:
        d: dict[str, Any] = {
            "write": self.write,
            "size": self.size,
            "index_crc32c": self.index_crc32c,
        }
        if self.crc32c is not None:
            d["crc32c"] = self.crc32c
        else:
            d["kind"] = SPLICED
            d["written"] = [list(r) for r in self.written]
            d["written_crc32c"] = self.written_crc32c
        return _json(d)

    @classmethod
    def from_bytes(cls, data: bytes) -> Record | None:
        try:
            d = json.loads(data)
            write, size, index_crc = str(d["write"]), int(d["size"]), int(d["index_crc32c"])
            if d.get("kind") == SPLICED:
                written = tuple((int(o), int(n)) for o, n in d["written"])
                return cls(write, size, None, index_crc, written, int(d["written_crc32c"]))
            return cls(write, size, int(d["crc32c"]), index_crc)
        except (ValueError, KeyError, TypeError):
            return None


def _span(views: Sequence[memoryview], start: int, n: int) -> bytes:
    """Bytes ``[start, start + n)`` of the concatenation of ``views``."""
    out = bytearray()
    pos = 0
    for v in views:
        lo, hi = max(start - pos, 0), min(start + n - pos, len(v))
        if lo < hi:
            out += v[lo:hi]
        pos += len(v)
    return bytes(out)


def _ranges_crc32c(parts: Sequence[Any]) -> int:
    crc = 0
    for p in parts:
        crc = _crc32c.crc32c(p, crc)
    return int(crc)


def stored_matches(store: ShardStore, name: str, rec: Record) -> bool:
    """Whether the object ``name`` is the one ``rec`` records: its size, then the crc32c of
    the whole object (read in blocks), or for a spliced record of the ranges its merge wrote
    (read as ranges: the bytes the store copied are not read)."""
    if store.size(name) != rec.size:
        return False
    if rec.crc32c is not None:
        return object_crc32c(store, name) == rec.crc32c
    try:
        got = store.get_ranges(name, list(rec.written))
    except (FileNotFoundError, NotADirectoryError, KeyError):
        return False
    if [len(g) for g in got] != [n for _, n in rec.written]:
        return False  # replaced meanwhile by a shorter object
    return _ranges_crc32c(got) == rec.written_crc32c


def object_crc32c(store: ShardStore, name: str, block: int = 16 << 20) -> int | None:
    """crc32c of a stored object (local files are read in blocks), None when it is missing."""
    root = store.local_root
    if root is None:
        data = store.get(name)
        return None if data is None else crc32c(data)
    crc = 0
    try:
        with open(root / store.key(name), "rb") as f:
            while chunk := f.read(block):
                crc = _crc32c.crc32c(chunk, crc)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(crc)
