"""The xarray engine ``shardwise``: lazy, shard-aligned reads of Zarr stores.

``xr.open_dataset(path, engine="shardwise")`` (or :func:`shardwise.open_dataset`) opens a Zarr
group exactly as xarray's ``zarr`` engine does -- the same dimension names, attributes, CF
decoding and encoding -- with two differences for sharded arrays:

* ``encoding["preferred_chunks"]`` is the *shard* shape, so ``chunks={}`` gives one dask chunk
  per shard instead of one per inner chunk;
* values are read by :class:`~shardwise.engine.read.ShardReader`: a selection reads only the inner
  chunks it needs, as coalesced byte ranges after one (cached) request for the shard index.

Arrays without a top-level sharding codec (xarray writes coordinates unsharded, zarr v2 arrays)
are read through zarr-python, as the ``zarr`` engine reads them. Opening reads metadata only.
``xr.open_datatree`` and ``xr.open_groups`` open every group below one, the same way.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import zarr
from xarray import Variable
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.backends.common import AbstractDataStore
from xarray.backends.store import StoreBackendEntrypoint
from xarray.backends.zarr import ZarrStore
from xarray.core import indexing

from ..codec.metadata import info_from_metadata
from ..compat import datatree_from_groups, normalize_path, with_rectilinear_grids
from ..core import args
from ..engine.gather import read_outer, read_vectorized
from ..engine.load import read_selection
from ..engine.read import ShardReader
from ..engine.whole import install as install_whole_reads
from ..errors import InvalidTypeError, ReadOnlyError, UnsupportedCodecError
from ..storage.icechunk import is_session
from ..storage.nodes import node_errors, walk_groups
from ..storage.store import ShardStore

__all__ = [
    "ShardwiseBackendArray",
    "ShardwiseBackendEntrypoint",
    "ShardwiseDataStore",
]


class ShardwiseBackendArray(BackendArray):
    """A lazily indexed sharded array for xarray. Thread-safe; pickles without its caches."""

    __slots__ = ("dtype", "reader", "shape")

    def __init__(self, reader: ShardReader, dtype: np.dtype[Any] | None = None) -> None:
        self.reader = reader
        self.shape = reader.shape
        self.dtype = reader.dtype if dtype is None else dtype

    def _finish(self, value: np.ndarray) -> np.ndarray:
        if value.dtype != self.dtype:
            value = value.astype(self.dtype)
        return value

    def _basic(self, key: tuple[Any, ...]) -> np.ndarray:
        if all(isinstance(k, slice | int | np.integer) for k in key):
            # ints and slices: straight into one new array (read_array's path, no dask)
            return self._finish(read_selection(self.reader, key))
        return self._finish(read_outer(self.reader, key))

    def _vectorized(self, key: tuple[Any, ...]) -> np.ndarray:
        return self._finish(read_vectorized(self.reader, key))

    async def async_getitem(self, key: indexing.ExplicitIndexer) -> Any:
        # reads block on local files or zarr's own event loop: run them off the caller's loop
        return await asyncio.to_thread(self.__getitem__, key)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> Any:
        method = self._vectorized if isinstance(key, indexing.VectorizedIndexer) else self._basic
        return indexing.explicit_indexing_adapter(
            _without_empty_reversed_slices(key, self.shape),
            self.shape,
            indexing.IndexingSupport.VECTORIZED,
            method,
        )


def _without_empty_reversed_slices(
    key: indexing.ExplicitIndexer, shape: tuple[int, ...]
) -> indexing.ExplicitIndexer:
    """``key`` with empty slices as ``slice(0, 0)``: xarray cannot flip an empty negative step."""
    parts = key.tuple
    if not any(isinstance(k, slice) and (k.step or 1) < 0 for k in parts):
        return key
    fixed = tuple(
        slice(0, 0) if isinstance(k, slice) and not len(range(*k.indices(n))) else k
        for k, n in zip(parts, shape, strict=True)
    )
    return type(key)(fixed)


# -- the data store -------------------------------------------------------------------------------


def _reader(array: Any, threads: int | None, cache_indexes: bool = False) -> ShardReader | None:
    """A reader for a zarr array with a top-level sharding codec, else None."""
    if getattr(array.metadata, "zarr_format", None) != 3:
        return None
    try:
        info = info_from_metadata(array.metadata)
    except UnsupportedCodecError:
        return None
    install_whole_reads()  # full loads of the dask arrays xarray builds: one read each
    return ShardReader(
        info=info,
        store=ShardStore(array.store, array.path),
        threads=threads,
        cache_indexes=cache_indexes,
    )


class ShardwiseDataStore(AbstractDataStore):
    """A read-only xarray data store over one Zarr group.

    Attributes, dimensions and per-variable encodings come from xarray's own ``ZarrStore`` (so
    they match the ``zarr`` engine exactly); the data of sharded arrays is served by shardwise.
    """

    def __init__(
        self, zarr_store: ZarrStore, *, threads: int | None = None, cache_indexes: bool = False
    ) -> None:
        self.zarr_store = zarr_store
        self.threads = threads
        self.cache_indexes = cache_indexes

    @classmethod
    @with_rectilinear_grids
    def open(cls, store: Any, *, group: str | None = None, **kwargs: Any) -> ShardwiseDataStore:
        """Open the group ``group`` of ``store`` (a path, URL, zarr Store or icechunk Session):
        metadata only. Takes the keywords of :meth:`open_tree` but ``subgroups``."""
        return cls.open_tree(store, group=group, subgroups=False, **kwargs)["/"]

    @classmethod
    @with_rectilinear_grids
    def open_tree(
        cls,
        store: Any,
        *,
        group: str | None = None,
        consolidated: bool | None = None,
        storage_options: dict[str, Any] | None = None,
        zarr_format: int | None = None,
        use_zarr_fill_value_as_mask: bool | None = None,
        threads: int | None = None,
        cache_indexes: bool = False,
        subgroups: bool = True,
    ) -> dict[str, ShardwiseDataStore]:
        """A data store for the group ``group`` of ``store`` (at ``"/"``) and, with
        ``subgroups``, for every group below it (``"/a"``, ``"/a/b"``, ...): the store and the
        group are opened once (metadata only), every data store reads through them.

        Consolidated metadata is used when present (``consolidated=None``), required with
        ``True`` and ignored with ``False``.
        """
        args.optional_str("group", group)
        args.optional_flags(consolidated=consolidated)
        args.mapping("storage_options", storage_options)
        threads = args.thread_count("threads", threads)
        args.flags(cache_indexes=cache_indexes)
        if isinstance(store, os.PathLike):
            store = os.fspath(store)
        if is_session(store):  # an icechunk Session (read-only or writable) reads its store
            store = store.store
        kwargs: dict[str, Any] = {}
        if storage_options:
            kwargs["storage_options"] = storage_options
        with node_errors(store, group, "group"):  # zarr's errors name its StorePath
            zgroup = zarr.open_group(
                store,
                mode="r",
                path=group or "",
                zarr_format=zarr_format,  # type: ignore[arg-type]
                use_consolidated=consolidated,
                **kwargs,
            )
        if use_zarr_fill_value_as_mask is None:
            # the zarr engine's rule: zarr's fill_value masks values in format 2 only
            use_zarr_fill_value_as_mask = zgroup.metadata.zarr_format == 2
        groups = walk_groups(zgroup) if subgroups else iter([("/", zgroup)])
        return {
            path: cls(
                ZarrStore(
                    node,
                    mode="r",
                    close_store_on_close=zgroup.store is not store,
                    use_zarr_fill_value_as_mask=use_zarr_fill_value_as_mask,
                ),
                threads=threads,
                cache_indexes=cache_indexes,
            )
            for path, node in groups
        }

    def open_store_variable(self, name: str) -> Variable:
        var: Variable = self.zarr_store.open_store_variable(name)
        reader = _reader(self.zarr_store.members[name], self.threads, self.cache_indexes)
        if reader is None:
            return var
        dtype = var.dtype
        if dtype.kind != reader.dtype.kind or dtype.itemsize != reader.dtype.itemsize:
            return var  # e.g. variable-length strings xarray maps to object: zarr reads them
        data = indexing.LazilyIndexedArray(ShardwiseBackendArray(reader, dtype))
        encoding = dict(var.encoding)
        lay = reader.info.layout
        shards: Any = lay.shard_shape if lay.is_regular else lay.dask_chunks()
        encoding["preferred_chunks"] = dict(zip(var.dims, shards, strict=True))
        return Variable(var.dims, data, var.attrs, encoding)

    def get_variables(self) -> dict[str, Variable]:
        return {k: self.open_store_variable(k) for k in self.zarr_store.array_keys()}

    def get_attrs(self) -> dict[str, Any]:
        return dict(self.zarr_store.get_attrs())

    def get_dimensions(self) -> dict[str, int]:
        return dict(self.zarr_store.get_dimensions())

    def close(self) -> None:
        self.zarr_store.close()


# -- the entry point ------------------------------------------------------------------------------


class ShardwiseBackendEntrypoint(BackendEntrypoint):
    """Open Zarr stores with shard-aligned, range-reading lazy arrays (``engine="shardwise"``)."""

    description = "Open Zarr v3 sharded stores with shard-aligned lazy reads (shardwise)"
    url = "https://github.com/shardwise/shardwise"
    supports_groups = True  # open_datatree and open_groups_as_dict
    open_dataset_parameters = (
        "filename_or_obj",
        "mask_and_scale",
        "decode_times",
        "concat_characters",
        "decode_coords",
        "drop_variables",
        "use_cftime",
        "decode_timedelta",
        "group",
        "mode",
        "consolidated",
        "storage_options",
        "zarr_format",
        "use_zarr_fill_value_as_mask",
        "threads",
        "cache_indexes",
    )

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        # never by extension: ".zarr" paths belong to xarray's own zarr engine
        return isinstance(filename_or_obj, ShardwiseDataStore)

    @with_rectilinear_grids
    def open_dataset(  # type: ignore[override]
        self,
        filename_or_obj: Any,
        *,
        mask_and_scale: bool = True,
        decode_times: Any = True,
        concat_characters: bool = True,
        decode_coords: Any = True,
        drop_variables: str | Iterable[str] | None = None,
        use_cftime: bool | None = None,
        decode_timedelta: Any = None,
        group: str | None = None,
        mode: str = "r",
        consolidated: bool | None = None,
        storage_options: dict[str, Any] | None = None,
        zarr_format: int | None = None,
        use_zarr_fill_value_as_mask: bool | None = None,
        threads: int | None = None,
        cache_indexes: bool = False,
    ) -> Any:
        _read_only(mode)
        if isinstance(filename_or_obj, ShardwiseDataStore):
            store = filename_or_obj
        else:
            store = ShardwiseDataStore.open(
                normalize_path(filename_or_obj),
                group=group,
                consolidated=consolidated,
                storage_options=storage_options,
                zarr_format=zarr_format,
                use_zarr_fill_value_as_mask=use_zarr_fill_value_as_mask,
                threads=threads,
                cache_indexes=cache_indexes,
            )
        decoders = {
            "mask_and_scale": mask_and_scale,
            "decode_times": decode_times,
            "concat_characters": concat_characters,
            "decode_coords": decode_coords,
            "drop_variables": drop_variables,
            "use_cftime": use_cftime,
            "decode_timedelta": decode_timedelta,
        }
        return _decode(store, decoders)

    @with_rectilinear_grids
    def open_datatree(self, filename_or_obj: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Every group at and below ``group`` (default: the root) as one ``DataTree``, each
        with the lazy arrays of :meth:`open_dataset`; coordinates are inherited as xarray
        inherits them. Takes the keywords of :meth:`open_groups_as_dict`."""
        return datatree_from_groups(self.open_groups_as_dict(filename_or_obj, **kwargs))

    @with_rectilinear_grids
    def open_groups_as_dict(  # type: ignore[override]
        self,
        filename_or_obj: Any,
        *,
        group: str | None = None,
        mode: str = "r",
        consolidated: bool | None = None,
        storage_options: dict[str, Any] | None = None,
        zarr_format: int | None = None,
        use_zarr_fill_value_as_mask: bool | None = None,
        threads: int | None = None,
        cache_indexes: bool = False,
        **decoders: Any,
    ) -> dict[str, Any]:
        """A dataset per group at and below ``group``, by path as xarray's zarr engine names
        them (``"/"``, ``"/a"``; relative to ``group`` when it is given: ``"."``, ``"a"``).
        ``decoders`` are :meth:`open_dataset`'s CF options and ``drop_variables``, for every
        group. The store is opened once; a missing group is an :class:`ArrayNotFoundError`, an
        array there a :class:`NotAGroupError`, both naming it."""
        _read_only(mode)
        unknown = sorted(set(decoders) - set(_DECODERS))
        if unknown:
            raise InvalidTypeError(
                f"open_groups_as_dict got unexpected keyword argument(s) {unknown}: it takes "
                f"{', '.join(_DECODERS)} and the keywords of open_dataset"
            )
        stores = ShardwiseDataStore.open_tree(
            normalize_path(filename_or_obj),
            group=group,
            consolidated=consolidated,
            storage_options=storage_options,
            zarr_format=zarr_format,
            use_zarr_fill_value_as_mask=use_zarr_fill_value_as_mask,
            threads=threads,
            cache_indexes=cache_indexes,
        )
        try:
            return {
                ((path.removeprefix("/") or ".") if group else path): _decode(store, decoders)
                for path, store in stores.items()
            }
        except BaseException:
            for store in stores.values():
                store.close()
            raise


# open_dataset's keywords that decode (and drop) variables, the same for every group of a tree
_DECODERS = (
    "mask_and_scale",
    "decode_times",
    "concat_characters",
    "decode_coords",
    "drop_variables",
    "use_cftime",
    "decode_timedelta",
)


def _read_only(mode: str) -> None:
    if mode != "r":
        raise ReadOnlyError(f"the shardwise engine opens stores read-only (mode='r'): {mode!r}")


def _decode(store: ShardwiseDataStore, decoders: dict[str, Any]) -> Any:
    """The dataset of one data store, CF-decoded as xarray decodes it; the store is closed
    when that fails."""
    try:
        return StoreBackendEntrypoint().open_dataset(store, **decoders)
    except BaseException:
        store.close()
        raise
