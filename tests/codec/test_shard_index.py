"""ShardIndex, the validated index of one shard: bytes -> index -> the same bytes, corrupt
indexes refused with CorruptShardError naming the key; and the inner chunk chain (chunks.py)
imports nothing from the shard side."""

from __future__ import annotations

import ast
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardwise import CorruptShardError
from shardwise.codec.chunks import ChunkCodec
from shardwise.codec.codecs import crc32c
from shardwise.codec.shard import MISSING, ShardCodec, ShardIndex
from strategies import examples

KEY = "grp/arr/c/0"
SRC = Path(__file__).resolve().parents[2] / "src" / "shardwise"


def codec_for(
    n: int, location: str = "end", endian: str = "little", crc: bool = True
) -> ShardCodec:
    inner = ChunkCodec(chunk_shape=(1,), dtype=np.dtype("u1"), fill_value=0)
    return ShardCodec((n,), inner, location, endian, crc)  # type: ignore[arg-type]


def stored_form(codec: ShardCodec, pairs: list[tuple[int, int]]) -> bytes:
    """The index bytes as the format defines them, written out by hand."""
    fmt = "<QQ" if codec.index_endian == "little" else ">QQ"
    raw = b"".join(struct.pack(fmt, o, n) for o, n in pairs)
    return raw + (crc32c(raw).to_bytes(4, "little") if codec.index_crc else b"")


@st.composite
def layouts(draw: st.DrawFn) -> tuple[ShardCodec, list[tuple[int, int]], int]:
    """A codec, its index entries (some empty) over a data region laid out in chunk order, and
    the size of the whole stored shard."""
    n = draw(st.integers(1, 40))
    codec = codec_for(
        n,
        draw(st.sampled_from(["start", "end"])),
        draw(st.sampled_from(["little", "big"])),
        draw(st.booleans()),
    )
    sizes = draw(st.lists(st.none() | st.integers(0, 300), min_size=n, max_size=n))
    pos = codec.index_nbytes if codec.index_location == "start" else 0
    pairs = []
    for s in sizes:
        if s is None:
            pairs.append((int(MISSING), int(MISSING)))
        else:
            pairs.append((pos, s))
            pos += s
    size = pos + (codec.index_nbytes if codec.index_location == "end" else 0)
    return codec, pairs, size


@examples(100)
@given(layout=layouts())
def test_from_bytes_and_back(layout: tuple[ShardCodec, list[tuple[int, int]], int]) -> None:
    codec, pairs, size = layout
    raw = stored_form(codec, pairs)
    assert len(raw) == codec.index_nbytes
    index = ShardIndex.from_bytes(codec, raw, size, KEY)
    assert index.to_bytes(codec) == raw
    assert index.key == KEY and len(index) == len(pairs)
    stored = [o != int(MISSING) for o, _ in pairs]
    assert index.stored.tolist() == stored
    assert [index.is_empty(i) for i in range(len(pairs))] == [not s for s in stored]
    assert index.offsets.tolist() == [o for o, _ in pairs]
    assert index.lengths.tolist() == [n for _, n in pairs]
    assert index.nbytes_total == sum(n for (_, n), s in zip(pairs, stored, strict=True) if s)
    picked = [i for i in range(len(pairs)) if i % 3 == 0]
    assert index.ranges(picked).tolist() == [list(pairs[i]) for i in picked]
    # the same index built from its stored entries encodes to the same bytes
    ids = [i for i, s in enumerate(stored) if s]
    built = ShardIndex.build(
        len(pairs), ids, [pairs[i][0] for i in ids], [pairs[i][1] for i in ids]
    )
    assert built == index and built.to_bytes(codec) == raw
    # a whole shard in memory: the index found at its start or end
    data = np.zeros(size, np.uint8).tobytes()
    at = 0 if codec.index_location == "start" else size - len(raw)
    shard = data[:at] + raw + data[at + len(raw) :]
    assert ShardIndex.of_shard(codec, shard, KEY) == index


def test_empty_index_and_frozen() -> None:
    codec = codec_for(3)
    index = ShardIndex.empty(3)
    assert index.to_bytes(codec) == stored_form(codec, [(int(MISSING), int(MISSING))] * 3)
    assert index.nbytes_total == 0 and not index.stored.any()
    with pytest.raises(ValueError):
        index.entries[0, 0] = 0  # read-only: a value, not a buffer
    with pytest.raises(AttributeError):
        index.key = "other"  # type: ignore[misc]


def corrupt(codec: ShardCodec, raw: bytes, size: int) -> CorruptShardError:
    with pytest.raises(CorruptShardError) as got:
        ShardIndex.from_bytes(codec, raw, size, KEY)
    assert got.value.key == KEY
    return got.value


@pytest.mark.parametrize("location", ["start", "end"])
@pytest.mark.parametrize("crc", [True, False])
def test_corrupt_indexes(location: str, crc: bool) -> None:
    codec = codec_for(3, location, crc=crc)
    base = codec.index_nbytes if location == "start" else 0
    pairs = [(base, 10), (int(MISSING), int(MISSING)), (base + 10, 5)]
    size = 15 + codec.index_nbytes
    raw = stored_form(codec, pairs)
    ShardIndex.from_bytes(codec, raw, size, KEY)  # the intact index is valid
    # wrong length, object smaller than its index
    assert "expected" in corrupt(codec, raw[:-1], size).problem
    assert "smaller than" in corrupt(codec, raw, codec.index_nbytes - 1).problem
    # an offset or a range past the end of the data region
    e = corrupt(codec, stored_form(codec, [pairs[0], pairs[1], (base + 10, 6)]), size)
    assert e.chunk == (2,) and "outside the data region" in e.problem
    e = corrupt(codec, stored_form(codec, [(base + 16, 0), *pairs[1:]]), size)
    assert e.chunk == (0,)
    # an offset inside the index itself
    if location == "start":
        assert corrupt(codec, stored_form(codec, [(0, 10), *pairs[1:]]), size).chunk == (0,)
    # one field empty, the other not
    e = corrupt(codec, stored_form(codec, [pairs[0], (int(MISSING), 0), pairs[2]]), size)
    assert e.chunk == (1,) and "empty marker" in e.problem
    if crc:
        bad = bytearray(raw)
        bad[3] ^= 1
        assert "checksum mismatch" in corrupt(codec, bytes(bad), size).problem


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (anywhere: top level, functions, TYPE_CHECKING blocks)."""
    package = ["shardwise", *path.relative_to(SRC).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(parts + ([node.module] if node.module else []))
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # x may be a module
    return found


def _file(mod: str) -> Path:
    return SRC / (mod.removeprefix("shardwise.").replace(".", "/") + ".py")


def test_chunk_chain_imports_nothing_of_the_shard_side() -> None:
    """chunks.py and every shardwise module it imports (transitively) import no shard module."""
    seen, todo = set(), ["shardwise.codec.chunks"]
    while todo:
        mod = todo.pop()
        if mod in seen or not _file(mod).exists():
            continue
        seen.add(mod)
        todo += [m for m in _imports(_file(mod)) if m.startswith("shardwise.")]
    assert "shardwise.codec.shard" not in seen, seen
    assert "shardwise.codec.metadata" not in seen, seen
    # the check sees imports hidden in functions: shard.py's own import of chunks is found
    assert "shardwise.codec.chunks" in _imports(SRC / "codec" / "shard.py")
