"""Slices of :func:`shardwise.open_array`'s dask array that read only what they select.

Dask slices an array by adding ``getitem`` tasks after the tasks that produce its blocks, so
``open_array(p)[100:110, 5000:5010]`` would read a whole block (by default a whole shard) to keep
ten rows of it: dask's graph optimization does not fuse such a slice into a source whose getter
is not fancy-capable. Here a basic selection of the opened array is instead a new array over a
:class:`ShardView`: the stored array's positions the selection keeps, per axis. Each block task
of it reads its part of those positions with :meth:`ShardReader.__getitem__` (the shard indexes
and the inner chunks holding selected positions, strides included), so a task holds its block of
the selection, never a shard. Slices of slices compose (Python ``range`` objects slice into
``range`` objects); whatever dask builds on a slice (``x[sel].sum()``) runs over these tasks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .assemble import ShardArray
from .load import read_selection
from .read import ShardReader
from .whole import install as install_whole_reads


@dataclass(frozen=True)
class NewAxis:
    """An axis a ``None`` added: of length 1 (0 once sliced empty); no stored axis behind it."""

    size: int = 1


# one entry per axis: the index an integer selected on a stored axis (dropped from the result),
# the positions kept along a stored axis (in the order of the result), or an added axis
Axis = int | range | NewAxis


@dataclass(frozen=True)
class ShardView:
    """Part of a stored array, as an array-like for ``dask.array.from_array``."""

    reader: ShardReader
    axes: tuple[Axis, ...]
    token: str

    @classmethod
    def whole(cls, reader: ShardReader, token: str) -> ShardView:
        return cls(reader, tuple(range(n) for n in reader.shape), token)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(
            len(a) if isinstance(a, range) else a.size for a in self.axes if not isinstance(a, int)
        )

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.reader.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def selection(self) -> tuple[int | slice, ...]:
        """The basic selection of the stored array this view holds."""
        return tuple(
            a if isinstance(a, int) else _as_slice(a)
            for a in self.axes
            if isinstance(a, int | range)
        )

    def compose(self, key: Sequence[int | slice | None]) -> ShardView:
        """This view's ``[key]``: one valid integer or slice per axis of the view, and ``None``
        anywhere for a new axis."""
        axes: list[Axis] = []
        keys = iter(key)
        for a in self.axes:
            if isinstance(a, int):
                axes.append(a)
                continue
            k = next(keys)
            while k is None:
                axes.append(NewAxis())
                k = next(keys)
            if isinstance(a, range):
                axes.append(a[k])
            elif isinstance(k, slice):  # an added axis stays one (sliced: 1 or 0 long)
                axes.append(NewAxis(len(range(a.size)[k])))
        axes.extend(NewAxis() for k in keys if k is None)  # trailing Nones
        return ShardView(self.reader, tuple(axes), self.token)

    def read(self, reader: ShardReader | None = None) -> np.ndarray:
        """The values of this view (read with ``reader``, default the view's own)."""
        shape = self.shape
        if not math.prod(shape):
            return np.empty(shape, dtype=self.dtype)
        return read_selection(reader or self.reader, self.selection()).reshape(shape)

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        # the block tasks' getter: dask hands one step-1 slice per axis of the view
        key = key + (slice(None),) * (self.ndim - len(key))
        sub = self.compose(key)
        if not math.prod(sub.shape):
            return np.empty(sub.shape, dtype=self.dtype)
        sel = sub.selection()
        box = tuple(k for k in sel if isinstance(k, slice) and k.step == 1)
        if len(box) == len(sel) == sub.ndim:
            return self.reader[box]  # a box of the stored array (the blocks of open_array)
        return read_selection(self.reader, sel).reshape(sub.shape)


def _as_slice(r: range) -> slice:
    """``r`` as the slice of the stored axis that selects it (a stop of -1 means 'to the start',
    which a slice spells None)."""
    return slice(r.start, None if r.stop < 0 else r.stop, r.step)


def view_array(view: ShardView, chunks: tuple[tuple[int, ...], ...]) -> Any:
    """The dask array of ``view`` in ``chunks`` (a :class:`ShardArray`, so that slices of it are
    views too and its ``compute()`` is one direct read)."""
    import dask.array as da
    from dask.base import tokenize

    install_whole_reads()  # a graph computing it whole (dask.compute of several) reads it once
    name = f"shardwise-read-{tokenize(view.token, view.axes, chunks)}"
    arr = da.from_array(
        view,
        chunks=chunks,
        name=name,
        lock=False,
        asarray=False,
        fancy=False,
        meta=np.empty((0,) * view.ndim, dtype=view.dtype),
    )
    out = ViewArray(arr.dask, arr.name, arr.chunks, meta=arr._meta)
    out._view = view
    return out


class ViewArray(ShardArray):
    """The array :func:`view_array` returns: a basic selection of it is a view again."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        """A basic selection: a view that reads only what it selects; anything else is dask's
        indexing of the blocks."""
        got = getitem(self._view, self.chunks, key)
        return super().__getitem__(key) if got is None else got


def _is_int(k: Any) -> bool:
    return isinstance(k, int | np.integer) and not isinstance(k, bool | np.bool_)


def _is_slice(k: Any) -> bool:
    return (
        isinstance(k, slice)
        and all(v is None or _is_int(v) for v in (k.start, k.stop, k.step))
        and k.step != 0
    )


def getitem(view: ShardView, chunks: tuple[tuple[int, ...], ...], key: Any) -> Any | None:
    """``array[key]`` of the array of ``view`` in ``chunks``, as a view array, for a basic
    selection (integers, slices, one Ellipsis, ``None``); None for anything else, and for
    indexes out of bounds, which dask's own indexing handles (or refuses) as it always did."""
    items = key if isinstance(key, tuple) else (key,)
    if not all(k is Ellipsis or k is None or _is_int(k) or _is_slice(k) for k in items):
        return None
    given = sum(1 for k in items if k is not None and k is not Ellipsis)
    nell = sum(1 for k in items if k is Ellipsis)
    if nell > 1 or given > view.ndim:
        return None
    if nell:
        at = items.index(Ellipsis)
        items = items[:at] + (slice(None),) * (view.ndim - given) + items[at + 1 :]
    else:
        items = items + (slice(None),) * (view.ndim - given)
    new_chunks: list[tuple[int, ...]] = []
    sizes = iter(zip(view.shape, chunks, strict=True))
    for k in items:
        if k is None:
            new_chunks.append((1,))
            continue
        n, c = next(sizes)
        if _is_int(k):
            if not -n <= k < n:
                return None
            continue
        new_chunks.append(sliced_chunks(c, k))
    key = [int(k) if _is_int(k) else k for k in items]
    return view_array(view.compose(key), tuple(new_chunks))


def sliced_chunks(chunks: Sequence[int], k: slice) -> tuple[int, ...]:
    """The chunks of ``axis[k]`` for an axis of ``chunks``, as dask's slicing makes them: the
    selected positions of each block, blocks holding none left out, in the order of the result
    (reversed for a negative step); ``(0,)`` when nothing is selected."""
    n = sum(chunks)
    sel = range(n)[k]
    out = []
    start = 0
    for c in chunks:
        out.append(_count(sel, start, start + c))
        start += c
    if sel.step < 0:
        out.reverse()
    kept = tuple(x for x in out if x)
    return kept or (0,)


def _count(sel: range, lo: int, hi: int) -> int:
    """How many positions of ``sel`` lie in ``[lo, hi)``."""
    if not sel:
        return 0
    step = sel.step
    if step > 0:
        first = max(0, -(-(lo - sel.start) // step))
        last = max(0, -(-(hi - sel.start) // step))
    else:
        first = max(0, -(-(sel.start - hi + 1) // -step))
        last = max(0, -(-(sel.start - lo + 1) // -step))
    return min(last, len(sel)) - min(first, len(sel))
