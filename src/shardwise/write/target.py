"""What write_array writes into, checked before the first byte (its keywords checked already,
one record: write/options.py): the source data (numpy, dask or xarray; unknown chunks and lossy
casts refused), the array at the path (existing or built in memory), the region the data fills,
the validated job, and the pipeline's ArrayWrite of it."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..codec.metadata import ArrayInfo, default_compressors
from ..compat import classic_dask, with_rectilinear_grids
from ..core.extents import has_extents
from ..core.geometry import ShardGeometry
from ..core.job import Strategy, WritePlan
from ..core.layout import Region, RegionArg, normalize_region
from ..core.plan import ShardPlan
from ..core.shardspec import dask_layout, extents_layout, wants_dask
from ..engine.write import Mode
from ..errors import ArrayNotFoundError, InvalidValueError, PlanError
from ..storage.conditional import versions
from ..storage.icechunk import is_icechunk_store
from ..storage.nodes import open_info
from ..storage.retry import retry_transient
from ..storage.store import ShardStore, describe, resolve_store
from .appended import AppendedArray, moved
from .create import planned_probe
from .intent import Intent, array_write, create_metadata, decide, job_for, resolve
from .options import WriteOptions
from .pipeline import ArrayWrite


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


@dataclass(frozen=True)
class PreparedWrite:
    """A write checked and planned, nothing stored yet: the validated job, and the pipeline's
    write of it (run by a :class:`~shardwise.write.pipeline.Pipeline` under the caller's
    lease: the array's for write_array, a part's for a batch part)."""

    job: WritePlan
    write: ArrayWrite
    # an append (``append_dim``): the array it grows, its write planned at the length found
    # (write/append_array.py reserves the rows and plans it again there)
    appended: AppendedArray | None = None


def prepare_write(data: Any, store: Any, options: WriteOptions) -> PreparedWrite:
    """Steps 2-4 of :func:`~shardwise.write_array`, its keywords checked already (step 1,
    :meth:`~shardwise.write.options.WriteOptions.checked`): the source, the array at the path
    and the validated job, before the store is written."""
    o, given = options, dict(options.create)
    dtype, chunks, shards = given.pop("dtype"), given.pop("chunks"), given.pop("shards")
    # 2. the data
    names = _dims_of(data)
    if names is not None and given.get("dimension_names") is None and o.append_dim is None:
        given["dimension_names"] = names  # a DataArray's dimensions name the array's
    data = _source(data)
    if o.append_dim is not None:  # into the existing array, at its end
        zstore = resolve_store(store, mode="w", storage_options=o.storage_options)
        return _append(data, names, zstore, o)
    if dtype is None and data.dtype == object:
        dtype = _object_dtype(data)
    shape = tuple(int(n) for n in data.shape)
    if wants_dask(shards) or has_extents(shards):
        dims = given.get("dimension_names")
        chunks, shards = _grid_layout(data, dtype, chunks, shards, names, dims)
    zstore = resolve_store(store, mode="w", storage_options=o.storage_options)
    # 3. what is at the path (refusals of "w-" and "r+"), the array's metadata: a new one
    # built and checked in memory, else the stored one
    layout = (shape, data.dtype if dtype is None else dtype, chunks, shards)
    if _is_auto(given["compressors"]):
        given["compressors"] = default_compressors()
    meta = _target_metadata(zstore, o.path, o.mode, o.resume, o.region, layout, given)
    # 4. where the data goes, and the job that puts it there (validated: dry_run stops here)
    target, data = _placed(data, meta.info, o.region, shape)
    sstore = ShardStore(zstore, o.path or "", fsync=o.fsync)
    return _prepared(sstore, meta, target, data, o.mode, o)


def _grid_layout(
    data: Any, dtype: Any, chunks: Any, shards: Any, names: Any, dims: Any
) -> tuple[tuple[int, ...], list[Any]]:
    """Inner chunks and shards (as zarr takes them) of ``shards="dask"`` (one shard per dask
    chunk: regular, or rectilinear where uneven) or of shard extents given (a rectilinear
    grid), checked here: ``names`` a DataArray's dimensions, ``dims`` the array's."""
    itemsize = np.dtype(data.dtype if dtype is None else dtype).itemsize
    given = None if chunks is None or _is_auto(chunks) else tuple(chunks)
    shape = tuple(int(n) for n in data.shape)
    if wants_dask(shards):
        source = data.chunks if _is_dask(data) else None
        return dask_layout(shards, shape, source, itemsize, given, names)
    return extents_layout(shards, shape, itemsize, given, dims)


def _prepared(
    sstore: ShardStore, meta: _Target, target: Region, data: Any, mode: Mode, o: WriteOptions
) -> PreparedWrite:
    """The validated job that writes ``data`` into ``target`` of ``meta``'s array (with the
    planner's reasons where it chose a new array's layout), and the pipeline's write of it."""
    job, shared = _validated_job(sstore, meta, target, data, mode, o.strategy, o.memory_limit)
    g, lay = meta.geometry, job.plan.layout
    if g is not None and (g.chunks, g.shards) == (lay.chunk_shape, lay.shard_shape):
        job = replace(job, layout=g)  # a new array: the plan says why its shards are these
    write = array_write(
        sstore,
        meta.info,
        meta.intent,
        data,
        job=job,
        create=meta.create,
        shared=shared,
        resume=o.resume,
        compute=o.compute,
        options=o.settings,
    )
    return PreparedWrite(job, write)


def _append(
    data: Any, names: tuple[str, ...] | None, zstore: Any, o: WriteOptions
) -> PreparedWrite:
    """An append's write, planned at the array's stored end: the array must be there
    (``ArrayNotFoundError``), ``append_dim`` one of its axes (or dimension names), and every
    other dimension of ``data`` the array's (``PlanError``)."""
    if not _exists(zstore, o.path):
        raise ArrayNotFoundError(
            "append_dim= appends to an existing array, and there is none at "
            f"{describe(zstore, o.path, 'path')} (write it first, without append_dim)"
        )
    sstore = ShardStore(zstore, o.path or "", fsync=o.fsync)
    meta = retry_transient(lambda: json.loads(sstore.get("zarr.json") or b"{}"))
    info = retry_transient(lambda: open_info(zstore, o.path))
    assert o.append_dim is not None
    axis = _append_axis(o.append_dim, info, names, describe(zstore, o.path))
    have = info.layout.shape
    shape = tuple(int(n) for n in data.shape)
    others = [i for i in range(len(have)) if i != axis]
    if len(shape) != len(have) or any(shape[i] != have[i] for i in others):
        raise PlanError(
            f"data of shape {shape} cannot be appended along axis {axis} to the array of shape "
            f"{have}: every other dimension must be the array's. Nothing was written"
        )
    region = tuple(
        slice(have[i], have[i] + shape[i]) if i == axis else slice(0, n) for i, n in enumerate(have)
    )
    data = _cast_source(data, info.dtype)
    planned = AppendedArray(sstore, axis, region, meta, info, data)
    planned.check()  # chunks that cannot be shards of a rectilinear axis
    return append_write(planned, o, start=have[axis])


def append_write(
    planned: AppendedArray, o: WriteOptions, *, start: int, grid: dict[str, Any] | None = None
) -> PreparedWrite:
    """The write of an append's ``planned`` array moved to rows ``start`` on (padded to whole
    shards along the axis: its last shard merged; ``grid``: the grid its reservation
    committed), its job validated; the policy's intent of a write into an existing array in
    mode "a"."""
    intent = decide("a", o.resume, True, True)
    at = moved(planned, start, start + planned.rows, pad=o.strategy != "staged", grid=grid)
    assert at.info is not None
    meta = _Target(at.info, intent, None)
    prepared = _prepared(planned.store, meta, at.region, at.source, "a", o)
    return replace(prepared, appended=planned)


def _exists(zstore: Any, path: str | None) -> bool:
    return bool(retry_transient(lambda: ShardStore(zstore, path or "").get("zarr.json")))


def _append_axis(
    append_dim: int | str, info: ArrayInfo, names: tuple[str, ...] | None, where: str
) -> int:
    """The axis ``append_dim`` names in the array ``info`` (an int: an axis, negative from the
    end; a str: a dimension name of the array, else of the data, a DataArray)."""
    ndim = len(info.layout.shape)
    stored = info.dimension_names
    if (
        stored is not None
        and names is not None
        and any(s is not None and s != n for s, n in zip(stored, names, strict=False))
    ):
        raise PlanError(
            f"the data's dimensions {names} are not those of {where} {tuple(stored)}. Nothing "
            "was written"
        )
    if isinstance(append_dim, str):
        known = list(stored if stored is not None and any(stored) else names or ())
        if append_dim not in known:
            raise InvalidValueError(
                f"append_dim={append_dim!r} is not a dimension of {where} (its dimensions: "
                f"{tuple(known) if known else 'none named; pass an axis'})"
            )
        return known.index(append_dim)
    if not -ndim <= append_dim < ndim:
        raise InvalidValueError(
            f"append_dim={append_dim} is not an axis of {where}, an array of {ndim} dimensions"
        )
    return append_dim % ndim


def _dims_of(data: Any) -> tuple[str, ...] | None:
    """The dimension names of ``data``, a DataArray (None for other arrays)."""
    xr = sys.modules.get("xarray")
    if xr is not None and isinstance(data, xr.DataArray | xr.Variable):
        return tuple(str(d) for d in data.dims)
    return None


@dataclass(frozen=True)
class _Target:
    """The metadata of the array a write goes into, and what the write does about it (the
    policy's :class:`~shardwise.write.intent.Intent`); ``create`` stores the metadata when
    this write creates (or replaces) the array, else None."""

    info: ArrayInfo
    intent: Intent
    create: Callable[[], None] | None
    # the planner's geometry of an array this write creates, where it chose the layout
    geometry: ShardGeometry | None = None


def _target_metadata(
    zstore: Any,
    path: str | None,
    mode: Mode,
    resume: bool,
    region: RegionArg | None,
    layout: tuple[tuple[int, ...], Any, Any, Any],
    given: dict[str, Any],
) -> _Target:
    """What is at the path (the policy's :func:`~shardwise.write.intent.resolve`: mode
    "w-" refuses an array, "r+" its absence), then the stored metadata of an array written
    into, else (and when a create or replace is resumed) the new array's, built and checked in
    memory before any I/O. ``layout``: shape, dtype, chunks and shards of a new array;
    ``given``: its other ``zarr.create_array`` keywords."""
    built: list[tuple[dict[str, Any], Any, ShardGeometry | None]] = []

    def probe() -> Any:
        if not built:
            built.append(planned_probe(*layout, given))
        return built[0][1]

    intent = resolve(zstore, path, mode, resume, probe, region=region is not None)
    if not intent.create and not built:
        return _Target(retry_transient(lambda: open_info(zstore, path)), intent, None)
    probe()
    kwargs, made, geometry = built[0]
    # translate the metadata as stored (JSON), which is what readers will see: e.g. a NaN
    # fill value with a payload is stored as plain "NaN"
    info = open_info(made.store)
    if not intent.create:
        return _Target(info, intent, None)  # a resumed create: the array is there already
    # zarr's rectilinear flag on while the metadata is stored (a grid of shards="dask")
    store_it = with_rectilinear_grids(create_metadata)
    return _Target(info, intent, lambda: store_it(zstore, path, kwargs, made), geometry)


def _placed(
    data: Any, info: ArrayInfo, region: RegionArg | None, shape: tuple[int, ...]
) -> tuple[Region, Any]:
    """The region of the array that ``data`` fills (all of it without ``region``), and the data
    in a form the encoder takes for the array's dtype; a PlanError when either does not fit."""
    target: Region = normalize_region(
        region if region is not None else tuple(slice(None) for _ in info.layout.shape),
        info.layout.shape,
    )
    want = tuple(s.stop - s.start for s in target)
    if want != shape:
        raise PlanError(f"data of shape {shape} does not fit the region {want} of the array")
    return target, _cast_source(data, info.dtype)


def _validated_job(
    sstore: ShardStore,
    meta: _Target,
    target: Region,
    data: Any,
    mode: Mode,
    strategy: Strategy,
    memory_limit: int | None,
) -> tuple[WritePlan, bool]:
    """The validated job that writes ``data`` into ``target``, and whether the write is shared:
    into an existing array, side by side with other such writes, whose shards they share are
    committed conditionally (on stores that can; the others keep one writer per array)."""
    shared = meta.create is None and mode in ("a", "r+") and versions(sstore) is not None
    job = job_for(
        ShardPlan(meta.info.layout, target),
        data,
        meta.info.dtype,
        strategy=strategy,
        memory_limit=memory_limit,
        shared=shared,
        forks=is_icechunk_store(sstore.store),  # an icechunk session's: its tasks fork it
    )
    job.validate()
    return job, shared


def _source(data: Any) -> Any:
    """``data`` as a numpy or dask array (or another array zarr can read), checked for what
    cannot be written: every refusal here comes before the store is touched."""
    xr = sys.modules.get("xarray")
    if xr is not None and isinstance(data, xr.DataArray | xr.Variable):
        var = data.variable if isinstance(data, xr.DataArray) else data
        # the dask or numpy array under it; a variable xarray has not loaded (opened without
        # chunks) is read window by window by the shard tasks, never whole
        data = var.data if var.chunks is not None or var._in_memory else LazyWindows(var)
    data = classic_dask(data)  # a dask_array array: its own graph, as a dask.array.Array
    if not hasattr(data, "shape") or not hasattr(data, "dtype"):
        data = np.asarray(data)
    refuse_unknown_chunks(data)
    return data


def refuse_unknown_chunks(data: Any, where: str = "") -> None:
    """A :class:`PlanError` for a dask array of unknown (NaN) chunk sizes, which no write can
    place: ``where`` starts the message (e.g. the variable's name)."""
    if _is_dask(data) and any(math.isnan(c) for dim in data.chunks for c in dim):
        raise PlanError(
            f"{where}the dask array has unknown chunk sizes (shape {data.shape}, e.g. after "
            "boolean indexing): call data.compute_chunk_sizes() first, or write it with known "
            "chunks"
        )


def _is_dask(data: Any) -> bool:
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(data, da.Array)


def _object_dtype(data: Any) -> Any:
    """The array dtype for object ``data`` when none is given: strings if numpy holds only str."""
    if not _is_dask(data) and all(isinstance(v, str) for v in np.asarray(data).flat):
        return str
    raise InvalidValueError(
        "data of dtype object: pass dtype= (e.g. dtype=str for Python strings, stored as zarr "
        "variable-length UTF-8 strings)"
    )


def _cast_source(data: Any, dtype: np.dtype[Any]) -> Any:
    """``data`` in a form the encoder takes for an array of ``dtype``, or a PlanError."""
    if dtype.kind == "T" and data.dtype.kind in "OUT":  # numpy StringDType: zarr's "string"
        if data.dtype.kind != "O":
            return data
        if _is_dask(data):
            return data.map_blocks(_to_strings, dtype=dtype)
        return _to_strings(np.asarray(data), dtype)
    if not np.can_cast(data.dtype, dtype, casting="same_kind"):
        raise PlanError(
            f"cannot write {data.dtype} data into a {dtype} array without loss: convert the "
            f"data first (e.g. data.astype({str(dtype)!r}))"
        )
    return data


def _to_strings(block: np.ndarray, dtype: Any = None) -> np.ndarray:
    """An object block of Python strings as numpy strings; a PlanError names a non-string."""
    for v in block.flat:
        if not isinstance(v, str):
            raise PlanError(
                f"a string array takes Python str values only, got {v!r} of type "
                f"{type(v).__name__}: convert the values first"
            )
    return block.astype(np.dtypes.StringDType() if dtype is None else dtype)


class LazyWindows:
    """An xarray variable not loaded yet (a backend's lazily indexed array) as a source the
    shard tasks read window by window (``engine/runs.py``): ``var[window].values`` loads that
    window only, where ``var.data`` would load the whole variable."""

    def __init__(self, var: Any) -> None:
        self.var = var
        self.shape = tuple(var.shape)
        self.dtype = var.dtype
        self.ndim = len(self.shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        return np.asarray(self.var[key].values)
