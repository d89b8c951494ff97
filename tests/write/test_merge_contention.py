"""Range merges under contention and kills (issue 44, item 5), on local files.

Eight processes update cells of the same two shards at once, every one held after its merge
until all eight have merged, so their commits collide: every update lands (0 lost), and the
redone merges prove the race. A hundred merges SIGKILLed at drawn points (a drawn step of the
merge, in a drawn one of the four shards it merges): after each kill every shard reads back
whole as it was before or as the update made it, never a mix, and verify finds no damaged or
missing shard. Deterministic: barriers and the merge's own steps, no timing.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np

import shardwise
from faultkit import forkserver

CHUNK, PER_SHARD = 4096, 8  # 4 KiB inner chunks of random bytes, 8 to a 32 KiB shard
SHARD = CHUNK * PER_SHARD
WRITERS = 8


def created(root: Path, shards: int) -> np.ndarray:
    values = np.random.default_rng(7).integers(0, 256, shards * SHARD, dtype="u1")
    shardwise.write_array(values, root, path="a", chunks=(CHUNK,), shards=(SHARD,))
    return values


def cells(k: int, shard: int) -> slice:
    """Writer ``k``'s cells in ``shard``: 8 bytes inside inner chunk ``k`` (merged in part)."""
    a = shard * SHARD + k * CHUNK + 100
    return slice(a, a + 8)


def _updater(root: str, k: int, meet: Any, out: Any) -> None:
    """Writer ``k``: its cells of both shards in one RegionWriter commit, held after its
    first merge of each shard until every writer has merged that shard (``meet``: a barrier
    per shard), so their commits of it collide."""
    from shardwise.storage import conditional as cond

    redone = []

    def hold(name: str, attempt: int) -> None:
        if not name.startswith("c/"):
            return  # a journal object's commit
        if attempt == 0:
            meet[int(name.rpartition("/")[2])].wait(timeout=300)
        else:
            redone.append(name)

    cond.before_commit = hold
    try:
        with shardwise.RegionWriter(root, path="a") as w:
            for shard in (0, 1):
                w.write((cells(k, shard),), 200 + k)
        assert w.report is not None
        out.put((k, len(redone), sorted(set(w.report.merges)), ""))
    except Exception as e:  # reported, and fails the test
        out.put((k, -1, [], f"{type(e).__name__}: {e}"))


def test_eight_processes_merging_the_same_shards_by_ranges_lose_nothing(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    want = created(root, 2)
    ctx = forkserver()
    meet, out = [ctx.Barrier(WRITERS) for _ in (0, 1)], ctx.Queue()
    jobs = [ctx.Process(target=_updater, args=(str(root), k, meet, out)) for k in range(WRITERS)]
    for j in jobs:
        j.start()
    results = sorted(out.get(timeout=600) for _ in range(WRITERS))
    for j in jobs:
        j.join(timeout=60)
    assert all(err == "" for *_, err in results), results
    assert all(merges == ["local ranges"] for _, _, merges, _ in results), results
    # the race happened: of the 8 commits of each shard held together, 7 found it committed
    # by another writer and merged again
    assert sum(redone for _, redone, _, _ in results) >= 2 * (WRITERS - 1), results
    for k in range(WRITERS):
        for shard in (0, 1):
            want[cells(k, shard)] = 200 + k
    np.testing.assert_array_equal(shardwise.read_array(root, path="a"), want)
    assert shardwise.verify(root, path="a", strict=True).ok


# -- kills mid-merge ------------------------------------------------------------------------------

STEPS = ("temp", "copied", "commit", "committed")  # storage/splice.py's steps on local files
SHARDS = 4
KILLS = 100


def _killed(root: str, updates: list[tuple[int, int, np.ndarray]], at: str, nth: int) -> None:
    """Merge ``updates`` (start, stop, values: one region of each shard) in one commit, and
    SIGKILL this process when the merge of its ``nth`` shard reaches step ``at``."""
    import shardwise.storage.splice as splice

    seen = {"n": 0}
    lock = threading.Lock()

    def stop(name: str) -> None:
        if name == at:
            with lock:
                seen["n"] += 1
                if seen["n"] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)

    splice.step_hook = stop
    # no lease: a hundred killed holders' leases would make every next writer check them all
    with shardwise.RegionWriter(root, path="a", lease=False) as w:
        for a, b, v in updates:
            w.write((slice(a, b),), v)


def _pilot(conn: Any) -> None:
    """Forks one merger per request (``_killed``'s arguments) from a process that imported
    what a merge runs (a fresh process would spend most of a round importing) and started no
    thread; answers each with the merger's wait status."""
    import distributed  # noqa: F401  # what a write's scheduler choice imports

    import shardwise.write.regions  # noqa: F401

    assert threading.active_count() == 1  # nothing a fork would leave half-held
    while (job := conn.recv()) is not None:
        pid = os.fork()
        if pid == 0:
            try:
                _killed(*job)
            finally:
                os._exit(0)
        conn.send(os.waitpid(pid, 0)[1])


def draw_updates(rng: np.random.Generator, now: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """One region of each shard, 1 to 2 chunks long at a drawn offset, every byte changed."""
    out = []
    for s in range(SHARDS):
        a = s * SHARD + int(rng.integers(0, SHARD - CHUNK))
        b = a + int(rng.integers(1, min(2 * CHUNK, (s + 1) * SHARD - a)))
        out.append((a, b, (now[a:b] + rng.integers(1, 256, b - a)).astype("u1")))
    return out


def test_a_hundred_merges_killed_mid_merge_leave_each_shard_old_or_new(tmp_path: Path) -> None:
    root = tmp_path / "a.zarr"
    now = created(root, SHARDS)
    rng = np.random.default_rng(44)
    ctx = forkserver()
    conn, theirs = ctx.Pipe()
    pilot = ctx.Process(target=_pilot, args=(theirs,), daemon=True)  # gone if the test fails
    pilot.start()
    landed = 0
    for _ in range(KILLS):
        updates = draw_updates(rng, now)
        at, nth = STEPS[int(rng.integers(len(STEPS)))], int(rng.integers(1, SHARDS + 1))
        conn.send((str(root), updates, at, nth))
        status = conn.recv()
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        got = shardwise.read_array(root, path="a")
        for s, (a, b, v) in enumerate(updates):
            new = now[s * SHARD : (s + 1) * SHARD].copy()
            new[a - s * SHARD : b - s * SHARD] = v
            shard = got[s * SHARD : (s + 1) * SHARD]
            old = np.array_equal(shard, now[s * SHARD : (s + 1) * SHARD])
            assert old or np.array_equal(shard, new), (s, at, nth)
            landed += not old
        now = got
        report = shardwise.verify(root, path="a")
        assert {p.kind for p in report.problems} <= {"temp", "incomplete"}, report.problems
    conn.send(None)
    pilot.join(timeout=60)
    assert 0 < landed < KILLS * SHARDS  # kills before and after commits, both
