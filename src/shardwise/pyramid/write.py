"""``shardwise.write_pyramid``: a multiscale pyramid (OME-Zarr 0.5) from one image, every level
written in one dask graph through the one write pipeline (one ``ArrayWrite`` per level).

Phases, as every front end: check everything (arguments, the store, every level's metadata
built in memory, every level's job validated) -> one ``Pipeline`` over the levels: every lease
or none, clear (mode "w"), markers and level metadata, one graph (level k+1 reduced from level
k's blocks; every shard of every level written by one task), then the group's ``zarr.json``
with the ``ome`` attributes (last: a pyramid cut short is not advertised as one), markers done.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core import args
from ..core.job import Strategy
from ..engine.report import WriteReport
from ..storage.consolidated import Nodes
from ..storage.icechunk import writes_into_session
from ..storage.store import ShardStore, resolve_store
from ..write import execute as execution
from ..write.clear import clear_for_replace
from ..write.intent import array_write
from ..write.options import WriteOptions
from ..write.pipeline import ArrayWrite
from . import geozarr, images, options
from .plan import LevelPlan, plan_image
from .target import Target, check_target, create_level

__all__ = ["write_pyramid"]


@writes_into_session
def write_pyramid(
    data: Any,
    store: Any,
    *,
    levels: int | str = "auto",
    factors: int | Sequence[int] | Mapping[str, int] = 2,
    method: str = "mean",
    dims: Sequence[str] | None = None,
    path: str | None = None,
    chunks: Any = "auto",
    shards: Any = None,
    compressors: Any = "auto",
    fill_value: Any = None,
    scale: Mapping[str, float] | None = None,
    translation: Mapping[str, float] | None = None,
    units: Mapping[str, str] | None = None,
    name: str | None = None,
    mode: str = "w-",
    resume: bool = False,
    write_empty_chunks: bool = False,
    threads: int | None = None,
    fsync: bool = False,
    storage_options: dict[str, Any] | None = None,
    compute: bool = True,
    progress: bool = False,
    lease: bool | None = None,
    break_lease: bool = False,
    strategy: Strategy = "auto",
    memory_limit: int | str | None = None,
    layout: str = "ome",
    commit: str | None = None,
) -> WriteReport | Any:
    """Write a multiscale pyramid of an image as an OME-Zarr 0.5 group of sharded arrays.

    Level 0 is the image; level k+1 is level k reduced by ``factors`` along the space axes
    (``x``, ``y``, ``z``; time ``t`` and channel ``c`` are never reduced). All levels are
    written in one dask graph: each level is reduced from the blocks of the level above while
    they are in memory, so the source is read once, and every shard of every level is written
    by one task once: level 0 by the strategy :func:`write_array` would pick, the reduced
    levels ``direct`` where a shard's task fits half the memory budget and ``staged`` where it does
    not (with ``strategy="auto"``). The levels written direct whose shards nest (each a
    multiple of the factor, or one shard along the axis) are a tree of shard tasks: a shard's
    task writes it and hands its reduced block on to the next level's, so the memory held does
    not grow with the image. Odd sizes follow the ceil rule of
    ngff-zarr and ome-zarr-py: a level of ``n`` samples has ``ceil(n / f)`` samples at the next,
    its last block reduced over the samples present.

    The group at ``path`` holds the levels as arrays ``"0"``, ``"1"``, ... and, written after
    their data, its ``zarr.json`` with the ``ome`` attributes: ``version`` "0.5" and one
    ``multiscales`` entry with the axes (types space, time, channel; units if given) and per
    level a ``scale`` and a ``translation`` transformation. A Dataset of several data
    variables is one OME-Zarr image per variable, each in the subgroup named after it
    (levels ``"<var>/0"``, ``"<var>/1"``, ..., the ``ome`` attributes on ``"<var>"``), all in
    the same graph; the group at ``path`` is then a plain group (OME-Zarr 0.5 defines no
    metadata for a collection of images: readers open each subgroup as an image).

    Parameters
    ----------
    data : numpy.ndarray, dask.array.Array, xarray.DataArray or xarray.Dataset
        The image, 2-D to 5-D. A DataArray's dims name its axes; a Dataset of one data
        variable is that image, of several one image per variable (each 2-D to 5-D, named
        by its own dims; its name a group name). The coordinates of a DataArray's (or a
        variable's) space axes give their scale, translation and units (below).
    store : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        A zarr ``Store``, a local path or a URL; or a writable ``icechunk.Session``, as
        :func:`write_array` writes it: every level's shard tasks write into forks of the
        session, merged back into it (checked disjoint) before the group's metadata; no
        lease, ``resume``, ``compute=False`` or ``strategy="staged"`` there.
    levels : int or "auto", default "auto"
        The number of levels, level 0 included (1 to 32); ``"auto"`` reduces until every
        space axis fits one inner chunk of level 0.
    factors : int, sequence of int or dict, default 2
        The factor of each reduction: an int for every space axis, ``{"x": 2, "y": 2}`` (axes
        not named: 1), or one int per axis (1 on time and channel axes). An axis down to one
        sample is not reduced further.
    method : {"mean", "nearest", "mode"}, default "mean"
        ``"mean"``: the mean of each block (floats accumulate in float64; integers exactly,
        without overflow, rounded to nearest, halves to even); ``"nearest"``: each block's
        first sample (labels); ``"mode"``: each block's most frequent value, ties to the
        smallest, NaN one value after every number (labels).
    dims : sequence of str, optional
        The axis names, among ``t``, ``c``, ``z``, ``y``, ``x`` in that order (default: a
        DataArray's dims, else the last ``ndim`` of them).
    path : str, optional
        The pyramid group's path inside ``store`` (default: its root).
    chunks : int, tuple of int or "auto", default "auto"
        Level 0's inner chunks, as in :func:`write_array`; smaller levels clip them to their
        shape.
    shards : int or tuple of int, optional
        Level 0's shards, as in :func:`write_array` (default: up to 64 MiB; a target such
        as ``"2GB"`` or ``"XY"`` too); smaller levels clip them to their shape (in whole
        chunks).
    compressors : zarr codec, list of codecs, "auto" or None, default "auto"
        As in :func:`write_array`, for every level.
    fill_value : scalar, optional
        As in :func:`write_array`, for every level.
    scale : dict, optional
        Level 0's physical size of one sample per axis; level k's is scaled by its factor
        from level 0. Default: a space axis with a 1-D numeric coordinate whose values step
        up uniformly (within 1e-6 of the step) takes that step, every other axis 1 (not
        uniform, descending or not numbers: 1, as OME-Zarr's scale and translation cannot
        say them). An axis named here wins over its coordinate.
    translation : dict, optional
        Level 0's position of its first sample per axis (default: a uniform coordinate's
        first value, as for ``scale``, else 0). Levels reduced by mean or mode move by half a
        block less half a sample (the centre of their first block).
    units : dict, optional
        The unit of each axis, as OME-Zarr names them (``{"x": "micrometer"}``; default: a
        uniform coordinate's ``units`` attribute when it is one of OME-Zarr's space units).
    name : str, optional
        The ``name`` of the multiscales entry.
    mode : {"w-", "w"}, default "w-"
        ``"w-"`` creates the pyramid (refused when anything is at ``path``), ``"w"`` replaces
        whatever is there.
    resume : bool, default False
        Continue an interrupted call with the same arguments: the shards of every level it
        stored (and recorded) are not written again.
    write_empty_chunks : bool, default False
        Store inner chunks equal to the fill value too, as :func:`write_array`.
    threads : int, optional
        Caps the threads that encode inner chunks, as in :func:`write_array`.
    fsync : bool, default False
        Make each shard durable (file and directory fsync) on local filesystems.
    storage_options : dict, optional
        fsspec options, for a ``store`` given as a URL.
    compute : bool, default True
        False returns one dask ``Delayed`` that writes every level and computes the report.
    progress : bool, default False
        Show a progress bar over the shards of every level.
    lease : bool, optional
        Hold every level's lease (default: on when ``compute=True`` and the store can delete),
        as :func:`write_array`: a zarr ``ZipStore``, which only appends, is written without
        leases and refuses ``True`` before anything is written.
    break_lease : bool, default False
        Take over the leases of a writer known to be gone.
    strategy : {"auto", "direct", "staged"}, default "auto"
        As in :func:`write_array`, for every level.
    memory_limit : int or str, optional
        Bytes one task may hold, as in :func:`write_array`.
    layout : {"ome", "geozarr"}, default "ome"
        ``"ome"``: the OME-Zarr 0.5 image above. ``"geozarr"``: the GeoZarr multiscales
        layout of a geospatial Dataset (or DataArray): child groups ``"0"``, ``"1"``, ...
        (a DataTree of levels), each holding every data variable over ``(..., "y", "x")``
        with its ``y``/``x`` coordinates reduced as the data (block means for mean and mode,
        each block's first for nearest), the other coordinates, the grid-mapping (CRS)
        variable and the attributes carried over; the group carries the zarr-conventions
        ``multiscales`` attributes (``layout`` of levels, each derived from the one before,
        ``resampling_method``) and, with every level group, the ``proj`` (the source's CRS)
        and ``spatial`` (each level's affine transform, shape and bbox, for a regular y/x
        grid) conventions. ``factors`` is then an int or ``{"y": .., "x": ..}``, and
        ``dims``, ``scale``, ``translation``, ``units`` and ``name`` are not taken (the
        coordinates say it).
    commit : str, optional
        Into an icechunk session: commit it with this message once the pyramid is in it
        (default: the caller commits).

    Returns
    -------
    WriteReport or dask.delayed.Delayed
        What the write did, summed over every level (shard keys prefixed with their level's
        path), or with ``compute=False`` a ``Delayed`` that computes it.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A keyword of the wrong type or outside what it accepts (the message names it and what
        is accepted), axes that are not an OME-Zarr image's (a Dataset's: naming the
        variable), or ``method="mean"`` of data that is not numbers.
    ArrayExistsError
        ``mode="w-"`` and something is at ``path`` (with ``resume=True``: levels with other
        metadata).
    PlanError
        A level whose task would not fit ``memory_limit``, or a dask array of unknown chunk
        sizes.
    LeaseHeldError
        Another writer holds a level's lease.
    TransactionError
        Into an icechunk session: two shard tasks wrote one shard, or the commit conflicts.

    Examples
    --------
    >>> import numpy as np, shardwise, zarr
    >>> image = np.arange(300 * 200, dtype="uint16").reshape(300, 200)
    >>> report = shardwise.write_pyramid(image, zarr.storage.MemoryStore(), levels=3,
    ...                                  chunks=64, shards=128)
    >>> report.shards_written
    9
    """
    # 1. every keyword, then the image: nothing looked at yet
    o = WriteOptions.checked(
        modes=("w-", "w"),
        verb="write_pyramid",
        mode=mode,
        strategy=strategy,
        resume=resume,
        write_empty_chunks=write_empty_chunks,
        fsync=fsync,
        compute=compute,
        progress=progress,
        break_lease=break_lease,
        lease=lease,
        threads=threads,
        memory_limit=memory_limit,
        path=path,
        storage_options=storage_options,
    )
    args.store_path("name", name, nested=False)
    args.choice("layout", layout, ("ome", "geozarr"))
    create = dict(compressors=compressors, fill_value=fill_value)
    # into an icechunk session: its own refusals first; every level direct into its forks
    dest, o = execution.Target.open(store, commit, o)
    zstore = resolve_store(dest.store, mode="w", storage_options=o.storage_options)
    if layout == "geozarr":
        geo = geozarr.geo_inputs(data, (dims, scale, translation, units, name))
        plan_var = functools.partial(
            plan_image, strategy=o.strategy, memory_limit=o.memory_limit, compute=o.compute,
            forks=dest.forks,
        )  # fmt: skip
        # the levels' small variables are in the plan too; groups: the level groups' attributes
        plan, attrs, groups = geozarr.geo_plan(
            geo, factors, levels, method, chunks, shards, create, plan_var
        )
        subgroups: dict[str, dict[str, Any]] = {}
    else:
        found = images.sources(data, dims, scale, translation, units)
        given = [_given(src, factors, levels, method, chunks, shards) for src in found]
        # 2. every level planned and checked, the store read but not written
        plan_one = functools.partial(
            plan_image, create=create, strategy=o.strategy, memory_limit=o.memory_limit,
            compute=o.compute, forks=dest.forks,
        )  # fmt: skip
        plan, attrs, subgroups = images.ome_plan(found, given, plan_one, name)
        groups = []  # no GeoZarr level groups
    # a store that cannot delete (ZipStore) is written without leases, refuses lease=True
    leased = dest.lease(o.lease, o.compute, zstore)
    target = check_target(zstore, path, [(lv.path, lv.probe) for lv in plan], o.mode, o.resume)
    # 3. the write: leases, clear, markers and metadata, one graph, the group's metadata
    writes = [_write(zstore, lv, target, o) for lv in plan]
    group = ShardStore(zstore, target.prefix, fsync=o.fsync)
    # the pyramid's group consolidated (xr.open_datatree reads it without a warning), and the
    # consolidated groups above it
    # (a session's store keeps no consolidated metadata: it lists a group's members itself)
    nodes = [] if dest.forks else [Nodes(zstore, (target.prefix,), consolidate=(target.prefix,))]
    call = execution.WriteCall(
        writes,
        lease=leased,
        break_lease=o.break_lease,
        compute=o.compute,
        progress=o.progress,
        desc="shardwise pyramid",
        nodes=nodes,
        clear=(lambda _: _clear(zstore, target, plan, o)) if o.mode == "w" else None,
        then=lambda: _finish(group, groups, attrs, subgroups),
    )
    return execution.execute(dest, call)


def _clear(zstore: Any, target: Target, plan: list[Any], o: WriteOptions) -> None:
    """Mode "w": the group but its levels (each clears its own, sparing its lease and, resumed,
    its stored shards); another writer's lease there refuses first."""
    levels_kept = [f"{target.key(lv.path)}/" for lv in plan]
    clear_for_replace(
        zstore, [target.prefix], levels_kept, resume=o.resume, break_lease=o.break_lease
    )


def _finish(
    group: ShardStore,
    groups: Any,
    attrs: dict[str, Any],
    subgroups: dict[str, dict[str, Any]],
) -> None:
    """After the data: the images' subgroups (OME) or the level groups (GeoZarr), then the
    pyramid group's ``zarr.json``."""
    images.finish_images(group, subgroups)
    geozarr.finish(group, groups, attrs)


def _given(
    src: images.Source, factors: Any, levels: Any, method: Any, chunks: Any, shards: Any
) -> options.Shape:
    """The pyramid keywords checked against one image's axes."""
    img, scale, translation, units = src.image, src.scale, src.translation, src.units
    axes = img.axes
    return options.Shape(
        factors=options.factors(factors, axes),
        levels=options.levels(levels),
        method=options.method(method, np.dtype(img.data.dtype)),
        scale=options.per_axis("scale", scale, axes, float, 1.0),
        translation=options.per_axis("translation", translation, axes, float, 0.0),
        units=options.per_axis("units", units, axes, str, ""),
        chunks=options.shape_of("chunks", chunks, len(axes)),
        shards=options.shape_of("shards", shards, len(axes)),
    )


def _write(zstore: Any, lv: LevelPlan, target: Target, o: WriteOptions) -> ArrayWrite:
    """The pipeline's write of one level, by the policy's one builder as write_array's (a
    level a resumed call keeps is neither cleared nor created again)."""
    key = target.key(lv.path)
    return array_write(
        ShardStore(zstore, key, fsync=o.fsync),
        lv.info,
        target.intents[lv.path],
        lv.source,
        job=lv.job,
        create=functools.partial(create_level, zstore, key, lv.create, lv.probe),
        resume=o.resume,
        compute=o.compute,
        options=o.settings,
        prefix=lv.path,
        tree=lv.tree,
    )
