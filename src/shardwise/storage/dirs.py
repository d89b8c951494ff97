"""The directories a local put needs (``storage/store.py``): made with one ``mkdir`` each."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["make_dirs"]


def make_dirs(d: Path) -> list[Path]:
    """Create the missing directory ``d`` and its missing parents; returns them, deepest
    first, with any another writer made meanwhile (fsynced too). One ``mkdir`` a directory,
    no ``stat``: a stream of one frame a shard makes new directories at almost every put."""
    try:
        os.mkdir(d)
    except FileNotFoundError:
        if d.parent == d:
            raise
        above = make_dirs(d.parent)
        try:
            os.mkdir(d)
        except FileExistsError:
            _is_dir(d)
        return [d, *above]
    except FileExistsError:
        _is_dir(d)
    return [d]


def _is_dir(d: Path) -> None:
    if not d.is_dir():
        raise FileExistsError(f"not a directory: {d}")
