"""The suites of ``page.py``: which script runs, with which options at each size, which of its
cases belong to which tool, and how its JSON lines become the page's rows.

A suite is a declaration (``Suite``, the catalogue in ``page_catalog.py``): the script and its
options per size (``{dir}`` stands for the stores' directory), the cases with their tool, and a
row function that reads one of the script's JSON lines. Each suite runs its script as the
script's own usage line shows, so the measurement (fresh processes, interleaved repetitions, the
check of every store) is the script's. A row of the page is ``dict(table, tool, case, what, s,
whole, ok)``: ``s`` the figure the script reports for the case (in-process seconds unless the
suite's ``unit`` says otherwise), ``whole`` its whole-process seconds where the script measures
them. ``limit`` rows are the machine's limit for the same bytes, where the script measures one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = ("tiny", "quick", "full")

# tool -> (the module its cases import, the distribution its version is read from, what it is)
TOOLS: dict[str, tuple[str, str, str]] = {
    "shardwise": ("shardwise", "shardwise", "this project"),
    "tensorstore": ("tensorstore", "tensorstore", "Google's C++ Zarr library"),
    "zarr-python": ("zarr", "zarr", "the reference Python implementation"),
    "xarray": ("xarray", "xarray", "xarray's own to_zarr/open_zarr (zarr-python under it)"),
    "zarrista": ("zarrista", "zarrista", "Python bindings of the Rust zarrs crate"),
    "ngff-zarr": ("ngff_zarr", "ngff-zarr", "OME-Zarr multiscales"),
    "ome-zarr": ("ome_zarr", "ome-zarr", "ome-zarr-py's own multiscale writer (write_image)"),
    "icechunk": ("icechunk", "icechunk", "icechunk's own dask and xarray writers"),
    "acquire-zarr": ("acquire_zarr", "acquire-zarr", "a C++ streaming writer"),
}
# installed libraries the page lists with their versions (not tools of a table)
LIBS = ("dask", "distributed", "numpy", "numcodecs", "zstandard", "zarrs")
LIMIT = "limit"

Rec = dict[str, Any]
Row = dict[str, Any]


@dataclass(frozen=True)
class Suite:
    key: str
    title: str
    script: str
    about: str
    cases: dict[str, tuple[str, str]]  # case -> (tool or "limit", what it runs)
    args: dict[str, list[str]]  # size -> the script's argv (no cases, no --out); {dir}: stores
    row: Callable[[Suite, Rec], list[Row]]  # one JSON line -> its rows (no tool, no what)
    caption: Callable[[str, list[Rec]], str]  # a table's name, the JSON lines -> its arrays
    ref_case: str | None = None  # the case every ratio is taken to (default: shardwise's first)
    case_flag: str | None = "--cases"  # None: the script runs all its cases
    sized_cases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # size -> cases run
    prepare: dict[str, list[str]] = field(default_factory=dict)  # size -> a command run first
    source: tuple[str, ...] = ()  # rows read from these suites' results (nothing runs)
    limit: str = ""  # what the limit rows measure, when no case of ``cases`` is the limit
    unit: str = "s"  # of ``s``: seconds, or MiB for memory
    finish: Callable[[Suite, str, str, dict[str, str]], None] | None = None  # (size, out, env)

    @property
    def ref(self) -> str:
        return "shardwise"

    def argv(self, size: str, present: dict[str, bool], out: str, stores: str) -> list[str]:
        """The script's command line at ``size``: the cases of the tools that import."""
        wanted = self.sized_cases.get(size, tuple(self.cases))
        cases = [c for c in wanted if self.cases[c][0] == LIMIT or present[self.cases[c][0]]]
        cmd = [a.replace("{dir}", stores) for a in self.args[size]]
        if self.case_flag:
            cmd += [self.case_flag, ",".join(cases)]
        return [*cmd, "--out", out]


def rows(s: Suite, recs: list[Rec]) -> list[Row]:
    """The page's rows of one suite's JSON lines (the rows of failed cases have ``s=None``)."""
    out = []
    for r in recs:
        for row in s.row(s, r):
            case = row["case"]
            if case in s.cases:
                row["tool"], row["what"] = s.cases[case]
            elif case == LIMIT:
                row["tool"], row["what"] = LIMIT, s.limit
            else:
                continue
            out.append(row)
    return out


def row(table: str, case: Any, s: Any, whole: Any = None, ok: Any = True) -> Row:
    return dict(table=table, case=case, s=s, whole=whole, ok=bool(ok) and s is not None)


def pick(
    table: str, s: str, whole: str | None = None, case: str = "case",
    ok: Callable[[Rec], Any] = lambda r: r.get("ok", "error" not in r),
    keep: Callable[[Rec], bool] = lambda r: True,
) -> Callable[[Suite, Rec], list[Row]]:  # fmt: skip
    """The row function of a script writing one JSON line per case and repetition: the table's
    name formatted from the line (``"{wl} reads"``), the figure and whole-process keys."""

    def get(suite: Suite, r: Rec) -> list[Row]:
        if r.get(case) not in suite.cases or not keep(r):
            return []
        name = table.format_map(r)
        return [row(name, r[case], r.get(s), r.get(whole) if whole else None, ok(r))]

    return get


def fixed(text: str) -> Callable[[str, list[Rec]], str]:
    """A caption that does not depend on the run: ``{table}`` the table's name."""
    return lambda name, recs: text.format(table=name)


def workload_caption(name: str, recs: list[Rec]) -> str:
    """A workload's arrays (``workloads.py``) at the size measured: the table's first word."""
    import sys

    sys.path.insert(0, HERE)
    import workloads

    first = name.split()[0]
    size = next((r["size"] for r in recs if r.get("size") in workloads.SIZES), "full")
    W = workloads.SIZES[size][first]
    return (f"{first} ({W['name']}): {W['dtype']} {tuple(W['shape'])}, inner chunks "
            f"{tuple(W['inner'])}, shards {tuple(W['shard'])} ({size})")  # fmt: skip


def pyramid_caption(name: str, recs: list[Rec]) -> str:
    import sys

    sys.path.insert(0, HERE)
    import pyramid

    first = name.split()[0]
    size = next((r["size"] for r in recs if "size" in r), "full")
    if first not in pyramid.IMAGES[size]:  # icechunk's memory rows
        return workload_caption(name, recs)
    G = pyramid.IMAGES[size][first]
    nd = len(G["shape"])
    return (f"`{first}`: {G['dtype']} {tuple(G['shape'])}, inner chunks {(G['inner'],) * nd}, "
            f"shards {(G['shard'],) * nd} ({size})")  # fmt: skip


def stream_caption(name: str, recs: list[Rec]) -> str:
    import sys

    sys.path.insert(0, HERE)
    import stream

    first = name.split()[0]
    n, h, w = stream.SPECS[first]
    return f"spec {first}: {n} frames of {h}x{w} uint16, variant `{name.split()[1]}`"
