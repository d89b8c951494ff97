"""The edges of conditional commits that the races of test_conditional.py do not reach.

* ``commit_beside``: an object that describes a shard (its journal record) is stored or removed
  only while the shard is still the commit it describes; a later commit's writer owns it then;
* a caller's ``tries=`` bounds the read-merge-commit rounds (not the module default);
* a store without conditional commits (and the check turned off): one unchecked merge, the
  object stored, removed or left absent as the merge says.

Real stores (local files, zarr's MemoryStore); another writer's commit is made for real between
the read and the commit through the ``before_commit`` hook.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from zarr.abc.store import Store
from zarr.storage import LocalStore, MemoryStore

import shardwise.storage.conditional as cond
from faultkit import NoSpaceStore
from shardwise import ShardConflictError
from shardwise.storage.conditional import (
    CONFLICT,
    UNCHECKED,
    commit_beside,
    read_merge_commit,
    versions,
)
from shardwise.storage.store import ShardStore

SHARD, RECORD = "c/0/0", ".shardwise/journal/c.0.0"


@pytest.fixture(params=["local", "memory"])
def sstore(request: pytest.FixtureRequest, tmp_path: Path) -> ShardStore:
    store: Store = LocalStore(tmp_path / "a.zarr") if request.param == "local" else MemoryStore()
    return ShardStore(store, "arr")


def _commit(s: ShardStore, data: bytes, expected: Any) -> Any:
    v = versions(s)
    assert v is not None
    gen = v.commit(SHARD, [data], expected)
    assert gen is not CONFLICT
    return gen


# -- commit_beside ---------------------------------------------------------------------------------


def test_commit_beside_stores_the_record_of_the_current_commit(sstore: ShardStore) -> None:
    gen = _commit(sstore, b"shard one", None)
    commit_beside(sstore, RECORD, b"record one", owner=SHARD, generation=gen)
    assert sstore.get(RECORD) == b"record one"
    commit_beside(sstore, RECORD, b"record one, again", owner=SHARD, generation=gen)
    assert sstore.get(RECORD) == b"record one, again"  # replaces its own record
    commit_beside(sstore, RECORD, None, owner=SHARD, generation=gen)
    assert sstore.get(RECORD) is None  # None removes it


def test_commit_beside_leaves_the_record_of_a_later_commit(sstore: ShardStore) -> None:
    """Writer A committed the shard, then writer B replaced it and stored B's record: A's late
    record (or its removal) must not overwrite B's."""
    gen_a = _commit(sstore, b"shard by A", None)
    gen_b = _commit(sstore, b"shard by B", gen_a)
    commit_beside(sstore, RECORD, b"record of B", owner=SHARD, generation=gen_b)
    commit_beside(sstore, RECORD, b"record of A", owner=SHARD, generation=gen_a)
    assert sstore.get(RECORD) == b"record of B"
    commit_beside(sstore, RECORD, None, owner=SHARD, generation=gen_a)
    assert sstore.get(RECORD) == b"record of B"


def test_commit_beside_after_the_shard_was_removed(sstore: ShardStore) -> None:
    gen = _commit(sstore, b"shard", None)
    v = versions(sstore)
    assert v is not None and v.commit(SHARD, None, gen) is None  # removed by another writer
    commit_beside(sstore, RECORD, b"stale record", owner=SHARD, generation=gen)
    assert sstore.get(RECORD) is None
    commit_beside(sstore, RECORD, b"record of the removal", owner=SHARD, generation=None)
    assert sstore.get(RECORD) == b"record of the removal"


def test_commit_beside_an_unchecked_commit_stores_unconditionally(sstore: ShardStore) -> None:
    _commit(sstore, b"shard", None)
    commit_beside(sstore, RECORD, b"record", owner=SHARD, generation=UNCHECKED)
    assert sstore.get(RECORD) == b"record"
    commit_beside(sstore, RECORD, None, owner=SHARD, generation=UNCHECKED)
    assert sstore.get(RECORD) is None


# -- the caller's tries ----------------------------------------------------------------------------


def _always_overtaken(
    s: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[int], Callable[[bytes | None], tuple[int, list[bytes]]]]:
    """A merge, and a hook that commits another writer's shard between every merge and commit."""
    merges: list[int] = []
    _commit(s, b"first", None)

    def other_writer(name: str, attempt: int) -> None:
        s.put(name, b"other writer, round %d" % attempt)

    def merge(old: bytes | None) -> tuple[int, list[bytes]]:
        merges.append(len(old or b""))
        return len(merges), [b"mine"]

    monkeypatch.setattr(cond, "before_commit", other_writer)
    monkeypatch.setattr(cond, "BACKOFF", 0.0)
    monkeypatch.setattr(cond, "BACKOFF_MAX", 0.0)
    return merges, merge


@pytest.mark.parametrize("tries", [1, 2, 5])
def test_a_callers_tries_bound_the_rounds(
    sstore: ShardStore, monkeypatch: pytest.MonkeyPatch, tries: int
) -> None:
    merges, merge = _always_overtaken(sstore, monkeypatch)
    with pytest.raises(ShardConflictError) as err:
        read_merge_commit(sstore, SHARD, merge, tries=tries)
    assert err.value.tries == tries and len(merges) == tries
    assert sstore.get(SHARD) == b"other writer, round %d" % (tries - 1)  # never "mine"


def test_without_tries_the_module_default_bounds_the_rounds(
    sstore: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    merges, merge = _always_overtaken(sstore, monkeypatch)
    monkeypatch.setattr(cond, "TRIES", 3)
    with pytest.raises(ShardConflictError) as err:
        read_merge_commit(sstore, SHARD, merge)
    assert err.value.tries == 3 and len(merges) == 3


def test_a_round_lost_then_won_counts_one_conflict(
    sstore: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    merges, merge = _always_overtaken(sstore, monkeypatch)
    hook = cond.before_commit
    assert hook is not None
    monkeypatch.setattr(cond, "before_commit", lambda n, a: hook(n, a) if a == 0 else None)
    done = read_merge_commit(sstore, SHARD, merge, tries=2)
    assert done.conflicts == 1 and done.result == 2 and done.existed
    assert len(merges) == 2 and merges[1] == len(b"other writer, round 0")  # merged onto B's
    assert sstore.get(SHARD) == b"mine"
    v = versions(sstore)
    assert v is not None and v.head(SHARD) == done.generation


# -- stores without conditional commits ------------------------------------------------------------


def _unchecked_store(tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> ShardStore:
    if how == "store without conditional commits":
        s = ShardStore(NoSpaceStore(LocalStore(tmp_path / "a.zarr"), budget=1 << 30), "arr")
        assert versions(s) is None
        return s
    monkeypatch.setattr(cond, "ENABLED", False)
    return ShardStore(LocalStore(tmp_path / "a.zarr"), "arr")


@pytest.mark.parametrize("how", ["store without conditional commits", "check turned off"])
def test_unchecked_merge_stores_removes_or_leaves_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    s = _unchecked_store(tmp_path, how, monkeypatch)
    seen: list[tuple[bytes | None, str, int]] = []
    monkeypatch.setattr(cond, "before_commit", lambda n, a: seen.append((s.get(n), n, a)))

    def put(old: bytes | None) -> tuple[str, list[bytes]]:
        return f"saw {old!r}", [b"ab", b"cd"]

    done = read_merge_commit(s, SHARD, put, tries=1)
    assert (done.result, done.stored, done.existed) == ("saw None", [b"ab", b"cd"], False)
    assert done.generation is UNCHECKED and done.conflicts == 0
    assert s.get(SHARD) == b"abcd" and seen == [(None, SHARD, 0)]  # hook before the put

    def remove(old: bytes | None) -> tuple[str, None]:
        return f"saw {old!r}", None

    done = read_merge_commit(s, SHARD, remove)
    assert (done.result, done.stored, done.existed) == ("saw b'abcd'", None, True)
    assert s.get(SHARD) is None and seen[-1] == (b"abcd", SHARD, 0)  # hook before the delete
    done = read_merge_commit(s, SHARD, remove)
    assert (done.result, done.stored, done.existed) == ("saw None", None, False)
    assert done.generation is UNCHECKED and s.get(SHARD) is None
