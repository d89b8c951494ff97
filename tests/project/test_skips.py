"""The skip allowlist (``tests/skips.py``) run on a small suite of its own with ``pytester``: a skip
or xfail outside the list fails its test when ``CI=true`` and is listed (the test still skipped)
otherwise; listed skips are counted per entry on one summary line."""

from __future__ import annotations

from pathlib import Path

import pytest

import skips

# a test module placed where allowlisted skips are expected (the Overlay's zarr StoreTests), so
# the same skip reasons are in and out of the list depending on the test
MODULE = skips.OVERLAY
SUITE = """
import pytest

def test_listed():
    pytest.skip("store does not implement SupportsGetSync")

@pytest.mark.skipif(True, reason="store does not implement SupportsSetSync")
def test_listed_by_mark():
    pass

def test_unlisted():
    pytest.skip("the S3 server did not start")

@pytest.mark.xfail(reason="a regression nobody listed")
def test_unlisted_xfail():
    assert False

def test_runs():
    pass
"""
HOOKS = (
    "from skips import pytest_configure, pytest_make_collect_report, pytest_runtest_makereport, "
)
HOOKS += "pytest_terminal_summary\n"


def run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None, *more: str
) -> pytest.RunResult:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    # worker processes (``-n``) import the hooks' module from where this process did
    pytester.makeconftest(
        f"import sys; sys.path.insert(0, {str(Path(skips.__file__).parent)!r})\n" + HOOKS
    )
    path = pytester.path / MODULE
    path.parent.mkdir(parents=True)
    path.write_text(SUITE)
    # no:randomly: the report lists skips in run order, and the inner run reads no addopts
    # (pytest-randomly, when installed, would shuffle it whatever the outer run's order)
    return pytester.runpytest_inprocess(
        "-p",
        "no:cacheprovider",
        "-p",
        "no:asyncio",
        "-p",
        "no:randomly",
        "--import-mode=importlib",
        "-rA",
        *more,
        MODULE,
    )


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one process", "two workers"])
def test_a_skip_outside_the_list_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: tuple[str, ...]
) -> None:
    """Also with the tests in worker processes (``pytest -n``, as ``dev.sh test`` runs them):
    each worker fails its own unlisted skips, the run counts every worker's."""
    got = run(pytester, monkeypatch, "true", *workers)
    got.assert_outcomes(passed=1, skipped=2, failed=2)
    assert got.ret == pytest.ExitCode.TESTS_FAILED
    text = got.stdout.str()
    assert "FAILED " + MODULE + "::test_unlisted - skipped outside the allowlist" in text
    assert "while CI=true: the S3 server did not start" in text
    assert "FAILED " + MODULE + "::test_unlisted_xfail" in text
    assert "while CI=true: a regression nobody listed" in text
    assert "allowlisted skips: 2 (2 zarr StoreTests: sync API)" in text


@pytest.mark.parametrize("ci", [None, "false"])
def test_a_skip_outside_the_list_passes_with_a_report_otherwise(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    got = run(pytester, monkeypatch, ci)
    got.assert_outcomes(passed=1, skipped=3, xfailed=1)
    assert got.ret == pytest.ExitCode.OK
    got.stdout.fnmatch_lines(
        [
            "skips outside the allowlist (tests/skips.py; CI=true fails them): 2",
            f"  {MODULE}::test_unlisted: the S3 server did not start",
            f"  {MODULE}::test_unlisted_xfail: a regression nobody listed",
            "allowlisted skips: 2 (2 zarr StoreTests: sync API)",
        ]
    )


def test_a_listed_reason_is_listed_only_in_its_module() -> None:
    reason = "store does not implement SupportsGetSync"
    assert skips.allowed(f"{skips.OVERLAY}::TestOverlay::test_get_sync", reason) is not None
    assert skips.allowed("tests/storage/test_stores.py::test_get_sync", reason) is None
    # a platform skip is expected only where the platform lacks it (CI runs on Linux)
    linux_only = skips.allowed(f"{skips.READ_DIRECT}::test_x", "Linux only")
    assert (linux_only is None) == skips.sys.platform.startswith("linux")
