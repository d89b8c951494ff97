"""The shard index of the ``sharding_indexed`` v1.0 format: ``(offset, nbytes)`` uint64 pairs,
one per inner chunk in C order, ``2**64 - 1`` twice for an empty chunk, stored with ``bytes``
(little or big endian) and optionally ``crc32c``; validated before anything is read through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from ..errors import CorruptShardError
from .chunks import ChunkCodec, Endian
from .codecs import crc32c

MISSING = np.uint64(2**64 - 1)
IndexLocation = Literal["start", "end"]


class ShardFormat(Protocol):
    """What the index and the decoding read of a shard codec (:class:`.shard.ShardCodec` is the
    one implementation). A protocol, not the class, because the codec encodes and decodes nested
    shards through these modules: they sit below shard.py, with no import back up."""

    @property
    def shard_shape(self) -> tuple[int, ...]: ...
    @property
    def inner(self) -> ChunkCodec: ...
    @property
    def index_location(self) -> IndexLocation: ...
    @property
    def index_endian(self) -> Endian: ...
    @property
    def index_crc(self) -> bool: ...
    @property
    def plain(self) -> bool: ...
    @property
    def chunk_shape(self) -> tuple[int, ...]: ...
    @property
    def grid(self) -> tuple[int, ...]: ...
    @property
    def index_nbytes(self) -> int: ...


def encode_index(codec: ShardFormat, index: np.ndarray) -> bytes:
    if codec.plain:  # one chunk stored as is: no index
        return b""
    dt = "<u8" if codec.index_endian == "little" else ">u8"
    raw = index.astype(dt, copy=False).tobytes()
    if codec.index_crc:
        raw += crc32c(raw).to_bytes(4, "little")
    return raw


@dataclass(frozen=True, eq=False)
class ShardIndex:
    """The validated index of one shard: an ``(nchunks, 2)`` read-only uint64 array of
    ``(offset, nbytes)`` pairs in C order of the inner-chunk grid, ``MISSING`` in both fields for
    an empty chunk; ``key`` names the shard it was read from (in errors), "" for a new one."""

    entries: np.ndarray
    key: str = ""

    def __post_init__(self) -> None:
        entries = np.asarray(self.entries, dtype=np.uint64)
        if entries.ndim != 2 or entries.shape[1] != 2:
            raise ValueError(f"index entries have shape {entries.shape}, expected (n, 2)")
        view = entries.view()
        view.flags.writeable = False
        object.__setattr__(self, "entries", view)

    @classmethod
    def empty(cls, nchunks: int) -> ShardIndex:
        """An index of ``nchunks`` empty chunks."""
        return cls(np.full((nchunks, 2), MISSING, dtype=np.uint64))

    @classmethod
    def build(
        cls, nchunks: int, flat_ids: Any, offsets: Any, lengths: Any, key: str = ""
    ) -> ShardIndex:
        """``nchunks`` entries: the chunks at ``flat_ids`` stored at ``(offsets, lengths)``."""
        entries = np.full((nchunks, 2), MISSING, dtype=np.uint64)
        entries[flat_ids, 0] = offsets
        entries[flat_ids, 1] = lengths
        return cls(entries, key)

    @classmethod
    def from_bytes(
        cls, codec: ShardFormat, raw: bytes | memoryview, object_size: int, key: str
    ) -> ShardIndex:
        """Validate and decode a stored index of ``codec.index_nbytes`` bytes; ``object_size``
        is the size of the whole stored shard. Raises :class:`CorruptShardError` naming ``key``."""
        return cls(_parse(codec, raw, object_size, key), key)

    @classmethod
    def of_shard(cls, codec: ShardFormat, data: bytes | memoryview, key: str) -> ShardIndex:
        """The validated index of a whole shard held in memory."""
        mv = memoryview(data)
        return cls.from_bytes(codec, mv[index_slice(codec, len(mv))], len(mv), key)

    def to_bytes(self, codec: ShardFormat) -> bytes:
        """The stored form: ``bytes`` in the codec's byte order, then its crc32c if it has one."""
        return encode_index(codec, self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardIndex):
            return NotImplemented
        return bool(np.array_equal(self.entries, other.entries))

    __hash__ = None  # type: ignore[assignment]

    @property
    def offsets(self) -> np.ndarray:
        return self.entries[:, 0]

    @property
    def lengths(self) -> np.ndarray:
        return self.entries[:, 1]

    @property
    def stored(self) -> np.ndarray:
        """Boolean mask of the stored (non-empty) chunks."""
        result: np.ndarray = self.entries[:, 0] != MISSING
        return result

    def is_empty(self, flat: int) -> bool:
        return bool(self.entries[flat, 0] == MISSING)

    def ranges(self, chunks: Any) -> np.ndarray:
        """The ``(offset, nbytes)`` entries of the chunks at flat positions ``chunks``."""
        result: np.ndarray = self.entries[chunks]
        return result

    @property
    def nbytes_total(self) -> int:
        """The bytes of all stored chunks (the index itself not counted)."""
        return int(self.lengths[self.stored].sum())


def parse_index(
    codec: ShardFormat, raw: bytes | memoryview, object_size: int, key: str
) -> np.ndarray:
    """The entries of :meth:`ShardIndex.from_bytes` as a plain array."""
    return ShardIndex.from_bytes(codec, raw, object_size, key).entries


def _parse(codec: ShardFormat, raw: bytes | memoryview, object_size: int, key: str) -> np.ndarray:
    """Validate and decode a shard index of ``codec.index_nbytes`` bytes.

    ``object_size`` is the size of the whole stored shard. Returns an ``(nchunks, 2)`` uint64
    array in C order of the inner-chunk grid; empty entries are ``MISSING`` in both fields.
    """
    if codec.plain:  # the object is its one chunk (``raw`` holds nothing of an index)
        return np.array([[0, object_size]], dtype=np.uint64)
    need = codec.index_nbytes
    if object_size < need:
        raise CorruptShardError(
            key, f"object is {object_size} bytes, smaller than its {need}-byte shard index"
        )
    if len(raw) != need:
        raise CorruptShardError(key, f"shard index is {len(raw)} bytes, expected {need}")
    body = memoryview(raw)
    if codec.index_crc:
        body, stored = body[:-4], int.from_bytes(body[-4:], "little")
        actual = crc32c(body)
        if actual != stored:
            raise CorruptShardError(
                key,
                f"shard index checksum mismatch (stored {stored:#010x}, computed {actual:#010x}); "
                f"index_location is {codec.index_location!r}",
            )
    dt = "<u8" if codec.index_endian == "little" else ">u8"
    index = np.frombuffer(body, dtype=dt).astype(np.uint64).reshape(-1, 2)
    offsets, sizes = index[:, 0], index[:, 1]
    miss_o, miss_n = offsets == MISSING, sizes == MISSING
    half = np.flatnonzero(miss_o != miss_n)
    if half.size:
        i = int(half[0])
        raise CorruptShardError(
            key,
            f"index entry (offset={int(offsets[i])}, nbytes={int(sizes[i])}): only one field is "
            "the empty marker 2**64-1",
            chunk=_coord(codec, i),
        )
    if codec.index_location == "start":
        lo, hi = need, object_size
    else:
        lo, hi = 0, object_size - need
    present = ~miss_o
    o, s = offsets[present], sizes[present]
    # compare without overflow: nbytes <= hi and offset <= hi - nbytes
    bad = (o < lo) | (s > hi) | (o > np.uint64(hi) - np.minimum(s, np.uint64(hi)))
    if bad.any():
        i = int(np.flatnonzero(present)[np.flatnonzero(bad)[0]])
        raise CorruptShardError(
            key,
            f"index entry (offset={int(offsets[i])}, nbytes={int(sizes[i])}) points outside the "
            f"data region [{lo}, {hi}) of a {object_size}-byte object",
            chunk=_coord(codec, i),
        )
    return index


def _coord(codec: ShardFormat, flat: int) -> tuple[int, ...]:
    return tuple(int(x) for x in np.unravel_index(flat, codec.grid))


def index_slice(codec: ShardFormat, object_size: int) -> slice:
    if codec.index_location == "start":
        return slice(0, codec.index_nbytes)
    return slice(object_size - codec.index_nbytes, object_size)
