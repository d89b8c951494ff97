"""Survivors of the mutation lane in storage/conditional (`mutation/run.py storage/conditional`):
how many rounds ``commit_beside`` makes before it gives up and what its error names, the
conflicts a ``read_merge_commit`` reports when it finds nothing left to delete, a record that
another writer replaces between ``commit_beside``'s check and its removal, the branch of object
stores that cannot delete conditionally (an emptied shard is stored as the empty object
instead), metadata documents updated through ``update_json`` (merged again over a rival's edit,
stored as zarr writes them, locked in place), the locks a forked child starts with, and the
fsync of a local commit. Each test names the mutants it kills. Real stores: local files, zarr's
MemoryStore, and the S3 API of the moto server (tests/faultkit.py) through obstore and through
s3fs, the two stores without conditional delete; other writers are real writes to the same
store, made between a writer's read and its commit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from zarr.abc.store import Store
from zarr.storage import FsspecStore, LocalStore, MemoryStore

import shardwise.storage.conditional as cond
from faultkit import BUCKET, CREDS, MotoS3, moto_s3, unique
from shardwise import ArrayNotFoundError, ShardConflictError
from shardwise.runtime import pool
from shardwise.storage.conditional import (
    CONFLICT,
    commit_beside,
    read_merge_commit,
    update_json,
    versions,
)
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


def test_removing_what_is_already_gone_is_no_error(sstore: ShardStore) -> None:
    """Kills `_Local.commit` deleting with `missing_ok=False` and `_Memory.commit` popping
    without a default: a conditional delete of an object that is absent, as expected, succeeds
    with nothing to do (`commit_beside` removes a record that was never stored when a write
    empties a shard it had not written before)."""
    v = versions(sstore)
    assert v is not None
    assert v.commit(SHARD, None, None) is None and v.get(SHARD) == (None, None)
    gen = v.commit(SHARD, [b"shard"], None)
    commit_beside(sstore, RECORD, None, owner=SHARD, generation=gen)
    assert sstore.get(RECORD) is None and sstore.get(SHARD) == b"shard"


def test_a_shard_rewritten_in_place_while_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills `_Local.get`'s short-read error without the key (`OSError(None)`) and `_retrying`
    retrying only transient errors (without `retry_on=any_error`): another tool that rewrites
    a shard in place (truncates it, then writes it again) while this writer reads it makes the
    read come up short; that is an error naming the key, never a short shard merged as whole,
    and the read-merge-commit reads again and merges onto the finished rewrite.
    `ShardStore.open_local` is wrapped to run the other tool's steps around the real open."""
    s = ShardStore(LocalStore(tmp_path / "a.zarr"), "arr")
    s.put(SHARD, b"the shard as first written")
    path = tmp_path / "a.zarr/arr/c/0/0"
    real = ShardStore.open_local
    opened: list[str] = []

    def other_tool_in_place(self: ShardStore, name: str) -> Any:
        if len(opened) == 1:
            path.write_bytes(b"rewritten in place")  # the other tool finishes its rewrite
        obj = real(self, name)
        if not opened:
            os.truncate(path, 3)  # the other tool starts: truncated after this open
        opened.append(name)
        return obj

    monkeypatch.setattr(ShardStore, "open_local", other_tool_in_place)
    v = versions(s)
    assert v is not None
    with pytest.raises(OSError, match="short read of 'arr/c/0/0'"):
        v.get(SHARD)
    s.put(SHARD, b"the shard as first written")
    opened.clear()
    done = read_merge_commit(s, SHARD, lambda old: (old, [b"merged onto: ", old or b""]))
    assert done.result == b"rewritten in place" and len(opened) == 2
    assert done.conflicts == 0  # the short read was retried as a store error, not a lost round
    assert path.read_bytes() == b"merged onto: rewritten in place"


# -- metadata documents -----------------------------------------------------------------------


def _doc(**attributes: int) -> bytes:
    return json.dumps({"zarr_format": 3, "attributes": attributes}, indent=2).encode()


def test_update_json_merges_over_a_rivals_edit_and_stores_it_as_zarr_does(
    sstore: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills `update_json`'s merge parsing nothing (`json.loads(None)`), storing the document
    unindented (`indent=None`), or handing no merge to `read_merge_commit`: an appender's edit
    of `zarr.json` lands on top of another writer's edit made between its read and its commit
    (both attributes kept, one round lost), stored indented as zarr writes it; an edit that
    changes nothing writes nothing; a document that is gone is refused, naming it."""
    sstore.put("zarr.json", _doc())
    monkeypatch.setattr(cond, "BACKOFF", 0.0)
    monkeypatch.setattr(cond, "BACKOFF_MAX", 0.0)

    def rival(name: str, attempt: int) -> None:
        if attempt == 0:
            sstore.put(name, _doc(rival=1))

    def mine(doc: dict[str, Any]) -> tuple[str, bool]:
        doc["attributes"]["mine"] = 2
        return "edited", True

    monkeypatch.setattr(cond, "before_commit", rival)
    assert update_json(sstore, "zarr.json", mine) == ("edited", 1)
    assert sstore.get("zarr.json") == _doc(rival=1, mine=2)
    v = versions(sstore)
    assert v is not None
    gen = v.head("zarr.json")
    assert update_json(sstore, "zarr.json", lambda doc: ("same", False)) == ("same", 0)
    assert v.head("zarr.json") == gen  # nothing written
    sstore.delete("zarr.json")
    with pytest.raises(ArrayNotFoundError, match="is gone") as err:
        update_json(sstore, "zarr.json", mine)
    assert sstore.key("zarr.json") in str(err.value) and sstore.get("zarr.json") is None


def test_update_json_gives_up_after_four_times_a_shards_rounds(
    sstore: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills `update_json` bounding its rounds by `TRIES * 5`: metadata commits are small and
    every appender makes them, so they get four times a shard's rounds, and no more (a bound
    on the time an appender can spend on a document others keep changing)."""
    sstore.put("zarr.json", _doc())
    rounds: list[int] = []

    def rival(name: str, attempt: int) -> None:
        rounds.append(attempt)
        sstore.put(name, _doc(rival=attempt))

    monkeypatch.setattr(cond, "TRIES", 2)
    monkeypatch.setattr(cond, "BACKOFF", 0.0)
    monkeypatch.setattr(cond, "BACKOFF_MAX", 0.0)
    monkeypatch.setattr(cond, "before_commit", rival)
    with pytest.raises(ShardConflictError) as err:
        update_json(sstore, "zarr.json", lambda doc: ("edited", True))
    assert err.value.tries == 8 and rounds == list(range(8))
    assert sstore.get("zarr.json") == _doc(rival=7)


@pytest.mark.parametrize("name", ["zarr.json", "g/zarr.json", "g/a/zarr.json"])
def test_a_metadata_document_is_locked_in_place(tmp_path: Path, name: str) -> None:
    """Kills `_Local._lock` locking a nested group's document through a lock file (`split`
    for `rsplit`: the last part of `g/a/zarr.json` is `zarr.json`, the part after the first
    slash is not) or locking no path (`object_lock(None)`): an update of a group's `zarr.json`
    leaves no lock directory in the store, which zarr would list as a node of the group (a
    warning on every listing)."""
    root = tmp_path / "a.zarr"
    s = ShardStore(LocalStore(root), "")
    s.put(name, _doc())
    assert update_json(s, name, lambda doc: ("edited", doc.update(x=1) is None)) == ("edited", 0)
    assert json.loads(s.get(name) or b"")["x"] == 1
    assert not (root / ".shardwise").exists()
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [name]


# -- forks and fsync ------------------------------------------------------------------------------


def test_a_forked_child_commits_with_fresh_locks(tmp_path: Path) -> None:
    """Kills `_after_fork` giving memory commits no lock (`_memory_lock = None`): a child forked
    while another thread of the parent held a commit lock must not inherit it held (it would
    wait for a thread that does not exist in the child). The hook is registered with the
    runtime's fork hooks; here it runs in this process with the old locks held."""
    assert cond._after_fork in pool._fork_hooks
    held = [cond._memory_lock, *cond._thread_locks]
    for lock in held:
        lock.acquire()
    try:
        cond._after_fork()  # what runtime.pool.after_fork runs in a forked child
        for s in (ShardStore(MemoryStore(), "arr"), ShardStore(LocalStore(tmp_path), "arr")):
            v = versions(s)
            assert v is not None
            gen = v.commit(SHARD, [b"child"], None)
            assert v.get(SHARD) == (b"child", gen)
    finally:
        for lock in held:
            lock.release()


def test_a_local_commit_with_fsync_makes_the_file_and_its_directories_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills `_Local.commit` dropping the store's fsync (`fsync = None`, or `fsync=None` for the
    temp file): on a store opened with `fsync=True` a commit fsyncs the new file's data before
    it is renamed into place, then the directories it created, so a committed shard survives
    a power cut; without fsync nothing is synced. `os.fsync` is wrapped to record each call's
    file (the calls themselves still happen)."""
    synced: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    root = tmp_path / "a.zarr"
    v = versions(ShardStore(LocalStore(root), "arr", fsync=True))
    assert v is not None and v.commit(SHARD, [b"shard"], None) is not CONFLICT
    shard_dir = str(root / "arr/c/0")
    temps = [p for p in synced if p.startswith(shard_dir + "/0.") and p.endswith(".partial")]
    assert len(temps) == 1 and not os.path.exists(temps[0])  # the temp file, renamed since
    assert shard_dir in synced and synced.index(temps[0]) < synced.index(shard_dir)
    synced.clear()
    v = versions(ShardStore(LocalStore(root), "arr"))
    assert v is not None and v.commit("c/0/1", [b"shard"], None) is not CONFLICT
    assert synced == []


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
