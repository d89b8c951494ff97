"""Which tests are slow in the fast lane (``pytest -m "not slow"``) without a mark of their own.

Whole modules that start clusters, processes or servers, or run xarray's own backend suite
(:data:`SLOW_MODULES`), and single tests whose id has one of :data:`SLOW_WORDS` as a whole word:
the id's words are its runs of letters and digits (``test_six_processes_write[local-2]`` has
``six``, ``processes``, ``local``, ``2`` ...), and a slow "word" of two (``job_array``) matches
those two words in a row. A word inside another never counts: ``kwargs3``, ``cuts3`` and
``shards3`` hold no ``s3``, ``grace`` no ``race``, ``s3fs`` no ``s3``.
"""

from __future__ import annotations

import re

SLOW_MODULES = frozenset(
    {
        "test_faults.py",
        "test_xarray_suite.py",
        "test_notebook.py",
        "test_demo.py",
        "test_benchmarks.py",
        "test_cloud_emulators.py",
    }
)
# tests that start worker processes, the S3 server or Jupyter (picked from the durations
# `dev.sh test` prints), by the words their names use for it
SLOW_WORDS = (
    "cluster",
    "clusters",
    "workers",
    "s3",
    "process",
    "processes",
    "subprocess",
    "zep2",
    "job_array",
    "cli_failures",
    "race",
    "races",
    "moto",
)


def words(nodeid: str) -> str:
    """The id's words joined by ``_``, with one ``_`` before and after: whole words are then
    found as ``_word_``."""
    return "_" + "_".join(w for w in re.split(r"[^a-z0-9]+", nodeid.lower()) if w) + "_"


def is_slow(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (``path/test_x.py::test_name[params]``) is in the slow lane
    by its module or its words (tests marked slow where they are defined are too)."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    joined = words(nodeid)
    return module in SLOW_MODULES or any(f"_{w}_" in joined for w in SLOW_WORDS)


# -- the order of the files under xdist ------------------------------------------------------------
# `pytest -n 2 --dist loadfile` gives each worker whole files, in the order of the collection. The
# files that take longest go first, slowest first (the durations of a full CI run), so the last
# file a worker takes is a short one and the two workers finish together; the rest follow in the
# order xdist's own `--loadscope-reorder` gives (most tests first).
SLOWEST_FILES = (
    "tests/engine/test_million.py",
    "tests/project/test_benchmarks.py",
    "tests/integration/test_concurrent_appends.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_promises.py",
    "tests/engine/test_runs.py",
    "tests/hpc/test_slurm.py",
    "tests/xarray/test_append_resume.py",
    "tests/write/test_merge_ranges.py",
    "tests/integration/test_cli.py",
    "tests/storage/test_cloud_emulators.py",
)


def file_order(nodeids: list[str]) -> list[int]:
    """The order to run ``nodeids`` in (indices into it): the items of :data:`SLOWEST_FILES`
    first, in that order, then the other files by their number of items, most first; the items of
    one file keep their order, and so do files of as many items."""
    files = [n.split("::", 1)[0] for n in nodeids]
    counts: dict[str, int] = {}
    for f in files:
        counts[f] = counts.get(f, 0) + 1
    first = {f: i for i, f in enumerate(SLOWEST_FILES)}
    seen = {f: i for i, f in reversed(list(enumerate(files)))}  # a file's first position

    def key(i: int) -> tuple[int, int, int]:
        f = files[i]
        if f in first:
            return (first[f], 0, i)
        return (len(SLOWEST_FILES), -counts[f], seen[f])

    return sorted(range(len(nodeids)), key=lambda i: (*key(i), i))
