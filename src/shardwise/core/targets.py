"""``shards=`` targets as callers write them, parsed and checked before any array is known: a
byte size (``"2GB"``), axis names (``"XY"``, ``"ZYX"``, ``"one per time step"``), a shape or
sizes per dimension name; and the axis an axis name or letter stands for. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidTypeError, InvalidValueError

__all__ = ["TARGETS", "Target", "axis_of", "parse_target", "positive"]

LETTERS = "tczyx"
# dimension names an axis letter also matches (case-insensitive)
ALIASES = {
    "t": ("t", "time"),
    "c": ("c", "channel", "band"),
    "z": ("z", "level", "depth", "height"),
    "y": ("y", "lat", "latitude"),
    "x": ("x", "lon", "longitude"),
}
TARGETS = (
    "None or 'auto', a byte size ('2GB'), axis names ('XY', 'ZYX', 'one per time step'), a "
    "shape (256, 256) or sizes per dimension name ({'time': 365})"
)
_PER = re.compile(r"^\s*one\s+(?:shard\s+)?per\s+(\w+?)(?:\s+(?:step|index|slice))?\s*$", re.I)


@dataclass(frozen=True)
class Target:
    """A parsed ``shards=`` target: ``kind`` is "default", "bytes", "axes", "per", "shape" or
    "sizes"; ``text`` is how it was given."""

    kind: str
    text: str
    nbytes: int = 0
    names: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()
    sizes: tuple[tuple[str, int], ...] = ()


def parse_target(value: Any) -> Target:
    """``shards=`` as a target, checked (no array needed yet).

    >>> parse_target("2GB").nbytes, parse_target("xyz").names
    (2000000000, ('x', 'y', 'z'))
    >>> parse_target("one per time step").kind, parse_target("one per time step").names
    ('per', ('time',))
    """
    if isinstance(value, Target):
        return value
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return Target("default", "default")
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"[tczyxTCZYX]+", text):
            names = tuple(text.lower())
            if len(set(names)) != len(names):
                raise InvalidValueError(f"shards={value!r} names an axis twice")
            return Target("axes", text, names=names)
        per = _PER.match(text)
        if per:
            return Target("per", text, names=(per.group(1),))
        if re.search(r"[a-zA-Z]", text):
            from dask.utils import parse_bytes

            try:
                return Target("bytes", text, nbytes=max(1, int(parse_bytes(text))))
            except (ValueError, KeyError, TypeError):
                pass
        raise InvalidValueError(f"shards must be {TARGETS}, got {value!r}")
    if isinstance(value, Mapping):
        sizes = tuple((k, positive(v, value)) for k, v in value.items() if isinstance(k, str))
        if len(sizes) != len(value) or not sizes:
            raise InvalidTypeError(f"shards must be {TARGETS}: names are strings, got {value!r}")
        return Target("sizes", str(dict(value)), sizes=sizes)
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        shape = tuple(positive(v, value) for v in value)  # () is a 0-d array's
        return Target("shape", str(shape), shape=shape)
    raise InvalidTypeError(f"shards must be {TARGETS}, got {value!r} ({type(value).__name__})")


def positive(v: Any, whole: Any) -> int:
    if isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 1:
        return int(v)
    raise InvalidValueError(f"shards must be {TARGETS}: sizes are positive ints, got {whole!r}")


def axis_of(name: str, ndim: int, dims: Sequence[str | None] | None) -> int:
    """The axis a name or letter stands for: a dimension of that name (or one an axis letter
    matches, e.g. ``x`` and ``lon``); without dimension names, a letter of t, c, z, y, x is one
    of the last axes (``x`` the last)."""
    key = name.lower()
    named = [str(d).lower() if d is not None else None for d in dims or ()]
    for accepted in ((key,), ALIASES.get(key, ()), ALIASES["t"] if key == "time" else ()):
        hits = [i for i, d in enumerate(named) if d is not None and d in accepted]
        if len(hits) == 1:
            return hits[0]
    if not any(named) and key in ALIASES and ndim <= 5:
        letters = LETTERS[5 - ndim :]
        if key in letters:
            return letters.index(key)
    have = tuple(dims or ()) if any(named) else "not named: letters " + LETTERS[max(0, 5 - ndim) :]
    raise InvalidValueError(
        f"shards names axis {name!r}, which the array does not have (dimensions {have})"
    )
