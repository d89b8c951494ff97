"""The journal's parts that the write, resume and verify tests pass through without pinning them
(survivors of the mutation lane, `mutation/run.py durability/journal`): the bytes of a record and
the name of a write marker (what a later version must still find), the checksums of a record of an
object stored in parts, what ``matches`` refuses, which temp files a clean-up removes, and what
``clear_array`` keeps. Each test names the mutants it kills. Real stores: local files and zarr's
MemoryStore.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from pathlib import Path

import crc32c as crc
import numpy as np
import pytest
from zarr.storage import LocalStore, MemoryStore

import shardwise
from shardwise.durability.journal import (
    LEASE,
    RECORDS,
    WRITES,
    Journal,
    Record,
    WriteMarker,
    appends_of,
    clear_array,
    marker_name,
    now,
    object_crc32c,
    read_marker,
    read_markers,
    remove_run_temps,
    remove_temp_files,
)
from shardwise.durability.records import read_records
from shardwise.storage.store import ShardStore

HEX_A = "ab" + "0" * 30  # the hex part of one writer's temp files (its tag: "ab")
HEX_B = "cd" + "1" * 30  # another writer's


@pytest.fixture(params=["local", "memory"])
def st(request: pytest.FixtureRequest, tmp_path: Path) -> ShardStore:
    if request.param == "local":
        return ShardStore(LocalStore(tmp_path / "a.zarr"), "arr")
    return ShardStore(MemoryStore(), "arr")


def local(tmp_path: Path) -> ShardStore:
    return ShardStore(LocalStore(tmp_path / "a.zarr"), "arr")


# -- the stored form: what another version of shardwise reads back ---------------------------------


def test_records_and_markers_are_compact_sorted_json_and_markers_are_named_by_region() -> None:
    """Kills `_json` without `separators` or with another one, and `region_list` / `marker_name`
    on the wrong input: a resume looks a write's marker up by a digest of these very bytes, so
    a changed form orphans the markers an earlier run left (and doubles every record's size)."""
    assert Record("w", 2, 3, 4).to_bytes() == b'{"crc32c":3,"index_crc32c":4,"size":2,"write":"w"}'
    m = WriteMarker("w", [[0, 4]], [8], "open", "t0")
    assert m.to_bytes() == (
        b'{"finished":null,"id":"w","region":[[0,4]],"shape":[8],"started":"t0","status":"open"}'
    )
    region = (slice(0, 4), slice(2, 6))
    digest = hashlib.sha1(b"[[0,4],[2,6]]").hexdigest()[:16]
    assert marker_name(region) == f"{WRITES}{digest}.json"


def test_now_is_utc_to_the_millisecond() -> None:
    """Kills `now()` without UTC or at another precision: markers' times are compared and shown
    across machines."""
    t = now()
    assert t.endswith("+00:00") and len(t.split("T")[1]) == len("12:34:56.789+00:00")


# -- records of objects stored in parts ------------------------------------------------------------

WHOLE = bytes(range(256)) * 3 + b"index-bytes!"  # 780 bytes; the last 12 are "the index"


@pytest.mark.parametrize("cuts", [(), (1,), (100, 770), (772,), (0, 5, 5, 779)])
@pytest.mark.parametrize("at_end", [True, False])
def test_a_record_checksums_the_whole_object_whatever_its_parts(
    cuts: tuple[int, ...], at_end: bool
) -> None:
    """Kills mutants of `Record.of` and `_span` (a crc seeded with 1, the index read past the end,
    a span restarted at each part, an empty span taken for a byte): the record of an object
    written as parts (an index and chunks, split anywhere, the index across part boundaries) must
    be that of the object as stored, or verify and resume call a good shard corrupt."""
    bounds = [0, *cuts, len(WHOLE)]
    parts = [WHOLE[a:b] for a, b in itertools.pairwise(bounds)]
    index = WHOLE[-12:] if at_end else WHOLE[:12]
    want = Record("w1", len(WHOLE), crc.crc32c(WHOLE), crc.crc32c(index))
    assert Record.of("w1", parts, 12, at_end) == want
    # numpy parts whose items are wider than a byte count in bytes
    arrays = [np.frombuffer(WHOLE[:768], "<u4"), np.frombuffer(WHOLE[768:], "u1")]
    assert Record.of("w1", arrays, 12, at_end) == want


def test_a_record_reads_back_each_field_and_a_damaged_one_reads_as_none() -> None:
    """Kills `Record.from_bytes` reading the wrong key or dropping a field: each field differs,
    so a swap shows; damage (not JSON, a key missing, a value of the wrong type) is None, not an
    exception, so verify reports the record instead of crashing."""
    rec = Record("w9", 1234, 567, 89)
    assert Record.from_bytes(rec.to_bytes()) == rec
    for bad in (
        b"{",
        b'{"write":"w","size":1,"crc32c":2}',
        b'{"write":"w","size":[],"crc32c":2,"index_crc32c":3}',
    ):
        assert Record.from_bytes(bad) is None


# -- a write's own records -------------------------------------------------------------------------


def test_record_then_forget_and_record_object(st: ShardStore) -> None:
    """Kills `Journal.record` storing elsewhere, with another write id or a generation that
    makes the commit conditional, and forgetting by writing "" instead of deleting; and
    `record_object` storing elsewhere or the wrong fields."""
    j = Journal(st, "w1", 12, True)
    st.put("c/0/0", WHOLE)
    j.record("c/0/0", [WHOLE[:5], WHOLE[5:]])
    assert Record.from_bytes(st.get(RECORDS + "c/0/0") or b"") == Record.of("w1", [WHOLE], 12, True)
    assert j.matches("c/0/0")
    j.record("c/0/0", None)
    assert st.get(RECORDS + "c/0/0") is None
    assert st.list(RECORDS) == []
    j.record_object("c/1/0", 5, 6, 7)
    assert read_records(st) == {"c/1/0": Record("w1", 5, 6, 7)}


def test_matches_only_the_object_this_write_recorded(st: ShardStore) -> None:
    """Kills the mutants of `Journal.matches` and `object_crc32c` (a missing record read, the
    size test inverted, the crc compared the other way or of no object): resume skips a shard
    only when it is exactly what this write stored, so each refusal here is a shard that would
    otherwise be kept wrong."""
    j = Journal(st, "w1", 12, True)
    assert not j.matches("c/0/0")  # no record, no object
    st.put("c/0/0", WHOLE)
    assert not j.matches("c/0/0")  # an object but no record
    j.record("c/0/0", [WHOLE])
    assert j.matches("c/0/0")
    assert not Journal(st, "w2", 12, True).matches("c/0/0")  # another write's record
    st.put("c/0/0", WHOLE[:-1] + b"?")  # same size, other bytes
    assert not j.matches("c/0/0")
    st.put("c/0/0", WHOLE + b"?")  # other size
    assert not j.matches("c/0/0")
    st.put(RECORDS + "c/0/0", b"damaged")
    st.put("c/0/0", WHOLE)
    assert not j.matches("c/0/0")


def test_object_crc32c_reads_local_files_in_blocks(tmp_path: Path) -> None:
    """Kills `object_crc32c`'s local branch continuing a crc from None or from no previous block,
    or reading the file in text mode: a crc over several blocks must be the whole file's."""
    s = local(tmp_path)
    s.put("c/0/0", WHOLE)
    assert object_crc32c(s, "c/0/0", block=7) == crc.crc32c(WHOLE)
    assert object_crc32c(s, "c/0/0") == crc.crc32c(WHOLE)
    assert object_crc32c(s, "c/9/9") is None
    m = ShardStore(MemoryStore(), "arr")
    m.put("c/0/0", WHOLE)
    assert object_crc32c(m, "c/0/0") == crc.crc32c(WHOLE)
    assert object_crc32c(m, "c/9/9") is None


def test_read_records_lists_every_record_and_skips_temp_files(st: ShardStore) -> None:
    """Kills `read_records` listing another prefix, reading no record or mapping another
    function: every record by shard key, a damaged one as None, a temp file left beside them
    not at all."""
    st.put(RECORDS + "c/0/0", Record("w", 1, 2, 3).to_bytes())
    st.put(RECORDS + "c/0/1", Record("w", 4, 5, 6).to_bytes())
    st.put(RECORDS + "c/1/0", b"not a record")
    st.put(f"{RECORDS}c/1/1.{HEX_A}.partial", Record("w", 7, 8, 9).to_bytes())
    st.put("c/0/0", b"a shard, not a record")
    assert read_records(st) == {
        "c/0/0": Record("w", 1, 2, 3),
        "c/0/1": Record("w", 4, 5, 6),
        "c/1/0": None,
    }


# -- write markers ---------------------------------------------------------------------------------


def test_markers_read_back_and_inside_includes_the_edges(st: ShardStore) -> None:
    """Kills `read_marker` / `read_markers` inverting the missing test, listing another prefix
    or reading nothing, and `WriteMarker.inside` refusing a region that ends where the other
    ends (a resume of the same region must adopt its marker)."""
    region = (slice(0, 4), slice(2, 6))
    assert read_marker(st, region) is None
    m = WriteMarker("w1", [[0, 4], [2, 6]], [8, 8], "open", "t0")
    st.put(marker_name(region), m.to_bytes())
    assert read_marker(st, region) == m
    st.put(WRITES + "bad.json", b"[")
    st.put(f"{WRITES}x.json.{HEX_A}.partial", m.to_bytes())
    assert read_markers(st) == {marker_name(region): m, WRITES + "bad.json": None}
    assert m.inside([[0, 4], [2, 6]])
    assert m.inside([[0, 8], [0, 8]])
    assert not m.inside([[1, 8], [0, 8]])
    assert not m.inside([[0, 8], [0, 5]])


# -- leftovers of interrupted writes ---------------------------------------------------------------


def _temp(root: Path, name: str) -> Path:
    p = root / "arr" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"partial")
    return p


def test_remove_temp_files_by_tag_removes_one_writers_leftovers(tmp_path: Path) -> None:
    """Kills `remove_temp_files` with another default tag, the tag test inverted, listing another
    prefix, and `break` for `continue` at another writer's file (names are listed sorted, so
    writer "ab"'s files come before writer "cd"'s): a writer's clean-up removes its own temp
    files and none of a writer running beside it."""
    s = local(tmp_path)
    root = tmp_path / "a.zarr"
    theirs = [_temp(root, f"c/0/0.{HEX_A}.partial"), _temp(root, f"c/0/1.{HEX_A}.partial")]
    mine = [_temp(root, f"c/0/2.{HEX_B}.partial"), _temp(root, f"zarr.json.{HEX_B}.partial")]
    s.put("c/0/0", b"a shard")
    assert sorted(remove_temp_files(s, tag="cd")) == [
        f"c/0/2.{HEX_B}.partial",
        f"zarr.json.{HEX_B}.partial",
    ]
    assert [p.exists() for p in theirs + mine] == [True, True, False, False]
    assert sorted(remove_temp_files(s)) == [f"c/0/0.{HEX_A}.partial", f"c/0/1.{HEX_A}.partial"]
    assert s.list("") == ["c/0/0"]


def test_remove_run_temps_removes_this_writes_run_record_leftovers_only(tmp_path: Path) -> None:
    """A task killed inside the put of its run record (``.shardwise/runs/<write id>-<token>.json``)
    leaves a temp file no list of keys names: the write's clean-up (its resume, its finish)
    removes those of its own id, never another write's nor a stored record."""
    s = local(tmp_path)
    root = tmp_path / "a.zarr"
    mine = _temp(root, f".shardwise/runs/w1-t1.json.{HEX_A}.partial")
    theirs = _temp(root, f".shardwise/runs/w2-t1.json.{HEX_B}.partial")
    s.put(".shardwise/runs/w1-t2.json", b"{}")
    assert remove_run_temps(s, "w1") == [f".shardwise/runs/w1-t1.json.{HEX_A}.partial"]
    assert (mine.exists(), theirs.exists()) == (False, True)
    assert s.get(".shardwise/runs/w1-t2.json") == b"{}"
    assert remove_run_temps(s, "w1") == []


def test_remove_temp_files_of_keys_in_nested_directories(tmp_path: Path) -> None:
    """Kills `remove_temp_files(keys=...)` listing the top directory of a key instead of its own
    (`partition` for `rpartition`), not listing, keeping names that are not temp files, testing
    the keys the other way round and stopping at the first temp file of another key: a resume
    removes the leftovers of the shards it rewrites, in their directories, and only those."""
    s = local(tmp_path)
    root = tmp_path / "a.zarr"
    # created in name order; removed one at a time in that order, so a loop that stops at the
    # first other key's file leaves one behind unless the directory lists exactly in that order
    names = [f"c/1/{i}.{HEX_A}.partial" for i in range(5)]
    paths = [_temp(root, n) for n in names]
    _temp(root, "c/1/9")  # not a temp file: never removed
    top = _temp(root, f"zarr.{HEX_A}.partial")  # zarr's temp file of zarr.json
    for i, p in enumerate(paths):
        assert remove_temp_files(s, {f"c/1/{i}"}) == [names[i]]
        assert not p.exists() and all(q.exists() for q in paths[i + 1 :])
    assert remove_temp_files(s, {"zarr.json"}) == [f"zarr.{HEX_A}.partial"]
    assert not top.exists() and (root / "arr/c/1/9").exists()
    assert remove_temp_files(s, {"c/7/7"}) == []  # a directory that does not exist


# -- clearing an array -----------------------------------------------------------------------------


def _fill(s: ShardStore) -> None:
    for name in (
        "zarr.json",
        "c/0/0",
        RECORDS + "c/0/0",
        WRITES + "m.json",
        LEASE,
        LEASE + "s/one",
    ):
        s.put(name, b"x")


def test_clear_array_keeps_what_it_is_told_and_the_leases(st: ShardStore) -> None:
    """Kills `clear_array` mutants on both branches (no local root, `or` for `and`, another
    journal prefix, the lease test on None, deleting another key): everything goes but the names
    kept and the leases; `journal_only` clears only the journal."""
    _fill(st)
    clear_array(st, {RECORDS + "c/0/0"}, journal_only=True)
    assert st.list("") == sorted(["zarr.json", "c/0/0", RECORDS + "c/0/0", LEASE, LEASE + "s/one"])
    clear_array(st, {RECORDS + "c/0/0"})  # the callers keep journal objects only
    assert st.list("") == sorted([RECORDS + "c/0/0", LEASE, LEASE + "s/one"])


def test_clear_array_on_local_files(tmp_path: Path) -> None:
    """Kills `_clear_local` walking top-down (empty directories stay), the lease test inverted,
    `suppress(None)` (a directory that still holds a kept file), and `clear_array` following a
    symlink into another directory or refusing a missing array: clearing must not reach outside
    the array and must leave no empty journal directories behind."""
    s = local(tmp_path)
    clear_array(s, set())  # nothing stored yet: nothing to do
    _fill(s)
    s.put(RECORDS + "c/5/5", b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep")
    top = tmp_path / "a.zarr" / "arr"
    os.symlink(outside, top / "link")
    clear_array(s, {RECORDS + "c/0/0"}, journal_only=True)
    assert (top / "link").is_symlink() and not (top / ".shardwise" / "writes").exists()
    assert not (top / RECORDS / "c" / "5").exists() and (top / RECORDS / "c" / "0" / "0").exists()
    clear_array(s, set())
    assert (outside / "precious").read_bytes() == b"keep"
    assert sorted(p.name for p in top.iterdir()) == [".shardwise"]
    assert s.list("") == sorted([LEASE, LEASE + "s/one"])


# -- array paths with slashes (a bug the survivors of remove_temp_files and clear_array showed) ----


def test_a_path_with_a_leading_slash_never_reaches_outside_the_store(tmp_path: Path) -> None:
    """Kills `remove_temp_files` listing `root / store.key(d)` or `root / store.path` alike, and
    pins the bug the two were equivalent under: `root / "/elsewhere"` is the absolute path
    "/elsewhere", so `mode="w"` with `path="/..."` cleared a directory outside the store and a
    clean-up listed one. The array's path is used without its slashes, as zarr does."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_bytes(b"keep")
    x = np.arange(64, dtype="int16").reshape(8, 8)
    kw = dict(chunks=(2, 2), shards=(4, 4), mode="w")
    shardwise.write_array(x, tmp_path / "d.zarr", path=str(victim), **kw)
    assert (victim / "precious").read_bytes() == b"keep"  # was deleted
    inside = tmp_path / "d.zarr" / str(victim).strip("/")
    assert (inside / "zarr.json").exists()
    s = ShardStore(LocalStore(tmp_path / "d.zarr"), "/" + str(victim).strip("/") + "/")
    clear_array(s, set())
    assert not (inside / "zarr.json").exists() and (victim / "precious").exists()
    stray = inside / f"zarr.{HEX_A}.partial"
    stray.write_bytes(b"partial")
    assert remove_temp_files(s, {"zarr.json"}) == [f"zarr.{HEX_A}.partial"]
    assert not stray.exists()


def test_appends_of_finds_the_appends_of_one_dimension_and_status() -> None:
    # kills appends_of_5 (every marker taken for an append of that dimension and status)
    store = ShardStore(MemoryStore())

    def put(lo: int, status: str, append: dict | None) -> None:
        region = [[lo, lo + 2], [0, 3]]
        m = WriteMarker(
            id=f"w{lo}", region=region, shape=[8, 3], status=status, started=now(), append=append
        )
        store.put(marker_name(tuple(slice(a, b) for a, b in region)), m.to_bytes())

    put(0, "done", None)  # a write that is no append
    put(2, "open", None)
    put(4, "open", {"dim": "t", "axis": 0, "id": "a"})
    put(6, "done", {"dim": "t", "axis": 0, "id": "b"})
    put(8, "open", {"dim": "u", "axis": 0, "id": "c"})
    assert [m.id for m in appends_of(store, "t", "open")] == ["w4"]
    assert [m.id for m in appends_of(store, "t", "done")] == ["w6"]
    assert [m.id for m in appends_of(store, "u", "open")] == ["w8"]
