"""The memory a task may hold, probed from the running dask workers or the machine (imported
only when asked: distributed and psutil load on first use)."""

from __future__ import annotations

from typing import Any

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

        workers = _scheduler_workers(default_client()).values()
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


def _scheduler_workers(client: Any) -> dict[str, Any]:
    """The scheduler's workers, asked of the scheduler. Not ``client.scheduler_info()``: it
    returns the client's cache after the fetch, which the client's periodic refresh (on its
    event loop) replaces with an identity fetched without workers, so under load it can read
    none and the probe would fall back to the machine's memory instead of the workers' limit."""
    if client.asynchronous:  # a fetch would have to be awaited; the cache is all there is
        return dict(client.scheduler_info()["workers"])
    return dict(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def default_threads(local: bool) -> int:
    """Threads the write's tasks run on at once: this process's (dask's ``num_workers``, else
    the cores) when it runs ``local``ly, else those of every worker of the default
    distributed client (the cores when none answers)."""
    import sys

    from .pool import cpu_count

    if not local and "distributed" in sys.modules:
        try:
            from distributed import default_client

            workers = _scheduler_workers(default_client()).values()
            total = sum(int(w.get("nthreads", 0)) for w in workers)
            if total:
                return total
        except (ImportError, ValueError, AttributeError, KeyError):
            pass
    if "dask" in sys.modules:
        import dask

        n = dask.config.get("num_workers", None)
        if n:
            return int(n)
    return cpu_count()
