"""A store whose listing fails is an error, never "nothing there".

shardwise lists a store to find the shared leases, an interrupted write's journal, the objects
``verify`` checks and a group's members. A listing that raises must surface: read as an empty
prefix, a write would miss the shared leases of the writers beside it and ``verify`` would find
an array of no shards. And a write that fails that way keeps no lease (its exclusive lease,
created before the look at the shared ones, is removed). The only answers read as "nothing
there" are the ones that mean it: a missing directory (``FileNotFoundError``) and icechunk's
"bad key prefix" for a name that is no node. On local files the walk of the directories is the
listing: a directory it cannot read is an error too (the test runs as any user: the directory's
read is made to fail where ``os.walk`` reads it, as a permission the user lacks would).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zarr.core.sync import sync
from zarr.storage import LocalStore, MemoryStore, WrapperStore

import shardwise
from faultkit import snapshot
from shardwise.storage.overlay import Overlay
from shardwise.storage.store import ShardStore


class FailingList(WrapperStore[Any]):
    """A memory store whose listings raise ``error`` once it is set (reads and writes work)."""

    error: Exception | None = None

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def list(self) -> AsyncIterator[str]:
        self._check()
        return self._store.list()

    def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        self._check()
        return self._store.list_prefix(prefix)

    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        self._check()
        return self._store.list_dir(prefix)


def _written() -> tuple[FailingList, MemoryStore]:
    base = MemoryStore()
    store = FailingList(base)
    shardwise.write_array(np.arange(64).reshape(8, 8), store, chunks=2, shards=4)
    return store, base


def _state(base: MemoryStore) -> dict[str, bytes]:
    return {k: v.to_bytes() for k, v in base._store_dict.items()}


def test_a_failing_list_is_an_error_for_the_store_and_verify() -> None:
    store, _ = _written()
    assert ShardStore(store).list("")  # the shards and the journal, while listing works
    store.error = PermissionError("listing refused")
    with pytest.raises(PermissionError, match="listing refused"):
        ShardStore(store).list("")
    with pytest.raises(PermissionError, match="listing refused"):
        shardwise.verify(store)


@pytest.mark.parametrize(
    ("mode", "extra"),
    [
        ("w", {}),
        ("r+", {}),
        ("a", {"resume": True}),
        ("r+", {"region": (slice(0, 4), slice(None))}),
    ],
    ids=["w", "r+", "a-resume", "r+-region"],
)
def test_a_write_that_cannot_list_fails_and_keeps_no_lease(mode: str, extra: dict) -> None:
    """The write fails with the store's error and leaves the store as it was: no exclusive or
    shared lease of its own left behind, and the next write (listing again) goes through."""
    store, base = _written()
    before = _state(base)
    store.error = PermissionError("listing refused")
    x = np.full((8, 8), 7)
    source = x[extra["region"]] if "region" in extra else x
    with pytest.raises(PermissionError, match="listing refused"):
        shardwise.write_array(source, store, mode=mode, chunks=2, shards=4, **extra)
    assert _state(base) == before
    store.error = None
    shardwise.write_array(x, store, mode="r+")
    np.testing.assert_array_equal(shardwise.read_array(store), x)


async def _keys(listing: AsyncIterator[str]) -> list[str]:
    return sorted([k async for k in listing])


def test_an_overlay_reads_only_missing_prefixes_as_empty() -> None:
    """The dry-run overlay (every metadata write runs through one) lists through its base:
    a missing directory and icechunk's bad key prefix are empty, any other error raises."""
    store, _ = _written()
    overlay = Overlay(store, read_only=True)
    assert "zarr.json" in sync(_keys(overlay.list_prefix("")))
    for error in (PermissionError("listing refused"), ValueError("listing refused")):
        store.error = error
        with pytest.raises(type(error), match="listing refused"):
            sync(_keys(overlay.list_prefix("")))
    for empty in (FileNotFoundError("no such directory"), ValueError("bad key prefix: g")):
        store.error = empty
        assert sync(_keys(overlay.list_prefix("g/"))) == []


def _unreadable(monkeypatch: pytest.MonkeyPatch, where: Path, error: OSError) -> None:
    """``os.scandir`` of ``where`` fails with ``error`` (as for a directory the user may not
    read, or one removed meanwhile); every other directory reads as it is."""
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if Path(path) == where:
            raise error
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_a_local_directory_that_cannot_be_read_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "a"
    x = np.arange(64).reshape(8, 8)
    shardwise.write_array(x, str(root), chunks=2, shards=4)
    before = snapshot(root)
    denied = PermissionError(13, "Permission denied", str(root / "c"))
    _unreadable(monkeypatch, root / "c", denied)
    with pytest.raises(PermissionError, match="Permission denied"):
        ShardStore(LocalStore(root)).list("")
    with pytest.raises(PermissionError, match="Permission denied"):
        shardwise.verify(str(root))  # not "every shard missing"
    monkeypatch.undo()
    assert snapshot(root) == before
    assert shardwise.verify(str(root)).ok


def test_a_local_directory_removed_while_listed_holds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "a"
    shardwise.write_array(np.arange(64).reshape(8, 8), str(root), chunks=2, shards=4)
    gone = FileNotFoundError(2, "No such file or directory", str(root / "c" / "1"))
    _unreadable(monkeypatch, root / "c" / "1", gone)
    names = ShardStore(LocalStore(root)).list("")
    assert "c/0/0" in names and not [n for n in names if n.startswith("c/1/")]


class FailingGet(WrapperStore[Any]):
    """A memory store whose gets of keys ending in ``failing`` raise once it is set."""

    failing: str | None = None

    async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        if self.failing is not None and key.endswith(self.failing):
            raise PermissionError(f"reading {key!r} refused")
        return await self._store.get(key, *args, **kwargs)


@pytest.mark.parametrize("kind", ["exclusive", "shared"])
def test_an_acquire_that_cannot_look_at_the_other_side_keeps_no_lease(kind: str) -> None:
    """Each side of the lease creates its own object, then looks for the other side's: when
    that look fails, the error is raised and its own object removed (kept, it would refuse
    every other writer of the array while this process lives)."""
    from shardwise.durability.lease import Lease

    base = MemoryStore()
    store = FailingGet(base)
    if kind == "shared":
        store.failing = ".shardwise/lease"  # the exclusive lease, read after the shared put
        with pytest.raises(PermissionError, match="refused"):
            Lease.acquire_shared(ShardStore(store))
    else:
        broken = FailingList(base)
        broken.error = PermissionError("listing refused")  # the shared leases, listed after
        with pytest.raises(PermissionError, match="refused"):
            Lease.acquire(ShardStore(broken))
    assert _state(base) == {}
