"""Reads straight into one numpy array: no dask, each inner chunk decoded into its place.

:func:`read_array` turns a basic selection (integers, slices with any step, one ``Ellipsis``) into
a step-1 bounding region, the steps, and a view of the output with one element per selected
position (flipped along axes selected with a negative step, with a length-1 axis for each
integer), then lets :meth:`ShardReader.read_into` fill that view on the shared pool. The output is
allocated once with ``np.empty`` (or is the caller's ``out=``); nothing else grows with the
array or the shard size: the pool threads decode through buffers they reuse.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.layout import Region
from ..errors import OutputError, SelectionError
from .memory import new_array
from .read import ShardReader, open_reader

__all__ = ["Selection", "parse_selection", "read_array", "read_selection"]


@dataclass(frozen=True)
class Selection:
    """A basic selection resolved against a shape.

    ``region`` is the step-1 box from the first to the last selected position on each axis,
    ``steps`` the (positive) steps, ``counts`` the positions selected per axis, ``flips`` the axes
    given with a negative step, ``drops`` the axes given an integer.

    >>> s = parse_selection((1, slice(None, None, -2)), (4, 5))
    >>> s.region, s.steps, s.counts, s.flips, s.drops, s.shape
    ((slice(1, 2, None), slice(0, 5, None)), (1, 2), (1, 3), (False, True), (True, False), (3,))
    """

    region: Region
    steps: tuple[int, ...]
    counts: tuple[int, ...]
    flips: tuple[bool, ...]
    drops: tuple[bool, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the result (integer-indexed axes dropped)."""
        return tuple(n for n, d in zip(self.counts, self.drops, strict=True) if not d)

    def view(self, out: np.ndarray) -> np.ndarray:
        """``out`` (of :attr:`shape`) as an array of :attr:`counts` in the array's order: a view
        with the integer-indexed axes back as length-1 axes and the flipped axes reversed."""
        work = np.expand_dims(out, tuple(i for i, d in enumerate(self.drops) if d))
        flip = tuple(slice(None, None, -1) if f else slice(None) for f in self.flips)
        return work[flip] if any(self.flips) else work


def parse_selection(selection: Any, shape: tuple[int, ...]) -> Selection:
    """Resolve a basic selection (ints, slices, one Ellipsis, or a tuple of them) for ``shape``."""
    items = selection if isinstance(selection, tuple) else (selection,)
    nell = sum(1 for k in items if k is Ellipsis)
    if nell > 1:
        raise SelectionError(f"a selection may hold one Ellipsis, got {nell}: {selection!r}")
    given = len(items) - nell
    if given > len(shape):
        raise SelectionError(
            f"too many indices: {given} for an array of {len(shape)} dimensions ({selection!r})"
        )
    if nell:
        at = items.index(Ellipsis)
        items = items[:at] + (slice(None),) * (len(shape) - given) + items[at + 1 :]
    else:
        items = items + (slice(None),) * (len(shape) - given)
    region, steps, counts, flips, drops = [], [], [], [], []
    for dim, (k, n) in enumerate(zip(items, shape, strict=True)):
        if isinstance(k, slice):
            try:
                start, stop, step = k.indices(n)
            except (TypeError, ValueError) as e:
                raise SelectionError(f"bad slice {k!r} on dimension {dim}: {e}") from None
            count = len(range(start, stop, step))
            if step < 0:
                start, step = start + (count - 1) * step if count else 0, -step
            region.append(slice(start, start + (count - 1) * step + 1 if count else start))
            steps.append(step)
            counts.append(count)
            flips.append(k.step is not None and k.step < 0)
            drops.append(False)
            continue
        if isinstance(k, bool | np.bool_) or not _is_int(k):
            raise SelectionError(
                f"dimension {dim}: {k!r} is not an integer, a slice or Ellipsis; read_array takes "
                "basic selections only (for fancy indexing read a box, then index the result, or "
                "use open_array)"
            )
        i = operator.index(k)
        if not -n <= i < n:
            raise SelectionError(f"index {i} is out of bounds for dimension {dim} of size {n}")
        i %= n
        region.append(slice(i, i + 1))
        steps.append(1)
        counts.append(1)
        flips.append(False)
        drops.append(True)
    return Selection(tuple(region), tuple(steps), tuple(counts), tuple(flips), tuple(drops))


def _is_int(k: Any) -> bool:
    try:
        operator.index(k)
    except TypeError:
        return False
    return True


def read_selection(
    reader: ShardReader, selection: Any = Ellipsis, out: np.ndarray | None = None
) -> np.ndarray:
    """``array[selection]`` of the array ``reader`` reads, into ``out`` or a new array."""
    sel = parse_selection(selection, reader.shape)
    if out is None:
        out = new_array(sel.shape, reader.dtype)
    else:
        check_out(out, sel.shape, reader.dtype)
    if out.size:
        reader.read_into(sel.region, sel.view(out), sel.steps)
    return out


def check_out(out: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    """Refuse an ``out=`` that is not a writeable numpy array of ``shape`` and ``dtype``."""
    if not isinstance(out, np.ndarray):
        raise OutputError(f"out= must be a numpy array, got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype:
        raise OutputError(
            f"out= is {out.dtype} {out.shape}; the selection needs {dtype} {shape}: allocate it "
            f"with np.empty({shape}, dtype={str(dtype)!r})"
        )
    if not out.flags.writeable:
        raise OutputError("out= is read-only: pass a writeable array")


def read_array(
    store: Any,
    selection: Any = Ellipsis,
    *,
    path: str | None = None,
    out: np.ndarray | None = None,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> np.ndarray:
    """Read ``array[selection]`` of a sharded Zarr v3 array into one numpy array, without dask.

    The result is allocated once with ``np.empty`` (or is ``out``). Every inner chunk is decoded
    on the shared thread pool straight into its place; missing shards and inner chunks read as
    the fill value. Memory beyond the result: a few buffers per thread, whatever the shard size.
    Shard indexes are cached for the duration of the call.

    Parameters
    ----------
    store : zarr.abc.store.Store, str or os.PathLike
        A zarr ``Store``, a local path or a URL.
    selection : int, slice, Ellipsis or tuple of them, default Ellipsis
        Basic indexing: integers, slices (any step, negative too) and one ``Ellipsis``, alone or
        in a tuple (default: the whole array).
    path : str, optional
        The array's path inside ``store`` (default: its root).
    out : numpy.ndarray, optional
        A writeable array of the result's shape and the array's dtype to read into.
    threads : int, optional
        Caps the threads that decode inner chunks (default: the shared thread pool's size).
    storage_options : dict, optional
        fsspec options, for a ``store`` given as a URL.

    Returns
    -------
    numpy.ndarray
        ``array[selection]``: a new array, or ``out``.

    Raises
    ------
    SelectionError
        Anything but basic indexing (arrays, masks, ``None``), or an index out of bounds (an
        ``IndexError``).
    OutputError
        An ``out`` that is not a writeable numpy array of the selection's shape and the array's
        dtype; raised before anything is read.
    InvalidTypeError, InvalidValueError
        A keyword of the wrong type, or a value it does not accept.
    ArrayNotFoundError
        No array or group at ``path``.
    NotAnArrayError
        ``path`` is a group; the message lists its arrays.
    UnsupportedCodecError
        A Zarr v2 array (``convert`` it first), or a codec chain shardwise cannot decode.

    Examples
    --------
    >>> import numpy as np, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> data = np.arange(4096, dtype="u2").reshape(64, 64)
    >>> _ = shardwise.write_array(data, store, chunks=(16, 16), shards=(32, 32))
    >>> shardwise.read_array(store, (slice(0, 2), slice(30, 34)))
    array([[30, 31, 32, 33],
           [94, 95, 96, 97]], dtype=uint16)
    """
    reader = open_reader(
        store, path=path, threads=threads, storage_options=storage_options, cache_indexes=True
    )
    if out is not None:
        check_out(out, parse_selection(selection, reader.shape).shape, reader.dtype)
    return read_selection(reader, selection, out=out)
