"""Conditional replace of stored objects: read with a generation, commit only if it is unchanged.

Independent writers may share a shard: region writes whose edges split shards, an append next to
a region write. Each one reads the shard together with its *generation*, merges its piece, and
commits only if the shard still has that generation; otherwise it reads and merges again
(:func:`read_merge_commit`). No update is lost, and no lock is held while encoding.

Generations and commits per store (a missing object has the generation ``None``):

local files
    ``(st_dev, st_ino, st_size, st_mtime_ns)``: every commit renames a new file into place, so the
    inode changes with each one. The check and the rename run under a per-shard lock
    (``fcntl.lockf`` on ``.shardwise/locks/<key>``, created on demand, plus a thread lock, since
    POSIX locks belong to the process): across hosts wherever the filesystem's locks work
    (docs/hpc.md: NFS, Lustre).
S3, GCS, Azure through obstore
    the ETag (and version); the commit is a put with ``If-Match`` (``If-None-Match: *`` for a new
    object): obstore's put ``mode=``.
S3 through s3fs
    the ETag; ``PutObject`` with ``IfMatch`` / ``IfNoneMatch``.
memory
    the stored buffer object itself, compared by identity under a process-wide lock.

Other stores cannot commit conditionally (:func:`versions` returns None): writers then keep one
writer job per array (the exclusive lease).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final, Protocol

from zarr.core.buffer import default_buffer_prototype
from zarr.storage import MemoryStore

from ..errors import ArrayNotFoundError, ShardConflictError
from ..runtime import pool as _pool
from . import s3
from .meter import count, count_put
from .retry import RetryPolicy, any_error
from .store import JOURNAL, ShardStore, fsync_dirs, write_temp

LOCKS = f"{JOURNAL}/locks/"
META = "zarr.json"  # metadata documents: locked in place (object_lock)
# read-merge-commit rounds before giving up, and the backoff between them (seconds: the cap of
# the random wait doubles from BACKOFF up to BACKOFF_MAX)
TRIES = 12
BACKOFF = 0.01
BACKOFF_MAX = 1.0
# store errors retried per commit (a failed request's outcome is unknown; merging again is safe)
ERROR_TRIES = 4
# False: shared shards merged without a check (benchmarks, tests: concurrent writers lose updates)
ENABLED = True
before_commit: Callable[[str, int], None] | None = None  # (name, attempt): tests force races


class _Conflict:
    def __repr__(self) -> str:
        return "CONFLICT"


CONFLICT: Final = _Conflict()
UNCHECKED: Final = object()  # the generation of a commit made without a check


class Versions(Protocol):
    """Versioned reads and conditional commits of the objects of one array."""

    can_delete: bool  # False: no conditional delete (store an empty object instead)

    def get(self, name: str) -> tuple[bytes | None, Any]: ...

    def head(self, name: str) -> Any: ...

    def commit(self, name: str, parts: Sequence[Any] | None, expected: Any) -> Any:
        """Store ``parts`` (None: delete) if ``name`` has generation ``expected``: the new
        generation, or :data:`CONFLICT`."""
        ...


def versions(store: ShardStore) -> Versions | None:
    """The conditional commits of ``store``, or None when it has none."""
    if store.local_root is not None:
        return _Local(store)
    zstore = store.store
    if isinstance(zstore, MemoryStore) and isinstance(getattr(zstore, "_store_dict", None), dict):
        return _Memory(store)
    inner = s3.obstore_of(zstore)
    if inner is not None:
        return _Obstore(store, inner)
    fs = s3.s3fs_of(zstore)
    if fs is not None:
        return _S3fs(store, fs)
    return None


@dataclass(frozen=True)
class Committed[T]:
    """The outcome of :func:`read_merge_commit`."""

    result: T  # what the last merge returned
    stored: Sequence[Any] | None  # the parts committed (None: the object was deleted or absent)
    existed: bool  # the object existed at the read the commit was based on
    generation: Any  # of the committed object (None: deleted; UNCHECKED: no check was made)
    conflicts: int  # rounds lost to another writer's commit


def read_merge_commit[T](
    store: ShardStore,
    name: str,
    merge: Callable[[bytes | None], tuple[T, Sequence[Any] | None]],
    *,
    empty: Sequence[Any] | None = None,
    tries: int | None = None,
) -> Committed[T]:
    """Replace object ``name`` by ``merge(its current bytes or None)`` without losing updates.

    ``merge`` returns ``(result, parts)``; ``parts`` None means "delete the object". It may run
    more than once: each time on what is stored then (another writer's commit between this
    writer's read and its commit makes it read and merge again, after a random backoff). Where
    the store cannot delete conditionally, ``empty`` is stored instead of deleting. After
    ``tries`` rounds lost to other writers, raises :class:`ShardConflictError`.
    """
    tries = TRIES if tries is None else tries
    backend = versions(store) if ENABLED else None
    if backend is None:
        old = store.get(name)
        result, parts = merge(old)
        _hook(name, 0)
        if parts is not None:
            store.put(name, parts)
        elif old is not None:
            store.delete(name)
        return Committed(result, parts, old is not None, UNCHECKED, 0)
    for attempt in range(tries):
        data, gen = _retrying(partial(backend.get, name))
        count("get", len(data or b""))
        result, parts = merge(data)
        if parts is None and not backend.can_delete:
            if empty is None:
                raise ValueError(f"{store.key(name)!r}: this store needs an empty object to store")
            parts = None if gen is None else empty
        _hook(name, attempt)
        if parts is None and gen is None:
            return Committed(result, None, False, None, attempt)
        new = _retrying(partial(backend.commit, name, parts, gen))
        count_put(parts)
        if new is not CONFLICT:
            return Committed(result, parts, gen is not None, new, attempt)
        RetryPolicy(backoff=BACKOFF, backoff_max=BACKOFF_MAX, jitter=1.0).pause(attempt)
    raise ShardConflictError(store.key(name), tries)


class _NoChange(Exception):
    def __init__(self, result: Any) -> None:
        self.result = result


def update_json[T](
    store: ShardStore, name: str, change: Callable[[dict[str, Any]], tuple[T, bool]]
) -> tuple[T, int]:
    """Update the JSON document ``name`` (an array's or a group's ``zarr.json``) without losing
    another writer's update: ``change(doc)`` edits the parsed document in place and returns
    ``(result, changed)``; the edit is committed only if the object is still the one read (else
    read and changed again), as shared shards are. Nothing is written when nothing changed.
    Returns ``(result, rounds lost to other writers)``."""

    def merge(data: bytes | None) -> tuple[T, list[bytes]]:
        if data is None:  # removed meanwhile (mode="w" of another call): nothing to update
            raise ArrayNotFoundError(f"{store.key(name)!r} is gone: nothing to update")
        doc = json.loads(data)
        result, changed = change(doc)
        if not changed:
            raise _NoChange(result)
        return result, [json.dumps(doc, indent=2).encode()]

    try:
        # metadata commits are small and every appender makes them: more rounds than a shard's
        done = read_merge_commit(store, name, merge, tries=TRIES * 4)
    except _NoChange as same:
        return same.result, 0
    return done.result, done.conflicts


def commit_beside(
    store: ShardStore, name: str, data: bytes | None, *, owner: str, generation: Any
) -> None:
    """Store ``data`` (None: delete) as ``name``, an object that describes object ``owner``
    (e.g. its journal record), unless ``owner`` was replaced after the commit that gave it
    ``generation``: the writer of that later commit stores its own description, and the last
    commit's description is what stays."""
    backend = versions(store) if generation is not UNCHECKED else None
    if backend is None:
        if data is None:
            store.delete(name)
        else:
            store.put(name, data)
        return
    parts = None if data is None else [data]
    for _ in range(TRIES * 4):
        _, gen = _retrying(partial(backend.get, name))
        if _retrying(partial(backend.head, owner)) != generation:
            return
        if parts is None and not backend.can_delete:
            store.delete(name)  # not reached by shard writers: they store empty shards there
            return
        if _retrying(partial(backend.commit, name, parts, gen)) is not CONFLICT:
            return
    raise ShardConflictError(store.key(name), TRIES * 4)


def _hook(name: str, attempt: int) -> None:
    if before_commit is not None:
        before_commit(name, attempt)


def _retrying[T](call: Callable[[], T]) -> T:
    """``call()``, retried on store errors (transient: dropped connections, a temp file removed
    by another writer's clean-up)."""
    return RetryPolicy(tries=ERROR_TRIES, retry_on=any_error).call(call)


# -- local files ----------------------------------------------------------------------------------

# thread locks in front of the file locks (striped: bounded, whatever the number of shards)
_STRIPES = 64
_thread_locks = [threading.Lock() for _ in range(_STRIPES)]


def _after_fork() -> None:
    global _thread_locks, _memory_lock
    _thread_locks = [threading.Lock() for _ in range(_STRIPES)]
    _memory_lock = threading.Lock()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold the exclusive lock on lock file ``path`` (created on demand, never removed)."""
    with _thread_locks[zlib.crc32(str(path).encode()) % _STRIPES]:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock


@contextlib.contextmanager
def object_lock(path: Path) -> Iterator[None]:
    """Hold the exclusive lock on the file at ``path`` itself, the one that is there once the
    lock is held: a commit renames a new file into place, so a writer that waited on the old
    one locks the new one instead. Nothing is locked when no file is there (the caller's
    generation check then finds the change)."""
    with _thread_locks[zlib.crc32(str(path).encode()) % _STRIPES]:
        while True:
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                yield
                return
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                if _same_file(fd, path):
                    yield
                    return
            finally:
                os.close(fd)  # releases the lock


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _stat_generation(path: Path) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _Local:
    can_delete = True

    def __init__(self, store: ShardStore) -> None:
        root = store.local_root
        assert root is not None
        self.store, self.root = store, root

    def _path(self, name: str) -> Path:
        return self.root / self.store.key(name)

    def get(self, name: str) -> tuple[bytes | None, Any]:
        obj = self.store.open_local(name)
        if obj is None:
            return None, None
        with obj:
            data = obj.read(0, obj.size)
            if len(data) != obj.size:
                raise OSError(f"short read of {self.store.key(name)!r}")
            return data, obj.version

    def head(self, name: str) -> Any:
        return _stat_generation(self._path(name))

    def _lock(
        self, name: str, path: Path, expected: Any
    ) -> contextlib.AbstractContextManager[None]:
        if expected is not None and name.rsplit("/", 1)[-1] == META:
            # a metadata document locks itself: a lock directory beside a group's zarr.json
            # would be a node zarr does not know (a warning on every listing)
            return object_lock(path)
        return file_lock(self.root / self.store.key(LOCKS + name))

    def commit(self, name: str, parts: Sequence[Any] | None, expected: Any) -> Any:
        path = self._path(name)
        fsync = self.store.fsync
        tmp, created = (
            (None, [])
            if parts is None
            else write_temp(path, parts, fsync=fsync, tag=self.store.tag)
        )
        try:
            with self._lock(name, path, expected):
                if _stat_generation(path) != expected:
                    return CONFLICT
                if tmp is None:
                    path.unlink(missing_ok=True)
                else:
                    os.replace(tmp, path)
                    tmp = None
                new = _stat_generation(path)
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        if fsync:
            fsync_dirs(path, created)
        return new


# -- memory ---------------------------------------------------------------------------------------

_memory_lock = threading.Lock()
_pool.on_fork(_after_fork)


class _Same:
    """A stored object's identity as a generation (holding it: its id cannot be reused)."""

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


class _Memory:
    can_delete = True

    def __init__(self, store: ShardStore) -> None:
        self.store = store
        self.objects: dict[str, Any] = store.store._store_dict  # type: ignore[attr-defined]

    def get(self, name: str) -> tuple[bytes | None, Any]:
        with _memory_lock:
            buf = self.objects.get(self.store.key(name))
        return (None, None) if buf is None else (buf.to_bytes(), _Same(buf))

    def head(self, name: str) -> Any:
        buf = self.objects.get(self.store.key(name))
        return None if buf is None else _Same(buf)

    def commit(self, name: str, parts: Sequence[Any] | None, expected: Any) -> Any:
        key = self.store.key(name)
        with _memory_lock:
            now = self.objects.get(key)
            if (None if now is None else _Same(now)) != expected:
                return CONFLICT
            if parts is None:
                self.objects.pop(key, None)
                return None
            buf = default_buffer_prototype().buffer.from_bytes(b"".join(parts))
            self.objects[key] = buf
            return _Same(buf)


# -- object stores --------------------------------------------------------------------------------


class _Obstore:
    can_delete = False  # obstore has no conditional delete

    def __init__(self, store: ShardStore, inner: Any) -> None:
        self.store, self.inner = store, inner

    def get(self, name: str) -> tuple[bytes | None, Any]:
        return s3.obstore_get(self.inner, self.store.key(name))

    def head(self, name: str) -> Any:
        return s3.obstore_head(self.inner, self.store.key(name))

    def commit(self, name: str, parts: Sequence[Any] | None, expected: Any) -> Any:
        assert parts is not None
        new = s3.obstore_put_if(self.inner, self.store.key(name), parts, expected)
        return CONFLICT if new is None else new


class _S3fs:
    can_delete = False

    def __init__(self, store: ShardStore, fs: Any) -> None:
        self.store, self.fs = store, fs
        self.bucket, self.prefix = s3.bucket_prefix(store.store)

    def _key(self, name: str) -> str:
        return "/".join(p for p in (self.prefix, self.store.key(name)) if p)

    def get(self, name: str) -> tuple[bytes | None, Any]:
        return s3.s3fs_get(self.fs, self.bucket, self._key(name))

    def head(self, name: str) -> Any:
        return s3.s3fs_head(self.fs, self.bucket, self._key(name))

    def commit(self, name: str, parts: Sequence[Any] | None, expected: Any) -> Any:
        assert parts is not None
        new = s3.s3fs_put_if(self.fs, self.bucket, self._key(name), parts, expected)
        return CONFLICT if new is None else new
