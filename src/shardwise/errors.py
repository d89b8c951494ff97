"""All shardwise exceptions. Each also derives from the builtin a caller would expect."""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "ArrayExistsError",
    "ArrayNotFoundError",
    "BatchNotFoundError",
    "CorruptShardError",
    "DependencyError",
    "LeaseHeldError",
    "NotAGroupError",
    "NotAnArrayError",
    "OutputError",
    "PlanError",
    "SelectionError",
    "ShardConflictError",
    "ShardwiseError",
    "UnsupportedCodecError",
    "VerifyError",
]


class ShardwiseError(Exception):
    """Base class of every error raised by shardwise."""


class CorruptShardError(ShardwiseError, ValueError):
    """A stored shard (or one of its inner chunks) cannot be decoded (a ``ValueError``).

    Each parameter is kept as the attribute of the same name.

    Parameters
    ----------
    key : str
        The store key of the shard.
    problem : str
        What is wrong.
    chunk : tuple of int or None, optional
        The inner-chunk coordinates inside the shard (``None`` when the problem is with the
        shard as a whole, e.g. its index).
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
    """The array's codec chain contains something shardwise cannot encode or decode, or the
    array is a Zarr v2 array (a ``NotImplementedError``)."""


class ArrayNotFoundError(ShardwiseError, FileNotFoundError):
    """No array (and no group) at the given store and path (a ``FileNotFoundError``)."""


class ArrayExistsError(ShardwiseError, FileExistsError):
    """An array (or a finished write, or a batch) is already there and the mode does not
    replace it (a ``FileExistsError``)."""


class BatchNotFoundError(ShardwiseError, FileNotFoundError):
    """No batch write is open for the array (a ``FileNotFoundError``)."""


class ArgumentTypeError(ShardwiseError, TypeError):
    """An argument of a type shardwise cannot use (a ``TypeError``); the message names the
    keyword, the value and what it takes. Raised before anything is read or written."""


class NotAnArrayError(ShardwiseError, ValueError):
    """The path names a group, not an array (a ``ValueError``).

    Parameters
    ----------
    message : str
        The error message.
    arrays : list of str
        The array paths below the group, kept as ``.arrays``.
    """

    def __init__(self, message: str, arrays: list[str]) -> None:
        self.arrays = arrays
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (NotAnArrayError, (str(self), self.arrays))


class NotAGroupError(ShardwiseError, ValueError):
    """The path names an array where a group is wanted, e.g. a Dataset's group (a
    ``ValueError``)."""


class PlanError(ShardwiseError, ValueError):
    """A write was refused before anything was written (bad arguments, misaligned region, ...);
    a ``ValueError``."""


class ArgumentValueError(PlanError):
    """A keyword argument's value is outside what the keyword accepts (a ``ValueError`` and a
    :class:`PlanError`); the message names the keyword, the value and the accepted values.
    Raised before anything is read or written."""


class SelectionError(ShardwiseError, IndexError):
    """A read selection shardwise cannot take: not basic indexing, or out of bounds (an
    ``IndexError``)."""


class OutputError(ShardwiseError, ValueError):
    """The ``out=`` array of a read does not fit the selection (shape, dtype or not writeable);
    a ``ValueError``."""


class LeaseHeldError(ShardwiseError, RuntimeError):
    """Another writer holds the write lease of this array (a ``RuntimeError``)."""


class ShardConflictError(ShardwiseError, RuntimeError):
    """A shard kept changing between this writer's read and its conditional commit (a
    ``RuntimeError``).

    Each parameter is kept as the attribute of the same name.

    Parameters
    ----------
    key : str
        The store key of the shard.
    tries : int
        The read-merge-commit rounds made.
    """

    def __init__(self, key: str, tries: int) -> None:
        self.key = key
        self.tries = tries
        super().__init__(
            f"shard {key!r} was replaced by another writer between this writer's read and its "
            f"commit {tries} times in a row; nothing of this write was lost or half-written in "
            "that shard. Rerun the write (resume=True skips the shards already done), or write "
            "fewer overlapping regions at once."
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (ShardConflictError, (self.key, self.tries))


class VerifyError(ShardwiseError, ValueError):
    """A stored array failed verification (a ``ValueError``).

    Parameters
    ----------
    report : VerifyReport
        What verification found, kept as ``.report``.
    """

    def __init__(self, report: object) -> None:
        self.report = report
        super().__init__(str(report))


class DependencyError(ShardwiseError, RuntimeError):
    """An installed dependency lacks something shardwise needs (see ``shardwise.compat``): its
    version is outside the range shardwise supports (a ``RuntimeError``)."""
