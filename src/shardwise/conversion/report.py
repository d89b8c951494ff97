"""What a conversion did: one :class:`ArrayReport` per array in a :class:`ConvertReport`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .plan import Method


@dataclass
class ArrayReport:
    """What happened to one array: the method and why, the shard shape, what was stored."""

    path: str
    method: Method
    reason: str
    shards: tuple[int, ...]
    chunks: tuple[int, ...]
    shards_written: int = 0
    shards_skipped: int = 0
    bytes_stored: int = 0
    objects_before: int = 0
    objects_after: int = 0
    seconds: float = 0.0
    verified: bool | None = None

    def __str__(self) -> str:
        check = {None: "", True: ", verified", False: ", VERIFY FAILED"}[self.verified]
        return (
            f"{self.path or '/'}: {self.method} ({self.reason}); shards {self.shards} of "
            f"chunks {self.chunks}: {self.shards_written} shards written"
            + (f", {self.shards_skipped} done before" if self.shards_skipped else "")
            + f", {self.bytes_stored / 1e6:.1f} MB; objects {self.objects_before} -> "
            f"{self.objects_after}; {self.seconds:.2f} s{check}"
        )


@dataclass
class ConvertReport:
    """The conversion's report: one :class:`ArrayReport` per array."""

    src: str
    dst: str
    arrays: list[ArrayReport] = field(default_factory=list)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(a.verified is not False for a in self.arrays)

    @property
    def objects_before(self) -> int:
        return sum(a.objects_before for a in self.arrays)

    @property
    def objects_after(self) -> int:
        return sum(a.objects_after for a in self.arrays)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}

    def __str__(self) -> str:
        head = (
            f"converted {self.src} -> {self.dst}: {len(self.arrays)} arrays, objects "
            f"{self.objects_before} -> {self.objects_after} in {self.seconds:.2f} s"
        )
        return "\n".join([head, *(f"  {a}" for a in self.arrays), *self.problems])
