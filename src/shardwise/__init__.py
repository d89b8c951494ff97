"""shardwise: parallel, shard-safe writes and shard-aligned reads of Zarr v3 sharded arrays."""

from . import batch
from .api import open_array, write_array
from .backend import open_dataset
from .direct import read_array
from .errors import (
    CorruptShardError,
    LeaseHeldError,
    OutputError,
    PlanError,
    SelectionError,
    ShardwiseError,
    UnsupportedCodecError,
    VerifyError,
)
from .verify import VerifyReport, verify
from .write import WriteReport
from .xarray_write import to_zarr

__version__ = "0.1.0"

__all__ = [
    "CorruptShardError",
    "LeaseHeldError",
    "OutputError",
    "PlanError",
    "SelectionError",
    "ShardwiseError",
    "UnsupportedCodecError",
    "VerifyError",
    "VerifyReport",
    "WriteReport",
    "batch",
    "open_array",
    "open_dataset",
    "read_array",
    "to_zarr",
    "verify",
    "write_array",
]
