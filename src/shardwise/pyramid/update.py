"""Pyramids follow their level 0: :func:`update_pyramid` reduces again only what a region of
level 0 changed, level by level.

A region written into level 0 of a pyramid (``write_array(..., region=...)``, a
``RegionWriter``) leaves the levels above it stale. For each level ``k`` above, the region
grows to whole windows of that step's factors, the windows are read from level ``k - 1``
(already updated), reduced by the pyramid's own method (the one ``write_pyramid`` used, read from
its ``multiscales`` metadata) and written into level ``k`` as a region write: each shard it
touches merged by its one task, conditionally, so processes updating other regions at once
lose nothing. What is read and held is the region's windows, never a level.

Rows appended to level 0 along one axis (``write_array(..., append_dim=)``) are followed the same
way: a level shorter than its source asks gets the reduced rows it lacks appended (its last
shard merged where they fall inside it), the rows it has updated as a region. OME-Zarr levels
only: a GeoZarr pyramid's levels carry coordinates, which this does not grow.

Regions aligned to the top level's cumulative factors never share an element of an upper
level; two unaligned neighbours updated at the same moment may each reduce an upper element
shared by both before the other's level-0 change is there: run ``update_pyramid`` again over
both regions when such writers are done.
"""

from __future__ import annotations

import itertools
from typing import Any

from ..core.layout import Region, normalize_region
from ..engine.load import read_array
from ..engine.report import WriteReport
from ..errors import InvalidValueError
from ..storage.icechunk import is_session
from ..storage.nodes import open_info
from ..storage.store import join, resolve_store
from .reduce import METHODS, reduce_block

__all__ = ["update_pyramid"]


def update_pyramid(
    store: Any,
    region: Any,
    *,
    path: str | None = None,
    threads: int | None = None,
    lease: bool | None = None,
    storage_options: dict[str, Any] | None = None,
) -> WriteReport:
    """Bring every level of the pyramid at ``path`` (OME-Zarr, or GeoZarr: each of its data
    variables) up to date with ``region`` of its level 0.

    Parameters
    ----------
    store : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        Where the pyramid is (a group written by :func:`shardwise.write_pyramid`).
    region : tuple of slice
        The region of level 0 that changed: a slice per dimension of its arrays, or one
        ``...`` (a GeoZarr pyramid's: of each data variable, whose last dimensions are y, x).
        Rows appended to level 0 (OME-Zarr) are reduced and appended to every level above,
        whatever part of them the region names.
    path : str, optional
        The pyramid group's path in the store.
    threads : int, optional
        Threads encoding each shard's inner chunks.
    lease : bool, optional
        Hold each level's shared lease while its region is written (default: where the
        store can delete).
    storage_options : dict, optional
        For a URL ``store``, as fsspec takes them.

    Returns
    -------
    WriteReport
        The region writes of the levels above level 0, added up; its notes name each level's
        region.

    Raises
    ------
    InvalidValueError
        No multiscales at ``path``, a method ``write_pyramid`` does not reduce by, or a
        level 0 grown along more than one axis, or grown in a GeoZarr pyramid.

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_pyramid(np.zeros((128, 128), "u1"), store, levels=2, chunks=32,
    ...                             shards=64)
    >>> zarr.open_array(store, path="0", mode="r+")[:64, :64] = 8
    >>> _ = shardwise.update_pyramid(store, (slice(0, 64), slice(0, 64)))
    >>> int(zarr.open_array(store, path="1", mode="r")[0, 0])
    8
    """
    read_from = store.store if is_session(store) else store
    zstore = resolve_store(read_from, mode="r", storage_options=storage_options)
    total = WriteReport()
    chains, method, ome = _chains(zstore, path)
    for paths, steps in chains:
        total += _update_chain(
            (zstore, store), paths, steps, (method, ome), region,
            dict(threads=threads, lease=lease, storage_options=storage_options),
        )  # fmt: skip
    return total


def _update_chain(
    stores: tuple[Any, Any],
    paths: list[str],
    steps: list[tuple[int, ...]],
    how: tuple[str, bool],
    region: Any,
    kw: dict[str, Any],
) -> WriteReport:
    """One array's levels (``paths``, level 0 first) updated above ``region``; ``how``: the
    pyramid's method, and whether its levels may grow (OME-Zarr: arrays without coordinates)."""
    from ..api import write_array

    zstore, store = stores
    method, grows = how
    shapes = [open_info(zstore, p).layout.shape for p in paths]
    reg = normalize_region(region, shapes[0])
    total = WriteReport()
    for k, step in enumerate(steps, start=1):
        step = (1,) * (len(reg) - len(step)) + step  # GeoZarr's steps are y and x's
        # the level's shape as its source now asks: longer where level 0 was appended to
        wanted = tuple(-(-n // f) for n, f in zip(shapes[k - 1], step, strict=True))
        up = tuple(
            slice(r.start // f, min(-(-r.stop // f), n))
            for r, f, n in zip(reg, step, wanted, strict=True)
        )
        up, grown = _with_new_rows(up, shapes[k], wanted, paths[k], grows)
        windows = tuple(
            slice(u.start * f, min(u.stop * f, n))
            for u, f, n in zip(up, step, shapes[k - 1], strict=True)
        )
        block = read_array(zstore, windows, path=paths[k - 1], threads=kw["threads"])
        values = reduce_block(block, step, method)
        if grown is None:
            total += write_array(values, store, path=paths[k], region=up, mode="r+", **kw)
        else:  # the rows the level has, merged; the rows it lacks, appended
            old = shapes[k][grown] - up[grown].start
            inside = tuple(slice(u.start, shapes[k][grown]) if d == grown else u
                           for d, u in enumerate(up))  # fmt: skip
            cut = (slice(None),) * grown
            if old:
                total += write_array(values[(*cut, slice(0, old))], store, path=paths[k],
                                     region=inside, mode="r+", **kw)  # fmt: skip
            total += write_array(values[(*cut, slice(old, None))], store, path=paths[k],
                                 append_dim=grown, **kw)  # fmt: skip
        total.notes.append(f"level {paths[k]}: {_text(up)}")
        shapes[k] = wanted
        reg = up
    return total


def _with_new_rows(
    up: Region, shape: tuple[int, ...], wanted: tuple[int, ...], path: str, grows: bool
) -> tuple[Region, int | None]:
    """``up`` grown to the rows a level lacks where its source was appended to (along one
    axis), and that axis (None where the level has every row its source asks for)."""
    grown = [d for d, (n, w) in enumerate(zip(shape, wanted, strict=True)) if w > n]
    if not grown:
        return up, None
    if not grows:
        raise InvalidValueError(
            f"level {path!r} is shorter than its source asks (appended to?): a GeoZarr "
            "pyramid's levels carry coordinates; update_pyramid grows OME-Zarr levels only "
            "(write the pyramid again)"
        )
    if len(grown) > 1:
        raise InvalidValueError(
            f"level {path!r} lacks rows along axes {grown}: update_pyramid follows appends to "
            "level 0 along one axis at a time"
        )
    d = grown[0]
    out = tuple(slice(min(u.start, shape[d]), wanted[d]) if i == d else u
                for i, u in enumerate(up))  # fmt: skip
    return out, d


Chains = list[tuple[list[str], list[Any]]]


def _chains(zstore: Any, path: str | None) -> tuple[Chains, str, bool]:
    """The arrays of the pyramid at ``path``, each as its level paths (in the store) and the
    factors of each step, the method it was reduced by, and whether it is OME-Zarr (levels
    without coordinates, which may grow)."""
    import zarr

    try:
        group = zarr.open_group(zstore, path=path or "", mode="r")
        attrs: Any = group.attrs.asdict()
    except (FileNotFoundError, ValueError, TypeError):
        attrs = {}
    if "ome" in attrs:
        return (*_ome(attrs, path), True)
    if isinstance(attrs.get("multiscales"), dict):
        return (*_geozarr(group, attrs["multiscales"], path), False)
    raise InvalidValueError(
        f"no OME-Zarr or GeoZarr multiscales at {path or '/'!r}: update_pyramid updates "
        "pyramids write_pyramid wrote"
    )


def _ome(attrs: Any, path: str | None) -> tuple[Chains, str]:
    ms = attrs["ome"]["multiscales"][0]
    scales = [_scale(d) for d in ms["datasets"]]
    steps = [
        tuple(round(b / a) for a, b in zip(lo, hi, strict=True))
        for lo, hi in itertools.pairwise(scales)
    ]
    paths = [join(path, str(d["path"])) for d in ms["datasets"]]
    return [(paths, steps)], _method(str(ms.get("type", "")), path)


def _geozarr(group: Any, ms: Any, path: str | None) -> tuple[Chains, str]:
    layout = ms["layout"]
    method = {"average": "mean"}.get(ms.get("resampling_method"), ms.get("resampling_method"))
    steps = [tuple(round(s) for s in e["transform"]["scale"]) for e in layout[1:]]
    level0 = group[str(layout[0]["asset"])]
    names = [
        n
        for n, a in level0.arrays()
        if tuple(a.metadata.dimension_names or ())[-2:] == ("y", "x") and a.ndim >= 2
    ]
    chains = [([join(path, str(e["asset"]), n) for e in layout], steps) for n in sorted(names)]
    return chains, _method(str(method), path)


def _method(method: str, path: str | None) -> str:
    if method not in METHODS:
        raise InvalidValueError(
            f"the pyramid at {path or '/'!r} was reduced by {method!r}: update_pyramid reduces "
            f"by {sorted(METHODS)}"
        )
    return method


def _scale(dataset: dict[str, Any]) -> tuple[float, ...]:
    for t in dataset["coordinateTransformations"]:
        if t["type"] == "scale":
            return tuple(float(s) for s in t["scale"])
    raise InvalidValueError(f"level {dataset.get('path')!r} has no scale")


def _text(region: Region) -> str:
    return ", ".join(f"{r.start}:{r.stop}" for r in region)
