"""Survivors of the mutation lane in storage/conditional (`mutation/run.py storage/conditional`):
how many rounds ``commit_beside`` makes before it gives up and what its error names, the
conflicts a ``read_merge_commit`` reports when it finds nothing left to delete, a record that
another writer replaces between ``commit_beside``'s check and its removal, and the branch of
object stores that cannot delete conditionally (an emptied shard is stored as the empty object
instead). Each test names the mutants it kills. Real stores: local files, zarr's MemoryStore,
and the S3 API of the moto server (tests/faultkit.py) through obstore and through s3fs, the two
stores without conditional delete; other writers are real writes to the same store, made
between a writer's read and its commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from zarr.abc.store import Store
from zarr.storage import FsspecStore, LocalStore, MemoryStore

import shardwise.storage.conditional as cond
from faultkit import BUCKET, CREDS, MotoS3, moto_s3, unique
from shardwise import ShardConflictError
from shardwise.storage.conditional import CONFLICT, commit_beside, read_merge_commit, versions
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


def test_commit_beside_keeps_the_record_a_later_commit_stored_meanwhile(
    sstore: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills `commit_beside` removing a record with a plain delete wherever the store can delete
    conditionally (`if parts is None and backend.can_delete`): writer A checks that the shard is
    still its commit, then writer B replaces the shard and stores B's record before A removes
    A's. The conditional delete finds the record changed and A, looking again, sees the shard
    is B's now and leaves B's record; a plain delete would drop the record of the shard that
    stays (and a later verify would call B's shard unrecorded)."""
    v = versions(sstore)
    assert v is not None
    gen_a = v.commit(SHARD, [b"shard by A"], None)
    commit_beside(sstore, RECORD, b"record of A", owner=SHARD, generation=gen_a)
    real = cond._retrying
    heads: list[object] = []

    def writer_b_after_the_check(call: Any) -> Any:
        got = real(call)
        if isinstance(call, partial) and call.func.__name__ == "head" and not heads:
            heads.append(got)  # A's check passed: B commits its shard and record now
            gen_b = v.commit(SHARD, [b"shard by B"], gen_a)
            assert gen_b is not CONFLICT
            sstore.put(RECORD, b"record of B")
        return got

    monkeypatch.setattr(cond, "_retrying", writer_b_after_the_check)
    commit_beside(sstore, RECORD, None, owner=SHARD, generation=gen_a)
    assert heads == [gen_a]
    assert sstore.get(SHARD) == b"shard by B" and sstore.get(RECORD) == b"record of B"


# -- object stores without conditional delete (S3 through obstore and through s3fs) -------------


@pytest.fixture(scope="module")
def server() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


@pytest.fixture(params=["obstore", "fsspec"])
def objects(request: pytest.FixtureRequest, server: MotoS3) -> tuple[ShardStore, str]:
    """An array ``arr`` in a fresh prefix of the server's bucket, and that prefix."""
    prefix = f"m-{unique()}"
    if request.param == "obstore":
        store: Store = server.obstore(prefix)
    else:
        opts = {
            "endpoint_url": server.endpoint,
            "key": CREDS["key"],
            "secret": CREDS["secret"],
            "client_kwargs": {"region_name": CREDS["region"]},
        }
        store = FsspecStore.from_url(f"s3://{BUCKET}/{prefix}", storage_options=opts)
    s = ShardStore(store, "arr")
    v = versions(s)
    assert v is not None and not v.can_delete  # the branch these tests are about
    return s, prefix


def test_an_emptied_shard_is_stored_empty_where_deletes_are_unconditional(
    objects: tuple[ShardStore, str], server: MotoS3
) -> None:
    """Kills the mutants of `read_merge_commit`'s branch for stores without conditional delete
    (`_47`-`_56`: the test of `parts is None` / `can_delete` negated or joined with `or`, the
    empty object stored always, never, or where nothing was stored, the refusal without `empty`
    inverted or without the key) and of `_S3fs`/`_Obstore` get and commit (the bucket key
    built from the prefix). A merge that empties a shard there commits the empty object with
    If-Match (a plain delete could remove another writer's newer shard); where nothing is
    stored, nothing is created; a put is stored as merged; without an `empty` to store the
    call is refused, naming the key, and the store is left as it was."""
    s, prefix = objects
    v = versions(s)
    assert v is not None

    def remove(old: bytes | None) -> tuple[bytes | None, None]:
        return old, None

    done = read_merge_commit(s, SHARD, remove, empty=[b""])
    assert (done.result, done.stored, done.existed, done.generation) == (None, None, False, None)
    assert done.conflicts == 0 and server.keys(prefix) == {}
    done = read_merge_commit(s, SHARD, lambda old: (old, [b"sha", b"rd"]), empty=[b""])
    assert (done.result, done.stored, done.existed) == (None, [b"sha", b"rd"], False)
    assert server.keys(prefix) == {"arr/c/0/0": b"shard"}
    assert v.head(SHARD) == done.generation
    with pytest.raises(ValueError, match="needs an empty object") as err:
        read_merge_commit(s, SHARD, remove)
    assert s.key(SHARD) in str(err.value)
    assert server.keys(prefix) == {"arr/c/0/0": b"shard"}  # refused: unchanged
    done = read_merge_commit(s, SHARD, remove, empty=[b""])
    assert (done.result, done.stored, done.existed) == (b"shard", [b""], True)
    assert server.keys(prefix) == {"arr/c/0/0": b""}
    assert v.get(SHARD) == (b"", done.generation)


def test_commit_beside_where_deletes_are_unconditional(
    objects: tuple[ShardStore, str], server: MotoS3
) -> None:
    """Kills `commit_beside`'s mutants of the branch for stores without conditional delete
    (`_32`-`_35`: the branch taken for every record, for stored ones, never, or deleting no
    key): there a record is stored with If-Match like anywhere else, and removed with a plain
    delete (the only delete such a store has) while its shard is still the commit described;
    once another commit replaced the shard, neither happens."""
    s, prefix = objects
    v = versions(s)
    assert v is not None
    gen = v.commit(SHARD, [b"shard"], None)
    assert gen is not CONFLICT and v.commit(SHARD, [b"late"], None) is CONFLICT
    commit_beside(s, RECORD, b"record", owner=SHARD, generation=gen)
    assert server.keys(prefix) == {"arr/c/0/0": b"shard", f"arr/{RECORD}": b"record"}
    commit_beside(s, RECORD, None, owner=SHARD, generation=gen)
    assert server.keys(prefix) == {"arr/c/0/0": b"shard"}
    commit_beside(s, RECORD, b"record", owner=SHARD, generation=gen)
    newer = v.commit(SHARD, [b"newer"], gen)
    assert newer is not CONFLICT and newer != gen
    commit_beside(s, RECORD, None, owner=SHARD, generation=gen)  # not the shard's commit now
    commit_beside(s, RECORD, b"stale", owner=SHARD, generation=gen)
    assert server.keys(prefix) == {"arr/c/0/0": b"newer", f"arr/{RECORD}": b"record"}
