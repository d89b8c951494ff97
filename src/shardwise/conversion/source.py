"""The source of a conversion as a dask array, for re-encoding and for the check by value."""

from __future__ import annotations

from typing import Any

from .plan import ArrayPlan


def source_array(plan: ArrayPlan, zsrc: Any) -> Any:
    """The source array of ``plan`` as a dask array (a sharded v3 one read by shardwise)."""
    import dask.array as da
    import zarr

    arr = zarr.open_array(zsrc, path=plan.src_path, mode="r")
    if plan.source.shard_codec is not None:
        from ..api import open_array

        return open_array(zsrc, path=plan.src_path)
    return da.from_zarr(arr)
