"""ShardKeys: the store keys of the shards a write stored, held as spans of shard indices.

A write of a million shards reports every key it stored (``WriteReport.keys``). As strings
they cost about 60 bytes each on the client and in every receipt a task sends back; here
each array's keys are spans ``[start, stop)`` of shard indices in C order of its grid, and
neighbouring shards (a run's, written one after another) make one span, so a report is a few
spans per task whatever its shard count. The strings are made when read (iterated, indexed,
compared), sorted as before.

>>> from shardwise.core.layout import Layout
>>> lay = Layout(shape=(4, 6), shard_shape=(2, 2), chunk_shape=(1, 1))
>>> keys = ShardKeys()
>>> for coord in [(0, 1), (0, 2), (1, 0)]:
...     keys.extend(ShardKeys.of_shard(lay, coord))
>>> keys.spans, len(keys)
(1, 3)
>>> list(keys.with_prefix("group/a"))
['group/a/c/0/1', 'group/a/c/0/2', 'group/a/c/1/0']
>>> keys == ["c/0/1", "c/0/2", "c/1/0"]
True
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from .layout import Layout


@dataclass(frozen=True)
class KeyGrid:
    """How the shard keys of one array are spelled: its path (``""``: at the store's root or
    the caller's) and its shard grid's key rules."""

    prefix: str
    grid: tuple[int, ...]
    separator: str
    encoding: str

    def key(self, index: int) -> str:
        coord: list[int] = []
        for n in reversed(self.grid):
            index, c = divmod(index, n)
            coord.append(c)
        coord.reverse()
        if self.encoding == "v2":
            name = self.separator.join(map(str, coord)) if coord else "0"
        else:
            name = self.separator.join(["c", *map(str, coord)])
        return f"{self.prefix}/{name}" if self.prefix else name


# one object per array's keys: the shards of a run join its last span by identity, not by
# comparing grids (asked once a shard written)
_key_grid = functools.lru_cache(maxsize=64)(KeyGrid)


class ShardKeys(Sequence[str]):
    """Shard keys as spans of shard indices per array, plus keys given as strings; read as
    a sorted sequence of strings (what ``WriteReport.keys`` was: a sorted list)."""

    __slots__ = ("_cache", "_grids", "_loose", "_spans")

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._spans: list[tuple[KeyGrid, int, int]] = []
        self._loose: list[str] = list(keys)
        self._cache: list[str] | None = None
        self._grids: dict[KeyGrid, KeyGrid] = {}

    @classmethod
    def of_shard(cls, layout: Layout, coord: Sequence[int], prefix: str = "") -> ShardKeys:
        """The key of the shard at ``coord`` of ``layout``'s grid."""
        out = cls()
        index = 0
        for c, n in zip(coord, layout.shard_grid, strict=True):
            index = index * n + int(c)
        kg = _key_grid(prefix, layout.shard_grid, layout.separator, layout.key_encoding)
        out._spans.append((kg, index, index + 1))
        return out

    @property
    def spans(self) -> int:
        """Spans held (the client's cost of the keys, with the loose strings)."""
        return len(self._spans)

    def extend(self, other: Iterable[str]) -> None:
        """Add ``other``'s keys (a ShardKeys's spans, joined to a neighbouring last span)."""
        self._cache = None
        if not isinstance(other, ShardKeys):
            self._loose.extend(other)
            return
        spans = self._spans
        for kg, start, stop in other._spans:
            if spans:  # the next shard of the last span's array (a run's shards, in order)
                last, first, end = spans[-1]
                if end == start and (last is kg or last == kg):
                    spans[-1] = (last, first, stop)
                    continue
            spans.append((self._grids.setdefault(kg, kg), start, stop))  # one object a grid
        self._loose.extend(other._loose)

    def with_prefix(self, prefix: str) -> ShardKeys:
        """These keys under the path ``prefix`` (``""``: unchanged)."""
        if not prefix:
            return self
        out = ShardKeys(f"{prefix}/{k}" for k in self._loose)
        for kg, start, stop in self._spans:
            if kg not in out._grids:
                joined = f"{prefix}/{kg.prefix}" if kg.prefix else prefix
                out._grids[kg] = KeyGrid(joined, kg.grid, kg.separator, kg.encoding)
            out._spans.append((out._grids[kg], start, stop))
        out._grids = {kg: kg for kg in out._grids.values()}
        return out

    def sort(self) -> None:
        """Nothing to do: the keys are always read sorted (a list's method, kept)."""

    def _all(self) -> list[str]:
        if self._cache is None:
            out = list(self._loose)
            for kg, start, stop in self._spans:
                out.extend(kg.key(i) for i in range(start, stop))
            out.sort()
            self._cache = out
        return self._cache

    def __bool__(self) -> bool:
        return bool(self._spans or self._loose)

    def __len__(self) -> int:
        return len(self._loose) + sum(stop - start for _, start, stop in self._spans)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        return self._all()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __contains__(self, key: object) -> bool:
        return key in self._all()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardKeys | list | tuple):
            return self._all() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as the list it stands for

    def __repr__(self) -> str:
        n = len(self)
        shown = self._all()[:3] if n <= 3 else [*self._all()[:2], "..."]
        return f"ShardKeys({n} keys in {self.spans} spans: {shown})"

    def __getstate__(self) -> dict[str, Any]:
        return {"spans": self._spans, "loose": self._loose}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._spans, self._loose, self._cache = state["spans"], state["loose"], None
        self._grids = {kg: kg for kg, _, _ in self._spans}
