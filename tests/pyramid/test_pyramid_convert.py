"""``convert(..., pyramid=...)`` and ``shardwise convert --pyramid``: an existing zarr v2 or v3
array written as an OME-Zarr 0.5 pyramid, every level equal to a numpy block mean of the level
above, validated by ome-zarr-models, shown and checked by inspect / verify; refusals that leave
the destination byte-identical; an interrupted conversion resumed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, MemoryStore, WrapperStore

import shardwise
from faultkit import files, snapshot
from shardwise.cli import main
from shardwise.errors import ArrayExistsError, InvalidTypeError, InvalidValueError, PlanError


def block_mean(x: np.ndarray, factors: tuple[int, ...]) -> np.ndarray:
    """One level by numpy: each block's mean over the samples present (the ceil rule), back in
    the data's dtype (integers rounded half to even)."""
    pads = [(0, -n % f) for n, f in zip(x.shape, factors, strict=True)]
    p = np.pad(x.astype("f8"), pads, constant_values=np.nan)
    blocks = sum(((n // f, f) for n, f in zip(p.shape, factors, strict=True)), ())
    m = np.nanmean(p.reshape(blocks), axis=tuple(range(1, 2 * x.ndim, 2)))
    return np.rint(m).astype(x.dtype) if x.dtype.kind in "iu" else m.astype(x.dtype)


def expected_levels(x: np.ndarray, n: int) -> list[np.ndarray]:
    out = [x]
    for _ in range(n - 1):
        out.append(block_mean(out[-1], (2,) * x.ndim))
    return out


def stored(root: Any, n: int, path: str = "") -> list[np.ndarray]:
    return [
        np.asarray(zarr.open_array(root, path=f"{path}/{k}".strip("/"), mode="r")[...])
        for k in range(n)
    ]


def v2_image(root: Path, x: np.ndarray, dims: tuple[str, ...] = ("y", "x")) -> None:
    attrs = {"_ARRAY_DIMENSIONS": list(dims)}
    a = zarr.create_array(
        root, shape=x.shape, chunks=(32, 32), dtype=x.dtype, zarr_format=2, attributes=attrs
    )
    a[...] = x


def test_a_v2_array_becomes_a_pyramid_each_level_a_block_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ome_zarr_models.v05.image import Image

    x = np.random.default_rng(1).integers(0, 65536, (203, 150)).astype("uint16")
    src, dst = tmp_path / "v2.zarr", tmp_path / "pyramid.zarr"
    v2_image(src, x)
    report = shardwise.convert(src, dst, shards=(64, 64), pyramid={"levels": 4}, verify=True)
    (rep,) = report.arrays
    assert report.ok and rep.verified and rep.method == "reencode"
    assert (rep.shards, rep.chunks) == ((64, 64), (32, 32))
    assert "4 levels (mean)" in rep.reason
    for k, (got, want) in enumerate(zip(stored(dst, 4), expected_levels(x, 4), strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"level {k}")
    arrays = [zarr.open_array(dst, path=str(k), mode="r") for k in range(4)]
    assert [a.shape for a in arrays] == [(203, 150), (102, 75), (51, 38), (26, 19)]
    assert all(a.metadata.dimension_names == ("y", "x") for a in arrays)
    grid = sum(-(-a.shape[0] // a.shards[0]) * -(-a.shape[1] // a.shards[1]) for a in arrays)
    assert rep.shards_written == grid  # every shard of every level, once
    model = Image.from_zarr(zarr.open_group(dst, mode="r"))
    assert [d.path for d in model.attributes.ome.multiscales[0].datasets] == ["0", "1", "2", "3"]
    # inspect and verify show and check every level of the converted pyramid
    capsys.readouterr()
    assert main(["inspect", str(dst)]) == 0
    shown = capsys.readouterr().out
    for k in range(4):
        assert f"  {k}  " in shown and "shards stored" in shown.split(f"  {k}  ")[1]
    assert main(["verify", str(dst), "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked["ok"] and checked["shards_stored"] == grid


def test_a_v3_sharded_source_in_memory_with_named_shards_and_physical_scale(
    tmp_path: Path,
) -> None:
    from ome_zarr_models.v05.image import Image

    x = np.random.default_rng(2).random((37, 70, 61)).astype("f4")
    src = MemoryStore()
    a = zarr.create_array(
        src, name="raw", shape=x.shape, chunks=(8, 16, 16), shards=(16, 32, 32), dtype="f4",
        dimension_names=("z", "y", "x"),
    )  # fmt: skip
    a[...] = x
    dst = tmp_path / "out.zarr"
    shards = {"z": 16, "y": 64, "x": 64}
    options = dict(levels=3, scale={"z": 2.0, "y": 0.5, "x": 0.5}, units={"x": "micrometer"})
    report = shardwise.convert(
        src, dst, path="raw", dst_path="image", shards=shards, pyramid=options, verify=True
    )
    assert report.ok and report.arrays[0].path == "image"
    level0 = zarr.open_array(dst, path="image/0", mode="r")
    assert (level0.chunks, level0.shards) == ((8, 16, 16), (16, 64, 64))
    for k, (got, want) in enumerate(
        zip(stored(dst, 3, "image"), expected_levels(x, 3), strict=True)
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"level {k}")
    ms = Image.from_zarr(zarr.open_group(dst, path="image", mode="r")).attributes.ome
    transforms = ms.multiscales[0].datasets[2].coordinateTransformations
    assert list(transforms[0].scale) == [8.0, 2.0, 2.0]
    assert [a.unit for a in ms.multiscales[0].axes] == [None, None, "micrometer"]


def test_the_cli_converts_with_pyramid_levels_and_method(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = np.random.default_rng(3).integers(0, 7, (130, 96)).astype("uint8")
    src, dst = tmp_path / "labels.zarr", tmp_path / "out.zarr"
    v2_image(src, labels)
    args = ["convert", str(src), str(dst), "--shards", "64,64", "--no-progress"]
    # the pyramid's options without --pyramid, or a bad count: usage errors, nothing written
    assert main([*args, "--levels", "3"]) == 2
    with pytest.raises(SystemExit) as bad:
        main([*args, "--pyramid", "--levels", "0"])
    assert bad.value.code == 2 and "--levels" in capsys.readouterr().err
    assert not dst.exists()
    pyramid = ["--pyramid", "--levels", "3", "--method", "nearest", "--factors", "2"]
    assert main([*args, *pyramid, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "OME-Zarr pyramid of 3 levels (nearest)" in out and "OK" in out
    for k, got in enumerate(stored(dst, 3)):  # nearest: each block's first sample
        np.testing.assert_array_equal(got, labels[:: 2**k, :: 2**k])


def test_refusals_leave_the_destination_byte_identical(tmp_path: Path) -> None:
    x = np.random.default_rng(4).random((96, 64)).astype("f4")
    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    v2_image(src, x)
    v2_image(tmp_path / "table.zarr", x, ("time", "station"))
    zarr.open_group(tmp_path / "group.zarr", mode="w")
    shardwise.convert(src, dst, pyramid={"levels": 2})
    before = snapshot(dst)
    refused: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
        (tmp_path / "table.zarr", {}, InvalidValueError, "dims must be names among"),
        (src, {"pyramid": {"levels": 0}}, InvalidValueError, "levels"),
        (src, {"pyramid": {"colour": 1}}, InvalidValueError, r"pyramid names \['colour'\]"),
        (src, {"pyramid": "yes"}, InvalidTypeError, "pyramid must be True"),
        (src, {"pyramid": {"method": "max"}}, InvalidValueError, "method"),
        (tmp_path / "group.zarr", {}, InvalidValueError, "is a group"),
    ]
    for source, kw, error, match in refused:
        kw = {"pyramid": True, **kw}
        with pytest.raises(error, match=match):
            shardwise.convert(source, dst, mode="w", **kw)  # "w": refused before it clears
        assert snapshot(dst) == before, (source, kw)
    with pytest.raises(ArrayExistsError):
        shardwise.convert(src, dst, pyramid=True)
    # next to itself: the array's own group contains the source (convert elsewhere, then swap)
    image = tmp_path / "image.zarr"
    zarr.create_array(image, name="0", data=x, chunks=(32, 32), shards=(64, 64))
    image_before = snapshot(image)
    with pytest.raises(PlanError, match="contains the source"):
        shardwise.convert(image, image, path="0", dst_path="", pyramid=True)
    assert snapshot(dst) == before and snapshot(image) == image_before


def test_a_pyramid_next_to_its_source_in_the_same_store(tmp_path: Path) -> None:
    x = np.random.default_rng(6).random((64, 96)).astype("f4")
    root = tmp_path / "s.zarr"
    zarr.create_array(root, name="raw", data=x, chunks=(16, 16), dimension_names=("y", "x"))
    before = snapshot(root)
    report = shardwise.convert(root, root, path="raw", dst_path="raw_pyramid", pyramid=True)
    # auto levels: until x (96 -> 48 -> 24 -> 12) fits one inner chunk of 16: 4 levels, each
    # one shard; the group's and every level's metadata; the source untouched beside them
    rep = report.arrays[0]
    assert (rep.objects_before, rep.objects_after) == (1 + 4 * 6, 1 + 4 + 4)
    assert {k: v for k, v in snapshot(root).items() if k.startswith("raw/")} == {
        k: v for k, v in before.items() if k.startswith("raw/")
    }
    for k, got in enumerate(stored(root, 4, "raw_pyramid")):
        np.testing.assert_allclose(got, expected_levels(x, 4)[k], rtol=1e-6)


class FailingGets(WrapperStore[Store]):
    """Raises on every chunk ``get`` after ``allowed`` of them (metadata reads pass); counts
    the chunk reads by key."""

    def __init__(self, store: Store, allowed: int, state: dict[str, Any] | None = None) -> None:
        super().__init__(store)
        self.state = state if state is not None else {"left": allowed, "reads": Counter()}

    def _with_store(self, store: Store) -> FailingGets:
        return FailingGets(store, 0, self.state)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if not key.rsplit("/", 1)[-1].startswith((".z", "zarr.json")):
            if self.state["left"] <= 0:
                raise OSError(f"source went away reading {key}")
            self.state["left"] -= 1
            self.state["reads"][key] += 1
        return await self._store.get(key, prototype, byte_range)


def test_the_source_is_read_once_for_every_level(tmp_path: Path) -> None:
    x = np.random.default_rng(7).random((160, 96)).astype("f4")
    src = tmp_path / "v2.zarr"
    v2_image(src, x)
    counted = FailingGets(LocalStore(src, read_only=True), allowed=10**6)
    report = shardwise.convert(counted, tmp_path / "out.zarr", shards=(64, 64), pyramid=True)
    assert "of 4 levels" in report.arrays[0].reason  # auto: y 160 -> 80 -> 40 -> 20 < 32
    # each of the 5 x 3 source chunks read once, for level 0 and every reduced level
    assert counted.state["reads"] == {f"{i}.{j}": 1 for i in range(5) for j in range(3)}


def test_an_interrupted_pyramid_conversion_resumes(tmp_path: Path) -> None:
    x = np.random.default_rng(5).random((256, 192)).astype("f4")
    src, dst, ref = tmp_path / "v2.zarr", tmp_path / "out.zarr", tmp_path / "ref.zarr"
    v2_image(src, x)
    kw: dict[str, Any] = dict(shards=(64, 64), pyramid={"levels": 3})
    shardwise.convert(src, ref, **kw)
    flaky = FailingGets(LocalStore(src, read_only=True), allowed=40)  # of 48 source chunks
    # one task at a time: the shards whose source chunks came first are committed
    with dask.config.set(scheduler="synchronous"), pytest.raises(OSError, match="went away"):
        shardwise.convert(flaky, dst, **kw)
    done = {
        p: p.stat().st_ino
        for p in dst.rglob("c/*/*")
        if p.is_file() and ".shardwise" not in str(p) and not p.name.endswith(".partial")
    }
    assert done and "ome" not in zarr.open_group(dst, mode="r").attrs
    with pytest.raises(ArrayExistsError):
        shardwise.convert(src, dst, **kw)
    report = shardwise.convert(src, dst, resume=True, verify=True, **kw)
    assert report.ok and report.arrays[0].shards_skipped == len(done)
    assert {p: p.stat().st_ino for p in done} == done  # none written again
    journal_free = {k: v for k, v in files(dst).items() if ".shardwise" not in k}
    assert journal_free == {k: v for k, v in files(ref).items() if ".shardwise" not in k}
