"""Pictures of plans and stored arrays (core/picture.py, core/svg.py, WritePlan._repr_html_): the
SVG parses, holds one rectangle per shard in the state the plan or the store gives it (checked
against ShardPlan.covers and the region, not against the drawing code), owner labels sit on their
shards, and big grids are drawn in a bounded number of cells that still account for every
shard."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET

import dask.array as da
import numpy as np
import pytest

import shardwise
from shardwise.core.job import make_job
from shardwise.core.layout import Layout
from shardwise.core.picture import COLOURS, MAX_CELLS, MAX_PANELS, plan_picture, stored_picture
from shardwise.core.plan import ShardPlan
from shardwise.core.svg import Drawing, to_svg

SVG = "{http://www.w3.org/2000/svg}"


def shards_of(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [e for e in root.iter(f"{SVG}rect") if e.get("class", "").startswith("shard ")]


def state(rect: ET.Element) -> str:
    return rect.get("class", "").split()[1]


def box(rect: ET.Element) -> tuple[float, float, float, float]:
    return tuple(float(rect.get(k, "nan")) for k in ("x", "y", "width", "height"))  # type: ignore[return-value]


def expected_plan_state(plan: ShardPlan, coord: tuple[int, ...], strategy: str) -> str:
    """A shard's state from the plan itself: outside the region, covered whole or merged."""
    lay = plan.layout
    meets = all(
        i * s < sl.stop and sl.start < min((i + 1) * s, n)
        for i, s, n, sl in zip(coord, lay.shard_shape, lay.shape, plan.region, strict=True)
    )
    if not meets:
        return "outside"
    return strategy if plan.covers(coord) else f"{strategy}-merge"


@pytest.mark.parametrize("strategy", ["direct", "staged"])
def test_plan_svg_has_one_rect_per_shard_in_its_state_with_its_owner(strategy: str) -> None:
    lay = Layout((100, 90), (20, 30), (10, 10))
    plan = ShardPlan(lay, (slice(10, 100), slice(30, 75)))  # edges split shards
    job = make_job(plan, ((45, 45), (20, 25)), 4, strategy=strategy, memory_limit=2**30)
    assert job.strategy == strategy
    blocks = job.blocks if strategy == "staged" else job.source_chunks
    svg = to_svg(plan_picture(plan, strategy, blocks, ["caption"]))
    root = ET.fromstring(svg)
    assert root.get("class") == f"shardwise {strategy}"
    rects = shards_of(svg)
    assert len(rects) == lay.nshards == 15
    grid = list(itertools.product(*map(range, lay.shard_grid)))
    owners: dict[tuple[int, ...], str] = {}
    for k, t in enumerate(itertools.product(*(range(len(c)) for c in plan.task_chunks))):
        owners[plan.shard_of_task(t)] = f"T{k}"
    labels = [
        (float(e.get("x", "nan")), float(e.get("y", "nan")), e.text)
        for e in root.iter(f"{SVG}text")
        if e.get("class") == "owner"
    ]
    assert sorted(t for *_, t in labels) == sorted(owners.values())
    for coord, rect in zip(grid, rects, strict=True):  # drawn in C order
        assert state(rect) == expected_plan_state(plan, coord, strategy)
        assert rect.get("fill") == COLOURS[state(rect)]
        x, y, w, h = box(rect)
        inside = [t for lx, ly, t in labels if x < lx < x + w and y < ly < y + h]
        assert inside == ([owners[coord]] if coord in owners else [])
    states = {state(r) for r in rects}
    assert states == {"outside", strategy, f"{strategy}-merge"}
    # the block edges: every inner edge of the blocks drawn, on each axis
    lines = list(root.iter(f"{SVG}line"))
    assert blocks is not None
    assert len(lines) == sum(len(c) - 1 for c in blocks)
    assert len(root.findall(f"{SVG}rect[@class='region']")) == 1


def test_plan_repr_html_in_a_notebook_shows_the_picture_and_the_printout() -> None:
    x = da.zeros((2048, 4096), chunks=(1000, 3000), dtype="f4")
    plan = shardwise.plan_write(x, "memory://", chunks=(32, 32), shards=(1024, 1024))
    html = plan._repr_html_()
    svg = html[html.index("<svg") : html.index("</svg>") + len("</svg>")]
    assert len(shards_of(svg)) == 8
    assert {state(r) for r in shards_of(svg)} == {plan.strategy}
    ET.fromstring(html)  # the whole HTML fragment is well-formed too
    assert f"tasks: {plan.tasks}" in html and "peak memory per task" in html


@pytest.mark.parametrize(
    ("shards", "said"), [((64, 64), "1 shard task T0;"), ((32, 64), "2 shard tasks T0..T1;")]
)
def test_plan_picture_caption_counts_its_tasks_in_words(shards: tuple[int, int], said: str) -> None:
    """The caption under a plan's picture reads as a sentence: one task is "1 shard task T0"
    (not "1 shard tasks T0..T0"), one staged block task "1 block task"."""
    x = da.zeros((64, 64), chunks=(64, 64), dtype="f4")
    plan = shardwise.plan_write(x, "memory://", chunks=(16, 16), shards=shards, strategy="staged")
    html = plan._repr_html_()
    assert f"staged: {said} thick: the region written" in html, html
    assert "dashed: the 1 block task (staged pieces)" in html and "tasks T0..T0" not in html


def test_stored_picture_1d_is_one_row() -> None:
    lay = Layout((1000,), (100,), (10,))
    svg = to_svg(stored_picture(lay, [(0,), (3,)], [(5,)], []))
    rects = shards_of(svg)
    assert [state(r) for r in rects] == ["stored", "empty", "empty", "stored", "empty"] + [
        "missing"
    ] + ["empty"] * 4
    assert len({box(r)[1] for r in rects}) == 1  # one row
    xs = [box(r)[0] for r in rects]
    assert xs == sorted(xs) and len(set(xs)) == 10


def test_stored_picture_3d_has_a_panel_per_leading_shard() -> None:
    lay = Layout((40, 300, 500), (10, 100, 100), (10, 10, 10))  # grid (4, 3, 5)
    stored = [(0, 0, 0), (1, 2, 3), (3, 1, 1)]
    svg = to_svg(stored_picture(lay, stored, [(2, 2, 2)], []))
    rects = shards_of(svg)
    assert len(rects) == 60
    titles = re.findall(r"shards \[(\d), :, :\]", svg)
    assert titles == ["0", "1", "2", "3"]
    for coord, rect in zip(itertools.product(range(4), range(3), range(5)), rects, strict=True):
        want = "stored" if coord in stored else "missing" if coord == (2, 2, 2) else "empty"
        assert state(rect) == want, coord
        assert rect.find(f"{SVG}title") is not None


def test_zero_d_array_is_one_cell() -> None:
    lay = Layout((), (), ())
    assert [state(r) for r in shards_of(to_svg(stored_picture(lay, [()], [], [])))] == ["stored"]
    plan = ShardPlan(lay, ())
    rects = shards_of(to_svg(plan_picture(plan, "direct", None, [])))
    assert [state(r) for r in rects] == ["direct"]


def tooltip_counts(rect: ET.Element) -> tuple[int, ...]:
    title = rect.find(f"{SVG}title")
    assert title is not None and title.text is not None
    return tuple(int(n) for n in re.findall(r"(\d+) (?:stored|missing|empty)", title.text))


def test_a_grid_of_100000_shards_is_drawn_in_bounded_cells_that_count_every_shard() -> None:
    lay = Layout((316 * 8, 317 * 8), (8, 8), (8, 8))  # 100,172 shards
    stored = sorted({(i, i) for i in range(316)} | {(0, j) for j in range(317)})  # as listed
    svg = to_svg(stored_picture(lay, stored, [(200, 5)], ["caption"]))
    rects = shards_of(svg)
    assert len(rects) <= MAX_CELLS
    assert len(svg) < 250_000
    counts = [tooltip_counts(r) for r in rects]
    assert sum(map(sum, counts)) == lay.nshards
    assert sum(c[0] for c in counts) == len(stored) == 632 and sum(c[1] for c in counts) == 1
    states = [state(r) for r in rects]
    assert states.count("missing") == 1 and "mixed" in states and "empty" in states
    assert "each cell: up to 10 x 10 shards" in svg
    assert not any(e.get("class") == "owner" for e in ET.fromstring(svg).iter(f"{SVG}text"))


def test_a_plan_of_100000_shards_and_many_blocks_stays_small() -> None:
    lay = Layout((316 * 8, 317 * 8), (8, 8), (8, 8))
    plan = ShardPlan(lay, (slice(4, 316 * 8), slice(0, 317 * 8)))
    blocks = tuple(
        tuple(np.diff([*range(0, b - a, 5), b - a]).tolist()) for a, b in [(4, 2528), (0, 2536)]
    )
    svg = to_svg(plan_picture(plan, "staged", blocks, []))
    rects = shards_of(svg)
    assert len(rects) <= MAX_CELLS and len(svg) < 250_000
    assert len(list(ET.fromstring(svg).iter(f"{SVG}line"))) <= 2 * 64
    # the top row of cells holds the shards the region meets in part
    top = {state(r) for r in rects if box(r)[1] == min(box(q)[1] for q in rects)}
    assert top == {"staged-merge"}
    assert {state(r) for r in rects} == {"staged", "staged-merge"}


def test_n_d_pictures_cap_their_panels() -> None:
    lay = Layout((50, 40, 30, 20), (1, 1, 10, 10), (1, 1, 10, 10))  # 2,000 x 6 shards
    svg = to_svg(stored_picture(lay, [(0, 0, 0, 0), (49, 39, 2, 1)], [], []))
    panels = re.findall(r"shards \[([0-9-]+), ([0-9-]+), :, :\]", svg)
    assert 1 < len(panels) <= MAX_PANELS
    rects = shards_of(svg)
    assert sum(map(sum, map(tooltip_counts, rects))) == lay.nshards
    assert state(rects[0]) == "mixed" and state(rects[-1]) == "mixed"


def test_drawing_str_is_the_svg() -> None:
    pic = stored_picture(Layout((8, 8), (4, 4), (2, 2)), [(1, 1)], [], ["a <caption> & more"])
    d = Drawing(pic, "text <below>")
    assert str(d) == to_svg(pic)
    assert "&lt;caption&gt; &amp; more" in str(d)
    ET.fromstring(d._repr_html_())
