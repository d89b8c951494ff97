"""The journal's shard records read back, and a run's records kept together.

A shard's own record (``.shardwise/shards/<key>``, :class:`~.journal.Record`) is put by the task
that stored it. A task writing a run of many shards of a write that creates its array keeps the
run's records in one object instead (``.shardwise/runs/<write id>-<token>.json``,
:class:`RunRecords`), put again every :data:`~shardwise.core.cost.RUN_FLUSH` shards and when the
task ends or fails. :func:`read_records` reads both, shard-exact, for verify, inspect and the
append give-back; :func:`read_run_records` one write's, for its resume.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..core.layout import Layout
from ..storage.store import TEMP, ShardStore
from .journal import IO_THREADS, RECORDS, RUNS, WriteMarker, read_markers
from .shardrecord import Record


def _run_records(data: bytes) -> tuple[str, dict[str, Record]] | None:
    """A run record object's time and records, None when it cannot be read."""
    try:
        d = json.loads(data)
        write, at = str(d["write"]), str(d["at"])
        recs = {
            str(k): Record(write, int(v[0]), int(v[1]), int(v[2])) for k, v in d["records"].items()
        }
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return at, recs


def read_records(
    store: ShardStore, unreadable: list[str] | None = None, layout: Layout | None = None
) -> dict[str, Record | None]:
    """Every shard record (None for an unreadable one), by shard key: the shards' own and
    those of runs (:class:`RunRecords`; a shard's own record wins, then the newest run's).
    ``unreadable``: gets the names of run record objects that cannot be read. With the
    array's ``layout``, a run's record of a shard stands only while no other write that
    started after the run put it touched the shard (it may have removed the shard, which
    leaves no record of its own)."""
    names = [n for n in store.list(RECORDS) if not TEMP.match(n)]
    runs = [n for n in store.list(RUNS) if not TEMP.match(n)]

    def load(name: str) -> Record | None:
        raw = store.get(name)
        return None if raw is None else Record.from_bytes(raw)

    def load_run(name: str) -> tuple[str, dict[str, Record]] | None:
        raw = store.get(name)
        return None if raw is None else _run_records(raw)

    with ThreadPoolExecutor(IO_THREADS) as pool:
        recs = list(pool.map(load, names))
        got = list(pool.map(load_run, runs))
    out: dict[str, Record | None] = {}
    later = _later_writes(store, got) if layout is not None else []
    for at, run in sorted((g for g in got if g is not None), key=lambda g: g[0]):
        # the newest run's record of a shard last; none a later write may have removed
        out.update(run if not later else _standing(run, at, later, layout))
    if unreadable is not None:
        unreadable += [n for n, g in zip(runs, got, strict=True) if g is None]
    out.update({n[len(RECORDS) :]: r for n, r in zip(names, recs, strict=True)})
    return out


def recorded_keys(store: ShardStore, layout: Layout) -> set[str]:
    """The keys of every recorded shard: one listing of the shards' own records, and the run
    records (one object per run) read, as :func:`read_records` takes them."""
    own = {n[len(RECORDS) :] for n in store.list(RECORDS) if not TEMP.match(n)}
    got = [_run_records(raw) for n in _run_names(store, "") if (raw := store.get(n))]
    later = _later_writes(store, got)
    runs: set[str] = set()
    for at, recs in (g for g in got if g is not None):
        runs.update(recs if not later else _standing(recs, at, later, layout))
    return own | runs


def _run_names(store: ShardStore, write_id: str) -> list[str]:
    """The run record objects of write ``write_id`` ("": of every write)."""
    mine = f"{RUNS}{write_id}-" if write_id else RUNS
    return [n for n in store.list(RUNS) if n.startswith(mine) and not TEMP.match(n)]


def _later_writes(
    store: ShardStore, got: Sequence[tuple[str, dict[str, Record]] | None]
) -> list[WriteMarker]:
    """The markers of writes that started after the oldest of the runs ``got``."""
    times = [g[0] for g in got if g is not None]
    if not times:
        return []
    first = min(times)
    return [m for m in read_markers(store).values() if m is not None and (m.started or "") > first]


def _standing(
    recs: dict[str, Record], at: str, later: list[WriteMarker], layout: Layout | None
) -> dict[str, Record]:
    """The records of a run put at ``at`` that no write of ``later`` (markers) started after
    and touched: such a write may have removed the shard."""
    assert layout is not None
    after = [m for m in later if (m.started or "") > at]
    if not after:
        return recs
    out = {}
    for key, rec in recs.items():
        coord = layout.parse_shard_key(key)
        if coord is not None:
            box = [
                (layout.axis_bound(d, i), layout.axis_bound(d, i + 1)) for d, i in enumerate(coord)
            ]
            if any(m.id != rec.write and _meets(m.region, box) for m in after):
                continue
        out[key] = rec
    return out


def _meets(region: list[list[int]], box: list[tuple[int, int]]) -> bool:
    return len(region) == len(box) and all(
        a < hi and lo < b for (a, b), (lo, hi) in zip(region, box, strict=True)
    )


def read_run_records(store: ShardStore, write_id: str) -> dict[str, Record]:
    """The records the runs of write ``write_id`` put, by shard key (newest run's last; ""
    for every write's)."""
    runs = _run_names(store, write_id)
    got = []
    for name in runs:
        raw = store.get(name)
        parsed = None if raw is None else _run_records(raw)
        if parsed is not None:
            got.append(parsed)
    out: dict[str, Record] = {}
    for _, recs in sorted(got, key=lambda g: g[0]):
        out.update(recs)
    return out


def cut_run_records(store: ShardStore, drop: Callable[[str], bool]) -> int:
    """Take the records of the shards ``drop`` says out of every run record object (the
    shards removed: a stream's rows past its stored length, on resume); an object left empty
    is deleted, the others put again as they were otherwise (their time kept). Returns the
    records taken out."""
    cut = 0
    for name in _run_names(store, ""):
        raw = store.get(name)
        try:
            doc = json.loads(raw) if raw is not None else None
        except ValueError:
            continue
        recs = doc.get("records") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not isinstance(recs, dict):
            continue
        kept = {k: v for k, v in recs.items() if not drop(k)}
        if len(kept) == len(recs):
            continue
        cut += len(recs) - len(kept)
        if kept:
            doc["records"] = kept
            store.put(name, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
        else:
            store.delete(name)
    return cut
