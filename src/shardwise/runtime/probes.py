"""The memory a task may hold, probed from the running dask workers or the machine (imported
only when asked: distributed and psutil load on first use)."""

from __future__ import annotations

MEMORY_FRACTION = 0.5  # of the machine's available memory, shared by the threads


def default_memory_limit() -> tuple[int, str]:
    """Bytes a task may hold, and where the figure came from.

    On a dask worker, or with a distributed client whose workers run the graph: the smallest
    worker ``memory_limit / nthreads``. Else a share of the machine's available memory per core.
    """
    import sys

    # no worker and no client can exist in a process that has not imported distributed
    if "distributed" in sys.modules:
        found = _distributed_limit()
        if found is not None:
            return found
    import psutil

    from .pool import cpu_count

    avail = int(psutil.virtual_memory().available * MEMORY_FRACTION)
    return avail // cpu_count(), f"{MEMORY_FRACTION:.0%} of available memory / cores"


def _distributed_limit() -> tuple[int, str] | None:
    try:
        from distributed import get_worker

        w = get_worker()
        limit = int(w.memory_manager.memory_limit or 0)
        if limit:
            return limit // max(1, int(w.state.nthreads)), "dask worker memory_limit / nthreads"
    except (ImportError, ValueError, AttributeError):
        pass
    try:
        from distributed import default_client

        workers = default_client().scheduler_info()["workers"].values()
        shares = [
            int(w["memory_limit"]) // max(1, int(w["nthreads"]))
            for w in workers
            if w.get("memory_limit")
        ]
        if shares:
            return min(shares), "dask workers' memory_limit / nthreads"
    except (ImportError, ValueError, AttributeError, KeyError):
        pass
    return None
