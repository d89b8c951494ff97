"""The append records' parts the append and resume tests pass through without pinning them
(survivors of the mutation lane, `mutation/run.py durability/appending`): a record of no rows
reads back as a record, and a record whose axis the lead array does not have names no rows
(rather than failing the survey that verify and a resume run). Each test names the mutants it
kills. Real stores: zarr's MemoryStore.
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
