"""Survivors of the mutation lane in durability/verify and durability/checks
(`mutation/run.py durability/verify durability/checks`): what a report says about each finding
(its kind, key, message and inner chunk, word for word: users and scripts read them), the cap on
the corrupt chunks listed per shard, the totals of a group, the keywords verify refuses, the
progress bar and the report's text. Each test names the mutants it kills. Real stores (local
files); damage and leftovers are real objects written into them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.storage import LocalStore

import shardwise
from shardwise import ArrayNotFoundError, InvalidTypeError, InvalidValueError
from shardwise.codec.codecs import crc32c
from shardwise.codec.shard import ShardIndex
from shardwise.durability.checks import MAX_PER_SHARD, Problem, VerifyReport, check_shard
from shardwise.durability.journal import (
    BATCH,
    PARTS,
    RECORDS,
    WRITES,
    WriteMarker,
    marker_name,
)
from shardwise.durability.lease import Lease, read_lease
from shardwise.durability.verify import UNSHARDED, verify, verify_store
from shardwise.engine.staged import STAGED
from shardwise.storage.nodes import open_info
from shardwise.storage.store import ShardStore, describe

SHAPE = (30, 26)
KW: dict[str, Any] = dict(
    chunks=(4, 4), shards=(8, 8), fill_value=0, compressors=[ZstdCodec(level=1), Crc32cCodec()]
)
HEX = "00112233445566778899aabbccddeeff"


def data(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 9, SHAPE).astype("int32")


def flip(path: Path, at: int) -> None:
    b = bytearray(path.read_bytes())
    b[at] ^= 0x10
    path.write_bytes(bytes(b))


def put(root: Path, key: str, raw: bytes) -> None:
    (root / key).parent.mkdir(parents=True, exist_ok=True)
    (root / key).write_bytes(raw)


def found(problems: list[Problem]) -> list[tuple[str, str, str, Any]]:
    return sorted((p.kind, p.key, p.message, p.chunk) for p in problems)


def damaged(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """An array with one finding of every kind verify reports, and the values its messages
    quote (the deleted shard's record, the open write's marker)."""
    root = tmp_path / "a.zarr"
    x = data()
    x[:8, :8] = 0  # c/0/0 all fill: not stored, not recorded
    shardwise.write_array(x, root, **KW)
    zarr.open_array(root, mode="r+")[0:8, 0:8] = 5  # c/0/0 written by another tool
    zarr.open_array(root, mode="r+")[16:24, 0:8] = 7  # c/2/0 sound, not as the writer recorded
    flip(root / "c/1/2", 3)  # inside the first inner chunk: a crc32c failure (a problem only)
    gone = json.loads((root / RECORDS / "c/3/0").read_bytes())
    (root / "c/3/0").unlink()
    put(root, RECORDS + "c/1/1", b"{not json")
    put(root, f"c/0/1.{HEX}.partial", b"x")
    put(root, f"{RECORDS}c/2/2.{HEX}.partial", b"x")  # a temp file inside the journal
    put(root, "c/9/9", b"outside the grid")
    region = [[0, 8], [0, 26]]
    marker = WriteMarker("0123456789abcdef", region, list(SHAPE), "open", "2026-01-02T03:04:05")
    put(root, marker_name(tuple(slice(a, b) for a, b in region)), marker.to_bytes())
    put(root, WRITES + "ffff.json", b"[broken")
    # staged pieces as a staged write names them: <write>/<shard key>/b<block>
    for piece in ("aaaaaaaa1111/c/0/0/b0.0", "aaaaaaaa1111/c/0/1/b0.1", "bbbbbbbb2222/c/1/0/b1"):
        put(root, STAGED + piece, b"piece")
    put(root, f"{STAGED}bbbbbbbb2222/c/1/1/b0.{HEX}.partial", b"x")  # not a piece yet
    put(root, BATCH, json.dumps({"nparts": 3}).encode())
    put(root, PARTS + "0", b"{}")
    put(root, PARTS + "1", b"{}")
    put(root, f"{PARTS}2.{HEX}.partial", b"{}")
    return root, {"gone": gone, "marker": marker}


def expected_problems(quoted: dict[str, Any], corrupt: str) -> list[tuple[str, str, str, Any]]:
    """The problems of :func:`damaged`'s array, as :func:`found` lists them."""
    gone, marker = quoted["gone"], quoted["marker"]
    temp = "temp file of an interrupted write"
    return sorted(
        [
            ("batch", BATCH, "batch write not finalized: 2 of 3 parts done", None),
            ("corrupt", "c/1/2", corrupt, (0, 0)),
            (
                "incomplete",
                marker_name(tuple(slice(a, b) for a, b in marker.region)),
                "write 01234567 of region [0:8, 0:26] started 2026-01-02T03:04:05 did not "
                "finish: rerun it with resume=True",
                None,
            ),
            ("journal", RECORDS + "c/1/1", "unreadable shard record", None),
            ("journal", WRITES + "ffff.json", "unreadable write marker", None),
            (
                "missing",
                "c/3/0",
                f"the writer stored this shard ({gone['size']} bytes, write "
                f"{gone['write'][:8]}) but it is gone: readers would see fill values",
                None,
            ),
            (
                "staged",
                STAGED + "aaaaaaaa1111",
                "2 staged pieces of write aaaaaaaa left behind: "
                "rerun the write with resume=True to finish it (or delete them)",
                None,
            ),
            (
                "staged",
                STAGED + "bbbbbbbb2222",
                "1 staged pieces of write bbbbbbbb left behind: "
                "rerun the write with resume=True to finish it (or delete them)",
                None,
            ),
            ("stray", "c/9/9", "not metadata, journal or a shard of this grid", None),
            ("temp", f"c/0/1.{HEX}.partial", temp, None),
            ("temp", f"{RECORDS}c/2/2.{HEX}.partial", temp, None),
            ("temp", f"{STAGED}bbbbbbbb2222/c/1/1/b0.{HEX}.partial", temp, None),
            ("temp", f"{PARTS}2.{HEX}.partial", temp, None),
        ]
    )


def expected_changes(root: Path) -> list[tuple[str, str, str, Any]]:
    """The changes of :func:`damaged`'s array (notes unless strict), as :func:`found` lists
    them."""
    new = (root / "c/2/0").read_bytes()
    rec = json.loads((root / RECORDS / "c/2/0").read_bytes())
    return [
        (
            "mismatch",
            "c/2/0",
            f"stored object ({len(new)} bytes, crc32c {crc32c(new):#010x}) differs from "
            f"what the writer recorded ({rec['size']} bytes, crc32c {rec['crc32c']:#010x}): "
            "rewritten by another tool, or damaged where no checksum covers it",
            None,
        ),
        (
            "unrecorded",
            "c/0/0",
            "stored, but the writer has no record of it (written by another tool)",
            None,
        ),
    ]


def test_every_finding_is_reported_with_its_key_and_message(tmp_path: Path) -> None:
    """Kills the mutants of the messages, kinds and keys of `_list_shards` (a temp file inside
    the journal, a temp file, a stray object), `_check_records` (an unreadable record, a
    recorded shard that is gone: its size and write), `_check_shards` (a shard without a
    record) and `checks._check_journal` (an open write with its region and start, an unreadable
    marker, staged pieces counted per write, temp files not counted, an unfinished batch with
    the parts done, a held lease): each finding says what is wrong where, so that a user knows
    what to rerun or delete; and of the counts the report gives (`+=` made `=` or `-=`)."""
    root, quoted = damaged(tmp_path)
    shards = [p for p in (root / "c").rglob("*") if p.is_file() and p.parent.name != "9"]
    shards = [p for p in shards if "partial" not in p.name]
    with Lease.acquire(ShardStore(LocalStore(root)), purpose="somebody"):
        held = read_lease(ShardStore(LocalStore(root)))
        assert held is not None
        report = verify(root)
    (corrupt,) = [p.message for p in report.problems if p.kind == "corrupt"]
    assert corrupt.startswith("inner chunk does not decode: crc32c checksum mismatch")
    assert found(report.problems) == expected_problems(quoted, corrupt)
    assert found(report.changes) == expected_changes(root)
    assert report.notes == [f"write lease held: {held.describe()}"]
    assert report.shards_stored == len(shards) == 15 and report.shards_recorded == 14
    assert report.bytes_read == sum(p.stat().st_size for p in shards)
    # every inner chunk of the stored shards decodes but the flipped one
    assert report.chunks_checked == 52 - 4 + 4 - 1  # c/3/0 gone (4), c/0/0 stored (4)
    strict = verify(root, strict=True)
    assert found(strict.problems) == found(report.problems + report.changes)
    assert strict.changes == [] and not strict.ok


def test_a_shard_lists_at_most_its_cap_of_corrupt_chunks_and_decodes_the_rest(
    tmp_path: Path,
) -> None:
    """Kills `check_shard` listing one corrupt chunk more than `MAX_PER_SHARD` (`<=`), counting
    the others wrongly, giving up at the first corrupt chunk (`break` for `continue`), or
    counting a chunk decoded in a shard whose index is broken: in a shard of 16 inner chunks of
    which 10 are damaged, the first 8 are named in order and the 6 sound ones are still decoded
    (a report stays readable for a shard that is all garbage, and still says how much of it is
    sound)."""
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **{**KW, "chunks": (2, 2)})  # 16 inner chunks a shard
    clean = verify(root)
    info = open_info(LocalStore(root), None)
    raw = (root / "c/0/0").read_bytes()
    index = ShardIndex.of_shard(info.codec, memoryview(raw), "c/0/0")
    bad = [0, 1, 2, 4, 5, 6, 8, 9, 10, 12]
    for flat in bad:
        flip(root / "c/0/0", int(index.entries[flat][0]) + 1)
    (root / "c/1/1").write_bytes((root / "c/1/1").read_bytes()[:-3])  # its index broken
    report = verify(root)
    listed = [p for p in report.problems if p.kind == "corrupt" and p.key == "c/0/0"]
    assert MAX_PER_SHARD == 8 and len(listed) == MAX_PER_SHARD
    assert [p.chunk for p in listed] == [divmod(f, 4) for f in bad[:MAX_PER_SHARD]]
    assert [(p.kind, p.key) for p in report.problems if p not in listed] == [("corrupt", "c/1/1")]
    # the broken index's shard adds no decoded chunk (none of its 16 is reachable)
    assert report.chunks_checked == clean.chunks_checked - len(bad) - 16


def test_a_group_adds_up_its_arrays(tmp_path: Path) -> None:
    """Kills `_verify_group`'s mutants of its totals (`+=` made `=` or `-=`, a count of recorded
    shards starting at 1), of its notes (a note per array, prefixed with the array's name; a
    not-sharded array noted, and the arrays after it still checked: `break` for `continue`), of
    the arrays' options passed on (`strict`), and `verify`'s `where` for a group at a path."""
    root = tmp_path / "g.zarr"
    zarr.open_group(root, mode="w")
    zarr.create_array(root, name="g/a", shape=(4,), dtype="int32", chunks=(4,))
    for name, seed in (("g/b", 1), ("g/c", 2)):
        shardwise.write_array(data(seed), root, path=name, **KW)
    (root / "g/c/c/1/1").write_bytes((root / "g/b/c/1/1").read_bytes())  # sound, not c's
    (root / "g/b/c/2/2").write_bytes((root / "g/c/c/2/2").read_bytes())  # and the other way
    (root / "g/b/c/0/0").unlink()
    one = {n: verify(root, path=n) for n in ("g/b", "g/c")}
    report = verify(root, path="g")
    assert report.where == f"file://{root} path 'g'"
    assert report.shards_stored == 15 + 16 and report.shards_recorded == 16 + 16
    assert report.chunks_checked == sum(r.chunks_checked for r in one.values()) > 0
    assert report.bytes_read == sum(r.bytes_read for r in one.values()) > 0
    assert found(report.problems) == [
        ("missing", "g/b/c/0/0", one["g/b"].problems[0].message, None)
    ]
    assert [(p.kind, p.key) for p in report.changes] == [
        ("mismatch", "g/b/c/2/2"),
        ("mismatch", "g/c/c/1/1"),
    ]
    # the unsharded array first in the group: its chunks checked (none stored), and noted
    assert report.notes == [
        f"g/a: {UNSHARDED}",
        "g/a: no writer records (not written by shardwise, or nothing stored): shards checked "
        "for integrity only",
    ]
    strict = verify(root, path="g", strict=True)
    assert sorted(p.kind for p in strict.problems) == ["mismatch", "mismatch", "missing"]


def test_a_group_without_writer_records_says_so_per_array(tmp_path: Path) -> None:
    """Kills `_verify_group` reporting recorded shards (`0`, or `any_records` true from the
    start) for arrays no shardwise writer recorded: `shards_recorded` is None, as for one such
    array, and each array's note is kept under its name."""
    root = tmp_path / "g.zarr"
    zarr.open_group(root, mode="w")
    for name in ("x", "y"):
        z = zarr.create_array(root, name=name, shape=(8,), dtype="int32", chunks=(2,), shards=(4,))
        z[:] = np.arange(8)
    report = verify(root)
    assert report.ok and report.shards_stored == 4 and report.shards_recorded is None
    assert report.where == f"file://{root}"
    assert report.notes == [
        f"{n}: no writer records (not written by shardwise, or nothing stored): shards checked "
        "for integrity only"
        for n in ("x", "y")
    ]
    assert report.chunks_checked == 8 and "no writer records" in str(report)


@pytest.mark.parametrize(
    ("kw", "error", "word"),
    [
        ({"path": 3}, InvalidTypeError, "path"),
        ({"threads": 0}, InvalidValueError, "threads"),
        ({"threads": "2"}, InvalidTypeError, "threads"),
        ({"storage_options": ["anon"]}, InvalidTypeError, "storage_options"),
        ({"strict": "yes"}, InvalidTypeError, "strict"),
        ({"progress": 1}, InvalidTypeError, "progress"),
    ],
)
def test_verify_refuses_a_keyword_naming_it(
    tmp_path: Path, kw: dict[str, Any], error: type[Exception], word: str
) -> None:
    """Kills `verify`'s mutants of its keyword checks (a check dropped or given another name):
    a wrong keyword is refused before anything is read, with an error that names it."""
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **KW)
    with pytest.raises(error, match=word):
        verify(root, **kw)


def test_unreadable_metadata_is_named_where_it_is(tmp_path: Path) -> None:
    """Kills `verify`'s mutants of the metadata problem (its kind, the key `zarr.json` or the
    path asked for, the exception's type in the message): a missing or broken array is a
    problem that says where, not a crash."""
    (tmp_path / "x").mkdir()
    (root_problem,) = verify(tmp_path / "x").problems
    assert (root_problem.kind, root_problem.key) == ("metadata", "zarr.json")
    assert root_problem.message.split(":")[0].endswith("Error")
    put(tmp_path / "x", "a/zarr.json", b"{not json")
    report = verify(tmp_path / "x", path="a")
    assert [(p.kind, p.key) for p in report.problems] == [("metadata", "a")]
    assert report.where.endswith(" path 'a'") and not report.ok


def test_verify_store_names_the_array_and_can_leave_the_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kills `verify_store`'s mutants of its `where` (without one: the array as messages name
    it) and of `check_batch=False` (the batch writer's own check of its parts, before it
    finalizes, must not report its own unfinished batch), and the time it reports (`+` for
    `-`: at most the time the call took), and of its default `progress=False`."""
    root = tmp_path / "b.zarr"
    from shardwise import batch

    batch.init(root, shape=SHAPE, dtype="int32", parts=2, **KW)
    batch.write_part(data(), root, 0)
    zstore = LocalStore(root)
    info, sstore = open_info(zstore, None), ShardStore(zstore, "")
    before = time.perf_counter()
    report = verify_store(info, sstore, check_batch=False)
    took = time.perf_counter() - before
    assert report.where == describe(zstore, "") and report.ok and report.shards_stored > 0
    assert 0 < report.seconds <= took
    assert [p.kind for p in verify_store(info, sstore).problems] == ["batch"]
    assert capsys.readouterr().err == ""  # no bar unless asked (`progress=False` by default)
    before = time.perf_counter()
    report = verify(root)
    assert 0 < report.seconds <= time.perf_counter() - before


def test_the_progress_bar_counts_every_shard_and_the_bytes_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kills `_check_shards`' mutants of the bar (its label, its total, a step of 2 shards or
    of no bytes, never shown or never closed): `progress=True` shows "verify", every shard
    counted once out of the shards stored, and the megabytes read."""
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **KW)
    report = verify(root, progress=True)
    err = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert err.startswith("verify: 100%") and "16/16" in err
    assert f"{report.bytes_read / 1e6:.1f} MB read" in err
    assert verify(root, progress=False).ok and capsys.readouterr().err == ""


def test_the_report_text_and_dict(tmp_path: Path) -> None:
    """Kills the mutants of `Problem.__str__`, `VerifyReport.__str__`, `to_dict` and `to_json`:
    the text the CLI prints (a problem's kind padded, its chunk; the head line with the counts;
    the first 50 problems and changes, then how many more; the notes) and the dict `--json`
    prints (every field and `ok`)."""
    p = Problem("corrupt", "c/1/2", "bad", (0, 1))
    assert str(p) == "corrupt    c/1/2 chunk (0, 1): bad"
    assert str(Problem("missing", "c/0/0", "gone")) == "missing    c/0/0: gone"
    rep = VerifyReport(
        where="here",
        shards_stored=3,
        shards_recorded=2,
        chunks_checked=7,
        bytes_read=2_500_000,
        seconds=1.234,
    )
    assert str(rep) == (
        "here: OK; 3 shards stored (2 recorded), 7 inner chunks decoded, 2.5 MB read in 1.23 s"
    )
    rep.problems = [Problem("temp", f"t{i}", "left") for i in range(52)]
    rep.changes = [Problem("mismatch", f"m{i}", "other") for i in range(51)]
    rep.notes = ["a note"]
    rep.shards_recorded = None
    lines = str(rep).splitlines()
    assert lines[0] == (
        "here: 52 problems; 3 shards stored (no writer records), 7 inner chunks decoded, "
        "2.5 MB read in 1.23 s"
    )
    assert lines[1:51] == [f"  temp       t{i}: left" for i in range(50)]
    assert lines[51] == "  ... and 2 more"
    assert lines[52] == (
        "  note: 51 shards sound but not what the writer recorded (written or rewritten "
        "by another tool; problems with --strict / strict=True):"
    )
    assert lines[53:103] == [f"    mismatch   m{i}: other" for i in range(50)]
    assert lines[103:] == ["    ... and 1 more", "  note: a note"]
    del rep.problems[50:], rep.changes[50:]  # 50 of each: all shown, no "more" line
    assert [line for line in str(rep).splitlines() if "more" in line] == []
    assert len(str(rep).splitlines()) == 1 + 50 + 1 + 50 + 1
    d = rep.to_dict()
    assert d["ok"] is False and d["where"] == "here" and d["shards_recorded"] is None
    assert d["problems"][0] == {"kind": "temp", "key": "t0", "message": "left", "chunk": None}
    assert json.loads(rep.to_json()) == d and rep.to_json().startswith('{\n  "where"')
    rep.strict = True
    rep.add_change(Problem("unrecorded", "u", "x"))
    assert rep.problems[-1].key == "u" and len(rep.changes) == 50
    # one of each: counted in the singular
    rep.shards_stored, rep.chunks_checked = 1, 1
    rep.strict = False
    del rep.problems[1:], rep.changes[1:]
    lines = str(rep).splitlines()
    assert lines[0].startswith("here: 1 problem; 1 shard stored (no writer records), 1 inner ")
    assert lines[0].split(", ")[1] == "1 inner chunk decoded"
    assert lines[2].startswith("  note: 1 shard sound but not what the writer recorded (")


def test_a_shard_gone_when_read_and_a_batch_that_does_not_parse(tmp_path: Path) -> None:
    """Kills `check_shard`'s mutants of a shard listed but gone when read (its kind, key,
    message and zero counts: another writer may delete an emptied shard between verify's
    listing and its read) and `_check_journal`'s fallback for a batch document that does not
    parse (still reported as an unfinished batch, with -1 parts expected)."""
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **KW)
    zstore = LocalStore(root)
    info, sstore = open_info(zstore, None), ShardStore(zstore, "")
    (root / "c/1/1").unlink()
    probs, change, decoded, nbytes = check_shard(info, sstore, "c/1/1", None)
    assert [(p.kind, p.key, p.message) for p in probs] == [
        ("missing", "c/1/1", "listed but gone when read")
    ]
    assert (change, decoded, nbytes) == (None, 0, 0)
    put(root, BATCH, b"{not json")
    put(root, PARTS + "0", b"{}")
    batch = [(p.key, p.message) for p in verify(root).problems if p.kind == "batch"]
    assert batch == [(BATCH, "batch write not finalized: 1 of -1 parts done")]


def test_verify_opens_read_only_and_refuses_a_path_with_no_store(tmp_path: Path) -> None:
    """Kills `verify`'s mutants of the store's mode (`None`, another word): verify only reads,
    so a local path where nothing is stored is refused as not found (a store opened for writing
    would be created there instead, and the typo reported as a missing array), and a check,
    through a path or a file:// URL, leaves every byte of the store as it was; the report
    names the store as the user gave it (`where` passed on to `verify_store`)."""
    with pytest.raises(ArrayNotFoundError, match="no store at"):
        verify(tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()
    root = tmp_path / "a.zarr"
    shardwise.write_array(data(), root, **KW)
    assert verify(root).where == f"file://{root}"  # the store as the user named it
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert verify(str(root)).ok and verify(f"file://{root}").ok
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_a_record_temp_file_alone_marks_a_shardwise_array(tmp_path: Path) -> None:
    """Kills `_check_records` needing both readable records and journal names (`and` for
    `or`): an array whose only record is the temp file of a write interrupted before its first
    record landed was being written by shardwise, so its shards are unrecorded notes (not
    "written by another tool, integrity only") and the temp file is reported."""
    root = tmp_path / "a.zarr"
    z = zarr.create_array(root, shape=(8,), dtype="int32", chunks=(2,), shards=(4,))
    z[:] = np.arange(8)
    put(root, f"{RECORDS}c/0.{HEX}.partial", b"{}")
    report = verify(root)
    assert [(p.kind, p.key) for p in report.problems] == [("temp", f"{RECORDS}c/0.{HEX}.partial")]
    assert sorted((p.kind, p.key) for p in report.changes) == [
        ("unrecorded", "c/0"),
        ("unrecorded", "c/1"),
    ]
    assert report.shards_recorded == 0 and report.notes == []


@pytest.mark.parametrize("path", ["g/x", None])
def test_verify_names_the_metadata_gone_under_a_finished_journal(
    tmp_path: Path, path: str | None
) -> None:
    # kills verify's _check_unfinished_20 (the problem made without its key: a TypeError)
    root = tmp_path / "s.zarr"
    if path is not None:
        zarr.create_group(root)
    shardwise.write_array(np.arange(64, dtype="int16").reshape(8, 8), root, path=path,
                          chunks=(2, 2), shards=(4, 4))  # fmt: skip
    key = "zarr.json" if path is None else f"{path}/zarr.json"
    (root / key).unlink()
    report = shardwise.verify(root)
    assert not report.ok
    problems = [(p.kind, p.key) for p in report.problems]
    assert ("metadata", key) in problems, report.problems
