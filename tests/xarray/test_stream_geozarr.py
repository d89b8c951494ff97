"""``shardwise.stream_geozarr``: a GeoZarr multiscales pyramid growing along time.

Every level equal to ``write_pyramid(layout="geozarr")`` of the whole Dataset (values,
coordinates, the pyramid group's and the level groups' attributes); the multiscales metadata
validated (zarr-cm, the conventions package eopf-geozarr builds them with) and every level
opened by xarray's own engine as one consistent Dataset after every sealed shard-row and while
a level is held between growing its arrays and its consolidated metadata; a stream stopped by
an error, and a child SIGKILLed mid-growth, resumed after the frames every level stored; a
Dataset that is no GeoZarr image refused before the store is touched."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from zarr_cm import multiscales as zcm

import shardwise
from shardwise.xarray import streams

WKT = 'PROJCS["WGS 84 / UTM zone 32N",GEOGCS["WGS 84"]]'
NY, NX = 24, 20
TOTAL = 10
KW: dict[str, Any] = dict(levels=3, chunks={"y": 8, "x": 8}, shards={"time": 4, "y": 16, "x": 16})


def scene(i: int, n: int = 1) -> xr.Dataset:
    """Scenes ``i`` to ``i + n`` (a day apart): a band over (time, y, x), one over (y, x)
    written once, projected coordinates and a CRS variable."""
    rng = np.random.default_rng(i)
    t = pd.date_range("2024-01-01", periods=n, freq="D") + pd.Timedelta(days=i)
    band = {"grid_mapping": "spatial_ref", "units": "K"}
    return xr.Dataset(
        {
            "b1": (("y", "x"), np.arange(NY * NX, dtype="f4").reshape(NY, NX), band),
            "b2": (("time", "y", "x"), rng.random((n, NY, NX)).astype("f4"), band),
        },
        coords={
            "y": ("y", 5000.0 - 10 * np.arange(NY), {"units": "m", "axis": "Y"}),
            "x": ("x", 300.0 + 10 * np.arange(NX), {"units": "m", "axis": "X"}),
            "time": t,
            "spatial_ref": ((), np.int64(0), {"crs_wkt": WKT, "grid_mapping_name": "utm"}),
        },
        attrs={"title": "a scene"},
    )


def scenes(start: int, stop: int) -> xr.Dataset:
    return xr.concat([scene(i) for i in range(start, stop)], "time", data_vars="minimal",
                     coords="minimal", compat="override", join="override")  # fmt: skip


def attributes(root: Path, key: str = "zarr.json") -> dict[str, Any]:
    return dict(json.loads((root / key).read_text())["attributes"])


def check_readable(root: Path) -> list[int]:
    """The pyramid's multiscales validated and every level opened by xarray's engine (through
    its consolidated metadata) as one Dataset; each level's time length."""
    document = json.loads((root / "zarr.json").read_text())
    zcm.validate_group_metadata(document)
    zcm.validate(document["attributes"]["multiscales"])
    lengths = []
    for k in range(3):
        with xr.open_zarr(root, group=str(k)) as ds:
            assert ds["b2"].shape[1:] == (-(-NY // 2**k), -(-NX // 2**k))
            lengths.append(ds.sizes["time"])
    return lengths


def test_levels_equal_write_pyramid_and_validate_after_every_sealed_shard_row(
    tmp_path: Path,
) -> None:
    root = tmp_path / "g.zarr"
    with shardwise.stream_geozarr(root, scene(0, 2), **KW) as s:
        assert check_readable(root) == [0, 0, 0]
        for i in range(TOTAL):
            s.append(scene(i))
            if i % 4 == 3:  # a shard-row of every level sealed
                s.flush()
                assert check_readable(root) == [i + 1] * 3 == list(s.stored)
    assert check_readable(root) == [TOTAL] * 3
    ref = tmp_path / "w.zarr"
    shardwise.write_pyramid(scenes(0, TOTAL), ref, levels=3, layout="geozarr")
    assert attributes(root) == attributes(ref)
    for k in range(3):
        assert attributes(root, f"{k}/zarr.json") == attributes(ref, f"{k}/zarr.json")
        for engine in ("zarr", "shardwise"):
            got = xr.open_dataset(root, group=str(k), engine=engine).load()
            want = xr.open_dataset(ref, group=str(k), engine=engine, consolidated=False).load()
            xr.testing.assert_allclose(got.drop_encoding(), want.drop_encoding(), rtol=1e-6)
    assert shardwise.verify(root).ok


def test_every_level_reads_as_one_dataset_while_a_level_is_held_mid_growth(
    tmp_path: Path,
) -> None:
    """Held on a writer thread after a level's arrays grew, before its consolidated metadata
    (at every growth of every level): the pyramid validates and every level opens."""
    root = tmp_path / "g.zarr"
    seen: list[list[int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def hook(end: int) -> None:
        if end == 0:
            return  # a level opening, before the pyramid's group is stored
        with lock:
            try:
                seen.append(check_readable(root))
            except BaseException as e:  # raised on the writer thread: reported here
                errors.append(e)

    streams.before_consolidate = hook
    try:
        with shardwise.stream_geozarr(root, scene(0, 2), **KW) as s:
            s.extend(scenes(0, TOTAL))
    finally:
        streams.before_consolidate = None
    # every level grows at least once (seals waiting are written together, so how many times
    # depends on how far the appender ran ahead): each growth held, every level readable
    assert errors == [] and len(seen) >= 3
    assert check_readable(root) == [TOTAL] * 3


def test_a_stopped_stream_resumes_after_what_every_level_stored(tmp_path: Path) -> None:
    root = tmp_path / "g.zarr"
    with pytest.raises(RuntimeError), shardwise.stream_geozarr(root, scene(0, 2), **KW) as s:
        s.extend(scenes(0, 6))
        raise RuntimeError("the instrument stopped")
    with shardwise.stream_geozarr(root, scene(0, 2), resume=True, **KW) as s:
        assert s.resumed_from == 4 and s.stored == (4, 4, 4)
        s.extend(scenes(4, TOTAL))
    ref = tmp_path / "w.zarr"
    shardwise.write_pyramid(scenes(0, TOTAL), ref, levels=3, layout="geozarr")
    for k in range(3):
        got = xr.open_zarr(root, group=str(k)).load()
        want = xr.open_zarr(ref, group=str(k), consolidated=False).load()
        xr.testing.assert_allclose(got.drop_encoding(), want.drop_encoding(), rtol=1e-6)
    assert shardwise.verify(root).ok


def killed_pyramid(root: str, said: Any) -> None:
    """A child streaming the scenes, stopping itself on the writer thread of the first level
    that grows to 8 frames, after its arrays grew, before its consolidated metadata."""
    import signal

    from shardwise.xarray import streams as child

    def hook(end: int) -> None:
        if end >= 8:
            said.send(("held", end))
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)

    child.before_consolidate = hook
    s = shardwise.stream_geozarr(root, scene(0, 2), pending=1, **KW)
    s.extend(scenes(0, TOTAL))
    s.flush()
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def test_a_pyramid_stream_killed_mid_growth_resumes_with_every_level(tmp_path: Path) -> None:
    """SIGKILLed with a level's arrays grown to 8 and its group's metadata not: the pyramid
    still validates and opens, every level resumes at 4 or 8, and the finished pyramid equals
    ``write_pyramid``'s, verified clean."""
    import os
    import signal

    from faultkit import forkserver

    root = str(tmp_path / "g.zarr")
    ctx = forkserver()
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=killed_pyramid, args=(root, theirs))
    proc.start()
    assert ours.poll(300) and ours.recv()[0] == "held"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    assert set(check_readable(Path(root))) <= {0, 4, 8}
    with shardwise.stream_geozarr(root, scene(0, 2), resume=True, **KW) as s:
        assert s.resumed_from in (0, 4, 8) and set(s.stored) <= {0, 4, 8}
        s.extend(scenes(s.resumed_from, TOTAL))
    ref = tmp_path / "w.zarr"
    shardwise.write_pyramid(scenes(0, TOTAL), ref, levels=3, layout="geozarr")
    for k in range(3):
        got = xr.open_zarr(root, group=str(k)).load()
        want = xr.open_zarr(ref, group=str(k), consolidated=False).load()
        xr.testing.assert_allclose(got.drop_encoding(), want.drop_encoding(), rtol=1e-6)
    assert shardwise.verify(root).ok


def test_a_dataset_that_is_no_geozarr_image_is_refused_before_the_store(tmp_path: Path) -> None:
    root = tmp_path / "g.zarr"
    flat = scene(0).rename({"y": "row"})
    with pytest.raises(shardwise.InvalidValueError, match="'y'"):
        shardwise.stream_geozarr(root, flat)
    with pytest.raises(shardwise.InvalidValueError, match="factors"):
        shardwise.stream_geozarr(root, scene(0), factors={"time": 2})
    assert not root.exists()
