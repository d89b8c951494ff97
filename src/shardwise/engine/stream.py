"""A shard object streamed into the store and committed once: bytes from staged pieces and
stored shards read by range through one fixed buffer per thread (``STREAM_BUFFER``), to a temp
file renamed into place (local), one multipart upload completed once (S3), or joined in memory
(other stores). The staged write's phase 2 and the copy task of a conversion commit through it."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ..core.job import PART_BYTES, STREAM_BUFFER
from ..storage.meter import count
from ..storage.s3 import multipart_client
from ..storage.store import PARTIAL_SUFFIX, ShardStore

Feed = Callable[[Callable[[Any], Any]], int]
"""Gives an object's bytes, in order, to the sink it is called with; returns their crc32c."""


def commit_shard(store: ShardStore, key: str, feed: Feed, *, total: int | None = None) -> int:
    """Store the object ``feed`` produces under ``key`` in one atomic commit; its crc32c.

    Local files: a temp file renamed into place. S3: one multipart upload completed once, when
    the object is larger than one part or its size (``total``) is not known ahead. Elsewhere:
    joined in memory, one put. Memory stays one buffer whatever the object's size.
    """
    if store.local_root is not None:
        return _commit_local(store, key, feed)
    s3 = multipart_client(store) if total is None or total > PART_BYTES else None
    if s3 is not None:
        return _commit_multipart(store, s3, key, feed)
    parts: list[Any] = []
    crc = feed(parts.append)
    store.put(key, parts)
    return crc


def _coalesce(ranges: Sequence[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Merge ranges that continue each other in the same object."""
    out: list[tuple[str, int, int]] = []
    for name, off, n in ranges:
        if out and out[-1][0] == name and out[-1][1] + out[-1][2] == off:
            out[-1] = (name, out[-1][1], out[-1][2] + n)
        else:
            out.append((name, off, n))
    return out


def _stream(
    store: ShardStore,
    head: Sequence[bytes],
    ranges: Sequence[tuple[str, int, int]],
    tail: Sequence[bytes],
    sink: Callable[[Any], Any],
) -> int:
    """Feed ``head``, the bytes of ``ranges`` (read ``STREAM_BUFFER`` at a time) and ``tail`` to
    ``sink`` in order; returns their crc32c. The sink must copy what it keeps."""
    import crc32c as _crc32c

    crc = 0
    for b in head:
        crc = _crc32c.crc32c(b, crc)
        sink(b)
    local = store.local_root is not None
    fds: dict[str, int] = {}
    batch: list[tuple[str, int, int]] = []
    filled = 0

    def flush() -> None:
        nonlocal crc, filled
        if not batch:
            return
        if local:
            view = _buffer(filled)
            pos = 0
            for name, off, n in batch:
                fd = fds.get(name)
                if fd is None:
                    fd = fds[name] = os.open(store._file(name), os.O_RDONLY)
                got = 0
                while got < n:
                    k = os.preadv(fd, [view[pos + got : pos + n]], off + got)
                    if k == 0:
                        raise OSError(f"{store.key(name)!r} ended before offset {off + n}")
                    got += k
                pos += n
            crc = _crc32c.crc32c(view[:filled], crc)
            sink(view[:filled])
        else:
            by_name: dict[str, list[tuple[int, int]]] = {}
            for name, off, n in batch:
                by_name.setdefault(name, []).append((off, n))
            got_by = {name: iter(store.get_ranges(name, rs)) for name, rs in by_name.items()}
            for name, _, _ in batch:
                b = next(got_by[name])
                crc = _crc32c.crc32c(b, crc)
                sink(b)
        batch.clear()
        filled = 0

    try:
        for name, off, n in ranges:
            while n > 0:
                take = min(n, STREAM_BUFFER - filled)
                batch.append((name, off, take))
                filled += take
                off += take
                n -= take
                if filled == STREAM_BUFFER:
                    flush()
        flush()
    finally:
        for fd in fds.values():
            os.close(fd)
    for b in tail:
        crc = _crc32c.crc32c(b, crc)
        sink(b)
    return int(crc)


_bufs = threading.local()


def _buffer(n: int) -> memoryview:
    """The calling thread's streaming buffer (fixed size, reused)."""
    buf: bytearray | None = getattr(_bufs, "buf", None)
    if buf is None:
        buf = _bufs.buf = bytearray(STREAM_BUFFER)
    return memoryview(buf)[:n]


def _commit_local(store: ShardStore, key: str, feed: Feed) -> int:
    path = store._file(key)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:

            def write(b: Any) -> None:
                view = memoryview(b).cast("B")
                while view:
                    view = view[os.write(fd, view) :]

            crc = feed(write)
            if store.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if store.fsync:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return crc


def _commit_multipart(store: ShardStore, s3: tuple[Any, str, str], key: str, feed: Feed) -> int:
    """One multipart upload for the shard, parts of ``PART_BYTES`` (the last may be shorter),
    completed once; aborted when anything fails, so no part of the shard ever becomes visible."""
    call, bucket, prefix = s3
    full = "/".join(p for p in (prefix, store.key(key)) if p)
    upload = call("create_multipart_upload", Bucket=bucket, Key=full)["UploadId"]
    count("put")
    done: list[dict[str, Any]] = []
    buf = bytearray()

    def send(data: bytes | bytearray) -> None:
        n = len(done) + 1
        got = call(
            "upload_part", Bucket=bucket, Key=full, UploadId=upload, PartNumber=n, Body=bytes(data)
        )
        count("put", len(data))
        done.append({"ETag": got["ETag"], "PartNumber": n})

    def sink(b: Any) -> None:
        buf.extend(b)
        if len(buf) >= PART_BYTES:
            send(buf[:PART_BYTES])
            del buf[:PART_BYTES]

    try:
        crc = feed(sink)
        if buf or not done:
            send(buf)
        call(
            "complete_multipart_upload",
            Bucket=bucket,
            Key=full,
            UploadId=upload,
            MultipartUpload={"Parts": done},
        )
        count("put")
    except BaseException:
        try:
            call("abort_multipart_upload", Bucket=bucket, Key=full, UploadId=upload)
        finally:
            raise
    return crc
