"""The size a progress bar takes in a terminal that reports none (:func:`bar_screen`), for
every tqdm bar shardwise shows: the shard bars (engine/progress.py) and the icechunk merge bar
(storage/icechunk.py)."""

from __future__ import annotations

from typing import Any


def bar_screen(file: Any = None) -> dict[str, int]:
    """The width and height for tqdm when ``file`` (None: stderr, tqdm's default) is a terminal
    that reports a size of 0 x 0 (a fresh pseudo-terminal, a container's or a CI runner's):
    tqdm would take it for a screen with no row for a bar, print none and still end each bar's
    line, leaving an empty line per bar. The size ``shutil`` falls back to then (``COLUMNS`` and
    ``LINES``, else 80 x 24); nothing (tqdm's own choice) for a terminal that has a size or a
    file that is no terminal."""
    import os
    import shutil
    import sys

    try:
        cols, rows = os.get_terminal_size((file or sys.stderr).fileno())
    except (AttributeError, OSError, ValueError):
        return {}
    if cols > 0 and rows > 0:
        return {}
    size = shutil.get_terminal_size()
    # tqdm keeps the last column and row free, as it does with a size it reads itself
    return {"ncols": (cols or size.columns) - 1, "nrows": (rows or size.lines) - 1}
