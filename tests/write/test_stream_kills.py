"""``shardwise.stream`` and ``shardwise.stream_pyramid`` SIGKILLed at points hypothesis draws,
then resumed with ``resume=True``.

Hypothesis draws the frames, the batches they are appended in (some followed by a flush) and
the kill point. A point is reached in the child's own program order, never by time: after
frame ``k`` (the appender kills itself), or at the ``n``-th object a level puts (its shards,
their records, its write marker, its ``zarr.json``: the shape commit), before the put, torn
(its temp file written, not renamed) or after it; so inside a seal, between the shards of a
shard-row, before and after the shape grows, inside the top level's seal. "Paced" children
wait for each seal (the order of every put fixed), the others let the seals run behind the
appender. Each child is forked from a server that imported shardwise once.

The child reports, as it dies, the frames it appended and each level's last shape commit (the
frames readers saw). Before the resume readers see exactly those frames; the resume reports at
least them (exactly them when paced), losing at most the unsealed shard-rows; the rest is
appended, and the array (every level) equals numpy, ``verify`` finds nothing, zarr-python
reads it.

A pyramid stream closed on a partial group is resumed in a child that is killed inside that
resume, which rewinds (the levels above cut back to whole groups, their partial shard-row written
again over the stored one): readers see each level's last shape commit, a second resume
finishes it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import zarr
from hypothesis import event, given, settings
from hypothesis import strategies as st

import shardwise
from streamkit import PHASES, PYRAMID, STEP, STREAM, frames, told
from streamkit import kill as killed_at


@st.composite
def runs(draw: Any, most: int, levels: tuple[str, ...]) -> dict[str, Any]:
    """Frames, batches (each maybe flushed after), pacing and the kill point: after a frame,
    or at the ``j``-th put of a kind by a level."""
    n = draw(st.integers(1, most))
    batches: list[tuple[int, bool]] = []
    while sum(b for b, _ in batches) < n:
        size = draw(st.integers(1, min(7, n - sum(b for b, _ in batches))))
        batches.append((size, draw(st.booleans())))
    if draw(st.sampled_from(["put", "put", "frame"])) == "frame":
        kill: tuple[Any, ...] = ("frame", draw(st.integers(0, n)))
    else:
        what = draw(st.sampled_from(["shard", "shape", "record", "marker"]))
        level = draw(st.sampled_from(levels))
        rows = -(-n // (STEP << int(level or 0)))  # the level's shard-rows, about
        j = draw(st.integers(1, 2 * rows))
        kill = ("put", level, what, j, draw(st.sampled_from(PHASES)))
    return dict(n=n, batches=batches, kill=kill, paced=draw(st.booleans()))


def lost_at_most(run: dict[str, Any]) -> int:
    """Frames appended but not stored a kill may lose: the open shard-row, and when the seals
    run behind, the sealed one being written (``pending=1``)."""
    return STEP if run["paced"] else 2 * STEP


# -- the tests ---------------------------------------------------------------------------------


@settings(max_examples=25)
@given(runs(most=22, levels=("",)))
def test_a_stream_killed_at_a_drawn_point_resumes_losing_nothing_sealed(
    fresh_dir: Any, run: dict[str, Any]
) -> None:
    root = str(fresh_dir("killed") / "a.zarr")
    where, committed, appended = killed_at(root, run, pyramid=False)
    event(where.split(":")[0])  # the point reached (--hypothesis-show-statistics)
    x = frames(run["n"], (6, 5))
    seen = committed.get("", 0)
    if os.path.exists(f"{root}/zarr.json"):  # readers see the frames committed, whole
        got = np.asarray(zarr.open_array(root, mode="r")[...])
        assert len(got) >= seen
        np.testing.assert_array_equal(got, x[: len(got)])
    with shardwise.stream(root, resume=True, **STREAM) as s:
        kept = s.resumed_from
        assert kept >= seen, (where, kept, committed)  # nothing sealed lost
        assert kept == seen or not run["paced"], (where, kept, committed)
        assert appended - kept <= lost_at_most(run), (where, kept, appended)
        np.testing.assert_array_equal(zarr.open_array(root, mode="r")[...], x[:kept])
        s.extend(x[kept:])
    np.testing.assert_array_equal(zarr.open_array(root, mode="r")[...], x)
    report = shardwise.verify(root)
    assert report.ok, (where, report.problems)


def oracle(x: np.ndarray) -> list[np.ndarray]:
    from test_stream_pyramid import oracle as reduced

    return reduced(x, (2, 2, 2), 3, "mean")


def every_level_done(root: str, want: list[np.ndarray], where: Any) -> None:
    """Every level of the finished pyramid equal to ``want`` and ``verify`` clean."""
    for k in range(3):
        got = np.asarray(zarr.open_array(root, path=str(k), mode="r")[...])
        np.testing.assert_array_equal(got, want[k], err_msg=f"level {k} ({where})")
        report = shardwise.verify(f"{root}/{k}")
        assert report.ok, (where, k, report.problems)


@settings(max_examples=20)
@given(runs(most=18, levels=("0", "1", "2")))
def test_a_pyramid_stream_killed_at_a_drawn_point_resumes_with_every_level(
    fresh_dir: Any, run: dict[str, Any]
) -> None:
    """The same over a 3-level pyramid; the put counted is of the drawn level (``"2"``: inside
    the top level's seals). Every level keeps what it committed and is consistent with level
    0 before and after the resume; at close each equals the block means of every frame."""
    root = str(fresh_dir("killed") / "img.zarr")
    where, committed, appended = killed_at(root, run, pyramid=True)
    event(where.split(":")[0])
    x = frames(run["n"], (12, 10))
    want = oracle(x)
    with shardwise.stream_pyramid(root, resume=True, **PYRAMID) as s:
        kept = s.resumed_from
        seen = [committed.get(str(k), 0) for k in range(3)]
        assert all(a >= b for a, b in zip(s.stored, seen, strict=True)), (where, s.stored, seen)
        assert kept == seen[0] or not run["paced"], (where, kept, committed)
        assert appended - kept <= lost_at_most(run), (where, kept, appended)
        for k in range(3):  # every level consistent with level 0 as resumed
            got = np.asarray(zarr.open_array(root, path=str(k), mode="r")[...])
            np.testing.assert_array_equal(got, want[k][: len(got)])
        s.extend(x[kept:])
    every_level_done(root, want, where)


# -- a kill inside a resume that rewinds -------------------------------------------------------


def kept_levels(start: int, old: list[np.ndarray]) -> list[int]:
    """The frames each level keeps when a pyramid stream closed after ``start`` frames (levels
    ``old``) resumes: those reduced from whole groups of the frames the level below keeps."""
    kept = [start]
    for k in range(1, len(old)):
        kept.append(min(len(old[k]), kept[k - 1] // 2))
    return kept


@st.composite
def rewinds(draw: Any) -> dict[str, Any]:
    """Frames closed on a partial group (``start``, no multiple of 4: a level above rewinds),
    the batches a resume appends (each maybe flushed after) and the rest, and the kill point
    inside that resume: the ``j``-th put of a kind by a level, the levels it rewinds likelier
    (their shape cut is shape put 1, the shard-row written again over the stored one next)."""
    start = draw(st.integers(1, 11).filter(lambda n: n % 4 != 0))
    more = draw(st.integers(0, 8))
    batches: list[tuple[int, bool]] = []
    while sum(b for b, _ in batches) < more:
        size = draw(st.integers(1, min(5, more - sum(b for b, _ in batches))))
        batches.append((size, draw(st.booleans())))
    n = start + more + draw(st.integers(0, 4))
    what = draw(st.sampled_from(["shape", "shape", "shard", "record", "marker"]))
    level = draw(st.sampled_from(["1", "2", "1", "2", "0"]))
    kill = ("put", level, what, draw(st.integers(1, 3)), draw(st.sampled_from(PHASES)))
    return dict(n=n, start=start, resume=True, batches=batches, kill=kill,
                paced=draw(st.booleans()))  # fmt: skip


@settings(max_examples=15)
@given(rewinds())
def test_a_pyramid_stream_killed_inside_a_rewinding_resume_resumes_again(
    fresh_dir: Any, run: dict[str, Any]
) -> None:
    """A pyramid stream closed on a partial group, then resumed in a child (the levels above
    cut back to whole groups, their partial shard-row written again) that is killed at a drawn
    put: each level's cut is its first shape commit, readers see exactly each level's last
    commit (the closed stream's frames where the kill left a level uncut), and a second resume
    keeps at least that and finishes every level equal to numpy, verified clean."""
    root = str(fresh_dir("rewound") / "img.zarr")
    x, start = frames(run["n"], (12, 10)), run["start"]
    with shardwise.stream_pyramid(root, **PYRAMID) as s:
        s.extend(x[:start])
    old, want = oracle(x[:start]), oracle(x)
    kept = kept_levels(start, old)
    rewound = [k for k in range(3) if kept[k] < len(old[k])]
    assert rewound, (start, kept)  # the resume has a level to take back
    where, committed, appended, seen = told(root, run, pyramid=True)
    event(where.split(":")[0])
    shapes = seen["shapes"]
    for k in rewound:  # the rewind's cut comes first, to the whole groups
        assert shapes.get(str(k), [kept[k]])[0] == kept[k], (where, k, shapes, kept)
    if seen["opened"] is not None:  # the resume opened: it rewound every level
        assert seen["opened"] == kept, (where, seen["opened"], kept)
        assert all(str(k) in shapes for k in rewound), (where, shapes)
    for k in range(3):  # readers see each level's last commit: the closed one where uncut
        got = np.asarray(zarr.open_array(root, path=str(k), mode="r")[...])
        source = want if str(k) in committed else old
        assert len(got) == committed.get(str(k), len(old[k])), (where, k, len(got), committed)
        np.testing.assert_array_equal(got, source[k][: len(got)], err_msg=f"{k} ({where})")
    floor = [committed.get(str(k), kept[k]) for k in range(3)]
    with shardwise.stream_pyramid(root, resume=True, **PYRAMID) as s:
        again = s.resumed_from
        assert all(a >= b for a, b in zip(s.stored, floor, strict=True)), (where, s.stored, floor)
        if seen["opened"] is not None:
            assert appended - again <= lost_at_most(run), (where, again, appended)
        for k in range(3):
            got = np.asarray(zarr.open_array(root, path=str(k), mode="r")[...])
            np.testing.assert_array_equal(got, want[k][: len(got)], err_msg=f"{k} ({where})")
        s.extend(x[again:])
    every_level_done(root, want, where)
