"""The arenas a shard task keeps its compressed inner chunks in (codec/frames.py): the bytes are
those of fresh frames, a full arena hands out exact bytes, one arena serves shard after shard of a
write without changing what was stored, and a child forked while the arenas' lock was held
writes all the same."""

from __future__ import annotations

import multiprocessing as mp
import threading
import traceback
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest

import shardwise
from shardwise.codec import frames
from shardwise.codec.chunks import ChunkCodec
from shardwise.codec.codecs import Zstd
from shardwise.codec.shard import ShardCodec, encode_shard
from shardwise.engine.read import open_reader

CHUNK = (32, 32, 64)  # 128 KiB of uint16: compressed one chunk at a time
SHARD = (64, 64, 128)  # 1 MiB raw: just large enough for an arena
SHAPE = (128, 128, 256)  # 8 shards


def data(shape: tuple[int, ...] = SHAPE, seed: int = 7) -> np.ndarray:
    """Compressible, different in every chunk (a ramp plus noise, the zeros at one corner)."""
    rng = np.random.default_rng(seed)
    ramp = np.add.outer(np.arange(shape[0]), np.arange(shape[1] * shape[2])).reshape(shape)
    out = (ramp + rng.integers(0, 64, shape)).astype("uint16")
    out[:32, :32, :64] = 0  # one inner chunk of the fill value: not stored
    return out


def codec() -> ShardCodec:
    inner = ChunkCodec(CHUNK, np.dtype("uint16"), 0, bytes_codecs=(Zstd(level=3),))
    return ShardCodec(SHARD, inner)


def test_a_shard_kept_in_an_arena_is_the_same_bytes() -> None:
    block = data(SHARD)
    fresh = encode_shard(codec(), block, threads=2)
    arena = frames.FrameArena(2**20)
    kept = encode_shard(codec(), block, threads=2, frames=arena)
    assert fresh is not None and kept is not None
    assert kept.data == fresh.data
    assert (kept.chunks_stored, kept.chunks_empty) == (7, 1)
    chunks = kept.parts[:-1]  # the index comes last
    assert all(isinstance(p, memoryview) for p in chunks)
    assert arena.used == sum(len(p) for p in chunks) == kept.nbytes - codec().index_nbytes


def test_frames_beyond_a_full_arena_are_exact_bytes() -> None:
    block = data(SHARD)
    fresh = encode_shard(codec(), block, threads=1)
    assert fresh is not None
    sizes = [len(p) for p in fresh.parts[:-1]]
    # room for the first three frames and less than any later one
    arena = frames.FrameArena(sum(sizes[:3]) + min(sizes[3:]) - 1)
    kept = encode_shard(codec(), block, threads=1, frames=arena)
    assert kept is not None and kept.data == fresh.data
    assert arena.used == sum(sizes[:3])
    views = [p for p in kept.parts[:-1] if isinstance(p, memoryview)]
    assert len(views) == 3
    overflow = [p for p in kept.parts[:-1] if not isinstance(p, memoryview)]
    assert [type(p) for p in overflow] == [bytes] * 4
    assert [len(p) for p in overflow] == sizes[3:]


def test_arenas_are_lent_one_task_at_a_time_and_kept_within_their_bound() -> None:
    big = frames.ARENA_MAX
    with frames.borrowed(big) as a, frames.borrowed(big) as b, frames.borrowed(big) as c:
        assert a is not None and b is not None and c is not None
        assert len({id(a), id(b), id(c)}) == 3
    assert frames.kept() <= frames.KEEP_BYTES
    with frames.borrowed(2**19) as small:  # a shard under 1 MiB takes no arena
        assert small is None
    with frames.borrowed(3 * 2**20) as again:
        assert again is not None and again.used == 0 and again.capacity >= 3 * 2**20


def _stored(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted((root / "c").rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_one_arena_serves_shard_after_shard_without_changing_stored_bytes(
    tmp_path: Path, scheduler: str
) -> None:
    x = data()
    with dask.config.set(scheduler=scheduler):
        shardwise.write_array(
            x, tmp_path / "a", chunks=CHUNK, shards=SHARD, fill_value=0, compressors=_zstd()
        )
    assert frames.kept() > 0  # the arenas went back to be lent again
    stored = _stored(tmp_path / "a")
    assert len(stored) == 8
    info = open_reader(str(tmp_path / "a")).info
    for key, got in stored.items():
        idx = [int(i) for i in key.split("/")[1:]]
        block = x[tuple(slice(i * s, (i + 1) * s) for i, s in zip(idx, SHARD, strict=True))]
        fresh = encode_shard(info.codec, block, threads=1)  # no arena: new bytes for all
        assert fresh is not None and got == fresh.data, key
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "a"), x)


def _zstd() -> Any:
    import zarr

    return zarr.codecs.ZstdCodec(level=3)


def _child_write(root: str, out: Any) -> None:
    try:
        with dask.config.set(scheduler="sync"):
            shardwise.write_array(
                data(), root, chunks=CHUNK, shards=SHARD, fill_value=0, compressors=_zstd()
            )
        assert frames.kept() > 0
    except BaseException:
        out.put(traceback.format_exc())
    else:
        out.put("ok")


def test_a_child_forked_while_the_arenas_lock_is_held_writes(tmp_path: Path) -> None:
    # the parent has used arenas; another thread holds their lock when the child is forked
    with dask.config.set(scheduler="sync"):
        shardwise.write_array(
            data(), tmp_path / "p", chunks=CHUNK, shards=SHARD, fill_value=0, compressors=_zstd()
        )
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with frames._lock:
            held.set()
            release.wait(300)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(300)
    ctx = mp.get_context("fork")
    out = ctx.SimpleQueue()
    try:
        with pytest.warns(DeprecationWarning, match="multi-threaded"):
            child = ctx.Process(target=_child_write, args=(str(tmp_path / "c"), out))
            child.start()
        child.join(timeout=120)
        if child.is_alive():
            child.kill()
            child.join(30)
            pytest.fail("the forked child hung on the arenas' lock")
    finally:
        release.set()
        holder.join()
    assert child.exitcode == 0
    assert out.get() == "ok"
    np.testing.assert_array_equal(shardwise.read_array(tmp_path / "c"), data())
