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
