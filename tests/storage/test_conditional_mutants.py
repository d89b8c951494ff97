"""Survivors of the mutation lane in storage/conditional (`mutation/run.py storage/conditional`):
how many rounds ``commit_beside`` makes before it gives up and what its error names, and the
conflicts a ``read_merge_commit`` reports when it finds nothing left to delete. Each test names
the mutants it kills. Real stores (local files, zarr's MemoryStore); other writers are real
writes to the same store, made between a writer's read and its commit.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from zarr.abc.store import Store
from zarr.storage import LocalStore, MemoryStore

import shardwise.storage.conditional as cond
from shardwise import ShardConflictError
from shardwise.storage.conditional import commit_beside, read_merge_commit, versions
from shardwise.storage.store import ShardStore

SHARD, RECORD = "c/0/0", ".shardwise/shards/c/0/0"


@pytest.fixture(params=["local", "memory"])
def sstore(request: pytest.FixtureRequest, tmp_path: Path) -> ShardStore:
    store: Store = LocalStore(tmp_path / "a.zarr") if request.param == "local" else MemoryStore()
    return ShardStore(store, "arr")


def test_commit_beside_gives_up_after_its_rounds_and_names_the_record(
    sstore: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills `commit_beside` looping `TRIES * 5` rounds, reporting `TRIES * 5` or no key: a
    record that another writer rewrites before every commit makes it stop after `TRIES * 4`
    rounds, with a ShardConflictError that names the record and that count (a caller's bound on
    the time a contended record can take, and an error that says what kept changing)."""
    v = versions(sstore)
    assert v is not None
    gen = v.commit(SHARD, [b"shard"], None)
    commits: list[int] = []
    real = cond._retrying

    def other_writer_first(call: Any) -> Any:
        # another writer's record lands between this writer's read of the record and its commit
        if isinstance(call, partial) and call.func.__name__ == "commit":
            commits.append(len(commits))
            sstore.put(RECORD, b"other writer, round %d" % len(commits))
        return real(call)

    monkeypatch.setattr(cond, "TRIES", 2)
    monkeypatch.setattr(cond, "_retrying", other_writer_first)
    with pytest.raises(ShardConflictError) as err:
        commit_beside(sstore, RECORD, b"mine", owner=SHARD, generation=gen)
    assert len(commits) == 8 and err.value.tries == 8
    assert err.value.key == sstore.key(RECORD) and sstore.key(RECORD) in str(err.value)
    assert sstore.get(RECORD) == b"other writer, round 8"  # never "mine"


def test_nothing_to_delete_reports_the_rounds_lost_before(
    sstore: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills `read_merge_commit` returning `conflicts=None` when the object it would delete is
    absent: the count of rounds lost is 0 without a rival, 1 when another writer removed the
    object between the first read and the commit (callers add these counts to a write's report)."""
    gone = read_merge_commit(sstore, SHARD, lambda old: ("nothing", None))
    assert (gone.existed, gone.stored, gone.generation, gone.conflicts) == (False, None, None, 0)
    sstore.put(SHARD, b"shard")
    monkeypatch.setattr(cond, "BACKOFF", 0.0)
    monkeypatch.setattr(cond, "BACKOFF_MAX", 0.0)
    monkeypatch.setattr(cond, "before_commit", lambda n, a: sstore.delete(n) if a == 0 else None)
    lost = read_merge_commit(sstore, SHARD, lambda old: (old, None))
    assert lost.result is None and lost.conflicts == 1 and sstore.get(SHARD) is None
