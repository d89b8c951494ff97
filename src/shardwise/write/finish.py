"""The end of a write that ran (:meth:`~shardwise.write.pipeline.Pipeline.run`'s last step,
or its Delayed's): every array's session tidied and finished, once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ..engine.report import NOTHING_TO_DO, WriteReport
from ..storage.consolidated import Nodes, refresh
from .session import WriteSession

__all__ = ["Finish", "Kind"]

Kind = Literal["direct", "staged", "copy"]


@dataclass(frozen=True)
class Finish:
    """The end of a write that ran: tidy, ``then`` (e.g. metadata written after the data),
    the consolidated groups above ``nodes`` re-consolidated (the one place every front end's
    write does it: :mod:`shardwise.storage.consolidated`), markers done, leases released; the
    report gets ``before`` added and the shards skipped."""

    sessions: list[tuple[Kind, WriteSession]]
    then: Callable[[], None] | None = None
    before: WriteReport | None = None
    nodes: list[Nodes] = field(default_factory=list)

    def __call__(self, report: WriteReport) -> WriteReport:
        for kind, s in self.sessions:
            s.tidy(staged=kind == "staged", multipart=kind != "direct")
        if self.then is not None:
            self.then()
        for n in self.nodes:
            report.notes += refresh(n)
        # a resume that found every write finished: said so before the sessions finish (a
        # batch part then keeps its record)
        idle = bool(self.sessions) and all(s.idle for _, s in self.sessions)
        if idle and not report.shards_written and NOTHING_TO_DO not in report.notes:
            report.notes.append(NOTHING_TO_DO)
        for _, s in self.sessions:
            s.finish(report)
        if self.before is not None:
            report = self.before + report
        report.shards_skipped = sum(s.skipped for _, s in self.sessions)
        return report
