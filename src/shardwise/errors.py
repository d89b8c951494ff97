"""All shardwise exceptions. Each also derives from the builtin a caller would expect.

The tree (the builtin or zarr class each one also is, in parentheses)::

    ShardwiseError                  base of every error shardwise raises
    |-- InvalidTypeError            (TypeError) a keyword's value is of a type it cannot take
    |-- InvalidValueError           (ValueError) a keyword's value, or a combination of them,
    |                               is outside what is accepted; raised before any I/O
    |-- PlanError                   (ValueError) a write refused with its figures: memory per
    |                               task, task count, misaligned or overlapping regions, data
    |                               that does not fit the stored array; nothing written
    |-- ReadOnlyError               (ValueError) a write mode asked of the read-only
    |                               xarray engine
    |-- ArrayNotFoundError          (zarr.errors.ArrayNotFoundError, so FileNotFoundError and
    |                               ValueError) no array and no group at the store and path
    |-- BatchNotFoundError          (FileNotFoundError) no batch write open for the array
    |-- ArrayExistsError            (FileExistsError) an array, finished write or batch is
    |                               already there and the mode does not replace it
    |-- NotAnArrayError             (ValueError) the path names a group, not an array
    |-- NotAGroupError              (ValueError) the path names an array, not a group
    |-- SelectionError              (IndexError) a read selection shardwise cannot take
    |-- OutputError                 (ValueError) a read's out= does not fit the selection
    |-- CorruptShardError           (ValueError) a stored shard cannot be decoded
    |-- VerifyError                 (ValueError) a stored array failed verification
    |-- UnsupportedCodecError       (NotImplementedError) a codec chain or Zarr v2 array
    |-- LeaseHeldError              (RuntimeError) another writer holds the write lease
    |-- ShardConflictError          (RuntimeError) a shard kept changing under a commit
    |-- TransactionError            (RuntimeError) an icechunk session's shard tasks wrote one
    |                               shard twice, its commit conflicts with another,
    |                               commit= found nothing changed to commit, or another
    |                               thread's write into the session is running
    `-- DependencyError             (RuntimeError) an installed dependency is out of range

Bad arguments (InvalidTypeError, InvalidValueError) are not plan refusals: a PlanError means
the arguments were usable and the write they describe was refused, with the numbers why.
"""

from __future__ import annotations

import zarr.errors

__all__ = [
    "ArrayExistsError",
    "ArrayNotFoundError",
    "BatchNotFoundError",
    "CorruptShardError",
    "DependencyError",
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
    "TransactionError",
    "UnsupportedCodecError",
    "VerifyError",
]


class ShardwiseError(Exception):
    """Base class of every error raised by shardwise.

    Examples
    --------
    >>> import zarr, shardwise
    >>> try:
    ...     shardwise.open_array(zarr.storage.MemoryStore())
    ... except shardwise.ShardwiseError as e:
    ...     print(type(e).__name__)
    ArrayNotFoundError
    """


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

    Examples
    --------
    >>> e = CorruptShardError("c/0/0", "checksum mismatch", chunk=(1, 0))
    >>> print(e)
    shard 'c/0/0', inner chunk (1, 0): checksum mismatch
    >>> e.key, e.chunk, isinstance(e, ValueError)
    ('c/0/0', (1, 0), True)
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
    array is a Zarr v2 array (a ``NotImplementedError``).

    Examples
    --------
    >>> import zarr, shardwise
    >>> v2 = zarr.storage.MemoryStore()
    >>> _ = zarr.create_array(v2, shape=(4,), dtype="u1", zarr_format=2)
    >>> try:
    ...     shardwise.read_array(v2)
    ... except NotImplementedError as e:
    ...     print(type(e).__name__)
    UnsupportedCodecError
    """


class ArrayNotFoundError(ShardwiseError, zarr.errors.ArrayNotFoundError):
    """No array (and no group) at the given store and path: zarr's own
    ``zarr.errors.ArrayNotFoundError`` (so a ``FileNotFoundError`` and a ``ValueError``), which
    means the same, so ``except`` clauses written for zarr catch it too.

    Parameters
    ----------
    message : str
        The error message.

    Examples
    --------
    >>> import zarr, shardwise
    >>> try:
    ...     shardwise.read_array(zarr.storage.MemoryStore())
    ... except zarr.errors.ArrayNotFoundError as e:  # zarr's own error class catches it
    ...     print(type(e).__name__, isinstance(e, FileNotFoundError))
    ArrayNotFoundError True
    """

    def __init__(self, message: str) -> None:
        # one preformatted message: zarr's base would format several arguments into its template
        super().__init__(message)


class ArrayExistsError(ShardwiseError, FileExistsError):
    """An array (or a finished write, or a batch) is already there and the mode does not
    replace it (a ``FileExistsError``).

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_array(np.zeros((8, 8), "u1"), store, chunks=(4, 4), shards=(8, 8))
    >>> try:
    ...     shardwise.write_array(np.ones((8, 8), "u1"), store, chunks=(4, 4), shards=(8, 8))
    ... except FileExistsError as e:
    ...     print(type(e).__name__)
    ArrayExistsError
    """


class BatchNotFoundError(ShardwiseError, FileNotFoundError):
    """No batch write is open for the array (a ``FileNotFoundError``).

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_array(np.zeros((8, 8), "u1"), store, chunks=(4, 4), shards=(8, 8))
    >>> try:
    ...     shardwise.batch.open_batch(store)
    ... except FileNotFoundError as e:
    ...     print(type(e).__name__)
    BatchNotFoundError
    """


class InvalidTypeError(ShardwiseError, TypeError):
    """An argument of a type shardwise cannot use (a ``TypeError``); the message names the
    keyword, the value and what it takes. Raised before anything is read or written.

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> try:
    ...     shardwise.write_array(np.zeros(8), zarr.storage.MemoryStore(), threads="many")
    ... except TypeError as e:
    ...     print(e)
    threads must be a positive integer, got 'many' (str)
    """


class NotAnArrayError(ShardwiseError, ValueError):
    """The path names a group, not an array (a ``ValueError``).

    Parameters
    ----------
    message : str
        The error message.
    arrays : list of str
        The array paths below the group, kept as ``.arrays``.

    Examples
    --------
    >>> import zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = zarr.open_group(store, mode="w").create_array("a", shape=(4,), dtype="u1")
    >>> try:
    ...     shardwise.open_array(store)
    ... except shardwise.NotAnArrayError as e:
    ...     print(e.arrays)
    ['a']
    """

    def __init__(self, message: str, arrays: list[str]) -> None:
        self.arrays = arrays
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (NotAnArrayError, (str(self), self.arrays))


class NotAGroupError(ShardwiseError, ValueError):
    """The path names an array where a group is wanted, e.g. a Dataset's group (a
    ``ValueError``).

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_array(np.zeros((8, 8), "u1"), store, chunks=(4, 4), shards=(8, 8))
    >>> try:
    ...     shardwise.open_dataset(store)
    ... except ValueError as e:
    ...     print(type(e).__name__)
    NotAGroupError
    """


class InvalidValueError(ShardwiseError, ValueError):
    """A keyword argument's value, or a combination of keywords, is outside what is accepted (a
    ``ValueError``); the message names the keyword, the value and the accepted values. Raised
    before anything is read or written.

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> try:
    ...     shardwise.write_array(np.zeros(8), zarr.storage.MemoryStore(), mode="x")
    ... except ValueError as e:
    ...     print(e)
    mode must be one of 'w', 'w-', 'a', 'r+', got 'x'
    """


class PlanError(ShardwiseError, ValueError):
    """A write was refused before anything was written, with the figures why: memory per task
    over the limit, too many shard tasks, regions off the shard grid or sharing shards, data
    that does not fit the stored array (a ``ValueError``).

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_array(np.zeros((8, 8), "u1"), store, chunks=(4, 4), shards=(8, 8))
    >>> try:
    ...     shardwise.write_array(np.zeros((16, 16), "u1"), store, mode="r+")
    ... except shardwise.PlanError as e:
    ...     print(e)
    data of shape (16, 16) does not fit the region (8, 8) of the array
    """


class ReadOnlyError(ShardwiseError, ValueError):
    """A write mode was asked of the read-only xarray engine (a ``ValueError``, as xarray's own
    engines raise for a mode they do not take).

    Examples
    --------
    >>> import xarray as xr, zarr
    >>> try:
    ...     xr.open_dataset(zarr.storage.MemoryStore(), engine="shardwise", mode="w")
    ... except ValueError as e:
    ...     print(type(e).__name__)
    ReadOnlyError
    """


class SelectionError(ShardwiseError, IndexError):
    """A read selection shardwise cannot take: not basic indexing, or out of bounds (an
    ``IndexError``).

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_array(np.zeros((8, 8), "u1"), store, chunks=(4, 4), shards=(8, 8))
    >>> try:
    ...     shardwise.read_array(store, (slice(None), 20))
    ... except IndexError as e:
    ...     print(e)
    index 20 is out of bounds for dimension 1 of size 8
    """


class OutputError(ShardwiseError, ValueError):
    """The ``out=`` array of a read does not fit the selection (shape, dtype or not writeable);
    a ``ValueError``.

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_array(np.zeros((8, 8), "u1"), store, chunks=(4, 4), shards=(8, 8))
    >>> try:
    ...     shardwise.read_array(store, out=np.empty(3))
    ... except ValueError as e:
    ...     print(type(e).__name__)
    OutputError
    """


class LeaseHeldError(ShardwiseError, RuntimeError):
    """Another writer holds the write lease of this array (a ``RuntimeError``).

    Examples
    --------
    >>> import shardwise
    >>> try:
    ...     raise shardwise.LeaseHeldError("the whole array is leased by another writer")
    ... except RuntimeError as e:  # a RuntimeError, as it is to callers
    ...     print(type(e).__name__)
    LeaseHeldError
    """


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

    Examples
    --------
    >>> e = ShardConflictError("c/0/0", 3)
    >>> e.key, e.tries, isinstance(e, RuntimeError)
    ('c/0/0', 3, True)
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


class TransactionError(ShardwiseError, RuntimeError):
    """A write into an icechunk session that would lose data or cannot commit (a
    ``RuntimeError``): two of its shard tasks' forks wrote one shard (nothing is merged), its
    commit conflicts with another commit to the branch (the session keeps the write
    uncommitted), ``commit=`` was asked of a write that changed nothing in the session
    (icechunk makes no empty commit; nothing is committed), or another thread's shardwise write
    into the same session is running (refused before any change: two at once would lose one's
    changes).

    Examples
    --------
    >>> import shardwise
    >>> issubclass(shardwise.TransactionError, (shardwise.ShardwiseError, RuntimeError))
    True
    """


class VerifyError(ShardwiseError, ValueError):
    """A stored array failed verification (a ``ValueError``).

    Parameters
    ----------
    report : VerifyReport
        What verification found, kept as ``.report``.

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> _ = shardwise.write_array(np.zeros((8, 8), "u1"), store, chunks=(4, 4), shards=(8, 8))
    >>> e = VerifyError(shardwise.verify(store))
    >>> e.report.problems, isinstance(e, ValueError)
    ([], True)
    """

    def __init__(self, report: object) -> None:
        self.report = report
        super().__init__(str(report))


class DependencyError(ShardwiseError, RuntimeError):
    """An installed dependency lacks something shardwise needs (see ``shardwise.compat``): its
    version is outside the range shardwise supports (a ``RuntimeError``).

    Examples
    --------
    >>> import shardwise
    >>> issubclass(shardwise.DependencyError, (shardwise.ShardwiseError, RuntimeError))
    True
    """
