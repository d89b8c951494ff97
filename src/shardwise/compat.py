"""Every call shardwise makes into another library's private API, in one place.

Each function below names what it reaches into and why there is no public way; ``CHECKED``
records the versions they were checked against (pyproject.toml bounds them from above). When a
dependency drops one of them, the call fails here with :class:`~shardwise.errors.DependencyError`
naming the library, its version and the supported range, not somewhere deep in a write.

What is not here is public API: zarr's ``Store``/``Codec`` interfaces, xarray's backend
entry points, the dask collection protocol (``__dask_postcompute__``, used by ``assemble.py``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import version
from typing import Any

from .errors import DependencyError

# library -> (oldest, first unsupported) versions the private calls below were checked with
CHECKED: Mapping[str, tuple[str, str]] = {
    "zarr": ("3.2", "3.5"),
    "xarray": ("2024.10", "2027"),
    "dask": ("2024.8", "2027"),
    "fsspec": ("2024.6", "2027"),
    "s3fs": ("2024.6", "2027"),
}


def _missing(lib: str, what: str) -> DependencyError:
    lo, hi = CHECKED[lib]
    return DependencyError(
        f"{lib} {version(lib)} has no {what}, which shardwise uses (checked with {lib} >= {lo}, "
        f"< {hi}): install a {lib} in that range"
    )


# -- zarr --------------------------------------------------------------------------------------
# Codec chains shardwise does not implement itself run through zarr's codec objects one chunk at
# a time; zarr's public codec API is asynchronous and batched, its synchronous per-chunk
# methods are private. Needed only for such chains (the common ones are native).


def has_sync_codec(codec: Any) -> bool:
    return hasattr(codec, "_encode_sync") and hasattr(codec, "_decode_sync")


def encode_sync(codec: Any, data: Any, spec: Any) -> Any:
    try:
        method = codec._encode_sync
    except AttributeError:
        raise _missing("zarr", f"synchronous encode on {type(codec).__name__}") from None
    return method(data, spec)


def decode_sync(codec: Any, data: Any, spec: Any) -> Any:
    try:
        method = codec._decode_sync
    except AttributeError:
        raise _missing("zarr", f"synchronous decode on {type(codec).__name__}") from None
    return method(data, spec)


def consolidated_metadata(store: Any, path: str) -> Any:
    """The ``consolidated_metadata`` of the group at ``path`` (a JSON value) exactly as
    ``zarr.consolidate_metadata`` would write it, built without writing it and without that
    function's warning that Zarr v3 does not specify consolidated metadata: silencing it takes
    ``warnings.catch_warnings``, which is not thread-safe (writes finishing on several threads at
    once would restore each other's filters). zarr builds the document in private steps."""
    import dataclasses
    import json

    try:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.group import AsyncGroup, ConsolidatedMetadata, GroupMetadata
        from zarr.core.sync import sync
        from zarr.storage import StorePath

        flat_to_nested = ConsolidatedMetadata._flat_to_nested
    except (ImportError, AttributeError):
        raise _missing("zarr", "the steps of zarr.consolidate_metadata") from None

    async def build() -> Any:
        group = await AsyncGroup.open(StorePath(store, path), zarr_format=3, use_consolidated=False)
        members = {
            k: v.metadata
            async for k, v in group.members(max_depth=None, use_consolidated_for_children=False)
        }
        for k, v in members.items():  # as zarr: an empty child group lists no members
            if isinstance(v, GroupMetadata) and v.consolidated_metadata is None:
                empty = ConsolidatedMetadata(metadata={})
                members[k] = dataclasses.replace(v, consolidated_metadata=empty)
        flat_to_nested(members)
        meta = dataclasses.replace(
            group.metadata, consolidated_metadata=ConsolidatedMetadata(metadata=members)
        )
        return meta.to_buffer_dict(default_buffer_prototype())["zarr.json"]

    return json.loads(sync(build()).to_bytes())["consolidated_metadata"]


# -- xarray ------------------------------------------------------------------------------------
# The xarray writer runs xarray's own to_zarr machinery against an overlay store, so that
# metadata and CF encoding are exactly xarray's; its entry points for that are not public.


def normalize_path(path: Any) -> Any:
    """xarray's path normalization for ``open_dataset`` (``~``, ``pathlib``, URLs)."""
    try:
        from xarray.backends.common import _normalize_path
    except ImportError:
        raise _missing("xarray", "xarray.backends.common._normalize_path") from None
    return _normalize_path(path)


def datatree_from_groups(groups: Mapping[str, Any]) -> Any:
    """``DataTree.from_dict(groups)`` whose nodes close their datasets' stores, as xarray's
    engines build trees (``datatree_from_dict_with_io_cleanup``); before that helper, the same
    with the public ``DataTree.from_dict`` and ``set_close``."""
    try:
        from xarray.backends.common import datatree_from_dict_with_io_cleanup
    except ImportError:
        from xarray import DataTree

        try:
            tree = DataTree.from_dict(groups)
        except Exception:
            for ds in groups.values():
                ds.close()
            raise
        for path, ds in groups.items():
            tree[path].set_close(ds.close)
        return tree
    return datatree_from_dict_with_io_cleanup(groups)


def zarr_store_writers() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """xarray's ``(dump_to_store, get_writable_zarr_store)``."""
    try:
        from xarray.backends.writers import dump_to_store, get_writable_zarr_store
    except ImportError:
        try:  # xarray before its writers module
            from xarray.backends.api import (  # type: ignore[attr-defined,no-redef]
                dump_to_store,
                get_writable_zarr_store,
            )
        except ImportError:
            raise _missing("xarray", "dump_to_store / get_writable_zarr_store") from None
    return dump_to_store, get_writable_zarr_store


def validate_region_and_encoding(zs: Any, ds: Any, encoding: Mapping[Any, Any]) -> Any:
    """xarray's checks of ``region`` (resolving ``"auto"``) and of the encoding, as its
    ``to_zarr`` runs them; returns the dataset with the region resolved."""
    try:
        region, enc = zs._validate_and_autodetect_region, zs._validate_encoding
    except AttributeError:
        raise _missing("xarray", "ZarrStore region and encoding validation") from None
    ds = region(ds)
    enc(encoding)
    return ds


# -- fsspec ------------------------------------------------------------------------------------


def pipe_file_async(fs: Any, path: str, data: bytes, **kwargs: Any) -> Any:
    """The coroutine of ``fs.pipe_file``: zarr's fsspec filesystems are asynchronous and
    have no loop of their own, so their sync wrappers cannot be called; run it on zarr's loop."""
    try:
        method = fs._pipe_file
    except AttributeError:
        raise _missing("fsspec", f"{type(fs).__name__}._pipe_file") from None
    return method(path, data, **kwargs)


def s3_call(fs: Any, method: str, **kwargs: Any) -> Any:
    """The coroutine of the S3 API call ``method`` (``get_object``, ``put_object`` ...) through
    an s3fs filesystem's botocore client: conditional puts (``IfMatch``/``IfNoneMatch``) and
    reads with the ETag have no public s3fs method."""
    try:
        call = fs._call_s3
    except AttributeError:
        raise _missing("s3fs", f"{type(fs).__name__}._call_s3") from None
    return call(method, **kwargs)


# -- numpy -------------------------------------------------------------------------------------


@functools.cache
def hugepage_switch() -> Callable[[bool], bool] | None:
    """numpy's switch of its huge-page advice for new arrays (see ``memory.new_array``), or
    None when this numpy has none (then arrays are allocated as numpy does by default)."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        with contextlib.suppress(ImportError):
            switch = getattr(importlib.import_module(name), "_set_madvise_hugepage", None)
            if switch is not None:
                return switch  # type: ignore[no-any-return]
    return None


# -- dask --------------------------------------------------------------------------------------


def runs_locally(collection: Any, scheduler: Any = None) -> bool:
    """True when computing ``collection`` (with ``scheduler=``, None for the configured one)
    runs on dask's threaded or synchronous scheduler in this process, with no local callbacks
    (progress bars, profilers) active that expect to see its tasks."""
    import dask.local
    import dask.threaded
    from dask.base import get_scheduler
    from dask.callbacks import Callback

    if Callback.active:
        return False
    if scheduler is None and default_scheduler_is_local():
        # the default is local (no client; no scheduler or a local one configured): the same
        # answer get_scheduler gives, without importing distributed (0.2 s) to look for a client
        return collection.__dask_scheduler__ in (dask.threaded.get, dask.local.get_sync)
    if scheduler is not None and _local_without_client(scheduler):
        return True
    get = get_scheduler(scheduler=scheduler, collections=[collection])
    return get in (dask.threaded.get, dask.local.get_sync)


def default_runs_locally() -> bool:
    """True when dask's default scheduler (no ``scheduler=`` given) is its threaded or synchronous
    one (no distributed client or other scheduler is set as the default), with no local callbacks
    (progress bars, profilers) active that expect to see the tasks."""
    from dask.callbacks import Callback

    return not Callback.active and default_scheduler_is_local()


def threads_run_here() -> bool:
    """True when a write computed now would run its tasks on dask's threaded scheduler in this
    process with no callbacks watching them (or dask is not imported at all: then no client,
    scheduler setting or callback exists). A numpy source's direct write then runs its shard
    tasks on this process's threads without dask (``engine/inprocess.py``): what dask's threaded
    scheduler would do, without importing it (a second of a fresh process's first write)."""
    if "dask" not in sys.modules:
        return True
    import dask
    import dask.threaded
    from dask.base import get_scheduler
    from dask.callbacks import Callback

    if Callback.active:
        return False
    if "distributed" not in sys.modules and not dask.config.get("scheduler", None):
        return True
    return get_scheduler() in (None, dask.threaded.get)


def tasks_run_here() -> bool:
    """True when a write computed now runs every task in this process (dask's threaded or
    synchronous scheduler, or no dask at all): no task of it can then be cut off by the end of
    another process, and each put removes its own temp file on any error."""
    if threads_run_here():
        return True
    import dask.local
    from dask.base import get_scheduler

    return get_scheduler() is dask.local.get_sync


def default_cluster_is_local() -> bool:
    """True when dask's default scheduler is a distributed client of a ``LocalCluster`` made in
    this process: its workers share this machine, so what moves between them is copied between
    local processes, not sent over a network (``auto`` then writes misaligned sources direct)."""
    if "distributed" not in sys.modules:  # no client can exist
        return False
    from dask.base import get_scheduler
    from distributed import Client, LocalCluster

    client = getattr(get_scheduler(), "__self__", None)  # a client's ``get``, default or set
    return isinstance(client, Client) and isinstance(client.cluster, LocalCluster)


def default_scheduler_is_local() -> bool:
    """True when dask's default scheduler (no ``scheduler=`` given) is its threaded or synchronous
    one, whose tasks share this process's memory (callbacks may be active: they watch the tasks,
    they do not move them)."""
    import dask
    import dask.local
    import dask.threaded
    from dask.base import get_scheduler

    configured = dask.config.get("scheduler", None)
    if not configured and "distributed" not in sys.modules:
        # no client can exist: dask would import distributed to look for one (a fraction of a
        # second a write would spend between its checks and its first byte)
        return True
    if configured and _local_without_client(configured):
        return True  # dask's get_scheduler would import distributed (0.2 s) before answering
    get = get_scheduler()
    return get is None or get in (dask.threaded.get, dask.local.get_sync)


# dask's names of its threaded and synchronous schedulers (``scheduler=`` and its setting)
LOCAL_SCHEDULERS = frozenset({"threads", "threading", "sync", "synchronous", "single-threaded"})


def _local_without_client(scheduler: Any) -> bool:
    """True when ``scheduler`` (a ``scheduler=`` value or setting) is dask's threaded or
    synchronous scheduler, by name or as its function, and distributed is not imported: then no
    client exists that could take the name over, and what dask's ``get_scheduler`` answers is
    known without letting it import distributed to look for one."""
    import dask.local
    import dask.threaded

    if "distributed" in sys.modules:
        return False
    if isinstance(scheduler, str):
        return scheduler.lower() in LOCAL_SCHEDULERS
    return scheduler is dask.threaded.get or scheduler is dask.local.get_sync


def dask_task_spec() -> Any:
    """dask's graph node classes (``dask._task_spec``: ``Task``, ``TaskRef``, ``List``,
    ``DataNode``), private, which a graph optimization must build and read; None on a dask
    without them (before 2024.12: full loads then run the block graph)."""
    try:
        import dask._task_spec as spec
    except ImportError:
        return None
    return spec


def reset_dask_threaded_pools() -> None:
    """Forget dask's threaded-scheduler pools in a forked child.

    dask keeps them per process and has no fork handler: the first ``compute()`` of a child
    forked after one in the parent would queue its tasks to threads that do not exist. Our
    writes and reads run on that scheduler by default, so the child gets new pools.
    """
    threaded: Any = sys.modules.get("dask.threaded")
    if threaded is None:
        return
    from collections import defaultdict

    fresh: dict[str, Callable[[], Any]] = {
        "default_pool": lambda: None,
        "pools": lambda: defaultdict(dict),
        "pools_lock": threading.Lock,
    }
    for name, make in fresh.items():
        if hasattr(threaded, name):
            setattr(threaded, name, make())


def classic_dask(data: Any) -> Any:
    """``data`` as a ``dask.array.Array`` when it is an array of the expression-based
    ``dask_array`` package (pip ``dask-array``; xarray's chunk manager once
    ``dask_array.xarray.register()`` ran), else unchanged. Its graph and keys come through the
    dask collection protocol (``__dask_graph__``, ``__dask_keys__``): the same blocks, named as
    that array names them, nothing computed and nothing rechunked, so every front end keeps one
    task per shard where the chunks are the shards."""
    if not type(data).__module__.startswith("dask_array") or not hasattr(data, "__dask_graph__"):
        return data
    import dask.array as da
    import numpy as np
    from dask.core import flatten

    keys = list(flatten(data.__dask_keys__()))
    name = keys[0][0] if keys and isinstance(keys[0], tuple) else str(data.name)
    meta = getattr(data, "_meta", None)
    if meta is None:
        meta = np.empty((0,) * data.ndim, dtype=data.dtype)
    return da.Array(data.__dask_graph__(), name, chunks=data.chunks, meta=meta)


def classic_dataset(ds: Any) -> Any:
    """An xarray Dataset whose variables that hold ``dask_array`` arrays hold them as
    ``dask.array.Array`` (:func:`classic_dask`), the same blocks; others unchanged."""
    swapped = {
        name: var.copy(deep=False, data=classic_dask(var.data))
        for name, var in ds.variables.items()
        # chunked variables only: ``.data`` of a lazy backend array would load it
        if var.chunks is not None and classic_dask(var.data) is not var.data
    }
    if not swapped:
        return ds
    coords = {n: v for n, v in swapped.items() if n in ds.coords}
    data = {n: v for n, v in swapped.items() if n not in ds.coords}
    return ds.assign_coords(coords).assign(data)


# zarr-python's rectilinear chunk grids are experimental, refused unless a config flag is set
# (zarr >= 3.2, ``array.rectilinear_chunks``); shardwise sets it only while it parses or stores
# metadata, never for the process, counted so that threads nest (the first in sets it, the last
# out restores what was there)
_flag_lock = threading.Lock()
_flag_users = 0
_flag_setting: Any = None


@contextlib.contextmanager
def rectilinear_grids() -> Any:
    """zarr's ``array.rectilinear_chunks`` flag on while the block runs (then as it was)."""
    global _flag_users, _flag_setting
    import zarr

    with _flag_lock:
        _flag_users += 1
        if _flag_users == 1 and not zarr.config.get("array.rectilinear_chunks", False):
            _flag_setting = zarr.config.set({"array.rectilinear_chunks": True})
    try:
        yield
    finally:
        with _flag_lock:
            _flag_users -= 1
            if _flag_users == 0 and _flag_setting is not None:
                _flag_setting.__exit__(None, None, None)
                _flag_setting = None


def with_rectilinear_grids[**P, R](fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run inside :func:`rectilinear_grids` (it parses or stores zarr metadata)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with rectilinear_grids():
            return fn(*args, **kwargs)

    return run
