"""The append records' parts the append and resume tests pass through without pinning them
(survivors of the mutation lane, `mutation/run.py durability/appending`): a record of no rows
reads back as a record, and a record whose axis the lead array does not have names no rows
(rather than failing the survey that verify and a resume run); a record's row count along its
own axis, exact and old-format blocks, a killed append of one shape on another block as a rival,
a block ending on a shard boundary, malformed records, records without a holder and a reused
process id; when a killed append started (verify's report), a resumed append along another axis,
a killed append of one row, a running append whose rows end where a killed one's begin. Each
test names the mutants it kills. Real stores: zarr's MemoryStore, or arrays in a temp directory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Any

from zarr.storage import MemoryStore

from faultkit import gone_pid
from shardwise.durability.appending import (
    APPENDING,
    AppendRecord,
    holds_values,
    read_appending,
    survey,
)
from shardwise.durability.holder import LeaseInfo
from shardwise.storage.store import ShardStore, resolve_store


def _record(region: list[list[int]], axis: int = 0, seen: int = 0) -> AppendRecord:
    holder = asdict(LeaseInfo.new("append"))
    return AppendRecord.new("t" * 32, "t", axis, region, seen, holder)


def _lead(shape: list[int]) -> ShardStore:
    store = ShardStore(MemoryStore(), "v")
    store.put("zarr.json", json.dumps({"shape": shape}).encode())
    return store


def test_a_record_of_no_rows_reads_back_as_a_record() -> None:
    # kills from_bytes_6 (a record of 0 rows read as unreadable: verify would report a journal
    # problem for a record shardwise wrote)
    rec = _record([[10, 10], [0, 4]])
    assert rec.rows == 0
    assert AppendRecord.from_bytes(rec.to_bytes()) == rec
    store = _lead([10, 4])
    store.put(rec.name(), rec.to_bytes())
    assert read_appending(store) == {rec.name(): rec}


def test_a_record_of_an_axis_the_lead_lacks_names_no_rows() -> None:
    # kills unnamed_12 (the lead's length read at an axis it does not have: IndexError in the
    # survey instead of no unnamed rows)
    store = _lead([10])
    rec = _record([[0, 10], [10, 14]], axis=1, seen=0)
    store.put(rec.name(), rec.to_bytes())
    found = survey(store)
    assert found is not None
    assert found.unnamed(rec) == []
    assert found.killed_rows(rec) is None and found.judge(rec) == "nothing"


def test_verify_reports_an_unreadable_append_record_once_by_its_key(tmp_path: object) -> None:
    """A record that does not parse (a torn or foreign file) is a journal problem naming its key,
    read once by the survey verify runs, beside the readable records it still judges."""
    import numpy as np

    import shardwise

    root = f"{tmp_path}/a.zarr"
    shardwise.write_array(np.zeros((8, 4), "i2"), root, chunks=(2, 4), shards=(4, 4))
    store = ShardStore(resolve_store(root, mode="a"), "")
    name = f"{APPENDING}torn.json"
    store.put(name, b"{not json")
    found = survey(store)
    assert found is not None and found.unreadable == [name]
    problems = [p for p in shardwise.verify(root).problems if p.kind == "journal"]
    assert [(p.key, p.message) for p in problems] == [(store.key(name), "unreadable append record")]


def _lead_array(tmp_path: Any, x: Any, fill: Any, shards: tuple[int, ...]) -> ShardStore:
    """A real sharded array of ``x`` (fill value ``fill``), as the lead of an append."""
    import shardwise

    root = f"{tmp_path}/lead.zarr"
    shardwise.write_array(x, root, chunks=shards, shards=shards, fill_value=fill)
    return ShardStore(resolve_store(root, mode="a"), "")


def test_holds_values_reads_the_rows_from_the_first_shard_boundary_along_their_axis(
    tmp_path: Any,
) -> None:
    # the other axes read whole, the rows from the first shard boundary at or after their start
    # (the shard across the start may keep a given-back append's values), to their end
    import numpy as np

    x = np.zeros((12, 6), "i4")
    x[4:8, 1] = 7  # values in the second shard of rows, in the first shard of columns
    st = _lead_array(tmp_path, x, 0, (4, 3))
    assert holds_values(st, 0, (4, 8))  # exactly one shard of rows, its values at column 1
    assert holds_values(st, 0, (8, 12)) is False and holds_values(st, 0, (0, 4)) is False
    assert holds_values(st, 0, (2, 5))  # rows 4:5, from the first shard boundary on
    assert holds_values(st, 0, (1, 3)) is None  # no row after a boundary: nothing to tell
    assert holds_values(st, 0, (5, 6)) is None  # inside one shard that holds earlier rows
    assert holds_values(st, 0, (2, 12))


def test_holds_values_reads_every_shard_along_the_other_axes(tmp_path: Any) -> None:
    # kills holds_values_45 (the other axes read from index 1: a column of shards one wide
    # at index 0 never read, its appended values taken for none)
    import numpy as np

    x = np.zeros((8, 2), "i4")
    x[4:8, 0] = 7  # values only in the first column, a shard one column wide
    st = _lead_array(tmp_path, x, 0, (4, 1))
    assert holds_values(st, 0, (4, 8))
    assert holds_values(st, 0, (0, 4)) is False


def test_holds_values_counts_nan_fill_as_no_value(tmp_path: Any) -> None:
    # kills holds_values_50 (NaN read as a value where the fill value is NaN)
    import numpy as np

    x = np.full((8,), np.nan, "f4")
    x[6] = 1.5
    st = _lead_array(tmp_path, x, float("nan"), (2,))
    assert not holds_values(st, 0, (0, 6))
    assert holds_values(st, 0, (6, 8))


def test_survey_reads_markers_and_names_settled_records() -> None:
    # kills survey_15 (the markers read as none: named rows taken for unnamed) and survey_35
    # (a settled record's name lost: its record never removed)
    from shardwise.durability.journal import WriteMarker, marker_name, now

    store = _lead([20])
    rec = _record([[10, 20]], seen=10)
    store.put(rec.name(), rec.to_bytes())
    marker = WriteMarker(
        "m" * 32, [[10, 20]], [20], "open", now(), append={"dim": "t", "axis": 0, "id": rec.id}
    )
    store.put(marker_name((slice(10, 20),)), marker.to_bytes())
    found = survey(store)
    assert found is not None
    assert found.markers == [marker] and found.settled == [rec.name()]
    assert found.unnamed(rec) == [] and found.stale == []


def test_the_survey_reads_each_stretch_of_rows_once_for_verify(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """A killed append's record whose first unnamed rows hold another tool's values: the
    resume's two questions (are they a killed append's block? did another tool append first?)
    and verify's report read those rows once, through the survey."""

    import numpy as np

    import shardwise
    import shardwise.durability.appending as appending

    x = np.zeros((12, 6), "i4")
    x[8:12] = 5  # rows another tool appended after the length the record saw
    lead = _lead_array(tmp_path, x, 0, (4, 3))
    for name in lead.list(".shardwise/writes/"):  # the rows 8:12 named by no marker
        lead.delete(name)
    holder = _gone_holder()
    rec = AppendRecord.new("k" * 32, "t", 0, [[8, 12], [0, 6]], 8, holder)
    lead.put(rec.name(), rec.to_bytes())
    asked: list[tuple[int, tuple[int, int]]] = []

    def counting(store: ShardStore, axis: int, rows: tuple[int, int]) -> bool:
        asked.append((axis, rows))
        return holds_values(store, axis, rows)

    monkeypatch.setattr(appending, "holds_values", counting)
    found = survey(lead)
    assert found is not None and [r for _, r in found.stale] == [rec]
    assert found.killed_rows(rec) is None  # the veto: values are stored there
    assert found.judge(rec) == "nothing"  # so the killed append reserved nothing
    assert asked == [(0, (8, 12))]  # both answers from one read
    asked.clear()
    (problem,) = [p for p in shardwise.verify(f"{tmp_path}/lead.zarr").problems]
    assert problem.kind == "incomplete" and "stopped before it reserved them" in problem.message
    assert asked == [(0, (8, 12))]


def _gone_holder() -> dict[str, Any]:
    """An append's holder whose process is gone."""
    return asdict(replace(LeaseInfo.new("append"), pid=gone_pid()))


def test_a_killed_appends_block_is_its_own_whatever_rows_follow_and_claims_on_it_decide(
    tmp_path: Any,
) -> None:
    """K committed rows 10:50 and was killed before its markers; another tool then appended rows
    50:90 with values (no marker). K's block is exactly the 40 rows from the length its commit
    grew from: the rows after it do not matter (they were counted against K before: 80 unnamed
    rows for one killed append of 40, and K's were never finished). A killed append of another
    shape claiming rows of the block makes it unsure; a running one, reserving; a killed twin
    (same shape, same block) changes nothing."""
    import numpy as np

    x = np.zeros((90, 6), "i4")
    x[:10], x[50:] = 1, 5
    lead = _lead_array(tmp_path, x, 0, (4, 3))
    for name in lead.list(".shardwise/writes/"):
        lead.delete(name)

    def put(rec: AppendRecord) -> AppendRecord:
        lead.put(rec.name(), rec.to_bytes())
        return rec

    k = put(AppendRecord.new("k" * 32, "t", 0, [[10, 50], [0, 6]], 10, _gone_holder()))
    found = survey(lead)
    assert found is not None and found.block(k) == (10, 50)
    assert found.judge(k) == "reserved" and found.killed_rows(k) == (10, 50)
    twin = put(AppendRecord.new("w" * 32, "t", 0, [[10, 50], [0, 6]], 10, _gone_holder()))
    found = survey(lead)
    assert found is not None and found.killed_rows(k) == (10, 50) == found.killed_rows(twin)
    lead.delete(twin.name())
    rival = put(AppendRecord.new("r" * 32, "t", 0, [[0, 20], [0, 6]], 30, _gone_holder()))
    found = survey(lead)
    assert found is not None and found.judge(k) == "unsure" and found.killed_rows(k) is None
    lead.delete(rival.name())
    running = put(_record([[0, 8], [0, 6]], seen=44))  # this process: alive
    found = survey(lead)
    assert found is not None and found.judge(k) == "reserving" and found.killed_rows(k) is None
    lead.delete(running.name())
    # a record of the earlier format (the length read before the commit): its block is the first
    # unnamed rows from there on
    old = replace(k, seen=4, exact=False)
    legacy = {key: v for key, v in asdict(old).items() if key != "exact"}
    lead.put(old.name(), json.dumps(legacy).encode())
    found = survey(lead)
    assert found is not None and [r for _, r in found.stale] == [old]
    assert found.block(old) == (4, 44)


def test_another_tools_rows_in_the_block_of_an_append_killed_before_its_commit_are_kept(
    tmp_path: Any,
) -> None:
    """K (3 rows, the length 10 seen) was killed before its commit; another tool appended 5
    rows at 10:15 (no marker). K's block, rows 10:13, is unnamed: its rows from the shard
    boundary at 12 hold the other tool's values, so K reserved nothing. Where no row of a block
    can be read (it lies in the tail of one shard), it is K's only when the unnamed rows there
    are exactly killed appends' blocks end to end; the other tool's rows make it unsure."""
    import numpy as np

    x = np.zeros((15, 2), "i4")
    x[:10], x[10:] = 1, 7
    lead = _lead_array(tmp_path, x, 0, (4, 2))
    for name in lead.list(".shardwise/writes/"):
        lead.delete(name)
    k = AppendRecord.new("k" * 32, "t", 0, [[10, 13], [0, 2]], 10, _gone_holder())
    lead.put(k.name(), k.to_bytes())
    found = survey(lead)
    assert found is not None and found.judge(k) == "nothing" and found.killed_rows(k) is None
    one = replace(k, region=[[10, 11], [0, 2]])  # one row: nothing of it after a boundary
    lead.put(one.name(), one.to_bytes())
    found = survey(lead)
    assert found is not None and found.judge(one) == "unsure"
    # rows 10:15 exactly the blocks of five killed one-row appends: theirs
    for i in range(5):
        r = AppendRecord.new(f"{i}" * 32, "t", 0, [[10 + i, 11 + i], [0, 2]], 10 + i, k.holder)
        lead.put(r.name(), r.to_bytes())
    lead.delete(k.name())
    blank = _lead_array(tmp_path / "b", np.where(np.arange(15)[:, None] < 10, 1, 0), 0, (4, 2))
    for name in blank.list(".shardwise/writes/"):
        blank.delete(name)
    for name in lead.list(APPENDING):
        raw = lead.get(name)
        assert raw is not None
        blank.put(name, raw)
    found = survey(blank)
    assert found is not None and len(found.stale) == 5
    assert [found.killed_rows(r) for _, r in found.stale] == [(i, i + 1) for i in range(10, 15)]


def test_killed_appends_of_two_shapes_on_one_length_are_told_apart_by_the_rows_they_fill(
    tmp_path: Any,
) -> None:
    """K (3 rows) and W (5 rows) both saw length 10 and were killed; the lead is 15 long, rows
    10:15 named by nothing. Only W's block makes up those rows (K's would leave 13:15 nobody's):
    W committed, K reserved nothing. A second killed append of 2 rows at 13 makes K's 10:13 and
    its 13:15 another way: two ways, unsure. Another shape with W's very block: unsure."""
    import numpy as np

    x = np.zeros((15, 2), "i4")
    x[:10] = 1
    lead = _lead_array(tmp_path, x, 0, (4, 2))
    for name in lead.list(".shardwise/writes/"):
        lead.delete(name)
    holder = _gone_holder()

    def put(token: str, rows: int, seen: int, width: int = 2) -> AppendRecord:
        rec = AppendRecord.new(token * 32, "t", 0, [[seen, seen + rows], [0, width]], seen, holder)
        lead.put(rec.name(), rec.to_bytes())
        return rec

    k, w = put("k", 3, 10), put("w", 5, 10)
    found = survey(lead)
    assert found is not None
    assert (found.judge(k), found.judge(w)) == ("nothing", "reserved")
    assert found.killed_rows(w) == (10, 15)
    put("m", 2, 13)
    found = survey(lead)
    assert found is not None and (found.judge(k), found.judge(w)) == ("unsure", "unsure")
    lead.delete(AppendRecord.new("m" * 32, "t", 0, [[13, 15], [0, 2]], 13, holder).name())
    put("o", 5, 10, width=1)  # another shape, W's block
    found = survey(lead)
    assert found is not None and found.judge(w) == "unsure"


def test_unnamed_rows_skip_named_gaps_and_markers_past_the_length(tmp_path: Any) -> None:
    # kills unnamed_14 (a stretch cut at a marker's start broken) and _24 (empty stretches kept:
    # a marker past the length leaves none), judge_21 (a record of no rows judged as a block)
    # and judge_31 (a block starting at the end of another counted as a claim on it)
    import numpy as np

    from shardwise.durability.journal import WriteMarker, marker_name, now

    lead = _lead_array(tmp_path, np.zeros((30,), "i4"), 0, (4,))
    for name in lead.list(".shardwise/writes/"):
        lead.delete(name)
    for lo, hi in ((0, 10), (20, 30), (32, 40)):  # the last past the length (given back)
        m = WriteMarker(f"{lo:032d}", [[lo, hi]], [30], "open", now())
        lead.put(marker_name((slice(lo, hi),)), m.to_bytes())
    k = AppendRecord.new("k" * 32, "t", 0, [[10, 20]], 10, _gone_holder())
    lead.put(k.name(), k.to_bytes())
    found = survey(lead)
    assert found is not None and found.unnamed(k) == [(10, 20)]
    assert found.judge(k) == "reserved" and found.killed_rows(k) == (10, 20)
    assert found.unnamed(replace(k, seen=30)) == []
    assert found.judge(replace(k, region=[[10, 10]])) == "nothing"  # no rows
    after = AppendRecord.new("a" * 32, "t", 0, [[20, 24]], 20, asdict(LeaseInfo.new("append")))
    lead.put(after.name(), after.to_bytes())  # running, its block right after K's
    found = survey(lead)
    assert found is not None and found.judge(k) == "reserved"
    for rec in (k, after):
        lead.delete(rec.name())
    found = survey(lead)
    assert found is not None and found.judge(replace(k, region=[[10, 10]])) == "nothing"


def test_the_survey_lists_killed_appends_first_rows_first() -> None:
    # kills survey_29 (records in the order of their names, random tokens: a resume of the
    # first call's data would finish the second call's rows)
    store = _lead([90])
    later = AppendRecord.new("a" * 32, "t", 0, [[50, 90]], 50, _gone_holder())
    first = AppendRecord.new("z" * 32, "t", 0, [[10, 50]], 10, _gone_holder())
    for rec in (later, first):
        store.put(rec.name(), rec.to_bytes())
    found = survey(store)
    assert found is not None and [r for _, r in found.stale] == [first, later]


# -- issue 41: the survey's row count, blocks, rivals, boundaries, records and holders ----------


def test_a_records_row_count_is_along_its_own_axis() -> None:
    # kills rows' axis taken as 0 or the extent off by one: a killed append's block would be
    # another size than the rows its commit took
    rec = AppendRecord.new("k" * 32, "t", 1, [[0, 6], [10, 14]], 10, _gone_holder())
    assert rec.rows == 4
    store = _lead([6, 14])
    store.put(rec.name(), rec.to_bytes())
    found = survey(store)
    assert found is not None and found.block(rec) == (10, 14)
    assert found.unnamed(rec) == [(10, 14)]
    assert AppendRecord.new("k" * 32, "t", 0, [[3, 3]], 3, {}).rows == 0


def test_exact_and_old_format_blocks(tmp_path: Any) -> None:
    # kills from_bytes reading a record without "exact" as exact, and block's start for an
    # old-format record (the first unnamed row from seen on; the end when none is unnamed)
    import numpy as np

    from shardwise.durability.journal import WriteMarker, marker_name, now

    lead = _lead_array(tmp_path, np.zeros((40,), "i4"), 0, (4,))
    for name in lead.list(".shardwise/writes/"):
        lead.delete(name)
    m = WriteMarker("m" * 32, [[0, 12]], [40], "open", now())  # rows 0:12 named
    lead.put(marker_name((slice(0, 12),)), m.to_bytes())
    exact = AppendRecord.new("e" * 32, "t", 0, [[0, 8]], 4, _gone_holder())
    old = replace(exact, id="o" * 32, exact=False)
    legacy = {k: v for k, v in asdict(old).items() if k != "exact"}
    lead.put(exact.name(), exact.to_bytes())
    lead.put(old.name(), json.dumps(legacy).encode())
    assert AppendRecord.from_bytes(json.dumps(legacy).encode()) == old
    found = survey(lead)
    assert found is not None
    assert found.block(exact) == (4, 12)  # from what its commit grew from, named or not
    assert found.block(old) == (12, 20)  # the first unnamed row from seen on
    assert found.judge(exact) == "nothing"  # rows of its block are named: never committed
    # nothing unnamed from seen on: an old record's block starts at the end
    full = WriteMarker("f" * 32, [[12, 40]], [40], "open", now())
    lead.put(marker_name((slice(12, 40),)), full.to_bytes())
    found = survey(lead)
    assert found is not None and found.block(old) == (40, 48)
    assert found.judge(old) == "nothing"


def test_a_killed_append_of_one_shape_on_another_block_is_a_rival(tmp_path: Any) -> None:
    # kills judge's twins taken by shape alone (a killed append of K's shape whose block
    # overlaps K's but is not K's is a rival: one of the two never committed)
    import numpy as np

    x = np.zeros((90, 6), "i4")
    x[:10], x[70:] = 1, 5
    lead = _lead_array(tmp_path, x, 0, (4, 3))
    for name in lead.list(".shardwise/writes/"):
        lead.delete(name)
    k = AppendRecord.new("k" * 32, "t", 0, [[10, 50], [0, 6]], 10, _gone_holder())
    r = AppendRecord.new("r" * 32, "t", 0, [[30, 70], [0, 6]], 30, _gone_holder())
    assert r.fits(k.dim, k.axis, k.region)
    for rec in (k, r):
        lead.put(rec.name(), rec.to_bytes())
    found = survey(lead)
    assert found is not None and found.block(r) == (30, 70)
    assert found.judge(k) == "unsure" and found.judge(r) == "unsure"
    assert found.killed_rows(k) is None and found.killed_rows(r) is None
    # the same shape on the same block: a twin, K's block stands
    lead.delete(r.name())
    twin = replace(r, seen=10, region=[[10, 50], [0, 6]])
    lead.put(twin.name(), twin.to_bytes())
    found = survey(lead)
    assert found is not None and found.killed_rows(k) == (10, 50)


def test_a_block_ending_on_a_shard_boundary(tmp_path: Any) -> None:
    # kills holds_values' "start >= rows[1]" as ">" (a block that ends where the next shard
    # starts has no row to read: None, not "no values") and the boundary rounded down
    import numpy as np

    x = np.zeros((16, 2), "i4")
    x[:6] = 1
    x[8:12] = 9  # another tool's rows in the next shard
    st = _lead_array(tmp_path, x, 0, (4, 2))
    assert holds_values(st, 0, (6, 8)) is None  # rows 6:8 end on the boundary at 8
    assert holds_values(st, 0, (6, 9)) is True  # row 8 read: the other tool's value
    assert holds_values(st, 0, (12, 16)) is False  # a whole shard of fill
    assert holds_values(st, 0, (4, 8)) is True  # from the boundary at 4: rows 4:6 hold ones


def test_malformed_records_are_unreadable_not_blocks() -> None:
    # kills from_bytes accepting what it cannot judge: every malformed record is listed as
    # unreadable (verify reports it) and judged as no append's
    good = json.loads(_record([[10, 14], [0, 2]], seen=10).to_bytes())
    bad = {
        "not-json": b"{torn",
        "a-list": b"[1, 2]",
        "no-seen": json.dumps({k: v for k, v in good.items() if k != "seen"}).encode(),
        "negative-rows": json.dumps({**good, "region": [[14, 10], [0, 2]]}).encode(),
        "axis-out-of-range": json.dumps({**good, "axis": 5}).encode(),
        "region-not-pairs": json.dumps({**good, "region": [[10], [0, 2]]}).encode(),
    }
    store = _lead([14, 2])
    for name, raw in bad.items():
        assert AppendRecord.from_bytes(raw) is None, name
        store.put(f"{APPENDING}{name}.json", raw)
    found = survey(store)
    assert found is not None
    assert sorted(found.unreadable) == sorted(f"{APPENDING}{n}.json" for n in bad)
    assert found.stale == [] and found.running == [] and found.settled == []


def test_records_without_a_holder_are_killed_appends() -> None:
    # kills holder_may_run's "no holder: nothing to wait for" (a record without a readable
    # holder would be taken for a running append forever, and a resume refused)
    from shardwise.durability.appending import holder_may_run

    store = _lead([20])
    for token, holder in (("n", None), ("e", {}), ("x", {"pid": 1, "what": "?"})):
        rec = AppendRecord.new(token * 32, "t", 0, [[10, 20]], 10, holder)
        store.put(rec.name(), rec.to_bytes())
        assert holder_may_run(store, holder) is False
    found = survey(store)
    assert found is not None and found.running == [] and len(found.stale) == 3


def test_a_reused_process_id_is_not_the_appends_writer() -> None:
    # kills the start time dropped from holder_may_run's comparison with the shared leases (a
    # live shared lease of another process under the same pid would keep a killed append
    # running) and the shared leases not asked at all (a holder on another host whose
    # heartbeat is old, its process still renewing its shared lease on the array)
    from shardwise.durability.appending import holder_may_run
    from shardwise.durability.lease import SHARED

    store = _lead([20])
    me = LeaseInfo.new("region write")
    store.put(SHARED + me.token, me.to_bytes())  # this process writes the array, alive
    reused = asdict(replace(me, token="r" * 32, started=me.started + 1))
    assert holder_may_run(store, reused) is False  # another process that had this pid
    rec = AppendRecord.new("k" * 32, "t", 0, [[10, 20]], 10, reused)
    store.put(rec.name(), rec.to_bytes())
    found = survey(store)
    assert found is not None and [r for _, r in found.stale] == [rec]
    # on another host, judged by heartbeats: the record's is old, its shared lease's fresh
    far = replace(me, token="f" * 32, host="elsewhere", boot_id="b", renewed=1.0, expiry=60.0)
    assert holder_may_run(store, asdict(far)) is False  # no shared lease of that process
    lease = replace(far, token="l" * 32, renewed=me.renewed)
    store.put(SHARED + lease.token, lease.to_bytes())
    assert holder_may_run(store, asdict(far)) is True
    other = replace(far, started=far.started + 1)  # that pid, another process there
    assert holder_may_run(store, asdict(other)) is False


def test_verify_says_when_a_killed_append_started(tmp_path: Any) -> None:
    # kills new_7 (a record put without its start time: verify's report says "started None")
    import datetime

    import numpy as np

    import shardwise

    lead = _lead_array(tmp_path, np.zeros((8, 4), "i2"), 0, (4, 2))
    before = datetime.datetime.now(datetime.UTC)
    rec = AppendRecord.new("k" * 32, "t", 0, [[8, 12], [0, 4]], 8, _gone_holder())
    after = datetime.datetime.now(datetime.UTC)
    lead.put(rec.name(), rec.to_bytes())
    (problem,) = shardwise.verify(f"{tmp_path}/lead.zarr").problems
    assert problem.kind == "incomplete" and problem.key == lead.key(rec.name())
    said = problem.message.split(" started ", 1)[1].split(" did not finish")[0]
    started = datetime.datetime.fromisoformat(said)
    assert before - datetime.timedelta(seconds=1) <= started <= after


def test_a_resumed_append_along_one_axis_leaves_a_killed_append_along_another(
    tmp_path: Any,
) -> None:
    """An append along axis 1 was killed before its commit (its record says it, nothing of it
    is stored). An append along axis 0 with resume=True is not that append: its rows land at the
    end of axis 0, and verify still reports the killed one with the call that finishes it."""
    # kills fits_2 (a record of another dimension taken for this call's shape: the resumed
    # append along axis 0 would stand for the killed one along axis 1 and remove its record)
    import numpy as np

    import shardwise

    root = f"{tmp_path}/lead.zarr"
    lead = _lead_array(tmp_path, np.ones((8, 4), "i2"), 0, (4, 2))
    rec = AppendRecord.new("k" * 32, "axis 1", 1, [[0, 8], [4, 6]], 4, _gone_holder())
    rec = replace(rec, call="write_array")
    lead.put(rec.name(), rec.to_bytes())
    shardwise.write_array(np.full((2, 4), 3, "i2"), root, append_dim=0, resume=True)
    got = shardwise.read_array(root)
    assert got.shape == (10, 4) and (got[8:] == 3).all() and (got[:8] == 1).all()
    (problem,) = shardwise.verify(root).problems
    assert problem.kind == "incomplete" and problem.key == lead.key(rec.name())
    assert "append_dim=1, resume=True" in problem.message
    assert "stopped before it reserved them" in problem.message


def test_a_killed_append_of_one_row_is_judged_by_its_row(tmp_path: Any) -> None:
    """K appended one row at 12 (a shard boundary) and was killed before its markers; another
    tool then appended rows 13:16 (no marker). K's row is the first of its shard: it can be read,
    and decides. Fill there: K reserved it (verify says so, the resume finishes it there); a
    value there: another tool's row, K reserved nothing."""
    # kills judge_18 (a block of one row never read: unsure either way)
    import numpy as np

    import shardwise

    x = np.ones((16, 2), "i4")
    x[12], x[13:] = 0, 7
    lead = _lead_array(tmp_path, x, 0, (4, 2))
    for name in lead.list(".shardwise/writes/"):
        lead.delete(name)
    k = AppendRecord.new("k" * 32, "t", 0, [[12, 13], [0, 2]], 12, _gone_holder())
    lead.put(k.name(), k.to_bytes())
    found = survey(lead)
    assert found is not None and found.killed_rows(k) == (12, 13)
    (problem,) = shardwise.verify(f"{tmp_path}/lead.zarr").problems
    assert "an append of rows 12:13 along 't' (reserved, never written" in problem.message
    other = x.copy()
    other[12] = 5  # another tool's row where K's block would be
    lead = _lead_array(tmp_path / "o", other, 0, (4, 2))
    for name in lead.list(".shardwise/writes/"):
        lead.delete(name)
    lead.put(k.name(), k.to_bytes())
    found = survey(lead)
    assert found is not None and found.judge(k) == "nothing" and found.killed_rows(k) is None


def test_a_running_append_just_before_a_killed_ones_block_does_not_claim_it(
    tmp_path: Any,
) -> None:
    """K grew the lead from 12 to 15 and was killed before its markers; an append still running
    reserves rows 10:12, which end where K's begin. It claims no row of K's block: K's rows are
    reserved (the resume finishes them now), not "reserving" (a resume refused until the other
    append is done)."""
    # kills judge_32 (a block ending at the start of K's taken as overlapping it)
    import numpy as np

    import shardwise

    x = np.zeros((15, 2), "i4")
    x[:10] = 1
    lead = _lead_array(tmp_path, x, 0, (4, 2))
    for name in lead.list(".shardwise/writes/"):
        lead.delete(name)
    k = AppendRecord.new("k" * 32, "t", 0, [[12, 15], [0, 2]], 12, _gone_holder())
    running = _record([[10, 12], [0, 2]], seen=10)  # this process: alive
    for rec in (k, running):
        lead.put(rec.name(), rec.to_bytes())
    found = survey(lead)
    assert found is not None and found.running == [running]
    assert found.judge(k) == "reserved" and found.killed_rows(k) == (12, 15)
    (problem,) = shardwise.verify(f"{tmp_path}/lead.zarr").problems
    assert "an append of rows 12:15 along 't' (reserved, never written" in problem.message
