"""Frames in, whole shards out: :func:`stream` and its :class:`Stream`.

A camera, a detector or a simulation gives an array a frame at a time; a shard is stored
whole. A stream keeps the open *shard-row* (every shard at one position of the append axis)
in a buffer allocated once, copies each frame into it, and when the shard-row is full seals
it: its shards are encoded (inner chunks in parallel on the shared pool) and put whole, each
recorded in the journal, and only then does the array's shape grow to include them, so a
reader (``open_array``, the xarray engine, zarr-python, tensorstore) sees sealed frames only.
``flush()`` also writes the partial last shard-row and grows the shape to it; its frames stay
buffered, and the shard is written whole again when it seals, the flushed chunks' bytes kept in
place (``codec/supersede.py``): a reader part-way through reading the flushed shard decodes it.

A stream is a front end of the one write call (``write/execute.py``), not a lifecycle of its
own: it holds one :class:`~shardwise.write.execute.Execution` open for its lifetime (the
array's exclusive lease, so a second writer is refused with ``LeaseHeldError``; one write
marker, grown by :meth:`~shardwise.write.execute.Execution.resize` as shard-rows seal), each
seal a flush of it, and :meth:`Stream.close` finishes it once (marker done, lease released).

Memory is the shard-row buffers, stated up front (:attr:`Stream.memory`): the open one and
``pending`` sealed ones being written in the background. When encoding falls behind, ``append``
waits for a buffer (backpressure); nothing grows without bound.

A process killed at any moment loses at most the frames not sealed (or flushed): shards are
atomic puts and the shape grows after them. ``stream(..., resume=True)`` reopens the array,
tells the frames stored (``Stream.resumed_from``) and continues there (``write/stream_open.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..core.plan import ShardPlan
from ..engine.report import WriteReport
from ..errors import InvalidValueError, PlanError
from .options import WriteOptions
from .stream_base import StreamBase
from .stream_open import Opened, _rows, _sized, open_stream, release_session, stream_axis
from .stream_rows import Ring, Row, RowWriter, row_writes

__all__ = ["Stream", "stream"]

# called as after_store(end) once the shards of a shard-row up to frame ``end`` are stored and
# recorded, before the shape grows (tests stop a stream there)
after_store: Callable[[int], None] | None = None
PENDING_BYTES = 8 << 20  # the sealed shard-rows a stream holds by default (at least one)
# ... and at most this many: small rows (a frame a shard) are written 256 at a time when the
# appender runs ahead, each flush's fixed costs (marker, shape, records) paid once for them
MAX_PENDING = 256


def stream(
    store: Any,
    *,
    shape: tuple[int | None, ...],
    dtype: Any,
    append_axis: int = 0,
    chunks: Any = "auto",
    shards: Any = None,
    path: str | None = None,
    mode: str = "w-",
    resume: bool = False,
    pending: int | None = None,
    fill_value: Any = None,
    compressors: Any = "auto",
    dimension_names: Any = None,
    attributes: dict[str, Any] | None = None,
    lease: bool | None = None,
    break_lease: bool = False,
    threads: int | None = None,
    fsync: bool = False,
    write_empty_chunks: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> Stream:
    """Open a stream of frames into a new sharded array (or, ``resume=True``, the stream
    stopped there), appended along ``append_axis``.

    Parameters
    ----------
    store : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        A zarr ``Store``, a local path, a URL, or a writable icechunk ``Session`` (or its
        store): see Notes.
    shape : tuple of int or None
        The array's shape; at ``append_axis`` the final number of frames, or None when it is
        not known (the stream ends at :meth:`Stream.close`). The other sizes are a frame's.
    dtype : str or numpy.dtype
        The array's data type; frames are cast to it without loss (``PlanError`` otherwise).
    append_axis : int
        The axis frames are appended along.
    chunks : tuple of int or "auto"
        The inner chunk shape ("auto": shardwise's default for the known length).
    shards : tuple of int, optional
        The shard shape; its size along ``append_axis`` is the frames of a shard-row.
    path : str, optional
        The array's path in ``store``.
    mode : {"w-", "w"}
        "w-" refuses an array at the path, "w" replaces it.
    resume : bool
        Continue the stream at the path: its stored frames are kept (see ``Stream.resumed_from``),
        the next frame appended after them. A new array when there is none. In a session: from
        the length its snapshot holds (the branch's last commit).
    pending : int, optional
        Sealed shard-rows written in the background while the next one fills; ``append`` waits
        when more would be (default: as many as fit 8 MiB, at least one and at most 256; written
        together).
    fill_value : scalar, optional
        The fill value, as ``zarr.create_array`` takes it.
    compressors : "auto", codec, list of codecs or None
        As ``zarr.create_array`` takes them ("auto": zstd).
    dimension_names : tuple of str, optional
        The array's dimension names (xarray reads them as its dimensions).
    attributes : dict, optional
        The array's attributes.
    lease : bool, optional
        Hold the array's exclusive lease while the stream is open (default: where the store
        can delete; none in a session, where ``lease=True`` is refused).
    break_lease : bool
        Break a stale lease of a writer that is gone.
    threads : int, optional
        Threads encoding a shard's inner chunks.
    fsync : bool
        ``fsync`` each shard of a local store.
    write_empty_chunks : bool
        Store inner chunks equal to the fill value.
    storage_options : dict, optional
        For a URL ``store``, as fsspec takes them.

    Returns
    -------
    Stream
        The open stream: ``append``, ``extend``, ``flush``, ``close`` (or a ``with`` block).

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A keyword of the wrong type or value (named in the message), before the store is touched.
    ArrayExistsError
        ``mode="w-"`` (without ``resume``) and an array is already at the path.
    LeaseHeldError
        Another writer holds the array (a stream still open, or a write running); with
        ``resume=True`` a stream whose process is gone is taken over.
    PlanError
        ``resume=True`` over an array of other frames, dtype, chunks or shards.
    TransactionError
        Another thread's shardwise write is running in the session.

    Notes
    -----
    Into an icechunk session, each flush grows the array's shape in the session, forks it,
    writes its whole shards into forks (one per shard task) and merges them back: no lease or
    journal; the caller commits once the stream closed (a committed session is read-only), and
    ``resume=True`` in a new session continues from the last commit. The stream holds the
    session while open (another thread's write into it is refused). A ``ForkSession``, a
    read-only session and ``lease=True`` are refused before any change.

    Examples
    --------
    >>> import numpy as np, shardwise, zarr
    >>> store = zarr.storage.MemoryStore()
    >>> with shardwise.stream(store, shape=(None, 4, 4), dtype="u2", chunks=(1, 4, 4),
    ...                       shards=(8, 4, 4)) as s:
    ...     for t in range(20):
    ...         s.append(np.full((4, 4), t, "u2"))
    >>> zarr.open_array(store, mode="r").shape
    (20, 4, 4)
    """
    axis = stream_axis(shape, append_axis, pending, mode, resume)
    o = WriteOptions.checked(
        verb="stream", modes=("w-", "w"), path=path, mode=mode, resume=resume, lease=lease,
        break_lease=break_lease, threads=threads, fsync=fsync,
        write_empty_chunks=write_empty_chunks, storage_options=storage_options, dtype=dtype,
        chunks=chunks, shards=shards, fill_value=fill_value, compressors=compressors,
        dimension_names=dimension_names, attributes=attributes,
    )  # fmt: skip
    final = shape[axis]
    return Stream(open_stream(store, tuple(shape), axis, o), final, pending)


class Stream(StreamBase):
    """An open stream of frames into a sharded array (made by :func:`stream`, never built
    directly).

    Attributes
    ----------
    frames : int
        Frames appended (those stored before a resume included).
    stored : int
        Frames stored: the array's length as readers see it.
    resumed_from : int
        Frames the array held when the stream opened (``resume=True``; 0 for a new array).
    length : int or None
        The final number of frames, or None (unbounded).
    report : WriteReport or None
        What the stream wrote, once closed.

    Frames are copied into the open shard-row's buffer; a full one is sealed (its shards put
    whole in the background, then the shape grown). As a context manager it closes on a clean
    exit; when the block raises, the sealed frames stay, left for ``resume=True``.

    Examples
    --------
    >>> import numpy as np, shardwise, zarr
    >>> with shardwise.stream(zarr.storage.MemoryStore(), shape=(None, 4), dtype="u1") as s:
    ...     s.extend(np.ones((6, 4), "u1"))
    >>> s.frames, s.stored
    (6, 6)
    """

    def __init__(self, opened: Opened, length: int | None, pending: int | None) -> None:
        self._o = opened
        self.axis = opened.axis
        info = opened.write.info
        self.dtype = info.dtype
        self.step = int(info.layout.shard_shape[self.axis])
        self.length = length
        self.frame_shape = tuple(n for i, n in enumerate(info.layout.shape) if i != self.axis)
        row = list(info.layout.shape)
        row[self.axis] = self.step
        self._row_shape = tuple(row)
        row_bytes = int(np.prod(self._row_shape)) * self.dtype.itemsize
        self.pending = pending or max(1, min(MAX_PENDING, PENDING_BYTES // max(row_bytes, 1)))
        self._ring = Ring(self._row_shape, self.dtype, self.axis, self.pending + 1)
        self._slot = 0  # the open shard-row's slot of the ring
        self._buf = self._ring.view(0)
        self._frame_key: list[Any] = [slice(None)] * len(self._row_shape)  # one frame's place
        self._casts: dict[np.dtype[Any], bool] = {}
        self.resumed_from = self._shown = opened.length  # frames stored when it opened
        self.frames = opened.length  # frames appended (those stored when it opened included)
        self.stored = opened.length  # frames stored: what readers see
        self._row = opened.length // self.step  # the open shard-row
        self._fill = opened.length - self._row * self.step  # its frames buffered
        self._flushed = self._fill  # of them, the frames stored (a flush, or on resume)
        if opened.tail is not None:
            self._buf[self._at(0, self._fill)] = opened.tail
        self._start = min(int(opened.write.plan.region[self.axis].start), self._row * self.step)
        self.report: WriteReport | None = None
        self.grow: Callable[[int], None] | None = None  # None: the shape grown here, as sealed
        self.closed = False
        self._writer = RowWriter(self._write, self._ring)

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape as readers see it (the sealed or flushed frames)."""
        return tuple(self.stored if i == self.axis else n for i, n in enumerate(self._row_shape))

    @property
    def memory(self) -> int:
        """The bytes of the shard-row buffers (the open one and ``pending`` sealed ones): what
        the stream holds, allocated when it opened."""
        return (self.pending + 1) * int(np.prod(self._row_shape)) * self.dtype.itemsize

    def __repr__(self) -> str:
        where = self._o.write.store
        total = "unbounded" if self.length is None else f"of {self.length}"
        return (
            f"<shardwise.Stream {where.path or '/'!r} {self.frames} frames {total} "
            f"({self.stored} readable), shard-rows of {self.step} frames, "
            f"memory {self.memory / 2**20:.1f} MiB>"
        )

    def append(self, frames: Any) -> None:
        """Append one frame (the array's shape without the append axis) or a batch of them
        (with it). Copied at the call; waits while ``pending`` sealed shard-rows are still
        being written.

        Parameters
        ----------
        frames : array_like
            One frame, or frames stacked along the append axis.
        """
        self._check_open()
        a = np.asarray(frames)
        if a.shape == self.frame_shape and self._fits(a.dtype) and self.frames != self.length:
            # one frame (a camera's append): copied into its place, no batch machinery
            key = self._frame_key
            key[self.axis] = self._fill
            self._buf[tuple(key)] = a
            self._fill += 1
            self.frames += 1
            if self._fill == self.step or self.frames == self.length:
                self._seal()
            return
        if a.ndim == len(self._row_shape) - 1:
            a = np.expand_dims(a, self.axis)
        others = tuple(n for i, n in enumerate(a.shape) if i != self.axis)
        if a.ndim != len(self._row_shape) or others != self.frame_shape:
            raise PlanError(
                f"frames of shape {a.shape} do not fit a stream of frames {self.frame_shape} "
                f"appended along axis {self.axis}"
            )
        if not self._fits(a.dtype):
            raise PlanError(f"cannot append {a.dtype} frames to a {self.dtype} array without loss")
        n = a.shape[self.axis]
        if self.length is not None and self.frames + n > self.length:
            raise InvalidValueError(
                f"{n} more frames would make {self.frames + n}, past the stream's length "
                f"{self.length}: nothing of them was appended"
            )
        i = 0
        while i < n:
            take = min(self.step - self._fill, n - i)
            self._buf[self._at(self._fill, self._fill + take)] = a[self._at(i, i + take)]
            self._fill, self.frames, i = self._fill + take, self.frames + take, i + take
            if self._fill == self.step or self.frames == self.length:
                self._seal()

    def extend(self, array: Any) -> None:
        """Append every frame of ``array`` (numpy, dask or any array that slices), a
        shard-row at a time (a dask array computed slab by slab: memory stays bounded).

        Parameters
        ----------
        array : array_like or dask.array.Array
            Frames stacked along the append axis.
        """
        n = int(array.shape[self.axis]) if np.ndim(array) == len(self._row_shape) else 1
        if n == 1 and np.ndim(array) != len(self._row_shape):
            self.append(array)
            return
        for i in range(0, n, self.step):
            self.append(np.asarray(array[self._at(i, min(i + self.step, n))]))

    def flush(self) -> None:
        """Write every sealed shard-row and the partial last one now (its frames stay
        buffered: its shards are written whole again when it seals, their flushed chunks kept
        in place for readers part-way through them), then grow the shape to every frame
        appended."""
        self._check_open()
        self._drain()
        if self._fill > self._flushed:
            self._write([(self._row, self._slot, self._fill)])
            self._flushed = self._fill

    def _finish(self) -> WriteReport:
        """Flush, then finish the write once (its marker done, the lease released)."""
        self.flush()
        self._writer.stop()
        self._o.ex.resize(self._whole(self.stored))  # the marker ends where the array does
        report: WriteReport = self._o.ex.run([])
        self._o.ex.__exit__(None, None, None)
        release_session(self._o.ex.target)
        note = f"stream: {self.stored} frames"
        if self.resumed_from:
            note += f" ({self.resumed_from} stored before, resume=True)"
        report.notes.append(note)
        return report

    # the background writer and the seals

    def _seal(self) -> None:
        """Hand the full (or final) shard-row to the writer; wait for a free buffer."""
        self._writer.put((self._row, self._slot, self._fill))
        self._row += 1
        self._fill = self._flushed = 0
        self._slot = self._ring.free.get()  # the writer gives every slot back, failed or not
        self._buf = self._ring.view(self._slot)
        self._check_open()

    def _write(self, rows: list[Row]) -> None:
        """Store the shard-rows ``rows`` (each: its index, its slot and its frames): the
        marker grown to the last, their shards put and recorded (rows after each other in
        one write, a row readers see in part superseded: ``write/stream_rows.py``), then the
        shape grown."""
        last, _, n = rows[-1]
        end = last * self.step + n
        whole = self._whole(end)
        ex = self._o.ex
        ex.resize(whole)
        writes = row_writes(whole, self._ring, rows, max(self.stored, self._shown))
        if ex.target.forks:  # a session: the shape first (the flush's forks write inside it)
            self._put_shape(end, whole)
            ex.fork_again()
            ex.flush(ex.parts(writes), merge=True)
        else:
            ex.flush(ex.parts(writes))
            if after_store is not None:
                after_store(end)
        if self.grow is not None:  # a dataset stream grows its arrays' shapes together
            self.grow(end)
        elif not ex.target.forks:
            self._put_shape(end, whole)
        self.stored = end

    def _put_shape(self, end: int, whole: Any) -> None:
        self._o.meta["shape"][self.axis] = end
        whole.store.put("zarr.json", json.dumps(self._o.meta, indent=2).encode())

    def _whole(self, end: int) -> Any:
        """The stream's write up to frame ``end``: its rows in the array at that length."""
        w = self._o.write
        info = _sized(w.info, self.axis, end)
        region = _rows(info.layout.shape, self.axis, min(self._start, end), end)
        return replace(w, info=info, plan=ShardPlan(info.layout, region), source=None)

    def _drain(self) -> None:
        self._writer.drain()
        self._check_open()

    def _abandon(self, error: BaseException) -> None:
        """Stop after ``error``: the sealed shard-rows handed to the writer are written (or
        its own error stands), the write left open for ``resume=True``, the lease released."""
        if self.closed:
            return
        self._writer.stop()
        self.closed = True
        try:
            self._o.ex.__exit__(type(error), error, error.__traceback__)
        finally:
            release_session(self._o.ex.target)

    def _fits(self, dtype: np.dtype[Any]) -> bool:
        """Whether frames of ``dtype`` go into the array's without loss (asked once a dtype)."""
        fits = self._casts.get(dtype)
        if fits is None:
            fits = self._casts[dtype] = bool(np.can_cast(dtype, self.dtype, casting="same_kind"))
        return fits

    def _check_open(self) -> None:
        if self._writer.error is not None:
            raise self._writer.error
        if self.closed:
            raise InvalidValueError("the stream is closed")

    def _at(self, start: int, stop: int) -> tuple[slice, ...]:
        ndim = len(self._row_shape)
        return tuple(slice(start, stop) if i == self.axis else slice(None) for i in range(ndim))
