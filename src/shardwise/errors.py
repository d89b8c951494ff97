"""All shardwise exceptions. Each also derives from the builtin a caller would expect."""

from __future__ import annotations

__all__ = [
    "ArrayNotFoundError",
    "CorruptShardError",
    "LeaseHeldError",
    "NotAnArrayError",
    "PlanError",
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


class ArrayNotFoundError(ShardwiseError, FileNotFoundError):
    """No array (and no group) at the given store and path."""


class NotAnArrayError(ShardwiseError, ValueError):
    """The path names a group, not an array; ``arrays`` lists the array paths below it."""

    def __init__(self, message: str, arrays: list[str]) -> None:
        self.arrays = arrays
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (NotAnArrayError, (str(self), self.arrays))


class PlanError(ShardwiseError, ValueError):
    """A write was refused before anything was written (bad arguments, misaligned region, ...)."""


class LeaseHeldError(ShardwiseError, RuntimeError):
    """Another writer holds the write lease of this array."""


class VerifyError(ShardwiseError, ValueError):
    """A stored array failed verification; ``report`` holds the ``VerifyReport``."""

    def __init__(self, report: object) -> None:
        self.report = report
        super().__init__(str(report))
