"""Check a conversion against its source: every shard as ``shardwise verify`` checks it (index,
ranges, every inner chunk decoded with its checksums), then copied arrays byte for byte per inner
chunk and re-encoded ones value for value."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..errors import CorruptShardError
    from .plan import ArrayPlan
    from .report import ArrayReport, ConvertReport

MAX_PROBLEMS = 20  # per array, in the report


def verify_conversion(
    report: ConvertReport,
    plans: list[ArrayPlan],
    zsrc: Any,
    zdst: Any,
    *,
    threads: int | None = None,
) -> None:
    """Set ``verified`` on every array of ``report`` and add what differs to its problems."""
    from ..durability.verify import verify

    entries = {a.path: a for a in report.arrays}
    for plan in plans:
        rep = entries[plan.dst_path]
        # every stored inner chunk decoded (and its checksum checked) exactly as `shardwise
        # verify` does: equal bytes prove the copy, not that the source chunk was sound
        found = verify(zdst, path=plan.dst_path or None, threads=threads)
        problems = [str(p) for p in found.problems]
        if plan.method == "copy":
            problems += _compare_copied(plan, zsrc, zdst, threads)
        else:
            problems += compare_values(plan, zsrc, zdst)
        rep.verified = not problems
        report.problems += problems[:MAX_PROBLEMS]


def source_failed(plan: ArrayPlan, error: CorruptShardError, report: ConvertReport) -> ArrayReport:
    """The entry of an array whose conversion stopped at a source chunk (or shard index) that
    does not decode, the chunk added to ``report``'s problems as ``verify`` words a corrupt
    chunk, with its store key: not verified, the destination's write left unfinished."""
    from .report import ArrayReport

    where = error.key + ("" if error.chunk is None else f" chunk {error.chunk}")
    report.problems.append(
        f"{'corrupt':<10} {where}: in the source of {plan.dst_path or '/'}, the conversion "
        f"stopped there: {error.problem}"
    )
    return ArrayReport(
        path=plan.dst_path,
        method=plan.method,
        reason=plan.reason,
        shards=plan.shards,
        chunks=plan.chunks,
        verified=False,
    )


def _compare_copied(plan: ArrayPlan, zsrc: Any, zdst: Any, threads: int | None) -> list[str]:
    from ..storage.store import ShardStore
    from .copy import ChunkReader, ShardCopier
    from .unshard import target_info

    info = target_info(zdst, plan.dst_path or None)
    copier = ShardCopier(
        info,
        ShardStore(zdst, plan.dst_path),
        ChunkReader(ShardStore(zsrc, plan.src_path), plan.source),
    )
    with ThreadPoolExecutor(threads or 4) as pool:
        found = pool.map(copier.compare, info.layout.shards())
        return [f"{plan.dst_path or '/'}: {p}" for bad in found for p in bad]


def compare_values(plan: ArrayPlan, zsrc: Any, zdst: Any) -> list[str]:
    import dask.array as da

    from ..api import open_array
    from .source import source_array

    a = source_array(plan, zsrc)
    if plan.sharded:
        b = open_array(zdst, path=plan.dst_path or None).rechunk(a.chunks)
    else:  # a plain array: zarr-python reads it
        b = da.from_zarr(zdst, component=plan.dst_path or None).rechunk(a.chunks)
    same = a == b
    if np.dtype(plan.dtype).kind in "fc":
        same = same | (da.isnan(a) & da.isnan(b))
    n = int((~same).sum().compute())
    return [f"{plan.dst_path or '/'}: {n} values differ from the source"] if n else []
