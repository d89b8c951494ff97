"""Committed golden shard stores freeze the byte format (see ``tests/golden/make_golden.py``).

* shardwise re-encodes each case's deterministic input: the shard objects must equal the committed
  bytes exactly (cases whose bytes depend on a compression library's version are read-only);
* zarr-python, tensorstore and shardwise read every committed store: bit-exact the input;
* one case is also spelled out byte by byte from the spec, so the goldens are not only
  shardwise agreeing with itself; the frames of ``zstd_sizeless`` state no content size, and every
  chunk of ``zstd_crc32c_large`` ends in the crc32c of its zstd frame.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest
import zarr

import shardwise
from golden.make_golden import CASES, HERE, stored_objects, write_case
from oracles import assert_bit_equal

NESTED_WARNING = "ignore:Combining a `sharding_indexed` codec:UserWarning"
METADATA_FIELDS = ("shape", "data_type", "chunk_grid", "chunk_key_encoding", "fill_value", "codecs")
MISSING = 2**64 - 1

REENCODED = [name for name, case in CASES.items() if case.compare_bytes]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _metadata(root: Path) -> dict[str, Any]:
    doc = json.loads((root / "zarr.json").read_text())
    return {k: doc.get(k) for k in METADATA_FIELDS}


def test_every_case_has_a_committed_store() -> None:
    for name in CASES:
        root = HERE / name
        assert (root / "zarr.json").is_file(), f"golden store {name} is missing"
        assert stored_objects(root), f"golden store {name} holds no shard"


@pytest.mark.filterwarnings(NESTED_WARNING)
@pytest.mark.parametrize("name", REENCODED)
def test_reencoding_reproduces_the_golden_bytes(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    root = tmp_path / name
    write_case(case, root)
    golden = HERE / name
    assert _metadata(root) == _metadata(golden)
    got, want = stored_objects(root), stored_objects(golden)
    assert sorted(got) == sorted(want), "another set of shard objects"
    for key in want:
        assert got[key] == want[key], f"{name}/{key}: bytes differ from the golden file"


@pytest.mark.filterwarnings(NESTED_WARNING)
@pytest.mark.parametrize("name", list(CASES))
def test_golden_stores_read_back_by_all_readers(
    name: str, read_zarr: Any, read_tensorstore: Any
) -> None:
    case = CASES[name]
    root = HERE / name
    before = _snapshot(root)
    want = case.data()
    assert_bit_equal(read_zarr(str(root)), want, f"{name}: zarr-python")
    if case.tensorstore:
        assert_bit_equal(read_tensorstore(root), want, f"{name}: tensorstore")
    assert_bit_equal(shardwise.open_array(str(root)).compute(), want, f"{name}: shardwise")
    # a part of the array, through the range-read path
    sel = tuple(slice(n // 3, n - n // 4) for n in want.shape)
    got = shardwise.open_array(str(root), chunks=tuple(max(1, n // 2) for n in want.shape))
    assert_bit_equal(got[sel].compute(), want[sel], f"{name}: shardwise, part")
    assert _snapshot(root) == before, "reading changed the golden store"


def test_index_start_golden_spelled_out_from_the_spec() -> None:
    """index_start: uint8 [1..13] with 3:6 = 255 (the fill value), chunks 3, shards 6."""
    root = HERE / "index_start"
    meta = zarr.open_array(str(root), mode="r").metadata
    assert meta.fill_value == 255

    def shard(chunks: list[bytes | None]) -> bytes:
        index_size = 16 * len(chunks) + 4
        entries, body, offset = [], b"", index_size
        for c in chunks:
            if c is None:
                entries.append((MISSING, MISSING))
            else:
                entries.append((offset, len(c)))
                body += c
                offset += len(c)
        index = b"".join(struct.pack("<QQ", o, n) for o, n in entries)
        return index + struct.pack("<I", crc32c.crc32c(index)) + body

    want = {
        "c/0": shard([bytes([1, 2, 3]), None]),
        "c/1": shard([bytes([7, 8, 9]), bytes([10, 11, 12])]),
        "c/2": shard([bytes([13]) + b"\xff\xff", None]),  # edge chunk padded with the fill
    }
    assert stored_objects(root) == want


def test_index_end_golden_entries() -> None:
    """index_end: the all-fill chunk is a missing entry, the edge shard has two of four chunks."""
    root = HERE / "index_end"
    blob = (root / "c" / "0" / "0").read_bytes()
    index = blob[-(4 * 16 + 4) :]
    assert struct.unpack("<I", index[-4:])[0] == crc32c.crc32c(index[:-4])
    entries = np.frombuffer(index[:-4], dtype="<u8").reshape(2, 2, 2)
    assert entries[0, 0].tolist() == [MISSING, MISSING]  # rows 0:2, cols 0:3 are all fill
    offsets = entries[..., 0][entries[..., 0] != MISSING]
    assert offsets.tolist() == sorted(offsets.tolist()) and offsets[0] == 0
    assert not (root / "c" / "1" / "0").exists()  # an all-fill shard has no object
    edge = (root / "c" / "2" / "1").read_bytes()
    edge_entries = np.frombuffer(edge[-68:-4], dtype="<u8").reshape(2, 2, 2)
    # rows 8..9 and column 6 only: chunk (0, 0) in the array, the rest past its end
    stored = (edge_entries[..., 0] != MISSING).tolist()
    assert stored == [[True, False], [False, False]]


def _stored_chunks(root: Path, name: str) -> list[bytes]:
    """The stored inner chunks of every shard object of golden store ``name``."""
    import math

    doc = json.loads((root / "zarr.json").read_text())
    inner = doc["codecs"][0]["configuration"]["chunk_shape"]
    shard = doc["chunk_grid"]["configuration"]["chunk_shape"]
    n = math.prod(s // c for s, c in zip(shard, inner, strict=True))
    out = []
    for blob in stored_objects(root).values():
        index = np.frombuffer(blob[-(16 * n + 4) : -4], dtype="<u8").reshape(n, 2)
        out += [blob[o : o + k] for o, k in index.tolist() if o != MISSING]
    assert out, f"{name} stores no chunk"
    return out


def test_sizeless_golden_frames_state_no_content_size() -> None:
    import zstandard

    for frame in _stored_chunks(HERE / "zstd_sizeless", "zstd_sizeless"):
        assert zstandard.frame_content_size(frame) == -1


def test_large_zstd_crc32c_golden_chunks_keep_their_checksums() -> None:
    import zstandard

    chunks = _stored_chunks(HERE / "zstd_crc32c_large", "zstd_crc32c_large")
    assert len(chunks) == 2 * 16 - 1  # two shards of 16 chunks, one left as the fill
    for blob in chunks:
        frame, crc = blob[:-4], blob[-4:]
        assert int.from_bytes(crc, "little") == crc32c.crc32c(frame)
        assert zstandard.frame_content_size(frame) == 128 * 64 * 8


@pytest.mark.filterwarnings(NESTED_WARNING)
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c.compare_bytes])
def test_read_only_goldens_rewritten_by_shardwise_read_the_same(
    name: str, tmp_path: Path, read_zarr: Any
) -> None:
    """Cases frozen for reading: shardwise writes the same input again (with this libzstd), and
    zarr-python and shardwise read it as the golden's values."""
    case = CASES[name]
    if case.writer != "shardwise":
        return  # written by another tool or rewritten after: their bytes are the golden's
    root = tmp_path / name
    write_case(case, root)
    want = case.data()
    assert _metadata(root) == _metadata(HERE / name)
    assert_bit_equal(read_zarr(str(root)), want, f"{name}: zarr-python")
    assert_bit_equal(shardwise.read_array(str(root)), want, f"{name}: shardwise")
