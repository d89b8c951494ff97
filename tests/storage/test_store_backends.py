"""The two store backends behind ``ShardStore`` against one contract, and the retry policy.

The contract runs over :class:`LocalFiles` (a directory) and :class:`ZarrStoreBackend` over a
MemoryStore and over a LocalStore: missing objects read as None, puts are whole and replace,
ranges and suffixes, sizes, sorted listings under a directory, deletes, and a failed put that
leaves the old object and nothing else. The retry policy is exercised through a store that fails
a set number of times.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pickle
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from zarr.abc.store import Store
from zarr.core.sync import sync
from zarr.storage import LocalStore, MemoryStore, WrapperStore

from shardwise.storage import dirs
from shardwise.storage.dirs import open_new, temp_hex
from shardwise.storage.retry import STORE_REQUESTS, RetryPolicy, any_error, transient
from shardwise.storage.store import (
    TEMP,
    Backend,
    LocalFiles,
    ShardStore,
    ZarrStoreBackend,
    backend_for,
    write_temp,
)

KINDS = ["local-files", "zarr-memory", "zarr-local"]


def make_backend(kind: str, root: Path) -> Backend:
    if kind == "local-files":
        return LocalFiles(root, tag="ab12")
    if kind == "zarr-memory":
        return ZarrStoreBackend(MemoryStore())
    return ZarrStoreBackend(LocalStore(root))


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path)


def test_missing_objects_read_as_none(backend: Backend) -> None:
    assert backend.get("a/b") is None
    assert backend.size("a/b") is None
    assert backend.get_suffix("a/b", 4) is None
    assert backend.list("a") == []
    backend.delete("a/b")  # deleting a missing object is no error
    with pytest.raises(FileNotFoundError):
        backend.get_ranges("a/b", [(0, 1)])


def test_put_joins_parts_and_replaces_whole(backend: Backend) -> None:
    backend.put("arr/c/0/0", [b"abc", bytearray(b"de"), memoryview(b"fgh")])
    assert backend.get("arr/c/0/0") == b"abcdefgh"
    assert backend.size("arr/c/0/0") == 8
    backend.put("arr/c/0/0", [b"xy"])
    assert backend.get("arr/c/0/0") == b"xy"
    assert backend.size("arr/c/0/0") == 2


def test_ranges_and_suffixes(backend: Backend) -> None:
    backend.put("k", [bytes(range(10))])
    assert backend.get_ranges("k", [(0, 2), (5, 3), (9, 1)]) == [b"\0\1", b"\5\6\7", b"\x09"]
    assert backend.get_suffix("k", 3) == (b"\7\x08\x09", 10)
    assert backend.get_suffix("k", 20) == (bytes(range(10)), 10)  # longer than the object
    backend.put("empty", [b""])
    assert backend.get_suffix("empty", 4) == (b"", 0)
    assert backend.size("empty") == 0


def test_list_is_sorted_full_keys_under_a_directory(backend: Backend) -> None:
    for key in ["arr/c/1/0", "arr/c/0/0", "arr/zarr.json", "arrow/x", "other/y"]:
        backend.put(key, [b"."])
    assert backend.list("arr") == ["arr/c/0/0", "arr/c/1/0", "arr/zarr.json"]
    assert backend.list("arr/c") == ["arr/c/0/0", "arr/c/1/0"]
    assert backend.list("") == sorted(
        ["arr/c/1/0", "arr/c/0/0", "arr/zarr.json", "arrow/x", "other/y"]
    )


def test_delete_removes_only_that_object(backend: Backend) -> None:
    backend.put("d/a", [b"1"])
    backend.put("d/b", [b"2"])
    backend.delete("d/a")
    assert backend.get("d/a") is None
    assert backend.list("d") == ["d/b"]


def test_a_failed_put_leaves_the_old_object_and_nothing_else(backend: Backend) -> None:
    backend.put("p/k", [b"old"])
    with pytest.raises(TypeError):
        backend.put("p/k", [b"new", "not bytes"])
    assert backend.get("p/k") == b"old"
    assert backend.list("") == ["p/k"]  # no temp file left behind


def test_local_temp_files_carry_the_writer_tag(tmp_path: Path) -> None:
    """A local put goes through ``<name>.<tag + hex>.partial`` next to the target (the name the
    journal's clean-up recognises), renamed into place: none is left after it."""
    target = tmp_path / "x" / "y" / "k"
    tmp, created = write_temp(target, [b"ab", b"c"], fsync=False, tag="ab12")
    m = TEMP.match(tmp.name)
    assert m is not None and m.group("base") == "k" and m.group("hex").startswith("ab12")
    assert tmp.read_bytes() == b"abc"
    assert created == [tmp_path / "x" / "y", tmp_path / "x"]
    files = LocalFiles(tmp_path, fsync=True, tag="ab12")
    files.put("x/y/k", [b"done"])
    assert sorted(p.name for p in target.parent.iterdir()) == ["k", tmp.name]
    tmp.unlink()
    assert files.get("x/y/k") == b"done"


def test_temp_names_are_unique_across_threads_and_forked_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temp names take no random draw each: a process token and a counter, the tag first,
    32 hex digits as the journal's clean-up recognises; unique across threads and in a
    forked child (its own token), and a name found taken is replaced by a random one."""
    names: list[str] = []
    with ThreadPoolExecutor(4) as ex:
        for got in ex.map(lambda _: [temp_hex("ab12") for _ in range(500)], range(8)):
            names += got
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, ",".join(temp_hex("ab12") for _ in range(500)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = f.read().split(",")
    os.waitpid(pid, 0)
    names += child
    assert len(set(names)) == len(names) == 4500
    assert all(len(n) == 32 and n.startswith("ab12") and int(n, 16) >= 0 for n in names)
    assert all(TEMP.match(f"k.{n}.partial") for n in (temp_hex(), temp_hex("f" * 12)))
    # the next name taken already (another process with the same token): a random one
    monkeypatch.setattr(dirs, "_counter", itertools.count(7))
    nxt = dirs._token[4:] + f"{7:012x}"
    (tmp_path / f"k.ab12{nxt}.partial").write_bytes(b"other")
    fd, name, _ = open_new(os.fspath(tmp_path / "k"), "ab12")
    os.close(fd)
    assert name != os.fspath(tmp_path / f"k.ab12{nxt}.partial") and TEMP.match(Path(name).name)


def test_puts_make_their_directories_remembered_or_not(tmp_path: Path) -> None:
    """A put below a directory this process made makes the missing ones top-down; one whose
    remembered directory was removed since makes it again; every one it made is returned
    (deepest first) for the fsync of their entries; the objects read back."""
    files = LocalFiles(tmp_path, fsync=True, tag="ab12")
    files.put("n/c/0/0/k", [b"a"])  # nothing known: the open fails, then the mkdirs
    tmp, made = write_temp(tmp_path / "n/c/1/0/k", [b"b"], fsync=False)
    assert tmp.read_bytes() == b"b" and made == [tmp_path / "n/c/1/0", tmp_path / "n/c/1"]
    shutil.rmtree(tmp_path / "n")  # what this process remembers is stale now
    files.put("n/c/0/0/k", [b"c"])
    files.put("n/c/1/0/k", [b"d"])
    assert files.get("n/c/0/0/k") == b"c" and files.get("n/c/1/0/k") == b"d"
    (tmp_path / "old/c/5").mkdir(parents=True)  # found, not made: opened at once
    tmp, made = write_temp(tmp_path / "old/c/5/k", [b"e"], fsync=False)
    assert made == [] and tmp.parent == tmp_path / "old/c/5"
    tmp.unlink()
    assert not [p for p in tmp_path.rglob("*") if TEMP.match(p.name)]


def test_shard_store_picks_its_backend_and_keeps_its_face(tmp_path: Path) -> None:
    local = ShardStore(LocalStore(tmp_path), "arr", fsync=True, tag="ff")
    assert local.backend == LocalFiles(tmp_path, fsync=True, tag="ff")
    assert local.local_root == tmp_path
    mem = ShardStore(MemoryStore(), "arr")
    assert isinstance(mem.backend, ZarrStoreBackend) and mem.local_root is None
    for s in (local, mem):
        s.put("c/0", b"123")
        assert s.list() == ["c/0"] and s.get("c/0") == b"123"
        assert s.get_prefix("c/0", 2) == (b"12", 3)
    # a changed copy rebuilds its backend; a pickled copy keeps it
    assert dataclasses.replace(local, tag="0a").backend == LocalFiles(tmp_path, True, "0a")
    again = pickle.loads(pickle.dumps(local))
    assert again == local and again.backend == local.backend
    assert isinstance(backend_for(MemoryStore()), ZarrStoreBackend)


# -- the retry policy -----------------------------------------------------------------------------


class FlakyStore(WrapperStore[Store]):
    """Wraps a store; its next ``fails`` gets and getsizes raise ``error`` instead."""

    def __init__(self, store: Store, fails: int, error: Callable[[], Exception]) -> None:
        super().__init__(store)
        self.fails, self.error, self.calls = fails, error, 0

    def _fail(self) -> None:
        self.calls += 1
        if self.fails > 0:
            self.fails -= 1
            raise self.error()

    async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self._fail()
        return await self._store.get(key, *args, **kwargs)

    async def getsize(self, key: str) -> int:
        self._fail()
        return await self._store.getsize(key)


def flaky(fails: int, error: Callable[[], Exception]) -> tuple[ZarrStoreBackend, FlakyStore]:
    inner = MemoryStore()
    sync(inner.set("k", inner_buffer(b"payload")))
    store = FlakyStore(inner, fails, error)
    return ZarrStoreBackend(store), store


def inner_buffer(data: bytes) -> Any:
    from zarr.core.buffer import default_buffer_prototype

    return default_buffer_prototype().buffer.from_bytes(data)


@pytest.mark.parametrize("fails", [1, STORE_REQUESTS.tries - 1])
def test_a_store_request_succeeds_after_transient_failures(fails: int) -> None:
    backend, store = flaky(fails, lambda: ConnectionResetError("dropped"))
    assert backend.get("k") == b"payload"
    assert store.calls == fails + 1


def test_a_store_request_gives_up_after_its_tries() -> None:
    backend, store = flaky(STORE_REQUESTS.tries, lambda: ConnectionResetError("dropped"))
    with pytest.raises(ConnectionResetError):
        backend.get("k")
    assert store.calls == STORE_REQUESTS.tries


def test_not_found_is_an_answer_and_never_retried() -> None:
    backend, store = flaky(1, lambda: FileNotFoundError("k"))
    assert backend.size("k") is None
    assert store.calls == 1


def test_the_policy_raises_a_non_transient_error_at_once() -> None:
    calls: list[int] = []

    def call() -> int:
        calls.append(1)
        raise ValueError("a bug, not the network")

    with pytest.raises(ValueError, match="a bug"):
        RetryPolicy(backoff=0.0).call(call)
    assert len(calls) == 1


def test_the_policy_retries_what_it_is_told_to() -> None:
    seen: list[int] = []

    def call() -> str:
        seen.append(1)
        if len(seen) < 3:
            raise ValueError("checked afterwards")
        return "done"

    assert RetryPolicy(backoff=0.0, retry_on=any_error).call(call) == "done"
    assert len(seen) == 3


def test_the_backoff_doubles_up_to_its_cap_with_jitter_below_it() -> None:
    policy = RetryPolicy(backoff=0.1, backoff_max=0.5, jitter=0.5)
    for attempt, cap in enumerate([0.1, 0.2, 0.4, 0.5, 0.5]):
        waits = [policy.wait(attempt) for _ in range(50)]
        assert all(cap / 2 <= w <= cap for w in waits), (attempt, waits)
    assert RetryPolicy(jitter=0.0).wait(1) == pytest.approx(0.1)
    assert transient(TimeoutError()) and not transient(FileNotFoundError())


def test_local_put_makes_missing_directories_once_and_refuses_a_file_in_the_way(
    tmp_path: Path,
) -> None:
    """A put under missing directories makes each (the deepest first in what it reports);
    a directory there already is used as it is; a file where a directory must be fails the
    put, leaving no temp file behind."""
    target = tmp_path / "a" / "b" / "c" / "k"
    tmp, created = write_temp(target, [b"x"], fsync=False)
    assert created == [tmp_path / "a" / "b" / "c", tmp_path / "a" / "b", tmp_path / "a"]
    tmp.unlink()
    files = LocalFiles(tmp_path)
    files.put("a/b/d/k", [b"y"])  # "a/b" there: only "d" made
    assert files.get("a/b/d/k") == b"y"
    (tmp_path / "f").write_bytes(b"a file")
    with pytest.raises(OSError):
        files.put("f/g/k", [b"z"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "f"]
    assert (tmp_path / "f").read_bytes() == b"a file"
