"""Slices of open_array read what they select, not the blocks (shards) they fall in.

Bytes read are counted where they leave the store: for local files the ``rchar`` of the processes
that read (``/proc/<pid>/io``: every byte passed to ``read``/``preadv``, page cache or not), for S3
the bodies of the GET responses moto's server sends. Each count is compared with ``read_array`` of
the same elements (shard index and inner chunks only), after one warm-up run of each, so that no
import or first use lands in a count.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
from zarr.storage import MemoryStore

import shardwise
from faultkit import MotoS3, s3_client
from shardwise.engine.assemble import ShardArray

SHAPE, INNER, SHARDS = (512, 2048), (32, 32), (256, 1024)  # 1 MiB shards of 4 KiB chunks
SHARD_BYTES = 256 * 1024 * 4
INDEX_BYTES = (256 // 32) * (1024 // 32) * 16 + 4  # (offset, nbytes) per inner chunk, crc32c

# name -> (the selection of the opened array, the same elements as read_array's selection)
CASES: dict[str, tuple[Callable[[Any], Any], Any]] = {
    "window": (lambda x: x[100:110, 500:510], np.s_[100:110, 500:510]),
    "across shards": (lambda x: x[250:262, 1020:1030], np.s_[250:262, 1020:1030]),
    "strided": (lambda x: x[::37, 5:900:101], np.s_[::37, 5:900:101]),
    "negative step": (lambda x: x[300:200:-9, ::-250], np.s_[300:200:-9, ::-250]),
    "integer": (lambda x: x[100, 300:340], np.s_[100, 300:340]),
    "chain": (lambda x: x[50:200][10:20, ::3][:, 100:110], np.s_[60:70, 300:330:3]),
    "ellipsis and None": (lambda x: x[..., None, 700:705][3:9], np.s_[3:9, 700:705]),
    "sum": (lambda x: x[100:110, 500:510].sum(), np.s_[100:110, 500:510]),
}


def data() -> np.ndarray:
    return np.random.default_rng(3).normal(size=SHAPE).astype("float32")  # barely compresses


def _rchar_of(tid: int) -> int:
    try:
        with open(f"/proc/self/task/{tid}/io") as f:
            return int(next(line for line in f if line.startswith("rchar")).split()[1])
    except (FileNotFoundError, ProcessLookupError):  # the thread ended
        return 0


def rchar(start: bool = True) -> int:
    """Bytes this process's threads have passed through read()/preadv() so far, but for the
    Python threads that cannot be reading the array (another test's heartbeat, an event loop
    left running: their reads would land in a count). The readers are the calling thread,
    shardwise's pool and dask's (long-lived: their counts stay in their own ``task/<tid>/io``).
    Reading the other threads' files is a read of the calling thread, kept out of a window:
    at its ``start`` the calling thread's own count is read last, at its end first."""
    me = threading.get_native_id()
    mine = 0 if start else _rchar_of(me)
    foreign = {
        t.native_id
        for t in threading.enumerate()
        if not t.name.startswith(("shardwise", "ThreadPoolExecutor")) and t.native_id != me
    }
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    others = sum(_rchar_of(t) for t in tids if t not in foreign and t != me)
    return others + (_rchar_of(me) if start else mine)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    root = str(tmp_path_factory.mktemp("lazy") / "a.zarr")
    values = data()
    shardwise.write_array(values, root, chunks=INNER, shards=SHARDS)
    return root, values


def counted(count: Callable[[bool], int], run: Callable[[], Any]) -> tuple[Any, int]:
    """``run()`` once to warm up, then again with the bytes ``count`` sees (``count(True)`` at
    the window's start, ``count(False)`` at its end)."""
    run()
    before = count(True)
    got = run()
    return got, count(False) - before


def read_array_bytes(store: Any, count: Callable[[bool], int], name: str) -> int:
    return counted(count, lambda: shardwise.read_array(store, CASES[name][1]))[1]


# -- values and chunks ----------------------------------------------------------------------------


@pytest.mark.parametrize("chunks", [None, (64, 100), (512, 2048)], ids=["shards", "small", "one"])
def test_selections_equal_numpy_with_dask_chunks(chunks: Any) -> None:
    """Every case gives numpy's values on every path (direct compute, the threaded and the
    synchronous graph), with the chunks dask's own slicing of the same blocks gives."""
    store = MemoryStore()
    values = data()
    shardwise.write_array(values, store, chunks=INNER, shards=SHARDS)
    x = shardwise.open_array(store, chunks=chunks)
    plain = da.from_array(values, chunks=x.chunks)
    for name, (select, _) in CASES.items():
        lazy, expect = select(x), select(values)
        assert lazy.chunks == select(plain).chunks, name
        np.testing.assert_array_equal(lazy.compute(), expect, err_msg=name)
        for scheduler in ["threads", "sync"]:
            (got,) = dask.compute(lazy, scheduler=scheduler)
            np.testing.assert_array_equal(got, expect, err_msg=f"{name} {scheduler}")
    assert isinstance(x[3:9, 5], ShardArray) and isinstance(x[3][4:9], ShardArray)
    assert x[7, 9].compute() == values[7, 9]
    # fancy indexing is dask's, over the blocks, as before
    np.testing.assert_array_equal(x[[1, 5, 2]].compute(), values[[1, 5, 2]])
    with pytest.raises(IndexError):
        x[600]


# -- bytes read: local files ----------------------------------------------------------------------


@pytest.mark.parametrize("chunks", [None, (64, 100)], ids=["shards", "small"])
@pytest.mark.parametrize("name", list(CASES))
def test_local_graph_reads_what_the_selection_needs(
    local: tuple[str, np.ndarray], name: str, chunks: Any
) -> None:
    root, values = local
    select = CASES[name][0]
    base = read_array_bytes(root, rchar, name)
    x = shardwise.open_array(root, chunks=chunks)
    got, used = counted(rchar, lambda: dask.compute(select(x), scheduler="threads")[0])
    np.testing.assert_allclose(got, select(values), rtol=1e-6)
    assert 0 < used <= 1.1 * base + 512, (used, base)
    if name in ("window", "integer", "chain", "sum"):
        assert used < SHARD_BYTES / 20, used  # a whole shard is 1 MiB


def test_local_direct_compute_of_a_slice_is_one_direct_read(local: tuple[str, np.ndarray]) -> None:
    root, values = local
    x = shardwise.open_array(root)
    got, used = counted(rchar, lambda: x[100:110, 500:510].compute())
    np.testing.assert_array_equal(got, values[100:110, 500:510])
    assert used <= 1.1 * read_array_bytes(root, rchar, "window") + 512


# -- bytes read: S3 (moto) ------------------------------------------------------------------------


class CountingApp:
    """A WSGI app that counts the body bytes of the GET responses of the app it wraps."""

    def __init__(self, app: Any) -> None:
        self.app, self.sent, self.lock = app, 0, threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        body = self.app(environ, start_response)
        get = environ.get("REQUEST_METHOD") == "GET"
        for part in body:
            if get:
                with self.lock:
                    self.sent += len(part)
            yield part


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[MotoS3, CountingApp]]:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = CountingApp(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True)  # the system picks the port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}"
        yield MotoS3(endpoint, s3_client(endpoint)), app
    finally:
        server.shutdown()
        thread.join()


@pytest.mark.parametrize("name", ["window", "strided", "integer", "chain", "sum"])
def test_s3_graph_reads_what_the_selection_needs(
    s3: tuple[MotoS3, CountingApp], name: str, tmp_path: Path
) -> None:
    server, app = s3
    store = server.obstore(f"lazy-{name.replace(' ', '-')}")
    values = data()
    shardwise.write_array(values, store, chunks=INNER, shards=SHARDS)

    def sent(_: bool = True) -> int:
        return app.sent

    base = read_array_bytes(store, sent, name)
    select = CASES[name][0]
    x = shardwise.open_array(store)
    got, used = counted(sent, lambda: dask.compute(select(x), scheduler="threads")[0])
    np.testing.assert_allclose(got, select(values), rtol=1e-6)
    assert 0 < used <= 1.1 * base, (used, base)
    if name != "strided":
        assert used < SHARD_BYTES / 20, used


def test_s3_graph_on_a_cluster(client: Any, s3: tuple[MotoS3, CountingApp]) -> None:
    """The block tasks run in 2 worker processes; moto's server counts what they fetch."""
    server, app = s3
    store = server.obstore("lazy-cluster")
    values = data()
    shardwise.write_array(values, store, chunks=INNER, shards=SHARDS)

    def sent(_: bool = True) -> int:
        return app.sent

    for chunks in [None, (64, 100)]:
        x = shardwise.open_array(store, chunks=chunks)
        for name in ["window", "strided", "chain", "sum"]:
            select = CASES[name][0]
            base = read_array_bytes(store, sent, name)
            lazy = select(x)
            got, used = counted(sent, lambda: client.compute(lazy).result())  # noqa: B023
            np.testing.assert_allclose(got, select(values), rtol=1e-6)
            # a task holds no index cache (the store may be rewritten): every block beyond
            # the first that lies in an already fetched shard fetches that shard's index again
            extra = (x[CASES[name][1]].npartitions - 1) * INDEX_BYTES
            assert 0 < used <= 1.1 * base + extra, (name, chunks, used, base)
