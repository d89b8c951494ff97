"""Pictures of shards: which rectangles to draw, in which state, for a write plan or a stored array.

Pure geometry and nothing else: a :class:`Picture` is rectangles (shards, each in a state that
names its colour), the dask block edges, the outline of the region a write covers and captions, in
pixels. ``core/svg.py`` writes it as SVG (notebooks, no dependency), ``cli/plot.py`` as PNG
(matplotlib).

Every axis is drawn to scale up to a ratio of about 3, then logarithmically (dask's rule), so a
long thin array stays visible. 1-D arrays are one row of shards; 2-D arrays the shard grid with
axis 0 down and axis 1 across; an N-D array (N > 2) is one panel per shard of the leading axes,
each a 2-D view of the last two axes.

Big grids stay small: one picture holds at most :data:`MAX_CELLS` rectangles (about 1,000) and
:data:`MAX_PANELS` panels. When an axis has more shards than fit, each drawn cell stands for a
block of shards (the caption says how many) and takes their common state; a cell of shards in
different states takes the most telling one (a missing or merged shard shows; stored beside empty
is ``mixed``), and its tooltip counts them. Owner labels (``T<n>``: the shard task that writes the
shard, numbered in C order over the tasks) are drawn on single-shard cells large enough to hold
one. Block edges are drawn up to :data:`MAX_LINES` per axis, evenly chosen beyond that.

>>> from shardwise.core.layout import Layout
>>> from shardwise.core.plan import ShardPlan
>>> plan = ShardPlan(Layout((100, 100), (50, 50), (10, 10)), (slice(0, 100), slice(0, 70)))
>>> pic = plan_picture(plan, "direct", ((50, 50), (35, 35)), ["a caption"])
>>> [(r.state, r.label) for r in pic.rects]  # doctest: +NORMALIZE_WHITESPACE
[('direct', 'T0'), ('direct-merge', 'T1'), ('direct', 'T2'), ('direct-merge', 'T3')]
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .layout import Coord, Layout, Region
from .plan import ShardPlan

# state -> fill colour; the state is also the SVG class of the rectangle
COLOURS = {
    "direct": "#9ecae1",  # written whole by its direct shard task
    "direct-merge": "#3182bd",  # a direct shard task merges it with what is stored
    "staged": "#fdd0a2",  # written whole by its staged shard task
    "staged-merge": "#e6550d",  # a staged shard task merges it with what is stored
    "outside": "#f0f0f0",  # not written by this plan
    "stored": "#74c476",  # a shard object is stored
    "empty": "#f0f0f0",  # nothing stored, nothing recorded: reads as the fill value
    "missing": "#de2d26",  # recorded by a write but gone: reads as fill, verify reports it
    "mixed": "#c7e9c0",  # a cell of several shards, some stored, some empty
}
MEANING = {
    "direct": "written (direct)",
    "direct-merge": "merged with stored data (direct)",
    "staged": "written (staged)",
    "staged-merge": "merged with stored data (staged)",
    "outside": "not written",
    "stored": "stored",
    "empty": "empty (reads as fill)",
    "missing": "missing (recorded, gone)",
    "mixed": "some stored, some empty",
}
MAX_CELLS = 1024  # rectangles per picture, over all panels
MAX_PANELS = 12  # panels of an N-D picture (leading axes grouped beyond that)
MAX_LINES = 64  # block edges drawn per axis
MAX_LABELS = 400  # owner labels per picture
SIDE = 240  # pixels of a panel's longer side (one panel; 160 for several)
THIN = 24  # pixels of a 1-D array's height
MARGIN = 10
LINE_HEIGHT = 15

Ranges = tuple[range, ...]  # the shards of one cell, per axis
StateOf = Callable[[Ranges], tuple[str, str]]  # a cell -> (state, tooltip)


@dataclass(frozen=True)
class Rect:
    """One cell: a shard (or a block of shards) in a state; ``label`` names its owner task."""

    x: float
    y: float
    w: float
    h: float
    state: str
    label: str = ""
    title: str = ""


@dataclass(frozen=True)
class Line:
    x1: float
    y1: float
    x2: float
    y2: float


@dataclass(frozen=True)
class Text:
    x: float
    y: float
    text: str
    size: float = 11.0
    anchor: str = "start"  # start | middle


@dataclass(frozen=True)
class Picture:
    """What to draw, in pixels (y down). ``kind``: direct, staged (a plan) or stored."""

    width: int
    height: int
    kind: str
    rects: tuple[Rect, ...]
    lines: tuple[Line, ...]
    outlines: tuple[Rect, ...]
    texts: tuple[Text, ...]
    legend: tuple[str, ...]


def legend_x(legend: Sequence[str]) -> list[float]:
    """Where each legend entry (a 12-pixel key, then its meaning) starts, and where the last
    ends: the SVG and PNG writers place them alike."""
    return list(itertools.accumulate((34 + 6.2 * len(MEANING[s]) for s in legend), initial=10.0))


def ratio_response(x: float) -> float:
    """How a ratio of sizes is drawn: exact up to e, then logarithmic, capped (dask's rule)."""
    return x if x < math.e else math.log(min(x, 100.0) + 12.4)


def draw_sizes(shape: Sequence[int], side: float) -> tuple[float, ...]:
    """Pixels per axis: the longest axis gets ``side``, the others their ratio's response."""
    mx = max(max(shape), 1)
    return tuple(max(side / ratio_response(mx / max(n, 0.1)), 8.0) for n in shape)


@dataclass(frozen=True)
class _Axis:
    """One drawn axis: ``size`` elements in shards of ``shard`` (a rectilinear axis: shards
    from ``edges``, where each starts and the last ends), cells of ``group`` shards."""

    size: int
    shard: int
    group: int
    pixels: float
    edges: tuple[int, ...] | None = None

    @property
    def nshards(self) -> int:
        e = self.edges
        n = -(-self.size // self.shard) if e is None else bisect.bisect_left(e, self.size)
        return max(1, n)

    def bound(self, i: int) -> int:
        """Where shard ``i`` starts (unclipped)."""
        return i * self.shard if self.edges is None else self.edges[min(i, len(self.edges) - 1)]

    @property
    def ncells(self) -> int:
        return -(-self.nshards // self.group)

    def cell(self, i: int) -> range:
        return range(i * self.group, min((i + 1) * self.group, self.nshards))

    def px(self, element: float) -> float:
        """The pixel offset of an element position."""
        return element * self.pixels / max(self.size, 1)

    def span(self, cells: range) -> tuple[float, float]:
        """(offset, length) in pixels of a range of shards."""
        lo = self.px(self.bound(cells.start))
        return lo, self.px(min(self.bound(cells.stop), self.size)) - lo


def _group(n: int, cap: int) -> int:
    """Shards per cell so that ``n`` shards make at most ``cap`` cells."""
    return max(1, -(-n // max(cap, 1)))


def _lead_groups(grid: Sequence[int]) -> list[int]:
    """Shards per panel along each leading axis: at most MAX_PANELS panels in all (the axis with
    the most panels is halved first)."""
    cells = list(grid)
    groups = [1] * len(grid)
    while math.prod(cells) > MAX_PANELS:
        i = max(range(len(cells)), key=cells.__getitem__)
        groups[i] = _group(grid[i], max(1, cells[i] // 2))
        cells[i] = -(-grid[i] // groups[i])
    return groups


def _axes(layout: Layout) -> tuple[list[_Axis], list[_Axis], int]:
    """(leading axes, [y axis, x axis], panel side) of a layout of any number of dimensions."""
    shape, shard = list(layout.shape), list(layout.shard_shape)
    edges: list[tuple[int, ...] | None] = [layout.axis_edges(d) for d in range(layout.ndim)]
    while len(shape) < 2:  # 0-d: one shard; 1-D: one row of shards
        shape.insert(0, 1)
        shard.insert(0, 1)
        edges.insert(0, None)
    axes = list(zip(shape, shard, edges, strict=True))
    lead = [_Axis(n, s, 1, 0.0, e).nshards for n, s, e in axes[:-2]]
    lgroups = _lead_groups(lead)
    panels = math.prod(-(-n // g) for n, g in zip(lead, lgroups, strict=True))
    side = SIDE if panels == 1 else 160
    cap = max(2, math.isqrt(MAX_CELLS // panels))
    sizes = draw_sizes(shape[-2:], side) if layout.ndim >= 2 else (THIN, side)
    drawn = []
    for (n, s, e), px in zip(axes[-2:], sizes, strict=True):
        drawn.append(_Axis(n, s, _group(_Axis(n, s, 1, 0.0, e).nshards, cap), px, e))
    leading = [_Axis(n, s, g, 0.0, e) for (n, s, e), g in zip(axes[:-2], lgroups, strict=True)]
    return leading, drawn, side


def _rng(r: range) -> str:
    return str(r.start) if len(r) == 1 else f"{r.start}-{r.stop - 1}"


@dataclass(frozen=True)
class _Frame:
    """Where one panel goes and which leading shards it shows."""

    x: float
    y: float
    lead: Ranges


def _frames(leading: list[_Axis], drawn: list[_Axis]) -> tuple[list[_Frame], float, float]:
    """The panels, laid out in rows of up to 4, and the size of the area they take."""
    cells = [range(a.ncells) for a in leading]
    combos = list(itertools.product(*cells))
    title = LINE_HEIGHT if leading else 0
    w, h = drawn[1].pixels + 50, drawn[0].pixels + title + 20
    cols = min(len(combos), 4)
    frames = [
        _Frame(
            MARGIN + (k % cols) * w,
            MARGIN + (k // cols) * h + title,
            tuple(a.cell(i) for a, i in zip(leading, combo, strict=True)),
        )
        for k, combo in enumerate(combos)
    ]
    return frames, cols * w, -(-len(combos) // cols) * h


def _own[T](items: Sequence[T], ndim: int) -> tuple[T, ...]:
    """The last ``ndim`` items: the array's own axes, without those a 0-d or 1-D picture adds."""
    return tuple(items[len(items) - ndim :])


def _cells(
    frame: _Frame,
    drawn: list[_Axis],
    ndim: int,
    state_of: StateOf,
    label_of: Callable[[Coord], str],
) -> list[Rect]:
    ya, xa = drawn
    lone = ya.group == 1 and xa.group == 1 and all(len(r) == 1 for r in frame.lead)
    out = []
    for i, j in itertools.product(range(ya.ncells), range(xa.ncells)):
        rows, cols = ya.cell(i), xa.cell(j)
        y0, h = ya.span(rows)
        x0, w = xa.span(cols)
        ranges = _own((*frame.lead, rows, cols), ndim)
        state, title = state_of(ranges)
        label = ""
        if lone and w >= 18 and h >= 11:
            label = label_of(tuple(r.start for r in ranges))
        out.append(Rect(frame.x + x0, frame.y + y0, w, h, state, label, title))
    return out


def _texts(frame: _Frame, drawn: list[_Axis], ndim: int) -> list[Text]:
    ya, xa = drawn
    out = [
        Text(frame.x + xa.pixels / 2, frame.y + ya.pixels + 13, str(xa.size), 10, "middle"),
    ]
    if ndim >= 2:
        out.append(Text(frame.x + xa.pixels + 4, frame.y + ya.pixels / 2 + 4, str(ya.size), 10))
    if frame.lead:
        head = ", ".join([*map(_rng, frame.lead), ":", ":"])
        out.append(Text(frame.x, frame.y - 4, f"shards [{head}]", 10))
    return out


def draw(
    layout: Layout,
    kind: str,
    state_of: StateOf,
    label_of: Callable[[Coord], str],
    caption: Sequence[str],
    region: Region | None = None,
    blocks: Sequence[Sequence[int]] | None = None,
) -> Picture:
    """The picture of ``layout``'s shard grid, each cell in ``state_of`` its shards; the outline
    of ``region`` and the edges of ``blocks`` (chunk sizes from the region's start) on top."""
    leading, drawn, _ = _axes(layout)
    frames, w, h = _frames(leading, drawn)
    rects: list[Rect] = []
    texts: list[Text] = []
    outlines: list[Rect] = []
    lines: list[Line] = []
    for frame in frames:
        rects += _cells(frame, drawn, layout.ndim, state_of, label_of)
        texts += _texts(frame, drawn, layout.ndim)
        if region is not None and _meets(frame, leading, region):
            box, edges = _region_marks(frame, drawn, layout.ndim, region, blocks)
            outlines.append(box)
            lines += edges
    if sum(bool(r.label) for r in rects) > MAX_LABELS:
        rects = [Rect(r.x, r.y, r.w, r.h, r.state, "", r.title) for r in rects]
    notes = list(caption)
    if any(a.group > 1 for a in (*leading, *drawn)):
        per = " x ".join(str(a.group) for a in _own((*leading, *drawn), layout.ndim)) or "1"
        notes.append(f"each cell: up to {per} shards (grid too large to draw one by one)")
    legend = tuple(dict.fromkeys(r.state for r in rects))
    y = MARGIN + h + 4
    for k, note in enumerate(notes):
        texts.append(Text(MARGIN, y + LINE_HEIGHT * (k + 1) - 3, note))
    y += LINE_HEIGHT * len(notes) + 4
    text = 6.2 * max(map(len, notes), default=0)
    width = int(max(w, text, legend_x(legend)[-1]) + 2 * MARGIN)
    height = int(y + (LINE_HEIGHT + 4 if legend else 0) + MARGIN)
    return Picture(
        width, height, kind, tuple(rects), tuple(lines), tuple(outlines), tuple(texts), legend
    )


def _meets(frame: _Frame, leading: list[_Axis], region: Region) -> bool:
    """True when the panel's leading shards meet the region."""
    for r, a, sl in zip(frame.lead, leading, region, strict=False):
        if a.bound(r.stop) <= sl.start or a.bound(r.start) >= sl.stop:
            return False
    return True


def _region_marks(
    frame: _Frame,
    drawn: list[_Axis],
    ndim: int,
    region: Region,
    blocks: Sequence[Sequence[int]] | None,
) -> tuple[Rect, list[Line]]:
    """The outline of the region in one panel and its block edges (at most MAX_LINES per axis)."""
    full = [slice(0, 1)] * (2 - ndim) + list(region)[-2:]
    (ys, xs), (ya, xa) = full[-2:], drawn
    y0, y1 = frame.y + ya.px(ys.start), frame.y + ya.px(ys.stop)
    x0, x1 = frame.x + xa.px(xs.start), frame.x + xa.px(xs.stop)
    box = Rect(x0, y0, x1 - x0, y1 - y0, "region")
    lines: list[Line] = []
    if blocks is None or not blocks:
        return box, lines
    sides = [()] * (2 - ndim) + [tuple(b) for b in blocks][-2:]
    for axis, sl, chunks in zip(drawn, full[-2:], sides, strict=True):
        inner = list(itertools.accumulate(chunks, initial=sl.start))[1:-1]
        if len(inner) > MAX_LINES:
            inner = [inner[round(k * (len(inner) - 1) / (MAX_LINES - 1))] for k in range(MAX_LINES)]
        for e in inner:
            p = axis.px(e)
            if axis is xa:
                lines.append(Line(frame.x + p, y0, frame.x + p, y1))
            else:
                lines.append(Line(x0, frame.y + p, x1, frame.y + p))
    return box, lines


# -- the two pictures -----------------------------------------------------------------------------


def _counts(cells: range, sl: slice, lay: Layout, d: int) -> tuple[int, int]:
    """(shards the region covers whole, shards it meets) among ``cells`` along axis ``d``."""
    whole = meet = 0
    # only the two shards at the region's edges can be met in part: count the rest at once
    span = lay.axis_span(d, sl.start, sl.stop)
    lo, hi = max(cells.start, span.start), min(cells.stop, span.stop)
    if hi <= lo:
        return 0, 0
    meet = hi - lo
    whole = meet
    for i in {lo, hi - 1}:
        a, b = lay.axis_bound(d, i), min(lay.axis_bound(d, i + 1), lay.shape[d])
        if not (sl.start <= a and b <= sl.stop):
            whole -= 1
    return whole, meet


def plan_picture(
    plan: ShardPlan, strategy: str, blocks: Sequence[Sequence[int]] | None, caption: Sequence[str]
) -> Picture:
    """The picture of a write plan: every shard written whole, merged or not written, with the
    task that owns it, the region's outline and the dask ``blocks`` over it."""
    lay, region = plan.layout, plan.region
    task_grid = [len(c) for c in plan.task_chunks]
    first = plan.first_shard

    def state_of(ranges: Ranges) -> tuple[str, str]:
        per = [_counts(r, sl, lay, d) for d, (r, sl) in enumerate(zip(ranges, region, strict=True))]
        total = math.prod(map(len, ranges))
        whole, meet = math.prod(p[0] for p in per), math.prod(p[1] for p in per)
        state = "outside" if meet == 0 else strategy if meet == whole else f"{strategy}-merge"
        where = ", ".join(map(_rng, ranges))
        return state, (
            f"shards [{where}]: {whole} written whole, {meet - whole} merged, "
            f"{total - meet} not written"
        )

    def label_of(coord: Coord) -> str:
        task = [c - f for c, f in zip(coord, first, strict=True)]
        if any(not 0 <= t < n for t, n in zip(task, task_grid, strict=True)):
            return ""
        return f"T{_c_order(task, task_grid)}"

    return draw(lay, strategy, state_of, label_of, caption, region, blocks)


def _c_order(index: Sequence[int], grid: Sequence[int]) -> int:
    return sum(i * math.prod(grid[k + 1 :]) for k, i in enumerate(index))


def stored_picture(
    layout: Layout, stored: Iterable[Coord], missing: Iterable[Coord], caption: Sequence[str]
) -> Picture:
    """The picture of a stored array: every shard stored, empty (nothing stored or recorded: it
    reads as the fill value) or missing (recorded by a write, gone)."""
    leading, drawn, _ = _axes(layout)
    axes = _own([*leading, *drawn], layout.ndim)
    counts: dict[tuple[Coord, str], int] = {}
    for name, coords in (("stored", stored), ("missing", missing)):
        for c in coords:
            cell = tuple(i // a.group for i, a in zip(c, axes, strict=True))
            counts[cell, name] = counts.get((cell, name), 0) + 1

    def state_of(ranges: Ranges) -> tuple[str, str]:
        cell = tuple(r.start // a.group for r, a in zip(ranges, axes, strict=True))
        total = math.prod(map(len, ranges))
        have, gone = counts.get((cell, "stored"), 0), counts.get((cell, "missing"), 0)
        if gone:
            state = "missing"
        elif have == total:
            state = "stored"
        else:
            state = "empty" if have == 0 else "mixed"
        where = ", ".join(map(_rng, ranges))
        return (
            state,
            f"shards [{where}]: {have} stored, {gone} missing, {total - have - gone} empty",
        )

    return draw(layout, "stored", state_of, lambda _: "", caption)
