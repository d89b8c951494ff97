"""Generate the golden shard stores next to this file. Run by hand, never by the tests:

    .venv/bin/python tests/golden/make_golden.py

Each case is a small deterministic input written with fixed codecs. The stores (``zarr.json`` and
the shard objects) are committed; ``tests/integration/test_golden.py`` re-encodes the same input
and compares the shard bytes exactly, and reads every store with zarr-python, tensorstore and
shardwise.
Regenerating changes the frozen byte format: only do it on purpose, and say why.

Cases whose bytes depend on a compression library's version (zstd) are frozen for reading only
(``compare_bytes=False``): a newer libzstd may compress differently but must still decode them.
The ``zarr_python_*`` cases are written by zarr-python (which orders inner chunks along a Morton
curve) and are frozen for reading only as well. ``zstd_sizeless`` is written by shardwise, then
each inner chunk's zstd frame is made again without its content size, as other writers store
them (``zstandard.ZstdCompressor(write_content_size=False)``).

    .venv/bin/python tests/golden/make_golden.py zstd_sizeless nested_zstd   # only these cases
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from zarr.codecs import (
    BytesCodec,
    Crc32cCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)

HERE = Path(__file__).parent


@dataclass(frozen=True)
class GoldenCase:
    """How one golden store is made: the data, the creation keywords, who writes it."""

    data: Callable[[], np.ndarray]
    create: dict[str, Any]
    writer: Literal["shardwise", "zarr-python", "sizeless-zstd"] = "shardwise"
    # "shardwise": the array is created by write_array from ``create``; "zarr-python" creates it
    # (for index codecs only a sharding serializer can express) and shardwise writes into it
    created_by: Literal["shardwise", "zarr-python"] = "shardwise"
    dask_chunks: Any = None
    write_empty_chunks: bool = False
    compare_bytes: bool = True
    # tensorstore refuses some valid chains (bytes-to-bytes codecs after a nested sharding codec)
    tensorstore: bool = True
    note: str = field(default="", compare=False)


def _ramp(shape: tuple[int, ...], dtype: str, start: int = 1) -> np.ndarray:
    return (np.arange(start, start + int(np.prod(shape))) % 251).astype(dtype).reshape(shape)


def _index_end() -> np.ndarray:
    x = _ramp((10, 7), "i2")
    x[0:2, 0:3] = 0  # inner chunk (0, 0) of shard (0, 0): all fill, not stored
    x[4:8, 0:6] = 0  # shard (1, 0): all fill, no object
    x[9, 6] = -7  # the corner of the edge shard (2, 1)
    return x


def _index_start() -> np.ndarray:
    x = _ramp((13,), "u1")
    x[3:6] = 255  # fill
    return x


def _nan_payloads() -> np.ndarray:
    x = np.linspace(-1, 1, 48, dtype="f4").reshape(6, 8)
    x[0:3, 0:4] = np.nan  # the fill value exactly: not stored
    payload = np.array([0x7FC00123], dtype="u4").view("f4")[0]
    x[3:6, 4:8] = payload  # NaN with another payload: data, stored
    return x


def _transpose() -> np.ndarray:
    return _ramp((4, 5, 6), "u2") * 7


def _big_endian() -> np.ndarray:
    x = _ramp((9, 4), "i4") * -1000
    x[6:9, :] = 0
    return x


def _index_big_no_crc() -> np.ndarray:
    x = np.linspace(0, 1, 7, dtype="f8")
    x[2:4] = 0.0
    return x


def _empty_chunks() -> np.ndarray:
    x = np.zeros((8, 8), dtype="f4")
    x[0:2, 2:4] = -0.0  # bit-different from the fill 0.0: stored
    x[2:4, 0:2] = np.nan  # data: stored
    x[3, 3] = 5.0  # one element off the fill value: chunk (1, 1) stored
    # shard (0, 1) and shard (1, 1) stay all 0.0: no objects; shard (1, 0) holds one chunk
    x[6, 1] = 1.0
    return x


def _all_fill() -> np.ndarray:
    return np.zeros((6, 6), dtype="u2")


def _bools() -> np.ndarray:
    return (_ramp((5, 5), "i4") % 3 == 0) & (np.arange(5)[:, None] < 3)


def _nested() -> np.ndarray:
    x = _ramp((8, 8), "u1")
    x[0:2, 0:2] = 0  # an empty chunk inside a nested shard
    x[4:8, 4:8] = 0  # an empty nested shard
    return x


def _zstd() -> np.ndarray:
    return np.sin(np.arange(40, dtype="f8")).reshape(8, 5)


def _zarr_3d() -> np.ndarray:
    x = _ramp((5, 6, 4), "i4") - 100
    x[0:2, 0:2, 0:2] = 0
    return x


def _zstd_big_endian() -> np.ndarray:
    x = _ramp((12, 10), "i4") * -1001
    x[0:2, 0:5] = 0  # a fill chunk among stored ones in shard (0, 0)
    x[6:12, 5:10] = 0  # a whole shard of fill: no object
    x[8:10, 0:5] = 0  # and one in the edge of shard (1, 0)
    return x


def _nested_zstd() -> np.ndarray:
    x = _ramp((12, 8), "u2") * 3
    x[0:2, 0:2] = 0  # an empty chunk inside a nested shard
    x[6:12, 4:8] = 0  # an empty outer shard
    return x


def _large_chunks() -> np.ndarray:
    # 128 x 64 float64 chunks: 64 KiB raw each, compressed one call each; 1 MiB shards
    x = ((np.arange(512 * 512) // 100 % 13) * 0.25 - 1).reshape(512, 512)
    x[0:128, 0:64] = 0  # one fill chunk
    return x


def _sizeless() -> np.ndarray:
    x = np.cos(np.arange(24 * 20, dtype="f4") / 7.0).reshape(24, 20)
    x[0:4, 0:5] = 0  # fill chunks are not stored (no frame to rewrite)
    return x


def _batches() -> np.ndarray:
    # 1-D: 150 chunks of 8 float64 per shard (64 bytes each, decoded many to one call), every
    # seventh chunk fill, a last shard of 3 chunks and a partial one
    x = (np.arange(8 * 150 * 2 + 8 * 3 + 5, dtype="f8") % 113) + 0.5
    for i in range(0, len(x) // 8, 7):
        x[i * 8 : i * 8 + 8] = 0
    return x


CASES: dict[str, GoldenCase] = {
    "index_end": GoldenCase(
        _index_end,
        dict(chunks=(2, 3), shards=(4, 6), compressors=None, fill_value=0),
        dask_chunks=(3, 5),
        note="index at the end (bytes + crc32c), all-fill chunk and shard, edge shards",
    ),
    "index_start": GoldenCase(
        _index_start,
        dict(
            chunks=(3,),
            shards={"shape": (6,), "index_location": "start"},
            compressors=None,
            fill_value=255,
        ),
        note="index at the start",
    ),
    "crc32c_inner_nan": GoldenCase(
        _nan_payloads,
        dict(chunks=(3, 4), shards=(6, 8), compressors=[Crc32cCodec()], fill_value=float("nan")),
        note="crc32c on every inner chunk; NaN fill, a NaN with another payload is data",
    ),
    "transpose": GoldenCase(
        _transpose,
        dict(
            chunks=(2, 5, 3),
            shards=(4, 5, 6),
            filters=[TransposeCodec(order=(2, 0, 1))],
            compressors=None,
        ),
        dask_chunks=(1, 2, 4),
        note="transpose codec on the inner chunks",
    ),
    "big_endian": GoldenCase(
        _big_endian,
        dict(chunks=(3, 2), shards=(6, 4), serializer=BytesCodec(endian="big"), compressors=None),
        note="big-endian inner chunks",
    ),
    "index_big_endian_no_crc": GoldenCase(
        _index_big_no_crc,
        dict(
            chunks=(4,),
            serializer=ShardingCodec(
                chunk_shape=(2,),
                codecs=[BytesCodec(endian="little")],
                index_codecs=[BytesCodec(endian="big")],
                index_location="start",
            ),
            compressors=None,
        ),
        created_by="zarr-python",
        note="big-endian index without crc32c, at the start",
    ),
    "empty_chunks": GoldenCase(
        _empty_chunks,
        dict(chunks=(2, 2), shards=(4, 4), compressors=None, fill_value=0.0),
        note="fill 0.0: all-fill chunks and shards not stored; -0.0 and NaN are data",
    ),
    "write_empty_chunks": GoldenCase(
        _all_fill,
        dict(chunks=(2, 2), shards=(4, 4), compressors=None),
        write_empty_chunks=True,
        note="write_empty_chunks=True: every inner chunk inside the array stored",
    ),
    "bool": GoldenCase(
        _bools,
        dict(chunks=(2, 2), shards=(4, 4), compressors=None, fill_value=False),
        note="bool, one byte per element",
    ),
    "nested": GoldenCase(
        _nested,
        dict(
            chunks=(4, 4),
            shards=(8, 8),
            serializer=ShardingCodec(chunk_shape=(2, 2)),
            compressors=None,
        ),
        note="nested sharding written by shardwise",
    ),
    "zstd": GoldenCase(
        _zstd,
        dict(chunks=(2, 5), shards=(4, 5), compressors=[ZstdCodec(level=3, checksum=True)]),
        compare_bytes=False,
        note="zstd with checksum; bytes depend on libzstd, frozen for reading",
    ),
    "zarr_python_3d": GoldenCase(
        _zarr_3d,
        dict(
            chunks=(2, 2, 2),
            shards={"shape": (4, 4, 4), "index_location": "start"},
            compressors=[Crc32cCodec()],
        ),
        writer="zarr-python",
        compare_bytes=False,
        note="written by zarr-python 3.4 (Morton order of inner chunks)",
    ),
    "zstd_big_endian": GoldenCase(
        _zstd_big_endian,
        dict(
            chunks=(2, 5),
            shards=(6, 5),
            serializer=BytesCodec(endian="big"),
            compressors=[ZstdCodec(level=3)],
        ),
        compare_bytes=False,
        note="big-endian int32 in small zstd chunks (decoded in batches), fill chunks mixed in",
    ),
    "nested_zstd": GoldenCase(
        _nested_zstd,
        dict(
            chunks=(6, 4),
            shards=(6, 8),
            serializer=ShardingCodec(chunk_shape=(2, 2)),
            compressors=[ZstdCodec(level=3, checksum=True)],
        ),
        compare_bytes=False,
        tensorstore=False,
        note="nested sharding then zstd (tensorstore refuses bytes codecs after a nested one)",
    ),
    "zstd_crc32c_large": GoldenCase(
        _large_chunks,
        dict(chunks=(128, 64), shards=(512, 256), compressors=[ZstdCodec(level=3), Crc32cCodec()]),
        compare_bytes=False,
        note="zstd then crc32c on 64 KiB chunks in 1 MiB shards: every chunk keeps its checksum",
    ),
    "zstd_sizeless": GoldenCase(
        _sizeless,
        dict(chunks=(4, 5), shards=(12, 10), compressors=[ZstdCodec(level=3)]),
        writer="sizeless-zstd",
        compare_bytes=False,
        note="zstd frames without their content size, as other writers store them",
    ),
    "zstd_batches": GoldenCase(
        _batches,
        dict(chunks=(8,), shards=(8 * 150,), compressors=[ZstdCodec(level=3), Crc32cCodec()]),
        compare_bytes=False,
        note="150 small zstd+crc32c chunks a shard, fill chunks mixed in, a partial last shard",
    ),
}


def write_case(case: GoldenCase, root: Path) -> None:
    """Write ``case`` into the directory ``root`` (which must not exist)."""
    import dask.array as da
    import zarr

    import shardwise

    data = case.data()
    if case.writer == "zarr-python":
        z = zarr.create_array(str(root), shape=data.shape, dtype=data.dtype, **case.create)
        z[...] = data
        return
    source = da.from_array(data, chunks=case.dask_chunks or data.shape)
    if case.created_by == "zarr-python":
        zarr.create_array(str(root), shape=data.shape, dtype=data.dtype, **case.create)
        shardwise.write_array(
            source, str(root), mode="r+", write_empty_chunks=case.write_empty_chunks
        )
        return
    shardwise.write_array(
        source, str(root), write_empty_chunks=case.write_empty_chunks, **case.create
    )
    if case.writer == "sizeless-zstd":
        _without_content_sizes(root)


def _without_content_sizes(root: Path) -> None:
    """Every stored inner chunk's zstd frame compressed again without its content size (an
    index at the end with its crc32c, as shardwise writes it), the index rebuilt."""
    import crc32c
    import zstandard

    sizeless = zstandard.ZstdCompressor(level=3, write_content_size=False)
    for key in stored_objects(root):
        path = root / key
        blob = path.read_bytes()
        n = _index_entries(root)
        index = np.frombuffer(blob[-(16 * n + 4) : -4], dtype="<u8").reshape(n, 2)
        body, entries = b"", []
        for offset, nbytes in index.tolist():
            if offset == 2**64 - 1:
                entries.append((offset, nbytes))
                continue
            frame = sizeless.compress(
                zstandard.ZstdDecompressor().decompress(blob[offset : offset + nbytes])
            )
            entries.append((len(body), len(frame)))
            body += frame
        raw = b"".join(o.to_bytes(8, "little") + k.to_bytes(8, "little") for o, k in entries)
        path.write_bytes(body + raw + crc32c.crc32c(raw).to_bytes(4, "little"))


def _index_entries(root: Path) -> int:
    """The inner chunks of one shard of the array at ``root``, from its zarr.json."""
    import json

    doc = json.loads((root / "zarr.json").read_text())
    sharding = doc["codecs"][0]["configuration"]
    shard = doc["chunk_grid"]["configuration"]["chunk_shape"]
    return int(np.prod([s // c for s, c in zip(shard, sharding["chunk_shape"], strict=True)]))


def stored_objects(root: Path) -> dict[str, bytes]:
    """The shard objects of a store (metadata and hidden bookkeeping left out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and p.name != "zarr.json" and not any(x.startswith(".") for x in rel.parts):
            out[rel.as_posix()] = p.read_bytes()
    return out


def main(names: list[str]) -> None:
    for name, case in CASES.items():
        if names and name not in names:
            continue
        root = HERE / name
        if root.exists():
            shutil.rmtree(root)
        write_case(case, root)
        for hidden in [p for p in root.iterdir() if p.name.startswith(".")]:
            shutil.rmtree(hidden) if hidden.is_dir() else hidden.unlink()
        objects = stored_objects(root)
        print(f"{name:26} {len(objects):2} objects {sum(map(len, objects.values())):6} bytes")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
