"""Pyramids and conversions into icechunk repositories on S3 (the moto server).

``write_pyramid`` (OME and GeoZarr) and ``convert`` (encoded chunks copied, re-encoded, into a
pyramid) write into a writable session of a repository whose storage is S3; each is committed,
then read back from a new handle of the repository (nothing from the writer's memory) exactly,
by shardwise and by zarr-python or xarray's own zarr engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr

import shardwise

icechunk = pytest.importorskip("icechunk")


@pytest.fixture(scope="module")
def s3_storage() -> Iterator[Callable[[str], Any]]:
    """One moto S3 server for the module: a function giving the icechunk storage of the
    repository at a prefix of its bucket."""
    from faultkit import BUCKET, CREDS, moto_s3

    with moto_s3() as s3:

        def storage(prefix: str) -> Any:
            return icechunk.s3_storage(
                bucket=BUCKET,
                prefix=prefix,
                region=CREDS["region"],
                endpoint_url=s3.endpoint,
                allow_http=True,
                force_path_style=True,
                access_key_id=CREDS["key"],
                secret_access_key=CREDS["secret"],
            )

        yield storage


@pytest.fixture
def on_s3(s3_storage: Callable[[str], Any]) -> tuple[Any, Callable[[], Any]]:
    """A new repository on S3 and a function that opens it again (a new handle: what it reads
    comes from S3)."""
    prefix = f"repo-{uuid.uuid4().hex[:8]}"
    repo = icechunk.Repository.create(s3_storage(prefix))
    return repo, lambda: icechunk.Repository.open(s3_storage(prefix)).readonly_session("main")


def block_mean(x: np.ndarray, f: int) -> np.ndarray:
    """``x`` (2-d, each side a multiple of ``f``) reduced by means of ``f`` x ``f`` blocks."""
    return x.reshape(x.shape[0] // f, f, x.shape[1] // f, f).mean(axis=(1, 3))


@pytest.mark.parametrize("where", ["threads", "cluster"])
def test_write_pyramid_into_a_repository_on_s3(
    on_s3: tuple[Any, Callable[[], Any]], where: str, request: pytest.FixtureRequest
) -> None:
    """An OME pyramid whose dask chunks split its shards, into a session of a repository on S3
    (on threads; on worker processes, the forks pickled there and back with their S3 storage),
    one commit: every level read back by shardwise and by zarr-python from a new handle, level 0
    equal to the image, the others its block means, the shards as asked."""
    repo, reopen = on_s3
    scheduler = request.getfixturevalue("client") if where == "cluster" else "threads"
    x = np.arange(80 * 120, dtype="f4").reshape(80, 120)
    image = xr.DataArray(da.from_array(x, chunks=(23, 31)), dims=("y", "x"))
    with dask.config.set(scheduler=scheduler):
        report = shardwise.write_pyramid(
            image, repo.writable_session("main"), levels=3, chunks=10, shards=20, commit="pyr"
        )
    assert report.forks == [] and report.notes[-1].startswith("committed snapshot")
    snap = reopen()
    group = zarr.open_group(snap.store, mode="r")
    assert [d["path"] for d in group.attrs["ome"]["multiscales"][0]["datasets"]] == ["0", "1", "2"]
    for level, want in enumerate([x, block_mean(x, 2), block_mean(x, 4)]):
        by_zarr = group[str(level)][:]
        by_shardwise = shardwise.read_array(snap, path=str(level))
        np.testing.assert_array_equal(by_shardwise, by_zarr)
        np.testing.assert_allclose(by_zarr, want, rtol=1e-6)
        if level == 0:
            np.testing.assert_array_equal(by_zarr, x)
    assert group["0"].shards == (20, 20)


def test_write_pyramid_geozarr_into_a_repository_on_s3(
    on_s3: tuple[Any, Callable[[], Any]],
) -> None:
    """A GeoZarr pyramid (a DataTree of levels) into a session on S3, committed by the caller:
    xarray's own zarr engine and the shardwise engine read every level identical."""
    repo, reopen = on_s3
    y, x = np.arange(64.0), np.arange(48.0)
    values = np.arange(64 * 48, dtype="f8").reshape(64, 48)
    ds = xr.Dataset({"b": (("y", "x"), values)}, coords={"y": 1000 - 10 * y, "x": 10 * x}).chunk(
        {"y": 13, "x": 17}
    )
    session = repo.writable_session("main")
    with dask.config.set(scheduler="threads"):
        shardwise.write_pyramid(ds, session, levels=2, chunks=8, shards=16, layout="geozarr")
    session.commit("geozarr")
    snap = reopen()
    by_xarray = xr.open_datatree(snap.store, engine="zarr", consolidated=False)
    by_shardwise = xr.open_datatree(snap.store, engine="shardwise")
    for level in ("0", "1"):
        xr.testing.assert_identical(by_shardwise[level].to_dataset().load(),
                                    by_xarray[level].to_dataset().load())  # fmt: skip
    np.testing.assert_array_equal(by_xarray["0"]["b"].values, values)
    np.testing.assert_allclose(by_xarray["1"]["b"].values, block_mean(values, 2))


def v2_dataset(root: Path) -> xr.Dataset:
    ds = xr.Dataset(
        {
            "v": (("y", "x"), np.arange(60 * 40, dtype="f4").reshape(60, 40)),
            "w": (("y",), np.arange(60, dtype="i8") * 3),
        },
        coords={"y": np.arange(60), "x": np.arange(40) * 0.5},
        attrs={"title": "converted"},
    )
    ds.to_zarr(root, zarr_format=2, encoding={"v": {"chunks": (10, 10)}}, consolidated=True)
    return ds


@pytest.mark.parametrize("where", ["threads", "cluster"])
def test_convert_into_a_repository_on_s3(
    on_s3: tuple[Any, Callable[[], Any]], tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """convert of a v2 dataset store into sessions on S3 (encoded chunks copied; re-encoded with
    another compressor), one commit each, on threads and on worker processes: xarray's own zarr
    engine and the shardwise engine read both identical to the source from a new handle, with
    the shards and codecs asked."""
    repo, reopen = on_s3
    scheduler = request.getfixturevalue("client") if where == "cluster" else "threads"
    ds = v2_dataset(tmp_path / "src.zarr")
    with dask.config.set(scheduler=scheduler):
        copied = shardwise.convert(
            tmp_path / "src.zarr", repo.writable_session("main"), shards={"y": 30}, commit="1"
        )
        again = shardwise.convert(
            tmp_path / "src.zarr",
            repo.writable_session("main"),
            dst_path="again",
            compressors=zarr.codecs.GzipCodec(),
            commit="2",
        )
    assert {a.method for a in copied.arrays} == {"copy"} and copied.snapshot
    assert {a.method for a in again.arrays} == {"reencode"} and again.snapshot
    snap = reopen()
    for group in (None, "again"):
        for engine in ("zarr", "shardwise"):
            back = xr.open_dataset(
                snap.store,
                group=group,
                engine=engine,
                consolidated=False if engine == "zarr" else None,
            )
            xr.testing.assert_identical(back.load(), ds)
    assert zarr.open_array(snap.store, path="v", mode="r").shards == (30, 40)
    gz = zarr.open_array(snap.store, path="again/v", mode="r").compressors
    assert isinstance(gz[0], zarr.codecs.GzipCodec)
    np.testing.assert_array_equal(shardwise.read_array(snap, path="again/v"), ds["v"].values)


def test_convert_a_pyramid_into_a_repository_on_s3(
    on_s3: tuple[Any, Callable[[], Any]], tmp_path: Path
) -> None:
    """convert(pyramid=...) into a session on S3, verified, the caller commits: both levels
    read back by zarr-python and by shardwise from a new handle."""
    repo, reopen = on_s3
    ds = v2_dataset(tmp_path / "src.zarr")
    session = repo.writable_session("main")
    report = shardwise.convert(
        tmp_path / "src.zarr", session, path="v", dst_path="p", pyramid={"levels": 2}, verify=True
    )
    assert report.ok and report.snapshot is None and session.has_uncommitted_changes
    session.commit("pyramid")
    snap = reopen()
    group = zarr.open_group(snap.store, path="p", mode="r")
    for level, want in enumerate([ds["v"].values, block_mean(ds["v"].values, 2)]):
        np.testing.assert_array_equal(shardwise.read_array(snap, path=f"p/{level}"),
                                      group[str(level)][:])  # fmt: skip
        np.testing.assert_allclose(group[str(level)][:], want)
    np.testing.assert_array_equal(group["0"][:], ds["v"].values)
