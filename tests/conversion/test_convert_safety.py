"""convert never destroys its source: a destination that is the source, lies inside it or
contains it is refused before anything is written (local paths through symlinks and relative
paths, Store objects, MemoryStore, S3 through fsspec and obstore; arrays and xarray groups), and
``verify=True`` decodes what it copied: a corrupt source chunk is reported as ``verify`` reports
it. A conversion whose task fails returns only after its running tasks, and releases its lease
after them, as a failed write does."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import numcodecs
import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.abc.store import Store
from zarr.codecs import ZstdCodec
from zarr.storage import FsspecStore, LocalStore, MemoryStore, WrapperStore

import shardwise
from faultkit import BUCKET, CREDS, HeldPut, SeenWaiting, exe, files, moto_s3
from shardwise.durability.lease import read_lease
from shardwise.durability.verify import verify
from shardwise.errors import CorruptShardError, PlanError
from shardwise.storage.store import ShardStore

SWAP = "convert to another location, verify it, then swap it in"


def dataset() -> xr.Dataset:
    rng = np.random.default_rng(3)
    return xr.Dataset(
        {"t2m": (("time", "lat"), rng.standard_normal((12, 6)).astype("f4"))},
        coords={"time": np.arange(12), "lat": np.linspace(-50, 50, 6)},
        attrs={"title": "source"},
    )


def make_source(kind: str, store: Any) -> None:
    """An array (v3 sharded) or an xarray dataset group (v2) at the root of ``store``."""
    if kind == "array":
        x = np.arange(24 * 10, dtype="i4").reshape(24, 10)
        shardwise.write_array(x, store, chunks=(4, 5), shards=(8, 10), mode="w")
    else:
        dataset().chunk({"time": 4}).to_zarr(store, zarr_format=2, mode="w")


def expect_refusal(call: Callable[[], Any], how: str) -> None:
    with pytest.raises(PlanError, match=f"{how} the source") as e:
        call()
    assert SWAP in str(e.value)


# -- local files ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["array", "group"])
def test_local_overlaps_are_refused_and_leave_the_store_byte_identical(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "data" / "src.zarr"
    make_source(kind, src)
    (tmp_path / "link.zarr").symlink_to(src)
    monkeypatch.chdir(tmp_path / "data")
    before = files(tmp_path, journal=True)
    cases: list[tuple[Any, Any, dict[str, Any], str]] = [
        (src, src, {}, "is"),
        (src, tmp_path / "link.zarr", {}, "is"),  # a symlink to it
        (src, "src.zarr", {}, "is"),  # a relative path
        (str(src), f"file://{src}", {}, "is"),
        (src, LocalStore(src), {}, "is"),  # a Store object with the same root
        (LocalStore(tmp_path / "data"), tmp_path / "data", {"path": "src.zarr"}, "is"),
        (src, src / "new", {}, "lies inside"),
        (src, src, {"dst_path": "resharded"}, "lies inside"),
        (src, tmp_path / "data", {}, "contains"),
        (src, tmp_path, {"dst_path": "data"}, "contains"),
    ]
    for s, d, kw, how in cases:
        for mode in ("w", "w-"):
            expect_refusal(
                lambda s=s, d=d, kw=kw, mode=mode: shardwise.convert(s, d, mode=mode, **kw), how
            )
        assert files(tmp_path, journal=True) == before, (s, d, kw)
    assert not (src / "new").exists()


def test_a_sibling_path_in_the_same_store_converts(tmp_path: Path) -> None:
    """The check compares locations, not stores: another path of the same store is fine."""
    store = tmp_path / "g.zarr"
    zarr.open_group(store, mode="w", zarr_format=2)
    x = np.arange(60, dtype="u2")
    zarr.create_array(store, name="v2", shape=(60,), chunks=(10,), dtype="u2", zarr_format=2)[
        ...
    ] = x
    rep = shardwise.convert(store, store, path="v2", dst_path="v3", shards=(30,), verify=True)
    assert rep.ok and rep.arrays[0].method == "copy"
    np.testing.assert_array_equal(zarr.open_array(store, path="v3", mode="r")[...], x)
    assert zarr.open_array(store, path="v2", mode="r").metadata.zarr_format == 2


# -- memory ---------------------------------------------------------------------------------------


def memory_bytes(store: MemoryStore) -> dict[str, bytes]:
    return {k: v.to_bytes() for k, v in store._store_dict.items()}


@pytest.mark.parametrize("kind", ["array", "group"])
def test_memory_store_overlaps_are_refused(kind: str) -> None:
    shared: dict[str, Any] = {}
    store = MemoryStore(shared)
    make_source(kind, store)
    before = memory_bytes(store)
    assert before
    expect_refusal(lambda: shardwise.convert(store, store, mode="w"), "is")
    # another MemoryStore object over the same dict holds the same objects
    expect_refusal(lambda: shardwise.convert(store, MemoryStore(shared), mode="w"), "is")
    expect_refusal(lambda: shardwise.convert(store, store, dst_path="sub", mode="w"), "lies inside")
    assert memory_bytes(store) == before
    other = MemoryStore()
    assert shardwise.convert(store, other, verify=True).ok
    assert memory_bytes(store) == before


# -- S3 (moto) ------------------------------------------------------------------------------------


def s3_options(endpoint: str) -> dict[str, Any]:
    return {
        "endpoint_url": endpoint,
        "key": CREDS["key"],
        "secret": CREDS["secret"],
        "client_kwargs": {"region_name": CREDS["region"]},
    }


@pytest.mark.parametrize("kind", ["array", "group"])
def test_s3_overlaps_are_refused_across_fsspec_and_obstore(kind: str) -> None:
    top = f"overlap-{kind}"  # moto keeps its buckets for the whole process: a prefix per case
    with moto_s3() as s3:
        opts = s3_options(s3.endpoint)
        src = s3.obstore(f"{top}/src")
        make_source(kind, src)
        before = s3.keys(top)
        assert before
        url = f"s3://{BUCKET}/{top}/src"
        cases: list[tuple[Any, Any, dict[str, Any], str]] = [
            (src, s3.obstore(f"{top}/src"), {}, "is"),
            (src, url, {}, "is"),  # fsspec by URL, the same bucket and prefix
            (url, src, {}, "is"),
            (src, FsspecStore.from_url(url + "/", storage_options=opts), {}, "is"),
            (src, s3.obstore(f"{top}/src/new"), {}, "lies inside"),
            (url, url + "/new", {}, "lies inside"),
            (src, s3.obstore(top), {}, "contains"),
            (src, s3.obstore(top), {"dst_path": "src"}, "is"),
        ]
        for s, d, kw, how in cases:
            expect_refusal(
                lambda s=s, d=d, kw=kw: shardwise.convert(
                    s, d, mode="w", storage_options=opts, **kw
                ),
                how,
            )
            assert s3.keys(top) == before, (s, d, kw)
        # a sibling prefix of the same bucket is another place
        rep = shardwise.convert(src, s3.obstore(f"{top}/src2"), verify=True)
        assert rep.ok
        assert s3.keys(f"{top}/src") == {k[len("src/") :]: v for k, v in before.items()}


# -- verify decodes what it copied ----------------------------------------------------------------


def _flip(path: Path, at: int | None = None) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 if at is None else at] ^= 0xFF
    path.write_bytes(bytes(raw))


def _v2(root: Path, compressor: Any) -> Path:
    x = (np.arange(37 * 50).reshape(37, 50) % 251).astype("<u2")
    zarr.create_array(
        root, shape=x.shape, chunks=(8, 10), dtype="<u2", zarr_format=2, compressors=compressor
    )[...] = x
    return root / "1.2"


def _v3(root: Path, compressor: Any) -> Path:
    x = (np.arange(37 * 50).reshape(37, 50) % 251).astype("<u2")
    zarr.create_array(root, shape=x.shape, chunks=(8, 10), dtype="<u2", compressors=compressor)[
        ...
    ] = x
    return root / "c" / "1" / "2"


@pytest.mark.parametrize(
    "make",
    [
        lambda r: _v2(r, numcodecs.GZip()),
        lambda r: _v2(r, numcodecs.Zstd(checksum=True)),
        lambda r: _v3(r, ZstdCodec(checksum=True)),
    ],
    ids=["v2-gzip", "v2-zstd-checksum", "v3-zstd-checksum"],
)
def test_verify_reports_a_corrupt_source_chunk_as_verify_does(
    make: Callable[[Path], Path], tmp_path: Path
) -> None:
    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    _flip(make(src))  # a byte inside the compressed chunk (1, 2) of the source
    rep = shardwise.convert(src, dst, shards=(16, 20), verify=True)
    assert rep.arrays[0].method == "copy" and rep.arrays[0].verified is False and not rep.ok
    # chunk (1, 2) is inner chunk (1, 0) of shard (0, 1)
    assert len(rep.problems) == 1
    assert rep.problems[0].startswith("corrupt    c/0/1 chunk (1, 0): inner chunk does not decode")
    found = shardwise.verify(dst)
    assert [str(p) for p in found.problems] == rep.problems


def test_verify_reports_a_corrupt_chunk_of_a_sharded_source(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    x = np.arange(32 * 40, dtype="f4").reshape(32, 40)
    shardwise.write_array(x, src, chunks=(8, 10), shards=(16, 20))  # checksummed zstd chunks
    _flip(src / "c" / "1" / "1", at=12)  # inside the first stored inner chunk of shard (1, 1)
    rep = shardwise.convert(src, dst, shards=(32, 40), verify=True, dst_path="out")
    assert not rep.ok
    assert [p.split(":")[0] for p in rep.problems] == ["corrupt    out/c/0/0 chunk (2, 2)"]
    assert [str(p) for p in shardwise.verify(dst, path="out").problems] == rep.problems
    # without the corruption the same conversion verifies
    good = tmp_path / "good.zarr"
    shardwise.write_array(x, good, chunks=(8, 10), shards=(16, 20))
    assert shardwise.convert(good, tmp_path / "ok.zarr", shards=(32, 40), verify=True).ok
    assert os.path.exists(tmp_path / "ok.zarr" / "c" / "0" / "0")


def test_convert_verify_on_the_command_line_exits_1_for_a_corrupt_source_chunk(
    tmp_path: Path,
) -> None:
    """The exit status docs/cli.md gives for problems found (1) from ``convert --verify``: the
    copy is made, its check decodes the corrupt chunk and says which one."""
    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    _flip(_v3(src, ZstdCodec(checksum=True)))
    args = [*exe(), "convert", str(src), str(dst), "--shards", "16,20", "--verify"]
    proc = subprocess.run([*args, "--no-progress"], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "c/0/1 chunk (1, 0)" in proc.stdout + proc.stderr
    # the same conversion of an intact source exits 0
    good = tmp_path / "good.zarr"
    _v3(good, ZstdCodec(checksum=True))
    ok = [*exe(), "convert", str(good), str(tmp_path / "ok.zarr"), "--shards", "16,20"]
    proc = subprocess.run([*ok, "--verify", "--no-progress"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _sharded(root: Path) -> Path:
    x = (np.arange(37 * 50).reshape(37, 50) % 251).astype("<u2")
    shardwise.write_array(x, root, chunks=(8, 10), shards=(16, 20))  # checksummed zstd chunks
    return root / "c" / "1" / "1"


DECODED = [  # (a corrupt source, its key): conversions that decode the source
    (lambda r: _v2(r, numcodecs.GZip()), "1.2"),
    (lambda r: _v2(r, numcodecs.Zstd(checksum=True)), "1.2"),
    (_sharded, "c/1/1"),
]


@pytest.mark.parametrize(
    "how",
    [{"shards": (16, 20), "chunks": (4, 5)}, {"pyramid": {"levels": 2}}],
    ids=["reencode", "pyramid"],
)
@pytest.mark.parametrize(("make", "key"), DECODED, ids=["v2-gzip", "v2-zstd", "v3-sharded"])
def test_verify_reports_a_corrupt_source_chunk_the_conversion_decodes(
    make: Callable[[Path], Path], key: str, how: dict[str, Any], tmp_path: Path
) -> None:
    """A conversion that re-encodes (new inner chunks, a pyramid) stops at a source chunk that
    does not decode: with verify=True it is reported naming its key (not a decoder's raw
    error), the array is not verified, and verify of the destination finds the unfinished
    write; without verify the error is shardwise's, naming the key."""
    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    _flip(make(src), at=12)
    rep = shardwise.convert(src, dst, verify=True, **how)
    assert not rep.ok and rep.arrays[-1].verified is False
    assert len(rep.problems) == 1 and rep.problems[0].startswith(f"corrupt    {key}"), rep.problems
    assert "does not decode" in rep.problems[0] or "cannot decode" in rep.problems[0]
    assert not shardwise.verify(dst, path="0" if "pyramid" in how else None).ok
    with pytest.raises(CorruptShardError, match=f"'{key}'"):
        shardwise.convert(src, tmp_path / "raw.zarr", **how)


@pytest.mark.parametrize(("make", "key"), DECODED[::2], ids=["v2-gzip", "v3-sharded"])
def test_convert_verify_on_the_command_line_exits_1_for_a_chunk_it_decodes(
    make: Callable[[Path], Path], key: str, tmp_path: Path
) -> None:
    src = tmp_path / "src.zarr"
    _flip(make(src), at=12)
    for cmd in (
        ["convert", "--pyramid", "--levels", "2"],
        ["reshard", "--shards", "16,20", "--chunks", "4,5"],
    ):
        dst = tmp_path / f"{cmd[0]}.zarr"
        args = [*exe(), cmd[0], str(src), str(dst), *cmd[1:], "--verify", "--no-progress"]
        proc = subprocess.run(args, capture_output=True, text=True)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"corrupt    {key}" in proc.stdout, proc.stdout + proc.stderr
        assert "verification FAILED" in proc.stdout


# -- a conversion that fails stops its running tasks before it returns ---------------------------


class FailingGet(WrapperStore[Store]):
    """Reading ``key`` waits until ``first`` is set (a put of the destination is under way),
    then fails, without blocking the store's event loop."""

    def __init__(self, store: Store, key: str, first: threading.Event) -> None:
        super().__init__(store)
        self.key, self.first = key, first

    def _with_store(self, store: Store) -> FailingGet:
        return FailingGet(store, self.key, self.first)

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        if key == self.key:
            assert await asyncio.to_thread(self.first.wait, 300), "no destination put started"
            raise RuntimeError("source failed")
        return await self._store.get(key, prototype, byte_range)


FAIL_DATA = np.arange(24 * 20, dtype="i4").reshape(24, 20)


def failed_conversion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, landed: Callable[[], None] | None = None
) -> tuple[bool, Path, Path]:
    """Convert an unsharded v3 array (chunks 4x4) into 8x8 shards (copied, 9 shard tasks on two
    threads): reading the source chunk of the last shard fails once the put of shard c/0/0 is
    under way; that put is held until the conversion, after the failure, waits for its running
    tasks (or, if it does not wait, until the call has returned). Returns whether the put
    landed before the call returned, the source and the destination."""
    from shardwise.runtime import pool as _pool

    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    zarr.create_array(LocalStore(src), shape=(24, 20), chunks=(4, 4), dtype="i4")[...] = FAIL_DATA
    held, go, resumed = threading.Event(), threading.Event(), threading.Event()
    monkeypatch.setattr(_pool, "_tasks", SeenWaiting(go))
    source = FailingGet(LocalStore(src), "c/5/4", held)
    target = HeldPut(LocalStore(dst), "c/0/0", held, go, resumed, landed)
    try:
        with (
            dask.config.set(scheduler="threads", num_workers=2),
            pytest.raises(RuntimeError, match="source failed"),
        ):
            shardwise.convert(source, target, shards=(8, 8))
        landed_before_return = resumed.is_set()
    finally:
        go.set()  # a conversion that did not wait: its put lands now (the test has seen enough)
        assert resumed.wait(300), "the held put never landed"
    return landed_before_return, src, dst


def test_a_failed_conversion_returns_after_its_running_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a failed write: nothing of the conversion lands after the call returned; a rerun with
    resume=True keeps the shard that landed and finishes the copy."""
    landed_before_return, src, dst = failed_conversion(tmp_path, monkeypatch)
    assert landed_before_return, "the call returned before its running put had landed"
    assert (dst / "c" / "0" / "0").exists()
    assert read_lease(ShardStore(LocalStore(dst))) is None
    assert [p.kind for p in verify(dst).problems] == ["incomplete"]
    report = shardwise.convert(src, dst, shards=(8, 8), resume=True)
    [array] = report.arrays
    assert array.method == "copy" and array.shards_skipped >= 1
    assert array.shards_skipped + array.shards_written == 9
    np.testing.assert_array_equal(shardwise.open_array(dst).compute(), FAIL_DATA)
    assert verify(dst).ok


def test_a_failed_conversion_releases_its_lease_after_its_tasks_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease stays held while a task of the failed conversion still writes: when the held
    put lands, the lease is there; once the call has returned, it is gone."""
    dst = tmp_path / "dst.zarr"
    leased_when_landed: list[bool] = []

    def landed() -> None:
        leased_when_landed.append(read_lease(ShardStore(LocalStore(dst))) is not None)

    failed_conversion(tmp_path, monkeypatch, landed)
    assert leased_when_landed == [True], "the lease was released while a task still wrote"
    assert read_lease(ShardStore(LocalStore(dst))) is None


def _cut(path: Path) -> None:
    """The chunk object cut short: no decoder takes it."""
    path.write_bytes(path.read_bytes()[:-7])


@pytest.mark.parametrize(
    "compressor",
    [numcodecs.Zstd(), numcodecs.Blosc(), numcodecs.GZip(), None],
    ids=["zstd", "blosc", "gzip", "none"],
)
@pytest.mark.parametrize("dst_path", [None, "out/a"])
def test_a_copied_corrupt_chunk_is_reported_by_verify_true_as_verify_reports_it(
    tmp_path: Path, compressor: Any, dst_path: str | None
) -> None:
    """A source chunk copied as it is (not re-encoded) that does not decode: convert's
    ``verify=True`` reports it exactly as ``verify`` of the destination does (ok False, the
    copied shard's key and inner chunk named), for every codec a copy keeps, at the root or a
    path; a rerun with ``resume=True`` (nothing to do) reports it again."""
    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    _cut(_v2(src, compressor))
    rep = shardwise.convert(src, dst, shards=(16, 20), verify=True, dst_path=dst_path)
    assert rep.arrays[0].method == "copy" and rep.arrays[0].verified is False and not rep.ok
    where = f"{dst_path}/" if dst_path else ""
    assert len(rep.problems) == 1
    assert rep.problems[0].startswith(f"corrupt    {where}c/0/1 chunk (1, 0): inner chunk does")
    assert [str(p) for p in shardwise.verify(dst, path=dst_path).problems] == rep.problems
    again = shardwise.convert(src, dst, shards=(16, 20), verify=True, dst_path=dst_path,
                              resume=True)  # fmt: skip
    assert again.problems == rep.problems and not again.ok


@pytest.mark.parametrize(
    ("compressor", "corrupt"),
    [
        (numcodecs.BZ2(), lambda p: _flip(p, at=0)),  # OSError("Invalid data stream")
        (numcodecs.BZ2(), _cut),  # EOFError
        (numcodecs.LZMA(), _cut),  # LZMAError
    ],
    ids=["bz2-header", "bz2-cut", "lzma-cut"],
)
def test_a_corrupt_chunk_of_a_codec_the_conversion_decodes_is_named_by_its_key(
    tmp_path: Path, compressor: Any, corrupt: Callable[[Path], None]
) -> None:
    """bz2 (an OSError without errno) and lzma (LZMAError) raise their own errors for bytes
    that do not decode: re-encoded, such a chunk is a problem of ``verify=True`` naming its
    key, and without verify a CorruptShardError naming it (not the decoder's raw error)."""
    src, dst = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    corrupt(_v2(src, compressor))
    rep = shardwise.convert(src, dst, shards=(16, 20), verify=True)
    assert rep.arrays[0].method == "reencode" and not rep.ok
    assert len(rep.problems) == 1 and rep.problems[0].startswith("corrupt    1.2"), rep.problems
    with pytest.raises(CorruptShardError, match=r"'1\.2'"):
        shardwise.convert(src, tmp_path / "raw.zarr", shards=(16, 20))
