"""The fast lane's marks by whole words (``slowmarks.py``, applied by ``conftest.py``): tests
whose ids held a slow word inside another word (``kwargs3``, ``cuts3``, ``shards3``,
``key_ranges3``, ``s3fs`` hold "s3"; ``grace`` holds "race") are fast, among them the only fast
test of a session's ``resume=True`` refusal, and the slow ones stay slow: by the words of their
ids, and as pytest's own collection marks them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slowmarks import SLOWEST_FILES, file_order, is_slow

TESTS = Path(__file__).resolve().parents[1]

# ids once marked slow by a word inside another word, each fast (no process, server or cluster)
FAST = [
    "tests/core/test_layout.py::test_invalid_layouts_are_refused"
    "[shape3-shards3-chunks3-same number of dimensions]",
    "tests/durability/test_journal_mutants.py::"
    "test_a_record_checksums_the_whole_object_whatever_its_parts[True-cuts3]",
    "tests/durability/test_journal_mutants.py::"
    "test_a_record_checksums_the_whole_object_whatever_its_parts[False-cuts3]",
    "tests/durability/test_termination.py::test_stop_on_signals_refuses_bad_arguments"
    "[kwargs3-InvalidValueError-grace must be a positive number]",
    "tests/durability/test_termination.py::test_stop_on_signals_refuses_bad_arguments"
    "[kwargs4-InvalidTypeError-grace must be a positive number]",
    "tests/project/test_compat.py::test_installed_versions_are_inside_the_checked_range[s3fs]",
    "tests/storage/test_conditional.py::test_a_commit_lands_only_on_the_generation_it_read[s3fs]",
    "tests/storage/test_icechunk.py::test_refused_calls_leave_the_session_unchanged"
    "[kwargs3-InvalidValueError-resume=True]",
    "tests/storage/test_icechunk.py::test_every_writer_refuses_before_any_change"
    "[kwargs3-InvalidValueError-resume=True]",
    "tests/storage/test_overlay_store.py::TestOverlayOverMemoryStore::"
    "test_get_partial_values[key_ranges3]",
    "tests/storage/test_overlay_store.py::TestOverlayOverLocalStore::"
    "test_get_partial_values[key_ranges3]",
]

# slow ones, one for each slow word (as a word, a parameter, a plural) and a slow module
SLOW = [
    "tests/storage/test_icechunk.py::test_split_shards_on_worker_processes",
    "tests/integration/test_intent_mutants.py::"
    "test_the_job_asks_the_scheduler_the_write_runs_on[processes]",
    "tests/engine/test_full_loads.py::test_full_loads_benchmark_runs_small_in_fresh_processes",
    "tests/integration/test_consolidated.py::"
    "test_processes_adding_subtrees_at_once_all_stay_visible[local-2]",
    "tests/storage/test_conditional.py::"
    "test_six_processes_write_shard_splitting_slabs_without_the_check_lose_rows[local]",
    "tests/storage/test_icechunk_gaps.py::test_to_icechunk_on_the_processes_scheduler",
    "tests/integration/test_faults.py::test_rlimit_fsize_in_a_subprocess",
    "tests/storage/test_cloud_emulators.py::test_a_commit_lands_only_on_the_generation_it_read"
    "_on_azurite",
]


@pytest.mark.parametrize("nodeid", FAST)
def test_ids_with_a_slow_word_inside_another_are_fast(nodeid: str) -> None:
    assert not is_slow(nodeid)


@pytest.mark.parametrize("nodeid", SLOW)
def test_slow_ids_stay_slow(nodeid: str) -> None:
    assert is_slow(nodeid)


@pytest.mark.parametrize(
    ("nodeid", "slow"),
    [
        ("tests/x/test_a.py::test_on_s3", True),
        ("tests/x/test_a.py::test_write[s3]", True),
        ("tests/x/test_a.py::test_write[s3-local]", True),
        ("tests/x/test_a.py::test_on_a_cluster", True),
        ("tests/x/test_a.py::test_two_workers", True),
        ("tests/x/test_a.py::test_a_race_lost", True),
        ("tests/x/test_a.py::test_slurm_job_array_requeued", True),
        ("tests/x/test_a.py::test_cli_failures_exit_codes", True),
        ("tests/x/test_a.py::test_moto_server", True),
        ("tests/x/test_a.py::test_read_zep2_example", True),
        ("tests/x/test_faults.py::test_anything", True),
        ("tests/x/test_a.py::test_job_arrays_of_one", False),  # "job_array" then "s": no word
        ("tests/x/test_a.py::test_embrace_it", False),
        ("tests/x/test_a.py::test_traced_calls", False),
        ("tests/x/test_a.py::test_cli_failure", False),
        ("tests/x/test_a.py::test_s3fs_version", False),
        ("tests/x/test_a.py::test_one[kwargs3]", False),
        ("tests/x/test_a.py::test_processing_order", False),
        ("tests/x/test_a.py::test_one_worker_setting", False),
    ],
)
def test_whole_words_decide(nodeid: str, slow: bool) -> None:
    assert is_slow(nodeid) is slow


def test_the_collection_marks_them_so() -> None:
    """pytest's own collection of the fast lane (``-m "not slow"``) keeps the fast ids and
    leaves out the slow ones: the hook applies the rule."""
    ids = FAST[:6] + SLOW[:3]
    collect = ["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "not slow"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *collect, *ids],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    kept = {line.strip() for line in out.stdout.splitlines() if "::" in line}
    assert kept == set(FAST[:6]), out.stdout + out.stderr


def test_the_slowest_files_go_first_then_the_most_tests() -> None:
    """xdist hands out whole files in the collection's order: the listed slow files first in
    their order, then the others by their number of items (ties in the order found), every
    file's items in their own order."""
    slowest, second = SLOWEST_FILES[0], SLOWEST_FILES[1]
    ids = [
        "tests/a/test_one.py::t",
        "tests/a/test_three.py::t1",
        f"{second}::t1",
        "tests/a/test_three.py::t2",
        f"{slowest}::t",
        "tests/a/test_other_one.py::t",
        f"{second}::t2",
        "tests/a/test_three.py::t3",
    ]
    got = [ids[i] for i in file_order(ids)]
    assert got == [
        f"{slowest}::t",
        f"{second}::t1",
        f"{second}::t2",
        "tests/a/test_three.py::t1",
        "tests/a/test_three.py::t2",
        "tests/a/test_three.py::t3",
        "tests/a/test_one.py::t",
        "tests/a/test_other_one.py::t",
    ]


def test_the_slowest_files_exist() -> None:
    """A renamed or removed slow file would silently lose its place at the front."""
    missing = [f for f in SLOWEST_FILES if not (TESTS.parent / f).is_file()]
    assert missing == []


def test_xdist_hands_out_a_slow_file_first() -> None:
    """One xdist worker runs the files in the order they are handed out: a listed slow file
    first, before a file of more tests (which xdist's own reorder would put first)."""
    slow = "tests/integration/test_cli.py::test_inspect"
    assert slow.split("::")[0] in SLOWEST_FILES
    other = "tests/core/test_layout.py::test_invalid_layouts_are_refused"
    run = ["-n", "1", "--dist", "loadfile", "-v", "-p", "no:cacheprovider", other, slow]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *run],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    ran = [line.split()[-1] for line in out.stdout.splitlines() if " PASSED " in line]
    assert len(ran) > 2 and ran[0] == slow, out.stdout + out.stderr
