"""ShardRecorder: how a shard task records what it stored.

The engine says what it stored; durability (``durability/journal.py``'s ``Journal``) decides where
and how the record is kept. The engine imports nothing of durability: layers go one way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..storage.conditional import UNCHECKED


class ShardRecorder(Protocol):
    """The records of one write, as its shard tasks see them (travels to the workers)."""

    @property
    def write_id(self) -> str:
        """The write the records belong to (its running tasks are counted under it)."""
        ...

    def record(self, key: str, parts: Sequence[Any] | None, generation: Any = UNCHECKED) -> None:
        """Record the shard stored as ``parts`` (None: a removed or empty shard); ``generation``
        of a conditional commit keeps the record only while the shard is still that commit's."""
        ...

    def record_spliced(self, key: str, segments: Sequence[Any], generation: Any) -> None:
        """Record the shard a range merge committed as ``generation``, built from
        ``segments`` (``(offset, nbytes)`` ranges copied from the shard it replaced, and the
        bytes-like parts it wrote), without reading the copied ranges."""
        ...

    def record_object(self, key: str, size: int, crc: int, index_crc: int) -> None:
        """Record a shard whose checksums its commit computed while it streamed the object."""
        ...

    def matches(self, key: str) -> bool:
        """True when ``key`` holds exactly the object this write recorded for it."""
        ...

    def for_run(self) -> ShardRecorder:
        """The recorder of one task writing a run of shards (engine/runs.py): the run's
        records kept together and put by :meth:`flush`."""
        ...

    def flush(self) -> None:
        """Put the records kept and not put yet (nothing, for a recorder that puts each one)."""
        ...
