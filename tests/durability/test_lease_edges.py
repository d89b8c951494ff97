"""The shared leases beside the exclusive one: breaking a stale lease on purpose removes what it
should and nothing else, and a refused writer leaves no lease object behind.

test_lease.py has the exclusive lease's rules; these are the edges between the two sides, on
local files and zarr's MemoryStore (and one store without conditional replace). The last section
pins what the mutation lane (`mutation/run.py durability/lease`) found untested: each test names
the mutants it kills.
"""

from __future__ import annotations

import datetime
import getpass
import json
import logging
import os
import pickle
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore, MemoryStore, WrapperStore

from faultkit import gone_pid, wait_until
from shardwise import LeaseHeldError
from shardwise.durability.holder import EXPIRY_ENV
from shardwise.durability.lease import (
    LEASE,
    SHARED,
    Lease,
    LeaseInfo,
    blocking_leases,
    break_lease,
    is_lease_key,
    leases_under,
    part_lease,
    read_lease,
    refuse_foreign,
    shared_leases,
)
from shardwise.storage.conditional import versions
from shardwise.storage.store import ShardStore, describe


@pytest.fixture(params=["local", "memory"])
def st(request: pytest.FixtureRequest, tmp_path: Path) -> ShardStore:
    if request.param == "local":
        return ShardStore(LocalStore(tmp_path / "a.zarr"), "arr")
    return ShardStore(MemoryStore(), "arr")


def _stale_exclusive(st: ShardStore) -> LeaseInfo:
    """An exclusive lease left by a job that is gone (its object, written as that job did)."""
    gone = LeaseInfo("0" * 32, "a crashed write", "elsewhere", 1, "someone", "2020-01-01")
    st.put(LEASE, gone.to_bytes())
    return gone


def test_acquire_shared_breaking_a_stale_lease_keeps_live_shared_leases(st: ShardStore) -> None:
    """A region writer that breaks a dead exclusive writer's lease must not remove the shared
    leases of the region writers still running beside it."""
    live = Lease.acquire_shared(st, purpose="a running region job")
    _stale_exclusive(st)
    with pytest.raises(LeaseHeldError, match="a crashed write"):
        Lease.acquire_shared(st, purpose="a new region job")
    assert set(shared_leases(st)) == {live.name}  # the refused writer removed its own
    mine = Lease.acquire_shared(st, purpose="a new region job", break_stale=True)
    assert read_lease(st) is None
    held = shared_leases(st)
    assert set(held) == {live.name, mine.name}
    assert held[live.name].purpose == "a running region job"
    assert held[mine.name].token == mine.info.token and mine.name == SHARED + mine.info.token
    # and so an exclusive writer is still kept out by the live region job
    with pytest.raises(LeaseHeldError, match="2 writers"):
        Lease.acquire(st, purpose="a replacing write")
    assert read_lease(st) is None  # the refused exclusive writer left nothing
    live.release()
    mine.release()
    assert shared_leases(st) == {}


def test_acquire_breaking_a_stale_lease_removes_the_shared_ones_too(st: ShardStore) -> None:
    """The exclusive side breaks on purpose everything that keeps it out."""
    Lease.acquire_shared(st, purpose="a dead region job")
    _stale_exclusive(st)
    with Lease.acquire(st, purpose="a replacing write", break_stale=True) as lease:
        held = read_lease(st)
        assert held is not None and held.token == lease.info.token
        assert shared_leases(st) == {}
    assert read_lease(st) is None


def test_break_lease_returns_the_holder_it_removed(st: ShardStore) -> None:
    assert break_lease(st) is None  # nothing held
    region = Lease.acquire_shared(st, purpose="a region job")
    got = break_lease(st, shared=False)
    assert got is None and set(shared_leases(st)) == {region.name}  # shared left alone
    got = break_lease(st)
    assert got is not None and got.purpose == "a region job"  # only shared ones: one of them
    assert shared_leases(st) == {}
    Lease.acquire_shared(st, purpose="another region job")
    gone = _stale_exclusive(st)
    assert break_lease(st) == gone  # the exclusive holder comes first
    assert read_lease(st) is None and shared_leases(st) == {}


# -- who holds it, as a refused writer is told -----------------------------------------------------


def test_lease_info_new_and_its_stored_form(monkeypatch: pytest.MonkeyPatch) -> None:
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    info = LeaseInfo.new("a job")
    after = datetime.datetime.now(datetime.UTC)
    assert (info.purpose, info.host, info.pid) == ("a job", socket.gethostname(), os.getpid())
    assert info.user == getpass.getuser() and len(info.token) == 32
    since = datetime.datetime.fromisoformat(info.since)
    assert since.utcoffset() == datetime.timedelta(0) and before <= since <= after
    assert info.since == since.isoformat(timespec="seconds")
    stored = info.to_bytes()
    assert list(json.loads(stored)) == sorted(json.loads(stored))  # the same bytes every time
    assert stored == json.dumps(json.loads(stored), sort_keys=True).encode()

    def no_passwd_entry() -> str:
        raise KeyError("getpwuid(): uid not found")

    monkeypatch.setattr(getpass, "getuser", no_passwd_entry)  # a container without /etc/passwd
    assert LeaseInfo.new("a job").user == "?"


def test_an_unreadable_lease_object_is_described_as_such() -> None:
    unreadable = LeaseInfo("?", "unreadable lease object", "?", -1, "?", "?")
    for raw in (b"not json", b'{"token": "t"}', b"[1, 2]"):
        assert LeaseInfo.from_bytes(raw) == unreadable
    assert unreadable.describe() == "'unreadable lease object' by ?@? pid -1 since ?"


def test_describe_says_whether_the_holder_runs_on_this_host() -> None:
    here = socket.gethostname()

    def on(host: str, pid: int) -> str:
        return LeaseInfo("t", "job", host, pid, "u", "2020").describe()

    assert on(here, os.getpid()) == f"'job' by u@{here} pid {os.getpid()} (running) since 2020"
    assert on(here, 1) == f"'job' by u@{here} pid 1 (running) since 2020"
    gone = gone_pid()
    assert on(here, gone) == f"'job' by u@{here} pid {gone} (that process is gone) since 2020"
    assert on(here, 0) == f"'job' by u@{here} pid 0 since 2020"  # not a process id
    assert on("elsewhere", os.getpid()) == f"'job' by u@elsewhere pid {os.getpid()} since 2020"


def _message(st: ShardStore, name: str, who: str, where: str = "") -> str:
    return (
        f"{where or describe(st.store, st.path)} is being written by another job: lease "
        f"{st.key(name)!r} held for {who}. If that job is gone, break the lease on "
        "purpose: break_lease=True (shardwise lease PATH --break), or turn leasing off "
        "with lease=False."
    )


@pytest.mark.parametrize("where", ["", "the array 'temperature'"])
def test_refusals_name_the_lease_its_holder_and_the_way_out(st: ShardStore, where: str) -> None:
    first = Lease.acquire(st)
    assert first.info.purpose == "write"  # the default purpose
    with pytest.raises(LeaseHeldError) as err:
        Lease.acquire(st, purpose="two", where=where) if where else Lease.acquire(st)
    assert str(err.value) == _message(st, LEASE, first.info.describe(), where)
    with pytest.raises(LeaseHeldError) as err:
        Lease.acquire_shared(st, where=where) if where else Lease.acquire_shared(st)
    assert str(err.value) == _message(st, LEASE, first.info.describe(), where)
    first.release()
    assert first.held is False
    a = Lease.acquire_shared(st)
    b = Lease.acquire_shared(st, purpose="b")
    assert a.info.purpose == "region write"  # the default purpose
    (name, holder), _ = sorted([(a.name, a.info), (b.name, b.info)])
    with pytest.raises(LeaseHeldError) as err:
        Lease.acquire(st, where=where)
    assert str(err.value) == _message(st, name, f"{holder.describe()} (2 writers)", where)


def test_part_leases_ignore_shared_leases_and_break_only_themselves(st: ShardStore) -> None:
    region = Lease.acquire_shared(st, purpose="a region job")
    part = part_lease(0, 2)
    stale = LeaseInfo("1" * 32, "a dead part", "elsewhere", 1, "u", "2020")
    st.put(part, stale.to_bytes())
    with Lease.acquire(st, name=part, break_stale=True) as mine:  # the region job is no reason
        held = read_lease(st, part)
        assert held is not None and held.token == mine.info.token
    assert set(shared_leases(st)) == {region.name}
    st.put(part, stale.to_bytes())
    assert break_lease(st, part) == stale and read_lease(st, part) is None
    assert set(shared_leases(st)) == {region.name}  # breaking a part lease leaves them


# -- the create, on stores that fail or lose it ----------------------------------------------------


class FlakyCreates(WrapperStore[Store]):
    """A store whose conditional creates fail ``fail`` times (the request errs, nothing is
    stored), or, with ``lose``, answer success without storing anything."""

    def __init__(self, store: Store, fail: int = 0, lose: bool = False) -> None:
        super().__init__(store)
        self.fail, self.lose, self.calls = fail, lose, 0

    async def set_if_not_exists(self, key: str, value: Any) -> None:
        self.calls += 1
        if self.calls <= self.fail:
            raise PermissionError(f"flaky create of {key}")
        if not self.lose:
            await self._store.set_if_not_exists(key, value)


def test_a_failed_create_is_tried_four_times() -> None:
    flaky = FlakyCreates(MemoryStore(), fail=3)
    with Lease.acquire(ShardStore(flaky, "arr")) as lease:
        assert flaky.calls == 4 and lease.held
    flaky = FlakyCreates(MemoryStore(), fail=4)
    with pytest.raises(PermissionError, match="flaky create"):
        Lease.acquire(ShardStore(flaky, "arr"))
    assert flaky.calls == 4 and read_lease(ShardStore(flaky, "arr")) is None


def test_a_lease_that_vanished_after_its_create_is_not_taken() -> None:
    st = ShardStore(FlakyCreates(MemoryStore(), lose=True), "arr")
    with pytest.raises(LeaseHeldError) as err:
        Lease.acquire(st)
    assert str(err.value) == _message(st, LEASE, "an unknown writer (the lease vanished)")


# -- survivors of the mutation lane (`mutation/run.py durability/lease`) --------------------------


def test_renew_rewrites_the_heartbeat_of_the_lease_it_holds(tmp_path: Path) -> None:
    # kills renew_19 (the conditional rewrite refused: the heartbeat never stored) and renew_39
    # (a lease still held read as lost)
    st = ShardStore(LocalStore(tmp_path), "arr")
    with Lease.acquire(st) as lease:
        before = read_lease(st)
        assert before is not None and before.token == lease.info.token
        # the clock past the first stamp, so the renewed one is later whatever its resolution
        wait_until(lambda: time.time() > before.renewed, "the clock to move")
        assert lease.renew() is True
        after = read_lease(st)
        assert after is not None and after.token == lease.info.token
        assert after.renewed == lease.info.renewed > before.renewed


def test_a_takeover_refused_by_a_live_shared_lease_names_that_lease(tmp_path: Path) -> None:
    # kills acquire_28 (the refusal names no lease)
    st = ShardStore(LocalStore(tmp_path), "arr")
    live = Lease.acquire_shared(st, purpose="a running region job")
    try:
        (name,) = shared_leases(st)
        with pytest.raises(LeaseHeldError) as err:
            Lease.acquire(st, takeover=True)
        # and its holder (acquire_33)
        assert str(err.value) == _message(st, name, f"{live.info.describe()} (1 writers)")
        assert read_lease(st) is None and set(shared_leases(st)) == {name}
    finally:
        live.release()


def _gone_shared(st: ShardStore) -> LeaseInfo:
    """A shared lease left by a region job on another host, silent since 2020: provably gone."""
    gone = LeaseInfo("0" * 32, "a dead region job", "elsewhere", 1, "u", "2020-01-01")
    st.put(SHARED + gone.token, gone.to_bytes())
    return gone


def test_only_a_takeover_drops_a_gone_writers_shared_lease(
    st: ShardStore, caplog: pytest.LogCaptureFixture
) -> None:
    # kills acquire_68 (gone shared leases dropped without takeover), _drop_gone_shared_10
    # (the takeover recorded without its reason) and _started_3 (the warning without it)
    caplog.set_level(logging.WARNING, logger="shardwise")
    gone = _gone_shared(st)
    with pytest.raises(LeaseHeldError, match="a dead region job"):
        Lease.acquire(st)  # no resume: nothing is taken over, whoever held it
    assert read_lease(st) is None and shared_leases(st) == {SHARED + gone.token: gone}
    with Lease.acquire(st, takeover=True) as lease:
        (took,) = lease.took_over
        assert (took.name, took.holder) == (st.key(SHARED + gone.token), gone)
        assert took.reason.startswith("no heartbeat for "), took.reason
        assert shared_leases(st) == {}
    assert f"{describe(st.store, st.path)}: {took}" in caplog.messages


def test_a_shared_takeover_removes_the_gone_exclusive_lease(st: ShardStore) -> None:
    # kills acquire_shared_48 (the exclusive lease, taken over for a moment, kept)
    gone = _stale_exclusive(st)
    with Lease.acquire_shared(st, takeover=True) as mine:
        (took,) = mine.took_over
        assert (took.name, took.holder) == (st.key(LEASE), gone)
        assert read_lease(st) is None and set(shared_leases(st)) == {mine.name}


def test_leases_under_a_path_and_those_that_block(st: ShardStore) -> None:
    # kills leases_under_4 (array=True lists the leases below the array too) and
    # blocking_leases_10 (a kept lease blocks all the same)
    gone, shared = _stale_exclusive(st), _gone_shared(st)
    child = ShardStore(st.store, st.key("child"))
    child.put(LEASE, shared.to_bytes())
    own = {LEASE: gone, SHARED + shared.token: shared}
    assert leases_under(st, array=True) == own
    assert leases_under(st) == {**own, "child/" + LEASE: shared}
    assert blocking_leases(st, array=True) == own
    assert blocking_leases(st, array=True, keep=[LEASE]) == {SHARED + shared.token: shared}
    assert blocking_leases(st, keep=[LEASE, SHARED, "child/"]) == {}
    assert blocking_leases(st, broken=True) == {} == blocking_leases(st, takeover=True)


def test_the_lock_a_takeover_leaves_is_no_lease(tmp_path: Path) -> None:
    # kills is_lease_key_11 (the journal found by its last ".shardwise": the lock file of the
    # takeover's conditional replace, .shardwise/locks/.shardwise/lease, read as a lease)
    st = ShardStore(LocalStore(tmp_path), "arr")
    _stale_exclusive(st)
    with Lease.acquire(st, takeover=True) as lease:
        assert lease.took_over
    assert st.list(".shardwise/locks") == [".shardwise/locks/" + LEASE]
    assert leases_under(st) == {} and blocking_leases(st) == {}
    assert not is_lease_key("arr/.shardwise/locks/.shardwise/lease")
    assert not is_lease_key("arr/.shardwise/writes/0123.json")  # a write marker (_21)
    assert is_lease_key("arr/.shardwise/lease") and is_lease_key("arr/.shardwise/leases/t")


def test_a_refusal_without_takeover_counts_gone_and_live_shared_leases(st: ShardStore) -> None:
    # kills acquire_18 (the live shared leases alone looked for without a takeover too)
    gone = _gone_shared(st)  # its name sorts before any live one's
    with Lease.acquire_shared(st):
        with pytest.raises(LeaseHeldError) as err:
            Lease.acquire(st)
        assert str(err.value) == _message(st, SHARED + gone.token, f"{gone.describe()} (2 writers)")
    assert read_lease(st) is None


def test_a_takeover_judges_a_holder_by_the_expiry_it_is_given(
    st: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # kills _take_over_7 and acquire_shared_38 (a holder that promised no expiry of its own
    # judged by the default, 300 s, not by the expiry the taking writer gives)
    monkeypatch.delenv(EXPIRY_ENV, raising=False)
    silent = replace(_stale_exclusive(st), renewed=time.time() - 150)  # no expiry of its own
    for take in (Lease.acquire, Lease.acquire_shared):
        st.put(LEASE, silent.to_bytes())
        with pytest.raises(LeaseHeldError):
            take(st, takeover=True)  # 150 s without a heartbeat: within the default
        with take(st, takeover=True, expiry=30) as lease:
            assert [t.holder for t in lease.took_over] == [silent]
        assert read_lease(st) is None and shared_leases(st) == {}


class RetakenWhenFreed(MemoryStore):
    """Memory where another writer creates the exclusive lease ``lease`` the moment the one
    there is deleted (its create lands right after a takeover released the lease)."""

    lease = b""

    async def delete(self, key: str) -> None:
        await super().delete(key)
        if key == f"arr/{LEASE}" and self.lease:
            data, self.lease = self.lease, b""
            await self.set(key, default_buffer_prototype().buffer.from_bytes(data))


def test_a_shared_takeover_is_refused_by_a_writer_that_took_the_freed_lease() -> None:
    # kills acquire_shared_53 (the exclusive lease not read again after the takeover freed it)
    zs = RetakenWhenFreed()
    st = ShardStore(zs, "arr")
    _stale_exclusive(st)
    nxt = LeaseInfo.new("the next exclusive write")
    zs.lease = nxt.to_bytes()
    with pytest.raises(LeaseHeldError, match="the next exclusive write"):
        Lease.acquire_shared(st, takeover=True)
    assert read_lease(st) == nxt and shared_leases(st) == {}


def test_mode_w_is_refused_naming_the_first_foreign_lease() -> None:
    # kills refuse_foreign_4 (the second lease named, none when there is one)
    refuse_foreign([])
    for found in (["b/.shardwise/lease"], ["b/.shardwise/lease", "a/.shardwise/lease"]):
        with pytest.raises(LeaseHeldError) as err:
            refuse_foreign(found)
        first = sorted(found)[0]
        assert str(err.value).startswith(f"mode='w' would delete {first!r}, the lease of")
        assert f"({len(found)} such leases)" in str(err.value)


def test_a_copy_of_a_held_lease_carries_no_heartbeat(tmp_path: Path) -> None:
    # kills __getstate___1 (the heartbeat thread pickled with the copy)
    with Lease.acquire(ShardStore(LocalStore(tmp_path), "arr")) as lease:
        copy = pickle.loads(pickle.dumps(lease))
        assert copy._beat is None and lease._beat is not None
        assert (copy.name, copy.info, copy.held) == (lease.name, lease.info, True)


def test_renew_on_a_store_without_conditional_replace() -> None:
    # kills renew_24 (the lease read from no store) and renew_29 (the heartbeat put elsewhere)
    st = ShardStore(WrapperStore(MemoryStore()), "arr")
    assert versions(st) is None  # check, then put
    with Lease.acquire(st) as lease:
        st.put(LEASE, replace(lease.info, renewed=0.0).to_bytes())
        assert lease.renew() is True
        assert read_lease(st) == lease.info and lease.info.renewed > 0


def test_a_release_racing_the_holders_renewal_leaves_no_lease(tmp_path: Path) -> None:
    """A copy of a lease (the finish of a ``compute=False`` write on a worker) releases it while
    the holder's heartbeat rewrites it. The release's delete goes through the same lock as the
    renewal's replace and is conditional on the version it judged: here it is made to wait on
    that lock while a renewal replaces the lease, then it judges the renewed lease again and
    deletes it. (An unconditional delete landing between a renewal's check and its replace
    put the lease back, held by nobody, refusing every later write.)"""
    import threading

    from shardwise.storage.conditional import LOCKS, file_lock

    st = ShardStore(LocalStore(tmp_path), "arr")
    lease = Lease.acquire(st, expiry=600)  # its own beat every 150 s: none in this test
    copy = pickle.loads(pickle.dumps(lease))
    path = tmp_path / st.key(LEASE)
    released = threading.Thread(target=copy.release)

    def waiting_on_the_lock() -> bool:
        frame = sys._current_frames().get(released.ident or -1)
        while frame is not None and frame.f_code.co_name != "file_lock":
            frame = frame.f_back
        return frame is not None

    with file_lock(tmp_path / st.key(LOCKS + LEASE)):  # a renewal's commit, under way
        released.start()
        wait_until(waiting_on_the_lock, "the release to wait on the commit lock")
        assert read_lease(st) == lease.info  # not deleted behind the renewal's back
        renewed = replace(lease.info, renewed=lease.info.renewed + 1)
        tmp = path.with_name("renewed.tmp")
        tmp.write_bytes(renewed.to_bytes())
        os.replace(tmp, path)  # the renewal's replace
    released.join(120)
    assert not released.is_alive()
    assert read_lease(st) is None and not path.exists()
    lease.release()  # the holder's own release then finds nothing to remove
    assert read_lease(st) is None
