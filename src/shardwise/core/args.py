"""The one vocabulary for checking public keyword arguments.

Every public verb checks its keywords through these functions before it touches a store, so a
refused call names the keyword, what it got and what it accepts, and raises a shardwise error that
is also the builtin a caller expects: :class:`~shardwise.errors.InvalidTypeError` (a
``TypeError``) for a value of the wrong type, :class:`~shardwise.errors.InvalidValueError` (a
``ValueError``) for a value of the right type outside what the keyword accepts.

Pure: no store, dask or xarray (byte sizes are parsed by ``dask.utils.parse_bytes``, imported
when a string is given, so that "256MiB" means what it means to dask users).
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Iterable, Mapping

import numpy as np

from ..errors import InvalidTypeError, InvalidValueError

__all__ = [
    "byte_size",
    "check_mode",
    "choice",
    "flags",
    "mapping",
    "optional_byte_size",
    "optional_flags",
    "optional_str",
    "positive_int",
    "region",
    "store_path",
    "thread_count",
]

# names a node (group or array) cannot take inside a store: the metadata document, the
# directories of a path, and the records shardwise keeps next to every array
_RESERVED_NAMES = frozenset({"zarr.json", ".", "..", ".shardwise"})


def _is_int(value: object) -> bool:
    # bool is an int to Python but never a count or a size to a caller
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(name: str, value: object) -> int:
    """``value`` as an ``int`` >= 1 (numpy integers too), else a clear error naming ``name``.

    >>> positive_int("threads", 4)
    4
    >>> positive_int("threads", 0)
    Traceback (most recent call last):
    ...
    shardwise.errors.InvalidValueError: threads must be a positive integer, got 0
    """
    if not _is_int(value):
        raise InvalidTypeError(
            f"{name} must be a positive integer, got {value!r} ({type(value).__name__})"
        )
    n = operator.index(value)  # type: ignore[arg-type]
    if n < 1:
        raise InvalidValueError(f"{name} must be a positive integer, got {n}")
    return n


def thread_count(name: str, value: object) -> int | None:
    """A thread count: ``None`` (the default: the shared pool's size) or an int >= 1."""
    return None if value is None else positive_int(name, value)


def byte_size(name: str, value: object) -> int:
    """A size in bytes >= 1: an int, or a string dask understands ("256MiB", "1.5GB", "64 kB").

    >>> byte_size("memory_limit", "256MiB")
    268435456
    >>> byte_size("shard_bytes", 1_000)
    1000
    >>> byte_size("memory_limit", "lots")
    Traceback (most recent call last):
    ...
    shardwise.errors.InvalidValueError: memory_limit must be a positive number of bytes ...
    """
    accepted = "a positive number of bytes (an int, or a string such as '256MiB' or '1.5GB')"
    if isinstance(value, str):
        from dask.utils import parse_bytes

        try:
            n = int(parse_bytes(value))
        except (ValueError, TypeError, KeyError):
            raise InvalidValueError(f"{name} must be {accepted}, got {value!r}") from None
    elif _is_int(value):
        n = operator.index(value)  # type: ignore[arg-type]
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    else:
        raise InvalidTypeError(f"{name} must be {accepted}, got {value!r} ({type(value).__name__})")
    if n < 1:
        raise InvalidValueError(f"{name} must be {accepted}, got {value!r}")
    return n


def optional_byte_size(name: str, value: object) -> int | None:
    """:func:`byte_size`, or ``None`` left as ``None`` (the keyword's default applies)."""
    return None if value is None else byte_size(name, value)


def choice(name: str, value: object, allowed: Iterable[object]) -> None:
    """Refuse ``value`` unless it is one of ``allowed`` (compared with ``==``, types checked so
    that an unhashable value gets the same message): :class:`InvalidTypeError` when its type is
    none of the allowed values' types, else :class:`InvalidValueError`.

    >>> choice("mode", "w", ("w", "a"))
    >>> choice("mode", "x", ("w", "a"))
    Traceback (most recent call last):
    ...
    shardwise.errors.InvalidValueError: mode must be one of 'w', 'a', got 'x'
    """
    options = tuple(allowed)
    if not any(type(value) is type(a) and value == a for a in options):
        names = ", ".join(repr(a) for a in options)
        message = f"{name} must be one of {names}, got {value!r}"
        if not any(type(value) is type(a) for a in options):
            raise InvalidTypeError(f"{message} ({type(value).__name__})")
        raise InvalidValueError(message)


def check_mode(mode: object, allowed: tuple[str, ...], what: str = "mode") -> None:
    """The one check of a ``mode`` argument: :class:`InvalidValueError` (a ``ValueError``)
    naming the allowed values, :class:`InvalidTypeError` for a mode that is not a string."""
    choice(what, mode, allowed)


def _is_bool(value: object) -> bool:
    # numpy's bool_ is what a comparison of numpy values gives: a caller may pass one
    return isinstance(value, bool | np.bool_)


def flags(**values: object) -> None:
    """Refuse any of ``values`` (keyword=value) that is not ``True`` or ``False``: a truthy
    string such as ``"no"`` must not silently switch something on.

    >>> flags(fsync=True, progress=False)
    >>> flags(fsync="no")
    Traceback (most recent call last):
    ...
    shardwise.errors.InvalidTypeError: fsync must be True or False, got 'no' (str)
    """
    for name, value in values.items():
        if not _is_bool(value):
            raise InvalidTypeError(
                f"{name} must be True or False, got {value!r} ({type(value).__name__})"
            )


def optional_flags(**values: object) -> None:
    """:func:`flags` for keywords whose ``None`` means "the default"."""
    for name, value in values.items():
        if value is not None and not _is_bool(value):
            raise InvalidTypeError(
                f"{name} must be True, False or None, got {value!r} ({type(value).__name__})"
            )


def optional_str(name: str, value: object) -> None:
    """Refuse a ``value`` that is neither a string nor ``None`` (paths inside a store, group
    names)."""
    if value is not None and not isinstance(value, str):
        raise InvalidTypeError(
            f"{name} must be a string or None, got {value!r} ({type(value).__name__})"
        )


def store_path(name: str, value: object, *, nested: bool = True) -> None:
    """Refuse a path of a node inside a store (``path=``, ``group=``, a group's or array's name)
    that cannot be stored: not a string or None, an empty name between two ``/``, or a name the
    store itself uses (``zarr.json``, ``.``, ``..``, ``.shardwise``). Leading and trailing ``/``
    are dropped, as zarr does (``""`` and ``"/"`` are the root); ``nested=False``: one name,
    no ``/`` at all.

    >>> store_path("path", "a/b")
    >>> store_path("group", "/")
    >>> store_path("path", "a/zarr.json")
    Traceback (most recent call last):
    ...
    shardwise.errors.InvalidValueError: path='a/zarr.json' names a node 'zarr.json', ...
    """
    optional_str(name, value)
    if not value:
        return
    assert isinstance(value, str)
    if not nested and "/" in value:
        raise InvalidValueError(
            f"{name}={value!r} contains '/': a name of one node, which zarr would store as "
            "a nested path"
        )
    inside = value.strip("/")
    for part in inside.split("/") if inside else ():
        if not part:
            raise InvalidValueError(
                f"{name}={value!r} has an empty name between two '/': every group or array "
                "of a path needs a name"
            )
        if part in _RESERVED_NAMES:
            raise InvalidValueError(
                f"{name}={value!r} names a node {part!r}, which the store itself uses "
                "(zarr.json holds a node's metadata, .shardwise the writer's records, '.' "
                "and '..' are directories): choose another name"
            )


def mapping(name: str, value: object) -> None:
    """Refuse a ``value`` that is neither a mapping (a dict) nor ``None``."""
    if value is not None and not isinstance(value, Mapping):
        raise InvalidTypeError(
            f"{name} must be a dict or None, got {value!r} ({type(value).__name__})"
        )


def region(name: str, value: object) -> None:
    """Refuse a ``value`` that is neither ``None`` nor a tuple (or list) of slices, one per
    dimension or one ``...`` for the dimensions not given (the count and the bounds are checked
    against the array by ``core.layout.normalize_region``, before any write).

    >>> region("region", (slice(0, 4), slice(None)))
    >>> region("region", (slice(0, 4), ...))
    >>> region("region", (0, 4))
    Traceback (most recent call last):
    ...
    shardwise.errors.InvalidTypeError: region must be None or a tuple of slices ...
    """
    if value is None:
        return
    if isinstance(value, slice) or value is Ellipsis:
        value = (value,)  # a lone slice or ... is a one-item region, as normalize_region takes it
    if not isinstance(value, tuple | list) or not all(
        isinstance(s, slice) or s is Ellipsis for s in value
    ):
        raise InvalidTypeError(
            f"{name} must be None or a tuple of slices (one per dimension, or one ... for the "
            f"dimensions not given), got {value!r} "
            f"({type(value).__name__})"
        )
    for s in value:
        if s is Ellipsis:
            continue
        for bound in (s.start, s.stop, s.step):
            if bound is not None and not _is_int(bound):
                raise InvalidTypeError(
                    f"{name} slices must have integer bounds (or None), got {s!r}"
                )
