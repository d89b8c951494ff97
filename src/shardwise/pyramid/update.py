"""Pyramids follow their level 0: :func:`update_pyramid` reduces again only what a region of
level 0 changed, level by level.

A region written into level 0 of a pyramid (``write_array(..., region=...)``, a
``RegionWriter``) leaves the levels above it stale. For each level ``k`` above, the region
grows to whole windows of that step's factors, the windows are read from level ``k - 1``
(already updated), reduced by the pyramid's own method (the one ``write_pyramid`` used, read from
its ``multiscales`` metadata) and written into level ``k`` as a region write: each shard it
touches merged by its one task, conditionally, so processes updating other regions at once
lose nothing. What is read and held is the region's windows, never a level.

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
    """Bring every level of the OME-Zarr pyramid at ``path`` up to date with ``region`` of
    its level 0.

    Parameters
    ----------
    store : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        Where the pyramid is (a group written by :func:`shardwise.write_pyramid`).
    region : tuple of slice
        The region of level 0 that changed: a slice per dimension, or one ``...``.
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
        No OME-Zarr multiscales at ``path``, or a method ``write_pyramid`` does not reduce by.
    """
    from ..api import write_array

    read_from = store.store if is_session(store) else store
    zstore = resolve_store(read_from, mode="r", storage_options=storage_options)
    paths, steps, method = _levels(zstore, path)
    shapes = [open_info(zstore, join(path, p)).layout.shape for p in paths]
    reg = normalize_region(region, shapes[0])
    total = WriteReport()
    for k, step in enumerate(steps, start=1):
        up = tuple(
            slice(r.start // f, min(-(-r.stop // f), n))
            for r, f, n in zip(reg, step, shapes[k], strict=True)
        )
        windows = tuple(
            slice(u.start * f, min(u.stop * f, n))
            for u, f, n in zip(up, step, shapes[k - 1], strict=True)
        )
        block = read_array(zstore, windows, path=join(path, paths[k - 1]), threads=threads)
        values = reduce_block(block, step, method)
        total += write_array(
            values, store, path=join(path, paths[k]), region=up, mode="r+", threads=threads,
            lease=lease, storage_options=storage_options,
        )  # fmt: skip
        total.notes.append(f"level {paths[k]}: {_text(up)}")
        reg = up
    return total


def _levels(zstore: Any, path: str | None) -> tuple[list[str], list[tuple[int, ...]], str]:
    """The level paths, each step's factors and the method of the pyramid at ``path``."""
    import zarr

    try:
        attrs: Any = zarr.open_group(zstore, path=path or "", mode="r").attrs.asdict()
        ms = attrs["ome"]["multiscales"][0]
        datasets = ms["datasets"]
    except (KeyError, IndexError, TypeError, FileNotFoundError, ValueError):
        raise InvalidValueError(
            f"no OME-Zarr multiscales at {path or '/'!r}: update_pyramid updates pyramids "
            "write_pyramid wrote with layout='ome'"
        ) from None
    method = str(ms.get("type", ""))
    if method not in METHODS:
        raise InvalidValueError(
            f"the pyramid at {path or '/'!r} was reduced by {method!r}: update_pyramid reduces "
            f"by {sorted(METHODS)}"
        )
    scales = [_scale(d) for d in datasets]
    steps = [
        tuple(round(b / a) for a, b in zip(lo, hi, strict=True))
        for lo, hi in itertools.pairwise(scales)
    ]
    return [str(d["path"]) for d in datasets], steps, method


def _scale(dataset: dict[str, Any]) -> tuple[float, ...]:
    for t in dataset["coordinateTransformations"]:
        if t["type"] == "scale":
            return tuple(float(s) for s in t["scale"])
    raise InvalidValueError(f"level {dataset.get('path')!r} has no scale")


def _text(region: Region) -> str:
    return ", ".join(f"{r.start}:{r.stop}" for r in region)
