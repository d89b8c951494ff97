"""How a pyramid stream (``streams.py``) goes on after ``resume=True``: every level's stream
resumed, then each level set back to the frames it can keep and fed what the level above has
not taken.

A level keeps the frames reduced from whole groups of frames the level below keeps; a frame
reduced from a partial group (the last one of a stream closed on an unbounded space axis, by
the ceil rule) is taken back (:func:`~shardwise.write.stream_open.rewind`: the level's shape
cut back, so readers see every level consistent with the one below again), reduced again when
its group fills (or the stream closes again) and written over the stored one. The frames of
each level the level above has not taken (its unfinished group, or the tail the level above
lost to a kill) are read back and fed on: the upper levels are made again from stored frames,
never from frames the stream no longer has.

A stream that reached its known length keeps every level as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..write.stream_open import rewind


def resume_levels(p: Any, zstore: Any, prefix: str) -> None:
    """Set the resumed levels of the :class:`~shardwise.pyramid.streams.StreamPyramid` ``p``
    back to what they keep and feed on their frames the level above has not taken (nothing to
    do for new levels)."""
    import zarr

    got = [s.resumed_from for s in p.levels]
    if not any(got):
        return
    done = p.length is not None and got[0] == p.length
    kept = [got[0]]
    for k in range(len(p.levels) - 1):
        f = p.steps[k][p.axis]
        keep = got[k + 1] if done else min(got[k + 1], kept[k] // f)
        if keep < got[k + 1]:  # frames of a partial group: reduced again once it fills
            rewind(p.levels[k + 1], keep)
        kept.append(keep)
        start = min(keep * f, kept[k])
        p._consumed[k] = start
        if start < kept[k]:
            arr = zarr.open_array(zstore, path=f"{prefix}{k}", mode="r")
            p._pending[k] = [np.asarray(arr[p._at(start, kept[k])])]
    for k in range(len(p.levels) - 1):
        p._feed(k, p._empty(k, 0), now=True)
    p._release()
