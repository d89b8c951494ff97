"""The I/O edge: whole-object get/put, byte ranges, delete and list over zarr stores.

``ShardStore`` wraps a zarr ``Store`` plus the array's path inside it and delegates the I/O to
one of two backends with one interface (:class:`Backend`): :class:`LocalFiles` for a local
directory (``pread`` and write-to-temp-then-rename, optionally with fsync), and
:class:`ZarrStoreBackend` for every other store (zarr's async API on zarr's own event loop,
requests retried by :mod:`shardwise.storage.retry`). A ``put`` is always atomic: a reader
sees the old object or the new one, never a part.

It holds configuration only (a zarr store pickles as its root or URL), so it travels to dask
workers cheaply.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from zarr.abc.store import Store
from zarr.storage import LocalStore

from ..errors import ArrayNotFoundError, InvalidTypeError, InvalidValueError
from .dirs import open_new
from .meter import count, count_put
from .zarr_backend import ZarrStoreBackend

PARTIAL_SUFFIX = ".partial"
# temp names: ours "<name>.<32 hex: dirs.temp_hex>.partial", zarr's LocalStore
# "<stem>.<uuid hex>.partial"
TEMP = re.compile(r"^(?P<base>.*)\.(?P<hex>[0-9a-f]{32})\.partial$")
# the objects beside an array's data that are shardwise's own: journal, leases, locks, staging
JOURNAL = ".shardwise"
# objects up to this size are read into a per-thread buffer kept for reuse (so at most this
# much memory per reading thread stays allocated between reads)
SCRATCH_MAX = 32 * 1024 * 1024
_scratch = threading.local()


def scratch(n: int) -> memoryview:
    """A writable buffer of ``n`` bytes reused by the calling thread.

    Its pages stay mapped from one use to the next: reading object after object into it costs no
    page faults. Valid until the thread's next call; callers copy out what they keep.
    """
    buf: bytearray | None = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < n:
        buf = _scratch.buf = bytearray(n)
    return memoryview(buf)[:n]


def resolve_store(
    store: Any, *, mode: str = "r", storage_options: dict[str, Any] | None = None
) -> Store:
    """A zarr Store for a Store, a local path, a URL or an icechunk Session (its store)."""
    if isinstance(store, Store):
        return store
    if type(store).__module__.startswith("icechunk"):
        from .icechunk import is_session

        if is_session(store) and mode == "w":  # write_array and to_zarr take its store
            raise InvalidValueError(
                "this writer does not take an icechunk Session (write_array, to_zarr, "
                "to_icechunk, write_pyramid, convert, stream, stream_pyramid and "
                "stream_dataset do); nothing was written"
            )
        if is_session(store):
            return store.store  # type: ignore[no-any-return]
    if isinstance(store, os.PathLike) or (isinstance(store, str) and "://" not in store):
        path = Path(store)
        if mode == "r" and not path.exists():
            raise ArrayNotFoundError(f"no store at {str(path)!r}")
        return LocalStore(path, read_only=mode == "r")
    if isinstance(store, str) and store.startswith("file://"):
        return resolve_store(store[len("file://") :], mode=mode)
    if isinstance(store, str):
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(
            store, storage_options=storage_options or {}, read_only=mode == "r"
        )
    raise InvalidTypeError(
        f"cannot use {type(store).__name__} as a store: pass a zarr Store, path or URL"
    )


def describe(store: Any, path: str | None, node: str = "array") -> str:
    """How messages name a node: ``array 'a/b' in STORE``, or ``the root array of STORE``."""
    p = (path or "").strip("/")
    where = store_name(store)
    return f"{node} {p!r} in {where}" if p else f"the root {node} of {where}"


def store_name(store: Any) -> str:
    """A store as a user wrote it: ``s3://bucket/prefix``, ``file:///dir``, ``memory://...``."""
    if type(store).__module__.startswith("icechunk"):  # a session's store: its branch, snapshot
        session = store.session
        return f"the icechunk session of branch {session.branch!r} ({session.snapshot_id})"
    fs, root = getattr(store, "fs", None), getattr(store, "path", None)
    if fs is not None and isinstance(root, str):  # an fsspec store: its protocol and path
        proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        return f"{proto}://{root}"
    return str(store)


def join(*parts: str | None) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


@dataclass(frozen=True)
class ShardStore:
    """The objects of one array: names relative to ``path`` inside ``store``.

    The I/O runs through a :class:`Backend` picked at construction: :class:`LocalFiles` for a
    local directory, :class:`ZarrStoreBackend` for any other zarr store.
    """

    store: Store
    path: str = ""
    fsync: bool = False
    # hex digits that start the names of this writer's temp files: a clean-up after a write
    # removes its own leftovers, not the live temp files of writers running beside it
    tag: str = ""
    backend: Backend = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", backend_for(self.store, fsync=self.fsync, tag=self.tag))

    def key(self, name: str) -> str:
        if not self.path and name[:1] != "/" and name[-1:] != "/":  # asked once a shard put
            return name
        return join(self.path, name)

    @property
    def local_root(self) -> Path | None:
        return self.backend.root

    def _file(self, name: str) -> Path:
        root = self.local_root
        assert root is not None
        return root / self.key(name)

    # -- reads ----------------------------------------------------------------------------------

    def get(self, name: str) -> bytes | None:
        data = self.backend.get(self.key(name))
        count("get", 0 if data is None else len(data))
        return data

    def size(self, name: str) -> int | None:
        count("size")
        return self.backend.size(self.key(name))

    def get_suffix(self, name: str, n: int) -> tuple[bytes, int] | None:
        """The last ``n`` bytes and the object size, or None when the object is missing."""
        got = self.backend.get_suffix(self.key(name), n)
        count("get", 0 if got is None else len(got[0]))
        return got

    def get_prefix(self, name: str, n: int) -> tuple[bytes, int] | None:
        """The first ``n`` bytes and the object size, or None when the object is missing."""
        size = self.size(name)
        if size is None:
            return None
        data = self.get_ranges(name, [(0, min(n, size))])
        return bytes(data[0]), size

    def open_local(self, name: str) -> LocalObject | None:
        """A handle on the current version of a local object (None when it is missing)."""
        return open_file(self._file(name))

    def get_ranges(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """``(offset, nbytes)`` ranges of one object; the caller validated them against its size."""
        got = self.backend.get_ranges(self.key(name), ranges)
        count("get", sum(len(g) for g in got))
        return got

    # -- writes ---------------------------------------------------------------------------------

    def put(self, name: str, data: bytes | Sequence[Any]) -> None:
        """Store ``data`` (bytes, or a sequence of bytes-like parts) under ``name`` atomically."""
        parts = [data] if isinstance(data, bytes | bytearray | memoryview) else list(data)
        self.backend.put(self.key(name), parts)
        count_put(parts)

    def delete(self, name: str) -> None:
        count("delete")
        self.backend.delete(self.key(name))

    def task_fork(self) -> tuple[ShardStore, Any] | None:
        """For a store of an icechunk fork: one shard task's own fork and this store over it
        (the task writes there and hands the fork back); None for any other store."""
        fork_for = getattr(self.backend, "task_fork", None)
        fork = None if fork_for is None else fork_for()
        return None if fork is None else (replace(self, store=fork.store), fork)

    def list(self, prefix: str = "") -> list[str]:
        """Names (relative to the array path) under ``prefix``."""
        strip = len(self.path) + 1 if self.path else 0
        count("list")
        return [k[strip:] for k in self.backend.list(self.key(prefix))]


class Backend(Protocol):
    """Object I/O by full key (the array path joined in). Missing objects read as None; a put
    is atomic (a reader sees the old object or the new one, never a part); deleting a missing
    object is no error."""

    @property
    def root(self) -> Path | None:
        """The directory of a local store (direct file access), else None."""
        ...

    def get(self, key: str) -> bytes | None: ...

    def size(self, key: str) -> int | None: ...

    def get_suffix(self, key: str, n: int) -> tuple[bytes, int] | None:
        """The last ``n`` bytes and the object size."""
        ...

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """``(offset, nbytes)`` ranges; a missing object raises FileNotFoundError."""
        ...

    def put(self, key: str, parts: Sequence[Any]) -> None:
        """Store the concatenation of the bytes-like ``parts``."""
        ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str) -> list[str]:
        """The keys under directory ``prefix`` ("" for all), sorted."""
        ...


def backend_for(store: Store, *, fsync: bool = False, tag: str = "") -> Backend:
    """Direct file I/O for a local directory, zarr's Store API for any other store (an
    icechunk store's without shardwise's journal: see storage/icechunk.py)."""
    if isinstance(store, LocalStore):
        return LocalFiles(Path(store.root), fsync=fsync, tag=tag)
    if type(store).__module__.startswith("icechunk"):
        from .icechunk import SessionBackend, is_icechunk_store

        if is_icechunk_store(store):
            return SessionBackend(store, skip=JOURNAL)
    return ZarrStoreBackend(store)


@dataclass(frozen=True)
class LocalFiles:
    """A local directory: ``pread`` for ranges, puts written to a temp file (named with ``tag``
    first) and renamed into place, with ``fsync`` of the file and its directories if asked."""

    root: Path
    fsync: bool = False
    tag: str = ""
    # the root as a string ending in "/": a put joins a key to it without pathlib
    prefix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", os.path.join(os.fspath(self.root), ""))

    def get(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def size(self, key: str) -> int | None:
        try:
            return (self.root / key).stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def get_suffix(self, key: str, n: int) -> tuple[bytes, int] | None:
        try:
            fd = os.open(self.root / key, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            size = os.fstat(fd).st_size
            return os.pread(fd, min(n, size), max(0, size - n)), size
        finally:
            os.close(fd)

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        fd = os.open(self.root / key, os.O_RDONLY)
        try:
            return [os.pread(fd, n, o) for o, n in ranges]
        finally:
            os.close(fd)

    def open(self, key: str) -> LocalObject | None:
        return open_file(self.root / key)

    def put(self, key: str, parts: Sequence[Any]) -> None:
        _atomic_write(self.prefix + key, parts, fsync=self.fsync, tag=self.tag)

    def delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)

    def list(self, prefix: str) -> list[str]:
        top = self.root / prefix
        if not top.is_dir():
            return []
        walk = os.walk(top, onerror=_unlisted)
        return sorted(
            str((Path(d) / f).relative_to(self.root)) for d, _, files in walk for f in files
        )


def _unlisted(error: OSError) -> None:
    """``os.walk``'s errors: a directory removed while it is walked holds nothing now; any other
    failure to list one (no permission, an I/O error) is raised, never read as empty."""
    if not isinstance(error, FileNotFoundError | NotADirectoryError):
        raise error


def open_file(path: Path) -> LocalObject | None:
    """A handle on the current version of a local file (None when it is missing)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return LocalObject(fd)


class LocalObject:
    """One open version of a local file: reads through it see that version even if the file is
    replaced meanwhile (writers rename a new file into place). ``version`` identifies it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        st = os.fstat(fd)
        self.size = st.st_size
        self.version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def read(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [os.pread(self.fd, n, o) for o, n in ranges]

    def read_all(self) -> bytes | memoryview:
        """The whole object; small ones in the thread's :func:`scratch` buffer (copy what you
        keep before this thread reads the next one)."""
        if self.size > SCRATCH_MAX:
            return self.read(0, self.size)
        view = scratch(self.size)
        got = 0
        while got < self.size:
            n = os.preadv(self.fd, [view[got:]], got)
            if n == 0:  # the file shrank: cannot happen to a renamed-into-place version
                return view[:got]
            got += n
        return view

    def __enter__(self) -> LocalObject:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _write_all(fd: int, parts: Sequence[Any]) -> None:
    """Write ``parts`` in order with few system calls (writev in groups, then any remainder)."""
    for i in range(0, len(parts), 512):
        group = [memoryview(p).cast("B") for p in parts[i : i + 512]]
        done = os.writev(fd, group)
        for view in group:
            if done >= len(view):
                done -= len(view)
                continue
            view = view[done:]
            done = 0
            while view:
                view = view[os.write(fd, view) :]


def _atomic_write(path: str, parts: Sequence[Any], *, fsync: bool, tag: str = "") -> None:
    tmp, created = _write_temp(path, parts, fsync=fsync, tag=tag)
    try:
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dirs(path, created)


def write_temp(
    path: Path, parts: Sequence[Any], *, fsync: bool, tag: str = ""
) -> tuple[Path, list[Path]]:
    """Write ``parts`` to a new temp file next to ``path``; returns it and the directories
    created for it (the caller renames it into place, or removes it). The temp name is
    ``<name>.<32 hex digits, the first ones tag>.partial``."""
    tmp, created = _write_temp(os.fspath(path), parts, fsync=fsync, tag=tag)
    return Path(tmp), [Path(d) for d in created]


def _write_temp(path: str, parts: Sequence[Any], *, fsync: bool, tag: str) -> tuple[str, list[str]]:
    # names as strings: no pathlib per put (a stream of one frame a shard puts one a frame)
    fd, tmp, created = open_new(path, tag)
    try:
        try:
            _write_all(fd, parts)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp, created


def fsync_dirs(path: str | Path, created: Sequence[str | Path]) -> None:
    """fsync the new name of ``path``, and the entry of every directory created for it."""
    for d in [os.path.dirname(os.fspath(p)) for p in (path, *created)]:
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
