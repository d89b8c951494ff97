#!/usr/bin/env python
"""Every copy a numpy ``write_array`` makes of the data, counted: a profile, not a timing.

``write_array(x, ...)`` of a W1 and a W3 source (``benchmarks/workloads.py``'s geometry and data;
``--full`` for the published sizes, small by default) with each place that copies data wrapped
to count its bytes (in this script only: the package is not changed), and Python's view of the
memory the write allocates (``tracemalloc``, which sees numpy's buffers and bytes objects, not
zstd's own allocations). Printed as bytes and as multiples of the source's bytes:

* ``gather``      the source's inner chunks copied into the encoder's input: one reused buffer
                  per encoding thread holding a unit of chunks (``ChunkCodec.stack``); a view,
                  not a copy, where a chunk is a contiguous run of the source;
* ``edge pad``    the units at the array's edge grown to whole chunks with the fill value;
* ``unit join``   the compressed frames of a unit of small chunks joined into one part
                  (python-zstandard's collection of frames is not one buffer we can write);
* ``arena``       a large chunk's compressed frame copied out of zstd's bound-sized bytes into
                  the shard task's reused arena (``codec/frames.py``);
* ``shard join``  a shard of many small parts joined into one buffer before its put
                  (``engine/write.py:_parts``); a shard of large parts is written from its parts;
* ``stored``      the bytes the store writes (the kernel's copy, from the parts by ``writev``).

Also: whether the process imported dask (it should not), and the tracemalloc peak over the write
as a multiple of the source's bytes.

Usage::

    python benchmarks/numpy_copies.py [--full] [--workloads W1,W3] [--dir D]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import tracemalloc
from collections import Counter
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE), "src"), HERE]

import workloads  # noqa: E402

COPIES = ("gather", "edge pad", "unit join", "arena", "shard join", "stored")
counted: Counter[str] = Counter()
_lock = threading.Lock()


def count(site: str, nbytes: int) -> None:
    with _lock:
        counted[site] += int(nbytes)


class _CountingNumpy:
    """``np`` as ``codec/shard.py`` sees it, with ``np.full`` (the edge padding) counted."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def full(*args: Any, **kwargs: Any) -> np.ndarray:
        out = np.full(*args, **kwargs)
        if isinstance(args[0], tuple):  # a unit's block (not a unit's sizes, a 1-d int count)
            count("edge pad", out.nbytes)
        return out


def instrument() -> None:
    """Wrap each copy site of the write path with a counter."""
    from shardwise.codec import chunks, frames, shard
    from shardwise.engine import write
    from shardwise.runtime.units import SMALL_CHUNK
    from shardwise.storage import store

    codec = chunks.ChunkCodec
    stack, encode_run, keep = codec.stack, codec.encode_run, frames.FrameArena.keep
    parts_of, put = write._parts, store.ShardStore.put

    def counted_stack(self: Any, block: np.ndarray, grid: Any, out: Any = None) -> np.ndarray:
        got = stack(self, block, grid, out)
        if not self.stack_is_view(block, grid):
            count("gather", got.nbytes)
        return got

    def counted_run(self: Any, stack_: np.ndarray, rows: np.ndarray, *a: Any, **k: Any) -> Any:
        sizes, parts = encode_run(self, stack_, rows, *a, **k)
        batched = (
            len(self.bytes_codecs) == 1
            and self._zstd_first is not None
            and len(rows) >= 2
            and self.raw_nbytes < SMALL_CHUNK
        )
        if batched and len(parts) == 1:
            count("unit join", len(parts[0]))
        return sizes, parts

    def counted_keep(self: Any, frame: Any, raw_nbytes: int) -> Any:
        got = keep(self, frame, raw_nbytes)
        if got is not frame:
            count("arena", len(frame))
        return got

    def counted_parts(enc: Any) -> list[Any]:
        got = parts_of(enc)
        if len(got) == 1 and len(enc.parts) > 1:
            count("shard join", enc.nbytes)
        return got

    def counted_put(self: Any, name: str, data: Any) -> None:
        if name.startswith("c/"):  # a shard (not the metadata, the journal or a lease)
            one = isinstance(data, bytes | bytearray | memoryview)
            count("stored", sum(memoryview(p).nbytes for p in ([data] if one else data)))
        put(self, name, data)

    codec.stack = counted_stack  # type: ignore[method-assign]
    codec.encode_run = counted_run  # type: ignore[method-assign]
    frames.FrameArena.keep = counted_keep  # type: ignore[method-assign]
    write._parts = counted_parts
    store.ShardStore.put = counted_put  # type: ignore[method-assign]
    shard.np = _CountingNumpy()  # type: ignore[assignment]


def profile(wl: str, root: str) -> None:
    from zarr.codecs import ZstdCodec

    import shardwise

    W = workloads.WORKLOADS[wl]
    x = np.ascontiguousarray(workloads.load_src(wl, mmap=False))
    path = os.path.join(root, f"{workloads.tag(wl)}.zarr")
    counted.clear()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    report = shardwise.write_array(
        x,
        path,
        chunks=tuple(W["inner"]),
        shards=tuple(W["shard"]),
        compressors=ZstdCodec(level=workloads.ZSTD_LEVEL),
        fill_value=0,
        mode="w",
    )
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert np.array_equal(shardwise.read_array(path), x)
    shutil.rmtree(path)
    print(
        f"\n{wl} {x.dtype} {x.shape}, inner {W['inner']}, shards {W['shard']}: "
        f"{x.nbytes / 2**20:.1f} MiB, {report.shards_written} shards"
    )
    print(f"  {'copy':<11} {'MiB':>9} {'x source':>9}")
    for site in COPIES:
        print(f"  {site:<11} {counted[site] / 2**20:>9.2f} {counted[site] / x.nbytes:>9.3f}")
    print(f"  tracemalloc peak over the write: {peak / 2**20:.1f} MiB, {peak / x.nbytes:.3f}x")
    print(f"  dask imported: {'dask' in sys.modules}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--full", action="store_true", help="the published sizes (default: small)")
    p.add_argument("--workloads", default="W1,W3")
    p.add_argument("--dir", default="/tmp/bench-copies")
    args = p.parse_args()
    workloads.set_size("full" if args.full else "small")
    instrument()
    os.makedirs(args.dir, exist_ok=True)
    try:
        for wl in args.workloads.split(","):
            profile(wl, args.dir)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
