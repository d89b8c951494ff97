"""zarr.json <-> (layout, dtype, fill value, shard codec). zarr-python parses and validates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from zarr.codecs import BytesCodec, ShardingCodec, TransposeCodec, ZstdCodec

from ..compat import has_sync_codec
from ..core.layout import Layout
from ..errors import UnsupportedCodecError
from .chunks import ChunkCodec, ZarrChain
from .codecs import bytes_codec_from_dict
from .shard import ShardCodec


def default_compressors() -> list[Any]:
    """What a new array gets when the caller does not choose ``compressors``: zstd (zarr's own
    default) with its frame checksum, so a damaged inner chunk fails to decode instead of reading
    back as wrong values. Every zstd decoder (zarr-python, tensorstore, ours) verifies it."""
    return [ZstdCodec(level=0, checksum=True)]


@dataclass(frozen=True)
class ArrayInfo:
    """What shardwise needs to read or write one sharded array."""

    layout: Layout
    codec: ShardCodec
    dimension_names: tuple[str | None, ...] | None
    attributes: dict[str, Any]

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.codec.inner.dtype

    @property
    def fill_value(self) -> Any:
        return self.codec.inner.fill_value

    def shard_codec(self, coord: Sequence[int]) -> ShardCodec:
        """The codec of shard ``coord``: its index has one entry per inner chunk of that
        shard's extent (every shard alike on a regular grid; a rectilinear one's differ)."""
        lay = self.layout
        if lay.is_regular:
            return self.codec
        extent = lay.shard_extent(coord)
        return (
            self.codec
            if extent == self.codec.shard_shape
            else replace(self.codec, shard_shape=extent)
        )


def _compose(order: tuple[int, ...] | None, nxt: tuple[int, ...]) -> tuple[int, ...]:
    return nxt if order is None else tuple(order[j] for j in nxt)


def chunk_codec_from_zarr(
    codecs: tuple[Any, ...], chunk_shape: tuple[int, ...], zdtype: Any, fill_value: Any
) -> ChunkCodec:
    """Translate a zarr inner codec chain; unknown parts run through zarr-python's objects."""
    dtype = np.dtype(zdtype.to_native_dtype())
    native = ChunkCodec(chunk_shape=chunk_shape, dtype=dtype, fill_value=fill_value)
    order: tuple[int, ...] | None = None
    endian: Any = None
    nested = None
    bytes_codecs = []
    fallback = dtype.hasobject
    stage = 0  # 0: array->array, 1: after the serializer
    for c in codecs:
        if stage == 0 and isinstance(c, TransposeCodec):
            order = _compose(order, tuple(int(i) for i in c.order))
        elif stage == 0 and isinstance(c, BytesCodec):
            endian = None if c.endian is None else str(getattr(c.endian, "value", c.endian))
            stage = 1
        elif stage == 0 and isinstance(c, ShardingCodec):
            stored = chunk_shape if order is None else tuple(chunk_shape[i] for i in order)
            nested = shard_codec_from_zarr(c, stored, zdtype, fill_value)
            stage = 1
        elif stage == 1 and (b := bytes_codec_from_dict(c.to_dict(), dtype.itemsize)) is not None:
            bytes_codecs.append(b)
        else:
            fallback = True
            break
    if fallback:
        for c in codecs:
            if not has_sync_codec(c):
                raise UnsupportedCodecError(
                    f"codec {c.to_dict()} has no synchronous implementation shardwise can call"
                )
        return ChunkCodec(
            chunk_shape=chunk_shape,
            dtype=dtype,
            fill_value=fill_value,
            order=None,
            endian=None,
            zarr_chain=ZarrChain(codecs=tuple(codecs), zdtype=zdtype),
        )
    if dtype.itemsize > 1 and endian is None and nested is None:
        endian = "little"
    return ChunkCodec(
        chunk_shape=native.chunk_shape,
        dtype=dtype,
        fill_value=fill_value,
        order=order,
        endian=endian,
        bytes_codecs=tuple(bytes_codecs),
        nested=nested,
    )


def shard_codec_from_zarr(
    codec: ShardingCodec, shard_shape: tuple[int, ...], zdtype: Any, fill_value: Any
) -> ShardCodec:
    index = [c.to_dict() for c in codec.index_codecs]
    names = [d["name"] for d in index]
    if names not in (["bytes"], ["bytes", "crc32c"]):
        raise UnsupportedCodecError(
            f"index codecs {names} are not supported: use bytes (+ crc32c) as the spec recommends"
        )
    cfg: Any = index[0].get("configuration") or {}
    index_endian: Any = cfg.get("endian", "little")
    location = str(getattr(codec.index_location, "value", codec.index_location))
    inner = chunk_codec_from_zarr(
        tuple(codec.codecs), tuple(int(x) for x in codec.chunk_shape), zdtype, fill_value
    )
    return ShardCodec(
        shard_shape=tuple(int(x) for x in shard_shape),
        inner=inner,
        index_location=str(location),  # type: ignore[arg-type]
        index_endian=index_endian,
        index_crc=names[-1] == "crc32c",
    )


def info_from_metadata(meta: Any) -> ArrayInfo:
    """An :class:`ArrayInfo` from zarr's ``ArrayV3Metadata``."""
    if getattr(meta, "zarr_format", None) != 3:
        raise UnsupportedCodecError("shardwise reads and writes Zarr format 3 arrays only")
    codecs = tuple(meta.codecs)
    if not meta.shape and not any(isinstance(c, ShardingCodec) for c in codecs):
        return _plain_info(meta, codecs)
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        names = [c.to_dict()["name"] for c in codecs]
        raise UnsupportedCodecError(
            f"the array's codecs are {names}: shardwise needs exactly one sharding_indexed codec "
            "at the top level (create the array with shards=...)"
        )
    sizes = _shard_sizes(meta.chunk_grid)
    shard_shape = tuple(s if isinstance(s, int) else max(s) for s in sizes)
    codec = shard_codec_from_zarr(codecs[0], shard_shape, meta.data_type, meta.fill_value)
    enc = meta.chunk_key_encoding
    key_encoding: Any = "v2" if type(enc).__name__.startswith("V2") else "default"
    layout = Layout.rectilinear(
        tuple(int(x) for x in meta.shape),
        sizes,
        codec.chunk_shape,
        separator=enc.separator,
        key_encoding=key_encoding,
    )
    dims = None if meta.dimension_names is None else tuple(meta.dimension_names)
    return ArrayInfo(
        layout=layout, codec=codec, dimension_names=dims, attributes=dict(meta.attributes)
    )


def unsharded_info(meta: Any) -> ArrayInfo | None:
    """An unsharded Zarr v3 array of a regular chunk grid (no sharding codec at the top level)
    as shards of one chunk each whose object is the chunk itself (``ShardCodec.plain``): what
    ``convert(shards=None)`` writes, ``verify`` checks chunk by chunk and ``inspect`` shows.
    None for anything else (a sharded array, another grid, Zarr v2)."""
    codecs = tuple(getattr(meta, "codecs", ()))
    grid = getattr(getattr(meta, "chunk_grid", None), "chunk_shape", None)
    if getattr(meta, "zarr_format", None) != 3 or grid is None:
        return None
    if any(isinstance(c, ShardingCodec) for c in codecs[:1]):
        return None
    return _plain_info(meta, codecs)


def _shard_sizes(grid: Any) -> tuple[int | tuple[int, ...], ...]:
    """Per axis, the shard length of a regular grid (or a rectilinear grid's regular axis), else
    the shard extents along it (zarr's rectilinear ``chunk_shapes``, expanded)."""
    shapes = getattr(grid, "chunk_shapes", None)
    if shapes is None:
        return tuple(int(x) for x in grid.chunk_shape)
    return tuple(s if isinstance(s, int) else tuple(int(x) for x in s) for s in shapes)


def _plain_info(meta: Any, codecs: tuple[Any, ...]) -> ArrayInfo:
    """An array stored as plain chunks (no sharding codec; a 0-d array as
    :mod:`shardwise.write.create` makes them): shards of one chunk whose object is the chunk
    itself (``ShardCodec.plain``)."""
    chunks = tuple(int(x) for x in meta.chunk_grid.chunk_shape) if meta.shape else ()
    inner = chunk_codec_from_zarr(codecs, chunks, meta.data_type, meta.fill_value)
    enc = meta.chunk_key_encoding
    key_encoding: Any = "v2" if type(enc).__name__.startswith("V2") else "default"
    layout = Layout(
        shape=tuple(int(x) for x in meta.shape),
        shard_shape=chunks,
        chunk_shape=chunks,
        separator=enc.separator,
        key_encoding=key_encoding,
    )
    return ArrayInfo(
        layout=layout,
        codec=ShardCodec(shard_shape=chunks, inner=inner, plain=True),
        dimension_names=None if meta.dimension_names is None else tuple(meta.dimension_names),
        attributes=dict(meta.attributes),
    )
