"""shardwise: parallel, shard-safe writes and shard-aligned reads of Zarr v3 sharded arrays."""

# The public names are imported on first use (PEP 562): ``import shardwise`` costs zarr and the
# errors, and each door pays only for its own modules (read_array never imports the writers,
# pyramids, conversion, batch, verify, dask or xarray). The TYPE_CHECKING block gives type
# checkers and IDEs the same names as if they were imported here.

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    ArrayExistsError,
    ArrayNotFoundError,
    BatchNotFoundError,
    CorruptShardError,
    DependencyError,
    InvalidTypeError,
    InvalidValueError,
    LeaseHeldError,
    NotAGroupError,
    NotAnArrayError,
    OutputError,
    PlanError,
    ReadOnlyError,
    SelectionError,
    ShardConflictError,
    ShardwiseError,
    TransactionError,
    UnsupportedCodecError,
    VerifyError,
)

if TYPE_CHECKING:
    from . import batch
    from .api import open_array, plan_write, write_array
    from .conversion.convert import convert
    from .conversion.report import ArrayReport, ConvertReport
    from .core.geometry import ShardGeometry
    from .core.job import WritePlan
    from .core.planner import plan_shards
    from .durability.verify import VerifyReport, verify
    from .engine.load import read_array
    from .engine.report import WriteReport
    from .pyramid.streams import StreamPyramid, stream_pyramid
    from .pyramid.update import update_pyramid
    from .pyramid.write import write_pyramid
    from .runtime.signals import Interrupted, stop_on_signals
    from .write.regions import RegionWriter
    from .write.streams import Stream, stream
    from .xarray.geo_streams import GeoZarrStream, stream_geozarr
    from .xarray.icechunk import to_icechunk
    from .xarray.opening import open_dataset, open_datatree
    from .xarray.streams import DatasetStream, stream_dataset
    from .xarray.writer import to_zarr

__version__ = "0.1.0"

__all__ = [
    "ArrayExistsError",
    "ArrayNotFoundError",
    "ArrayReport",
    "BatchNotFoundError",
    "ConvertReport",
    "CorruptShardError",
    "DatasetStream",
    "DependencyError",
    "GeoZarrStream",
    "Interrupted",
    "InvalidTypeError",
    "InvalidValueError",
    "LeaseHeldError",
    "NotAGroupError",
    "NotAnArrayError",
    "OutputError",
    "PlanError",
    "ReadOnlyError",
    "RegionWriter",
    "SelectionError",
    "Stream",
    "StreamPyramid",
    "ShardConflictError",
    "ShardGeometry",
    "ShardwiseError",
    "TransactionError",
    "UnsupportedCodecError",
    "VerifyError",
    "VerifyReport",
    "WritePlan",
    "WriteReport",
    "batch",
    "convert",
    "open_array",
    "open_dataset",
    "open_datatree",
    "plan_shards",
    "plan_write",
    "read_array",
    "stop_on_signals",
    "stream",
    "stream_dataset",
    "stream_geozarr",
    "stream_pyramid",
    "to_icechunk",
    "to_zarr",
    "update_pyramid",
    "verify",
    "write_array",
    "write_pyramid",
]

# name -> the module defining it (relative to this package)
_LAZY = {
    "ArrayReport": ".conversion.report",
    "ConvertReport": ".conversion.report",
    "Interrupted": ".runtime.signals",
    "RegionWriter": ".write.regions",
    "ShardGeometry": ".core.geometry",
    "VerifyReport": ".durability.verify",
    "WritePlan": ".core.job",
    "WriteReport": ".engine.report",
    "convert": ".conversion.convert",
    "open_array": ".api",
    "open_dataset": ".xarray.opening",
    "open_datatree": ".xarray.opening",
    "plan_shards": ".core.planner",
    "plan_write": ".api",
    "read_array": ".engine.load",
    "stop_on_signals": ".runtime.signals",
    "Stream": ".write.streams",
    "stream": ".write.streams",
    "StreamPyramid": ".pyramid.streams",
    "stream_pyramid": ".pyramid.streams",
    "DatasetStream": ".xarray.streams",
    "stream_dataset": ".xarray.streams",
    "GeoZarrStream": ".xarray.geo_streams",
    "stream_geozarr": ".xarray.geo_streams",
    "to_icechunk": ".xarray.icechunk",
    "to_zarr": ".xarray.writer",
    "update_pyramid": ".pyramid.update",
    "verify": ".durability.verify",
    "write_array": ".api",
    "write_pyramid": ".pyramid.write",
}
# public names that are modules themselves (``shardwise.batch.run(...)``)
_MODULES = {"batch": ".batch"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value: Any = importlib.import_module(_MODULES[name], __name__)
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module 'shardwise' has no attribute {name!r}")
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    """The public names, the errors' module and the module's dunders: not the helpers this
    module imports for itself (``importlib``, ``Any``, ``TYPE_CHECKING``), nor the subpackages
    that happen to be imported already."""
    return sorted({*__all__, "errors", *(n for n in globals() if n.startswith("__"))})
