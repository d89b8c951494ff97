"""The pipeline's parts computed: every array's dask work (a :data:`Part`) in one graph into one
report, with or without a progress bar, or as one Delayed's arguments (``compute=False``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..engine.inprocess import dask_parts, run_here
from ..engine.report import WriteReport, sum_reports
from ..engine.write import lazy_call

__all__ = ["Part", "compute_parts", "deferred", "total_report", "total_report_of"]

Part = tuple[str, Any]
"""A key prefix (the array's path in a group, or "") and its dask work: a dask array of
receipts, a list of Delayed reports (one per shard task), or one Delayed report; or a numpy
source's shard tasks to run without dask (:class:`~shardwise.engine.inprocess.LocalShards`,
its dask work when asked: ``dask_parts``)."""


def compute_parts(parts: list[Part], progress: bool, desc: str = "shardwise") -> WriteReport:
    """Compute every part in one graph into one report (``seconds``: the wall time); a numpy
    source's shard tasks (:class:`~shardwise.engine.inprocess.LocalShards`) on this process's
    threads without dask when every part is one and nothing asks for dask."""
    started = time.perf_counter()
    here = run_here(parts, progress)
    if here is not None:
        report = total_report([(prefix, r) for (prefix, _), r in zip(parts, here, strict=True)])
    elif progress:
        report = _with_progress(dask_parts(parts), desc)
    else:
        import dask.array as da
        from dask.base import compute

        # every part as one Delayed report: dask's compute of Delayed and array collections
        # together returns the Delayed ones' results first, whatever the order they were given;
        # an array's graph optimized first, as computing the array would (its blocks fused)
        parts = deferred(
            [(pre, _optimized(p) if isinstance(p, da.Array) else p) for pre, p in dask_parts(parts)]
        )
        got = compute(*[p for _, p in parts])
        report = total_report([(prefix, g) for (prefix, _), g in zip(parts, got, strict=True)])
    report.seconds = time.perf_counter() - started
    return report


def _optimized(receipts: Any) -> Any:
    """A dask array of receipts as its Delayed blocks over the array's optimized graph (a
    list, as the parts of one Delayed per shard task are)."""
    return receipts.to_delayed(optimize_graph=True).ravel().tolist()


def _with_progress(parts: list[Part], desc: str) -> WriteReport:
    """``parts`` computed with a bar over their shard tasks (one dask item per shard task)."""
    import dask.array as da

    from ..engine.progress import compute_with_progress

    flat: list[Any] = []
    spans: list[tuple[str, int, int, bool]] = []
    nshards = 0
    for prefix, p in parts:
        shard_tasks = isinstance(p, da.Array | list)
        if isinstance(p, list):
            items = p
        elif isinstance(p, da.Array):
            items = p.to_delayed().ravel().tolist()
        else:
            items = [p]
        # runs (engine/runs.py) write many shards a task: they say how many
        nshards += getattr(p, "nshards", len(items)) if shard_tasks else 0
        spans.append((prefix, len(flat), len(flat) + len(items), shard_tasks))
        flat.extend(items)
    got = compute_with_progress(flat, nshards, desc=desc)
    return total_report(
        [(pre, sum_reports(got[a:b]) if many else got[a]) for pre, a, b, many in spans]
    )


def deferred(parts: list[Part]) -> list[Part]:
    """``parts`` with each one's shard tasks as one Delayed report (for a Delayed's arguments:
    dask resolves lists of block keys nested in them unreliably); building stays
    O(#shards + #blocks), no graph materialized or optimized here."""
    import dask.array as da
    from dask.delayed import delayed

    out: list[Part] = []
    for prefix, p in parts:
        if isinstance(p, da.Array):
            keys = [d.key for d in p.to_delayed(optimize_graph=False).ravel()]
            p = lazy_call(sum_reports, keys, p)
        elif isinstance(p, list) and p and all(d.dask is p[0].dask for d in p):
            # the shard tasks of one array (resumed: some left out) share its graph: one more
            # layer over it, not a Delayed per task (seconds for tens of thousands of tasks)
            p = lazy_call(sum_reports, [d.key for d in p], p[0])
        elif isinstance(p, list):
            p = delayed(sum_reports, pure=False)(list(p))
        out.append((prefix, p))
    return out


def total_report_of(prefixes: list[str], reports: list[Any]) -> WriteReport:
    """:func:`total_report` of the parts' reports given apart from their prefixes."""
    return total_report(list(zip(prefixes, reports, strict=True)))


def total_report(parts: Sequence[tuple[str, Any]]) -> WriteReport:
    """Sum the reports (or receipts) of all parts; shard keys get their part's prefix."""
    total = WriteReport()
    for prefix, p in parts:
        rep = p if isinstance(p, WriteReport) else sum_reports(p)
        if prefix:
            rep.keys = rep.keys.with_prefix(prefix)
        total = total + rep
    return total
