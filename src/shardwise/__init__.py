"""shardwise: parallel, shard-safe writes and shard-aligned reads of Zarr v3 sharded arrays."""

from typing import TYPE_CHECKING, Any

from .api import open_array, plan_write, write_array
from .conversion.convert import convert
from .conversion.report import ArrayReport, ConvertReport
from .core.job import WritePlan
from .durability import batch
from .durability.verify import VerifyReport, verify
from .engine.load import read_array
from .engine.report import WriteReport
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
    UnsupportedCodecError,
    VerifyError,
)
from .pyramid.write import write_pyramid
from .runtime.signals import Interrupted, stop_on_signals

if TYPE_CHECKING:
    from .xarray.opening import open_dataset
    from .xarray.writer import to_zarr

__version__ = "0.1.0"

__all__ = [
    "ArrayExistsError",
    "ArrayNotFoundError",
    "ArrayReport",
    "BatchNotFoundError",
    "ConvertReport",
    "CorruptShardError",
    "DependencyError",
    "Interrupted",
    "InvalidTypeError",
    "InvalidValueError",
    "LeaseHeldError",
    "NotAGroupError",
    "NotAnArrayError",
    "OutputError",
    "PlanError",
    "ReadOnlyError",
    "SelectionError",
    "ShardConflictError",
    "ShardwiseError",
    "UnsupportedCodecError",
    "VerifyError",
    "VerifyReport",
    "WritePlan",
    "WriteReport",
    "batch",
    "convert",
    "open_array",
    "open_dataset",
    "plan_write",
    "read_array",
    "stop_on_signals",
    "to_zarr",
    "verify",
    "write_array",
    "write_pyramid",
]


def __getattr__(name: str) -> Any:
    # the xarray parts load xarray and pandas: import them on first use, so that array reads
    # and writes do not pay for them
    if name == "open_dataset":
        from .xarray.opening import open_dataset

        return open_dataset
    if name == "to_zarr":
        from .xarray.writer import to_zarr

        return to_zarr
    raise AttributeError(f"module 'shardwise' has no attribute {name!r}")
