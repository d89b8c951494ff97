"""shardwise: parallel, shard-safe writes and shard-aligned reads of Zarr v3 sharded arrays."""

from .api import open_array, write_array
from .errors import (
    CorruptShardError,
    LeaseHeldError,
    PlanError,
    ShardwiseError,
    UnsupportedCodecError,
)
from .write import WriteReport

__version__ = "0.1.0"

__all__ = [
    "CorruptShardError",
    "LeaseHeldError",
    "PlanError",
    "ShardwiseError",
    "UnsupportedCodecError",
    "WriteReport",
    "open_array",
    "write_array",
]
