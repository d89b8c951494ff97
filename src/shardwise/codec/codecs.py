"""Bytes-to-bytes codecs implemented natively (zstd, gzip, blosc, crc32c).

Each decoder takes ``max_size``, the most bytes it may produce, and refuses input that claims more:
nothing is ever allocated from a size read out of untrusted bytes. Decoders raise ``ValueError``
with a plain message; the shard codec adds the store key and the inner chunk.
"""

from __future__ import annotations

import struct
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import crc32c as _crc32c
import numcodecs
import zstandard
from numcodecs.zstd import decompress as _nc_decompress

Buffer = bytes | bytearray | memoryview


class BytesCodec(Protocol):
    @property
    def name(self) -> str: ...

    def encode(self, data: Buffer) -> bytes: ...

    def decode(self, data: Buffer, max_size: int) -> Buffer: ...

    def to_dict(self) -> dict[str, Any]: ...


_local = threading.local()


def crc32c(data: Buffer) -> int:
    return int(_crc32c.crc32c(data))


@dataclass(frozen=True)
class Zstd:
    level: int = 0
    checksum: bool = False
    name: str = field(default="zstd", init=False)

    def _cctx(self) -> zstandard.ZstdCompressor:
        key = ("zc", self.level, self.checksum)
        ctx = getattr(_local, "ctx", None)
        if ctx is None:
            ctx = _local.ctx = {}
        c = ctx.get(key)
        if c is None:
            c = ctx[key] = zstandard.ZstdCompressor(
                level=self.level, write_checksum=self.checksum, write_content_size=True
            )
        return c

    def _dctx(self) -> zstandard.ZstdDecompressor:
        d = getattr(_local, "dctx", None)
        if d is None:
            d = _local.dctx = zstandard.ZstdDecompressor()
        return d

    def compress(self, data: Buffer) -> bytes:
        """One frame as python-zstandard returns it, holding the whole compression bound."""
        out: bytes = self._cctx().compress(data)
        return out

    def encode(self, data: Buffer) -> bytes:
        out = self.compress(data)
        # the bytes python-zstandard returns keep their whole allocation (the compression bound,
        # a little over the raw size) whatever the compressed size: an encoded chunk would hold
        # as much memory as its raw data. An exact copy is cheap beside the compression.
        return bytes(memoryview(out)) if len(data) - len(out) > 4096 else out

    def decode(self, data: Buffer, max_size: int) -> Buffer:
        try:
            size = zstandard.frame_content_size(data)
        except zstandard.ZstdError as e:
            raise ValueError(f"zstd: {e}") from None
        if size > max_size:
            raise ValueError(f"zstd frame claims {size} bytes, at most {max_size} expected")
        try:
            if size >= 0:
                return self._dctx().decompress(data)
            return self._dctx().decompress(data, max_output_size=max_size)
        except zstandard.ZstdError as e:
            raise ValueError(f"zstd: {e}") from None

    def decode_into(self, data: Buffer, out: memoryview) -> bool:
        """Decompress one frame straight into ``out`` (GIL released). False, with nothing
        written, when the frame does not state its size; ``ValueError`` when it is bad or its
        size is not ``len(out)``."""
        try:
            size = zstandard.frame_content_size(data)
        except zstandard.ZstdError as e:
            raise ValueError(f"zstd: {e}") from None
        if size < 0:
            return False
        if size != len(out):
            raise ValueError(f"zstd frame claims {size} bytes, expected {len(out)}")
        try:
            # numcodecs' module function, not its codec object: the same GIL-free decompress
            # into ``out`` without the codec's argument wrapping, once per large chunk
            _nc_decompress(data, out)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"zstd: {e}") from None
        return True

    def multi_encode(self, buf: Buffer, segs: Any) -> Any:
        """Compress the ``(offset, nbytes)`` segments of ``buf`` in one GIL-free call."""
        items = zstandard.BufferWithSegments(buf, segs.tobytes())
        return self._cctx().multi_compress_to_buffer(items, threads=1)

    def multi_decode(self, buf: Buffer, segs: Any, size: int) -> Any:
        """Decompress frames at ``segs`` of ``buf``, each to exactly ``size`` bytes, in one call
        that releases the GIL, with no Python per frame: python-zstandard's collection, a
        sequence of one bytes-like per frame (``b"".join`` of it joins them in C)."""
        import numpy as np

        items = zstandard.BufferWithSegments(buf, segs.tobytes())
        sizes = np.full(len(segs), size, dtype=np.uint64).tobytes()
        try:
            coll = self._dctx().multi_decompress_to_buffer(
                items, decompressed_sizes=sizes, threads=1
            )
        except zstandard.ZstdError as e:
            raise ValueError(f"zstd: {e}") from None
        return coll

    def to_dict(self) -> dict[str, Any]:
        return {"name": "zstd", "configuration": {"level": self.level, "checksum": self.checksum}}


@dataclass(frozen=True)
class Gzip:
    level: int = 5
    name: str = field(default="gzip", init=False)

    def encode(self, data: Buffer) -> bytes:
        # one-shot zlib with a gzip wrapper: the header's mtime is 0, so the same input gives
        # the same bytes (numcodecs.GZip stamps the current time into every chunk)
        return zlib.compress(data, self.level, wbits=31)

    def decode(self, data: Buffer, max_size: int) -> Buffer:
        d = zlib.decompressobj(wbits=31)
        try:
            out = d.decompress(data, max_size + 1)
        except zlib.error as e:
            raise ValueError(f"gzip: {e}") from None
        if len(out) > max_size or not d.eof:
            raise ValueError(f"gzip stream is truncated or longer than {max_size} bytes")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": "gzip", "configuration": {"level": self.level}}


_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


@dataclass(frozen=True)
class Blosc:
    cname: str = "zstd"
    clevel: int = 5
    shuffle: str = "shuffle"
    typesize: int = 1
    blocksize: int = 0
    name: str = field(default="blosc", init=False)

    def _codec(self) -> numcodecs.Blosc:
        return numcodecs.Blosc(
            cname=self.cname,
            clevel=self.clevel,
            shuffle=_SHUFFLE[self.shuffle],
            blocksize=self.blocksize,
            typesize=self.typesize,
        )

    def encode(self, data: Buffer) -> bytes:
        return bytes(self._codec().encode(data))

    def decode(self, data: Buffer, max_size: int) -> Buffer:
        if len(data) < 16:
            raise ValueError(f"blosc frame of {len(data)} bytes is shorter than its 16-byte header")
        nbytes, _, cbytes = struct.unpack_from("<III", data, 4)
        if cbytes != len(data):
            raise ValueError(f"blosc header says {cbytes} compressed bytes, got {len(data)}")
        if nbytes > max_size:
            raise ValueError(f"blosc frame claims {nbytes} bytes, at most {max_size} expected")
        try:
            return bytes(self._codec().decode(data))
        except RuntimeError as e:
            raise ValueError(f"blosc: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        cfg = {
            "cname": self.cname,
            "clevel": self.clevel,
            "shuffle": self.shuffle,
            "typesize": self.typesize,
            "blocksize": self.blocksize,
        }
        return {"name": "blosc", "configuration": cfg}


@dataclass(frozen=True)
class Crc32c:
    name: str = field(default="crc32c", init=False)

    def encode(self, data: Buffer) -> bytes:
        return bytes(data) + crc32c(data).to_bytes(4, "little")

    def decode(self, data: Buffer, max_size: int) -> Buffer:
        if len(data) < 4:
            raise ValueError(f"{len(data)} bytes is too short to hold a crc32c checksum")
        mv = memoryview(data)
        body, stored = mv[:-4], int.from_bytes(mv[-4:], "little")
        actual = crc32c(body)
        if actual != stored:
            raise ValueError(
                f"crc32c checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
            )
        return body

    def to_dict(self) -> dict[str, Any]:
        return {"name": "crc32c"}


def bytes_codec_from_dict(d: dict[str, Any], itemsize: int) -> BytesCodec | None:
    """A native codec for a zarr.json codec entry, or None when it is not one of ours."""
    name, cfg = d["name"], d.get("configuration") or {}
    if name == "zstd":
        return Zstd(level=int(cfg.get("level", 0)), checksum=bool(cfg.get("checksum", False)))
    if name == "gzip":
        return Gzip(level=int(cfg.get("level", 5)))
    if name == "crc32c":
        return Crc32c()
    if name == "blosc":
        shuffle = cfg.get("shuffle", "shuffle")
        return Blosc(
            cname=str(cfg.get("cname", "zstd")),
            clevel=int(cfg.get("clevel", 5)),
            shuffle=shuffle if isinstance(shuffle, str) else "noshuffle",
            typesize=int(cfg.get("typesize") or itemsize),
            blocksize=int(cfg.get("blocksize", 0)),
        )
    return None
