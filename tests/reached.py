"""The xarray suite's count of items that reached shardwise (``tests/xarray/conftest.py``), summed
where the run reports: each passing item that asked for ``shardwise_calls`` carries its calls in
its report (``user_properties``), so the count is the same when the items run in worker
processes (``pytest -n``). ``conftest.py`` registers :class:`Reached`."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

KEY = "shardwise_calls"  # the report property: {door: calls} of one passing item


class Reached:
    """Sums the calls of every passing item's report; one summary line pair at the end."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" or not report.passed:
            return
        for name, calls in report.user_properties:
            if name != KEY:
                continue
            self.counts["items"] += 1
            self.counts["items writing"] += calls.get("to_zarr", 0) > 0
            opens = calls.get("open_dataset", 0) + calls.get("open_groups_as_dict", 0)
            self.counts["items reading"] += opens > 0
            self.counts.update(calls)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        c = self.counts
        if not c:
            return
        terminalreporter.write_line(
            f"xarray suite: {c['items']} passed items reached shardwise "
            f"({c['to_zarr']} calls of shardwise.to_zarr, "
            f"{c['open_dataset'] + c['open_groups_as_dict']} opens with the shardwise engine)"
        )
        terminalreporter.write_line(
            f"  of which {c['items writing']} wrote with shardwise.to_zarr and "
            f"{c['items reading']} read with the shardwise engine"
        )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Reached(), "shardwise-reached")
