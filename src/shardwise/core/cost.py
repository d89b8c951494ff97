"""What a write costs in objects and requests, before it runs: pure counting over its job.

On an object store every object is a request and requests are billed: a terabyte in 1 MiB
objects is a million PUTs, in 1 GiB shards a thousand. :func:`requests_of` counts, for a
:class:`~shardwise.core.job.WritePlan`, the objects the write leaves and the requests it makes
(PUT, GET, LIST, multipart parts), as upper bounds (all-fill shards are not stored, so a write
of fill values puts fewer); :class:`Prices` turns them into money. The default prices are S3
Standard's in us-east-1 as published in 2026 (USD: PUT, COPY, POST and LIST $0.005 per 1,000
requests, GET $0.0004 per 1,000); give your own ``Prices`` for another store or region.

>>> r = Requests(objects=2003, puts=2006, gets=0, lists=3, parts=0, raw_bytes=2**40)
>>> round(r.cost(), 4), round(r.cost_per_tib(), 4)
(0.01, 0.01)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TiB = 2**40


@dataclass(frozen=True)
class Prices:
    """Request prices in USD per 1,000 requests (default: S3 Standard, us-east-1)."""

    put: float = 0.005
    get: float = 0.0004
    list: float = 0.005
    name: str = "S3 Standard us-east-1"


@dataclass(frozen=True)
class Requests:
    """The objects a write leaves and the requests it makes (upper bounds).

    ``objects``: shards, their journal records and the few objects of the write itself
    (metadata, marker); ``puts``: every object put, multipart parts and their completions
    included; ``gets``: stored shards read to merge (regions that cover shards in part) and
    staged pieces read back; ``lists``: listings (markers, leftovers); ``parts``: multipart
    upload parts (staged writes on S3); ``raw_bytes``: the data written, for a cost per TiB;
    ``bytes_read`` and ``bytes_written``: the shards read to merge and the shards written, raw
    (before compression; a shard the write covers in part is read and written whole).
    """

    objects: int
    puts: int
    gets: int
    lists: int
    parts: int
    raw_bytes: int
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def amplification(self) -> float:
        """Raw bytes moved (read and written) per byte of data written (NaN: no data)."""
        moved = self.bytes_read + self.bytes_written
        return moved / self.raw_bytes if self.raw_bytes else math.nan

    def cost(self, prices: Prices | None = None) -> float:
        """The requests' price in USD."""
        p = prices or Prices()
        return (self.puts * p.put + self.gets * p.get + self.lists * p.list) / 1000

    def cost_per_tib(self, prices: Prices | None = None) -> float:
        """:meth:`cost` per TiB of raw data written (NaN for an empty write)."""
        return self.cost(prices) * TiB / self.raw_bytes if self.raw_bytes else math.nan

    def describe(self, prices: Prices | None = None) -> str:
        """Two lines for a plan's printout."""
        p = prices or Prices()
        return (
            f"objects: {self.objects:,}\n"
            f"  requests: PUT {self.puts:,}, GET {self.gets:,}, LIST {self.lists:,}, multipart "
            f"parts {self.parts:,}; ${self.cost(p):,.4f} at {p.name} prices "
            f"(${self.cost_per_tib(p):,.4f} per TiB written)\n"
            f"  moves: {size_text(self.bytes_read)} read, {size_text(self.bytes_written)} written "
            f"(raw, before compression) for {size_text(self.raw_bytes)} of data: "
            f"{self.amplification:.2f}x"
        )


# what a write's graph holds, measured by benchmarks/million.py (2026-12-06, 2 cores): the
# client's traced memory while it builds the graph, per task and per shard (one task a shard:
# 23 MB for 20,004 tasks of 10,000 shards; runs: 59 MB for 1,028 tasks of a million shards),
# and the scheduler's resident growth per task (140 MB for 20,004 tasks, 9 MB for 1,004)
CLIENT_BYTES_PER_TASK = 1200
CLIENT_BYTES_PER_SHARD = 60
SCHEDULER_BYTES_PER_TASK = 8 * 1024


def graph_memory(tasks: int, shards: int) -> tuple[int, int]:
    """The client's and the scheduler's memory a graph of ``tasks`` writing ``shards`` takes
    (estimates from the measured figures above).

    >>> graph_memory(1028, 10**6)
    (61233600, 8421376)
    """
    return (
        tasks * CLIENT_BYTES_PER_TASK + shards * CLIENT_BYTES_PER_SHARD,
        tasks * SCHEDULER_BYTES_PER_TASK,
    )


# shards a run of a create records in memory before it puts its run's record object again
# (durability/journal.py's RunRecords)
RUN_FLUSH = 64
# the write's own objects: its zarr.json, its marker; its lease is put and deleted
OWN_OBJECTS = 2
OWN_PUTS = 4  # metadata, marker open, marker done, lease
OWN_LISTS = 3  # markers at the start and the finish, leftovers of interrupted writes


def requests_of(
    *,
    shards: int,
    partial: int,
    records: int,
    staged_pieces: int,
    parts_per_shard: int,
    raw_bytes: int,
    record_puts: int | None = None,
    bytes_read: int = 0,
    bytes_written: int = 0,
) -> Requests:
    """The requests of a write of ``shards`` shards (``partial`` of them merged with what is
    stored: read first), ``records`` journal record objects (put ``record_puts`` times in
    all; default once each), ``staged_pieces`` pieces staged and read back (a staged write; 0
    for direct), each shard put in ``parts_per_shard`` multipart parts (a staged write on S3:
    parts plus create and complete; 0: one put)."""
    shard_puts = shards * (parts_per_shard + 2 if parts_per_shard else 1)
    return Requests(
        objects=shards + records + OWN_OBJECTS,
        puts=shard_puts
        + (records if record_puts is None else record_puts)
        + staged_pieces
        + OWN_PUTS,
        gets=partial + staged_pieces,
        lists=OWN_LISTS,
        parts=shards * parts_per_shard,
        raw_bytes=raw_bytes,
        bytes_read=bytes_read + staged_bytes(staged_pieces, raw_bytes),
        bytes_written=bytes_written + staged_bytes(staged_pieces, raw_bytes),
    )


def staged_bytes(pieces: int, raw_bytes: int) -> int:
    """The raw bytes a staged write's pieces move through the store (each piece written once
    and read back once: the data, once each way); none for a direct write."""
    return raw_bytes if pieces else 0


def size_text(n: int) -> str:
    """``n`` bytes as a plan prints them: ``64.0 MiB``, ``256 B``."""
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


def counted(n: int, noun: str, plural: str = "") -> str:
    """``n`` and ``noun``, singular for one (``plural``: when not ``noun + "s"``).

    >>> counted(1, "shard"), counted(0, "shard"), counted(3, "all-fill shard")
    ('1 shard', '0 shards', '3 all-fill shards')
    """
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def tasks_text(n: int, what: str, labels: bool = False) -> str:
    """``n`` tasks as a plan's picture names them, singular for one, with their labels if
    ``labels``.

    >>> tasks_text(1, "shard", labels=True), tasks_text(4, "shard", labels=True)
    ('1 shard task T0', '4 shard tasks T0..T3')
    >>> tasks_text(1, "block"), tasks_text(0, "shard", labels=True)
    ('1 block task', '0 shard tasks')
    """
    text = f"{n} {what} task{'' if n == 1 else 's'}"
    if labels and n:
        text += " T0" if n == 1 else f" T0..T{n - 1}"
    return text
