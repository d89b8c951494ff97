"""Every level of one pyramid image planned before anything is written: its geometry, layout and
metadata (built and checked in memory by zarr-python), its dask array in the one graph and its
validated job; write.py hands each level to the pipeline as one ``ArrayWrite``."""

from __future__ import annotations

import functools
import sys
import uuid
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..codec.metadata import ArrayInfo, default_compressors
from ..core.job import Strategy, WritePlan
from ..core.layout import Layout
from ..core.plan import ShardPlan
from ..core.planner import default_layout
from ..core.pyramid import Level, auto_levels, level_layout, nests, pyramid_levels
from ..engine.tree import TreeLink
from ..engine.write import as_dask
from ..errors import PlanError
from ..storage.nodes import open_info
from ..write.intent import job_for
from . import options
from .levels import level_arrays
from .reduce import reduce_block

__all__ = ["LevelPlan", "plan_image"]


@dataclass(frozen=True)
class LevelPlan:
    """One level to write: its geometry, source, metadata and validated job."""

    path: str
    geometry: Level
    source: Any
    create: dict[str, Any]  # the zarr.create_array keywords
    probe: Any  # the array built in memory from them
    info: ArrayInfo
    job: WritePlan
    # written in the image's tree of shard tasks (engine/tree.py), else alone (None)
    tree: TreeLink | None = None


def plan_image(
    img: options.Image,
    given: options.Shape,
    create: dict[str, Any],
    strategy: Strategy,
    memory_limit: int | None,
    compute: bool,
    var: str | None = None,
    group: str | None = None,
    forks: bool = False,
) -> list[LevelPlan]:
    """Every level: geometry, layout and metadata (built and checked in memory), dask source
    and validated job. Level ``k`` is at ``k``; a GeoZarr variable's at ``k/var``; an OME image
    of a Dataset's several variables at ``group/k``."""
    from ..api import create_in_memory
    from ..write.target import refuse_unknown_chunks

    create = {**create, "dimension_names": img.axes}

    data = img.data
    refuse_unknown_chunks(data)
    shape = tuple(int(n) for n in data.shape)
    dtype = np.dtype(data.dtype)
    c0, s0 = default_layout(shape, dtype.itemsize, given.chunks, given.shards)
    kwargs0 = _create_kwargs(shape, dtype, c0, s0, create)
    # what zarr refuses (codecs, fill values, layouts) is refused here, naming the keyword
    probe0 = create_in_memory(kwargs0)
    c0, s0 = tuple(probe0.chunks), tuple(probe0.shards)
    geometry = pyramid_levels(
        shape,
        given.factors,
        given.levels or auto_levels(shape, given.factors, c0),
        centered=given.method != "nearest",
        scale=given.scale,
        translation=given.translation,
    )
    source = data if _is_dask(data) else as_dask(data, s0, copy=not compute)
    arrays = level_arrays(source, geometry, given.method)
    out = []
    for k, (lv, arr) in enumerate(zip(geometry, arrays, strict=True)):
        ck, sk = level_layout(lv.shape, c0, s0)
        kwargs = kwargs0 if k == 0 else _create_kwargs(lv.shape, dtype, ck, sk, create)
        probe = probe0 if k == 0 else create_in_memory(kwargs)
        info = open_info(probe.store)
        job = _job(k, info.layout, arr, dtype, strategy, memory_limit, forks)
        where = f"{k}/{var}" if var else (f"{group}/{k}" if group else str(k))
        out.append(LevelPlan(where, lv, arr, kwargs, probe, info, job))
    return _linked(out, given.method)


def _linked(levels: list[LevelPlan], method: str) -> list[LevelPlan]:
    """The levels from the first of a run up to the top, each written direct and nesting in
    the next (:func:`~shardwise.core.pyramid.nests`), linked into one tree of shard tasks
    (built by the pipeline's one graph builder); the levels below it stay written alone, as
    ``map_blocks`` arrays."""
    first = len(levels)
    while first > 0:
        lv = levels[first - 1]
        shape = lv.geometry.shape
        if lv.job.strategy != "direct" or 0 in shape:
            break
        if first < len(levels):
            up = levels[first]
            step = _step(lv.geometry, up.geometry)
            if not nests(shape, lv.info.layout.shard_shape, up.info.layout.shard_shape, step):
                break
        first -= 1
    if len(levels) - first < 2:  # a tree of one level is the level written alone
        return levels
    tree = uuid.uuid4().hex
    out = levels[:first]
    for k in range(first, len(levels)):
        top = k + 1 == len(levels)
        into = None if top else _step(levels[k].geometry, levels[k + 1].geometry)
        reduce = None if into is None else functools.partial(_reduce, into, method)
        link = TreeLink(tree, k, into, reduce)
        # a tree runs one task per shard (each hands its reduced block on): no runs
        out.append(replace(levels[k], tree=link, job=replace(levels[k].job, per_task=1)))
    return out


def _reduce(step: tuple[int, ...], method: str, block: np.ndarray) -> np.ndarray:
    """A tree level's shard block reduced into its part of the next level's."""
    return reduce_block(block, step, method)


def _step(lv: Level, up: Level) -> tuple[int, ...]:
    """The factors that reduce ``lv`` to ``up``, the next level."""
    return tuple(b // a for a, b in zip(lv.factors, up.factors, strict=True))


def _job(
    k: int,
    layout: Layout,
    arr: Any,
    dtype: np.dtype[Any],
    strategy: Strategy,
    memory_limit: int | None,
    forks: bool = False,
) -> WritePlan:
    """Level ``k``'s validated job (refusals name the level), by the one job maker: level 0
    as ``write_array``'s, a reduced level by the pyramid's half-budget rule (its ``role``)."""
    plan = ShardPlan(layout, tuple(slice(0, n) for n in layout.shape))
    try:
        job = job_for(
            plan,
            arr,
            dtype,
            strategy=strategy,
            memory_limit=memory_limit,
            role="reduced" if k else "array",
            forks=forks,
        )
        job.validate()
    except PlanError as e:
        raise PlanError(f"level {k}: {e}") from None
    return job


def _create_kwargs(
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    chunks: tuple[int, ...],
    shards: tuple[int, ...],
    create: dict[str, Any],
) -> dict[str, Any]:
    """The ``zarr.create_array`` keywords of one level."""
    comp = create["compressors"]
    out: dict[str, Any] = dict(
        shape=shape,
        dtype=dtype,
        chunks=chunks,
        shards=shards,
        zarr_format=3,
        compressors=default_compressors() if isinstance(comp, str) and comp == "auto" else comp,
        dimension_names=list(create["dimension_names"]),
    )
    if create["fill_value"] is not None:
        out["fill_value"] = create["fill_value"]
    if create.get("attributes"):
        out["attributes"] = create["attributes"]
    return out


def _is_dask(data: Any) -> bool:
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(data, da.Array)
