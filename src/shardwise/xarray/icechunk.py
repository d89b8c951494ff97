"""``shardwise.to_icechunk``: :func:`~shardwise.to_zarr` into an icechunk ``Session``, under the
name of icechunk's own writer (the session's fork, merge and commit are in
``storage/icechunk.py``)."""

from __future__ import annotations

from typing import Any

from ..engine.report import WriteReport
from ..errors import InvalidTypeError
from ..storage.icechunk import is_session
from .writer import to_zarr

__all__ = ["to_icechunk"]


def to_icechunk(obj: Any, session: Any, *, commit: str | None = None, **kwargs: Any) -> WriteReport:
    """Write an :class:`xarray.Dataset`, ``DataArray`` or ``DataTree`` into an icechunk session.

    :func:`to_zarr` into a writable :class:`icechunk.Session`, under the name of icechunk's own
    ``icechunk.xarray.to_icechunk``: one task per shard whatever the dask chunks, on threads and
    on any dask cluster. The metadata goes into the session first; the session is forked once,
    each shard task writes its whole shards into a fork of its own, and the forks, checked to
    have written disjoint shards, are merged back. The caller commits the session (or passes
    ``commit``). No lease or journal is written into the repository; a write interrupted
    before the merge leaves the session uncommitted (``session.discard_changes()``, or run it
    again).

    Parameters
    ----------
    obj : xarray.Dataset, xarray.DataArray or xarray.DataTree
        What to write, as :func:`to_zarr` takes it.
    session : icechunk.Session
        A writable session (``repo.writable_session(branch)``), not a fork of one.
    commit : str, optional
        Commit the session with this message once the write is merged, rebased over commits
        made meanwhile that changed other chunks (``icechunk.ConflictDetector``).
    **kwargs
        The keywords of :func:`to_zarr` (``mode``, ``region``, ``group``, ``encoding``,
        ``shards`` ...); ``compute=False``, ``resume=True``, ``lease=True`` and
        ``strategy="staged"`` do not apply to a session and are refused.

    Returns
    -------
    WriteReport
        What the write did; with ``commit``, its ``notes`` name the new snapshot.

    Raises
    ------
    InvalidTypeError
        ``session`` is not an icechunk ``Session``, or a keyword of the wrong type.
    InvalidValueError
        A read-only session or a ForkSession, or a keyword that does not apply to a session.
    TransactionError
        Two shard tasks wrote one shard (nothing merged), or the commit conflicts with another.

    Examples
    --------
    >>> import icechunk, tempfile, numpy as np, xarray as xr, shardwise
    >>> repo = icechunk.Repository.create(icechunk.local_filesystem_storage(tempfile.mkdtemp()))
    >>> ds = xr.Dataset({"t": (("y", "x"), np.ones((64, 64)))})
    >>> report = shardwise.to_icechunk(ds, repo.writable_session("main"), commit="first",
    ...                                shards={"y": 32, "x": 32})
    >>> report.shards_written, xr.open_zarr(repo.readonly_session("main").store).t.shape
    (4, (64, 64))
    """
    if not is_session(session):
        raise InvalidTypeError(
            f"to_icechunk writes into an icechunk Session, got {type(session).__name__} (use "
            "shardwise.to_zarr for other stores)"
        )
    report: WriteReport = to_zarr(obj, session, commit=commit, **kwargs)
    return report
