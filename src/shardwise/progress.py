"""Progress bars for long writes and reads (tqdm on the local schedulers, dask's own elsewhere)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def progress_bar(desc: str = "shardwise") -> Iterator[None]:
    """Show a tqdm bar over the dask tasks computed inside the block (local schedulers)."""
    from dask.callbacks import Callback
    from tqdm.auto import tqdm

    class _Bar(Callback):  # type: ignore[misc]
        def _start_state(self, dsk: Any, state: Any) -> None:
            self._bar = tqdm(
                total=sum(len(state[k]) for k in ("ready", "waiting", "running")),
                desc=desc,
                unit="task",
            )

        def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
            self._bar.update(1)

        def _finish(self, dsk: Any, state: Any, errored: bool) -> None:
            self._bar.close()

    with _Bar():
        yield
