"""What a conversion did: one :class:`ArrayReport` per array in a :class:`ConvertReport`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.cost import counted
from ..engine.report import NOTHING_TO_DO
from .plan import Method


@dataclass
class ArrayReport:
    """What happened to one array: the method and why, the shard shape, what was stored.

    Attributes
    ----------
    path : str
        The array's path in the destination.
    method : {"copy", "reencode"}
        Copied as encoded chunks, or decoded and re-encoded.
    reason : str
        Why this method.
    shards : tuple of int or None
        The shard shape; None: unsharded (``convert(shards=None)``), one object per chunk.
    chunks : tuple of int
        The inner chunk shape.
    shards_written : int
        Shards stored.
    shards_skipped : int
        Shards done before (``resume=True``).
    bytes_stored : int
        Encoded bytes stored.
    objects_before : int
        Stored objects of the source array.
    objects_after : int
        Stored objects of the converted array.
    seconds : float
        Wall time.
    verified : bool or None
        The outcome of ``verify=True`` (None: not verified).
    notes : list of str
        What the array's write found besides its shards, e.g. a resume (``resume=True``) of
        a finished conversion: nothing to do.

    Examples
    --------
    >>> import zarr, shardwise
    >>> src, dst = zarr.storage.MemoryStore(), zarr.storage.MemoryStore()
    >>> zarr.create_array(src, shape=(64, 64), chunks=(16, 16), dtype="u1")[...] = 1
    >>> (a,) = shardwise.convert(src, dst, shards=(32, 32)).arrays
    >>> a.method, a.shards, a.shards_written
    ('copy', (32, 32), 4)
    """

    path: str
    method: Method
    reason: str
    shards: tuple[int, ...] | None
    chunks: tuple[int, ...]
    shards_written: int = 0
    shards_skipped: int = 0
    bytes_stored: int = 0
    objects_before: int = 0
    objects_after: int = 0
    seconds: float = 0.0
    verified: bool | None = None
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        check = {None: "", True: ", verified", False: ", VERIFY FAILED"}[self.verified]
        return (
            f"{self.path or '/'}: {self.method} ({self.reason}); "
            + (
                f"shards {self.shards} of chunks {self.chunks}: "
                f"{counted(self.shards_written, 'shard')} "
                if self.shards is not None
                else f"unsharded, chunks {self.chunks}: "
                f"{counted(self.shards_written, 'chunk object')} "
            )
            + "written"
            + (f", {self.shards_skipped} done before" if self.shards_skipped else "")
            + f", {self.bytes_stored / 1e6:.1f} MB; objects {self.objects_before} -> "
            f"{self.objects_after}; {self.seconds:.2f} s{check}"
            + "".join(f"; {n}" for n in self.notes)
        )


@dataclass
class ConvertReport:
    """The conversion's report: one :class:`ArrayReport` per array.

    Attributes
    ----------
    src : str
        The source store.
    dst : str
        The destination store.
    arrays : list of ArrayReport
        One per array converted.
    seconds : float
        Wall time of the conversion.
    problems : list of str
        What verification found (``verify=True``); ``ok`` is False when there are any, or an
        array failed verification.
    snapshot : str or None
        Into an icechunk session with ``commit=``: the snapshot committed.

    Examples
    --------
    >>> import zarr, shardwise
    >>> src, dst = zarr.storage.MemoryStore(), zarr.storage.MemoryStore()
    >>> group = zarr.open_group(src, mode="w")
    >>> for name in ("a", "b"):
    ...     group.create_array(name, shape=(64,), chunks=(16,), dtype="u1")[...] = 1
    >>> report = shardwise.convert(src, dst, shards=(32,))
    >>> [a.path for a in report.arrays], report.problems
    (['a', 'b'], [])
    """

    src: str
    dst: str
    arrays: list[ArrayReport] = field(default_factory=list)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    snapshot: str | None = None

    @property
    def ok(self) -> bool:
        """True when verification found no problem (always when not verified)."""
        return not self.problems and all(a.verified is not False for a in self.arrays)

    @property
    def nothing_to_do(self) -> bool:
        """A resume (``resume=True``) that found the conversion finished: no array written,
        the destination as it was."""
        return bool(self.arrays) and all(NOTHING_TO_DO in a.notes for a in self.arrays)

    @property
    def objects_before(self) -> int:
        """Stored objects of the source arrays, summed."""
        return sum(a.objects_before for a in self.arrays)

    @property
    def objects_after(self) -> int:
        """Stored objects of the converted arrays, summed."""
        return sum(a.objects_after for a in self.arrays)

    def to_dict(self) -> dict[str, Any]:
        """The report as a dict of plain values, ``ok`` included.

        Returns
        -------
        dict
            The fields of the report and ``ok``.
        """
        return asdict(self) | {"ok": self.ok}

    def __str__(self) -> str:
        head = (
            f"converted {self.src} -> {self.dst}: {counted(len(self.arrays), 'array')}, objects "
            f"{self.objects_before} -> {self.objects_after} in {self.seconds:.2f} s"
        )
        done = [f"committed snapshot {self.snapshot}"] if self.snapshot else []
        return "\n".join([head, *(f"  {a}" for a in self.arrays), *self.problems, *done])
