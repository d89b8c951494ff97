"""A :class:`~shardwise.core.picture.Picture` as a PNG file through matplotlib (``--plot``).

The file is exactly ``picture.width`` x ``picture.height`` pixels (100 dpi, no tight bounding box),
drawn as the SVG is: the same rectangles, colours, block edges, outlines, labels and captions.
matplotlib is optional (the ``plot`` extra); without it the command is refused before the store is
read, with a :class:`~shardwise.errors.DependencyError` saying what to install.
"""

from __future__ import annotations

import os
from typing import Any

from ..core.picture import COLOURS, MEANING, Picture, legend_x
from ..errors import DependencyError

DPI = 100
PT = 72 / DPI  # matplotlib sizes text in points; the picture in pixels


def require_matplotlib() -> Any:
    """matplotlib's pyplot on the Agg backend, or a DependencyError saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib import pyplot
    except ImportError:
        raise DependencyError(
            "--plot draws with matplotlib, which is not installed: pip install matplotlib "
            "(or shardwise[plot])"
        ) from None
    return pyplot


def write_png(picture: Picture, path: str | os.PathLike[str]) -> None:
    """Draw ``picture`` into the PNG file ``path`` (replaced when it exists)."""
    from matplotlib.collections import LineCollection, PatchCollection
    from matplotlib.patches import Rectangle

    plt = require_matplotlib()
    fig = plt.figure(figsize=(picture.width / DPI, picture.height / DPI), dpi=DPI)
    try:
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, picture.width)
        ax.set_ylim(picture.height, 0)  # y down, as in the SVG
        ax.set_axis_off()
        boxes = [Rectangle((r.x, r.y), r.w, r.h) for r in picture.rects]
        fills = [COLOURS[r.state] for r in picture.rects]
        ax.add_collection(PatchCollection(boxes, facecolors=fills, edgecolors="#555", lw=0.4))
        segments = [((a.x1, a.y1), (a.x2, a.y2)) for a in picture.lines]
        ax.add_collection(LineCollection(segments, colors="#222", lw=0.6, linestyles="--"))
        for o in picture.outlines:
            ax.add_patch(Rectangle((o.x, o.y), o.w, o.h, fill=False, edgecolor="#000", lw=1.5))
        for r in picture.rects:
            if r.label:
                size = min(10.0, r.h * 0.7) * PT
                ax.text(r.x + r.w / 2, r.y + r.h / 2, r.label, ha="center", va="center", size=size)
        for t in picture.texts:
            ha = "center" if t.anchor == "middle" else "left"
            ax.text(t.x, t.y, t.text, ha=ha, va="baseline", size=t.size * PT)
        _legend(ax, picture)
        fig.savefig(os.fspath(path), dpi=DPI, format="png")
    finally:
        plt.close(fig)


def _legend(ax: Any, picture: Picture) -> None:
    from matplotlib.patches import Rectangle

    y = picture.height - 10 - 12
    for state, x in zip(picture.legend, legend_x(picture.legend), strict=False):
        ax.add_patch(Rectangle((x, y), 12, 12, facecolor=COLOURS[state], edgecolor="#666", lw=0.4))
        ax.text(x + 16, y + 10, MEANING[state], va="baseline", size=11 * PT)
