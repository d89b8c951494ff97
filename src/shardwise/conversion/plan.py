"""What a conversion will do with each array, decided before anything is written.

For every source array: the target's inner chunks (the source's chunks), its shard shape, its
codec chain, metadata (attributes, dimension names, fill value) and the method: ``copy`` when the
source's encoded chunks already are valid inner chunks of the target (the same chunk grid and a
codec chain the target declares equivalently), else ``reencode`` with the reason. Pure except for
reading the source's metadata objects handed in.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..codec.shard import ShardCodec
from ..core.layout import ceildiv
from ..core.shardspec import ShardSpec, shards_for
from ..errors import PlanError

Method = Literal["copy", "reencode"]
XARRAY_DIMS = "_ARRAY_DIMENSIONS"
FIXED_KINDS = "biufcmMSU"  # fixed-size dtypes: numbers, datetimes, fixed-width strings


@dataclass(frozen=True)
class WriteSettings:
    """How each array of a conversion is written (``convert``'s keywords, carried as one)."""

    mode: str
    resume: bool
    progress: bool
    lease: bool
    break_lease: bool
    fsync: bool
    threads: int | None


@dataclass(frozen=True)
class SourceChunks:
    """Where a source array keeps its encoded chunks: one object per chunk (zarr v2, v3 without
    sharding) or inner chunks of shards (v3 sharded, ``shard_codec`` set)."""

    chunk_shape: tuple[int, ...]
    separator: str
    prefix: str  # "c" for the v3 default key encoding, "" for v2 keys
    shard_codec: ShardCodec | None = None

    def key(self, coords: Sequence[int]) -> str:
        """The store key (relative to the array) of chunk (or shard) ``coords``."""
        if self.prefix:
            return self.separator.join([self.prefix, *map(str, coords)])
        return self.separator.join(map(str, coords)) if coords else "0"

    def locate(self, chunk: Sequence[int]) -> tuple[str, int]:
        """Source shard key and flat position inside it of inner chunk ``chunk`` (sharded)."""
        codec = self.shard_codec
        assert codec is not None
        grid = codec.grid
        shard = [c // g for c, g in zip(chunk, grid, strict=True)]
        inside = tuple(c % g for c, g in zip(chunk, grid, strict=True))
        flat = int(np.ravel_multi_index(inside, grid)) if grid else 0
        return self.key(shard), flat


@dataclass(frozen=True)
class ArrayPlan:
    """How one array is converted: the target's creation arguments and the method."""

    src_path: str
    dst_path: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    chunks: tuple[int, ...]
    shards: tuple[int, ...]
    method: Method
    reason: str
    source: SourceChunks
    create: dict[str, Any] = field(compare=False, repr=False)

    @property
    def nshards(self) -> int:
        return math.prod(ceildiv(n, s) for n, s in zip(self.shape, self.shards, strict=True))


# -- codec chains -------------------------------------------------------------------------------


def _v2_compressor(comp: Any, itemsize: int) -> list[Any] | str:
    """The v3 bytes-to-bytes codecs that decode what a v2 compressor wrote, or why none do."""
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    if comp is None:
        return []
    cfg = comp.get_config()
    cid = cfg.get("id")
    if cid == "zstd":
        return [ZstdCodec(level=int(cfg.get("level", 0)), checksum=bool(cfg.get("checksum")))]
    if cid == "gzip":
        return [GzipCodec(level=int(cfg.get("level", 5)))]
    if cid == "blosc":
        shuffle = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}.get(int(cfg.get("shuffle", 1)))
        if shuffle is None:  # automatic shuffle: a decoder reads the choice from the frame
            shuffle = "shuffle" if itemsize > 1 else "noshuffle"
        return [
            BloscCodec(
                cname=cfg.get("cname", "lz4"),
                clevel=int(cfg.get("clevel", 5)),
                shuffle=shuffle,  # type: ignore[arg-type]
                typesize=itemsize,
                blocksize=int(cfg.get("blocksize", 0)),
            )
        ]
    return f"v2 compressor {cid!r} has no equivalent v3 codec"


def _v2_chain(meta: Any, dtype: np.dtype[Any]) -> tuple[list[Any], Any, list[Any]] | str:
    """(filters, serializer, compressors) of v3 codecs equivalent to a v2 array's, or why not."""
    from zarr.codecs import BytesCodec, TransposeCodec

    if meta.filters:
        ids = [f.get_config().get("id") for f in meta.filters]
        return f"v2 filters {ids} have no equivalent v3 codec"
    if dtype.kind not in FIXED_KINDS:
        return f"dtype {dtype} has no fixed size"
    comp = _v2_compressor(meta.compressor, dtype.itemsize)
    if isinstance(comp, str):
        return comp
    single = dtype.itemsize == 1 or dtype.kind == "S"
    endian: Any = None if single else ("big" if dtype.byteorder == ">" else "little")
    filters: list[Any] = []
    if meta.order == "F" and len(meta.shape) > 1:
        # a v2 F-order chunk is the C-order bytes of the chunk transposed
        filters = [TransposeCodec(order=tuple(reversed(range(len(meta.shape)))))]
    return filters, BytesCodec(endian=endian), comp


def _v3_chain(codecs: Sequence[Any]) -> tuple[list[Any], Any, list[Any]] | str:
    from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec
    from zarr.codecs import ShardingCodec

    filters, serializer, compressors = [], None, []
    for c in codecs:
        if isinstance(c, ShardingCodec):
            return "nested sharding codecs are re-encoded"
        if isinstance(c, ArrayArrayCodec) and serializer is None:
            filters.append(c)
        elif isinstance(c, ArrayBytesCodec) and serializer is None:
            serializer = c
        elif isinstance(c, BytesBytesCodec) and serializer is not None:
            compressors.append(c)
        else:
            return f"codec chain {[c.to_dict()['name'] for c in codecs]} is not understood"
    return filters, serializer, compressors


def _fill_attr(value: Any, dtype: np.dtype[Any]) -> Any:
    """xarray's encoding of a ``_FillValue`` attribute in zarr v3 (floats as base64 doubles)."""
    if dtype.kind == "b":
        return bool(value)
    if dtype.kind in "iumM":
        return int(value)
    if dtype.kind == "f":
        return base64.standard_b64encode(struct.pack("<d", float(value))).decode()
    if dtype.kind == "c":
        c = complex(value)
        return [base64.standard_b64encode(struct.pack("<d", x)).decode() for x in (c.real, c.imag)]
    return value


# -- one array ----------------------------------------------------------------------------------


def plan_array(
    arr: Any,
    src_path: str,
    dst_path: str,
    *,
    shards: ShardSpec = None,
    shard_bytes: int | None = None,
    chunks: tuple[int, ...] | None = None,
    compressors: Any = None,
    xarray_group: bool = False,
) -> ArrayPlan:
    """The :class:`ArrayPlan` of zarr array ``arr`` (any format). ``chunks`` / ``compressors``
    (given by ``reshard``) replace the source's and force a re-encode when they differ."""
    from zarr.codecs import ShardingCodec

    from ..codec.metadata import shard_codec_from_zarr

    meta = arr.metadata
    shape = tuple(int(n) for n in arr.shape)
    attrs = dict(arr.attrs)
    dims: Any
    source: SourceChunks
    if meta.zarr_format == 2:
        dtype = np.dtype(meta.dtype.to_native_dtype())
        src_chunks = tuple(int(c) for c in meta.chunks)
        source = SourceChunks(src_chunks, meta.dimension_separator or ".", "")
        chain = _v2_chain(meta, dtype)
        fill = meta.fill_value
        dims = attrs.pop(XARRAY_DIMS, None)
        if xarray_group and dims is not None and fill is not None:
            # xarray masks a v2 array's fill value; in v3 it reads the mask from _FillValue
            attrs["_FillValue"] = _fill_attr(fill, dtype)
        if isinstance(fill, np.generic):
            fill = fill.item()
    else:
        dtype = np.dtype(meta.data_type.to_native_dtype())
        dims = meta.dimension_names
        fill = meta.fill_value
        enc = meta.chunk_key_encoding
        v2_keys = type(enc).__name__.startswith("V2")
        sep, prefix = enc.separator, "" if v2_keys else "c"
        codecs = tuple(meta.codecs)
        grid = getattr(meta.chunk_grid, "chunk_shape", None)
        if grid is None:
            raise PlanError(
                f"array {src_path or '/'!r} has a {type(meta.chunk_grid).__name__} chunk grid: "
                "shardwise converts regular chunk grids only"
            )
        outer = tuple(int(x) for x in grid)
        if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec):
            sc = codecs[0]
            src_chunks = tuple(int(x) for x in sc.chunk_shape)
            chain = _v3_chain(sc.codecs)
            try:
                scodec = shard_codec_from_zarr(sc, outer, meta.data_type, fill)
            except Exception as e:  # an index the copy cannot read: decode instead
                chain = f"source shard index: {e}"
                scodec = None
            source = SourceChunks(src_chunks, sep, prefix, scodec)
        else:
            src_chunks = outer
            chain = _v3_chain(codecs)
            source = SourceChunks(src_chunks, sep, prefix)
    inner = src_chunks if chunks is None else tuple(chunks)
    reason = "same inner chunks and an equivalent codec chain: encoded chunks copied"
    method: Method = "copy"
    if isinstance(chain, str):
        method, reason = "reencode", chain
    elif inner != src_chunks:
        method, reason = "reencode", f"inner chunks {inner} differ from the source's {src_chunks}"
    elif compressors is not None:
        method, reason = "reencode", "other compressors asked for"
    if dtype.kind not in FIXED_KINDS:
        raise PlanError(
            f"array {src_path or '/'!r} has dtype {dtype}: shardwise converts fixed-size numbers "
            "and strings only (convert the other arrays one by one with path=)"
        )
    dim_names = None if dims is None else tuple(dims)
    shard_shape = shards_for(
        shards, shape, inner, dtype.itemsize, dim_names, shard_bytes, name=src_path or "/"
    )
    create: dict[str, Any] = dict(
        shape=shape,
        dtype=dtype,
        chunks=inner,
        shards=shard_shape,
        fill_value=fill,
        dimension_names=dim_names,
        attributes=attrs or None,
        zarr_format=3,
    )
    if not isinstance(chain, str):
        filters, serializer, comps = chain
        create.update(filters=filters or None, serializer=serializer)
        create["compressors"] = (comps or None) if compressors is None else compressors
    elif compressors is not None:
        create["compressors"] = compressors
    return ArrayPlan(
        src_path=src_path,
        dst_path=dst_path,
        shape=shape,
        dtype=dtype,
        chunks=inner,
        shards=shard_shape,
        method=method,
        reason=reason,
        source=source,
        create=create,
    )
