"""Objects built from byte ranges of the object they replace, committed conditionally.

A merge into a big shard changes a few inner chunks; the rest of the new shard is byte ranges of
the old one. Where the store can copy those ranges itself, the writer reads only what it merges
and sends only what changed (``codec/splice.py`` gives the new object as *segments*: ranges of
the old object and new bytes). :func:`open_source` opens the stored object (its generation
taken at the open); :meth:`Source.commit` builds the new object and replaces the old one only if
it still has that generation, as :mod:`.conditional` commits do.

local files (:class:`LocalSource`)
    the new file is a temp file beside the shard: ranges copied from the open old file by the
    kernel (``os.copy_file_range``: no byte passes through the process; filesystems with
    reflinks share the blocks), new bytes written, then the generation check and the rename
    under the shard's lock (``conditional.file_lock``), as every local commit. A killed merge
    leaves the old file and at most a temp file (``*.partial``, removed by a resume's clean-up
    or here on any error). Where the kernel refuses the copy (another filesystem, an old
    kernel) the ranges are copied through the process, and counted as read and written.
S3 (:class:`S3Source`, in ``storage/s3_splice.py``)
    a multipart upload: ``UploadPartCopy`` of the old object's ranges, new parts, the index
    last, completed with ``If-Match`` (``storage/s3_splice.py``).
other stores
    :func:`open_source` returns None: the caller merges the whole object (:mod:`.conditional`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from . import s3_splice
from .conditional import CONFLICT, LOCKS, file_lock
from .meter import count
from .store import LocalObject, ShardStore, fsync_dirs, write_temp

__all__ = ["LocalSource", "Source", "open_source", "splice_kind"]

# tests: called with each step's name to stop a merge there (local files: "temp", "copied",
# "commit", "committed"; S3: "part", "complete", "committed")
step_hook: Callable[[str], None] | None = None


def step(name: str) -> None:
    if step_hook is not None:
        step_hook(name)


class Source(Protocol):
    """One stored version of an object, open for a splice."""

    kind: str  # what the merge is reported as ("local ranges", "s3 ranges")
    size: int
    generation: Any

    def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]: ...

    def commit(self, segments: Sequence[Any]) -> Any:
        """Replace the object by ``segments`` (``(offset, nbytes)`` ranges of this version and
        bytes-like parts) if it is still this version: the new generation, or ``CONFLICT``."""
        ...

    def close(self) -> None: ...

    def worth(self, segments: Sequence[Any]) -> bool:
        """Whether a splice of ``segments`` moves less than a whole put would."""
        ...

    def worth_copying(self, ranges: Sequence[tuple[int, int]]) -> bool:
        """Whether the untouched ``ranges`` may make a splice worth it (asked before the
        chunks are read)."""
        ...


def splice_kind(store: ShardStore) -> str | None:
    """How ``store`` builds an object from ranges of another: "local ranges", "s3 ranges", or
    None when it cannot (the merge moves whole objects)."""
    if store.local_root is not None:
        return "local ranges"
    return "s3 ranges" if s3_splice.client_of(store) is not None else None


def open_source(store: ShardStore, name: str) -> Source | None:
    """The stored object ``name`` open for a splice; None when it is missing, the store
    cannot splice (:func:`splice_kind`), or (S3) it is too small for any copy."""
    if store.local_root is not None:
        obj = store.open_local(name)
        return None if obj is None else LocalSource(store, name, obj)
    return s3_splice.open_s3(store, name, step)


class LocalSource:
    """An open version of a local shard file (see the module's docstring)."""

    kind = "local ranges"

    def __init__(self, store: ShardStore, name: str, obj: LocalObject) -> None:
        self.store, self.name, self.obj = store, name, obj
        self.size, self.generation = obj.size, obj.version

    def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        out = self.obj.read_ranges(ranges)
        for got in out:
            count("get", len(got))
        return out

    def close(self) -> None:
        os.close(self.obj.fd)

    def worth(self, segments: Sequence[Any]) -> bool:
        return True

    def worth_copying(self, ranges: Sequence[tuple[int, int]]) -> bool:
        return True  # even with nothing to copy, only the chunks merged in part are read

    def commit(self, segments: Sequence[Any]) -> Any:
        root = self.store.local_root
        assert root is not None
        path = root / self.store.key(self.name)
        fsync = self.store.fsync
        tmp, created = write_temp(path, [], fsync=False, tag=self.store.tag)
        try:
            step("temp")
            fd = os.open(tmp, os.O_WRONLY)
            try:
                self._fill(fd, segments)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            step("copied")
            with file_lock(root / self.store.key(LOCKS + self.name)):
                if _generation(path) != self.generation:
                    return CONFLICT
                step("commit")
                os.replace(tmp, path)
                new = _generation(path)
        finally:
            tmp.unlink(missing_ok=True)  # gone after the rename
        if fsync:
            fsync_dirs(path, created)
        step("committed")  # the new shard stored, its record not yet
        return new

    def _fill(self, fd: int, segments: Sequence[Any]) -> None:
        """Write ``segments`` to the new file ``fd``: ranges copied in the kernel."""
        pos, new = 0, 0
        for seg in segments:
            if isinstance(seg, tuple):
                offset, n = seg
                copied = _copy_range(self.obj.fd, fd, offset, n, pos)
                count("copy", copied)
                if copied < n:  # the kernel refused: through the process
                    data = self.obj.read(offset + copied, n - copied)
                    count("get", len(data))
                    _pwrite_all(fd, data, pos + copied)
                    new += len(data)
                pos += n
            else:
                view = memoryview(seg).cast("B")
                _pwrite_all(fd, view, pos)
                pos += len(view)
                new += len(view)
        count("put", new)


def _copy_range(src: int, dst: int, offset: int, n: int, at: int) -> int:
    """Copy ``n`` bytes at ``offset`` of ``src`` to ``at`` of ``dst`` in the kernel; the bytes
    copied (fewer when the kernel cannot copy between these files)."""
    copy = getattr(os, "copy_file_range", None)  # Linux only
    done = 0
    while done < n and copy is not None:
        try:
            got = copy(src, dst, n - done, offset + done, at + done)
        except OSError as e:
            if e.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                return done
            raise
        if got == 0:  # the source is shorter than its index said: a torn file
            raise OSError(f"short copy: {done} of {n} bytes at {offset}")
        done += got
    return done


def _pwrite_all(fd: int, data: Any, at: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


def _generation(path: Path) -> tuple[int, ...] | None:
    """As ``conditional``'s local generation: the file's identity and version."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
