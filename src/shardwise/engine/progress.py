"""Progress of long writes in shards and bytes, on the local schedulers and on a distributed client.

Each shard task returns a small receipt (:class:`~shardwise.engine.report.WriteReport`); the bar
counts the receipts as they come back, so it moves once per shard whatever the dask graph around the
shard tasks looks like. On the local schedulers a dask callback sees each receipt when its task
finishes; on a ``dask.distributed`` client the receipts are futures the client collects as they
complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..runtime.terminal import bar_screen
from .report import WriteReport


def _reports(result: Any) -> list[Any]:
    """The write reports in one task's result (a receipt array, or one report)."""
    if isinstance(result, WriteReport):
        return [result]
    if isinstance(result, np.ndarray) and result.dtype == object:
        return [r for r in result.flat if isinstance(r, WriteReport)]
    return []


class ShardBar:
    """A tqdm bar over ``total`` shards and the bytes moved so far (``what``: "stored", "read")."""

    def __init__(
        self, total: int, desc: str = "shardwise", file: Any = None, what: str = "stored"
    ) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="shard", file=file, **bar_screen(file))
        self.what = what
        self.nbytes = 0

    def step(self, shards: int, nbytes: int) -> None:
        self.nbytes += nbytes
        self.bar.set_postfix_str(f"{self.nbytes / 1e6:.1f} MB {self.what}", refresh=False)
        self.bar.update(shards)

    def add(self, result: Any) -> None:
        """Count the shards and bytes in one task's receipts."""
        reports = _reports(result)
        if reports:
            self.step(
                sum(r.shards_written + r.shards_empty for r in reports),
                sum(r.bytes_stored for r in reports),
            )

    def close(self) -> None:
        self.bar.close()


def _distributed_client() -> Any:
    """The distributed client dask would compute on now, else None."""
    import sys

    if "distributed" not in sys.modules:
        return None
    from dask.base import get_scheduler
    from distributed import Client

    owner = getattr(get_scheduler(), "__self__", None)
    return owner if isinstance(owner, Client) else None


def compute_with_progress(
    parts: Sequence[Any], nshards: int, desc: str = "shardwise", file: Any = None
) -> list[Any]:
    """Compute the dask ``parts`` (one per shard task, or other writes) with a bar over shards.

    Returns their results in order. ``nshards``: the shards the parts write (the bar's total).
    """
    from dask.base import compute

    bar = ShardBar(nshards, desc=desc, file=file)
    try:
        client = _distributed_client()
        if client is not None:
            from distributed import as_completed

            futures = client.compute(list(parts))
            for fut in as_completed(futures, loop=client.loop):
                bar.add(fut.result())
            return [f.result() for f in futures]
        from dask.callbacks import Callback

        wanted = {p.key for p in parts}

        class _Receipts(Callback):  # type: ignore[misc]
            def _posttask(self, key: Any, result: Any, *args: Any) -> None:
                if key in wanted:
                    bar.add(result)

        with _Receipts():
            return list(compute(*parts))
    finally:
        bar.close()
