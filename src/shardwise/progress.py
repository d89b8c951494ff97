"""Progress bars for long writes and reads (tqdm on the local schedulers, dask's own elsewhere)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def progress_bar(desc: str = "shardwise", unit: str = "task") -> Iterator[None]:
    """Show a tqdm bar over the dask tasks computed inside the block (local schedulers); tasks
    that return a report with ``bytes_stored`` (one per shard) add their bytes to the bar."""
    from dask.callbacks import Callback
    from tqdm.auto import tqdm

    class _Bar(Callback):  # type: ignore[misc]
        def _start_state(self, dsk: Any, state: Any) -> None:
            self._bar = tqdm(
                total=sum(len(state[k]) for k in ("ready", "waiting", "running")),
                desc=desc,
                unit=unit,
            )
            self._bytes = 0

        def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
            stored = getattr(result, "bytes_stored", None)
            if isinstance(stored, int) and stored:
                self._bytes += stored
                self._bar.set_postfix_str(f"{self._bytes / 1e6:.1f} MB", refresh=False)
            self._bar.update(1)

        def _finish(self, dsk: Any, state: Any, errored: bool) -> None:
            self._bar.close()

    with _Bar():
        yield
