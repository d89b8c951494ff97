"""The forks of a write into an icechunk session merged as a tree, where the shard tasks ran.

Each shard task of a write into a session hands back the fork it wrote into (its report's
``forks``; see :mod:`shardwise.storage.icechunk`). Merged one by one in the client, N forks are
N transfers to the client and N merges there. :func:`fork_tree` adds ``FAN_IN``-ary merge tasks
over a part's shard tasks instead: each merges its inputs' forks (checked disjoint first, as
:func:`~shardwise.storage.icechunk.check_disjoint` does for the last step) into one, on the
workers, so one fork per array reaches the client. Two forks that wrote one shard meet at
some merge task, which refuses them: the check over the tree is the check over every pair.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from ..storage.icechunk import check_disjoint
from .report import WriteReport, sum_reports

__all__ = ["FAN_IN", "fork_tree", "merge_forks"]

FAN_IN = 8  # forks merged by one task


def merge_forks(*receipts: Any) -> WriteReport:
    """The sum of ``receipts`` (reports, or blocks of them), their forks checked disjoint and
    merged into the first (a :class:`~shardwise.errors.TransactionError` names a shard two of
    them wrote; nothing merged)."""
    total = sum_reports(receipts)
    if len(total.forks) > 1:
        check_disjoint(total.forks)
        head, *rest = total.forks
        head.merge(*rest)
        total.forks = [head]
    return total


def fork_tree(parts: Sequence[tuple[str, Any]], fan_in: int = FAN_IN) -> list[tuple[str, Any]]:
    """``parts`` (prefix, shard tasks: a dask array of receipts or a list of Delayed) with each
    one's tasks reduced by a tree of :func:`merge_forks` tasks to one Delayed report holding
    one fork. Other parts (one Delayed already) are kept."""
    import dask.array as da
    from dask.delayed import delayed

    out: list[tuple[str, Any]] = []
    for prefix, p in parts:
        if isinstance(p, da.Array):
            level = p.to_delayed(optimize_graph=False).ravel().tolist()
        elif isinstance(p, list):
            level = list(p)
        else:
            out.append((prefix, p))
            continue
        if not level:
            out.append((prefix, p))
            continue
        tok, depth = uuid.uuid4().hex[:12], 0
        while depth == 0 or len(level) > 1:
            level = [
                delayed(merge_forks, pure=False)(
                    *level[i : i + fan_in],
                    dask_key_name=f"shardwise-merge-forks-{tok}-{depth}-{i // fan_in}",
                )
                for i in range(0, len(level), fan_in)
            ]
            depth += 1
        out.append((prefix, level[0]))
    return out
