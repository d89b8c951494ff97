"""Fault-injection kit for the resume, lease, verify and fault tests.

* :class:`MotoS3`: moto's S3 server on 127.0.0.1 (started by the tests, stopped after).
* :class:`FaultProxy`: a small HTTP/1.1 proxy on 127.0.0.1 in front of it that injects S3 faults
  at random: 5xx answers, dropped connections (before and after the request reached S3),
  truncated response bodies, and lost acknowledgements of conditional creates.
* :class:`NoSpaceStore`: a real zarr store wrapper whose ``set`` fails with ``ENOSPC`` once a
  byte budget is used up, as a full disk does.
* helpers that look at a local array directly: its files, temp files and torn shards.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from zarr.abc.store import Store
from zarr.storage import LocalStore, ObjectStore, WrapperStore

BUCKET = "shardwise-faults"
CREDS = {"key": "testing", "secret": "testing", "region": "us-east-1"}
TEMP = re.compile(r"\.[0-9a-f]{32}\.partial$")


def gone_pid() -> int:
    """The pid of a process that ran and was reaped: it names no process now."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- S3 -------------------------------------------------------------------------------------------


@dataclass
class MotoS3:
    endpoint: str
    client: Any  # boto3 client straight to moto (never through the proxy)

    def obstore(self, prefix: str, endpoint: str | None = None, **retry: Any) -> ObjectStore[Any]:
        from obstore.store import S3Store

        s3 = S3Store(
            BUCKET,
            prefix=prefix,
            endpoint=endpoint or self.endpoint,
            access_key_id=CREDS["key"],
            secret_access_key=CREDS["secret"],
            region=CREDS["region"],
            client_options={"allow_http": True, "timeout": "20s", "connect_timeout": "5s"},
            retry_config=retry or None,
        )
        return ObjectStore(s3)

    def keys(self, prefix: str) -> dict[str, bytes]:
        out = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=prefix + "/"
        )
        for page in pages:
            for o in page.get("Contents", []):
                body = self.client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
                out[o["Key"][len(prefix) + 1 :]] = bytes(body)
        return out


def s3_client(endpoint: str, bucket: str = BUCKET) -> Any:
    """A boto3 client of the S3 server at ``endpoint``, with ``bucket`` created in it."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=CREDS["key"],
        aws_secret_access_key=CREDS["secret"],
        region_name=CREDS["region"],
    )
    client.create_bucket(Bucket=bucket)
    return client


_S3_WRITES = threading.RLock()


def atomic_conditional_writes() -> None:
    """Make the in-process moto server check a write's condition and store it in one step,
    as S3 does. moto checks ``If-Match`` / ``If-None-Match`` in its request handler and stores
    afterwards, with the hashing of the body between: two conditional puts of one key served
    by two of its threads at once could both pass the check, and the second would silently
    replace the first, which S3 never does. Every object put, copy, delete and
    multipart completion runs under one lock here (a test server's throughput is no concern).
    ``test_conditional.py::test_moto_refuses_all_but_one_of_racing_conditional_puts``.

    moto also hashes an object's ETag on first use, reading its buffer without the lock its
    value reads take: a GET of a new object while its PUT's answer hashed it could cache the
    ETag of empty bytes for it (two such versions then pass each other's ``If-Match``). Objects
    are hashed here as they are made, before any request sees them
    (``test_conditional.py::test_moto_hashes_an_etag_before_a_read_can_move_its_buffer``)."""
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    if not getattr(FakeKey.__init__, "atomic", False):

        def hashed(self: Any, *args: Any, _init: Any = FakeKey.__init__, **kwargs: Any) -> None:
            _init(self, *args, **kwargs)
            _ = self.etag  # cached: no later read of the buffer can spoil it

        hashed.atomic = True  # type: ignore[attr-defined]
        FakeKey.__init__ = hashed

    for name in ("put_object", "copy_object", "delete_object", "_key_response_post"):
        handler = getattr(S3Response, name)
        if getattr(handler, "atomic", False):
            continue

        def locked(self: Any, *args: Any, _handler: Any = handler, **kwargs: Any) -> Any:
            with _S3_WRITES:
                return _handler(self, *args, **kwargs)

        locked.atomic = True  # type: ignore[attr-defined]
        setattr(S3Response, name, locked)


def conditional_multipart() -> None:
    """Make moto check what S3 checks of a multipart upload built from copies: moto 5.2 ignores
    ``If-Match`` on ``CompleteMultipartUpload`` (S3 honours it since 2024-11) and, on
    ``UploadPartCopy``, ``x-amz-copy-source-if-match`` and a ``x-amz-copy-source-range`` past
    the source's end (S3: 412, 412, InvalidRange). Checked under the lock the writes take
    (:func:`atomic_conditional_writes`); ``write/test_merge_ranges.py`` tests each one."""
    from moto.s3.exceptions import InvalidRange, PreconditionFailed
    from moto.s3.responses import S3Response

    post, copy = S3Response._key_response_post, S3Response.upload_part_copy
    if getattr(post, "if_match", False):
        return

    def etag_of(self: Any, bucket: str, key: str) -> str | None:
        obj = self.backend.get_object(bucket, key)
        return None if obj is None else str(obj.etag).strip('"')

    def checked_post(self: Any, request: Any, body: bytes, bucket_name: str, query: Any,
                     key_name: str) -> Any:  # fmt: skip
        with _S3_WRITES:
            want = self.headers.get("If-Match")
            stale = want is not None and etag_of(self, bucket_name, key_name) != want.strip('"')
            if query.get("uploadId") and stale:
                raise PreconditionFailed("If-Match")
            return post(self, request, body, bucket_name, query, key_name)

    def checked_copy(self: Any) -> Any:
        with _S3_WRITES:
            from urllib.parse import unquote, urlparse

            source = self.headers.get("x-amz-copy-source")
            source = source.decode() if isinstance(source, bytes) else source
            bucket, key = unquote(urlparse(source).path).lstrip("/").split("/", 1)
            obj = self.backend.get_object(bucket, key)
            want = self.headers.get("x-amz-copy-source-if-match")
            if want is not None and (obj is None or str(obj.etag).strip('"') != want.strip('"')):
                raise PreconditionFailed("x-amz-copy-source-If-Match")
            rng = self.headers.get("x-amz-copy-source-range")
            if rng and obj is not None and int(rng.split("-")[-1]) >= obj.size:
                raise InvalidRange(rng, str(obj.size))
            return copy(self)

    checked_post.if_match = True  # type: ignore[attr-defined]
    S3Response._key_response_post = checked_post  # type: ignore[method-assign]
    S3Response.upload_part_copy = checked_copy  # type: ignore[method-assign]


def listed_once() -> None:
    """moto's server lists the directory of its own package for every request it serves (to
    ask whether the request's service is one of its modules: ``os.listdir`` and a stat per
    module, 4-6 ms of CPU a request under the test's GIL); the list never changes while the
    tests run, so it is listed once. What the server answers is unchanged."""
    import moto.backends
    import moto.moto_server.werkzeug_app as app

    if getattr(moto.backends.list_of_moto_modules, "once", False):
        return
    modules = tuple(moto.backends.list_of_moto_modules())

    def listed() -> tuple[str, ...]:
        return modules

    listed.once = True  # type: ignore[attr-defined]
    moto.backends.list_of_moto_modules = listed  # type: ignore[assignment]
    assert app.backends is moto.backends  # the server calls it through this module


@contextmanager
def moto_s3(bucket: str = BUCKET) -> Iterator[MotoS3]:
    """A moto S3 server on a free port of 127.0.0.1 with ``bucket`` created, enforcing
    conditional writes atomically (:func:`atomic_conditional_writes`) and multipart uploads'
    conditions as S3 does (:func:`conditional_multipart`), its own modules listed once
    (:func:`listed_once`)."""
    from moto.server import ThreadedMotoServer

    atomic_conditional_writes()
    conditional_multipart()
    listed_once()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # port 0: the system picks a free port as the server binds it (a port found free first can
    # be taken by another process before the bind, and moto's start then waits forever)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        yield MotoS3(endpoint, s3_client(endpoint, bucket))
    finally:
        server.stop()


_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "expect", "te"}


@dataclass
class FaultProxy:
    """HTTP proxy in front of ``upstream`` (host, port) injecting faults with probability ``p``.

    Faults, picked at random: ``503`` (answered without forwarding), ``drop`` (connection closed
    before forwarding), ``lost`` (forwarded, then the connection closed without an answer: for a
    conditional create this is the lost acknowledgement), ``500`` (forwarded, then answered
    500), ``truncate`` (forwarded; the client gets the headers and half of the body).
    ``p_ack`` is the extra probability of ``lost`` for conditional puts (If-None-Match, If-Match).
    """

    upstream: tuple[str, int]
    p: float = 0.3
    p_ack: float = 0.5
    seed: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    port: int = 0
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _sock: socket.socket | None = field(default=None, repr=False)
    enabled: bool = True

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._sock = sock
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._sock is not None:
            with suppress(OSError):
                self._sock.close()

    def _accept(self) -> None:
        assert self._sock is not None
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _pick(self, conditional: bool) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            if not self.enabled:
                return None
            if conditional and self._rng.random() < self.p_ack:
                fault: str | None = "lost_ack"
            elif self._rng.random() < self.p:
                fault = self._rng.choice(["503", "drop", "lost", "500", "truncate"])
            else:
                fault = None
            if fault:
                self.counts[fault] += 1
            return fault

    def _serve(self, conn: socket.socket) -> None:
        import http.client

        up = http.client.HTTPConnection(*self.upstream, timeout=30)
        f = conn.makefile("rb")
        try:
            while True:
                line = f.readline()
                if not line or line in (b"\r\n", b"\n"):
                    return
                method, target, _ = line.decode("latin-1").split(" ", 2)
                headers: list[tuple[str, str]] = []
                while True:
                    h = f.readline().decode("latin-1")
                    if h in ("\r\n", "\n", ""):
                        break
                    k, _, v = h.partition(":")
                    headers.append((k.strip(), v.strip()))
                hmap = {k.lower(): v for k, v in headers}
                if hmap.get("expect", "").lower() == "100-continue":
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = self._read_body(f, hmap)
                conditional = "if-none-match" in hmap or "if-match" in hmap
                fault = self._pick(method == "PUT" and conditional)
                if fault in ("drop",):
                    return
                if fault == "503":
                    self._answer(conn, 503, b"<Error><Code>SlowDown</Code></Error>")
                    continue
                fwd = {k: v for k, v in headers if k.lower() not in _HOP}
                if body or method in ("PUT", "POST"):
                    fwd["Content-Length"] = str(len(body))
                up.request(method, target, body=body or None, headers=fwd)
                resp = up.getresponse()
                data = resp.read()
                if fault in ("lost", "lost_ack"):
                    return
                if fault == "500":
                    self._answer(conn, 500, b"<Error><Code>InternalError</Code></Error>")
                    continue
                out = [f"HTTP/1.1 {resp.status} {resp.reason}\r\n"]
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        out.append(f"{k}: {v}\r\n")
                length = resp.getheader("Content-Length")
                n = len(data) if method != "HEAD" else int(length or 0)
                out.append(f"Content-Length: {n}\r\n\r\n")
                conn.sendall("".join(out).encode("latin-1"))
                if method == "HEAD":
                    continue
                if fault == "truncate" and len(data) > 1:
                    conn.sendall(data[: len(data) // 2])
                    return
                conn.sendall(data)
        except (OSError, ValueError, http.client.HTTPException):
            return
        finally:
            up.close()
            with suppress(OSError):
                conn.close()

    @staticmethod
    def _read_body(f: Any, hmap: dict[str, str]) -> bytes:
        if hmap.get("transfer-encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(f.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while f.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += f.read(size)
                f.readline()
        n = int(hmap.get("content-length", 0) or 0)
        return f.read(n) if n else b""

    @staticmethod
    def _answer(conn: socket.socket, status: int, body: bytes) -> None:
        reason = {500: "Internal Server Error", 503: "Slow Down"}[status]
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        conn.sendall(head.encode() + body)


# -- a full disk ----------------------------------------------------------------------------------


class NoSpaceStore(WrapperStore[Store]):
    """Wraps a store; ``set`` raises ``OSError(ENOSPC)`` once ``budget`` bytes have been stored.

    The failing ``set`` stores nothing (a full disk fails the write of the temp file, which the
    store then removes), so what is visible is all or nothing per key.
    """

    def __init__(self, store: Store, budget: int, state: dict[str, Any] | None = None) -> None:
        super().__init__(store)
        # shared with the copies zarr makes (read-only views, ...)
        self.state = (
            state
            if state is not None
            else {"budget": budget, "used": 0, "refused": 0, "lock": threading.Lock()}
        )

    def _with_store(self, store: Store) -> NoSpaceStore:
        return NoSpaceStore(store, self.state["budget"], self.state)

    @property
    def refused(self) -> int:
        return int(self.state["refused"])

    def _take(self, key: str, n: int) -> None:
        st = self.state
        with st["lock"]:
            if st["used"] + n > st["budget"]:
                st["refused"] += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), key)
            st["used"] += n

    async def set(self, key: str, value: Any) -> None:
        self._take(key, len(value))
        await self._store.set(key, value)

    def set_sync(self, key: str, value: Any) -> None:
        self._take(key, len(value))
        self._store.set_sync(key, value)  # type: ignore[attr-defined]

    def __reduce__(self) -> Any:
        raise TypeError("NoSpaceStore is for threaded tests only")


# -- looking at a local array ---------------------------------------------------------------------


def files(root: Path, *, journal: bool = False) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes), without the journal unless asked."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = Path(d) / n
            rel = p.relative_to(root).as_posix()
            if journal or not rel.startswith(".shardwise/"):
                out[rel] = p.read_bytes()
    return out


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (the store's complete state)."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = Path(d) / n
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def exe() -> list[str]:
    """The ``shardwise`` command of this interpreter's environment (or ``python -m``)."""
    found = shutil.which("shardwise", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "shardwise.cli"]


def records(root: Path) -> dict[str, tuple[int, int]]:
    """The shard records under ``root``: relative path -> (inode, mtime_ns)."""
    top = root / ".shardwise" / "shards"
    out = {}
    for d, _, names in os.walk(top):
        for f in names:
            if not TEMP.search(f):
                with suppress(FileNotFoundError):
                    st = (Path(d) / f).stat()
                    out[str(Path(d, f).relative_to(top))] = (st.st_ino, st.st_mtime_ns)
    return out


def settle(
    root: Path,
    want: int,
    before: dict[str, tuple[int, int]] | None = None,
    timeout: float = 120.0,
) -> None:
    """Wait until ``want`` shard records exist under ``root`` that were not in ``before`` (a
    :func:`records` snapshot: a rewritten record is a new file) -- the state, not a clock."""
    before = before or {}

    def count() -> int:
        return sum(before.get(k) != v for k, v in records(root).items())

    wait_until(lambda: count() >= want, f"{want} new shard records under {root}", timeout)


def wait_until(cond: Any, what: str, timeout: float = 120.0, every: float = 0.02) -> None:
    """Poll ``cond()`` until it is true; fail with ``what`` after a generous ``timeout``.

    For waiting on a state (a file, a worker, a process) instead of sleeping a guessed time.
    """
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        time.sleep(every)


def stored_without(
    x: np.ndarray, shards: tuple[int, ...], region: tuple[slice, ...], fill: Any = 0
) -> int:
    """Shards of ``x`` holding data other than ``fill`` that do not touch ``region``."""
    from shardwise.core.layout import Layout

    lay = Layout(x.shape, shards, shards)
    skip = set(lay.shards_touching(region))
    return sum(bool((x[lay.shard_region(s)] != fill).any()) for s in lay.shards() if s not in skip)


def temp_files(root: Path) -> list[str]:
    return sorted(k for k in files(root, journal=True) if TEMP.search(k))


def torn_shards(root: Path) -> list[str]:
    """Shards under ``root`` that do not decode completely (index and every inner chunk)."""
    from shardwise.codec.shard import decode_shard_bytes
    from shardwise.errors import CorruptShardError
    from shardwise.storage.nodes import open_info

    if not (root / "zarr.json").exists():
        return [k for k in files(root) if not TEMP.search(k)]
    info = open_info(LocalStore(root, read_only=True))
    bad = []
    for rel, data in files(root).items():
        if rel == "zarr.json" or TEMP.search(rel):
            continue
        try:
            decode_shard_bytes(info.codec, data, rel)
        except (CorruptShardError, ValueError):
            bad.append(rel)
    return bad


def unique() -> str:
    return uuid.uuid4().hex[:12]


def figures_path() -> Path:
    """Where tests record the figures they measure (read by the closing note)."""
    import tempfile

    default = Path(tempfile.gettempdir()) / "shardwise-figures"
    p = Path(os.environ.get("SHARDWISE_FIGURES", default))
    p.mkdir(parents=True, exist_ok=True)
    return p


def record_figures(name: str, figures: dict[str, Any]) -> None:
    """Write ``figures`` to ``<figures dir>/<name>.json`` and print them (``pytest -s`` shows)."""
    import json

    text = json.dumps(figures, indent=1, sort_keys=True, default=str)
    (figures_path() / f"{name}.json").write_text(text + "\n")
    print(f"\n[figures] {name}: {json.dumps(figures, sort_keys=True, default=str)}")


@contextmanager
def worker_cluster(memory_limit: str, *, set_as_default: bool) -> Iterator[Any]:
    """A client of a LocalCluster of 2 worker processes with 1 thread and ``memory_limit`` each."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            memory_limit=memory_limit,
        ) as cluster,
        Client(cluster, set_as_default=set_as_default) as c,
    ):
        yield c


def cluster_workers(client: Any) -> set[str]:
    """The addresses of the workers the scheduler has now, asked of the scheduler itself.

    Not ``client.scheduler_info()["workers"]``: that returns the client's cached identity after
    fetching it, and the client's periodic refresh (every 2 s, on its event loop) replaces that
    cache with an identity fetched without workers, so on a loaded machine the check can read an
    empty set."""
    return set(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def traced_peak(fn: Any) -> int:
    """tracemalloc's peak over ``fn()``: the allocations it makes (what existed before is not
    counted)."""
    import tracemalloc

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return int(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()


def assert_same(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(a, b)


# -- a disk that stalls on one key (for pausing a worker inside a shard write) -------------------


class StallStore(WrapperStore[Store]):
    """Wraps a (picklable) store; the first ``set`` of ``key`` anywhere writes its pid to ``flag``
    and holds until ``<flag>.go`` exists, so a test can SIGSTOP that process mid-write (and let
    it go on later) whatever the machine's speed. ``<flag>.resumed`` marks that it went on."""

    def __init__(self, store: Store, key: str, flag: str, timeout: float = 600.0) -> None:
        super().__init__(store)
        self.key, self.flag, self.timeout = key, flag, timeout

    def __reduce__(self) -> Any:
        return (StallStore, (self._store, self.key, self.flag, self.timeout))

    def _with_store(self, store: Store) -> StallStore:
        return StallStore(store, self.key, self.flag, self.timeout)

    async def set(self, key: str, value: Any) -> None:
        if key == self.key:
            tmp = f"{self.flag}.{os.getpid()}"
            Path(tmp).write_text(str(os.getpid()))
            try:
                os.link(tmp, self.flag)  # atomic, with the pid in it
            except FileExistsError:
                pass
            else:
                # blocks this worker thread: the pause point
                wait_until(lambda: os.path.exists(f"{self.flag}.go"), "released", self.timeout)
                Path(f"{self.flag}.resumed").write_text(str(os.getpid()))
        await self._store.set(key, value)


# -- functions run in separate processes (multiprocessing forkserver) ---------------------------


def race_lease(
    idx: int, kind: str, base: str, trials: int, barrier: Any, out: Any, endpoint: str = ""
) -> None:
    """One of the racing writer jobs: every trial, wait for the others, then take the lease."""
    from shardwise.durability.lease import Lease
    from shardwise.errors import LeaseHeldError
    from shardwise.storage.store import ShardStore

    for t in range(trials):
        if kind == "local":
            store = ShardStore(LocalStore(Path(base) / f"t{t}"))
        else:
            store = ShardStore(MotoS3(endpoint, None).obstore(f"{base}/t{t}"))
        barrier.wait()
        try:
            lease = Lease.acquire(store, purpose=f"job {idx}")
            out.put((t, idx, lease.info.token))
        except LeaseHeldError:
            out.put((t, idx, None))
        except Exception as e:  # reported, and fails the test
            out.put((t, idx, f"error: {type(e).__name__}: {e}"))


def race_write(idx: int, root: str, barrier: Any, out: Any) -> None:
    """A whole writer job: write an array filled with ``idx`` (slowly) into ``root``."""
    import dask.array as da
    import numpy as np

    import shardwise
    from shardwise.errors import LeaseHeldError

    def slow(block: Any) -> Any:
        time.sleep(0.02)
        return block

    src = da.full((64, 64), idx, dtype="int16", chunks=(16, 16)).map_blocks(
        slow, meta=np.empty((0, 0), "int16")
    )
    barrier.wait()
    try:
        rep = shardwise.write_array(src, root, chunks=(8, 8), shards=(16, 16))
        out.put((idx, "wrote", rep.shards_written))
    except LeaseHeldError:
        out.put((idx, "refused", 0))
    except FileExistsError:
        out.put((idx, "exists", 0))
    except Exception as e:
        out.put((idx, f"error: {type(e).__name__}: {e}", 0))


KILL_SHAPE = (768, 768)
# direct: the held source block then holds back exactly the shards it touches (staged writes
# are killed in test_staged.py)
KILL_KW: dict[str, Any] = dict(chunks=(32, 32), shards=(128, 128), fill_value=0, strategy="direct")


def kill_data(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4000, KILL_SHAPE).astype("float32")
    x[:128, :256] = 0  # two shards of fill
    return x


def hold_block(block: Any, hold: Any, block_info: Any = None) -> Any:
    """A source block function: block ``hold`` never comes (its task waits until killed)."""
    import threading

    if block_info is not None and tuple(block_info[0]["chunk-location"]) == tuple(hold):
        threading.Event().wait(600)
        raise RuntimeError("the writer was never killed")
    return block


def kill_writer(root: str, seed: int, started: Any, hold: Any = None) -> None:
    """The writer that gets SIGKILLed: a plain write of ``kill_data(seed)``; with ``hold`` (a
    source block) the write cannot finish, so the kill always comes mid-write."""
    import dask
    import dask.array as da

    import shardwise

    src = da.from_array(kill_data(seed), chunks=(200, 300))
    if hold is not None:
        src = src.map_blocks(hold_block, hold, dtype=src.dtype, meta=src._meta)
    started.set()
    # threads enough that the held task never stops the others, however many cores
    with dask.config.set(scheduler="threads", num_workers=4):
        shardwise.write_array(src, root, **KILL_KW)


def forkserver() -> Any:
    """A multiprocessing context whose children fork from a server that preloaded shardwise
    (its writers and streams too: a child that writes starts in milliseconds, not a second).

    Also preloaded: what a child's first write imports on its way -- distributed (dask asks
    whether it is installed before it computes anything), botocore (shardwise's S3 client for
    ranged merges) and xarray's writer: 3-6 s of CPU per child otherwise, paid by every child
    of every test, eight at once in the eight-appender tests."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["faultkit", "shardwise", "shardwise.write.streams", "shardwise.pyramid.streams",
         "dask.array", "numpy", "zarr", "distributed", "botocore.session", "botocore.client",
         "shardwise.xarray.writer", "shardwise.storage.s3"]
    )  # fmt: skip
    return ctx


# -- independent region writers sharing shards (conditional commits) -------------------------------

SLAB_ROWS, SLAB_SHARD, SLAB_WIDTH = 85, 64, 6


def slab_array(trial: int, writers: int) -> np.ndarray:
    """What ``writers`` slabs of ``SLAB_ROWS`` rows write together in ``trial`` (no fill value)."""
    n = writers * SLAB_ROWS
    return (np.arange(n * SLAB_WIDTH).reshape(n, SLAB_WIDTH) + 1 + 1000 * trial).astype("int32")


def slab_store(kind: str, base: str, trial: int, endpoint: str = "") -> Any:
    if kind in ("local", "xarray"):  # xarray: variable "v" of a Dataset written by to_zarr
        return str(Path(base) / f"t{trial}.zarr")
    if kind == "azure":  # Azurite (tests/cloudkit.py)
        from cloudkit import azure_store

        return azure_store(endpoint, f"{base}/t{trial}")
    return MotoS3(endpoint, None).obstore(f"{base}/t{trial}")


def race_region(
    idx: int,
    kind: str,
    base: str,
    trials: int,
    writers: int,
    barrier: Any,
    out: Any,
    endpoint: str = "",
    conditional: bool = True,
    meet: dict[int, Any] | None = None,
) -> None:
    """One independent job: every trial, wait for the others, then write slab ``idx`` (85 rows,
    splitting 64-row shards) into that trial's existing array with ``region=`` (``write_array``,
    or ``to_zarr`` for kind "xarray").
    ``conditional=False`` turns the check off (to show what it prevents). ``meet`` (a barrier of
    two per shard row that two slabs share) forces the race: each writer of a shared shard waits,
    after its read and merge and before its first commit, until the other has read and merged
    too, so one of the two commits always finds the shard changed since its read."""
    import dask

    import shardwise
    import shardwise.storage.conditional as cond

    cond.ENABLED = conditional
    if meet:
        cond.before_commit = partial(_meet_before_commit, meet)

    dask.config.set(scheduler="synchronous")  # the concurrency under test is between processes
    for t in range(trials):
        rows = slice(idx * SLAB_ROWS, (idx + 1) * SLAB_ROWS)
        part = slab_array(t, writers)[rows]
        store = slab_store(kind, base, t, endpoint)
        barrier.wait(timeout=300)
        try:
            if kind == "xarray":
                import xarray as xr

                ds = xr.Dataset({"v": (("t", "x"), part)})
                rep = shardwise.to_zarr(ds, store, region={"t": rows})
            else:
                rep = shardwise.write_array(part, store, region=(rows, slice(None)), mode="r+")
            out.put((t, idx, rep.conflicts_retried, ""))
        except Exception as e:  # reported, and fails the test
            out.put((t, idx, -1, f"error: {type(e).__name__}: {e}"))


def _meet_before_commit(meet: dict[int, Any], name: str, attempt: int) -> None:
    """``before_commit`` of :func:`race_region`: the first commit of a shared shard ("c/<row>/0")
    waits for the other writer of that shard (a retry does not: the other has committed)."""
    parts = name.split("/")
    if attempt == 0 and parts[0] == "c" and int(parts[1]) in meet:
        meet[int(parts[1])].wait(timeout=300)


# -- holding a write at a known point (deterministic failure tests) -------------------------------


class HeldPut(WrapperStore[Store]):
    """The first ``set`` of ``key`` sets ``held`` and waits for ``go`` without blocking the
    store's event loop (other requests go on meanwhile); once stored, it calls ``landed`` (if
    given) and sets ``resumed``."""

    def __init__(
        self, store: Store, key: str, held: Any, go: Any, resumed: Any, landed: Any = None
    ) -> None:
        super().__init__(store)
        self.key, self.held, self.go, self.resumed = key, held, go, resumed
        self.landed = landed

    def _with_store(self, store: Store) -> HeldPut:
        return HeldPut(store, self.key, self.held, self.go, self.resumed, self.landed)

    async def set(self, key: str, value: Any) -> None:
        if key == self.key and not self.held.is_set():
            self.held.set()
            assert await asyncio.to_thread(self.go.wait, 300), "the held put was never let go"
            await self._store.set(key, value)
            if self.landed is not None:
                self.landed()
            self.resumed.set()
            return
        await self._store.set(key, value)


class SeenWaiting(threading.Condition):
    """The pool's task condition, telling ``waiting`` when someone waits on it: the failed write
    waiting for its running tasks (``_pool.stop_write``, its only waiter)."""

    def __init__(self, waiting: threading.Event) -> None:
        super().__init__()
        self.waiting = waiting

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)
