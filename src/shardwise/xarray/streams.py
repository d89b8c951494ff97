"""A Dataset whose append dimension grows, streamed: :func:`stream_dataset` and its
:class:`DatasetStream`.

One :class:`~shardwise.write.streams.Stream` per variable along the append dimension (the
append coordinate, ``time``, among them: CF-encoded with the units fixed at open,
``stream_vars.py``); the variables without it are written once at open
(:func:`~shardwise.write_array`). Each variable's stream seals its shard-rows in the
background, on its own; its shape does not grow on its own (``Stream.grow``): the length every
variable has sealed (the smallest) is *published* once it advances, every array's ``zarr.json``
grown to it, then the group's ``zarr.json`` with consolidated metadata (the documents of every
array) put last. A reader through the consolidated metadata (``xr.open_zarr``'s default, the
shardwise engine's, zarr-python's ``use_consolidated``) sees every variable at one length, the
old or the new: all or nothing. A reader without it reads each ``zarr.json`` on its own, and
while the documents of one growth are being put may find variables of two lengths (xarray then
refuses the dataset for its conflicting sizes: opening again finds one length).

A process killed at any moment loses only frames not published: ``resume=True`` resumes every
variable's stream, and the length the dataset resumes from is the smallest stored (a kill
during a growth leaves some arrays longer; their stored frames past it are kept, and skipped
when the same frames are appended again).
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..engine.report import WriteReport
from ..errors import InvalidTypeError, InvalidValueError
from ..storage.store import ShardStore, resolve_store
from ..write.stream_base import StreamBase
from ..write.stream_open import session_store
from ..write.streams import Stream, stream
from .stream_vars import Spec, capture, encode_slice, layouts

__all__ = ["DatasetStream", "stream_dataset"]

# called on a variable's writer thread with the new common length ``end`` (tests stop there):
# every variable sealed up to ``end``, no shape grown yet
before_publish: Callable[[int], None] | None = None
# every array's ``zarr.json`` grown to ``end``, the group's consolidated metadata not yet
before_consolidate: Callable[[int], None] | None = None


def stream_dataset(
    store: Any,
    template: Any,
    *,
    append_dim: str = "time",
    chunks: Mapping[str, int] | None = None,
    shards: Mapping[str, int] | int | None = None,
    group: str | None = None,
    mode: str = "w-",
    resume: bool = False,
    pending: int | None = None,
    compressors: Any = "auto",
    lease: bool | None = None,
    break_lease: bool = False,
    threads: int | None = None,
    fsync: bool = False,
    write_empty_chunks: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> DatasetStream:
    """Open a stream of slices of an ``xarray.Dataset`` growing along ``append_dim`` (or,
    ``resume=True``, the Dataset stream stopped there).

    Parameters
    ----------
    store : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        A zarr ``Store``, a local path, a URL, or a writable icechunk ``Session`` (or its
        store): each variable streamed into the session as :func:`shardwise.stream` does (its
        Notes), its array grown by its own flushes, the group without consolidated metadata
        (read with ``consolidated=False``); the caller commits once the stream closed.
    template : xarray.Dataset
        The Dataset the store takes: its variables, dtypes, sizes, attributes and encoding.
        Its frames along ``append_dim`` are not written (append them); its first one fixes the
        CF encoding of a time coordinate (``units``, ``calendar``), as ``to_zarr`` would
        choose it, unless its ``encoding`` gives them. Variables without ``append_dim`` are
        written once, at open.
    append_dim : str, default "time"
        The dimension slices are appended along.
    chunks : dict, optional
        Inner chunk sizes by dimension name (default: 1 along ``append_dim``, others whole).
    shards : dict or int, optional
        Shard sizes by dimension name (an int: along ``append_dim``); along ``append_dim`` the
        frames of a shard-row (default 16), others whole.
    group : str, optional
        The group's path in ``store``.
    mode : {"w-", "w"}
        "w-" refuses arrays already there, "w" replaces them.
    resume : bool
        Continue the stream there: its stored frames are kept (``resumed_from``; in a
        session, those of the branch's last commit).
    pending, compressors, lease, break_lease, threads, fsync, write_empty_chunks : optional
        As :func:`shardwise.stream` takes them, for every variable's stream.
    storage_options : dict, optional
        As :func:`shardwise.stream` takes them, for every variable's stream.

    Returns
    -------
    DatasetStream
        ``append``, ``extend``, ``flush``, ``close`` (or a ``with`` block).

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A keyword of the wrong type or value, before the store is touched.
    ArrayExistsError, LeaseHeldError, PlanError
        As :func:`shardwise.stream` raises them, for the first variable that does.

    Notes
    -----
    Readers through the group's consolidated metadata (``xr.open_zarr``,
    ``shardwise.open_dataset``) see every variable at one length, the old or the new: it is
    put after every array's ``zarr.json`` has grown. A reader with ``consolidated=False``
    reads each array's own document and, during one growth, may find two lengths (xarray
    refuses such a Dataset for conflicting sizes; opening again finds one).

    Examples
    --------
    >>> import numpy as np, pandas as pd, shardwise, xarray as xr, zarr
    >>> def day(i):
    ...     when = pd.date_range("2024-01-01", periods=1) + pd.Timedelta(days=i)
    ...     return xr.Dataset({"t2m": (("time", "x"), np.full((1, 3), i, "f4"))},
    ...                       coords={"time": when})
    >>> store = zarr.storage.MemoryStore()
    >>> with shardwise.stream_dataset(store, day(0), shards=4) as s:
    ...     for i in range(6):
    ...         s.append(day(i))
    >>> xr.open_zarr(store).sizes["time"]
    6
    """
    if group is not None and not isinstance(group, str):
        raise InvalidTypeError(f"group must be a str, got {group!r}")
    if mode not in ("w-", "w"):
        raise InvalidValueError(f"mode must be 'w-' or 'w', got {mode!r}")
    specs, attrs = capture(template, append_dim)
    grid = layouts(specs, append_dim, chunks, shards)
    if not grid:
        raise InvalidValueError(f"no variable of the template has the dimension {append_dim!r}")
    prefix = f"{group.strip('/')}/" if group and group.strip("/") else ""
    common = dict(
        mode=mode, resume=resume, pending=pending, compressors=compressors, lease=lease,
        break_lease=break_lease, threads=threads, fsync=fsync,
        write_empty_chunks=write_empty_chunks, storage_options=storage_options,
    )  # fmt: skip
    opened: dict[str, Stream] = {}
    try:
        for name in sorted(grid):
            v = specs[name]
            assert v.axis is not None
            sized = tuple(None if i == v.axis else n for i, n in enumerate(v.shape))
            opened[name] = stream(
                store, shape=sized, dtype=v.dtype, append_axis=v.axis, chunks=grid[name][0],
                shards=grid[name][1], path=f"{prefix}{name}", fill_value=v.fill_value,
                dimension_names=v.dims, attributes=v.attributes, **common,
            )  # fmt: skip
        for name, st in opened.items():  # a resumed variable keeps its stored CF encoding
            kept = st._o.meta.get("attributes", {})
            if "units" in specs[name].encoding:
                specs[name].encoding.update(
                    {k: kept[k] for k in ("units", "calendar") if k in kept}
                )
        zstore = resolve_store(session_store(store), mode="w", storage_options=storage_options)
        statics = _write_static(zstore, prefix, specs, mode, resume)
        return DatasetStream(opened, specs, attrs, append_dim, zstore, prefix, statics)
    except BaseException as e:
        for st in opened.values():
            st.__exit__(type(e), e, e.__traceback__)
        raise


def _write_static(
    zstore: Any, prefix: str, specs: Mapping[str, Spec], mode: str, resume: bool
) -> dict[str, dict[str, Any]]:
    """The variables without the append dimension written (on resume: those not there yet);
    their ``zarr.json`` documents."""
    from ..api import write_array

    docs = {}
    for name, s in sorted(specs.items()):
        if s.axis is not None:
            continue
        where = ShardStore(zstore, f"{prefix}{name}")
        if not (resume and where.get("zarr.json") is not None):
            write_array(s.values, zstore, path=f"{prefix}{name}", fill_value=s.fill_value,
                        dimension_names=s.dims or None, attributes=s.attributes,
                        mode="w" if mode == "w" or resume else "w-")  # fmt: skip
        raw = where.get("zarr.json")
        assert raw is not None
        docs[name] = json.loads(raw)
    return docs


class DatasetStream(StreamBase):
    """An open Dataset stream (made by :func:`stream_dataset`, never built directly).

    Attributes
    ----------
    streams : dict of str to Stream
        Each streamed variable's stream.
    frames : int
        Frames appended (those stored before a resume included).
    stored : int
        Frames published: the length readers see, every variable alike.
    resumed_from : int
        Frames stored when the stream opened (``resume=True``; 0 for a new one).
    report : WriteReport or None
        What every variable's stream wrote, once closed.

    Examples
    --------
    >>> import numpy as np, pandas as pd, shardwise, xarray as xr, zarr
    >>> def day(i):
    ...     when = pd.date_range("2024-01-01", periods=2) + pd.Timedelta(days=2 * i)
    ...     return xr.Dataset({"t2m": (("time", "x"), np.full((2, 3), i, "f4"))},
    ...                       coords={"time": when})
    >>> s = shardwise.stream_dataset(zarr.storage.MemoryStore(), day(0), shards=4)
    >>> s.append(day(0)); s.append(day(1)); s.append(day(2))
    >>> s.frames, sorted(s.streams)
    (6, ['t2m', 'time'])
    >>> s.close().shards_written >= 2, s.stored
    (True, 6)
    """

    def __init__(
        self,
        streams: dict[str, Stream],
        specs: Mapping[str, Spec],
        attrs: dict[str, Any],
        dim: str,
        zstore: Any,
        prefix: str,
        statics: dict[str, dict[str, Any]],
    ) -> None:
        self.streams = streams
        self.append_dim = dim
        self._specs = specs
        self._attrs = attrs
        self._docs = statics
        self._root = ShardStore(zstore, prefix.rstrip("/"))
        self._lock = threading.Lock()
        self._session = any(s._o.ex.target.forks for s in streams.values())
        got = {n: s.resumed_from for n, s in streams.items()}
        self.resumed_from = min(got.values())
        self._skip = {n: g - self.resumed_from for n, g in got.items()}  # stored past it
        self._sealed = dict(got)
        self.frames = self.resumed_from
        self.stored = -1
        self.report: WriteReport | None = None
        self.closed = False
        self.after_publish: Callable[[], None] | None = None  # a pyramid's group, refreshed
        self._publish(self.resumed_from)
        for n, s in streams.items():
            s.grow = functools.partial(self._grown, n)

    @property
    def memory(self) -> int:
        """The bytes of every variable's shard-row buffers."""
        return sum(s.memory for s in self.streams.values())

    def __repr__(self) -> str:
        return (
            f"<shardwise.DatasetStream {len(self.streams)} variables along "
            f"{self.append_dim!r}, {self.frames} frames ({self.stored} readable), "
            f"memory {self.memory / 2**20:.1f} MiB>"
        )

    def append(self, ds: Any) -> None:
        """Append a slice: a Dataset of the stored variables along the append dimension
        (one step may be a scalar coordinate), every variable checked and encoded first.

        Parameters
        ----------
        ds : xarray.Dataset
            The frames to append, of every variable along the append dimension.
        """
        self._check_open()
        n, values = encode_slice(self._specs, self.append_dim, ds)
        try:
            for name, v in values.items():
                s = self.streams[name]
                k = min(self._skip[name], n)  # stored before a kill, past the resumed length
                self._skip[name] -= k
                if k < n:
                    s.append(v[tuple(slice(k, None) if i == s.axis else slice(None)
                                     for i in range(v.ndim))])  # fmt: skip
        except BaseException as e:
            self._abandon(e)
            raise
        self.frames += n

    def extend(self, ds: Any) -> None:
        """Append every frame of ``ds`` (numpy- or dask-backed), a shard-row at a time.

        Parameters
        ----------
        ds : xarray.Dataset
            Frames of every variable along the append dimension.
        """
        step = min(s.step for s in self.streams.values())
        n = int(ds.sizes[self.append_dim])
        for i in range(0, n, step):
            self.append(ds.isel({self.append_dim: slice(i, i + step)}).compute())

    def flush(self) -> None:
        """Store every variable's frames (the partial shard-rows too) and publish them."""
        self._check_open()
        for s in self.streams.values():
            s.flush()

    def _parts(self) -> list[Stream]:
        return list(self.streams.values())

    def _finish(self) -> WriteReport:
        self.flush()
        return super()._finish()

    # the shapes grown together

    def _grown(self, name: str, end: int) -> None:
        """``name``'s stream stored its frames up to ``end`` (on its writer thread): the
        common length published once it advances."""
        with self._lock:
            self._sealed[name] = end
            common = min(self._sealed.values())
            if common > self.stored:
                if before_publish is not None:
                    before_publish(common)
                self._publish(common)

    def _publish(self, end: int) -> None:
        """Every streamed array's ``zarr.json`` grown to ``end``, then the group's, its
        consolidated metadata naming every array at that length."""
        root: dict[str, Any] = {"zarr_format": 3, "node_type": "group", "attributes": self._attrs}
        if self._session:  # each array grown with its own flushes; icechunk keeps no consolidated
            self._root.put("zarr.json", json.dumps(root, indent=2).encode())
            self.stored = end
            return
        for s in self.streams.values():
            meta = s._o.meta
            meta["shape"][s.axis] = end
            s._o.write.store.put("zarr.json", json.dumps(meta, indent=2).encode())
        if before_consolidate is not None:
            before_consolidate(end)
        docs = {**self._docs, **{n: s._o.meta for n, s in self.streams.items()}}
        root["consolidated_metadata"] = {
            "kind": "inline",
            "must_understand": False,
            "metadata": dict(sorted(docs.items())),
        }
        self._root.put("zarr.json", json.dumps(root, indent=2).encode())
        self.stored = end
        if self.after_publish is not None:
            self.after_publish()

    def _check_open(self) -> None:
        if self.closed:
            raise InvalidValueError("the Dataset stream is closed")
