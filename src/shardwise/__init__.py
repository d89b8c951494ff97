"""shardwise: parallel, shard-safe writes and shard-aligned reads of Zarr v3 sharded arrays."""

from typing import TYPE_CHECKING, Any

from . import batch
from .api import open_array, plan_write, write_array
from .convert import ArrayReport, ConvertReport, convert
from .direct import read_array
from .errors import (
    ArgumentTypeError,
    ArrayExistsError,
    ArrayNotFoundError,
    BatchNotFoundError,
    CorruptShardError,
    DependencyError,
    LeaseHeldError,
    NotAnArrayError,
    OutputError,
    PlanError,
    SelectionError,
    ShardConflictError,
    ShardwiseError,
    UnsupportedCodecError,
    VerifyError,
)
from .job import WriteJob
from .verify import VerifyReport, verify
from .write import WriteReport

if TYPE_CHECKING:
    from .backend import open_dataset
    from .xarray_write import to_zarr

__version__ = "0.1.0"

__all__ = [
    "ArgumentTypeError",
    "ArrayExistsError",
    "ArrayNotFoundError",
    "ArrayReport",
    "BatchNotFoundError",
    "ConvertReport",
    "CorruptShardError",
    "DependencyError",
    "LeaseHeldError",
    "NotAnArrayError",
    "OutputError",
    "PlanError",
    "SelectionError",
    "ShardConflictError",
    "ShardwiseError",
    "UnsupportedCodecError",
    "VerifyError",
    "VerifyReport",
    "WriteJob",
    "WriteReport",
    "batch",
    "convert",
    "open_array",
    "open_dataset",
    "plan_write",
    "read_array",
    "to_zarr",
    "verify",
    "write_array",
]


def __getattr__(name: str) -> Any:
    # the xarray parts load xarray and pandas: import them on first use, so that array reads
    # and writes do not pay for them
    if name == "open_dataset":
        from .backend import open_dataset

        return open_dataset
    if name == "to_zarr":
        from .xarray_write import to_zarr

        return to_zarr
    raise AttributeError(f"module 'shardwise' has no attribute {name!r}")
