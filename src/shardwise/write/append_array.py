"""``write_array(..., append_dim=...)``: a numpy or dask array appended along an axis of the
array at the path, by the one append rule (:mod:`shardwise.write.appends`).

:func:`~shardwise.write.target.prepare_write` checked the call and planned the write at the
array's stored end (``dry_run`` and ``plan_write`` stop there). Here the rows are reserved in
the array's metadata by a conditional commit (so any number of processes appending at once all
land, each at the rows its commit took), the write is planned again at those rows and run by
the one sequence of every write (``execute.py``) under the array's shared lease; a failure
before the data is done gives the rows back while no later append reserved after them. The
array's metadata is the reservation's: nothing else is committed after the data but the
consolidated groups above the array. With ``resume=True`` an unfinished append of this shape
is finished where it was reserved, or found written already (the array's rows there hold this
data), rather than appended again.
"""

from __future__ import annotations

from typing import Any

from ..storage.consolidated import Nodes
from .appends import reserve, tagged
from .execute import Target, WriteCall, execute
from .options import WriteOptions
from .target import PreparedWrite, append_write


def append_array(prepared: PreparedWrite, o: WriteOptions, target: Target, leased: bool) -> Any:
    """Run the append ``prepared`` (its ``appended`` set) into ``target``: reserve, write by
    the one sequence (:func:`~shardwise.write.execute.execute`), note the rows (as
    ``to_zarr``'s appends do). With ``compute=False`` the rows stay reserved once the leases
    are held, and the Delayed writes them (a failure then leaves them as fill values, its open
    marker telling verify)."""
    planned = prepared.appended
    assert planned is not None
    held = reserve(
        [planned],
        _dim(planned.axis, planned.info.dimension_names if planned.info else None),
        pad=o.strategy != "staged",
        resume=o.resume,
        lead_names_rows=True,
        call="write_array",
    )

    def keep() -> None:
        held.committed = True  # nothing is given back from here on

    try:
        grid = held.moved[0].meta.get("chunk_grid")  # as the reservation committed it
        moved = append_write(planned, o, start=held.start, grid=grid)
        call = WriteCall(
            [tagged(held, {0: moved.write})[0]],
            lease=leased,
            break_lease=o.break_lease,
            compute=o.compute,
            progress=o.progress,
            nodes=[Nodes(planned.store.store, (planned.path,))],  # consolidated groups above
            first=None if o.compute else keep,
            then=keep,
        )
        report = execute(target, call)
    except BaseException:
        held.release()
        raise
    if o.compute:
        report.notes.append(held.note())
    return report


def _dim(axis: int, names: tuple[str | None, ...] | None) -> str:
    """The name of an append along ``axis`` in its markers and notes: the array's dimension
    name there, else ``"axis <n>"``."""
    name = None if names is None else names[axis]
    return name if name else f"axis {axis}"
