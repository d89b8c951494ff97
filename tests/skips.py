"""Every skip (and xfail) the suite expects, with the reason it is expected; and the pytest hooks
that hold the run to this list.

A skip hides a test that did not run. The ones listed here are known and explained; any other
one (a server that did not start, a package missing from the environment, a precondition of the
machine) is news. With ``CI=true`` in the environment (``.ci/run`` sets it) such a test FAILS,
naming itself and its skip reason; without it the test stays skipped and the terminal summary
lists it. Either way the summary ends with one line counting the skips per allowlisted entry.

An entry matches by module (the node id's file) and by the exact reason pytest reports (for an
xfail, its reason). ``conftest.py`` imports the hooks below; ``tests/project/test_skips.py``
runs them on a small suite of their own (``pytester``).
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import pytest

# -- the xarray suite (tests/xarray/test_xarray_suite.py): which of xarray's tests do not run ----

_ZARR_STORE = "uses xarray's ZarrStore directly (create_store / store.ds / ZarrStore.open_group)"
_DESIGN = "by design: "
_UNREACHED = "checks nothing of shardwise: "
_LAYOUT_CHUNKS = (
    "the stored layout does not follow the dask chunks, so chunks={} gives one chunk per shard"
)

# by test name, in both classes of the suite
XARRAY_SKIPPED: dict[str, str] = {
    # reach into xarray's own ZarrStore instead of the save/open hooks
    "test_write_store": _ZARR_STORE + ": dump_to_store into xarray's ZarrStore, decode_cf of it",
    "test_hidden_zarr_keys": _ZARR_STORE + ": edits attributes through ZarrStore.ds",
    "test_dimension_names": _ZARR_STORE + ": reads dimension names through ZarrStore.ds",
    "test_cache_members": _ZARR_STORE + ": tests ZarrStore's member cache",
    # intended differences from xarray's zarr engine and Dataset.to_zarr
    "test_warning_on_bad_chunks": _DESIGN
    + "preferred_chunks is the shard shape, so xarray warns for other chunks than it expects",
    "test_chunked_datetime64_or_timedelta64": _DESIGN + _LAYOUT_CHUNKS,
    "test_chunked_cftime_datetime": _DESIGN + _LAYOUT_CHUNKS,
    "test_chunk_encoding_with_dask": _DESIGN
    + "any dask chunking is written (irregular, or splitting inner chunks and shards) where "
    "xarray refuses it, and dask chunks over 1 MiB are not made the inner chunks",
    "test_shard_encoding_with_dask": _DESIGN
    + "dask chunks that split shards are written (one task per shard) instead of refused",
    # never reach shardwise (tests/xarray/conftest.py would fail them)
    "test_non_existent_store": _UNREACHED
    + "calls only xr.open_zarr, on a store that does not exist",
    # inherited tests without an assertion: they would count as passing whatever happens
    "test_encoding_kwarg_fixed_width_string": _UNREACHED + "asserts nothing (ZarrBase overrides "
    "it with `pass`: zarr does not use EncodedStringCoder)",
    "test_write_read_select_write": _UNREACHED
    + "asserts nothing: only that two writes do not raise",
}

# by test name, in TestShardwiseZarrSuiteSmallShards only
XARRAY_SKIPPED_SMALL_SHARDS: dict[str, str] = {
    "test_auto_chunk": "this class imposes its own small shards, so chunks={} gives them rather "
    "than the source's dask chunks",
    "test_chunk_auto_with_small_dask_chunks": "this class imposes its own small inner chunks, so "
    "xr.open_zarr gives them rather than the source's dask chunks",
}

# strict xfails: differences of shardwise.to_zarr from Dataset.to_zarr still to be resolved
XARRAY_KNOWN_FAILURES: dict[str, str] = {}

# -- xarray's DataTree Zarr tests (tests/xarray/test_datatree_suite.py): which do not run --------

_FORMAT_2 = (
    "Zarr format 2, which xarray's DataTree.to_zarr writes (shardwise writes format 3 only), "
)

# by test name, or by item name for one Zarr format ("name[zarr_format=2]"). The suite routes
# DataTree.to_zarr and Dataset.to_zarr to shardwise.to_zarr for format 3; its format-2 items
# test shardwise's reader of what xarray wrote, and those that read nothing with it are here
XARRAY_DATATREE_SKIPPED: dict[str, str] = {
    "test_to_zarr_not_consolidated[zarr_format=2]": _FORMAT_2
    + "read by the zarr engine, whose warning the test checks: nothing of shardwise runs",
    "test_zarr_engine_recognised[zarr_format=2]": _FORMAT_2
    + "read by the engine xarray picks for a .zarr path (its own): nothing of shardwise runs",
    "test_to_zarr_no_redundant_computation[zarr_format=2]": _FORMAT_2
    + "and no read: nothing of shardwise runs",
    "test_rplus_mode[zarr_format=2]": _FORMAT_2
    + "then written again with mode='r+', which shardwise refuses before writing anything "
    "(PlanError: the store holds Zarr format 2 metadata) where the test expects the write",
}


# -- the allowlist ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Allowed:
    """A skip (or xfail) that is expected: in ``module``, with exactly ``reason``."""

    name: str  # a short label for the summary line
    module: str  # the node id's file, from the rootdir
    reason: str  # exactly as pytest reports it
    why: str  # why it is expected (for readers of this file)
    when: Callable[[], bool] = lambda: True  # False: not expected on this machine


XARRAY_SUITE = "tests/xarray/test_xarray_suite.py"
DATATREE_SUITE = "tests/xarray/test_datatree_suite.py"
OVERLAY = "tests/storage/test_overlay_store.py"
READ_DIRECT = "tests/engine/test_read_load.py"

ALLOWED: list[Allowed] = [
    *(
        Allowed(
            "xarray suite: ZarrStore"
            if r.startswith(_ZARR_STORE)
            else "xarray suite: checks nothing of shardwise"
            if r.startswith(_UNREACHED)
            else "xarray suite: design",
            XARRAY_SUITE,
            r,
            "listed with its reason in XARRAY_SKIPPED",
        )
        for r in sorted({*XARRAY_SKIPPED.values(), *XARRAY_SKIPPED_SMALL_SHARDS.values()})
    ),
    *(
        Allowed("xarray suite: known failure", XARRAY_SUITE, r, "XARRAY_KNOWN_FAILURES")
        for r in XARRAY_KNOWN_FAILURES.values()
    ),
    *(
        Allowed("xarray DataTree suite", DATATREE_SUITE, r, "listed in XARRAY_DATATREE_SKIPPED")
        for r in sorted(set(XARRAY_DATATREE_SKIPPED.values()))
    ),
    Allowed(
        "xarray DataTree suite: xarray's xfails",
        DATATREE_SUITE,
        "upstream zarr read-only changes have broken this test",
        "xarray's xfail of its ZipStore test: zarr opens a ZipStore read-only with "
        "with_read_only, which ZipStore lacks, so both engines fail in zarr.open_group",
    ),
    # xarray's own marks in the tests ZarrBase inherits (xarray/tests/test_backends.py)
    Allowed(
        "xarray suite: xarray's marks",
        XARRAY_SUITE,
        "requires netcdf",
        "xarray's requires_netcdf imports a module named 'netcdf': pip finds no package of that "
        "name, and installing netCDF4 (another module name) leaves these skipped",
    ),
    *(
        Allowed(
            "xarray suite: xarray's marks", XARRAY_SUITE, r, "xarray skips it for every Zarr store"
        )
        for r in (
            "float32 will be treated as float64 in zarr",
            "No unlimited_dims handled in zarr.",
            "uint8 data can't be written to non-NetCDF4 data",
            "This works on pre ZDtype Zarr-Python, but fails after.",
        )
    ),
    *(
        Allowed("xarray suite: xarray's xfails", XARRAY_SUITE, r, "xarray's xfail for Zarr stores")
        for r in ("Bad _Unsigned attribute.", "Broken by Zarr 3.0.7")
    ),
    # zarr-python's StoreTests: the Overlay is an async store, without zarr's optional sync API
    *(
        Allowed(
            "zarr StoreTests: sync API",
            OVERLAY,
            f"store does not implement Supports{op}Sync",
            "the Overlay implements zarr's async Store API only; the suite skips the tests of "
            "the optional synchronous one",
        )
        for op in ("Get", "Set", "Delete")
    ),
    # platform skips: only where the platform really lacks it (CI runs on Linux)
    Allowed(
        "platform",
        READ_DIRECT,
        "Linux only",
        "reads /proc/self/smaps",
        lambda: not sys.platform.startswith("linux"),
    ),
    Allowed("platform", READ_DIRECT, "needs fork", "os.fork", lambda: not hasattr(os, "fork")),
    # code blocks of README.md and docs/**/*.md marked `<!-- docs-test: skip (REASON) -->` in the
    # document itself (each marker is reviewed there; test_docs.py refuses commands that must
    # never run unmarked): the one skip whose reason is a pattern
    Allowed(
        "docs: marked blocks",
        "tests/project/test_docs.py",
        r"re:(README|docs/[\w/-]+)\.md:\d+ not run: .+",
        "a block the document itself marks as not run, with its reason",
    ),
]


def allowed(nodeid: str, reason: str) -> Allowed | None:
    """The entry that expects a skip of ``nodeid`` with ``reason``, or None."""
    module = nodeid.split("::", 1)[0]
    for entry in ALLOWED:
        same = (
            re.fullmatch(entry.reason[3:], reason)
            if entry.reason.startswith("re:")
            else entry.reason == reason
        )
        if entry.module == module and same and entry.when():
            return entry
    return None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


# -- the hooks (conftest.py imports them) ----------------------------------------------------------

_counts = pytest.StashKey[Counter[str]]()
_unlisted = pytest.StashKey[list[tuple[str, str]]]()


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str | None:
    """The reason of a skipped or xfailed report (None when it is neither)."""
    if not report.skipped:
        return None
    wasxfail = getattr(report, "wasxfail", None)
    if wasxfail is not None:
        return str(wasxfail).removeprefix("reason: ")
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


_UNLISTED = "skipped outside the allowlist (tests/skips.py) while CI=true: "


def _judge(report: pytest.TestReport | pytest.CollectReport) -> None:
    """With CI=true a skip outside the allowlist fails its test, where it would have hidden
    (in the process that ran it: a worker's report reaches the run as failed)."""
    reason = skip_reason(report)
    if reason is None or allowed(report.nodeid, reason) is not None or not in_ci():
        return
    # the test fails where it would have hidden: its own report names it and the reason
    report.outcome = "failed"
    report.longrepr = (
        f"{_UNLISTED}{reason}\n"
        "fix the precondition, or add an entry that says why this skip is expected"
    )
    if hasattr(report, "wasxfail"):
        del report.wasxfail


def _count(config: pytest.Config, report: pytest.TestReport | pytest.CollectReport) -> None:
    """The summary's counts, from the reports the run logs (those of ``pytest -n`` workers
    too, which reach the controlling process as logged reports)."""
    text = str(report.longrepr) if report.failed else ""
    if _UNLISTED in text:
        reason = text.split(_UNLISTED, 1)[1].split("\n", 1)[0]
        config.stash.setdefault(_unlisted, []).append((report.nodeid, reason))
        return
    reason = skip_reason(report)
    if reason is None:
        return
    entry = allowed(report.nodeid, reason)
    if entry is not None:
        config.stash.setdefault(_counts, Counter())[entry.name] += 1
    else:
        config.stash.setdefault(_unlisted, []).append((report.nodeid, reason))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _judge(report)
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _judge(report)
    return report


class _Counts:
    """The hooks that count, bound to their run's config (a run inside a run, as
    ``tests/project/test_skips.py``'s, counts in its own)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        _count(self.config, report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        _count(self.config, report)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Counts(config), "shardwise-skip-counts")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    unlisted = config.stash.get(_unlisted, [])
    if unlisted and not in_ci():
        terminalreporter.write_line(
            f"skips outside the allowlist (tests/skips.py; CI=true fails them): {len(unlisted)}"
        )
        for nodeid, reason in unlisted:
            terminalreporter.write_line(f"  {nodeid}: {reason}")
    counts = config.stash.get(_counts, Counter())
    parts = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    terminalreporter.write_line(f"allowlisted skips: {sum(counts.values())} ({parts or 'none'})")
