"""Checks and layout for an xarray write, all done before anything is written.

Input checks (names, modes, append dimension against the stored arrays) and the inner chunk and
shard shapes of new variables (from ``encoding``, ``shards=`` or the defaults).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any, Literal

import numpy as np
from zarr.abc.store import Store

from ..codec.metadata import default_compressors
from ..core import args
from ..core.planner import default_layout
from ..core.sizing import DEFAULT_CHUNK_BYTES, default_shards, dividing_chunks, whole_chunks
from ..core.targets import parse_target
from ..errors import InvalidTypeError, InvalidValueError
from ..storage.nodes import open_group
from ..storage.store import JOURNAL

WriteMode = Literal["w", "w-", "a", "a-", "r+"]
# xarray's name for a DataArray without a usable name (kept so xr.open_dataarray reads it back)
_DATAARRAY_VARIABLE = "__xarray_dataarray_variable__"
# names a variable cannot take: each is already a key (or a directory step) in the store
_STORE_KEYS = frozenset({"zarr.json", JOURNAL, ".", ".."})
_DATAARRAY_NAME = "__xarray_dataarray_name__"
# at most this many small dask chunks per shard become the default inner chunks (an index of
# 64 KiB); beyond, the default rule's chunks of about 1 MiB
MAX_DASK_CHUNKS_PER_SHARD = 4096


# -- checks ---------------------------------------------------------------------------------------


def as_dataset(obj: Any) -> Any:
    import xarray as xr

    if isinstance(obj, xr.Dataset):
        return obj
    if isinstance(obj, xr.DataArray):
        # as DataArray.to_zarr: xr.open_dataarray reads these conventions back
        if obj.name is None:
            return obj.to_dataset(name=_DATAARRAY_VARIABLE)
        if obj.name in obj.coords or obj.name in obj.dims:
            ds = obj.to_dataset(name=_DATAARRAY_VARIABLE)
            ds.attrs[_DATAARRAY_NAME] = obj.name
            return ds
        return obj.to_dataset()
    raise InvalidTypeError(
        f"to_zarr writes an xarray Dataset, DataArray or DataTree, not {type(obj).__name__}"
    )


def check_keywords(
    *,
    region: Any,
    append_dim: Any,
    encoding: Any,
    group: Any,
    flags: dict[str, Any],
    optional_flags: dict[str, Any],
    write_empty_chunks: Any,
) -> None:
    """The keywords of :func:`to_zarr` that are xarray's, not about layout, checked before any
    I/O (those write_array takes too are checked by ``WriteOptions.checked``);
    ``write_empty_chunks`` takes ``None`` as ``Dataset.to_zarr`` does (:func:`empty_chunks`)."""
    args.mapping("encoding", encoding)
    accepted = "a dict of dimension name -> slice (or 'auto'), 'auto' or None"
    if isinstance(region, str) and region != "auto":
        raise InvalidValueError(f"region must be {accepted}, got {region!r}")
    if not (region is None or isinstance(region, Mapping | str)):
        raise InvalidTypeError(
            f"region must be {accepted}, got {region!r} ({type(region).__name__})"
        )
    if not isinstance(append_dim, Hashable):
        raise InvalidTypeError(
            f"append_dim must be a dimension name (a str) or None, got {append_dim!r}"
        )
    args.store_path("group", group)
    args.flags(**flags)
    args.optional_flags(**optional_flags, write_empty_chunks=write_empty_chunks)


def check_names(ds: Any) -> None:
    """Refuse names zarr or xarray cannot store, before any I/O (xarray's messages for types)."""
    for name, var in ds.variables.items():
        if name is not None:  # None is xarray's own: stored as "__values__", read back as None
            if not isinstance(name, str):
                raise InvalidTypeError(
                    f"Invalid name {name!r} for DataArray or Dataset key: must be either a "
                    "string or None for serialization to zarr"
                )
            if not name:
                raise InvalidValueError(
                    f"Invalid name {name!r} for DataArray or Dataset key: string must be "
                    "length 1 or greater for serialization to zarr"
                )
            if "/" in name:
                raise InvalidValueError(
                    f"variable name {name!r} contains '/': zarr would store it as a nested "
                    f"group path; rename it (e.g. ds.rename({{{name!r}: "
                    f"{name.replace('/', '_')!r}}}))"
                )
            if name in _STORE_KEYS:
                raise InvalidValueError(
                    f"variable name {name!r} is a key the store itself uses (zarr.json holds "
                    f"the group's metadata, {JOURNAL} the writer's records, '.' and '..' are "
                    f"directories): rename it (e.g. ds.rename({{{name!r}: "
                    f"{name.strip('.').replace('.', '_') or 'var'!r}}}))"
                )
            if name.startswith("__") and name != _DATAARRAY_VARIABLE:
                raise InvalidValueError(
                    f"variable name {name!r} starts with '__', which the zarr v3 specification "
                    "reserves for internal use; rename it"
                )
        dims = tuple(var.dims)
        if len(set(dims)) != len(dims):
            dup = sorted({str(d) for d in dims if dims.count(d) > 1})
            raise InvalidValueError(
                f"variable {name!r} has duplicate dimension names {dims} (repeated: {dup}); "
                "zarr dimension names must be unique per array: rename one of them"
            )
        for d in dims:
            if not isinstance(d, str):
                raise InvalidValueError(
                    f"variable {name!r}: dimension names must be strings, got {d!r}"
                )


def as_dict(value: Any, name: Hashable) -> dict[str, Any]:
    try:
        return dict(value)
    except (TypeError, ValueError):
        # a ValueError, as xarray's own message for it
        raise InvalidValueError(
            f"encoding[{name!r}] must be castable to a dictionary of encoding keys, got {value!r}"
        ) from None


def empty_chunks(value: bool | None) -> bool:
    """``write_empty_chunks=`` as xarray means it: ``None`` (``Dataset.to_zarr``'s default) is
    zarr's configured default (``array.write_empty_chunks``, False unless changed)."""
    if value is None:
        import zarr

        return bool(zarr.config.get("array.write_empty_chunks"))
    return bool(value)


def check_group_names(tree: Any) -> None:
    """Refuse a group of a DataTree whose name cannot be stored (``zarr.json``, ``..``, the
    writer's records' ``.shardwise``, an empty name), before any I/O."""
    for node in tree.subtree:
        if node is not tree and (not node.name or node.name in _STORE_KEYS or "/" in node.name):
            raise InvalidValueError(
                f"DataTree group {node.path!r}: its name {node.name!r} cannot be stored (zarr.json "
                f"holds a node's metadata, {JOURNAL} the writer's records, '.' and '..' are "
                "directories, '/' separates groups): rename it"
            )


def shards_by_dimension(shards: Any, obj: Any) -> Mapping[Hashable, int | None] | str | None:
    """``shards=`` as sizes per dimension name: a mapping as given; a shape (a tuple or list of
    positive ints, as :func:`shardwise.write_array` takes it) gives its sizes, by position, to
    the dimensions of every data variable of that many dimensions (all of them must have that
    many, and agree); anything else is refused naming ``shards``."""
    if shards is None or isinstance(shards, Mapping):
        return shards
    if isinstance(shards, str):  # a target: "2GB", "XY", "one per time step" (checked here)
        parse_target(shards)
        return shards
    accepted = (
        "sizes per dimension name ({'time': 365}) or a shape (10, 10) with a size per "
        "dimension of the data variables"
    )
    if not isinstance(shards, tuple | list):
        raise InvalidTypeError(
            f"shards must be {accepted}, got {shards!r} ({type(shards).__name__})"
        )
    if not shards or not all(_positive_int(n) for n in shards):
        raise InvalidValueError(f"shards must be {accepted}: positive sizes, got {shards!r}")
    import xarray as xr

    if isinstance(obj, xr.DataTree):
        datasets = [node.to_dataset(inherit=False) for node in obj.subtree]
    else:
        datasets = [as_dataset(obj)]
    out: dict[Hashable, int] = {}
    for ds in datasets:
        for name, var in ds.data_vars.items():
            if var.ndim and var.ndim != len(shards):
                raise InvalidValueError(
                    f"shards={tuple(shards)} has {len(shards)} size(s), but data variable "
                    f"{name!r} has {var.ndim} dimension(s) {tuple(map(str, var.dims))}: give "
                    "sizes per dimension name instead (e.g. shards={"
                    + ", ".join(f"{str(d)!r}: {n}" for d, n in zip(var.dims, shards, strict=False))
                    + "})"
                )
            for dim, n in zip(var.dims, shards, strict=False):
                if out.setdefault(dim, int(n)) != int(n):
                    raise InvalidValueError(
                        f"shards={tuple(shards)} gives dimension {dim!r} two sizes ({out[dim]} "
                        f"and {int(n)}): the data variables order their dimensions "
                        "differently; give sizes per dimension name instead"
                    )
    if not out:
        raise InvalidValueError(
            f"shards={tuple(shards)}: the data has no data variable with dimensions to apply it to"
        )
    return out


def choose_mode(mode: WriteMode | None, append_dim: Hashable | None, region: Any) -> WriteMode:
    if mode is None:
        mode = "a" if append_dim is not None else "r+" if region is not None else "w-"
    args.check_mode(mode, ("w", "w-", "a", "a-", "r+"))
    # each message also carries xarray's own wording, which callers' code and tests match on
    if append_dim is not None and mode not in ("a", "a-"):
        raise InvalidValueError(
            f"append_dim needs mode='a' (or None), got mode={mode!r} "
            "(cannot set append_dim unless mode='a' or mode=None)"
        )
    if region is not None and mode not in ("a", "a-", "r+"):
        raise InvalidValueError(
            f"region needs mode='r+' or 'a' (or None), got mode={mode!r} "
            "(cannot set region unless mode='a', mode='a-', mode='r+' or mode=None)"
        )
    return mode


def stored_dims(store: Store, group: str | None) -> dict[str, tuple[str, ...]] | None:
    """The dimension names of every array in ``group`` (None when there is no group)."""
    g = open_group(store, group)
    if g is None:
        return None
    out = {}
    for name, arr in g.arrays():
        names = getattr(arr.metadata, "dimension_names", None)
        if names is None:  # zarr v2, as xarray writes it
            names = arr.attrs.get("_ARRAY_DIMENSIONS") or ()
        out[name] = tuple(str(n) for n in names if n is not None)
    return out


def check_append_dim(
    stored: dict[str, tuple[str, ...]] | None, group: str | None, append_dim: Hashable
) -> None:
    dims = {d for names in (stored or {}).values() for d in names}
    if dims and append_dim not in dims:
        where = f"group {group!r}" if group else "the store"
        raise InvalidValueError(
            f"cannot append along {append_dim!r}: {where} has no such dimension "
            f"(append_dim={append_dim!r} does not match any existing dataset dimensions "
            f"{sorted(dims)}); nothing was written"
        )
    # no arrays at all: xarray's own check below reports it


# -- layout of new variables ----------------------------------------------------------------------


def _encoded_shape(value: Any, ndim: int, name: Any, key: str) -> tuple[int, ...] | None:
    """``encoding[key]`` as a shape of ``ndim`` positive ints.

    None when absent, ``"auto"`` or of another length (as xarray, which drops chunks of another
    dimensionality, e.g. after ``isel``); a TypeError, as xarray's, for entries that are not
    ints.
    """
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        value = (int(value),) * ndim
    if not isinstance(value, tuple | list):
        raise InvalidTypeError(
            f"encoding[{key!r}] of variable {name!r} must be an int or a tuple of ints, "
            f"got {value!r}"
        )
    if len(value) != ndim:
        return None
    if not all(isinstance(x, int | np.integer) and not isinstance(x, bool) for x in value):
        raise InvalidTypeError(
            f"zarr {key} sizes in encoding[{key!r}] must be an int or a tuple of ints; "
            f"variable {name!r} has {value!r}"
        )
    if not all(_positive_int(x) for x in value):
        raise InvalidValueError(
            f"encoding[{key!r}] of variable {name!r} must be positive: {value!r}"
        )
    return tuple(int(x) for x in value)


def _positive_int(x: Any) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool) and bool(x > 0)


def _named_shard(value: int | None, length: int) -> int:
    """A shard length from ``shards={dim: value}``: None (or a dimension not named) is whole."""
    return max(1, length) if value is None else int(value)


def _divides(chunks: tuple[int, ...], shards: tuple[int, ...]) -> bool:
    return all(s % c == 0 for c, s in zip(chunks, shards, strict=True))


def _layout_for(
    name: Any,
    var: Any,
    enc: Mapping[str, Any],
    explicit: bool,
    shards_kw: Mapping[Hashable, int | None] | str | None,
    shard_bytes: int,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(inner chunks, shards) of a new variable; see :func:`to_zarr` for the order of rules.

    Inner chunks that do not divide the shards are an error when both come from the same
    encoding (as in xarray), except for an encoding read from a store whose chunks were
    changed since; kept chunks are replaced when ``shards=`` sets new shards.
    """
    shape, ndim = tuple(int(n) for n in var.shape), var.ndim
    itemsize = max(1, var.dtype.itemsize)
    inner_bytes = min(DEFAULT_CHUNK_BYTES, shard_bytes)
    chunks = _encoded_shape(enc.get("chunks"), ndim, name, "chunks")
    shard: tuple[int, ...] | None
    if explicit and enc.get("shards") is not None:
        shard = _encoded_shape(enc["shards"], ndim, name, "shards")
        if shard is None:
            raise InvalidValueError(
                f"encoding[{name!r}]['shards'] must be {ndim} positive ints, got {enc['shards']!r}"
            )
        replace_chunks = False
    elif isinstance(shards_kw, str):  # a target ("2GB", "XY"): the planner's, per variable
        chunks = chunks if explicit else None
        try:
            return default_layout(shape, itemsize, chunks, shards_kw, shard_bytes, dims=var.dims)
        except InvalidValueError:  # a coordinate without the axes named: the default rule
            return default_layout(shape, itemsize, chunks, None, shard_bytes)
    elif shards_kw:
        shard = tuple(
            _named_shard(shards_kw.get(d), n) for d, n in zip(var.dims, shape, strict=True)
        )
        replace_chunks = not explicit
    else:
        shard = None if explicit else _encoded_shape(enc.get("shards"), ndim, name, "shards")
        replace_chunks = False

    if shard is None:
        chunks = chunks or _small_dask_chunks(var, itemsize, inner_bytes, shard_bytes)
        return default_layout(shape, itemsize, chunks, None, shard_bytes)
    if chunks is None or (replace_chunks and not _divides(chunks, shard)):
        named = _by_name(shards_kw, var.dims) if not (explicit and enc.get("shards")) else None
        return default_layout(shape, itemsize, None, named or shard, shard_bytes, dims=var.dims)
    if not explicit and not _divides(chunks, shard) and "preferred_chunks" in enc:
        # read from a store, then given other chunks (overwrite_encoded_chunks=True): the
        # stored shards no longer fit; new shards are built around the chunks asked for
        return default_layout(shape, itemsize, chunks, None, shard_bytes)
    if shards_kw and not (explicit and enc.get("shards") is not None):
        # sizes by dimension name with inner chunks asked for: rounded up to whole chunks, the
        # rule of write_array and convert (encoding shards follow xarray: refused below)
        return chunks, whole_chunks(shard, chunks)
    if not _divides(chunks, shard):
        raise InvalidValueError(
            f"variable {name!r}: the inner chunks {chunks} must divide the shard shape "
            f"{shard} (e.g. chunks={dividing_chunks(shard, itemsize, inner_bytes)})"
        )
    return chunks, shard


def _by_name(shards_kw: Any, dims: Any) -> dict[str, int] | None:
    """``shards=`` sizes of the dimensions ``dims`` names (None: whole), as the planner's sizes
    by name: the dimensions not named are whole, their inner chunks cut evenly (a shard then
    rounded up to whole chunks)."""
    if not shards_kw or isinstance(shards_kw, str):
        return None
    sizes = {str(d): int(n) for d, n in shards_kw.items() if d in dims and n is not None}
    return sizes or None


def _small_dask_chunks(
    var: Any, itemsize: int, limit: int, shard_bytes: int
) -> tuple[int, ...] | None:
    """The dask chunks of ``var`` as its inner chunks, as xarray's default takes them, when they
    are uniform (all but the last of one size, the last no larger), no larger than a default
    inner chunk (``limit`` bytes) and a default shard around them holds at most
    :data:`MAX_DASK_CHUNKS_PER_SHARD` of them: then xarray's zarr engine (``xr.open_zarr``)
    reads back the chunks that were written. Else the default rule chooses: a shard of
    millions of tiny chunks would spend more on its index and frames than on its data."""
    dask_chunks = var.chunks
    if not dask_chunks or any(len(set(c[:-1])) > 1 or c[-1] > c[0] for c in dask_chunks):
        return None
    first = tuple(int(c[0]) for c in dask_chunks)
    if min(first) < 1 or math.prod(first) * itemsize > limit:
        return None
    shards = default_shards(tuple(int(n) for n in var.shape), first, itemsize, shard_bytes)
    if math.prod(s // c for s, c in zip(shards, first, strict=True)) > MAX_DASK_CHUNKS_PER_SHARD:
        return None
    return first


def with_layout(
    ds: Any,
    user_encoding: dict[Hashable, dict[str, Any]],
    existing: set[str],
    shards_kw: Mapping[Hashable, int | None] | str | None,
    shard_bytes: int,
) -> tuple[Any, dict[Hashable, dict[str, Any]]]:
    """Give every variable this call creates its inner chunks and shards (in its encoding)."""
    ds = ds.copy(deep=False)
    out = dict(user_encoding)
    for name, var in ds.variables.items():
        explicit = name in user_encoding
        if name in existing:
            continue  # existing arrays keep their layout
        if var.ndim == 0:
            if not explicit:  # scalars are not sharded (e.g. a coordinate after isel)
                var.encoding = {
                    k: v for k, v in var.encoding.items() if k not in ("chunks", "shards")
                }
            continue
        enc = user_encoding[name] if explicit else var.encoding
        chunks, shard = _layout_for(name, var, enc, explicit, shards_kw, shard_bytes)
        layout: dict[str, Any] = {"chunks": chunks, "shards": shard}
        if "compressors" not in enc and "compressor" not in enc:
            layout["compressors"] = default_compressors()  # checksummed inner chunks
        if explicit:
            out[name] = {**enc, **layout}
        else:
            var.encoding = {**var.encoding, **layout}
    return ds, out
