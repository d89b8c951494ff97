"""Streams killed at a chosen point, for ``write/test_stream_kills.py``: the child (forked from
a server that imported shardwise once; this module imports nothing more, so a child starts in
milliseconds) streams drawn batches of frames and SIGKILLs itself at its kill point, reached in
its own program order: after frame ``k``, or before, torn inside (its temp file written, not
renamed) or after the ``j``-th put of a kind (shard, record, write marker, shape commit) by a
level. It tells, as it dies, where it was, every level's last shape commit and the frames it
appended. A resuming child (``run["resume"]``) opens the stream stopped there with
``resume=True`` and appends from its frame ``run["start"]`` on; :func:`told` also gives every
shape commit of each level in order (a rewinding resume's cut first) and the levels' stored
frames once the stream opened."""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

import numpy as np

import shardwise
from faultkit import forkserver

STEP = 4  # frames of a shard-row
STREAM: dict[str, Any] = dict(shape=(None, 6, 5), dtype="u2", chunks=(2, 3, 5), shards=(4, 3, 5))
PYRAMID: dict[str, Any] = dict(
    shape=(None, 12, 10), dtype="u2", levels=3, chunks=(2, 4, 4), shards=(4, 8, 8)
)  # dims z, y, x: the append axis reduced by 2, a group of frames at a time
PHASES = ("before", "torn", "after")


def frames(n: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 1000, size=(n, *shape)).astype("u2")


KINDS = {"c/": "shard", ".shardwise/shards/": "record", ".shardwise/writes/": "marker"}


def kind(name: str) -> str:
    """What a put is: a shard, its record, a write marker, the shape commit (``zarr.json``)."""
    if name == "zarr.json":
        return "shape"
    return next((k for p, k in KINDS.items() if name.startswith(p)), "other")


def killed(root: str, run: dict[str, Any], pyramid: bool, said: Any) -> None:
    """:func:`streamed`, or what it raised told (the test fails at once)."""
    try:
        streamed(root, run, pyramid, said)
    except BaseException as e:
        said.send((f"error: {e!r}", {}, 0, {}))
        raise


def streamed(root: str, run: dict[str, Any], pyramid: bool, said: Any) -> None:
    """Stream ``run``'s frames and SIGKILL this process at its kill point (at the end when the
    point is never reached), telling ``said`` (where, every level's last shape commit, frames
    appended) first."""
    from shardwise.storage import store as stores
    from shardwise.write.streams import Stream

    kw, frame = (PYRAMID, (12, 10)) if pyramid else (STREAM, (6, 5))
    x = frames(run["n"], frame)
    kill = run["kill"]
    committed: dict[str, int] = {}
    seen: dict[str, Any] = dict(shapes={}, opened=None)  # every shape commit, stored at open
    lock = threading.Lock()
    count = [0]  # puts of the kind and level drawn
    s: Any = None

    def die(where: str) -> None:
        said.send((where, dict(committed), 0 if s is None else s.frames, seen))
        os.kill(os.getpid(), signal.SIGKILL)

    put = stores.ShardStore.put

    def hooked(self: Any, name: str, data: Any) -> None:
        hit = False
        if kill[0] == "put" and self.path == kill[1] and kind(name) == kill[2]:
            with lock:
                count[0] += 1
                hit = count[0] == kill[3]
        point = f"{kill[-1]} {kill[2]} {kill[3]} of level {self.path or 0}: {name}" if hit else ""
        if hit and kill[4] == "before":
            die(point)
        if hit and kill[4] == "torn":  # the temp file written, never renamed
            parts = [data] if isinstance(data, bytes | bytearray | memoryview) else list(data)
            stores.write_temp(self._file(name), parts, fsync=False, tag=self.tag)
            die(point)
        put(self, name, data)
        if name == "zarr.json":
            doc = json.loads(bytes(data) if not isinstance(data, list | tuple) else b"".join(data))
            if doc.get("node_type") == "array":
                committed[self.path] = int(doc["shape"][0])
                seen["shapes"].setdefault(self.path, []).append(committed[self.path])
        if hit:
            die(point)

    stores.ShardStore.put = hooked  # type: ignore[method-assign]
    if run["paced"]:
        seal = Stream._seal

        def paced(self: Any) -> None:
            seal(self)
            self._drain()  # the seal written before the appender goes on

        Stream._seal = paced  # type: ignore[method-assign]
    opening = shardwise.stream_pyramid if pyramid else shardwise.stream
    resume = bool(run.get("resume"))
    s = opening(root, pending=1, resume=resume, **kw)
    seen["opened"] = list(s.stored) if pyramid else [s.stored]
    done = int(run.get("start", 0))
    for size, flush in run["batches"]:
        if kill[0] == "frame" and done <= kill[1] < done + size:
            s.append(x[done : kill[1]])
            break
        s.append(x[done : done + size])
        done += size
        if flush:
            s.flush()
    if kill[0] == "frame" and run["paced"]:
        for level in s.levels if pyramid else [s]:
            level._drain()
    die("frame" if kill[0] == "frame" else "end")


def kill(root: str, run: dict[str, Any], pyramid: bool) -> tuple[str, dict[str, int], int]:
    """Run :func:`killed` in a forked child; what it told as it died: where, every level's last
    shape commit, the frames appended."""
    return told(root, run, pyramid)[:3]  # type: ignore[return-value]


def told(root: str, run: dict[str, Any], pyramid: bool) -> tuple[Any, ...]:
    """:func:`kill`'s answer and, fourth, ``shapes`` (each level's shape commits in order) and
    ``opened`` (the levels' stored frames once the stream opened, None if it never did)."""
    ctx = forkserver()
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=killed, args=(root, run, pyramid, theirs))
    proc.start()
    assert ours.poll(300), "the child said nothing"
    got = ours.recv()
    assert not got[0].startswith("error"), got[0]
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    return got  # type: ignore[no-any-return]
