"""The I/O edge: whole-object get/put, byte ranges, delete and list over zarr stores.

``ShardStore`` wraps a zarr ``Store`` plus the array's path inside it. Local directories take a
direct path (``pread`` and write-to-temp-then-rename, optionally with fsync); every other store
goes through zarr's async API on zarr's own event loop. A ``put`` is always atomic: a reader
sees the old object or the new one, never a part.

It holds configuration only (a zarr store pickles as its root or URL), so it travels to dask
workers cheaply.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zarr.abc.store import RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from .errors import ArgumentTypeError, ArrayNotFoundError

PARTIAL_SUFFIX = ".partial"
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
    """A zarr Store for a Store, a local path or a URL."""
    if isinstance(store, Store):
        return store
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
    raise ArgumentTypeError(
        f"cannot use {type(store).__name__} as a store: pass a zarr Store, path or URL"
    )


def describe(store: Any, path: str | None, node: str = "array") -> str:
    """How messages name a node: ``array 'a/b' in STORE``, or ``the root array of STORE``."""
    p = (path or "").strip("/")
    where = store_name(store)
    return f"{node} {p!r} in {where}" if p else f"the root {node} of {where}"


def store_name(store: Any) -> str:
    """A store as a user wrote it: ``s3://bucket/prefix``, ``file:///dir``, ``memory://...``."""
    fs, root = getattr(store, "fs", None), getattr(store, "path", None)
    if fs is not None and isinstance(root, str):  # an fsspec store: its protocol and path
        proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        return f"{proto}://{root}"
    return str(store)


def join(*parts: str | None) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


@dataclass(frozen=True)
class ShardStore:
    store: Store
    path: str = ""
    fsync: bool = False
    # hex digits that start the names of this writer's temp files: a clean-up after a write
    # removes its own leftovers, not the live temp files of writers running beside it
    tag: str = ""

    def key(self, name: str) -> str:
        return join(self.path, name)

    @property
    def local_root(self) -> Path | None:
        if isinstance(self.store, LocalStore):
            return Path(self.store.root)
        return None

    def _file(self, name: str) -> Path:
        root = self.local_root
        assert root is not None
        return root / self.key(name)

    # -- reads ----------------------------------------------------------------------------------

    def get(self, name: str) -> bytes | None:
        if self.local_root is not None:
            try:
                return self._file(name).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
        buf = _again(lambda: self.store.get(self.key(name), default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def size(self, name: str) -> int | None:
        if self.local_root is not None:
            try:
                return self._file(name).stat().st_size
            except (FileNotFoundError, NotADirectoryError):
                return None
        try:
            return int(_again(lambda: self.store.getsize(self.key(name))))
        except FileNotFoundError:
            return None

    def get_suffix(self, name: str, n: int) -> tuple[bytes, int] | None:
        """The last ``n`` bytes and the object size, or None when the object is missing."""
        if self.local_root is not None:
            try:
                fd = os.open(self._file(name), os.O_RDONLY)
            except (FileNotFoundError, NotADirectoryError):
                return None
            try:
                size = os.fstat(fd).st_size
                return os.pread(fd, min(n, size), max(0, size - n)), size
            finally:
                os.close(fd)
        key = self.key(name)

        async def go() -> tuple[Any, int] | None:
            proto = default_buffer_prototype()
            size, buf = await asyncio.gather(
                self.store.getsize(key),
                self.store.get(key, proto, SuffixByteRequest(n)),
                return_exceptions=True,
            )
            for got in (size, buf):
                if isinstance(got, FileNotFoundError):
                    return None
            if isinstance(size, BaseException):
                raise size
            if isinstance(buf, BaseException):
                if size >= n:
                    raise buf
                # S3 via obstore refuses a suffix range on an empty object: fetch it whole
                buf = await self.store.get(key, proto)
            return (None, size) if buf is None else (buf, size)

        got = _again(go)
        if got is None or got[0] is None:
            return None
        return got[0].to_bytes(), int(got[1])

    def get_prefix(self, name: str, n: int) -> tuple[bytes, int] | None:
        """The first ``n`` bytes and the object size, or None when the object is missing."""
        size = self.size(name)
        if size is None:
            return None
        data = self.get_ranges(name, [(0, min(n, size))])
        return bytes(data[0]), size

    def open_local(self, name: str) -> LocalObject | None:
        """A handle on the current version of a local object (None when it is missing)."""
        try:
            fd = os.open(self._file(name), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return LocalObject(fd)

    def get_ranges(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """``(offset, nbytes)`` ranges of one object; the caller validated them against its size."""
        if self.local_root is not None:
            fd = os.open(self._file(name), os.O_RDONLY)
            try:
                return [os.pread(fd, n, o) for o, n in ranges]
            finally:
                os.close(fd)
        key = self.key(name)
        proto = default_buffer_prototype()

        async def go() -> list[Any]:
            return await asyncio.gather(
                *(self.store.get(key, proto, RangeByteRequest(o, o + n)) for o, n in ranges)
            )

        out = []
        for buf in _again(go):
            if buf is None:
                raise FileNotFoundError(f"{key!r} disappeared while it was being read")
            out.append(buf.to_bytes())
        return out

    # -- writes ---------------------------------------------------------------------------------

    def put(self, name: str, data: bytes | Sequence[Any]) -> None:
        """Store ``data`` (bytes, or a sequence of bytes-like parts) under ``name`` atomically."""
        parts = [data] if isinstance(data, bytes | bytearray | memoryview) else list(data)
        if self.local_root is not None:
            _atomic_write(self._file(name), parts, fsync=self.fsync, tag=self.tag)
            return
        joined = parts[0] if len(parts) == 1 else b"".join(parts)
        buf = default_buffer_prototype().buffer.from_bytes(joined)
        _again(lambda: self.store.set(self.key(name), buf))

    def delete(self, name: str) -> None:
        if self.local_root is not None:
            self._file(name).unlink(missing_ok=True)
            return
        with contextlib.suppress(FileNotFoundError):
            _again(lambda: self.store.delete(self.key(name)))

    def list(self, prefix: str = "") -> list[str]:
        """Names (relative to the array path) under ``prefix``."""
        base = self.key(prefix)
        if self.local_root is not None:
            top = self.local_root / base
            if not top.is_dir():
                return []
            rel = self.local_root / self.path if self.path else self.local_root
            return sorted(
                str((Path(d) / f).relative_to(rel)) for d, _, files in os.walk(top) for f in files
            )

        async def go() -> list[str]:
            return [k async for k in self.store.list_prefix(base + "/" if base else "")]

        strip = len(self.path) + 1 if self.path else 0
        return sorted(k[strip:] for k in _again(go))


def _again[T](make: Callable[[], Coroutine[Any, Any, T]], tries: int = 4) -> T:
    """Run an idempotent store request, retrying failures other than "not found".

    Client libraries retry most transient S3 errors themselves, but not all: obstore gives up
    on a response body cut short (a dropped connection mid-answer). Every request here may be
    repeated safely (gets, whole-object puts, deletes, listings).
    """
    for attempt in range(tries):
        try:
            return sync(make())
        except FileNotFoundError:
            raise
        except Exception:
            if attempt == tries - 1:
                raise
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


def transient(e: BaseException) -> bool:
    """A store failure worth another try: a dropped connection, a timeout, or obstore's generic
    error (a response body cut short, which obstore itself does not retry)."""
    if isinstance(e, ConnectionError | TimeoutError):
        return True
    try:
        from obstore.exceptions import GenericError
    except ImportError:  # pragma: no cover - obstore is optional
        return False
    return isinstance(e, GenericError)


def retry_transient[T](call: Callable[[], T], tries: int = 4) -> T:
    """``call()`` again after a :func:`transient` failure: for zarr-python's own metadata requests,
    which do not go through :func:`_again`. ``call`` must be safe to repeat."""
    for attempt in range(tries):
        try:
            return call()
        except Exception as e:
            if attempt == tries - 1 or not transient(e):
                raise
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


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


def _atomic_write(path: Path, parts: Sequence[Any], *, fsync: bool, tag: str = "") -> None:
    tmp, created = write_temp(path, parts, fsync=fsync, tag=tag)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dirs(path, created)


def write_temp(
    path: Path, parts: Sequence[Any], *, fsync: bool, tag: str = ""
) -> tuple[Path, list[Path]]:
    """Write ``parts`` to a new temp file next to ``path``; returns it and the directories
    created for it (the caller renames it into place, or removes it). The temp name is
    ``<name>.<32 hex digits, the first ones tag>.partial``."""
    hexed = (tag + uuid.uuid4().hex)[:32]
    tmp = path.with_name(f"{path.name}.{hexed}{PARTIAL_SUFFIX}")
    created: list[Path] = []
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:
        created = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            _write_all(fd, parts)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, created


def fsync_dirs(path: Path, created: Sequence[Path]) -> None:
    """fsync the new name of ``path``, and the entry of every directory created for it."""
    for d in (path.parent, *(c.parent for c in created)):
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
