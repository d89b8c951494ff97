"""shardwise: parallel, shard-safe writes and shard-aligned reads of Zarr v3 sharded arrays."""

from . import batch
from .api import open_array, plan_write, write_array
from .backend import open_dataset
from .convert import ArrayReport, ConvertReport, convert
from .errors import (
    ArrayNotFoundError,
    CorruptShardError,
    LeaseHeldError,
    NotAnArrayError,
    PlanError,
    ShardwiseError,
    UnsupportedCodecError,
    VerifyError,
)
from .job import WriteJob
from .verify import VerifyReport, verify
from .write import WriteReport
from .xarray_write import to_zarr

__version__ = "0.1.0"

__all__ = [
    "ArrayNotFoundError",
    "ArrayReport",
    "ConvertReport",
    "CorruptShardError",
    "LeaseHeldError",
    "NotAnArrayError",
    "PlanError",
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
    "to_zarr",
    "verify",
    "write_array",
]
