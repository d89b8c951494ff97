"""What happens to the files of local directories, as the kernel reports it (Linux inotify).

Counts the writes of every process (dask worker processes included) without wrapping or patching
the store: shardwise writes a local object by renaming a finished temp file into place, so each
store write is one rename into a watched directory, and each delete one removal.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

IN_MOVED_TO, IN_DELETE, IN_Q_OVERFLOW = 0x80, 0x200, 0x4000
_HEAD = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


class FileEvents:
    """Renames into and removals from ``dirs`` (not their subdirectories) from the moment it is
    made: ``read()`` gives ``(kind, path)`` pairs, kind "renamed" or "deleted", in order."""

    def __init__(self, dirs: Iterable[Path]) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self._check(self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        self.dirs: dict[int, Path] = {}
        for d in dirs:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(d), IN_MOVED_TO | IN_DELETE)
            self.dirs[self._check(wd)] = Path(d)
        self.events: list[tuple[str, Path]] = []

    def _check(self, result: int) -> int:
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return result

    def read(self) -> list[tuple[str, Path]]:
        """Every event so far (the kernel queues them as the calls that cause them return)."""
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return self.events
            at = 0
            while at < len(buf):
                wd, mask, _, n = _HEAD.unpack_from(buf, at)
                name = buf[at + _HEAD.size : at + _HEAD.size + n].rstrip(b"\0").decode()
                at += _HEAD.size + n
                if mask & IN_Q_OVERFLOW:
                    raise RuntimeError("inotify queue overflow: events were lost")
                kind = "renamed" if mask & IN_MOVED_TO else "deleted"
                self.events.append((kind, self.dirs[wd] / name))

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> FileEvents:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
