"""The resume judgement of an append (``appends.py``): which rows a call with ``resume=True``
finishes rather than appending again.

The open append markers are searched first: the first one of this call's shape (as many rows,
the same extent in every other dimension) whose writer is gone is finished, its rows written
again where they were reserved (the shards it stored and recorded skipped); then, when the
lead's values tell which rows an append wrote (a dimension coordinate), a finished append whose
rows of the lead hold this call's values (nothing to write); then the record of a killed append
of this shape whose commit took its rows (``Survey.judge``: they lie in the lead's length, named
by no marker, holding no values, and no other unsettled record claims them): they are finished,
named first by this call's markers. Only when there is none does the call append, as without
``resume``, removing a record of this shape whose append reserved nothing; while a running
append's record claims a killed one's rows, the call is refused before any change
(``LeaseHeldError``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..compat import with_rectilinear_grids
from ..durability.appending import Survey, holder_may_run
from ..durability.journal import WriteMarker, appends_of, region_list
from ..errors import LeaseHeldError
from .appended import AppendedArray


def not_reserved(lead: AppendedArray, dim: str, found: Survey) -> list[str]:
    """The record of an append of this shape killed before it reserved anything (its commit
    never took its rows: durability/appending.py): this call, appending, stands for it.
    Refused while another append, still running, claims rows of its block (they are that
    append's, or the killed one's had it committed first: whose they are shows once they are
    named); killed appends whose rows are not certain stay reported."""
    want = region_list(lead.region)
    for name, rec in found.stale:
        if not rec.fits(dim, lead.axis, want):
            continue
        verdict = found.judge(rec)
        if verdict == "nothing":
            return [name]
        if verdict == "reserving":
            a, b = found.block(rec)
            raise LeaseHeldError(
                f"an append of {rec.rows} rows along {dim!r} at {lead.path!r} (started "
                f"{rec.started}) was killed around its reservation, and another append is "
                f"reserving rows now: rows {a}:{b} are named by no write yet, and whether they "
                "are the killed append's shows once that append names its rows. Nothing was "
                "written: rerun with resume=True in a moment"
            )
    return []


def unfinished(
    arrays: Sequence[AppendedArray], dim: str, found: Survey, lead_names_rows: bool
) -> tuple[int, int, str, list[str]] | None:
    """The rows of the first unfinished append along ``dim`` of this call's shape (as many rows,
    the same extent in every other dimension): an open marker in any appended array, the
    lead's first; else (``lead_names_rows``) those of a finished one whose rows of the lead hold
    exactly this call's values; else the rows a killed append reserved in the lead and never
    named (``found``, durability/appending.py). (start, end, "open" | "done" | "orphan", the
    names of the lead's records that are settled by it)."""
    for a in arrays:
        for m in appends_of(a.store, dim, "open"):
            holder = (m.append or {}).get("holder")
            if (rows := _rows_of(m, a)) is not None and not holder_may_run(a.store, holder):
                return rows[0], rows[1], "open", []
    lead = arrays[0]
    if lead_names_rows:
        for m in appends_of(lead.store, dim, "done"):
            rows = _rows_of(m, lead)
            if rows is not None and _holds(lead, rows):
                return rows[0], rows[1], "done", []
    want = region_list(lead.region)
    for name, rec in found.stale:
        if rec.fits(dim, lead.axis, want) and (rows := found.killed_rows(rec)) is not None:
            return rows[0], rows[1], "orphan", [name]
    return None


def _rows_of(m: WriteMarker, a: AppendedArray) -> tuple[int, int] | None:
    """The rows of the append ``m`` if it has the shape of ``a``'s (along its axis)."""
    axis = a.axis
    want = [[s.start, s.stop] for s in a.region]
    if int((m.append or {}).get("axis", -1)) != axis or len(m.region) != len(want):
        return None
    lo, hi = (int(r) for r in m.region[axis])
    same = all(r == q for i, (r, q) in enumerate(zip(m.region, want, strict=True)) if i != axis)
    return (lo, hi) if same and hi - lo == want[axis][1] - want[axis][0] else None


@with_rectilinear_grids
def _holds(a: AppendedArray, rows: tuple[int, int]) -> bool:
    """Whether the stored array of ``a`` holds ``a``'s values at ``rows`` along its axis."""
    import numpy as np
    import zarr

    sel = tuple(slice(*rows) if i == a.axis else s for i, s in enumerate(a.region))
    stored = zarr.open_array(a.store.store, path=a.path, mode="r")[sel]
    return bool(np.array_equal(np.asarray(stored), np.asarray(a.source), equal_nan=False))
