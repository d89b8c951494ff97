"""``to_zarr``'s one check, of an ``xarray.DataTree`` or of a Dataset, which is a tree of one
node: every group of the tree through the one write of ``to_zarr``.

xarray's own metadata pass runs once per node (parents first) against ONE dry-run overlay, as
``DataTree.to_zarr`` runs it against one store: the root in the call's mode, the nodes below in
mode "a" (after a "w" or "w-" of the root, which clears or refuses the whole tree). Every node's
variable writes are recorded by one capture, so the checked call is one ``XarrayWrite`` like a
Dataset's: ``to_zarr`` then runs its one pipeline over the variables of every group (one graph,
one task per shard across all groups), and the overlay's metadata (every group's ``zarr.json``,
consolidated unless ``consolidated=False``, as ``DataTree.to_zarr``) is committed once, after the
data.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..core import args
from ..core.job import Strategy
from ..errors import ArrayExistsError, ArrayNotFoundError, InvalidTypeError, InvalidValueError
from ..storage.icechunk import is_icechunk_store
from ..storage.nodes import refuse_inside_array
from ..storage.overlay import Overlay, read_only
from ..storage.store import describe, resolve_store
from ..write.target import refuse_unknown_chunks
from .capture import Capture, plan_writes, run_xarray
from .finished import has_metadata, stored_as, writes_stored
from .parts import XarrayWrite, open_marker, variable_jobs
from .prepare import (
    WriteMode,
    as_dataset,
    as_dict,
    check_append_dim,
    check_group_names,
    check_names,
    check_shards_kw,
    choose_mode,
    stored_dims,
    with_layout,
)
from .steady import steady_lengths


def is_tree(obj: Any) -> bool:
    """Whether ``obj`` is an ``xarray.DataTree`` (xarray is loaded: the caller writes xarray)."""
    import xarray as xr

    return isinstance(obj, xr.DataTree)


def check_tree(
    obj: Any,
    store: Any,
    *,
    shards: Mapping[Hashable, int | None] | str | None,
    encoding: Mapping[Hashable, Any] | None,
    mode: WriteMode | None,
    append_dim: Hashable | None,
    region: Any,
    group: str | None,
    consolidated: bool | None,
    storage_options: dict[str, Any] | None,
    safe_shards: bool | None,
    shard_bytes: int | str,
    strategy: Strategy,
    memory_limit: int | str | None,
    resume: bool,
    write_inherited_coords: bool,
) -> XarrayWrite:
    """``to_zarr``'s one check, of a DataTree or of a Dataset (or DataArray), which is a tree of
    one node: every keyword, every group's metadata built in one overlay by xarray's pass (the
    root in the call's mode, the nodes below in "a"); nothing is written."""
    tree = is_tree(obj)
    nodes, encodings = _nodes(obj, shards, encoding, region, append_dim, write_inherited_coords)
    shard_bytes = args.byte_size("shard_bytes", shard_bytes)
    mode = choose_mode(mode, append_dim, region)
    zstore = resolve_store(store, mode="w", storage_options=storage_options)
    if group:  # zarr would refuse a group inside an array only after the first bytes
        refuse_inside_array(zstore, group, "group")
    base = read_only(zstore)
    _refuse_nothing_there(zstore, base, group, mode)
    root_mode = _resumed_mode(base, group, mode, nodes) if resume else mode

    def xarray_pass(root_mode: WriteMode) -> tuple[Overlay, Capture]:
        overlay, capture = Overlay(steady_lengths(base, append_dim)), Capture()
        for i, (path, ds) in enumerate(nodes.items()):
            where = _join(group, path) if tree else group
            node_mode: WriteMode = root_mode if i == 0 else "a" if mode in ("w", "w-") else mode
            node_region = _node_region(region, ds) if tree else region
            if region is not None and node_region is None:
                continue  # no variable of this group lies in the region: the group stays as is
            if i:
                node_region = _inherited_region(node_region, obj[path], ds, base, group, obj)
            node_append = append_dim if append_dim in ds.dims else None
            stored = stored_dims(base, where) if mode in ("a", "a-", "r+") else None
            if node_append is not None:
                check_append_dim(stored, where, node_append)
            ds, enc = with_layout(
                ds,
                encodings.get(path, {}),
                set(stored or ()),
                _node_shards(shards, ds),
                shard_bytes,
            )
            with _refused_create(zstore, where, node_mode, resume):
                run_xarray(
                    ds,
                    overlay,
                    capture,
                    mode=node_mode,
                    group=where or None,
                    consolidated=False if tree else consolidated,  # a tree's once, below
                    append_dim=node_append,
                    region=node_region,
                    encoding=enc,
                )
        if tree and consolidated is not False:  # None too: as DataTree.to_zarr by default
            _consolidate(overlay, group, asked=consolidated is True)
        return overlay, capture

    finished = False
    if resume and mode == "w-" and root_mode == "w-" and has_metadata(base, group):
        # over a finished write: what this call would store over nothing (mode "w", into the
        # overlay only) is what is stored? then it is that write, resumed: nothing to do
        overlay, capture = xarray_pass("w")
        finished = stored_as(overlay, base, group)
    if not finished:
        overlay, capture = xarray_pass(root_mode)
        # mode "a" resumed over what it would write (no append, no region): maybe finished
        whole = append_dim is None and region is None and not any(overlay.changes[:2])
        finished = resume and whole and mode == "a" and writes_stored(overlay, base)
    writes = plan_writes(capture.items, append_dim, region is not None, safe_shards, zstore)
    shared = region is not None or append_dim is not None
    forks = is_icechunk_store(zstore)  # into a session: the job decides how its tasks write
    jobs = variable_jobs(writes, strategy, memory_limit, shared=shared, forks=forks)
    return XarrayWrite(zstore, overlay, writes, jobs, mode, shared, finished=finished)


def _nodes(
    obj: Any,
    shards: Mapping[Hashable, int | None] | str | None,
    encoding: Mapping[Hashable, Any] | None,
    region: Any,
    append_dim: Hashable | None,
    inherited: bool,
) -> tuple[dict[str, Any], dict[str, dict[Hashable, dict[str, Any]]]]:
    """The datasets to write by their path in the tree ("" the root; a Dataset's alone) and
    their encodings, the names and every keyword naming dimensions, groups or variables
    checked against them (a Dataset's messages in xarray's wording)."""
    if is_tree(obj):
        check_group_names(obj)
        args.flags(write_inherited_coords=inherited)
        nodes = _node_datasets(obj, inherited)
        encodings = _group_encodings(encoding, nodes)
        dims = {str(d) for ds in nodes.values() for d in ds.dims}
        _refuse_unknown_dims("shards", None if isinstance(shards, str) else shards, dims)
        _refuse_unknown_dims("region", region if isinstance(region, Mapping) else None, dims)
        if append_dim is not None and append_dim not in dims:
            raise InvalidValueError(
                f"append_dim={append_dim!r} is not a dimension of any group of the tree "
                f"(dimensions: {sorted(dims)})"
            )
        return nodes, encodings
    if inherited:
        raise InvalidValueError(
            "write_inherited_coords=True applies to an xarray DataTree only, got a "
            f"{type(obj).__name__}"
        )
    ds = as_dataset(obj)
    check_names(ds)
    for name, var in ds.variables.items():
        refuse_unknown_chunks(var.data, f"variable {name!r}: ")
    unknown = sorted(map(str, set(region) - set(ds.dims))) if isinstance(region, Mapping) else []
    if unknown:
        # xarray's words for it
        raise InvalidValueError(
            f"all keys in ``region`` are not in Dataset dimensions, got {unknown} and "
            f"{sorted(map(str, ds.dims))}: region names dimensions of the data to write"
        )
    if shards is not None:
        check_shards_kw(ds, shards)
    if append_dim is not None and append_dim not in ds.dims:
        raise InvalidValueError(  # with xarray's wording, which callers match on
            f"append_dim={append_dim!r} is not a dimension of the data to write: it "
            f"does not match any existing dataset dimensions {sorted(map(str, ds.dims))}"
        )
    return {"": ds}, {"": {k: as_dict(v, k) for k, v in (encoding or {}).items()}}


def _node_datasets(tree: Any, inherited: bool) -> dict[str, Any]:
    """Each node's dataset by its path in the tree ("" for the root), parents first: a node's
    own coordinates only (xarray reads inherited ones back from the parents) unless
    ``write_inherited_coords``; every name checked as for a Dataset."""
    out = {}
    for node in tree.subtree:
        ds = node.to_dataset(inherit=inherited or node is tree)
        check_names(ds)
        for name, var in ds.variables.items():
            refuse_unknown_chunks(var.data, f"group {node.path!r}, variable {name!r}: ")
        out[node.relative_to(tree) if node is not tree else ""] = ds
    return out


def _group_encodings(
    encoding: Mapping[Hashable, Any] | None, nodes: Mapping[str, Any]
) -> dict[str, dict[Hashable, dict[str, Any]]]:
    """``encoding`` keyed by group path ("/", "/a/b", as ``DataTree.to_zarr`` takes it) as the
    per-variable encoding of each node; a group or a variable the tree does not have is
    refused, naming what it has."""
    groups = {"/" + p if p else "/": p for p in nodes}
    given = dict(encoding or {})
    paths = {
        key: groups.get("/" + key.strip("/")) if isinstance(key, str) else None for key in given
    }
    unknown_groups = [key for key, path in paths.items() if path is None]
    if unknown_groups:
        # xarray's own wording too, which callers' code and tests match on
        raise InvalidValueError(
            f"encoding names group {unknown_groups[0]!r}, which the tree does not have: a "
            f"DataTree's encoding is keyed by group path (groups: {sorted(groups)}); "
            f"unexpected encoding group name(s) provided: {set(unknown_groups)}"
        )
    out: dict[str, dict[Hashable, dict[str, Any]]] = {}
    for key, value in given.items():
        path = paths[key] or ""
        if not isinstance(value, Mapping):
            raise InvalidTypeError(
                f"encoding[{key!r}] must be a dict of variable name -> encoding, got {value!r}"
            )
        names = set(nodes[path].variables)
        unknown = sorted(map(str, set(value) - names))
        if unknown:
            raise InvalidValueError(
                f"encoding[{key!r}] names variables {unknown} that group {key!r} does not "
                f"have (variables: {sorted(map(str, names))})"
            )
        out[path] = {k: as_dict(v, k) for k, v in value.items()}
    return out


def _refuse_unknown_dims(
    keyword: str, given: Mapping[Hashable, Any] | None, dims: set[str]
) -> None:
    """``shards=`` and ``region=`` name dimensions of at least one group."""
    for dim, n in (given or {}).items():
        if dim not in dims:
            raise InvalidValueError(
                f"{keyword} names dimension {dim!r}, which no group of the tree has "
                f"(dimensions: {sorted(dims)})"
            )
        if keyword == "shards" and n is not None and not _positive(n):
            raise InvalidValueError(f"shards[{dim!r}] must be a positive int or None, got {n!r}")


def _positive(n: Any) -> bool:
    import numpy as np

    return isinstance(n, int | np.integer) and not isinstance(n, bool) and bool(n >= 1)


def _node_shards(
    shards: Mapping[Hashable, int | None] | str | None, ds: Any
) -> Mapping[Hashable, int | None] | str | None:
    """``shards=`` for one group: the sizes of the dimensions it has."""
    if shards is None or isinstance(shards, str):  # a target: each variable's own
        return shards
    return {d: n for d, n in shards.items() if d in ds.dims}


def _node_region(region: Any, ds: Any) -> Any:
    """``region=`` for one group: the dimensions it has; None when its variables have none of
    them (an "auto" region goes to every group with variables)."""
    if region is None or not ds.variables:
        return None
    if not isinstance(region, Mapping):
        return region
    mine = {d: s for d, s in region.items() if d in ds.dims}
    return mine or None


def _inherited_region(
    region: Any, node: Any, ds: Any, base: Any, group: str | None, tree: Any
) -> Any:
    """``"auto"`` for the dimensions whose coordinate a group inherits: xarray resolves
    ``"auto"`` against the group's own stored coordinate and takes a dimension it does not find
    there as unindexed (rows from 0); here the inherited values are looked up in the coordinate
    stored with the group that defines it, as xarray looks up a group's own."""
    if region is None:
        return None
    wanted = dict.fromkeys(ds.dims, "auto") if region == "auto" else dict(region)
    for dim, where in wanted.items():
        if where != "auto" or dim in ds.variables:
            continue
        owner = next((p for p in _parents(node, tree) if dim in _own(p)), None)
        if owner is not None:
            at = _join(group, "" if owner is tree else owner.relative_to(tree))
            wanted[dim] = _lookup(base, at, dim, node.to_dataset(inherit=True)[dim].values)
    return wanted


def _parents(node: Any, tree: Any) -> list[Any]:
    """The nodes above ``node`` up to the tree written (closest first), not those above it."""
    out = []
    for p in node.parents:
        out.append(p)
        if p is tree:
            break
    return out


def _own(node: Any) -> Any:
    """The variables a node defines itself (not those it inherits)."""
    return node.to_dataset(inherit=False).variables


def _lookup(base: Any, group: str, dim: str, values: Any) -> slice:
    """Where ``values`` lie in the coordinate ``dim`` stored in ``group``: one contiguous run of
    its rows (xarray's rule and wording for ``region="auto"``)."""
    import numpy as np
    import pandas as pd
    import xarray as xr

    with xr.open_zarr(base, group=group or None, consolidated=False, chunks=None) as stored:
        index = pd.Index(stored[dim].values)
    idxs = index.get_indexer(values)
    if not len(idxs):
        return slice(0, 0)
    if (idxs == -1).any():
        raise InvalidValueError(
            f"region='auto': not all values of coordinate {dim!r} (inherited from group "
            f"{'/' + group!r}) in the new array were found in the original store. Writing to "
            "a zarr region slice requires that no dimensions or metadata are changed by the write."
        )
    if (np.diff(idxs) != 1).any():
        raise InvalidValueError(
            f"region='auto': the auto-detected region of coordinate {dim!r} (inherited from "
            f"group {'/' + group!r}) had non-contiguous indices. Writing to a zarr region slice "
            "requires that the new data constitute a contiguous subset of the original store."
        )
    return slice(int(idxs[0]), int(idxs[-1]) + 1)


def _refuse_nothing_there(zstore: Any, base: Any, group: str | None, mode: str) -> None:
    """Mode "r+" writes into what is there: over nothing, refused as write_array's "r+"."""
    if mode == "r+" and not has_metadata(base, group):
        raise ArrayNotFoundError(
            f"{describe(zstore, group, 'group')} is not there: mode='r+' writes into an existing "
            "group (mode='a' or 'w-' creates it); nothing was written"
        )


def _join(group: str | None, path: str) -> str:
    return "/".join(p for p in ((group or "").strip("/"), path) if p)


def _consolidate(overlay: Overlay, group: str | None, *, asked: bool) -> None:
    """Consolidated metadata of the whole tree, in the overlay (committed with the rest), so
    that ``xr.open_datatree(p)`` opens it without a warning, as after ``DataTree.to_zarr``."""
    import warnings

    import zarr

    with warnings.catch_warnings():
        if not asked:
            # as for a Dataset (capture.py): zarr's warning that Zarr v3 does not specify
            # consolidated metadata is for callers who ask for it with consolidated=True
            warnings.filterwarnings(
                "ignore", "Consolidated metadata is currently not part", UserWarning
            )
        zarr.consolidate_metadata(overlay, path=(group or "").strip("/") or None)


@contextmanager
def _refused_create(
    zstore: Any, where: str | None, mode: WriteMode, resume: bool
) -> Iterator[None]:
    """xarray's refusal of mode "w-" over a stored group (a ``FileExistsError`` from its dry
    run, before any byte) as the one refusal of every front end (``resolve``'s)."""
    try:
        yield
    except FileExistsError as e:
        if mode != "w-" or isinstance(e, ArrayExistsError):
            raise
        here = describe(zstore, where, "group")
        if resume:  # metadata (a finished write's, or another's), or keys of another write
            raise ArrayExistsError(
                f"{here} holds a finished write or other nodes: nothing to resume "
                "(use mode='w' to replace it)"
            ) from e
        raise ArrayExistsError(f"{here} already exists (use mode='w' to replace it)") from e


def _resumed_mode(
    base: Any, group: str | None, mode: WriteMode, nodes: Mapping[str, Any]
) -> WriteMode:
    """Mode "w-" resuming an interrupted tree write (whose metadata, written last, is missing)
    runs the xarray pass as "w", whose deletes spare the variables being resumed: only while
    every key under the tree's group is data (no metadata) of the tree's variables, one of them
    with the open marker of an interrupted write. Anything else keeps "w-", which refuses the
    call (:func:`_refused_create`), a finished write included: unlike ``write_array``'s resume
    of its finished array, which has nothing to do, a tree's would rewrite its metadata and its
    coordinates, so it is refused and changes nothing."""
    if mode != "w-":
        return mode
    from zarr.core.sync import sync

    from ..storage.store import ShardStore

    prefix = f"{_join(group, '')}/" if _join(group, "") else ""
    variables = {_join(group, _join(p, str(v))) for p, ds in nodes.items() for v in ds.variables}

    async def keys() -> list[str]:
        return [k async for k in base.list_prefix(prefix)]

    found: set[str] = set()
    for key in sync(keys()):
        owner = next((v for v in variables if key.startswith(v + "/")), None)
        if owner is None or key.rsplit("/", 1)[-1] == "zarr.json":
            return "w-"  # metadata (written last), or something else: not ours to resume
        found.add(owner)
    # variables without shards (0-d ones) are written by zarr-python, without a marker
    if not any(open_marker(ShardStore(base, v)) for v in found):
        return "w-"
    return "w"
