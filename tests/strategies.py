"""Hypothesis strategies for sharded arrays, reusable by every test module.

The building blocks:

* :func:`geometries` -- array shape (1-D to 4-D) with an inner chunk shape and a shard shape that
  is a whole multiple of it; sizes are bounded so one example stays in the milliseconds.
* :func:`dtypes`, :func:`fill_values` -- ints, uints, floats, complex and bool; fill values include
  NaN, -0.0 and the infinities.
* :func:`arrays` -- data for a geometry: a seeded mix of random values, inner chunks that are
  entirely the fill value, and "look-alike" chunks (-0.0 for a 0.0 fill, NaN with another payload
  for a NaN fill, one element off for the rest) that must be stored.
* :func:`dask_chunkings` -- dask chunks for a shape: equal to the shards, inner-sized, whole,
  larger than a shard, misaligned, irregular, mixed per dimension.
* :func:`codec_chains` -- :class:`Chain`: transpose, bytes endian, zstd/blosc/gzip/crc32c
  combinations, index location and index codecs, nested sharding.
* :func:`selections` -- basic sub-selections (slices with steps, integers); :func:`regions`
  -- boxes inside a shape (write regions).

Plus :func:`examples`, per-test example counts that scale with the hypothesis profile, and
:func:`write`, which writes a drawn :class:`Case` with shardwise. The oracles that judge the
results (bit-exact comparison, the expected stored chunks, a shard index read from first
principles) are in ``oracles.py``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

# the max_examples of the "shardwise" profile (tests/conftest.py); :func:`examples` scales from it
BASE_EXAMPLES = 50


def examples(n: int) -> settings:
    """Settings for ``n`` examples under the default profile, scaled with the active profile.

    ``HYPOTHESIS_PROFILE=thorough`` (10x max_examples) gives such a test 10x ``n`` examples.
    """
    scaled = round(n * settings.default.max_examples / BASE_EXAMPLES)
    return settings(max_examples=max(1, scaled))


# -- dtypes and fill values ------------------------------------------------------------------------

INT_DTYPES = tuple(np.dtype(t) for t in ("int8", "int16", "int32", "int64"))
UINT_DTYPES = tuple(np.dtype(t) for t in ("uint8", "uint16", "uint32", "uint64"))
FLOAT_DTYPES = tuple(np.dtype(t) for t in ("float16", "float32", "float64"))
COMPLEX_DTYPES = tuple(np.dtype(t) for t in ("complex64", "complex128"))
BOOL_DTYPES = (np.dtype("bool"),)
ALL_DTYPES = INT_DTYPES + UINT_DTYPES + FLOAT_DTYPES + COMPLEX_DTYPES + BOOL_DTYPES


def dtypes(choices: Sequence[np.dtype[Any]] = ALL_DTYPES) -> st.SearchStrategy[np.dtype[Any]]:
    return st.sampled_from(tuple(choices))


def _uint_for(dtype: np.dtype[Any]) -> np.dtype[Any]:
    return np.dtype(f"u{dtype.itemsize}")


def nan_with_payload(dtype: np.dtype[Any], payload: int = 1, negative: bool = False) -> Any:
    """A quiet NaN of a float ``dtype`` whose bits differ from numpy's canonical NaN."""
    bits = {2: (10, 16), 4: (23, 32), 8: (52, 64)}[dtype.itemsize]
    mant, width = bits
    exp_all = ((1 << (width - mant - 1)) - 1) << mant
    value = exp_all | (1 << (mant - 1)) | payload
    if negative:
        value |= 1 << (width - 1)
    return np.array([value], dtype=_uint_for(dtype)).view(dtype)[0]


@st.composite
def fill_values(draw: st.DrawFn, dtype: np.dtype[Any]) -> Any:
    """A fill value for ``dtype`` as zarr accepts it (python scalar)."""
    kind = dtype.kind
    if kind == "b":
        return draw(st.booleans())
    if kind in "iu":
        info = np.iinfo(dtype)
        return draw(st.sampled_from([0, 0, int(info.min), int(info.max), 7]))
    if kind == "f":
        return draw(st.sampled_from([0.0, 0.0, -0.0, math.nan, math.inf, -math.inf, 1.5]))
    if kind == "c":
        return draw(st.sampled_from([0j, 0j, complex(-0.0, 0.0), complex(math.nan, 0.0), 1 - 2j]))
    raise AssertionError(f"no fill values for {dtype}")


def fill_array(shape: Sequence[int], dtype: np.dtype[Any], fill: Any) -> np.ndarray:
    return np.full(tuple(shape), fill, dtype=dtype)


# -- geometry --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Geometry:
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    shard_shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def shard_grid(self) -> tuple[int, ...]:
        return tuple(-(-n // s) for n, s in zip(self.shape, self.shard_shape, strict=True))

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return tuple(s // c for s, c in zip(self.shard_shape, self.chunk_shape, strict=True))


# per ndim: (largest inner chunk edge, most inner chunks per shard edge, most inner chunks along
# the array edge); keeps every example below ~150 inner chunks
_LIMITS = {1: (6, 4, 24), 2: (4, 3, 9), 3: (3, 3, 5), 4: (2, 2, 3)}


@st.composite
def geometries(draw: st.DrawFn, min_ndim: int = 1, max_ndim: int = 4) -> Geometry:
    """Shape, inner chunk shape and shard shape; the shape often ends inside a shard."""
    ndim = draw(st.integers(min_ndim, max_ndim))
    max_c, max_k, max_m = _LIMITS[ndim]
    shape, chunks, shards = [], [], []
    for _ in range(ndim):
        c = draw(st.integers(1, max_c))
        k = draw(st.integers(1, max_k))
        m = draw(st.integers(1, max_m))  # inner chunks along this edge (the last may be partial)
        n = (m - 1) * c + draw(st.integers(1, c))
        shape.append(n)
        chunks.append(c)
        shards.append(c * k)
    return Geometry(tuple(shape), tuple(chunks), tuple(shards))


# -- dask chunkings --------------------------------------------------------------------------------

ChunkKind = Literal["shard", "inner", "whole", "larger", "misaligned", "irregular", "ones"]
CHUNK_KINDS: tuple[ChunkKind, ...] = (
    "shard",
    "inner",
    "whole",
    "larger",
    "misaligned",
    "irregular",
    "ones",
)


def _regular(n: int, size: int, first: int | None = None) -> tuple[int, ...]:
    out = []
    left = n
    if first is not None and first < n:
        out.append(first)
        left -= first
    while left > 0:
        out.append(min(size, left))
        left -= out[-1]
    return tuple(out)


@st.composite
def dim_chunks(draw: st.DrawFn, n: int, shard: int, inner: int) -> tuple[int, ...]:
    """Dask chunks along one dimension of length ``n``."""
    kind = draw(st.sampled_from(CHUNK_KINDS))
    if kind == "shard":
        return _regular(n, shard)
    if kind == "inner":
        return _regular(n, inner)
    if kind == "whole":
        return (n,)
    if kind == "larger":
        return _regular(n, shard + draw(st.integers(1, 2 * shard)))
    if kind == "misaligned":
        return _regular(n, shard, first=draw(st.integers(1, max(1, shard - 1))))
    if kind == "ones":
        return _regular(n, 1)
    cuts = draw(st.sets(st.integers(1, max(1, n - 1)), max_size=min(6, n - 1))) if n > 1 else set()
    edges = [0, *sorted(cuts), n]
    return tuple(b - a for a, b in itertools.pairwise(edges) if b > a)


@st.composite
def dask_chunkings(draw: st.DrawFn, geometry: Geometry) -> tuple[tuple[int, ...], ...]:
    """Dask chunks for ``geometry.shape``; each dimension picks its own kind of chunking."""
    return tuple(
        draw(dim_chunks(n, s, c))
        for n, s, c in zip(geometry.shape, geometry.shard_shape, geometry.chunk_shape, strict=True)
    )


# -- data ------------------------------------------------------------------------------------------


def _random_values(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> np.ndarray:
    kind = dtype.kind
    if kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(int(info.min), int(info.max), size=shape, dtype=dtype, endpoint=True)
    if kind == "f":
        out = (rng.standard_normal(shape) * 100).astype(dtype)
        specials = [np.nan, -0.0, 0.0, np.inf, -np.inf, nan_with_payload(dtype, 3)]
        mask = rng.random(shape) < 0.05
        out[mask] = rng.choice(np.array(specials, dtype=dtype), size=int(mask.sum()))
        return out
    if kind == "c":
        part = np.dtype(f"f{dtype.itemsize // 2}")
        re = _random_values(rng, shape, part)
        im = _random_values(rng, shape, part)
        out = np.empty(shape, dtype=dtype)
        out.real, out.imag = re, im
        return out
    raise AssertionError(f"no values for {dtype}")


def look_alike(dtype: np.dtype[Any], fill: Any) -> Any:
    """A value equal to ``fill`` by ``==`` or NaN-ness but with other bits (None if there is none).

    -0.0 for 0.0 (and back), a NaN with another payload and sign for NaN; for complex the same
    on the real part.
    """
    if dtype.kind not in "fc":
        return None
    out = np.array(fill, dtype=dtype)
    part = out.real if dtype.kind == "c" else out
    if np.isnan(part):
        new = nan_with_payload(part.dtype, 5, negative=True)
    elif part == 0:
        new = np.negative(part)
    else:
        return None
    if dtype.kind == "c":
        out.real = new
    else:
        out[()] = new
    return out[()]


@st.composite
def arrays(draw: st.DrawFn, geometry: Geometry, dtype: np.dtype[Any], fill: Any) -> np.ndarray:
    """Data for ``geometry``: random values, all-fill inner chunks and look-alike chunks.

    Each inner chunk is, at random, data, all fill value (must not be stored), all fill but one
    element (must be stored), or filled with a bit-different look-alike of the fill value such as
    -0.0 or a NaN with another payload (must be stored: comparison is bit-exact).
    """
    seed = draw(st.integers(0, 2**32 - 1))
    p_fill = draw(st.sampled_from([0.0, 0.3, 0.6, 0.9, 1.0]))
    rng = np.random.default_rng(seed)
    shape = geometry.shape
    out = _random_values(rng, shape, dtype)
    grid = tuple(-(-n // c) for n, c in zip(shape, geometry.chunk_shape, strict=True))
    p_rest = (1.0 - p_fill) / 3
    states = rng.choice(4, size=grid, p=[p_rest, p_fill, p_rest, p_rest])
    fill_v = np.asarray(fill, dtype=dtype)
    alike = look_alike(dtype, fill)
    for idx in np.ndindex(*grid):
        state = states[idx]
        if state == 0:
            continue
        region = tuple(
            slice(i * c, min((i + 1) * c, n))
            for i, c, n in zip(idx, geometry.chunk_shape, shape, strict=True)
        )
        if state == 1 or (state == 3 and alike is None):
            out[region] = fill_v
            if state == 3:  # no look-alike for this fill: one element off instead
                first = tuple(r.start for r in region)
                out[first] = _other_than(dtype, fill_v)
        elif state == 2:
            out[region] = fill_v
            last = tuple(r.stop - 1 for r in region)
            out[last] = _other_than(dtype, fill_v)
        else:
            out[region] = alike
    return out


def _other_than(dtype: np.dtype[Any], fill: np.ndarray) -> Any:
    if dtype.kind == "b":
        return not bool(fill)
    if dtype.kind in "iu":
        return fill ^ np.asarray(1, dtype=dtype)
    return np.asarray(2.5 if fill != 2.5 else 3.5, dtype=dtype)


# -- codec chains ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chain:
    """An inner codec chain plus the shard index settings, as plain values (readable in repr).

    ``compressors`` holds ``(name, config)`` pairs among zstd, blosc, gzip and crc32c, applied in
    order after the serializer. ``nested`` is the chunk shape of a nested sharding codec used as
    the serializer (its own inner chain is ``bytes`` + the compressors). Non-default index codecs
    (``index_endian`` big or no ``index_crc``) can only be created through a sharding codec given
    as the serializer of an unsharded array (:meth:`zarr_kwargs` handles both forms).
    """

    transpose: tuple[int, ...] | None = None
    endian: Literal["little", "big"] = "little"
    compressors: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    index_location: Literal["start", "end"] = "end"
    index_endian: Literal["little", "big"] = "little"
    index_crc: bool = True
    nested: tuple[int, ...] | None = None

    @property
    def default_index(self) -> bool:
        return self.index_endian == "little" and self.index_crc

    def compressor_codecs(self) -> list[Any]:
        from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

        make = {"zstd": ZstdCodec, "blosc": BloscCodec, "gzip": GzipCodec, "crc32c": Crc32cCodec}
        return [make[name](**dict(cfg)) for name, cfg in self.compressors]

    def serializer(self) -> Any:
        from zarr.codecs import BytesCodec, ShardingCodec

        if self.nested is None:
            return BytesCodec(endian=self.endian)
        return ShardingCodec(
            chunk_shape=self.nested,
            codecs=[BytesCodec(endian=self.endian), *self.compressor_codecs()],
        )

    def filters(self) -> list[Any]:
        from zarr.codecs import TransposeCodec

        return [] if self.transpose is None else [TransposeCodec(order=self.transpose)]

    def zarr_kwargs(self, geometry: Geometry) -> dict[str, Any]:
        """Keywords for ``zarr.create_array`` (and, when :attr:`default_index`, ``write_array``)."""
        from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

        compressors = [] if self.nested is not None else self.compressor_codecs()
        if self.default_index:
            return dict(
                chunks=geometry.chunk_shape,
                shards={"shape": geometry.shard_shape, "index_location": self.index_location},
                filters=self.filters(),
                serializer=self.serializer(),
                compressors=compressors,
            )
        index = [BytesCodec(endian=self.index_endian)] + ([Crc32cCodec()] if self.index_crc else [])
        sharding = ShardingCodec(
            chunk_shape=geometry.chunk_shape,
            codecs=[*self.filters(), self.serializer(), *compressors],
            index_codecs=index,
            index_location=self.index_location,
        )
        return dict(
            chunks=geometry.shard_shape,
            shards=None,
            filters=[],
            serializer=sharding,
            compressors=[],
        )


_COMPRESSORS = st.one_of(
    st.builds(
        lambda level, checksum: ("zstd", (("level", level), ("checksum", checksum))),
        st.integers(-3, 7),
        st.booleans(),
    ),
    st.builds(
        lambda cname, clevel, shuffle: (
            "blosc",
            (("cname", cname), ("clevel", clevel), ("shuffle", shuffle)),
        ),
        st.sampled_from(["lz4", "zstd", "blosclz", "zlib"]),
        st.integers(0, 9),
        st.sampled_from(["noshuffle", "shuffle", "bitshuffle"]),
    ),
    st.builds(lambda level: ("gzip", (("level", level),)), st.integers(0, 9)),
    st.just(("crc32c", ())),
)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def codec_chains(
    draw: st.DrawFn,
    geometry: Geometry,
    *,
    index_codecs: bool = True,
    nested: bool = False,
) -> Chain:
    """A codec chain valid for ``geometry``.

    ``index_codecs``: also vary the index codecs (big endian, no crc32c). ``nested``: the
    serializer is a nested sharding codec (then no bytes-to-bytes codec follows it at the outer
    level, which tensorstore rejects; the compressors go inside).
    """
    ndim = geometry.ndim
    transpose = None
    if ndim > 1 and draw(st.booleans()):
        transpose = tuple(draw(st.permutations(range(ndim))))
    comps = draw(st.lists(_COMPRESSORS, max_size=3))
    nested_shape = None
    if nested:
        stored = geometry.chunk_shape
        if transpose is not None:
            stored = tuple(stored[i] for i in transpose)
        nested_shape = tuple(draw(st.sampled_from(_divisors(c))) for c in stored)
    index_endian: Literal["little", "big"] = "little"
    index_crc = True
    if index_codecs:
        index_endian = draw(st.sampled_from(["little", "big"]))
        index_crc = draw(st.booleans())
    return Chain(
        transpose=transpose,
        endian=draw(st.sampled_from(["little", "big"])),
        compressors=tuple(comps),
        index_location=draw(st.sampled_from(["start", "end"])),
        index_endian=index_endian,
        index_crc=index_crc,
        nested=nested_shape,
    )


# -- selections ------------------------------------------------------------------------------------


@st.composite
def selections(draw: st.DrawFn, shape: Sequence[int]) -> tuple[Any, ...]:
    """A basic selection: per dimension a slice (step 1..3) or an integer."""
    out: list[Any] = []
    for n in shape:
        if draw(st.integers(0, 4)) == 0:
            out.append(draw(st.integers(-n, n - 1)))
            continue
        start = draw(st.integers(0, n - 1))
        stop = draw(st.integers(start + 1, n))
        out.append(slice(start, stop, draw(st.integers(1, 3))))
    return tuple(out)


@st.composite
def regions(draw: st.DrawFn, shape: Sequence[int], allow_empty: bool = True) -> tuple[slice, ...]:
    """A box inside ``shape``: one ``slice(start, stop)`` per dimension (step 1)."""
    out = []
    for n in shape:
        start = draw(st.integers(0, n if allow_empty else n - 1))
        stop = draw(st.integers(start if allow_empty else start + 1, n))
        out.append(slice(start, stop))
    return tuple(out)


# -- whole cases -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One array to write: geometry, dtype, fill value, data and a codec chain."""

    geometry: Geometry
    dtype: np.dtype[Any]
    fill_value: Any
    data: np.ndarray
    chain: Chain

    def __repr__(self) -> str:  # the data is reproducible from the seed; keep failures readable
        return (
            f"Case({self.geometry}, dtype={self.dtype}, fill_value={self.fill_value!r}, "
            f"chain={self.chain}, data=<{self.data.dtype} {self.data.shape}>)"
        )


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    dtype_choices: Sequence[np.dtype[Any]] = ALL_DTYPES,
    index_codecs: bool = True,
    nested: bool = False,
    max_ndim: int = 4,
) -> Case:
    geometry = draw(geometries(max_ndim=max_ndim))
    dtype = draw(dtypes(dtype_choices))
    fill = draw(fill_values(dtype))
    data = draw(arrays(geometry, dtype, fill))
    chain = draw(codec_chains(geometry, index_codecs=index_codecs, nested=nested))
    return Case(geometry, dtype, fill, data, chain)


def write(case: Case, store: Any, chunks: Any, **options: Any) -> Any:
    """Write ``case`` with shardwise from a dask array with ``chunks``.

    Default index codecs: shardwise creates the array from the same keywords as
    ``zarr.create_array``. Other index codecs can only be expressed as an unsharded array whose
    serializer is a sharding codec, so zarr-python creates the metadata and shardwise writes the
    data into it (``mode="r+"``).
    """
    import dask.array as da
    import zarr

    import shardwise

    source = da.from_array(case.data, chunks=chunks)
    kwargs = case.chain.zarr_kwargs(case.geometry)
    if case.chain.default_index:
        return shardwise.write_array(source, store, fill_value=case.fill_value, **kwargs, **options)
    zarr.create_array(
        store, shape=case.geometry.shape, dtype=case.dtype, fill_value=case.fill_value, **kwargs
    )
    return shardwise.write_array(source, store, mode="r+", **options)
