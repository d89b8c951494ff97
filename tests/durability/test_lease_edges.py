"""The shared leases beside the exclusive one: breaking a stale lease on purpose removes what it
should and nothing else, and a refused writer leaves no lease object behind.

test_lease.py has the exclusive lease's rules; these are the edges between the two sides, on
local files and zarr's MemoryStore.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from zarr.storage import LocalStore, MemoryStore

from shardwise import LeaseHeldError
from shardwise.durability.lease import (
    LEASE,
    SHARED,
    Lease,
    LeaseInfo,
    break_lease,
    read_lease,
    shared_leases,
)
from shardwise.storage.store import ShardStore


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
