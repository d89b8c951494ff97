"""A :class:`~shardwise.core.picture.Picture` as SVG text: what notebooks show, no dependency.

Every shard rectangle carries its state as its class (``shard stored``, ``shard direct-merge``
...) and its colour as its fill, and a ``<title>`` (the tooltip: which shards, how many in each
state). :class:`Drawing` wraps a picture for Jupyter (``_repr_html_``).

>>> from shardwise.core.layout import Layout
>>> from shardwise.core.picture import stored_picture
>>> svg = to_svg(stored_picture(Layout((8,), (4,), (2,)), [(0,)], [], []))
>>> svg.count('class="shard stored"'), svg.count('class="shard empty"')
(1, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from .picture import COLOURS, MEANING, Picture, Rect, legend_x

FONT = "font-family:sans-serif"


def _n(x: float) -> str:
    """A coordinate, short: whole numbers without a point, else one decimal."""
    r = round(x, 1)
    return str(int(r)) if r == int(r) else str(r)


def _rect(r: Rect) -> str:
    head = (
        f'<rect class="shard {r.state}" x="{_n(r.x)}" y="{_n(r.y)}" width="{_n(r.w)}" '
        f'height="{_n(r.h)}" fill="{COLOURS[r.state]}"'
    )
    if not r.title:
        return head + "/>"
    return f"{head}><title>{escape(r.title)}</title></rect>"


def _label(r: Rect) -> str:
    size = min(10.0, r.h * 0.7)
    return (
        f'<text class="owner" x="{_n(r.x + r.w / 2)}" y="{_n(r.y + r.h / 2 + size / 3)}" '
        f'font-size="{_n(size)}" text-anchor="middle">{escape(r.label)}</text>'
    )


def _legend(pic: Picture) -> list[str]:
    y = pic.height - 10 - 12
    return [
        f'<rect class="key {state}" x="{_n(x)}" y="{_n(y)}" width="12" height="12" '
        f'fill="{COLOURS[state]}" stroke="#666" stroke-width="0.5"/>'
        f'<text x="{_n(x + 16)}" y="{_n(y + 10)}" font-size="11">{escape(MEANING[state])}</text>'
        for state, x in zip(pic.legend, legend_x(pic.legend), strict=False)
    ]


def to_svg(pic: Picture) -> str:
    """The SVG document of ``pic`` (one ``<rect class="shard STATE">`` per drawn cell)."""
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="shardwise {pic.kind}" '
        f'width="{pic.width}" height="{pic.height}" viewBox="0 0 {pic.width} {pic.height}" '
        f'style="{FONT}">',
        '<g stroke="#555" stroke-width="0.6">',
        *map(_rect, pic.rects),
        "</g>",
    ]
    if pic.lines:
        parts.append('<g class="blocks" stroke="#222" stroke-width="0.8" stroke-dasharray="3,2">')
        parts += [
            f'<line x1="{_n(a.x1)}" y1="{_n(a.y1)}" x2="{_n(a.x2)}" y2="{_n(a.y2)}"/>'
            for a in pic.lines
        ]
        parts.append("</g>")
    parts += [
        f'<rect class="region" x="{_n(o.x)}" y="{_n(o.y)}" width="{_n(o.w)}" '
        f'height="{_n(o.h)}" fill="none" stroke="#000" stroke-width="2"/>'
        for o in pic.outlines
    ]
    parts += [_label(r) for r in pic.rects if r.label]
    parts += [
        f'<text x="{_n(t.x)}" y="{_n(t.y)}" font-size="{_n(t.size)}" '
        f'text-anchor="{t.anchor}">{escape(t.text)}</text>'
        for t in pic.texts
    ]
    parts += _legend(pic)
    parts.append("</svg>")
    return "\n".join(parts)


@dataclass(frozen=True)
class Drawing:
    """A picture that notebooks show (``_repr_html_``, the SVG); ``str()`` is the SVG text."""

    picture: Picture
    text: str = ""  # shown under the picture in a notebook (e.g. a plan's printout)

    def _repr_html_(self) -> str:
        below = f"<pre>{escape(self.text)}</pre>" if self.text else ""
        return f"<div>{to_svg(self.picture)}{below}</div>"

    def __str__(self) -> str:
        return to_svg(self.picture)
