"""The data writes of a checked ``to_zarr`` call as pipeline work: each sharded variable's job and
:class:`~shardwise.write.pipeline.ArrayWrite`, the leases mode "w" must not delete, and the
dask parts (variables without shards through zarr-python).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from zarr.abc.store import Store

from ..compat import with_rectilinear_grids
from ..core.job import Strategy, WritePlan
from ..core.layout import Layout, Region
from ..core.plan import ShardPlan
from ..durability.journal import read_marker, read_markers
from ..engine.report import WriteReport
from ..engine.write import WriteSettings
from ..errors import PlanError
from ..storage.overlay import Overlay
from ..storage.store import ShardStore
from ..write.compute import Part
from ..write.intent import Intent, Mode, array_write, job_for, resolve
from ..write.pipeline import ArrayWrite, Pipeline
from .capture import VariableWrite
from .prepare import WriteMode


@dataclass(frozen=True)
class XarrayWrite:
    """A checked ``to_zarr`` call: the metadata xarray would write (in ``overlay``, not yet in
    the store), the data writes and their jobs."""

    zstore: Store
    overlay: Overlay
    writes: list[VariableWrite]
    jobs: dict[int, WritePlan]
    mode: WriteMode
    shared: bool  # region and append writes: other processes may write beside this one
    # a resume over a stored tree that is what this call writes (metadata and small arrays):
    # maybe a finished write of it, whose shards finished_shards looks at. In mode "w-" the
    # overlay and writes are then those of a mode "w" pass, never run
    finished: bool = False


def variable_jobs(
    writes: list[VariableWrite],
    strategy: Strategy,
    memory_limit: int | str | None,
    *,
    shared: bool,
    forks: bool = False,
) -> dict[int, WritePlan]:
    """The validated job of every sharded variable write (by ``id`` of the write), by the one
    job maker (write/intent.py); ``shared``: region and append writes, which other
    processes may run beside this one (a staged merge of shared shards then holds the exclusive
    lease instead, as write_array's)."""
    out = {}
    for w in writes:
        if w.info is None or w.size == 0:
            continue
        job = job_for(
            ShardPlan(w.info.layout, w.region),
            w.source if w.lazy else None,
            np.dtype(w.info.dtype),
            strategy=strategy,
            memory_limit=memory_limit,
            shared=shared,
            forks=forks,
        )
        try:
            job.validate()
        except PlanError as e:
            raise PlanError(f"variable {w.name!r}: {e}") from None
        out[id(w)] = job
    return out


def open_marker(store: ShardStore) -> bool:
    """Whether an interrupted write left its open marker in the array at ``store``."""
    return any(m is not None and m.status == "open" for m in read_markers(store).values())


def array_writes(
    xw: XarrayWrite, opts: WriteSettings, *, fsync: bool, resume: bool
) -> dict[int, ArrayWrite]:
    """The pipeline's write of every sharded variable (by ``id`` of the variable's write), by
    the policy's one answer and one builder (write/intent.py, as ``write_array``'s): what is at
    the variable's path (:func:`variable_intent`) decides what its write clears, whether it
    adopts a finished write and whether it must find one. The metadata is xarray's (committed
    from the overlay after the data), never the pipeline's, and mode "w"'s clear of the groups
    xarray's pass deletes runs first (writer.py), sparing what the intents keep."""
    out: dict[int, ArrayWrite] = {}
    for w in xw.writes:
        job = xw.jobs.get(id(w))
        if w.info is None or job is None:
            continue
        store = ShardStore(xw.zstore, w.path, fsync=fsync)
        out[id(w)] = array_write(
            store,
            w.info,
            variable_intent(store, w, xw.mode, resume),
            # numpy-backed variables are written now, even with compute=False: no copy
            w.source if w.lazy else np.asarray(w.source),
            job=job,
            shared=xw.shared,
            resume=resume,
            options=opts,
            prefix=w.path,
        )
    return out


def variable_intent(store: ShardStore, w: VariableWrite, mode: WriteMode, resume: bool) -> Intent:
    """What ``to_zarr`` in ``mode`` (``resume``) does about the array of variable ``w``: the
    policy's :func:`~shardwise.write.intent.resolve`, given what is there. ``to_zarr`` stores
    a variable's metadata last, so its interrupted create is data and an open marker of this
    write's shape without metadata (:func:`left_by_interrupted_write`): on resume that is this
    write's array (kept, its marker adopted; in mode "w-" it must be found). An array with
    metadata is a finished one: replaced in mode "w" (xarray's "w-" refused it already),
    written into in "a", "a-" and "r+"."""
    assert w.info is not None  # a sharded variable
    left = resume and left_by_interrupted_write(store, w.region, w.info.layout.shape)
    # mode "w" replaces a finished array, "w-" refused it already (xarray's pass)
    stored = mode not in ("w", "w-") and store.get("zarr.json") is not None
    # no probe: the metadata is xarray's (in the overlay), compared by nothing here
    asked: Mode = "a" if mode == "a-" else mode
    intent = resolve(store.store, store.path, asked, resume, exists=left or stored)
    # mode "w"'s clear of the old arrays is the group's (writer.py, before the metadata that
    # compute=False commits ahead of the data): the array's own clear is its stale journal's
    return replace(intent, clear="journal") if intent.clear == "all" else intent


def left_by_interrupted_write(store: ShardStore, region: Region, shape: tuple[int, ...]) -> bool:
    """Whether an interrupted create (or replace) of the array at ``store`` (``shape``, written
    in ``region``) left its data: its open marker, and no metadata (a create writes it last, a
    replace deleted the old first; an older array with an interrupted write of its own still
    has its metadata, and is replaced)."""
    if store.get("zarr.json") is not None:
        return False
    found = read_marker(store, region)
    return found is not None and found.status == "open" and list(found.shape) == list(shape)


def resumed_paths(arrays: dict[int, ArrayWrite]) -> list[str]:
    """The variables whose interrupted write a resumed call finishes (its intent keeps the
    array, which has no metadata yet): what mode "w"'s clear of their group spares."""
    return [
        f"{aw.store.path}/"
        for aw in arrays.values()
        if aw.resume and aw.clear == "none" and aw.store.get("zarr.json") is None
    ]


def dask_parts(
    pipe: Pipeline, arrays: dict[int, ArrayWrite], zstore: Store, writes: list[VariableWrite]
) -> list[Part]:
    """The dask work that writes ``writes``, run together: sharded variables through the
    pipeline's engine (shards a resumed session stored already left out), the others through
    zarr-python."""
    from dask.delayed import delayed

    parts: list[Part] = []
    for w in writes:
        if w.size == 0:
            continue
        if id(w) in arrays:
            parts += pipe.parts([arrays[id(w)]])
            continue
        source: Any = w.source if w.lazy else np.asarray(w.source)
        if not w.lazy or not w.chunks:
            if w.lazy:
                # its one block by the source graph's own keys: delayed(...) of the dask array
                # would optimize (fuse) a copy of that graph per variable, and a source shared
                # by several variables (one derived from another) would be computed once each
                source = source.to_delayed(optimize_graph=False).item()
            part = delayed(_write_plain, pure=False)(zstore, w.path, w.meta, w.region, source)
            parts.append((w.path, part))
            continue
        # not sharded (an array some other writer created without shards): zarr writes it, from
        # dask blocks cut at chunk boundaries so that no two tasks share a chunk
        cuts = ShardPlan(Layout(w.shape, w.chunks, w.chunks), w.region).task_chunks
        blocks = source.rechunk(cuts).to_delayed().ravel()
        starts = [np.cumsum((0, *c[:-1])) for c in cuts]
        for idx, block in zip(np.ndindex(*(len(c) for c in cuts)), blocks, strict=True):
            region = tuple(
                slice(r.start + int(st[i]), r.start + int(st[i]) + c[i])
                for r, st, c, i in zip(w.region, starts, cuts, idx, strict=True)
            )
            part = delayed(_write_plain, pure=False)(zstore, w.path, w.meta, region, block)
            parts.append((w.path, part))
    return parts


@with_rectilinear_grids
def _write_plain(
    zstore: Store, path: str, meta: dict[str, Any], region: Region, block: Any
) -> WriteReport:
    """Write ``block`` through zarr-python, into the array as ``meta`` describes it (which the
    store may not hold yet: metadata is written after the data)."""
    import zarr
    from zarr.core.metadata import ArrayV3Metadata
    from zarr.storage import StorePath

    data = np.asarray(block)
    meta_v3 = ArrayV3Metadata.from_dict(meta)
    own = ShardStore(zstore).task_fork()  # into an icechunk fork: a fork of its own, handed back
    into = zstore if own is None else own[0].store
    zarr.Array(zarr.AsyncArray(metadata=meta_v3, store_path=StorePath(into, path)))[region] = data
    return WriteReport(raw_bytes=int(data.nbytes), forks=[] if own is None else [own[1]])
