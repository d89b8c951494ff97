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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..codec.shard import ShardCodec
from ..core.extents import fit_extents, grid_of, has_extents, split_extents
from ..core.layout import ceildiv
from ..core.shardspec import ShardSpec, by_source_chunks, shards_for, wants_dask
from ..errors import InvalidValueError, PlanError

Method = Literal["copy", "reencode"]
Chain = tuple[list[Any], Any, list[Any]] | str  # filters, serializer, compressors; or why not
XARRAY_DIMS = "_ARRAY_DIMENSIONS"
FIXED_KINDS = "biufcmMSU"  # fixed-size dtypes: numbers, datetimes, fixed-width strings


@dataclass(frozen=True)
class SourceChunks:
    """Where a source array keeps its encoded chunks: one object per chunk (zarr v2, v3 without
    sharding) or inner chunks of shards (v3 sharded, ``shard_codec`` set)."""

    chunk_shape: tuple[int, ...]
    separator: str
    prefix: str  # "c" for the v3 default key encoding, "" for v2 keys
    shard_codec: ShardCodec | None = None
    # a rectilinear grid (its objects of their own extents): read whole and re-encoded
    rectilinear: bool = False

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
    # False: written unsharded (``convert(shards=None)``), one object per chunk (``shards``
    # is then the chunk shape: the grid of the stored objects)
    sharded: bool = True
    # ``shards="dask"`` of a rectilinear source: its shards kept (write_array's one shard per
    # dask chunk, the source read a shard per chunk); or the rectilinear grid of shard extents
    # given (zarr's ``shards=`` form); ``shards`` is then the largest shard
    keep: Any = field(default=None, compare=False)

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


def _v2_chain(meta: Any, dtype: np.dtype[Any]) -> Chain:
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


def _v3_chain(codecs: Sequence[Any]) -> Chain:
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


@dataclass(frozen=True)
class _Source:
    """What a conversion reads of a source array's metadata, whatever its format."""

    dtype: np.dtype[Any]
    dims: Any
    fill: Any
    attrs: dict[str, Any]
    chunks: SourceChunks
    chain: Chain  # the codec chain the target can declare, or why the chunks are re-encoded
    outer: tuple[Any, ...] = ()  # v3: its stored objects per axis (a size, or the extents)


def plan_array(
    arr: Any,
    src_path: str,
    dst_path: str,
    *,
    shards: ShardSpec = None,
    shard_bytes: int | None = None,
    chunks: tuple[int, ...] | Mapping[str, int] | None = None,
    compressors: Any = None,
    xarray_group: bool = False,
    sharded: bool = True,
) -> ArrayPlan:
    """The :class:`ArrayPlan` of zarr array ``arr`` (any format). ``chunks`` / ``compressors``
    (given by ``reshard``) replace the source's and force a re-encode when they differ;
    ``chunks`` may name dimensions (``{"time": 10}``: the others keep the source's).
    ``sharded=False``: a plain array, one object per chunk."""
    meta = arr.metadata
    shape = tuple(int(n) for n in arr.shape)
    attrs = dict(arr.attrs)
    if meta.zarr_format == 2:
        src = _read_v2(meta, attrs, xarray_group)
    else:
        src = _read_v3(meta, attrs, src_path)
    inner = inner_chunks(chunks, src.chunks.chunk_shape, src.dims, src_path or "/")
    method, reason = _method(src, inner, compressors)
    if src.dtype.kind not in FIXED_KINDS:
        raise PlanError(
            f"array {src_path or '/'!r} has dtype {src.dtype}: shardwise converts fixed-size "
            "numbers and strings only (convert the other arrays one by one with path=)"
        )
    dim_names = None if src.dims is None else tuple(src.dims)
    # "dask" by any name: the whole grid kept (the source's dask chunks are its shards)
    keep: Any = "dask" if src.chunks.rectilinear and sharded and wants_dask(shards) else None
    if src.chunks.rectilinear:
        method, reason = "reencode", "a rectilinear source: its shards read and re-encoded"
        if keep is not None:  # its grid kept: the largest shard stands in for the checks
            shards = tuple(max(s) if isinstance(s, tuple) else s for s in src.outer)
    edges: dict[int, tuple[int, ...]] = {}
    if sharded and has_extents(shards):  # a rectilinear grid of the extents given
        shards, edges, inner = _extents(shards, shape, inner, chunks, dim_names, src_path)
        method, reason = "reencode", "shard extents given: a rectilinear grid, re-encoded"
    spec = by_source_chunks(shards, src.chunks.chunk_shape, dim_names)  # "dask": its chunks
    shard_shape = (
        shards_for(
            spec, shape, inner, src.dtype.itemsize, dim_names, shard_bytes, name=src_path or "/"
        )
        if sharded
        else inner
    )
    if edges:
        keep = grid_of(edges, shard_shape, shape)
    return ArrayPlan(
        src_path=src_path,
        dst_path=dst_path,
        shape=shape,
        dtype=src.dtype,
        chunks=inner,
        shards=shard_shape,
        method=method,
        reason=reason,
        source=src.chunks,
        create=_create_kwargs(
            src, shape, inner, shard_shape if sharded else None, dim_names, compressors
        ),
        sharded=sharded,
        keep=keep,
    )


def _extents(
    shards: Any,
    shape: tuple[int, ...],
    inner: tuple[int, ...],
    chunks: Any,
    dims: tuple[str, ...] | None,
    src_path: str,
) -> tuple[Any, dict[int, tuple[int, ...]], tuple[int, ...]]:
    """(``shards`` with each list of extents as its largest, the extents by axis, inner chunks
    dividing every extent): chunks given there checked (refused with the sizes that would),
    the source's cut to a divisor."""
    name = f"array {src_path or '/'!r}"
    nominal, edges = split_extents(shards, shape, dims, name)
    names = list(dims or ())
    if chunks is None:
        given: set[int] = set()
    elif isinstance(chunks, Mapping):
        given = {i for i, d in enumerate(names) if d in chunks}
    else:
        given = set(range(len(shape)))
    for fixed in (True, False):
        part = {i: e for i, e in edges.items() if (i in given) == fixed}
        if part:
            inner = fit_extents(part, shape, inner, fixed, dims)
    return nominal, edges, inner


def inner_chunks(chunks: Any, source: tuple[int, ...], dims: Any, name: str) -> tuple[int, ...]:
    """The target's chunks: the source's; ``chunks`` as a shape; or ``{dimension name:
    size}`` over the source's (a name the array does not have is skipped: a group's arrays
    differ; :func:`~shardwise.core.shardspec.check_names` refuses a name no array has)."""
    if chunks is None:
        return source
    if not isinstance(chunks, Mapping):
        return tuple(int(c) for c in chunks)
    if source and not any(dims or ()):
        raise InvalidValueError(
            f"array {name!r} has no dimension names, so chunks={dict(chunks)} cannot apply to "
            f"it: give a shape of {len(source)} sizes instead"
        )
    return tuple(int(chunks.get(d, c)) for d, c in zip(dims, source, strict=True))


def _read_v2(meta: Any, attrs: dict[str, Any], xarray_group: bool) -> _Source:
    """A zarr v2 array: one object per chunk; xarray keeps its dimension names in the
    attributes (taken out of ``attrs``: v3 has a field for them)."""
    dtype = np.dtype(meta.dtype.to_native_dtype())
    chunks = SourceChunks(tuple(int(c) for c in meta.chunks), meta.dimension_separator or ".", "")
    fill = meta.fill_value
    dims = attrs.pop(XARRAY_DIMS, None)
    if xarray_group and dims is not None and fill is not None:
        # xarray masks a v2 array's fill value; in v3 it reads the mask from _FillValue
        attrs["_FillValue"] = _fill_attr(fill, dtype)
    if isinstance(fill, np.generic):
        fill = fill.item()
    return _Source(dtype, dims, fill, attrs, chunks, _v2_chain(meta, dtype))


def _read_v3(meta: Any, attrs: dict[str, Any], src_path: str) -> _Source:
    """A zarr v3 array: one object per chunk, or inner chunks of shards (their index read by
    the copy when the sharding codec is one shardwise reads)."""
    from zarr.codecs import ShardingCodec

    from ..codec.metadata import shard_codec_from_zarr

    dtype = np.dtype(meta.data_type.to_native_dtype())
    fill = meta.fill_value
    enc = meta.chunk_key_encoding
    v2_keys = type(enc).__name__.startswith("V2")
    sep, prefix = enc.separator, "" if v2_keys else "c"
    codecs = tuple(meta.codecs)
    grid = getattr(meta.chunk_grid, "chunk_shape", None)
    shapes = getattr(meta.chunk_grid, "chunk_shapes", None)  # rectilinear: extents per axis
    if grid is None and shapes is None:
        raise PlanError(
            f"array {src_path or '/'!r} has a {type(meta.chunk_grid).__name__} chunk grid: "
            "shardwise converts regular and rectilinear chunk grids"
        )
    rect = grid is None
    sizes: Any = shapes if rect else grid
    outer = tuple(int(x) if isinstance(x, int) else tuple(int(v) for v in x) for x in sizes)
    stand_in = tuple(x if isinstance(x, int) else max(x) for x in outer)
    if not (len(codecs) == 1 and isinstance(codecs[0], ShardingCodec)):
        chunks = SourceChunks(stand_in, sep, prefix, rectilinear=rect)
        return _Source(dtype, meta.dimension_names, fill, attrs, chunks, _v3_chain(codecs), outer)
    sc = codecs[0]
    chain = _v3_chain(sc.codecs)
    try:
        scodec = shard_codec_from_zarr(sc, stand_in, meta.data_type, fill)
    except Exception as e:  # an index the copy cannot read: decode instead
        chain = f"source shard index: {e}"
        scodec = None
    inner = tuple(int(x) for x in sc.chunk_shape)
    chunks = SourceChunks(inner, sep, prefix, scodec, rectilinear=rect)
    return _Source(dtype, meta.dimension_names, fill, attrs, chunks, chain, outer)


def _method(src: _Source, inner: tuple[int, ...], compressors: Any) -> tuple[Method, str]:
    """Copy the encoded chunks when they already are valid inner chunks of the target, else
    re-encode; with the reason."""
    if isinstance(src.chain, str):
        return "reencode", src.chain
    if inner != src.chunks.chunk_shape:
        return "reencode", f"inner chunks {inner} differ from the source's {src.chunks.chunk_shape}"
    if compressors is not None:
        return "reencode", "other compressors asked for"
    return "copy", "same inner chunks and an equivalent codec chain: encoded chunks copied"


def _create_kwargs(
    src: _Source,
    shape: tuple[int, ...],
    inner: tuple[int, ...],
    shard_shape: tuple[int, ...] | None,
    dim_names: tuple[str, ...] | None,
    compressors: Any,
) -> dict[str, Any]:
    """The target's ``zarr.create_array`` keywords: the source's codec chain where the target
    can declare it, ``compressors`` when given."""
    create: dict[str, Any] = dict(
        shape=shape,
        dtype=src.dtype,
        chunks=inner,
        shards=shard_shape,
        fill_value=src.fill,
        dimension_names=dim_names,
        attributes=src.attrs or None,
        zarr_format=3,
    )
    if not isinstance(src.chain, str):
        filters, serializer, comps = src.chain
        create.update(filters=filters or None, serializer=serializer)
        create["compressors"] = (comps or None) if compressors is None else compressors
    elif compressors is not None:
        create["compressors"] = compressors
    return create
