"""A pyramid streamed a frame at a time: :func:`stream_pyramid` and its :class:`StreamPyramid`.

One :class:`~shardwise.write.streams.Stream` per level (arrays ``"0"``, ``"1"``, ... of the
group at ``path``), driven by the level-0 frames: each level's frames are reduced from the
frames of the level below while they are in memory (``reduce.py``, the reductions of
:func:`~shardwise.write_pyramid`), never read back. Along the append axis a reduction by ``f``
needs ``f`` frames: the frames of an unfinished group wait (at most ``f - 1`` per level) and the
group is reduced when it is whole; the last, partial one at :meth:`StreamPyramid.close` (the
ceil rule of ``write_pyramid``). Along the other axes each frame is reduced on its own.

A reduced frame is handed to its level's stream only once its source frames are stored in the
level below: a reader sees consistent levels at any moment, a resume finds each level no
further than its source. The group's ``zarr.json`` (OME-Zarr 0.5 ``multiscales``, as
``write_pyramid`` writes it: ``metadata.py``) is put once the level arrays exist; it names no
shapes, so it stays valid as the levels grow.

Memory (:attr:`StreamPyramid.memory`): every level's shard-row buffers, the reduced frames
waiting for their source's seal (at most the unstored frames of the level below, reduced) and
the unfinished groups.

``resume=True`` resumes every level's stream, then (``stream_resume.py``) takes back each
level's frames reduced from a partial group (a stream closed on an unbounded space axis) and
reads back the stored frames of each level that the level above has not taken yet, reduces
them and hands them on: the upper levels' lost tails are made again from stored frames.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.pyramid import (
    Level,
    auto_levels,
    check_axes,
    default_axes,
    level_layout,
    pyramid_levels,
)
from ..engine.report import WriteReport
from ..errors import InvalidValueError
from ..storage.store import ShardStore, resolve_store
from ..write.stream_base import StreamBase
from ..write.stream_open import session_store, stream_axis
from ..write.streams import Stream, stream
from . import options
from .metadata import ome_attributes, put_group
from .reduce import reduce_block
from .stream_resume import resume_levels

__all__ = ["StreamPyramid", "stream_pyramid"]

UNBOUNDED = 1 << 40  # the length an unbounded append axis is planned with (never reached)
GATHER = 256 << 10  # bytes of a level's frames reduced together (one call for small frames)


def stream_pyramid(
    store: Any,
    *,
    shape: tuple[int | None, ...],
    dtype: Any,
    levels: int | str = "auto",
    factors: int | Sequence[int] | Mapping[str, int] = 2,
    method: str = "mean",
    dims: Sequence[str] | None = None,
    append_axis: int = 0,
    path: str | None = None,
    chunks: Any = "auto",
    shards: Any = None,
    scale: Mapping[str, float] | None = None,
    translation: Mapping[str, float] | None = None,
    units: Mapping[str, str] | None = None,
    name: str | None = None,
    mode: str = "w-",
    resume: bool = False,
    pending: int | None = None,
    fill_value: Any = None,
    compressors: Any = "auto",
    lease: bool | None = None,
    break_lease: bool = False,
    threads: int | None = None,
    fsync: bool = False,
    write_empty_chunks: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> StreamPyramid:
    """Open a stream of frames into a new multiscale pyramid (OME-Zarr 0.5), every level
    growing as frames arrive (or, ``resume=True``, the pyramid stream stopped there).

    Parameters
    ----------
    store : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        A zarr ``Store``, a local path, a URL, or a writable icechunk ``Session`` (or its
        store): every level streamed into the session as :func:`shardwise.stream` does (its
        Notes), the group's metadata put there; the caller commits once the stream closed.
    shape : tuple of int or None
        Level 0's shape; at ``append_axis`` the final number of frames or None (unbounded).
    dtype : str or numpy.dtype
        The levels' data type.
    levels : int or "auto", default "auto"
        The number of levels, level 0 included, as :func:`shardwise.write_pyramid` takes it;
        ``"auto"`` counts the axes other than an unbounded append axis.
    factors : int, sequence of int or dict, default 2
        The factor of each reduction, as ``write_pyramid`` takes it. A space append axis
        (``z``) is reduced too (a group of frames at a time); an unbounded one by its factor
        at every level.
    method : {"mean", "nearest", "mode"}, default "mean"
        The reduction, as ``write_pyramid``'s.
    dims : sequence of str, optional
        The axis names, among ``t``, ``c``, ``z``, ``y``, ``x`` in that order (default: the
        last ``ndim`` of them); they are the levels' dimension names.
    append_axis : int
        The axis frames are appended along.
    path : str, optional
        The pyramid group's path (levels at ``"<path>/0"``, ``"<path>/1"``, ...).
    chunks : tuple of int or "auto"
        Level 0's inner chunks, as :func:`shardwise.stream` takes them; smaller levels clip
        them to their shape, as ``write_pyramid`` does.
    shards : tuple of int, optional
        Level 0's shards, as :func:`shardwise.stream` takes them (clipped as ``chunks``).
    scale, translation, units : dict, optional
        Level 0's size and position of a sample, and the units, per axis (``write_pyramid``'s).
    name : str, optional
        The ``name`` of the multiscales entry.
    mode : {"w-", "w"}
        "w-" refuses level arrays already there, "w" replaces them.
    resume : bool
        Continue the pyramid stream at ``path``: every level keeps what it stored, the
        frames each level above had not taken are reduced again from the level below (in a
        session: what the branch's last commit holds).
    pending : int, optional
        Each level's sealed shard-rows written in the background, as :func:`shardwise.stream`
        (default: level 0's default; the other levels as many as level 0).
    fill_value : scalar, optional
        Every level's fill value.
    compressors : "auto", codec, list of codecs or None
        Every level's compressors, as :func:`shardwise.stream` takes them.
    lease, break_lease, threads, fsync, write_empty_chunks, storage_options : optional
        As :func:`shardwise.stream` takes them, for every level.

    Returns
    -------
    StreamPyramid
        ``append``, ``extend``, ``flush``, ``close`` (or a ``with`` block).

    Examples
    --------
    >>> import numpy as np, shardwise, zarr
    >>> store = zarr.storage.MemoryStore()
    >>> with shardwise.stream_pyramid(store, shape=(None, 8, 8), dtype="u2", levels=2,
    ...                               dims=("t", "y", "x"), chunks=(1, 4, 4),
    ...                               shards=(4, 8, 8)) as s:
    ...     for t in range(10):
    ...         s.append(np.full((8, 8), t, "u2"))
    >>> zarr.open_array(store, path="1", mode="r").shape
    (10, 4, 4)
    """
    axis = stream_axis(shape, append_axis, pending, mode, resume)
    axes = check_axes(dims) if dims is not None else default_axes(len(shape))
    if len(axes) != len(shape):
        raise InvalidValueError(f"dims must name each of the {len(shape)} axes, got {dims!r}")
    given = options.factors(factors, axes)
    count = options.levels(levels)
    dt = np.dtype(dtype)
    how = options.method(method, dt)
    s0 = options.per_axis("scale", scale, axes, float, 1.0)
    t0 = options.per_axis("translation", translation, axes, float, 0.0)
    named = options.per_axis("units", units, axes, str, "")
    known = shape[axis]
    plan_shape = tuple(int(UNBOUNDED if n is None else n) for n in shape)
    prefix = f"{path.strip('/')}/" if path else ""
    common = dict(
        dtype=dt, append_axis=axis, mode=mode, resume=resume, pending=pending,
        fill_value=fill_value, compressors=compressors, lease=lease, break_lease=break_lease,
        threads=threads, fsync=fsync, write_empty_chunks=write_empty_chunks,
        storage_options=storage_options,
    )  # fmt: skip
    opened: list[Stream] = []
    try:
        first = stream(store, shape=tuple(shape), chunks=chunks, shards=shards,
                       path=f"{prefix}0", dimension_names=axes, **common)  # fmt: skip
        opened.append(first)
        lay = first._o.write.info.layout
        common["pending"] = first.pending  # the smaller levels hold as many shard-rows
        if count is None:  # "auto": over the axes that have a size
            fits = tuple(1 if known is None and i == axis else f for i, f in enumerate(given))
            count = auto_levels(plan_shape, fits, lay.chunk_shape)
        geometry = pyramid_levels(plan_shape, given, count, centered=how != "nearest",
                                  scale=s0, translation=t0)  # fmt: skip
        for k, lv in enumerate(geometry[1:], start=1):
            ck, sk = level_layout(lv.shape, lay.chunk_shape, lay.shard_shape)
            sized = tuple(
                None if known is None and i == axis else n for i, n in enumerate(lv.shape)
            )
            opened.append(stream(store, shape=sized, chunks=ck, shards=sk, path=f"{prefix}{k}",
                                 dimension_names=axes, **common))  # fmt: skip
        zstore = resolve_store(session_store(store), mode="w", storage_options=storage_options)
        given_units = {a: u for a, u in zip(axes, named, strict=True) if u}
        attrs = ome_attributes(axes, geometry, how, name=name, units=given_units)
        put_group(ShardStore(zstore, prefix.rstrip("/")), "zarr.json", attrs)
        return StreamPyramid(opened, geometry, how, zstore, prefix)
    except BaseException as e:
        for s in opened:
            s.__exit__(type(e), e, e.__traceback__)
        raise


class StreamPyramid(StreamBase):
    """An open pyramid stream (made by :func:`stream_pyramid`, never built directly).

    Attributes
    ----------
    levels : list of Stream
        Each level's stream (level 0 first): its ``stored`` frames are what readers see.
    frames, resumed_from, length
        Level 0's (see :class:`~shardwise.Stream`).
    report : WriteReport or None
        What every level wrote, once closed.

    Examples
    --------
    >>> import numpy as np, shardwise, zarr
    >>> with shardwise.stream_pyramid(zarr.storage.MemoryStore(), shape=(None, 8, 8), dtype="u1",
    ...                               levels=2, chunks=(1, 4, 4), shards=(2, 8, 8)) as s:
    ...     s.extend(np.ones((3, 8, 8), "u1"))
    >>> s.frames, s.report.shards_written
    (3, 3)
    """

    def __init__(
        self, streams: list[Stream], geometry: list[Level], method: str, zstore: Any, prefix: str
    ) -> None:
        self.levels = streams
        self.geometry = geometry
        self.method = method
        self.axis = streams[0].axis
        self.steps = options.steps(geometry)
        self.length = streams[0].length
        self.resumed_from = streams[0].resumed_from
        self.report: WriteReport | None = None
        n = len(streams)
        # per level k < top: the frames of an unfinished group, and how many were reduced
        self._pending: list[list[np.ndarray]] = [[] for _ in range(n)]
        self._consumed = [0] * n
        # per level k > 0: reduced frames waiting for their source's seal (source end, frames)
        self._held: list[deque[tuple[int, np.ndarray]]] = [deque() for _ in range(n)]
        resume_levels(self, zstore, prefix)

    @property
    def frames(self) -> int:
        return self.levels[0].frames

    @property
    def stored(self) -> tuple[int, ...]:
        """Every level's stored frames (what readers see), level 0 first."""
        return tuple(s.stored for s in self.levels)

    @property
    def memory(self) -> int:
        """Bytes held at most: every level's shard-row buffers, the reduced frames waiting
        for the seals below (the unstored frames of a level, reduced) and the frames gathered
        for the next reduction."""
        total = 0
        for k, s in enumerate(self.levels):
            total += s.memory
            if k:
                f = self.steps[k - 1][self.axis]
                below = self.levels[k - 1]
                waiting = (below.pending + 1) * below.step // f + below.step + 1
                total += waiting * self._frame_bytes(k)
            if k + 1 < len(self.levels):  # gathered for the next reduction
                gathered = self._gather(k) + self.steps[k][self.axis] - 1
                total += gathered * self._frame_bytes(k)
        return total

    def append(self, frames: Any) -> None:
        """Append one frame or a batch of them (stacked along the append axis) to level 0;
        the levels above grow from them. A batch is taken a shard-row at a time.

        Parameters
        ----------
        frames : array_like
            One frame, or frames stacked along the append axis.
        """
        s0 = self.levels[0]
        a = np.asarray(frames)
        if a.ndim == len(s0.shape) - 1:
            a = np.expand_dims(a, self.axis)
        n = a.shape[self.axis] if a.ndim == len(s0.shape) else 0
        if self.length is not None and self.frames + n > self.length:  # before any slab
            raise InvalidValueError(
                f"{n} more frames would make {self.frames + n}, past the stream's length "
                f"{self.length}: nothing of them was appended"
            )
        for i in range(0, max(n, 1), s0.step):
            part = a[self._at(i, min(i + s0.step, n))] if n else a
            s0.append(part)  # checks the frames (shape, dtype, length) before taking them
            self._feed(0, np.array(part, dtype=s0.dtype))  # a copy: the caller's may change
            self._release()

    def extend(self, array: Any) -> None:
        """Append every frame of ``array`` (numpy, dask or any array that slices), a
        shard-row of level 0 at a time.

        Parameters
        ----------
        array : array_like or dask.array.Array
            Frames stacked along the append axis.
        """
        step = self.levels[0].step
        n = int(array.shape[self.axis])
        for i in range(0, n, step):
            self.append(np.asarray(array[self._at(i, min(i + step, n))]))

    def flush(self) -> None:
        """Store every level's frames (the partial shard-rows too, as ``Stream.flush``),
        level 0 first; the frames of an unfinished group along the append axis are held back
        from the level above until their group is whole (or the stream closes)."""
        for k in range(len(self.levels)):  # each level's whole groups, gathered or not
            self._feed(k, self._empty(k, 0), now=True)
        for k, s in enumerate(self.levels):
            self._release(k)
            s.flush()

    def close(self) -> WriteReport:
        """Close every level, level 0 first: each level's last, partial group reduced into
        the level above (the ceil rule) before that level closes.

        Returns
        -------
        WriteReport
            What every level wrote, summed (also kept as ``report``).
        """
        return super().close()

    def _parts(self) -> list[Stream]:
        return self.levels

    def _closing(self, k: int, before: bool) -> None:
        if before:
            self._release(k)
        else:
            self._feed(k, self._empty(k, 0), last=True)

    def __repr__(self) -> str:
        return (
            f"<shardwise.StreamPyramid {len(self.levels)} levels, {self.frames} frames, "
            f"stored {self.stored}, memory {self.memory / 2**20:.1f} MiB>"
        )

    # the levels fed from the ones below

    def _feed(self, k: int, x: np.ndarray, last: bool = False, now: bool = False) -> None:
        """Level ``k``'s new frames ``x`` gathered until ``GATHER`` bytes (or a shard-row) are in
        (``now``: at once; reduced frames wait for their row's seal anyway), then the whole groups
        (every one, ``last``) reduced into level ``k + 1`` at once, held for its stream and fed
        on up."""
        if k + 1 >= len(self.levels):
            return
        parts = self._pending[k]
        if x.shape[self.axis]:
            parts.append(x)
        have = sum(p.shape[self.axis] for p in parts)
        if have == 0 or (have < self._gather(k) and not (now or last)):
            return
        buf = np.concatenate(parts, axis=self.axis) if len(parts) != 1 else parts[0]
        f = self.steps[k][self.axis]
        whole = have if last else have // f * f
        self._pending[k] = [buf[self._at(whole, have)]] if whole < have else []
        if whole == 0:
            return
        r = reduce_block(buf[self._at(0, whole)], self.steps[k], self.method)
        self._consumed[k] += whole
        self._held[k + 1].append((self._consumed[k], r))
        self._feed(k + 1, r, now=now or last)

    def _release(self, upto: int | None = None) -> None:
        """Hand each level (up to ``upto``) the reduced frames whose source frames are
        stored."""
        for k in range(1, len(self.levels) if upto is None else upto + 1):
            below, held = self.levels[k - 1], self._held[k]
            while held and (held[0][0] <= below.stored or below.closed):
                self.levels[k].append(held.popleft()[1])

    def _empty(self, k: int, n: int) -> np.ndarray:
        s = self.levels[k]
        shape = list(s.shape)
        shape[self.axis] = n
        return np.empty(shape, s.dtype)

    def _gather(self, k: int) -> int:
        return max(1, min(self.levels[k].step, GATHER // max(self._frame_bytes(k), 1)))

    def _frame_bytes(self, k: int) -> int:
        s = self.levels[k]
        return int(np.prod(s.frame_shape)) * s.dtype.itemsize

    def _at(self, start: int, stop: int) -> tuple[slice, ...]:
        return self.levels[0]._at(start, stop)
