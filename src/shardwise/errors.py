"""All shardwise exceptions. Each also derives from the builtin a caller would expect."""

from __future__ import annotations

__all__ = [
    "CorruptShardError",
    "LeaseHeldError",
    "OutputError",
    "PlanError",
    "SelectionError",
    "ShardwiseError",
    "UnsupportedCodecError",
    "VerifyError",
]


class ShardwiseError(Exception):
    """Base class of every error raised by shardwise."""


class CorruptShardError(ShardwiseError, ValueError):
    """A stored shard (or one of its inner chunks) cannot be decoded.

    ``key`` is the store key of the shard, ``chunk`` the inner-chunk coordinates inside the shard
    (``None`` when the problem is with the shard as a whole, e.g. its index).
    """

    def __init__(self, key: str, problem: str, *, chunk: tuple[int, ...] | None = None) -> None:
        self.key = key
        self.problem = problem
        self.chunk = chunk
        where = f"shard {key!r}" + ("" if chunk is None else f", inner chunk {chunk}")
        super().__init__(f"{where}: {problem}")

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_corrupt, (self.key, self.problem, self.chunk))


def _rebuild_corrupt(key: str, problem: str, chunk: tuple[int, ...] | None) -> CorruptShardError:
    return CorruptShardError(key, problem, chunk=chunk)


class UnsupportedCodecError(ShardwiseError, NotImplementedError):
    """The array's codec chain contains something shardwise cannot encode or decode."""


class PlanError(ShardwiseError, ValueError):
    """A write was refused before anything was written (bad arguments, misaligned region, ...)."""


class SelectionError(ShardwiseError, IndexError):
    """A read selection shardwise cannot take: not basic indexing, or out of bounds."""


class OutputError(ShardwiseError, ValueError):
    """The ``out=`` array of a read does not fit the selection (shape, dtype or not writeable)."""


class LeaseHeldError(ShardwiseError, RuntimeError):
    """Another writer holds the write lease of this array."""


class VerifyError(ShardwiseError, ValueError):
    """A stored array failed verification; ``report`` holds the ``VerifyReport``."""

    def __init__(self, report: object) -> None:
        self.report = report
        super().__init__(str(report))
