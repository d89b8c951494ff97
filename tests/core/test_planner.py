"""plan_shards: the shard and inner-chunk geometry from a target (a byte size, axis names, a
shape rounded up to whole chunks, sizes by dimension name), never growing the write axes, and
its report; the defaults of write_array and to_zarr come from it, and every ``shards=`` takes
its targets (write_array, to_zarr, convert, write_pyramid, batch.init, the CLI).

Oracles: iohub's worked example (#458/#461), zarr-python's stored metadata, and arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import given
from hypothesis import strategies as st

import shardwise
from shardwise.core.planner import plan_shards
from shardwise.core.shardspec import check_shards, parse_shards
from shardwise.errors import InvalidValueError
from strategies import examples

IOHUB = ((100, 6, 86, 1664, 1193), (1, 1, 16, 256, 256))  # [T, C, Z, Y, X], uint16
CLIMATE = ("time", "lat", "lon")


def test_iohub_xyz_is_one_volume_rounded_up_to_whole_chunks() -> None:
    shape, chunks = IOHUB
    g = plan_shards(shape, "uint16", target="XYZ", chunks=chunks)
    assert g.shards == (1, 1, 96, 1792, 1280)
    assert plan_shards(shape, "uint16", target="zyx", chunks=chunks).shards == g.shards


@pytest.mark.parametrize("t", [4, 5, 100, 1068])
def test_iohub_2gb_grows_time_not_the_channels_that_writers_split(t: int) -> None:
    shape, chunks = IOHUB
    g = plan_shards((t, *shape[1:]), "uint16", target="2GB", chunks=chunks, write_axes=["c"])
    assert g.shards == (4, 1, 96, 1792, 1280)
    assert g.shard_bytes <= 2 * 10**9 < g.shard_bytes // 4 * 5  # the largest that fits
    assert "along axis 1 a shard spans one inner chunk" in g.report()


def test_an_overhanging_last_shard_is_allowed() -> None:
    g = plan_shards((1068, 64), "uint8", target=(96, 64), chunks=(16, 64))
    assert g.shards == (96, 64) and g.nshards == 12  # 1068 = 11 * 96 + 12


def test_zarr_3602_a_100000_element_array_is_not_cut_into_tiny_chunks() -> None:
    for dtype in ("int8", "float32", "float64"):
        g = plan_shards((100_000,), dtype)
        assert g.chunks[0] >= 100_000 // 8 and g.nshards == 1
        assert g.shards_reason == "the whole array in one shard: it fits in 64.0 MiB"


def test_the_default_reason_names_the_axes_grown_around_the_write_axes() -> None:
    dims = ("T", "C", "Z", "Y", "X")
    shape, chunks = (1068, 6, 86, 1664, 1193), (1, 1, 16, 256, 256)
    g = plan_shards(shape, "uint16", chunks=chunks, write_axes=(0, 1), dims=dims)
    assert g.shards[:2] == (1, 1)
    assert g.shards_reason == "whole chunks up to 64.0 MiB, grown along Z, Y, X only"
    g = plan_shards((4000, 4000), "float32", chunks=(100, 100), write_axes=(0,))
    assert g.shards_reason == "whole chunks up to 64.0 MiB, grown along axis 1 only"


def test_one_per_time_step_and_axis_names_by_dimension_name() -> None:
    shape = (365, 181, 360)
    g = plan_shards(shape, "float32", target="one per time step", dims=CLIMATE)
    assert g.shards == (1, 181, 360) and g.chunks == (1, 181, 360)
    assert plan_shards(shape, "float32", target="XY", dims=CLIMATE).shards == (1, 181, 360)
    with pytest.raises(InvalidValueError, match="'z'"):
        plan_shards(shape, "float32", target="XYZ", dims=CLIMATE)


@given(
    shape=st.lists(st.integers(1, 3000), min_size=1, max_size=4).map(tuple),
    data=st.data(),
    nbytes=st.integers(1, 2**28),
)
@examples(200)
def test_write_axes_are_never_grown_and_byte_targets_hold(
    shape: tuple[int, ...], data: st.DataObject, nbytes: int
) -> None:
    chunks = tuple(data.draw(st.integers(1, n)) for n in shape)
    keep = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    g = plan_shards(shape, "float32", target=f"{nbytes}B", chunks=chunks, write_axes=keep)
    assert all(g.shards[w] == chunks[w] for w in keep)
    assert all(s % c == 0 for s, c in zip(g.shards, g.chunks, strict=True))
    assert g.shard_bytes <= max(nbytes, math.prod(chunks) * 4)
    assert all(s < n + c for s, c, n in zip(g.shards, chunks, shape, strict=True))


def test_a_shape_is_rounded_up_to_whole_chunks_and_refused_across_a_write_axis() -> None:
    g = plan_shards((1000, 1000), "float32", target=(100, 64), chunks=(32, 32))
    assert g.shards == (128, 64)
    with pytest.raises(InvalidValueError, match="write axis"):
        plan_shards((1000, 1000), "float32", target=(100, 64), chunks=(32, 32), write_axes=[0])


@pytest.mark.parametrize(
    ("grid", "n", "chunks", "shards"),
    [
        ((181, 360), 10, (10, 181, 360), (10, 181, 360)),
        ((181, 360), 30, (15, 181, 360), (30, 181, 360)),
        ((181, 360), 64, (16, 181, 360), (64, 181, 360)),
        ((721, 1440), 30, (1, 721, 1440), (30, 721, 1440)),
        ((1441, 2880), 30, (1, 721, 1440), (30, 1442, 2880)),  # a plane split evenly
    ],
)
def test_inner_chunks_for_shards_by_name_are_compact(
    grid: tuple[int, int], n: int, chunks: tuple[int, ...], shards: tuple[int, ...]
) -> None:
    g = plan_shards((365, *grid), "float32", target={"time": n}, dims=CLIMATE)
    assert (g.chunks, g.shards) == (chunks, shards)
    assert g.chunk_bytes <= 4 * 2**20
    first = g.reads()[0]  # a map decodes only chunks of its own time step's block
    assert first.chunks == math.prod(
        math.ceil(a / b) for a, b in zip(grid, chunks[1:], strict=True)
    )
    assert "compact" in g.chunks_reason and "time" in g.shards_reason


def test_the_report_has_sizes_objects_memory_reads_risks_and_levels() -> None:
    g = plan_shards(
        (365, 181, 360), "float32", target={"time": 30}, dims=CLIMATE, memory_per_task="1GiB"
    )
    text = str(g)
    for words in (
        "shards   (30, 181, 360): 13 of 7.5 MiB (2 inner chunks, index 36 B)",
        "objects  13 shards + metadata; memory per write task ~22.4 MiB (budget 1.0 GiB)",
        "a map (time at one index): 1 shard, 1 chunk, 3.7 MiB decoded for 254.5 KiB (15.0x)",
        "a time series (all of time at one point): 13 shards, 25 chunks",
        "the whole array: 13 shards, 25 chunks, 90.7 MiB decoded",
        "the last shard holds 5 of 30, so the next append reads, merges and rewrites it",
        "regions  aligned to the shards (multiples of (30, 181, 360))",
        "why: compact",
    ):
        assert words in text, words
    pyramid = plan_shards((4096, 4096), "uint8", levels=3).levels
    assert [lv.shape for lv in pyramid] == [(4096, 4096), (2048, 2048), (1024, 1024)]
    assert all(lv.nshards >= 1 for lv in pyramid)


def test_rectilinear_shards_get_chunks_that_divide_every_extent() -> None:
    months = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    g = plan_shards((365, 10), "float32", rectilinear={0: months})
    assert g.shard_edges == (tuple(months), None) and g.chunks[0] == 1
    with pytest.raises(InvalidValueError, match=r"sizes that would: \[1\]"):
        plan_shards((365, 10), "float32", chunks=(7, 10), rectilinear=[months, None])


@pytest.mark.parametrize("bad", ["lots", "XX", {"time": 0}, (0, 4), 3.5])
def test_targets_that_are_not_accepted_are_refused(bad: object) -> None:
    with pytest.raises((InvalidValueError, TypeError)):
        plan_shards((10, 10), "float32", target=bad, dims=("time", "x"))


def test_the_cli_grammar_takes_targets() -> None:
    assert parse_shards("2GB") == "2GB" and check_shards(parse_shards("XY")) == "XY"
    assert parse_shards("16x20") == (16, 20) and parse_shards("time=30") == {"time": 30}
    with pytest.raises(InvalidValueError, match="byte size like 2GB"):
        parse_shards("lots")


def test_write_array_and_to_zarr_defaults_come_from_the_planner(tmp_path: object) -> None:
    data = np.random.default_rng(0).random((365, 181, 360)).astype("float32")
    ds = xr.Dataset({"t2m": (CLIMATE, data)})
    for target in ({"time": 30}, "2GB", "one per time step"):
        p = f"{tmp_path}/ds-{len(str(target))}.zarr"
        shardwise.to_zarr(ds, p, shards=target, mode="w")
        a = zarr.open_array(p, path="t2m")
        want = plan_shards(data.shape, "float32", target=target, dims=CLIMATE)
        assert (a.chunks, a.shards) == (want.chunks, want.shards)
    for target in ((30, 181, 360), "2GB", None):
        p = f"{tmp_path}/a-{len(str(target))}.zarr"
        shardwise.write_array(data, p, shards=target, mode="w")
        a = zarr.open_array(p)
        want = plan_shards(data.shape, "float32", target=target)
        assert (a.chunks, a.shards) == (want.chunks, want.shards)
        np.testing.assert_array_equal(a[:], data)


def test_convert_write_pyramid_and_batch_init_take_targets(tmp_path: object) -> None:
    src = zarr.create_array(f"{tmp_path}/src.zarr", shape=(64, 256), chunks=(16, 64), dtype="u1")
    src[:] = 7
    shardwise.convert(f"{tmp_path}/src.zarr", f"{tmp_path}/dst.zarr", shards="XY")
    assert zarr.open_array(f"{tmp_path}/dst.zarr").shards == (64, 256)
    shardwise.write_pyramid(np.zeros((64, 256), "u1"), f"{tmp_path}/p.zarr", shards="16KB")
    assert zarr.open_array(f"{tmp_path}/p.zarr", path="0").shards == (64, 128)  # 16,000 B
    shardwise.batch.init(
        f"{tmp_path}/b.zarr", shape=(64, 256), dtype="u1", chunks=(16, 64), shards="XY", parts=1
    )
    assert zarr.open_array(f"{tmp_path}/b.zarr").shards == (64, 256)


def test_to_zarr_axis_names_apply_to_data_variables_and_refuse_unknown_ones(
    tmp_path: object,
) -> None:
    coords = {"time": np.arange(20), "lat": np.arange(18.0), "lon": np.arange(36.0)}
    ds = xr.Dataset({"t": (CLIMATE, np.ones((20, 18, 36), "float32"))}, coords=coords)
    shardwise.to_zarr(ds, f"{tmp_path}/xy.zarr", shards="XY")
    assert zarr.open_array(f"{tmp_path}/xy.zarr", path="t").shards == (1, 18, 36)
    assert xr.open_zarr(f"{tmp_path}/xy.zarr").t.shape == (20, 18, 36)  # coordinates: default
    with pytest.raises(InvalidValueError, match="'level'"):
        shardwise.to_zarr(ds, f"{tmp_path}/no.zarr", shards="one per level step")


def test_plan_write_says_why_a_new_arrays_shards_and_chunks_are_these(tmp_path: object) -> None:
    data = np.zeros((365, 181, 360), "float32")
    for target, shards_why, chunks_why in (
        (None, "whole chunks up to 64.0 MiB", "about 1 MiB, balanced"),
        ("2GB", "the largest of whole chunks under 2GB", "compact: whole planes"),
        ((30, 181, 360), "as given", "compact: whole planes"),
    ):
        text = str(shardwise.plan_write(data, f"{tmp_path}/a.zarr", shards=target))
        assert f"    shards because: {shards_why}" in text, text
        assert f"    inner chunks because: {chunks_why}" in text, text
    # given both, or into a stored array, nothing is chosen: no reasons
    text = str(shardwise.plan_write(data, tmp_path, chunks=(5, 181, 360), shards=(30, 181, 360)))
    assert "because" not in text
    shardwise.write_array(data, f"{tmp_path}/s.zarr")
    assert "because" not in str(shardwise.plan_write(data, f"{tmp_path}/s.zarr", mode="r+"))


def test_a_dataarray_names_its_dimensions_so_shards_by_name_work(tmp_path: object) -> None:
    da = xr.DataArray(np.arange(365 * 18 * 36, dtype="float32").reshape(365, 18, 36), dims=CLIMATE)
    job = shardwise.plan_write(da, f"{tmp_path}/a.zarr", shards={"time": 30})
    assert "shards because: {'time': 30} as given, the other dimensions whole" in str(job)
    assert "a map (time at one index)" in str(job)
    shardwise.write_array(da, f"{tmp_path}/a.zarr", shards={"time": 30})
    a = zarr.open_array(f"{tmp_path}/a.zarr")
    assert a.metadata.dimension_names == CLIMATE and a.shards == (30, 18, 36)
    np.testing.assert_array_equal(a[:], da.values)
    # a numpy array has no names: the refusal says what to give, before any byte
    with pytest.raises(InvalidValueError, match="names dimensions, but the array has none"):
        shardwise.write_array(da.values, f"{tmp_path}/b.zarr", shards={"time": 30})
    assert not (tmp_path / "b.zarr").exists()  # type: ignore[operator]
