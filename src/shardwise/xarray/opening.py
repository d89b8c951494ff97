"""``shardwise.open_dataset`` and ``shardwise.open_datatree``: a Zarr group as an
``xarray.Dataset``, or a group and every group below it as an ``xarray.DataTree``, through the
shardwise engine (``xr.open_dataset(..., engine="shardwise", chunks={})`` and
``xr.open_datatree`` alike, with their keywords checked)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import InvalidTypeError, InvalidValueError
from .backend import ShardwiseBackendEntrypoint


def open_dataset(
    store: Any,
    *,
    group: str | None = None,
    drop_variables: str | Iterable[str] | None = None,
    chunks: Any = "shards",
    threads: int | None = None,
    cache_indexes: bool = False,
    **kwargs: Any,
) -> Any:
    """Open a Zarr group as an :class:`xarray.Dataset` with the shardwise engine.

    The same as :func:`xarray.open_dataset` with ``engine="shardwise", chunks={}`` by default.
    It opens stores written by xarray and zarr-python too (unsharded arrays are read through
    zarr-python).

    Parameters
    ----------
    store : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        A zarr ``Store``, a local path, a URL or an icechunk ``Session`` (read-only or
        writable: a writable one reads its uncommitted changes too).
    group : str, optional
        The group to open (default: the root), as in ``xr.open_dataset``.
    drop_variables : str or iterable of str, optional
        Variables not to open, as in ``xr.open_dataset``.
    chunks : "shards", "auto", int, dict or None, default "shards"
        ``"shards"`` (the same as xarray's ``chunks={}``) gives dask arrays with one chunk per
        shard (per stored chunk for unsharded arrays); ``None`` gives lazily indexed
        numpy-backed variables; any other xarray ``chunks`` value works too, and dask chunks
        that split shards read only the inner chunks each needs.
    threads : int, optional
        Caps the threads that decode inner chunks.
    cache_indexes : bool, default False
        Cache shard indexes on non-local stores (local files always cache them, validated
        against the file).
    **kwargs
        The other keyword arguments of ``xr.open_dataset`` (CF decoding options,
        ``consolidated``, ``storage_options``, ...).

    Returns
    -------
    xarray.Dataset
        The dataset, its variables lazy (dask arrays, or lazily indexed with ``chunks=None``).

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A ``chunks`` (or another keyword) of the wrong type, or a value it does not accept.

    Examples
    --------
    >>> import numpy as np, xarray as xr, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> ds = xr.Dataset({"t": (("y", "x"), np.ones((64, 64)))})
    >>> _ = shardwise.to_zarr(ds, store, shards={"y": 32, "x": 32})
    >>> shardwise.open_dataset(store).t.chunks  # a dask chunk per shard
    ((32, 32), (32, 32))
    """
    import xarray as xr

    return _open(
        xr.open_dataset, store, group, drop_variables, chunks, threads, cache_indexes, kwargs
    )


def open_datatree(
    store: Any,
    *,
    group: str | None = None,
    drop_variables: str | Iterable[str] | None = None,
    chunks: Any = "shards",
    threads: int | None = None,
    cache_indexes: bool = False,
    **kwargs: Any,
) -> Any:
    """Open a Zarr group and every group below it as an ``xarray.DataTree`` with the shardwise
    engine.

    The same as ``xr.open_datatree(store, engine="shardwise", chunks={})`` by default: each
    group's variables as :func:`open_dataset` opens them, coordinates inherited as xarray
    inherits them.

    Parameters
    ----------
    store : zarr.abc.store.Store, str, os.PathLike or icechunk.Session
        A zarr ``Store``, a local path, a URL or an icechunk ``Session`` (read-only or
        writable: a writable one reads its uncommitted changes too).
    group : str, optional
        The group at the root of the tree (default: the store's root).
    drop_variables : str or iterable of str, optional
        Variables not to open, in every group.
    chunks : "shards", "auto", int, dict or None, default "shards"
        As in :func:`open_dataset`, for every group.
    threads : int, optional
        Caps the threads that decode inner chunks.
    cache_indexes : bool, default False
        Cache shard indexes on non-local stores.
    **kwargs
        The other keyword arguments of ``xr.open_datatree`` (CF decoding options,
        ``consolidated``, ``storage_options``, ...).

    Returns
    -------
    xarray.DataTree
        The tree, its variables lazy.

    Raises
    ------
    InvalidTypeError, InvalidValueError
        A ``chunks`` (or another keyword) of the wrong type, or a value it does not accept.

    Examples
    --------
    >>> import numpy as np, xarray as xr, zarr, shardwise
    >>> store = zarr.storage.MemoryStore()
    >>> ds = xr.Dataset({"t": ("x", np.arange(64.0))})
    >>> _ = shardwise.to_zarr(xr.DataTree.from_dict({"/a": ds, "/b": ds * 2}), store,
    ...                       shards={"x": 32})
    >>> tree = shardwise.open_datatree(store)
    >>> sorted(tree.children), float(tree["b"].t.sum())
    (['a', 'b'], 4032.0)
    """
    import xarray as xr

    return _open(
        xr.open_datatree, store, group, drop_variables, chunks, threads, cache_indexes, kwargs
    )


def _open(
    opener: Any,
    store: Any,
    group: Any,
    drop_variables: Any,
    chunks: Any,
    threads: Any,
    cache_indexes: Any,
    kwargs: dict[str, Any],
) -> Any:
    """``opener`` (xarray's ``open_dataset`` or ``open_datatree``) with the shardwise engine,
    ``chunks="shards"`` as the engine's preferred chunks (``{}``)."""
    _check_chunks(chunks)
    return opener(
        store,
        engine=ShardwiseBackendEntrypoint,
        group=group,
        drop_variables=drop_variables,
        chunks={} if isinstance(chunks, str) and chunks == "shards" else chunks,
        threads=threads,
        cache_indexes=cache_indexes,
        **kwargs,
    )


def _check_chunks(chunks: Any) -> None:
    """``chunks=`` of :func:`open_dataset`: what xarray takes, refused here with its name."""
    accepted = "'shards', 'auto', an int, a dict of dimension name -> chunks, or None"
    if isinstance(chunks, str):
        if chunks not in ("shards", "auto"):
            raise InvalidValueError(f"chunks must be {accepted}, got {chunks!r}")
    elif not (
        chunks is None
        or isinstance(chunks, dict | tuple)
        or (isinstance(chunks, int) and not isinstance(chunks, bool))
    ):
        raise InvalidTypeError(
            f"chunks must be {accepted}, got {chunks!r} ({type(chunks).__name__})"
        )
