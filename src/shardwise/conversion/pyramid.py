"""``convert(..., pyramid=...)``: an existing zarr v2 or v3 array written as an OME-Zarr 0.5
pyramid. The source is opened as a lazy dask array and handed to
:func:`shardwise.write_pyramid` (the one pyramid pipeline: level 0 the source's values with the
target's shards, levels 1.. reduced from its blocks in the same graph, the source read once);
its inner chunks, shards, codecs and fill value are planned as a plain conversion plans them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import zarr

from ..compat import with_rectilinear_grids
from ..core.shardspec import ShardSpec
from ..errors import InvalidTypeError, InvalidValueError
from ..storage.nodes import walk
from ..storage.store import ShardStore, join
from .plan import ArrayPlan, plan_array
from .report import ArrayReport, ConvertReport
from .source import source_array

__all__ = ["PYRAMID_KEYS", "convert_pyramid", "pyramid_options"]

PYRAMID_KEYS = ("levels", "factors", "method", "dims", "scale", "translation", "units", "name")
"""The keywords of :func:`shardwise.write_pyramid` a ``pyramid=`` mapping may hold."""


def pyramid_options(value: Any) -> dict[str, Any] | None:
    """``pyramid=``: None or False (no pyramid), True (write_pyramid's defaults) or a mapping of
    its keywords among :data:`PYRAMID_KEYS` (checked by write_pyramid itself)."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidTypeError(
            "pyramid must be True, False, None or a mapping of write_pyramid's keywords "
            f"{list(PYRAMID_KEYS)}, got {value!r}"
        )
    unknown = sorted(str(k) for k in value if k not in PYRAMID_KEYS)
    if unknown:
        raise InvalidValueError(
            f"pyramid names {unknown}, which it does not take; it takes {list(PYRAMID_KEYS)}"
        )
    return dict(value)


def plan_source(
    zsrc: Any,
    path: str,
    dst_path: str,
    spec: ShardSpec,
    *,
    shard_bytes: int | None,
    chunks: Any,
    compressors: Any,
) -> ArrayPlan:
    """The source array at ``path`` planned as a conversion of it (level 0's layout); a group
    there is refused."""
    root, _, _ = walk(zsrc, path)
    if not isinstance(root, zarr.Array):
        raise InvalidValueError(
            f"pyramid=... converts one array, and {path or '/'!r} is a group: give path= of "
            "its image array (a Dataset of several variables: shardwise.write_pyramid)"
        )
    one = plan_array(
        root,
        path,
        join(dst_path, "0"),
        shards=spec,
        shard_bytes=shard_bytes,
        chunks=None if chunks is None else tuple(int(c) for c in chunks),
        compressors=compressors,
    )
    if isinstance(one.keep, list):
        raise InvalidValueError(
            "pyramid=... writes regular shards on every level: give shard sizes, not extents"
        )
    return one


def convert_pyramid(
    plan: ArrayPlan,
    zsrc: Any,
    zdst: Any,
    dst_path: str,
    options: dict[str, Any],
    report: ConvertReport,
    **write: Any,
) -> None:
    """Write the pyramid of ``plan``'s source at ``dst_path`` (``write``: write_pyramid's
    keywords of the write itself: mode, resume, lease, ...) and add it to ``report`` as one
    entry: the pyramid group, level 0's layout, what the write stored over every level."""
    from ..pyramid.write import write_pyramid

    started = time.perf_counter()
    dims = plan.create.get("dimension_names")
    if "dims" not in options and dims is not None and all(d is not None for d in dims):
        options = {**options, "dims": tuple(dims)}
    comp = plan.create.get("compressors", "auto")
    wrote = write_pyramid(
        source_array(plan, zsrc),
        zdst,
        path=dst_path or None,
        chunks=plan.chunks,
        shards=plan.shards,
        compressors=comp,
        fill_value=plan.create["fill_value"],
        **options,
        **write,
    )
    ome = _multiscale(zdst, dst_path)
    count = len(ome["datasets"])
    out = ArrayReport(
        path=dst_path,
        method="reencode",
        reason=f"OME-Zarr pyramid of {count} levels ({ome['type']}): level 0 the source, "
        "levels 1.. reduced from its blocks in the same graph",
        shards=plan.shards,
        chunks=plan.chunks,
        shards_written=wrote.shards_written,
        shards_skipped=wrote.shards_skipped,
        bytes_stored=wrote.bytes_stored,
        notes=list(wrote.notes),
    )
    out.objects_before = _objects(ShardStore(zsrc, plan.src_path))
    out.objects_after = _objects(ShardStore(zdst, dst_path))
    out.seconds = time.perf_counter() - started
    report.arrays.append(out)


def verify_pyramid(
    report: ConvertReport, plan: ArrayPlan, zsrc: Any, zdst: Any, threads: int | None
) -> None:
    """Every level checked as ``shardwise verify`` checks it, level 0 compared by value with
    the source (the reduced levels have no source to compare with)."""
    from ..durability.verify import verify
    from .verify import MAX_PROBLEMS, compare_values

    dst_path = report.arrays[-1].path
    ome = _multiscale(zdst, dst_path)
    problems: list[str] = []
    for d in ome["datasets"]:
        found = verify(zdst, path=join(dst_path, d["path"]) or None, threads=threads)
        problems += [str(p) for p in found.problems]
    problems += compare_values(replace(plan, dst_path=join(dst_path, "0")), zsrc, zdst)
    report.arrays[-1].verified = not problems
    report.problems += problems[:MAX_PROBLEMS]


@with_rectilinear_grids
def _multiscale(zdst: Any, path: str) -> dict[str, Any]:
    """The multiscales entry of the pyramid written at ``path``."""
    attrs: dict[str, Any] = zarr.open_group(zdst, path=path, mode="r").attrs.asdict()
    entry: dict[str, Any] = attrs["ome"]["multiscales"][0]
    return entry


def _objects(store: ShardStore) -> int:
    from ..storage.store import JOURNAL

    # every level's own journal (``k/.shardwise/...``) is bookkeeping, not the pyramid's
    return sum(1 for n in store.list("") if JOURNAL not in n.split("/"))
