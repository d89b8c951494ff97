"""How a stream (``write/streams.py``) starts: the array created at length 0, or on
``resume=True`` the array found and its stream's open write adopted, as the one write call
(``write/execute.py``) holds it open.

The stream's write is one :class:`~shardwise.write.pipeline.ArrayWrite` whose region is the
rows it wrote so far along the append axis (from the first shard-row it writes), in the array
at the length written so far: one exclusive lease and one open marker (its ``append`` says
``{"call": "stream", "axis": i}``) for the stream's lifetime, grown by
:meth:`~shardwise.write.execute.Execution.resize` as shard-rows are sealed.

A resume finds the length readers see (the array's stored shape: it grows only after the
shards below it are stored and recorded) and the open marker of the stream that stopped
(killed, or failed): the marker is adopted (its lease taken over when its holder is gone) and
cut back to that length when the stream goes on; shards a killed seal stored past the length
(their shape never grew) are removed, and the rows of a partial last shard-row are read back
into the stream's buffer, so that shard is written whole again when it seals.

:func:`rewind` takes a resumed stream back to fewer frames than it stored (a pyramid level
whose last frame was reduced from a partial group when its stream closed): they are appended
again (the shape cut back to the frames kept), their shard-row written whole when it seals.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..codec.metadata import ArrayInfo
from ..core.layout import Region
from ..core.plan import ShardPlan
from ..durability.journal import (
    RECORDS,
    WRITES,
    WriteMarker,
    marker_name,
    read_markers,
    temp_target,
)
from ..durability.records import cut_run_records
from ..errors import InvalidTypeError, InvalidValueError, PlanError
from ..storage.nodes import open_info
from ..storage.retry import retry_transient
from ..storage.store import JOURNAL, ShardStore, describe, resolve_store
from .create import _layout, _probe
from .execute import Execution, Target, WriteCall
from .intent import array_write, create_metadata, decide, resolve
from .options import WriteOptions
from .pipeline import ArrayWrite

STREAM = "stream"  # the ``call`` of a stream's marker
NOMINAL = 4096  # frames: the length the default layout of an unbounded stream is chosen for


@dataclass
class Opened:
    """A stream's write, held open: the execution, its array write (the region written so
    far), the array's metadata document (its shape grown by the stream), the length readers
    see, and on resume the rows of the partial last shard-row read back."""

    ex: Execution
    write: ArrayWrite
    meta: dict[str, Any]
    axis: int
    length: int
    tail: np.ndarray | None
    resumed: bool


def stream_axis(shape: Any, append_axis: Any, pending: Any, mode: Any, resume: bool) -> int:
    """:func:`~shardwise.write.streams.stream`'s own keywords checked (before the store is
    touched); the append axis, non-negative."""
    if not isinstance(shape, tuple | list) or not shape:
        raise InvalidTypeError(f"shape must be a tuple of sizes (None: unbounded), got {shape!r}")
    ndim = len(shape)
    if isinstance(append_axis, bool) or not isinstance(append_axis, int):
        raise InvalidTypeError(f"append_axis must be an int, got {append_axis!r}")
    if not -ndim <= append_axis < ndim:
        raise InvalidValueError(f"append_axis={append_axis} is not an axis of shape {shape}")
    axis = append_axis % ndim
    for i, n in enumerate(shape):
        if not (n is None and i == axis) and (not isinstance(n, int) or n < 0):
            raise InvalidValueError(
                f"shape={tuple(shape)!r}: sizes are whole numbers (None only at the append axis)"
            )
    if pending is not None and (
        isinstance(pending, bool) or not isinstance(pending, int) or pending < 1
    ):
        raise InvalidValueError(f"pending must be a positive int, got {pending!r}")
    if mode not in ("w-", "w"):
        raise InvalidValueError(f"mode must be 'w-' or 'w', got {mode!r}")
    if resume and mode == "w":
        raise InvalidValueError("resume=True continues the stream there; mode='w' replaces it")
    return axis


def frame_layout(
    shape: tuple[int | None, ...], axis: int, dtype: Any, chunks: Any, shards: Any
) -> tuple[Any, Any]:
    """Chunks and shards of a stream's array: as given, or completed by the default rule
    for the known length (``NOMINAL`` frames for an unbounded stream)."""
    nominal = tuple(
        (NOMINAL if n is None else max(int(n), 1)) if i == axis else int(n or 1)
        for i, n in enumerate(shape)
    )
    return _layout(nominal, dtype, chunks, shards)


def open_stream(store: Any, shape: tuple[int | None, ...], axis: int, o: WriteOptions) -> Opened:
    """The stream's write entered (lease held, marker open, metadata stored): a new array at
    length 0, or (``o.resume``) the array there, its stream's open write adopted."""
    # a session: no lease (its transaction keeps writers out), resume from its snapshot
    target, checked = Target.open(store, None, replace(o, resume=False))
    hold_session(target)
    try:
        return _open_at(target, shape, axis, replace(checked, resume=o.resume))
    except BaseException:
        release_session(target)
        raise


def _open_at(target: Target, shape: tuple[int | None, ...], axis: int, o: WriteOptions) -> Opened:
    """:func:`open_stream` into ``target``, its session claimed (given back on an error)."""
    zstore = resolve_store(target.store, mode="w", storage_options=o.storage_options)
    sstore = ShardStore(zstore, o.path or "", fsync=o.fsync)
    given = dict(o.create)
    dtype, chunks, shards = given.pop("dtype"), given.pop("chunks"), given.pop("shards")
    chunks, shards = frame_layout(shape, axis, dtype, chunks, shards)
    empty = tuple(0 if i == axis else int(n or 0) for i, n in enumerate(shape))
    kwargs, made = _probe(empty, dtype, chunks, shards, given)
    probe_info = open_info(made.store)
    if o.resume and _exists(sstore):
        return _resume(target, sstore, probe_info, axis, o)
    intent = resolve(zstore, o.path, o.mode, False, lambda: made)
    plan = ShardPlan(probe_info.layout, _rows(empty, axis, 0, 0))
    write = array_write(
        sstore,
        probe_info,
        intent,
        None,
        plan=plan,
        strategy="direct",
        create=lambda: create_metadata(zstore, o.path, kwargs, made),
        options=o.settings,
    )
    # resume=True over no array: a stream killed before its metadata (its lease taken over)
    write = replace(write, append=_named(axis), adopt_done=False, resume=o.resume)
    ex = _enter(target, write, o, zstore)
    return Opened(ex, write, _metadata(sstore), axis, 0, None, False)


def _enter(target: Target, write: ArrayWrite, o: WriteOptions, zstore: Any) -> Execution:
    call = WriteCall(
        [write],
        lease=target.lease(o.lease, True, zstore),
        break_lease=o.break_lease,
        desc="shardwise stream",
    )
    return Execution(target, call).__enter__()


def session_store(store: Any) -> Any:
    """Where a stream front end puts its own metadata (a pyramid's group, a Dataset's): an
    icechunk session's store (its streams write into the session), else ``store`` itself."""
    from ..storage.icechunk import is_session

    return store.store if is_session(store) else store


def hold_session(target: Target) -> None:
    """A stream into a session holds the claim its open took on the session while it is open
    (one write into a session at a time, ``storage/icechunk.py``): one hold per stream, so a
    front end's streams (a Dataset's variables, a pyramid's levels) keep the session claimed
    until the last of them has finished."""
    if target.session is not None:
        from ..storage.icechunk import hold

        hold(target.session.session)


def release_session(target: Target) -> None:
    """A stream into a session gives its hold on the session back (:func:`hold_session`):
    the claim goes with the last stream holding it."""
    if target.session is None:
        return
    from ..storage.icechunk import release

    release(target.session.session)


def _resume(
    target: Target, sstore: ShardStore, probe: ArrayInfo, axis: int, o: WriteOptions
) -> Opened:
    """The array at ``sstore`` continued: checked against the stream's layout, its open stream
    write adopted (else a new one from its last shard-row), leftovers past its length removed
    and the partial last shard-row read back."""
    where = describe(sstore.store, sstore.path)
    meta = _metadata(sstore)
    info = retry_transient(lambda: open_info(sstore.store, sstore.path))
    _check_same(info, probe, axis, where)
    lay = info.layout
    length, step = lay.shape[axis], lay.shard_shape[axis]
    first = length // step * step
    found = _open_marker(sstore, axis)
    if found is not None:  # the stopped stream's write: adopted as it was left
        region = tuple(slice(a, b) for a, b in found.region)
        at = _sized(info, axis, int(found.shape[axis]))
    else:
        region, at = _rows(lay.shape, axis, first, length), info
    intent = decide("a", True, True, True)
    write = array_write(sstore, at, intent, None, plan=ShardPlan(at.layout, region),
                        strategy="direct", resume=True, options=o.settings)  # fmt: skip
    write = replace(write, append=_named(axis), adopt_done=False)
    ex = _enter(target, write, o, sstore.store)
    try:
        session = ex.pipe.sessions[0]
        assert session.marker is not None
        _drop_duplicates(sstore, session.marker.id, marker_name(region))
        _drop_marker_temps(sstore)
        if not target.forks:  # a session holds no seal past its shape (its transaction)
            _drop_past(sstore, info, axis, length)
        tail = None
        if length > first:
            import zarr

            arr = zarr.open_array(sstore.store, path=sstore.path, mode="r")
            tail = np.asarray(arr[_rows(lay.shape, axis, first, length)])
    except BaseException as e:
        ex.__exit__(type(e), e, e.__traceback__)
        raise
    return Opened(ex, write, meta, axis, length, tail, found is not None)


def rewind(s: Any, m: int) -> None:
    """Take the resumed stream ``s`` (a :class:`~shardwise.write.streams.Stream`) back to
    ``m`` frames, fewer than it stored: its shape cut back to ``m`` (what readers see), the
    next frame appended is frame ``m``, the frames of its shard-row before it read back into
    the buffer, its write grown back over that shard-row, which is written again over the
    stored one as a flushed one is (the stored chunks kept in place for a reader of the
    longer shape)."""
    meta = s._o.meta
    meta["shape"][s.axis] = m
    s._o.write.store.put("zarr.json", json.dumps(meta, indent=2).encode())
    start = m // s.step * s.step
    s.frames = s.stored = m
    s._row, s._fill = m // s.step, m - start
    s._flushed = s._fill
    s._start = min(s._start, start)
    if s._fill:
        import zarr

        w = s._o.write.store
        arr = zarr.open_array(w.store, path=w.path, mode="r")
        s._buf[s._at(0, s._fill)] = np.asarray(arr[s._at(start, m)])


def _metadata(sstore: ShardStore) -> dict[str, Any]:
    raw = retry_transient(lambda: sstore.get("zarr.json"))
    assert raw is not None
    return dict(json.loads(raw))


def _exists(sstore: ShardStore) -> bool:
    return retry_transient(lambda: sstore.get("zarr.json")) is not None


def _check_same(info: ArrayInfo, probe: ArrayInfo, axis: int, where: str) -> None:
    """The stored array must be this stream's: frames, dtype, chunks and shards."""
    have, want = info.layout, probe.layout
    problems = []
    if len(have.shape) != len(want.shape):
        problems.append(f"{len(have.shape)} dimensions, not {len(want.shape)}")
    else:
        frame = [n for i, n in enumerate(have.shape) if i != axis]
        if frame != [n for i, n in enumerate(want.shape) if i != axis]:
            problems.append(f"shape {have.shape} (frames of another shape)")
        if (have.shard_shape, have.chunk_shape) != (want.shard_shape, want.chunk_shape):
            problems.append(f"shards/chunks {have.shard_shape}/{have.chunk_shape}")
    if info.dtype != probe.dtype:
        problems.append(f"dtype {info.dtype}")
    if problems:
        raise PlanError(
            f"{where} is not this stream's array ({'; '.join(problems)}; the stream asks for "
            f"shape {want.shape} with the append axis {axis}, dtype {probe.dtype}, shards/chunks "
            f"{want.shard_shape}/{want.chunk_shape}). Nothing was written"
        )


def _open_marker(sstore: ShardStore, axis: int) -> WriteMarker | None:
    """The open marker of a stream along ``axis`` (of two of one write, left by a kill
    between the puts of a resize, the larger)."""
    found = [
        m
        for m in read_markers(sstore).values()
        if m is not None
        and m.status == "open"
        and (m.append or {}).get("call") == STREAM
        and int((m.append or {}).get("axis", -1)) == axis
    ]
    return max(found, key=lambda m: m.region[axis][1], default=None)


def _drop_duplicates(sstore: ShardStore, write_id: str, kept: str) -> None:
    for name, m in read_markers(sstore).items():
        if m is not None and m.id == write_id and name != kept:
            sstore.delete(name)


def _drop_marker_temps(sstore: ShardStore) -> None:
    """Temp files of marker puts a kill interrupted (a resize's new marker): under the
    exclusive lease no other write puts markers here."""
    for name in sstore.list(WRITES):
        if temp_target(name) is not None:
            sstore.delete(name)


def _drop_past(sstore: ShardStore, info: ArrayInfo, axis: int, length: int) -> None:
    """Shards (and their records) at shard-rows past ``length``: a seal killed after its puts,
    before the shape grew. No reader saw them; the stream writes those rows again."""
    lay = info.layout
    stop = -(-length // lay.shard_shape[axis])  # the first shard-row not (partly) inside
    # the grid as long as any stream makes it: every shard key past the length parses
    wide = replace(lay, shape=tuple(1 << 62 if i == axis else n for i, n in enumerate(lay.shape)))

    def past(name: str) -> bool:
        coord = None if name.startswith(JOURNAL + "/") else wide.parse_shard_key(name)
        return coord is not None and coord[axis] >= stop

    for name in sstore.list(""):
        if past(name):
            sstore.delete(name)
            sstore.delete(RECORDS + name)
    cut_run_records(sstore, past)  # a flush's rows recorded together (write/stream_rows.py)


def _named(axis: int) -> dict[str, Any]:
    return {"call": STREAM, "axis": axis}


def _rows(shape: tuple[int, ...], axis: int, start: int, stop: int) -> Region:
    return tuple(slice(start, stop) if i == axis else slice(0, n) for i, n in enumerate(shape))


def _sized(info: ArrayInfo, axis: int, n: int) -> ArrayInfo:
    """``info`` of the array at length ``n`` along ``axis``."""
    shape = tuple(n if i == axis else s for i, s in enumerate(info.layout.shape))
    return replace(info, layout=replace(info.layout, shape=shape))
