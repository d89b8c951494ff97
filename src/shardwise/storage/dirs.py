"""What a local put (``storage/store.py``) needs besides its bytes: the directories of its
file, made with one ``mkdir`` each (no ``stat`` before), and its temp file's name.

A process remembers a bounded number of directories it made or found: a put into a known
directory opens its temp file at once, a put below a directory this process made (a new
array's next shard-row) makes the missing ones top-down without a failed open first. What it
remembers is a hint only: a directory removed since is made again (the open fails first).
Temp names take no system call: this process's random token and a counter (a new token in a
forked child), unique across threads, processes and hosts; a clash (``O_EXCL``) takes a
random name instead.
"""

from __future__ import annotations

import itertools
import os
import uuid

__all__ = ["make_dirs", "open_new", "temp_hex"]

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL
_LIMIT = 4096  # directories remembered (then forgotten all at once)
# directory -> whether this process made it (True) or found it (False)
_known: dict[str, bool] = {}
_token = ""
_counter = itertools.count()


def _new_token() -> None:
    global _token, _counter
    _token = os.urandom(10).hex()
    _counter = itertools.count()


_new_token()
os.register_at_fork(after_in_child=_new_token)


def temp_hex(tag: str = "") -> str:
    """32 hex digits for a temp name: ``tag`` (up to 20 digits) first, then this process's
    token (cut to fit) and a 12-digit counter."""
    if len(tag) > 20:
        return (tag + uuid.uuid4().hex)[:32]
    return tag + f"{_token}{next(_counter):012x}"[len(tag) :]


def open_new(target: str, tag: str = "") -> tuple[int, str, list[str]]:
    """Create and open (write only, ``O_EXCL``) a temp file ``<target>.<hex>.partial`` next
    to ``target``, making its missing directories; returns the descriptor, the temp file's
    name and the directories made for it (deepest first, with any another writer made
    meanwhile)."""
    parent = target.rpartition("/")[0] or "."
    name = f"{target}.{temp_hex(tag)}.partial"
    created: list[str] = []
    if parent not in _known:
        top = _made_above(parent)
        if top is not None:
            created = _make_down(top, parent)
    try:
        fd, more = _create(name, parent)
    except FileExistsError:  # another process with the same token: a random name instead
        name = f"{target}.{(tag + uuid.uuid4().hex)[:32]}.partial"
        fd, more = _create(name, parent)
    created = more or created
    if len(_known) > _LIMIT:
        _known.clear()
    for d in created:
        _known[d] = True
    _known.setdefault(parent, False)
    return fd, name, created


def _create(name: str, parent: str) -> tuple[int, list[str]]:
    try:
        return os.open(name, _FLAGS, 0o644), []
    except FileNotFoundError:
        created = make_dirs(parent)
        return os.open(name, _FLAGS, 0o644), created


def _made_above(d: str) -> str | None:
    """The nearest directory above ``d`` this process knows, when it made it; else None."""
    up = d.rpartition("/")[0]
    while up:
        made = _known.get(up)
        if made is not None:
            return up if made else None
        up = up.rpartition("/")[0]
    return None


def _make_down(top: str, d: str) -> list[str]:
    """Make the directories from below ``top`` down to ``d``; deepest first. [] when one is
    missing above (``top`` removed since): the caller's open fails and makes them up."""
    parts = d[len(top) + 1 :].split("/")
    made: list[str] = []
    at = top
    for p in parts:
        at = f"{at}/{p}"
        try:
            os.mkdir(at)
        except FileExistsError:
            pass
        except FileNotFoundError:
            return []
        made.append(at)
    return made[::-1]


def make_dirs(d: str) -> list[str]:
    """Create the missing directory ``d`` and its missing parents; returns them, deepest
    first, with any another writer made meanwhile (fsynced too). One ``mkdir`` a directory,
    no ``stat``: a stream of one frame a shard makes new directories at almost every put."""
    try:
        os.mkdir(d)
    except FileNotFoundError:
        up = os.path.dirname(d)
        if up == d:
            raise
        above = make_dirs(up)
        try:
            os.mkdir(d)
        except FileExistsError:
            _is_dir(d)
        return [d, *above]
    except FileExistsError:
        _is_dir(d)
    return [d]


def _is_dir(d: str) -> None:
    if not os.path.isdir(d):
        raise FileExistsError(f"not a directory: {d}")
