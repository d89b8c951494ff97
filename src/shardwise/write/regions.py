"""Many small updates, one merge per shard: :class:`RegionWriter`.

Annotation, label painting, re-acquired tiles and corrected time steps write many small regions
into big shards. Each ``write_array(region=...)`` call reads and rewrites every shard it
touches, so a shard touched by a hundred calls moves a hundred times. A ``RegionWriter`` keeps
the updates (their values copied when they are given, split by shard), and
:meth:`RegionWriter.commit` writes them as one call of the one write sequence
(``write/execute.py``): one task per touched shard reads the shard once, merges every update of
it in the order they were given (a later update wins where two overlap) and commits it once,
conditionally, so other processes updating the same shards at once lose nothing; the tasks hold
the array's shared lease and one write marker over the updates' bounding box, as a region
write does. Into an icechunk session the tasks write into forks, merged and committed as every
write into a session is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.layout import Coord, Region, intersect, normalize_region
from ..core.plan import ShardPlan
from ..engine.report import WriteReport
from ..engine.tasks import shard_task
from ..engine.write import ShardWriter
from ..errors import PlanError
from ..storage.icechunk import is_session, writes_into_session
from ..storage.nodes import open_info
from ..storage.store import ShardStore, resolve_store
from .compute import Part
from .execute import Target, WriteCall, execute
from .intent import array_write, resolve
from .options import WriteOptions
from .pipeline import Pipeline, direct_writer

__all__ = ["RegionWriter"]

Update = tuple[tuple[slice, ...], np.ndarray]


class RegionWriter:
    """Collect region updates of the sharded array at ``path`` of ``store``; ``commit()``
    merges each touched shard once. As a context manager it commits on a clean exit (and
    drops the updates when the block raises).

    Parameters
    ----------
    store : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        Where the array is.
    path : str, optional
        The array's path in the store.
    commit : str, optional
        Into an icechunk ``Session``: commit the session with this message after the merge.
    lease : bool, optional
        Hold the array's shared lease (default: where the store can delete).
    break_lease : bool
        Break a stale lease of a writer that is gone.
    threads : int, optional
        Threads encoding a shard's inner chunks.
    fsync : bool
        ``fsync`` each shard of a local store.
    progress : bool
        A progress bar over the shard tasks.
    write_empty_chunks : bool
        Store inner chunks equal to the fill value.
    storage_options : dict, optional
        For a URL ``store``, as fsspec takes them.

    Examples
    --------
    >>> import numpy as np, shardwise, zarr
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_array(np.zeros((64, 64), "u1"), store, chunks=(8, 8), shards=(32, 32))
    >>> with shardwise.RegionWriter(store) as w:
    ...     w.write((slice(0, 4), slice(0, 4)), 1)
    ...     w.write((slice(2, 6), slice(2, 6)), 2)     # the same shard: merged once, in order
    ...     w.write((slice(40, 42), slice(40, 42)), 3)
    >>> w.report.shards_written, int(shardwise.read_array(store)[3, 3])
    (2, 2)
    """

    def __init__(
        self,
        store: Any,
        *,
        path: str | None = None,
        commit: str | None = None,
        lease: bool | None = None,
        break_lease: bool = False,
        threads: int | None = None,
        fsync: bool = False,
        progress: bool = False,
        write_empty_chunks: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        keywords: dict[str, Any] = dict(
            lease=lease, break_lease=break_lease, threads=threads, fsync=fsync, progress=progress,
            write_empty_chunks=write_empty_chunks, storage_options=storage_options,
        )  # fmt: skip
        self.options = WriteOptions.checked(verb="RegionWriter", path=path, mode="r+", **keywords)
        self.store, self.commit_message = store, commit
        where = store.store if is_session(store) else store  # a session's store to read from
        self.info = open_info(
            resolve_store(where, mode="r", storage_options=self.options.storage_options), path
        )
        self.pending: dict[Coord, list[Update]] = {}
        self.box: list[list[int]] = []  # the updates' bounding box: [start, stop] per axis
        self.report: WriteReport | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.info.layout.shape)

    @property
    def pending_bytes(self) -> int:
        """The bytes of the updates held until the commit."""
        return sum(v.nbytes for ups in self.pending.values() for _, v in ups)

    def write(self, region: Any, values: Any) -> None:
        """Keep ``values`` for ``region``; nothing is written until :meth:`commit`.

        Parameters
        ----------
        region : tuple of slice
            A slice per dimension, or one ``...`` for the dimensions not given.
        values : array_like or scalar
            The region's shape, or one that broadcasts to it; cast to the array's dtype
            without loss (a ``PlanError`` otherwise). Copied at the call.
        """
        lay, dtype = self.info.layout, self.info.dtype
        reg = normalize_region(region, lay.shape)
        want = tuple(r.stop - r.start for r in reg)
        vals = _values(values, dtype)
        if not np.can_cast(vals.dtype, dtype, casting="same_kind"):
            raise PlanError(
                f"cannot write {vals.dtype} values into a {dtype} array without loss: convert "
                f"them first (e.g. values.astype({str(dtype)!r}))"
            )
        try:
            vals = np.broadcast_to(vals, want)
        except ValueError:
            raise PlanError(f"values of shape {vals.shape} do not fit region {want}") from None
        for shard in lay.shards_touching(reg):
            box = lay.shard_region(shard)
            part = intersect(reg, box)
            assert part is not None
            sub = np.array(vals[_within(part, reg)], dtype=dtype)  # a copy: kept until commit
            self.pending.setdefault(shard, []).append((_within(part, box), sub))
        self.box = [[r.start, r.stop] for r in reg] if not self.box else [
            [min(a, r.start), max(b, r.stop)] for (a, b), r in zip(self.box, reg, strict=True)
        ]  # fmt: skip

    @writes_into_session
    def commit(self) -> WriteReport:
        """Merge every update kept: one task per touched shard, one read and one conditional
        commit each; the updates are dropped once written (or when the write fails: its open
        marker tells ``verify``).

        Returns
        -------
        WriteReport
            What the merge wrote and moved (also kept as ``report``).
        """
        if not self.pending:
            self.report = WriteReport(notes=["nothing to write: no update given"])
            return self.report
        pending, region = self.pending, tuple(slice(a, b) for a, b in self.box)
        self.pending, self.box = {}, []
        o = self.options
        target, o = Target.open(self.store, self.commit_message, o)
        zstore = resolve_store(target.store, mode="w", storage_options=o.storage_options)
        intent = resolve(zstore, o.path, "r+", False, region=True)
        plan = ShardPlan(self.info.layout, region)
        write = array_write(ShardStore(zstore, o.path or "", fsync=o.fsync), self.info, intent,
                            None, plan=plan, strategy="direct", shared=True,
                            options=o.settings)  # fmt: skip

        def parts(pipe: Pipeline, _: Any) -> list[Part]:
            writer = direct_writer(write, pipe.session(write))
            return [("", _tasks(writer, pending))]

        call = WriteCall([write], lease=target.lease(o.lease, True, zstore),
                         break_lease=o.break_lease, progress=o.progress,
                         desc="shardwise updates", nodes=(), parts=parts)  # fmt: skip
        self.report = execute(target, call)
        return self.report

    def __enter__(self) -> RegionWriter:
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        if error is None:
            self.commit()
        else:
            self.pending, self.box = {}, []


def _within(part: Region, outer: Region) -> tuple[slice, ...]:
    """``part`` relative to the start of ``outer``."""
    return tuple(
        slice(p.start - o.start, p.stop - o.start) for p, o in zip(part, outer, strict=True)
    )


def _values(values: Any, dtype: np.dtype[Any]) -> np.ndarray:
    """``values`` as an array; a Python number the array's dtype holds exactly takes it (as
    numpy's own assignment of a scalar does)."""
    if isinstance(values, int | float | complex) and not isinstance(values, bool):
        try:
            exact = np.asarray(values, dtype=dtype)
        except (OverflowError, ValueError, TypeError):
            return np.asarray(values)
        return exact if exact == values else np.asarray(values)
    return np.asarray(values)


def _tasks(writer: ShardWriter, pending: dict[Coord, list[Update]]) -> list[Any]:
    """One Delayed report per touched shard: its updates merged in one task."""
    import uuid

    from dask.delayed import delayed

    tok = uuid.uuid4().hex[:12]
    return [
        delayed(_merge, pure=False)(writer, shard, ups, dask_key_name=f"shardwise-update-{tok}-{i}")
        for i, (shard, ups) in enumerate(sorted(pending.items()))
    ]


def _merge(writer: ShardWriter, shard: Coord, updates: list[Update]) -> WriteReport:
    """The task of one shard: counted as a running task of its write, forked in a session."""
    write_id = None if writer.journal is None else writer.journal.write_id
    return shard_task(writer, write_id).run(lambda w: w.write_updates(shard, updates))
