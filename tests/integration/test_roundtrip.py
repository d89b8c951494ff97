"""Round trips with independent readers as oracles.

* written by ``shardwise.write_array`` from dask arrays of random chunkings, read back by
  zarr-python, tensorstore and shardwise: bit-exact equal to the input;
* written by zarr-python, read by ``shardwise.open_array`` (whole and random sub-selections,
  default and user chunks): bit-exact equal to what zarr-python reads;
* the stored inner chunks are exactly the non-fill ones (bit-exact: -0.0 and NaN payloads are
  data), or all in-array chunks with ``write_empty_chunks=True``; shards pack their chunks tightly;
* same input, same bytes, whatever the dask chunking and thread count;
* region writes merged into shards zarr-python wrote (shards outside the region untouched);
* nested sharding both ways, MemoryStore, edge shards past the array end, zero-length
  dimensions, chunk key encodings.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from zarr.storage import MemoryStore

import shardwise
from golden.make_golden import stored_objects
from oracles import assert_bit_equal, expected_stored, parse_index
from strategies import (
    FLOAT_DTYPES,
    Case,
    Chain,
    Geometry,
    arrays,
    cases,
    dask_chunkings,
    examples,
    geometries,
    nan_with_payload,
    regions,
    selections,
    write,
)

MISSING = np.uint64(2**64 - 1)
NESTED_WARNING = "ignore:Combining a `sharding_indexed` codec:UserWarning"


# -- helpers ---------------------------------------------------------------------------------------


def shard_key(coord: tuple[int, ...]) -> str:
    return "/".join(["c", *map(str, coord)])


def check_stored_chunks(
    root: Path, case: Case, report: shardwise.WriteReport, *, write_empty_chunks: bool
) -> None:
    """The shard objects hold exactly the expected inner chunks, tightly packed in C order."""
    want = expected_stored(
        case.data, case.geometry, case.fill_value, write_empty_chunks=write_empty_chunks
    )
    files = stored_objects(root)
    assert sorted(files) == sorted(shard_key(s) for s in want)
    chain, cps = case.chain, case.geometry.chunks_per_shard
    index_nbytes = 16 * math.prod(cps) + (4 if chain.index_crc else 0)
    for coord, grid in want.items():
        blob = files[shard_key(coord)]
        offsets, nbytes = parse_index(blob, chain, cps)
        stored = offsets != MISSING
        assert ((nbytes != MISSING) == stored).all(), "half-empty index entry"
        assert (stored == grid).all(), f"shard {coord}: stored {stored}, expected {grid}"
        o, n = offsets[stored].ravel(), nbytes[stored].ravel()  # C order
        start = index_nbytes if chain.index_location == "start" else 0
        assert o[0] == start
        assert (o[1:] == o[:-1] + n[:-1]).all(), "inner chunks not packed in C order"
        assert len(blob) == index_nbytes + int(n.sum())
    assert report.shards_written == len(want)
    assert report.chunks_stored == sum(int(g.sum()) for g in want.values())
    assert report.bytes_stored == sum(len(b) for b in files.values())


# -- shardwise writes, three readers ---------------------------------------------------------------


@examples(60)
@given(data=st.data(), write_empty_chunks=st.booleans(), threads=st.sampled_from([None, 1, 2]))
def test_written_by_shardwise_read_by_zarr_and_tensorstore(
    data: st.DataObject,
    write_empty_chunks: bool,
    threads: int | None,
    fresh_dir: Any,
    read_zarr: Any,
    read_tensorstore: Any,
) -> None:
    case = data.draw(cases(), label="case")
    chunks = data.draw(dask_chunkings(case.geometry), label="dask chunks")
    root = fresh_dir()
    report = write(case, str(root), chunks, write_empty_chunks=write_empty_chunks, threads=threads)

    assert_bit_equal(read_zarr(str(root)), case.data, "zarr-python")
    assert_bit_equal(read_tensorstore(root), case.data, "tensorstore")
    assert_bit_equal(shardwise.open_array(str(root)).compute(), case.data, "shardwise")
    check_stored_chunks(root, case, report, write_empty_chunks=write_empty_chunks)


@examples(25)
@given(case=cases(index_codecs=False, max_ndim=3), data=st.data())
def test_memory_store_round_trip(case: Case, data: st.DataObject, read_zarr: Any) -> None:
    store = MemoryStore()
    chunks = data.draw(dask_chunkings(case.geometry), label="dask chunks")
    write(case, store, chunks)
    assert_bit_equal(read_zarr(store), case.data, "zarr-python")
    assert_bit_equal(shardwise.open_array(store).compute(), case.data, "shardwise")


# -- zarr-python writes, shardwise reads -----------------------------------------------------------


@examples(60)
@given(
    case=cases(),
    data=st.data(),
    write_empty_chunks=st.booleans(),
    in_memory=st.booleans(),
)
def test_written_by_zarr_read_by_shardwise(
    case: Case,
    data: st.DataObject,
    write_empty_chunks: bool,
    in_memory: bool,
    fresh_dir: Any,
) -> None:
    store: Any = MemoryStore() if in_memory else str(fresh_dir())
    z = zarr.create_array(
        store,
        shape=case.geometry.shape,
        dtype=case.dtype,
        fill_value=case.fill_value,
        config={"write_empty_chunks": write_empty_chunks},
        **case.chain.zarr_kwargs(case.geometry),
    )
    z[...] = case.data
    oracle = zarr.open_array(store, mode="r")
    want = oracle[...]
    # zarr-python compares chunks to the fill value by value (-0.0 == 0.0, NaN == NaN), so it
    # may drop look-alike chunks: the oracle is what zarr-python reads back, and that must
    # still equal the input by value
    assert np.array_equal(want, case.data, equal_nan=case.dtype.kind in "fc")

    assert_bit_equal(shardwise.open_array(store).compute(), want, "whole array")
    sel = data.draw(selections(case.geometry.shape), label="selection")
    assert_bit_equal(shardwise.open_array(store)[sel].compute(), oracle[sel], f"selection {sel}")
    user_chunks = data.draw(dask_chunkings(case.geometry), label="user chunks")
    got = shardwise.open_array(store, chunks=user_chunks)
    assert got.chunks == user_chunks
    assert_bit_equal(got[sel].compute(), oracle[sel], f"user chunks, selection {sel}")


@examples(40)
@given(case=cases(max_ndim=3), data=st.data())
def test_region_write_into_a_zarr_written_array(
    case: Case, data: st.DataObject, fresh_dir: Any, read_zarr: Any, read_tensorstore: Any
) -> None:
    """shardwise merges a region into shards zarr-python wrote (its Morton chunk order)."""
    root = fresh_dir()
    g = case.geometry
    z = zarr.create_array(
        str(root),
        shape=g.shape,
        dtype=case.dtype,
        fill_value=case.fill_value,
        **case.chain.zarr_kwargs(g),
    )
    z[...] = case.data
    before = stored_objects(root)
    want = read_zarr(str(root))

    region = data.draw(regions(g.shape, allow_empty=False), label="region")
    extent = tuple(r.stop - r.start for r in region)
    part = Geometry(extent, g.chunk_shape, g.shard_shape)
    values = data.draw(arrays(part, case.dtype, case.fill_value), label="values")
    chunks = data.draw(dask_chunkings(part), label="dask chunks")
    rep = shardwise.write_array(
        da.from_array(values, chunks=chunks), str(root), mode="r+", region=region
    )
    want[region] = values
    assert_bit_equal(read_zarr(str(root)), want, "zarr-python")
    assert_bit_equal(read_tensorstore(root), want, "tensorstore")
    assert_bit_equal(shardwise.open_array(str(root)).compute(), want, "shardwise")

    # shards outside the region keep their bytes; each touched shard was one task
    touched = {
        shard_key(s)
        for s in np.ndindex(*g.shard_grid)
        if all(
            r.start < (i + 1) * e and r.stop > i * e
            for i, e, r in zip(s, g.shard_shape, region, strict=True)
        )
    }
    after = stored_objects(root)
    for key, blob in before.items():
        if key not in touched:
            assert after.get(key) == blob, f"{key} changed outside the region"
    assert set(rep.keys) <= touched
    assert rep.shards_written + rep.shards_empty == len(touched)


# -- nested sharding -------------------------------------------------------------------------------


@pytest.mark.filterwarnings(NESTED_WARNING)
@examples(30)
@given(case=cases(index_codecs=False, nested=True, max_ndim=3), data=st.data())
def test_nested_sharding_both_ways(
    case: Case, data: st.DataObject, fresh_dir: Any, read_zarr: Any, read_tensorstore: Any
) -> None:
    # shardwise writes nested shards: zarr-python and tensorstore read them
    chunks = data.draw(dask_chunkings(case.geometry), label="dask chunks")
    root = fresh_dir()
    write(case, str(root), chunks)
    assert_bit_equal(read_zarr(str(root)), case.data, "zarr-python")
    assert_bit_equal(read_tensorstore(root), case.data, "tensorstore")
    assert_bit_equal(shardwise.open_array(str(root)).compute(), case.data, "shardwise")

    # zarr-python writes nested shards: shardwise reads them, whole and in part
    root2 = fresh_dir()
    z = zarr.create_array(
        str(root2),
        shape=case.geometry.shape,
        dtype=case.dtype,
        fill_value=case.fill_value,
        **case.chain.zarr_kwargs(case.geometry),
    )
    z[...] = case.data
    want = z[...]
    assert_bit_equal(shardwise.open_array(str(root2)).compute(), want, "zarr-written, whole")
    sel = data.draw(selections(case.geometry.shape), label="selection")
    got = shardwise.open_array(str(root2))[sel].compute()
    assert_bit_equal(got, z[sel], f"zarr-written, selection {sel}")


# -- determinism -----------------------------------------------------------------------------------


@examples(40)
@given(case=cases(), data=st.data())
def test_same_input_same_bytes(case: Case, data: st.DataObject, fresh_dir: Any) -> None:
    """The stored bytes depend on the data and metadata only, not on chunking or threads."""
    runs = []
    for threads in (1, None):
        chunks = data.draw(dask_chunkings(case.geometry), label="dask chunks")
        root = fresh_dir()
        write(case, str(root), chunks, threads=threads)
        runs.append(stored_objects(root))
    assert runs[0].keys() == runs[1].keys()
    for key in runs[0]:
        assert runs[0][key] == runs[1][key], f"{key} differs between runs"


@examples(40)
@given(
    geometry=geometries(max_ndim=1),
    dtype=st.sampled_from([np.dtype(t) for t in ("u1", "i2", "f4", "c8", "?")]),
    data=st.data(),
)
def test_one_dimensional_shards_match_zarr_python_bytes(
    geometry: Geometry, dtype: np.dtype[Any], data: st.DataObject, fresh_dir: Any
) -> None:
    """In 1-D zarr-python also stores inner chunks in C order: the shards are byte-identical.

    (In more dimensions zarr-python orders chunks along a Morton curve, so only the decoded
    values can be compared.)
    """
    from strategies import fill_values

    fill = data.draw(fill_values(dtype), label="fill")
    values = data.draw(arrays(geometry, dtype, fill), label="values")
    # zarr-python compares chunks with the fill value by value, shardwise bit for bit: replace
    # the look-alikes (-0.0 for 0.0, other NaNs for NaN) with the fill value itself
    values[_same_value(values, np.asarray(fill, dtype))] = fill
    chain = data.draw(
        st.builds(
            Chain,
            endian=st.sampled_from(["little", "big"]),
            compressors=st.sampled_from([(), (("crc32c", ()),)]),
            index_location=st.sampled_from(["start", "end"]),
        ),
        label="chain",
    )
    case = Case(geometry, dtype, fill, values, chain)
    ours, theirs = fresh_dir(), fresh_dir()
    write(case, str(ours), data.draw(dask_chunkings(geometry), label="dask chunks"))
    z = zarr.create_array(
        str(theirs),
        shape=geometry.shape,
        dtype=dtype,
        fill_value=fill,
        **chain.zarr_kwargs(geometry),
    )
    z[...] = values
    assert stored_objects(ours) == stored_objects(theirs)


def _same_value(x: np.ndarray, fill: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        # zarr-python compares with numpy's equal_nan, for which complex values are equal when
        # both have a NaN in either component: (1+nanj) "equals" a (nan+0j) fill
        return (_same_value(x.real, fill.real) & _same_value(x.imag, fill.imag)) | (
            np.isnan(x) & np.isnan(fill)
        )
    if x.dtype.kind == "f":
        return (x == fill) | (np.isnan(x) & np.isnan(fill))
    return x == fill


# -- fill-value semantics, explicit ----------------------------------------------------------------


def _index_of(root: Path, key: str, nchunks: int) -> np.ndarray:
    blob = (root / key).read_bytes()
    offsets, _ = parse_index(blob, Chain(), (nchunks,))
    return offsets != MISSING


@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, np.dtype("complex64")])
def test_negative_zero_and_nan_payloads_are_data(
    dtype: np.dtype[Any], tmp_path: Path, read_zarr: Any, read_tensorstore: Any
) -> None:
    """Inner chunks are compared with the fill value bit for bit, as the spec asks."""
    part = np.zeros((), dtype).real.dtype
    for fill, twin in [
        (0.0, np.negative(np.zeros((), dtype))[()]),
        (-0.0, np.zeros((), dtype)[()]),
        (math.nan, nan_with_payload(part, 7)),
    ]:
        x = np.full(12, fill, dtype=dtype)  # chunk 0: the fill value itself
        x[4:8] = twin  # chunk 1: a bit-different twin of the fill value
        x[8:12] = fill
        x[11] = twin  # chunk 2: fill but one element
        root = tmp_path / f"fill{fill}"
        rep = shardwise.write_array(x, str(root), chunks=(4,), shards=(12,), fill_value=fill)
        assert _index_of(root, "c/0", 3).tolist() == [False, True, True]
        assert rep.chunks_stored == 2 and rep.chunks_empty == 1
        for got, who in [
            (read_zarr(str(root)), "zarr-python"),
            (read_tensorstore(root), "tensorstore"),
            (shardwise.open_array(str(root)).compute(), "shardwise"),
        ]:
            assert_bit_equal(got, x, f"{who}, fill {fill}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_fill_value_nan_with_payload(
    dtype: np.dtype[Any], tmp_path: Path, read_zarr: Any, read_tensorstore: Any
) -> None:
    """zarr.json spells any NaN fill value "NaN": chunks of the payload NaN the caller gave are
    data to every reader, so they must be stored (comparing with the caller's NaN loses them)."""
    fill = nan_with_payload(dtype, 1)
    x = np.full(8, fill, dtype=dtype)
    x[:4] = 1
    rep = shardwise.write_array(x, str(tmp_path), chunks=(4,), shards=(8,), fill_value=fill)
    assert rep.chunks_stored == 2
    for got, who in [
        (read_zarr(str(tmp_path)), "zarr-python"),
        (read_tensorstore(tmp_path), "tensorstore"),
        (shardwise.open_array(str(tmp_path)).compute(), "shardwise"),
    ]:
        assert_bit_equal(got, x, who)


def test_write_empty_chunks_stores_in_array_chunks_only(
    tmp_path: Path, read_zarr: Any, read_tensorstore: Any
) -> None:
    x = np.zeros((10, 7), dtype="i2")
    for flag in (False, True):
        root = tmp_path / str(flag)
        rep = shardwise.write_array(
            x, str(root), chunks=(2, 2), shards=(4, 4), write_empty_chunks=flag
        )
        files = stored_objects(root)
        if not flag:
            assert files == {} and rep.shards_written == 0 and rep.shards_empty == 6
        else:
            assert sorted(files) == sorted(shard_key(s) for s in np.ndindex(3, 2))
            # the edge shard (2, 1) covers rows 8..9 and columns 4..6: two of its four chunks
            offsets, _ = parse_index(files["c/2/1"], Chain(), (2, 2))
            assert (offsets != MISSING).tolist() == [[True, True], [False, False]]
            assert rep.chunks_stored == 5 * 4
        assert_bit_equal(read_zarr(str(root)), x, "zarr-python")
        assert_bit_equal(read_tensorstore(root), x, "tensorstore")


def test_overwriting_with_fill_removes_shards(tmp_path: Path, read_zarr: Any) -> None:
    root = str(tmp_path / "a")
    x = np.arange(1, 65, dtype="f4").reshape(8, 8)
    shardwise.write_array(x, root, chunks=(2, 2), shards=(4, 4), fill_value=0.0)
    assert len(stored_objects(tmp_path / "a")) == 4
    y = x.copy()
    y[:4, :] = 0.0  # shards (0, 0) and (0, 1) become all fill
    rep = shardwise.write_array(da.from_array(y, chunks=3), root, mode="r+")
    assert sorted(stored_objects(tmp_path / "a")) == ["c/1/0", "c/1/1"]
    assert rep.shards_deleted == 2 and rep.shards_written == 2
    assert_bit_equal(read_zarr(root), y, "zarr-python")
    # a partial write of fill into a shard keeps the rest of it
    rep = shardwise.write_array(
        np.zeros((1, 4), "f4"), root, mode="r+", region=(slice(4, 5), slice(0, 4))
    )
    y[4, :4] = 0.0
    assert rep.shards_written == 1 and sorted(stored_objects(tmp_path / "a")) == ["c/1/0", "c/1/1"]
    assert_bit_equal(read_zarr(root), y, "zarr-python after a partial write")


@pytest.mark.parametrize(
    ("shape", "shards", "chunks"),
    [((10,), (4,), (2,)), ((9, 7), (6, 4), (3, 2)), ((5, 3, 6), (4, 2, 4), (2, 1, 2))],
)
def test_edge_shards_past_the_array_end(
    shape: tuple[int, ...],
    shards: tuple[int, ...],
    chunks: tuple[int, ...],
    tmp_path: Path,
    read_zarr: Any,
    read_tensorstore: Any,
) -> None:
    rng = np.random.default_rng(len(shape))
    x = rng.integers(1, 100, size=shape).astype("u2")  # no fill values: every in-array chunk
    geometry = Geometry(shape, chunks, shards)
    root = tmp_path / "a"
    rep = shardwise.write_array(da.from_array(x, chunks=3), str(root), chunks=chunks, shards=shards)
    case = Case(geometry, x.dtype, 0, x, Chain())
    check_stored_chunks(root, case, rep, write_empty_chunks=False)
    # chunks past the array end are never stored, even with write_empty_chunks
    want = expected_stored(x, geometry, 0, write_empty_chunks=True)
    assert rep.chunks_stored == sum(int(g.sum()) for g in want.values())
    assert rep.chunks_stored < math.prod(geometry.shard_grid) * math.prod(geometry.chunks_per_shard)
    assert_bit_equal(read_zarr(str(root)), x, "zarr-python")
    assert_bit_equal(read_tensorstore(root), x, "tensorstore")
    # zarr-python writing the same edge shards: shardwise reads them
    z = zarr.create_array(
        str(tmp_path / "z"), shape=shape, dtype=x.dtype, chunks=chunks, shards=shards
    )
    z[...] = x
    assert_bit_equal(shardwise.open_array(str(tmp_path / "z")).compute(), x, "shardwise")


@pytest.mark.parametrize("shape", [(0,), (0, 5), (6, 0), (3, 0, 2)])
@pytest.mark.parametrize("compute", [True, False])
def test_zero_length_dimensions(
    shape: tuple[int, ...], compute: bool, tmp_path: Path, read_zarr: Any, read_tensorstore: Any
) -> None:
    x = da.zeros(shape, dtype="f4", chunks=2)
    out = shardwise.write_array(
        x, str(tmp_path), chunks=(2,) * len(shape), shards=(4,) * len(shape), compute=compute
    )
    rep = out if compute else out.compute()
    assert rep.shards_written == 0 and stored_objects(tmp_path) == {}
    empty = np.zeros(shape, "f4")
    assert_bit_equal(read_zarr(str(tmp_path)), empty, "zarr-python")
    assert_bit_equal(read_tensorstore(tmp_path), empty, "tensorstore")
    assert_bit_equal(shardwise.open_array(str(tmp_path)).compute(), empty, "shardwise")


def test_zero_dimensional_array(tmp_path: Path, read_zarr: Any) -> None:
    shardwise.write_array(np.array(5.0), str(tmp_path), chunks=(), shards=())
    assert_bit_equal(read_zarr(str(tmp_path)), np.array(5.0), "zarr-python")
    assert_bit_equal(shardwise.open_array(str(tmp_path)).compute(), np.array(5.0), "shardwise")


@pytest.mark.parametrize(
    "encoding",
    [
        {"name": "default", "separator": "."},
        {"name": "v2", "separator": "."},
        {"name": "v2", "separator": "/"},
    ],
)
def test_chunk_key_encodings(
    encoding: dict[str, str], tmp_path: Path, read_zarr: Any, read_tensorstore: Any
) -> None:
    x = np.arange(50, dtype="i4").reshape(10, 5)
    x[4:8] = 0  # shard row 1 all fill: no object
    rep = shardwise.write_array(
        da.from_array(x, chunks=3),
        str(tmp_path),
        chunks=(2, 2),
        shards=(4, 4),
        chunk_key_encoding=encoding,
    )
    sep = encoding["separator"]
    prefix = ["c"] if encoding["name"] == "default" else []
    want = sorted(sep.join([*prefix, str(i), str(j)]) for i in (0, 2) for j in (0, 1))
    assert sorted(stored_objects(tmp_path)) == want == rep.keys
    assert_bit_equal(read_zarr(str(tmp_path)), x, "zarr-python")
    assert_bit_equal(read_tensorstore(tmp_path), x, "tensorstore")
    assert_bit_equal(shardwise.open_array(str(tmp_path)).compute(), x, "shardwise")


LARGE_CHAINS = {
    "zstd": dict(compressors=[zarr.codecs.ZstdCodec(level=1)]),  # decoded in place
    "raw": dict(compressors=None),  # copied in place
    "transpose-zstd": dict(
        filters=[zarr.codecs.TransposeCodec(order=(2, 0, 1))],
        compressors=[zarr.codecs.ZstdCodec(level=1)],
    ),
    "big-endian-raw": dict(serializer=zarr.codecs.BytesCodec(endian="big"), compressors=None),
    "zstd-crc32c": dict(compressors=[zarr.codecs.ZstdCodec(level=1), zarr.codecs.Crc32cCodec()]),
    "gzip": dict(compressors=[zarr.codecs.GzipCodec(level=1)]),
}


@pytest.mark.parametrize("writer", ["shardwise", "zarr"])
@pytest.mark.parametrize("chain", sorted(LARGE_CHAINS))
def test_large_inner_chunks(tmp_path: Path, chain: str, writer: str) -> None:
    """Inner chunks of 128 KiB and more take the one-by-one decode path (straight into the
    output where they are contiguous in it); whole reads and windows cutting chunks agree."""
    rng = np.random.default_rng(11)
    data = rng.normal(size=(40, 64, 24)).astype("float64")
    data[:16] = 0.0  # some inner chunks hold only the fill value
    kw = dict(chunks=(16, 64, 16), shards=(32, 64, 16), fill_value=0.0, **LARGE_CHAINS[chain])
    if writer == "shardwise":
        shardwise.write_array(data, str(tmp_path), **kw)
    else:
        z = zarr.create_array(str(tmp_path), shape=data.shape, dtype=data.dtype, **kw)
        z[...] = data
    arr = shardwise.open_array(str(tmp_path))
    np.testing.assert_array_equal(arr.compute(), data)
    window = (slice(5, 37), slice(3, 61), slice(9, 23))
    np.testing.assert_array_equal(arr[window].compute(), data[window])
    one = shardwise.open_array(str(tmp_path), chunks=(40, 64, 24))  # several shards per task
    np.testing.assert_array_equal(one.compute(), data)


@pytest.mark.parametrize("source", ["numpy", "dask"])
def test_a_0d_array_written_with_compute_false_reports_and_reads_back(source: str) -> None:
    """A 0-d array's one shard task returns its receipt as a 0-d object array; the deferred
    write's report must still add it up (it raised AttributeError in ``sum_reports``)."""
    import dask

    value = np.array(3.5, dtype="float32")
    data = da.from_array(value) if source == "dask" else value
    store = MemoryStore()
    lazy = shardwise.write_array(data, store, compute=False)
    (report,) = dask.compute(lazy)
    assert report.shards_written == 1
    assert report.chunks_stored == 1
    got = shardwise.read_array(store)
    assert got.shape == () and got.dtype == value.dtype and got == value
    assert zarr.open_array(store, mode="r")[()] == value


def _codec_names(root: Path) -> list[str]:
    import json

    return [c["name"] for c in json.loads((root / "zarr.json").read_text())["codecs"]]


def test_0d_arrays_are_one_plain_chunk_that_zarr_and_shardwise_read_verify_and_resume(
    tmp_path: Path,
) -> None:
    """A 0-d array is stored without the sharding codec (other Zarr readers refuse a sharded
    0-d array): write_array's, convert's and a GeoZarr pyramid's CRS variable alike; zarr-python
    and shardwise read it, verify decodes its chunk (and finds it corrupt), a resumed write
    skips it."""
    import xarray as xr

    a = tmp_path / "a.zarr"
    rep = shardwise.write_array(np.float32(3.5), a)
    assert rep.shards_written == 1 and "sharding_indexed" not in _codec_names(a)
    assert zarr.open_array(a, mode="r")[()] == np.float32(3.5)
    assert shardwise.read_array(a) == 3.5 and shardwise.open_array(a).compute() == 3.5
    assert shardwise.verify(a).ok
    stored = (a / "c").read_bytes()
    again = shardwise.write_array(np.float32(3.5), a, mode="w-", resume=True)
    assert again.shards_written == 0 and again.shards_skipped == 1
    assert (a / "c").read_bytes() == stored and shardwise.verify(a).ok
    shardwise.write_array(np.float32(-1.0), a, mode="r+")
    assert zarr.open_array(a, mode="r")[()] == -1.0 and shardwise.verify(a).ok
    raw = bytearray((a / "c").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (a / "c").write_bytes(bytes(raw))
    found = shardwise.verify(a)
    assert [(p.kind, p.key) for p in found.problems] == [("corrupt", "c")]
    # a zarr store (no index to fetch: only the object's size)
    mem = MemoryStore()
    shardwise.write_array(np.arange(3.0)[1], mem)
    assert "c" in mem._store_dict and zarr.open_array(mem, mode="r")[()] == 1.0
    assert shardwise.read_array(mem) == 1.0 and shardwise.open_array(mem).compute() == 1.0
    assert shardwise.verify(mem).ok
    # convert of a 0-d source (v2) and the CRS variable of every GeoZarr level
    src = tmp_path / "src.zarr"
    zarr.create_array(src, shape=(), dtype="i4", zarr_format=2)[()] = 5
    shardwise.convert(src, tmp_path / "c.zarr")
    assert "sharding_indexed" not in _codec_names(tmp_path / "c.zarr")
    assert zarr.open_array(tmp_path / "c.zarr", mode="r")[()] == 5
    ds = xr.Dataset(
        {"b": (("y", "x"), np.ones((6, 4)), {"grid_mapping": "spatial_ref"})},
        coords={
            "y": 100.0 - np.arange(6),
            "x": np.arange(4.0),
            "spatial_ref": ((), np.int64(32632), {"crs_wkt": "PROJCRS[]"}),
        },
    )
    g = tmp_path / "g.zarr"
    shardwise.write_pyramid(ds, g, levels=2, layout="geozarr")
    for k in ("0", "1"):
        assert "sharding_indexed" not in _codec_names(g / k / "spatial_ref")
        assert zarr.open_array(g / k / "spatial_ref", mode="r")[()] == 32632
    assert shardwise.verify(g).ok
    assert int(xr.open_datatree(g, engine="zarr", consolidated=False)["1"]["spatial_ref"]) == 32632
    # a Dataset's 0-d variable
    shardwise.to_zarr(ds, tmp_path / "d.zarr")
    assert "sharding_indexed" not in _codec_names(tmp_path / "d.zarr" / "spatial_ref")
    assert int(xr.open_zarr(tmp_path / "d.zarr")["spatial_ref"]) == 32632
    assert shardwise.verify(tmp_path / "d.zarr").ok
