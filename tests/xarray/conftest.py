"""Accounting for xarray's own suite (``test_xarray_suite.py``): which items reach shardwise.

A test module asks for ``shardwise_calls`` to have its items counted. The fixture wraps the
doors into shardwise that xarray code can go through -- :func:`shardwise.to_zarr` and the
``engine="shardwise"`` backend's ``open_dataset`` and ``open_groups_as_dict`` (which
``xr.open_datatree`` and ``xr.open_groups`` reach) -- and counts the calls of each item. An
item that passes without a single call tested xarray, not shardwise: it is reported as failed,
so the number of passing items can never overstate what shardwise was tested for (an item that
cannot reach shardwise is skipped with its reason instead, and then does not run at all). The
terminal summary (``tests/reached.py``) says how many passing items reached shardwise.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable, Generator
from typing import Any

import pytest

import shardwise
from shardwise.xarray.backend import ShardwiseBackendEntrypoint

CALLS = pytest.StashKey[Counter[str]]()


def _counted(calls: Counter[str], door: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``, counting its calls in ``calls[door]``: only calls whose arguments bind, so an
    argument shardwise does not have (a TypeError before any of its code runs) is no visit."""
    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        signature.bind(*args, **kwargs)
        calls[door] += 1
        return func(*args, **kwargs)

    return wrapper


@pytest.fixture
def shardwise_calls(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Counter[str]:
    """Calls of ``shardwise.to_zarr`` and of the shardwise engine's ``open_dataset`` and
    ``open_groups_as_dict`` made by this test (counted per door); the item fails if it passes
    with none."""
    calls: Counter[str] = Counter()
    request.node.stash[CALLS] = calls
    monkeypatch.setattr(
        shardwise, "to_zarr", _counted(calls, "to_zarr", shardwise.to_zarr), raising=False
    )
    # a tree's open (open_datatree, open_groups) goes through open_groups_as_dict
    for door in ("open_dataset", "open_groups_as_dict"):
        opener = getattr(ShardwiseBackendEntrypoint, door)
        monkeypatch.setattr(ShardwiseBackendEntrypoint, door, _counted(calls, door, opener))
    return calls


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    calls = item.stash.get(CALLS, None)
    if calls is None or report.when != "call" or not report.passed or hasattr(report, "wasxfail"):
        return report
    if not calls:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} passed without reaching shardwise: no call of shardwise.to_zarr nor "
            "of the shardwise engine's open_dataset. It tested xarray only: route its writes and "
            "reads through shardwise, or skip it with the reason it cannot be."
        )
        return report
    # counted where the run reports (tests/reached.py), from worker processes too
    report.user_properties.append(("shardwise_calls", dict(calls)))
    return report
