"""The anchors shardwise is measured against, on the same workloads and the same machine.

* writes: xarray ``Dataset.to_zarr`` (threads, a LocalCluster, sub-shard dask chunks),
  zarr-python ``arr[...] = data``, tensorstore ``write`` (with and without fsync);
* reads: xarray ``open_zarr`` (default chunks and shard chunks), ``da.from_zarr``, zarr-python,
  tensorstore, of a store written once by xarray (``prepare_read``);
* ``g-limits``: the machine's limits on the same inner chunks (zstd-3 compress/decompress on
  1 and 2 threads, file writes and reads of the compressed bytes, memcpy).

Every write is read back by an implementation other than the writer and compared inner chunk by
inner chunk with the source (:func:`verify_all`); reads are compared with the source. Timings
come from :class:`Meter`: wall time, CPU time of the process tree, sampled peak RSS.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import workloads
from workloads import (
    WORKLOADS,
    ZSTD_LEVEL,
    inner_slices_shard_order,
    load_src,
    make_ds,
    shard_slices,
    tag,
)

STORE_DIR = os.environ.get("BENCH_STORES", "/tmp/bench-stores")
CASE_TIMEOUT_S = int(os.environ.get("BENCH_CASE_TIMEOUT", "420"))


# -- measurement -------------------------------------------------------------------------------


def _proc_mem(pid: int) -> tuple[int, int]:
    rss = anon = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, anon


class Meter:
    """Wall time, CPU time and sampled peak RSS (and anonymous RSS) of this process and all its
    descendants (dask workers included), sampled every ``interval`` seconds."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self.me = psutil.Process()
        self.interval = interval
        self._stop = threading.Event()
        self.peak_rss = self.peak_anon = 0

    def _tree(self) -> list[Any]:
        try:
            return [self.me, *self.me.children(recursive=True)]
        except Exception:
            return [self.me]

    @staticmethod
    def _sample(procs: list[Any]) -> tuple[int, int]:
        rss = anon = 0
        for p in procs:
            r, a = _proc_mem(p.pid)
            rss += r
            anon += a
        return rss, anon

    @staticmethod
    def _cpu(p: Any) -> float:
        try:
            c = p.cpu_times()
            return float(c.user + c.system)
        except Exception:
            return 0.0

    def _run(self) -> None:
        procs = self._tree()
        last = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() - last > 0.5:
                procs, last = self._tree(), time.monotonic()
            r, a = self._sample(procs)
            self.peak_rss = max(self.peak_rss, r)
            self.peak_anon = max(self.peak_anon, a)
            self._stop.wait(self.interval)

    def __enter__(self) -> Meter:
        procs = self._tree()
        self.base_rss, self.base_anon = self._sample(procs)
        self.peak_rss, self.peak_anon = self.base_rss, self.base_anon
        self._cpu0 = {p.pid: self._cpu(p) for p in procs}
        self._th = threading.Thread(target=self._run, daemon=True)
        self._th.start()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self._stop.set()
        self._th.join()
        procs = self._tree()
        r, a = self._sample(procs)
        self.peak_rss = max(self.peak_rss, r)
        self.peak_anon = max(self.peak_anon, a)
        self.cpu = sum(self._cpu(p) - self._cpu0.get(p.pid, 0.0) for p in procs)

    def result(self) -> dict[str, float]:
        mib = 1 << 20
        return dict(
            wall_s=self.wall,
            cpu_s=self.cpu,
            peak_rss_mib=self.peak_rss / mib,
            peak_anon_mib=self.peak_anon / mib,
            base_rss_mib=self.base_rss / mib,
            base_anon_mib=self.base_anon / mib,
            delta_anon_mib=(self.peak_anon - self.base_anon) / mib,
        )


def _warnings(wlist: list[Any]) -> list[str]:
    return sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in wlist})


# -- stores ------------------------------------------------------------------------------------


def dir_bytes(path: str) -> tuple[int, int]:
    tot = n = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            tot += os.path.getsize(os.path.join(root, f))
            n += 1
    return tot, n


def rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def store_path(wl: str, case: str, rep: int) -> str:
    os.makedirs(STORE_DIR, exist_ok=True)
    return os.path.join(STORE_DIR, f"{tag(wl)}-{case}-r{rep}-{os.getpid()}.zarr")


def read_store_path(wl: str) -> str:
    return os.path.join(STORE_DIR, f"{tag(wl)}-read.zarr")


def xr_encoding(W: dict[str, Any]) -> dict[str, Any]:
    """Inner chunks, shards and zstd-3 for the workload's variable (every case uses these)."""
    from zarr.codecs import ZstdCodec

    return {
        W["var"]: {
            "chunks": W["inner"],
            "shards": W["shard"],
            "compressors": (ZstdCodec(level=ZSTD_LEVEL),),
        }
    }


def zarr_create(path: str, W: dict[str, Any]) -> Any:
    import zarr
    from zarr.codecs import ZstdCodec

    return zarr.create_array(
        store=path,
        shape=W["shape"],
        dtype=W["dtype"],
        chunks=W["inner"],
        shards=W["shard"],
        compressors=ZstdCodec(level=ZSTD_LEVEL),
        fill_value=0,
        overwrite=True,
        zarr_format=3,
        dimension_names=W["dims"],
    )


def ts_spec(path: str, W: dict[str, Any] | None = None, sync: bool = True) -> dict[str, Any]:
    """A tensorstore spec for the array at ``path`` (and, given ``W``, the metadata to create)."""
    spec: dict[str, Any] = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": path},
        "context": {"file_io_sync": bool(sync)},
    }
    if W is not None:
        codec = {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": list(W["inner"]),
                "codecs": [
                    {"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "zstd", "configuration": {"level": ZSTD_LEVEL, "checksum": False}},
                ],
                "index_codecs": [
                    {"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "crc32c"},
                ],
                "index_location": "end",
            },
        }
        spec["metadata"] = {
            "shape": list(W["shape"]),
            "data_type": W["dtype"],
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(W["shard"])}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0,
            "codecs": [codec],
            "dimension_names": list(W["dims"]),
        }
        spec["create"] = True
        spec["delete_existing"] = True
    return spec


def start_cluster() -> tuple[Any, Any]:
    import logging

    from dask.distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    cluster = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    return cluster, Client(cluster)


# -- verification with an implementation other than the writer ---------------------------------


def open_reader(kind: str, arr_path: str) -> tuple[Callable[[Any], np.ndarray], str]:
    """A function from a selection to its values: tensorstore (``ts``) or zarr-python."""
    if kind == "ts":
        import tensorstore as ts

        t = ts.open(ts_spec(arr_path), open=True, read=True).result()
        return (lambda sl: t[sl].read().result()), "tensorstore"
    import zarr

    a = zarr.open_array(arr_path, mode="r")
    return (lambda sl: a[sl]), "zarr-python"


def verify(wl: str, arr_path: str, reader: str) -> dict[str, Any]:
    """Compare every inner chunk read back with the source, shard by shard."""
    W = WORKLOADS[wl]
    src = load_src(wl)
    rd, rname = open_reader(reader, arr_path)
    inner = W["inner"]
    bad_chunks = fill_chunks = total_chunks = bad_shards = 0
    t0 = time.perf_counter()
    for ssl in shard_slices(W):
        a = np.asarray(src[ssl])
        b = np.asarray(rd(ssl))
        if a.shape != b.shape:
            raise RuntimeError(f"shape mismatch {a.shape} vs {b.shape}")
        rs: list[int] = []
        for s, c in zip(a.shape, inner, strict=True):
            rs += [s // c, c]
        chunk_axes = tuple(range(1, 2 * a.ndim, 2))
        nbad = (a != b).reshape(rs).any(axis=chunk_axes)
        isfill = ((b == 0) | np.isnan(b)) if b.dtype.kind == "f" else (b == 0)
        nzero = isfill.reshape(rs).all(axis=chunk_axes)
        total_chunks += nbad.size
        if nbad.any():
            bad_shards += 1
            bad_chunks += int(nbad.sum())
            fill_chunks += int((nbad & nzero).sum())
    return dict(
        reader=rname,
        ok=bad_chunks == 0,
        bad_inner_chunks=bad_chunks,
        bad_chunks_all_fill=fill_chunks,
        bad_shards=bad_shards,
        total_inner_chunks=total_chunks,
        verify_s=round(time.perf_counter() - t0, 2),
    )


def verify_all(wl: str, arr_path: str, readers: list[str]) -> dict[str, Any]:
    """:func:`verify` with each reader: the first one's result and a summary of all."""
    res = [verify(wl, arr_path, r) for r in readers]
    out = dict(res[0])
    out["all_readers"] = [
        f"{r['reader']}:{'ok' if r['ok'] else 'BAD ' + str(r['bad_inner_chunks'])}" for r in res
    ]
    out["ok"] = all(r["ok"] for r in res)
    return out


# -- write cases -------------------------------------------------------------------------------


def case_xr(
    wl: str,
    rep: int,
    *,
    chunks: str = "shard",
    scheduler: str = "threads",
    safe_chunks: bool = True,
    align_chunks: bool = False,
) -> dict[str, Any]:
    """xarray ``to_zarr`` with the workload's encoding, from dask chunks of one kind."""
    import dask

    W = WORKLOADS[wl]
    ch = {"shard": W["shard"], "inner": W["inner"], "mis": W["misaligned"]}[chunks]
    ds = make_ds(wl, ch)
    path = store_path(wl, "xr", rep)
    info: dict[str, Any] = dict(
        dask_chunks=list(ch),
        n_dask_chunks=int(np.prod(ds[W["var"]].data.numblocks)),
        scheduler=scheduler,
        safe_chunks=safe_chunks,
        align_chunks=align_chunks,
    )
    cluster = client = None
    if scheduler == "distributed":
        t0 = time.perf_counter()
        cluster, client = start_cluster()
        info["cluster_start_s"] = round(time.perf_counter() - t0, 2)
    ctx = dask.config.set(scheduler="threads") if scheduler == "threads" else dask.config.set({})
    try:
        with ctx, warnings.catch_warnings(record=True) as wlist:
            warnings.simplefilter("always")
            try:
                with Meter() as m:
                    ds.to_zarr(
                        path,
                        mode="w",
                        zarr_format=3,
                        encoding=xr_encoding(W),
                        safe_chunks=safe_chunks,
                        align_chunks=align_chunks,
                    )
            except Exception as e:  # expected for sub-shard chunks with safe_chunks=True
                info.update(error=f"{type(e).__name__}: {e}")
                rmtree(path)
                return info
            info["warnings"] = _warnings(wlist)
        info.update(m.result())
    finally:
        if client is not None:
            client.close()
            cluster.close()
    info["store_bytes"], info["store_files"] = dir_bytes(path)
    info["verify"] = verify_all(wl, os.path.join(path, W["var"]), readers_for("xr", rep))
    rmtree(path)
    return info


def readers_for(writer: str, rep: int) -> list[str]:
    """tensorstore reads what zarr-python/xarray wrote and the other way round; the first
    repetition of a zarr-python or xarray write is read by zarr-python as well."""
    if writer == "ts":
        return ["zarr"]
    return ["ts"] + (["zarr"] if rep == 0 else [])


def case_zarr_write(wl: str, rep: int, *, mode: str = "full") -> dict[str, Any]:
    """zarr-python: ``arr[...] = data`` (``full``) or a sequential loop over the shards."""
    W = WORKLOADS[wl]
    data = np.ascontiguousarray(load_src(wl, mmap=False))
    path = store_path(wl, f"zarr-{mode}", rep)
    info: dict[str, Any] = dict(mode=mode)
    with warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")
        with Meter() as m:
            a = zarr_create(path, W)
            if mode == "full":
                a[...] = data
            else:
                for sl in shard_slices(W):
                    a[sl] = data[sl]
        info["warnings"] = _warnings(wlist)
    info.update(m.result())
    del data
    info["store_bytes"], info["store_files"] = dir_bytes(path)
    info["verify"] = verify_all(wl, path, ["ts"])
    rmtree(path)
    return info


def case_ts_write(wl: str, rep: int, *, mode: str = "full", sync: bool = True) -> dict[str, Any]:
    """tensorstore: one ``write`` of the whole array, or a sequential loop over the shards."""
    import tensorstore as ts

    W = WORKLOADS[wl]
    data = np.ascontiguousarray(load_src(wl, mmap=False))
    path = store_path(wl, f"ts-{mode}", rep)
    info: dict[str, Any] = dict(mode=mode, file_io_sync=sync)
    with Meter() as m:
        t = ts.open(ts_spec(path, W, sync=sync)).result()
        if mode == "full":
            t.write(data).result()
        else:
            for sl in shard_slices(W):
                t[sl].write(data[sl]).result()
    info.update(m.result())
    del data, t
    info["store_bytes"], info["store_files"] = dir_bytes(path)
    info["verify"] = verify_all(wl, path, readers_for("ts", rep))
    rmtree(path)
    return info


# -- the machine's limits ----------------------------------------------------------------------


def _write_all(fd: int, blob: bytes) -> None:
    mv = memoryview(blob)
    while mv:
        n = os.write(fd, mv[: 1 << 30])
        mv = mv[n:]


def case_limits(wl: str, rep: int) -> dict[str, Any]:
    """zstd-3 compress/decompress of every inner chunk (1 and 2 threads, numcodecs and
    python-zstandard with a reused context), file write/read of the compressed shards, memcpy.

    write limit = max(best 2-core compress, file write without fsync); read limit = max(best
    2-core decompress, file read); best 2-core = min(measured 2-thread runs, best 1-thread / 2).
    """
    import numcodecs
    import zstandard

    W = WORKLOADS[wl]
    data = np.ascontiguousarray(load_src(wl, mmap=False))
    nbytes = data.nbytes
    codec = numcodecs.Zstd(level=ZSTD_LEVEL)
    groups = list(inner_slices_shard_order(W))
    flat = [c for _, cs in groups for c in cs]
    info: dict[str, Any] = dict(nbytes=nbytes, n_inner=len(flat), n_shards=len(groups))

    def encode_group(g: Any) -> list[bytes]:
        return [codec.encode(np.ascontiguousarray(data[c])) for c in g[1]]

    t0 = time.perf_counter()
    comp = [encode_group(g) for g in groups]
    info["compress_1t_s"] = time.perf_counter() - t0
    cbytes = sum(len(b) for g in comp for b in g)
    info.update(compressed_bytes=cbytes, ratio=nbytes / cbytes)
    with ThreadPoolExecutor(2) as ex:
        t0 = time.perf_counter()
        comp = list(ex.map(encode_group, groups))  # one task per shard
        info["compress_2t_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        list(ex.map(lambda c: codec.encode(np.ascontiguousarray(data[c])), flat))
        info["compress_2t_perchunk_s"] = time.perf_counter() - t0

    local = threading.local()

    def ctx() -> Any:
        if not hasattr(local, "c"):
            local.c = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
            local.d = zstandard.ZstdDecompressor()
        return local

    def zgroup(g: Any) -> list[bytes]:
        c = ctx().c
        return [c.compress(np.ascontiguousarray(data[ch])) for ch in g[1]]

    def zdgroup(g: list[bytes]) -> list[bytes]:
        d = ctx().d
        return [d.decompress(b) for b in g]

    t0 = time.perf_counter()
    zcomp = [zgroup(g) for g in groups]
    info["zstd_ctx_compress_1t_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for g in zcomp:
        zdgroup(g)
    info["zstd_ctx_decompress_1t_s"] = time.perf_counter() - t0
    with ThreadPoolExecutor(2) as ex:
        t0 = time.perf_counter()
        list(ex.map(zgroup, groups))
        info["zstd_ctx_compress_2t_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        list(ex.map(zdgroup, zcomp))
        info["zstd_ctx_decompress_2t_s"] = time.perf_counter() - t0
    del zcomp
    info["zstandard_version"] = zstandard.__version__

    t0 = time.perf_counter()
    for g in comp:
        for b in g:
            codec.decode(b)
    info["decompress_1t_s"] = time.perf_counter() - t0
    with ThreadPoolExecutor(2) as ex:
        t0 = time.perf_counter()
        list(ex.map(lambda g: [codec.decode(b) for b in g], comp))
        info["decompress_2t_s"] = time.perf_counter() - t0

    # the compressed bytes as one file per shard, written sequentially, then read back
    blobs = [b"".join(g) for g in comp]
    del comp
    d = os.path.join(STORE_DIR, f"{tag(wl)}-limits-r{rep}-{os.getpid()}")
    for fsync in (False, True):
        rmtree(d)
        os.makedirs(d)
        t0 = time.perf_counter()
        fds = []
        for i, blob in enumerate(blobs):
            fd = os.open(os.path.join(d, f"s{i}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            _write_all(fd, blob)
            if fsync:
                fds.append(fd)
            else:
                os.close(fd)
        for fd in fds:
            os.fsync(fd)
            os.close(fd)
        info["write_fsync_s" if fsync else "write_nofsync_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(len(blobs)):
        with open(os.path.join(d, f"s{i}"), "rb") as f:
            f.read()
    info["read_files_s"] = time.perf_counter() - t0
    rmtree(d)
    del blobs

    # 1 GiB (64 MiB for the small workloads), best of 3
    a = np.ones((1 << 27) if workloads.SIZE == "full" else (1 << 23), dtype=np.float64)
    b = np.zeros_like(a)
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    info["memcpy_GBps"] = a.nbytes / best / 1e9
    info["memcpy_workload_s"] = nbytes / (a.nbytes / best)
    del a, b

    c2 = min(
        info["compress_2t_s"],
        info["zstd_ctx_compress_2t_s"],
        min(info["compress_1t_s"], info["zstd_ctx_compress_1t_s"]) / 2,
    )
    d2 = min(
        info["decompress_2t_s"],
        info["zstd_ctx_decompress_2t_s"],
        min(info["decompress_1t_s"], info["zstd_ctx_decompress_1t_s"]) / 2,
    )
    info.update(
        compress_best2core_s=c2,
        decompress_best2core_s=d2,
        write_limit_s=max(c2, info["write_nofsync_s"]),
        read_limit_s=max(d2, info["read_files_s"]),
    )
    info["wall_s"] = info["write_limit_s"]
    return info


# -- read cases --------------------------------------------------------------------------------


def prepare_read(wl: str) -> dict[str, Any]:
    """Write the store the read cases read, once, with xarray; checked by tensorstore."""
    import dask

    W = WORKLOADS[wl]
    path = read_store_path(wl)
    rmtree(path)
    ds = make_ds(wl, W["shard"])
    with dask.config.set(scheduler="threads"):
        ds.to_zarr(path, mode="w", zarr_format=3, encoding=xr_encoding(W))
    v = verify(wl, os.path.join(path, W["var"]), "ts")
    nb, nf = dir_bytes(path)
    out = dict(prepared=path, store_bytes=nb, files=nf, verify=v)
    print(json.dumps(out), flush=True)
    if not v["ok"]:
        raise RuntimeError(f"the read store does not match the source: {v}")
    return out


def _chunked_sum(src: np.ndarray) -> float:
    return sum(
        float(np.asarray(src[i : i + 64], dtype=np.float64).sum()) for i in range(0, len(src), 64)
    )


def case_read(wl: str, rep: int, *, how: str) -> dict[str, Any]:
    """A full read of the read store: xarray (default or shard chunks), dask sums, zarr-python,
    tensorstore."""
    import dask
    import zarr

    W = WORKLOADS[wl]
    path = read_store_path(wl)
    arr_path = os.path.join(path, W["var"])
    if not os.path.exists(arr_path):
        raise RuntimeError(f"read store missing: run `bench.py prepare-read {wl}` first")
    info: dict[str, Any] = dict(how=how)
    check: tuple[str, Any]
    if how in ("xr-default", "xr-shards", "xr-shards-dist"):
        import xarray as xr

        chunks = {} if how == "xr-default" else dict(zip(W["dims"], W["shard"], strict=True))
        cluster = client = None
        if how == "xr-shards-dist":
            cluster, client = start_cluster()
        ctx = dask.config.set(scheduler="threads") if client is None else dask.config.set({})
        try:
            with ctx, Meter() as m:
                v = xr.open_zarr(path, chunks=chunks, zarr_format=3)[W["var"]]
                info["n_dask_chunks"] = int(np.prod(v.data.numblocks))
                info["dask_chunksize"] = list(v.data.chunksize)
                if client is not None:
                    check = ("sum", float(v.sum().compute()))
                else:
                    check = ("array", v.values)
        finally:
            if client is not None:
                client.close()
                cluster.close()
    elif how in ("dask-sum", "dask-sum-inner"):
        import dask.array as da

        with dask.config.set(scheduler="threads"), Meter() as m:
            a = zarr.open_array(arr_path, mode="r")
            d = da.from_zarr(a, chunks=a.shards if how == "dask-sum" else a.chunks)
            info["n_dask_chunks"] = int(np.prod(d.numblocks))
            check = ("sum", float(d.sum(dtype="float64").compute()))
    elif how == "zarr":
        with Meter() as m:
            check = ("array", zarr.open_array(arr_path, mode="r")[...])
    elif how == "ts":
        import tensorstore as ts

        with Meter() as m:
            t = ts.open(ts_spec(arr_path), open=True, read=True).result()
            check = ("array", t.read().result())
    else:
        raise ValueError(how)
    info.update(m.result())
    src = load_src(wl)
    if check[0] == "array":
        info["read_ok"] = bool(np.array_equal(np.asarray(check[1]), src))
    else:
        ref = _chunked_sum(src)
        info["read_ok"] = bool(abs(ref - check[1]) <= 1e-6 * max(1.0, abs(ref)))
    return info


# -- the registry ------------------------------------------------------------------------------


def _case(fn: Callable[..., dict[str, Any]], **kw: Any) -> Callable[[str, int], dict[str, Any]]:
    def run(wl: str, rep: int) -> dict[str, Any]:
        return fn(wl, rep, **kw)

    return run


CASES: dict[str, tuple[Callable[[str, int], dict[str, Any]], str]] = {
    "g-limits": (_case(case_limits), "the machine's limits (compress/decompress, file IO, memcpy)"),
    # writes
    "a-xr-threads": (_case(case_xr), "xarray to_zarr, dask chunks = shards, threaded scheduler"),
    "b0-xr-inner-safe": (
        _case(case_xr, chunks="inner"),
        "dask chunks = inner chunks, default safe_chunks=True (records the error)",
    ),
    "b0-xr-mis-safe": (
        _case(case_xr, chunks="mis"),
        "sub-shard dask chunks, default safe_chunks=True (records the error)",
    ),
    "b1-xr-mis-unsafe-threads": (
        _case(case_xr, chunks="mis", safe_chunks=False),
        "sub-shard dask chunks, safe_chunks=False, threads",
    ),
    "b2-xr-mis-unsafe-dist": (
        _case(case_xr, chunks="mis", safe_chunks=False, scheduler="distributed"),
        "sub-shard dask chunks, safe_chunks=False, LocalCluster 2 procs",
    ),
    "b3-xr-mis-align-threads": (
        _case(case_xr, chunks="mis", align_chunks=True),
        "sub-shard dask chunks, align_chunks=True, threads",
    ),
    "b4-xr-inner-unsafe-threads": (
        _case(case_xr, chunks="inner", safe_chunks=False),
        "dask chunks = inner, safe_chunks=False, threads",
    ),
    "b5-xr-inner-unsafe-dist": (
        _case(case_xr, chunks="inner", safe_chunks=False, scheduler="distributed"),
        "dask chunks = inner, safe_chunks=False, LocalCluster",
    ),
    "c-xr-dist": (
        _case(case_xr, scheduler="distributed"),
        "xarray to_zarr, shard chunks, LocalCluster(2 procs x 1 thread)",
    ),
    "d1-zarr-full": (_case(case_zarr_write), "zarr-python arr[...] = numpy"),
    "d2-zarr-shardloop": (
        _case(case_zarr_write, mode="shards"),
        "zarr-python, sequential loop of per-shard writes",
    ),
    "f1-ts-full": (_case(case_ts_write), "tensorstore write (default file_io_sync=True)"),
    "f2-ts-full-nosync": (
        _case(case_ts_write, sync=False),
        "tensorstore write, file_io_sync=False",
    ),
    "f3-ts-shardloop-nosync": (
        _case(case_ts_write, mode="shards", sync=False),
        "tensorstore per-shard loop, file_io_sync=False",
    ),
    # reads (of the store prepare_read writes)
    "h-xr-default": (_case(case_read, how="xr-default"), "xr.open_zarr(default chunks).values"),
    "h-xr-shards": (_case(case_read, how="xr-shards"), "xr.open_zarr(chunks=shards).values"),
    "h-xr-shards-dist-sum": (
        _case(case_read, how="xr-shards-dist"),
        "xr.open_zarr(chunks=shards).sum() on LocalCluster",
    ),
    "h-dask-sum": (_case(case_read, how="dask-sum"), "da.from_zarr(chunks=shards).sum(), threads"),
    "h-dask-sum-inner": (
        _case(case_read, how="dask-sum-inner"),
        "da.from_zarr(default chunks = inner).sum(), threads",
    ),
    "h-zarr": (_case(case_read, how="zarr"), "zarr-python arr[...]"),
    "h-ts": (_case(case_read, how="ts"), "tensorstore read()"),
}
WRITE_CASES = [
    "g-limits",
    "a-xr-threads",
    "c-xr-dist",
    "d1-zarr-full",
    "d2-zarr-shardloop",
    "f1-ts-full",
    "f2-ts-full-nosync",
    "f3-ts-shardloop-nosync",
]
MIS_CASES = [
    "b0-xr-inner-safe",
    "b0-xr-mis-safe",
    "b1-xr-mis-unsafe-threads",
    "b2-xr-mis-unsafe-dist",
    "b3-xr-mis-align-threads",
]
# dask chunks = inner chunks with safe_chunks=False: feasible only for W1 (4096 tasks at full size)
MIS_CASES_EXTRA = {"W1": ["b4-xr-inner-unsafe-threads", "b5-xr-inner-unsafe-dist"]}
READ_CASES = [c for c in CASES if c.startswith("h-")]


def versions() -> dict[str, Any]:
    import importlib.metadata as md
    import platform
    import sys

    out: dict[str, Any] = {"python": sys.version.split()[0]}
    for p in (
        "zarr",
        "tensorstore",
        "xarray",
        "dask",
        "distributed",
        "numcodecs",
        "numpy",
        "crc32c",
        "psutil",
        "pandas",
    ):
        try:
            out[p] = md.version(p)
        except Exception:
            out[p] = None
    out["nproc"] = os.cpu_count()
    try:
        with open("/proc/meminfo") as f:
            out["memtotal"] = f.readline().split(":")[1].strip()
    except OSError:
        pass
    out["platform"] = platform.platform()
    return out


# -- report ------------------------------------------------------------------------------------


def _med(v: list[float]) -> float:
    return statistics.median(v) if v else float("nan")


def _ok(by: dict[tuple[str, str], list[dict]], wl: str, c: str) -> list[dict]:
    return [r for r in by.get((wl, c), []) if r.get("status") == "ok"]


def _check(ok: list[dict]) -> str:
    checks = []
    for r in ok:
        if "verify" in r:
            v = r["verify"]
            checks.append(
                "ok"
                if v["ok"]
                else f"CORRUPT {v['bad_inner_chunks']}/{v['total_inner_chunks']} chunks "
                f"({v['bad_chunks_all_fill']} all-fill)"
            )
        elif "read_ok" in r:
            checks.append("ok" if r["read_ok"] else "MISMATCH")
    return ", ".join(sorted(set(checks)))


def _limits_text(lim: list[dict], nbytes: int) -> str:
    L = {k: _med([r[k] for r in lim]) for k in lim[0] if isinstance(lim[0][k], int | float)}

    def mbs(k: str) -> str:
        return f"{L[k]:.2f} s ({nbytes / L[k] / 1e6:.0f} MB/s)" if k in L else "n/a"

    return (
        f"Limits (median of {len(lim)} runs): zstd-3 ratio on inner chunks "
        f"**{L['ratio']:.2f}**.\n\n"
        f"- compress, numcodecs: 1 thread {mbs('compress_1t_s')}, 2 threads "
        f"{mbs('compress_2t_s')}, one task per inner chunk {mbs('compress_2t_perchunk_s')}; "
        f"zstandard with a reused context: 1 thread {mbs('zstd_ctx_compress_1t_s')}, "
        f"2 threads {mbs('zstd_ctx_compress_2t_s')}\n"
        f"- decompress, numcodecs: 1t {mbs('decompress_1t_s')}, 2t {mbs('decompress_2t_s')}; "
        f"zstandard: 1t {mbs('zstd_ctx_decompress_1t_s')}, 2t {mbs('zstd_ctx_decompress_2t_s')}\n"
        f"- files: write {L['write_nofsync_s']:.2f} s (fsync {L['write_fsync_s']:.2f} s), read "
        f"{L['read_files_s']:.2f} s; memcpy {L['memcpy_GBps']:.1f} GB/s\n"
        f"- **write limit {L['write_limit_s']:.2f} s**, **read limit {L['read_limit_s']:.2f} s**\n"
    )


def report(recs: list[dict], order: list[str]) -> str:
    """Markdown tables per workload: every case in ``order`` with its median, spread, MB/s, CPU,
    memory, ratio to the limit and to the xarray reference, and its check."""
    by: dict[tuple[str, str], list[dict]] = {}
    for r in recs:
        by.setdefault((r["workload"], r["case"]), []).append(r)
    lines: list[str] = []
    for wl, W in WORKLOADS.items():
        if not any(k[0] == wl for k in by):
            continue
        nbytes = int(np.prod(W["shape"])) * np.dtype(W["dtype"]).itemsize
        lines.append(
            f"\n### {wl} ({W['name']}): {W['dtype']}{tuple(W['shape'])}, inner {W['inner']}, "
            f"shard {W['shard']}, {nbytes / 1e9:.2f} GB\n"
        )
        lim = _ok(by, wl, "g-limits")
        if lim:
            lines.append(_limits_text(lim, nbytes))
        limit = {
            k: _med([r[f"{k}_limit_s"] for r in lim]) if lim else float("nan")
            for k in ("write", "read")
        }
        ref = {
            "write": _med([r["wall_s"] for r in _ok(by, wl, "a-xr-threads")]),
            "read": _med([r["wall_s"] for r in _ok(by, wl, "h-xr-shards")]),
        }
        for kind in ("write", "read"):
            cases = [
                c
                for c in order
                if (wl, c) in by and c != "g-limits" and c.startswith("h-") == (kind == "read")
            ]
            if not cases:
                continue
            refname = "x a-xr-threads" if kind == "write" else "x h-xr-shards"
            lines += [
                f"\n{'Writes' if kind == 'write' else 'Full reads'}:\n",
                f"| case | n | median s | spread s | MB/s | CPU util | peak RSS MiB (Δanon) "
                f"| x {kind} limit | {refname} | check |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            for c in cases:
                rs, ok = by[(wl, c)], _ok(by, wl, c)
                if not ok:
                    msg = rs[0].get("error") or rs[0].get("exception") or rs[0].get("note") or ""
                    lines.append(
                        f"| {c} | {len(rs)} | {rs[0].get('status')} | | | | | | | {msg[:200]} |"
                    )
                    continue
                walls = [r["wall_s"] for r in ok]
                m = _med(walls)
                util = _med([r.get("cpu_s", float("nan")) / r["wall_s"] for r in ok])
                rss = _med([r.get("peak_rss_mib", float("nan")) for r in ok])
                dan = _med([r.get("delta_anon_mib", float("nan")) for r in ok])
                lines.append(
                    f"| {c} | {len(ok)} | {m:.2f} | {min(walls):.2f}-{max(walls):.2f} | "
                    f"{nbytes / m / 1e6:.0f} | {100 * util:.0f}% | {rss:.0f} ({dan:+.0f}) | "
                    f"{m / limit[kind]:.2f} | {m / ref[kind]:.2f} | {_check(ok)} |"
                )
    return "\n".join(lines)
