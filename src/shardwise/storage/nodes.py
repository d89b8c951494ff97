"""What is at a path of a zarr store: a Zarr v3 array, a group, a Zarr v2 node or nothing.

The one place that answers it, below the engine, for every front end, verify, batch, convert
and the xarray room (whose trees walk their groups with :func:`walk_groups`). zarr's errors for a
missing node or a node of the other kind become shardwise errors naming the store and path
(:func:`node_errors`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import zarr
from zarr.abc.store import Store

from ..codec.metadata import ArrayInfo, info_from_metadata
from ..compat import with_rectilinear_grids
from ..errors import (
    ArrayNotFoundError,
    NotAGroupError,
    NotAnArrayError,
    PlanError,
    UnsupportedCodecError,
)
from .overlay import Overlay
from .store import describe


def readable(store: Any) -> Any:
    """``store`` as zarr opens it with mode "r": zarr asks a writable store for a read-only view,
    which a store without one (a zarr ``ZipStore``) refuses with a ValueError; a read-only
    :class:`~.overlay.Overlay` over it (reads fall through to it) stands in for the view."""
    if not isinstance(store, Store) or store.read_only:
        return store
    if type(store).with_read_only is not Store.with_read_only:  # zarr makes its own view
        return store
    return Overlay(store, read_only=True)


def open_info(store: Any, path: str | None = None) -> ArrayInfo:
    """Read and translate the metadata of the array at ``path`` in a zarr ``store``."""
    meta = open_zarr_array(store, path).metadata
    try:
        return info_from_metadata(meta)
    except UnsupportedCodecError as e:
        raise UnsupportedCodecError(f"{describe(store, path)}: {e}") from None


@with_rectilinear_grids
def open_zarr_array(store: Any, path: str | None = None) -> Any:
    """zarr-python's array at ``path`` (Zarr v3), or a shardwise error saying what is there
    instead: :class:`NotAnArrayError` for a group (listing its arrays),
    :class:`UnsupportedCodecError` for a Zarr v2 array, :class:`ArrayNotFoundError` for nothing."""
    try:
        with node_errors(store, path, "array"):
            return zarr.open_array(readable(store), path=path or "", mode="r", zarr_format=3)
    except ArrayNotFoundError:  # maybe a Zarr v2 node, which a format-3 open does not see
        kind = v2_node(store, path)
        if kind is None:
            raise
    raise UnsupportedCodecError(_v2_message(store, path, kind))


@with_rectilinear_grids
def open_node(store: Any, path: str | None = None) -> Any:
    """zarr-python's array or group at ``path`` (Zarr v2 or v3); nothing there is an
    :class:`ArrayNotFoundError` naming the store and path, not zarr's own error."""
    with node_errors(store, path, "node"):
        return zarr.open(readable(store), path=path or "", mode="r")


@contextmanager
def node_errors(store: Any, path: str | None, want: str) -> Iterator[None]:
    """zarr's errors for a missing node or a node of the other kind, raised inside, as shardwise
    errors naming the store and path (zarr's own name the internal StorePath): nothing there is
    :class:`ArrayNotFoundError` (a ``FileNotFoundError``), a group where ``want`` is "array" is
    :class:`NotAnArrayError` listing its arrays, an array where ``want`` is "group" is
    :class:`NotAGroupError` (both ``ValueError``)."""
    from zarr.errors import (
        ContainsArrayError,
        ContainsGroupError,
        NodeTypeValidationError,
    )

    try:
        yield
    except FileNotFoundError as e:  # zarr's NodeNotFoundError, or a missing local root
        if isinstance(e, ArrayNotFoundError):
            raise
        noun = "zarr array or group" if want == "node" else want
        raise ArrayNotFoundError(f"no {noun} at {describe(store, path, 'path')}") from None
    except ContainsArrayError:
        raise _not_a_group(store, path) from None
    except (ContainsGroupError, NodeTypeValidationError):
        # zarr raises NodeTypeValidationError for metadata of the other kind either way round
        raise (
            _not_a_group(store, path) if want == "group" else _not_an_array(store, path)
        ) from None


def _not_a_group(store: Any, path: str | None) -> NotAGroupError:
    return NotAGroupError(
        f"{describe(store, path, 'path')} is an array, not a group: pass the path of the group "
        "that holds it, or open it as an array (shardwise.open_array)"
    )


def _not_an_array(store: Any, path: str | None) -> NotAnArrayError:
    arrays = group_arrays(store, path) or []
    listed = ", ".join(repr(a) for a in arrays[:20]) + (" ..." if len(arrays) > 20 else "")
    return NotAnArrayError(
        f"{describe(store, path, 'group')} is a group, not an array: "
        + (
            f"pass path= (CLI: --path) with one of its arrays: {listed}"
            if arrays
            else "it has no arrays"
        ),
        arrays,
    )


@with_rectilinear_grids
def _array_above(store: Any, path: str | None) -> str | None:
    """The path of an array (Zarr v2 or v3) that ``path`` would lie inside, else None."""
    parts = (path or "").strip("/").split("/")[:-1]
    for i in range(len(parts) + 1) if path and path.strip("/") else ():
        try:
            node = zarr.open(readable(store), path="/".join(parts[:i]), mode="r")
        except (FileNotFoundError, ValueError):  # nothing there, or not zarr metadata
            continue
        if isinstance(node, zarr.Array):
            return "/".join(parts[:i])
    return None


def v2_node(store: Any, path: str | None) -> str | None:
    """ "array" or "group" when a Zarr v2 node is at ``path``, else None."""
    try:
        node = zarr.open(readable(store), path=path or "", mode="r", zarr_format=2)
    except FileNotFoundError:  # zarr's NodeNotFoundError is one
        return None
    return "array" if isinstance(node, zarr.Array) else "group"


def _v2_message(store: Any, path: str | None, kind: str) -> str:
    return (
        f"{describe(store, path, kind)} is a Zarr v2 {kind}: shardwise reads and writes Zarr v3 "
        "sharded arrays; read it with zarr-python (zarr.open_array, dask.array.from_zarr) or "
        "convert it to sharded v3 with `shardwise convert SRC DST` (Python: shardwise.convert)"
    )


def refuse_inside_array(store: Any, path: str | None, keyword: str = "path") -> None:
    """A :class:`PlanError` when ``path`` lies inside an array (zarr would refuse only after
    the write's first bytes, with its own error); ``keyword`` names the caller's keyword."""
    above = _array_above(store, path)
    if above is not None:
        raise PlanError(
            f"{describe(store, above)} holds no other nodes, so nothing can be written at "
            f"{describe(store, path, keyword)}: pick a {keyword} that is not inside an array"
        )


def array_exists(store: Any, path: str | None) -> bool:
    """True when a Zarr v3 array is at ``path``, False when nothing is; anything else there
    (a group, a Zarr v2 node, a path inside an array) is a :class:`PlanError` saying what to
    pass instead."""
    refuse_inside_array(store, path)
    try:
        open_zarr_array(store, path)
    except ArrayNotFoundError:
        return False
    except UnsupportedCodecError as e:  # a Zarr v2 node
        raise PlanError(f"{e}; mode='w' replaces it") from None
    except NotAnArrayError as e:
        raise PlanError(
            f"{describe(store, path, 'path')} is a group, not an array: pass path= to write "
            "an array inside it, or mode='w' to replace the group"
        ) from e
    return True


@with_rectilinear_grids
def group_arrays(zstore: Any, path: str | None) -> list[str] | None:
    """Paths of the arrays below the group at ``path`` (None when it is not a group)."""
    try:
        # the stored nodes, not a consolidated listing that a write may not have updated
        group = zarr.open_group(
            readable(zstore), path=path or "", mode="r", zarr_format=3, use_consolidated=False
        )
    except Exception:  # not a group: an array, or nothing
        return None
    prefix = f"{path.strip('/')}/" if path and path.strip("/") else ""
    with warnings.catch_warnings():
        # a directory without zarr.json (an interrupted write's journal and shards, which
        # verify reports from the journal) is no node: zarr warns and skips it, as wanted here
        warnings.filterwarnings("ignore", "Object at .* is not recognized as a component")
        arrays = sorted(prefix + name for name, _ in group.arrays())
        groups = [name for name, _ in group.groups()]
    return arrays + [a for name in groups for a in group_arrays(zstore, prefix + name) or []]


def walk(zsrc: Any, path: str) -> tuple[Any, list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(root node, [(relative path, array)], [(relative path, group)]) under ``path``."""
    node = open_node(zsrc, path)
    if isinstance(node, zarr.Array):
        return node, [("", node)], []
    arrays: list[tuple[str, Any]] = []
    groups: list[tuple[str, Any]] = []
    for name, member in node.members(max_depth=None):
        (arrays if isinstance(member, zarr.Array) else groups).append((name, member))
    return node, sorted(arrays, key=lambda x: x[0]), sorted(groups, key=lambda x: x[0])


def walk_groups(group: Any, path: str = "/") -> Iterator[tuple[str, Any]]:
    """``(path, zarr group)`` for ``group`` (at ``path``) and every group below it, parents
    before children, in the order zarr lists them: the order xarray's own zarr engine walks a
    tree in, so that a tree opened either way has its children in the same order. Arrays are
    not walked: each group's dataset opens its own."""
    yield path, group
    for name, sub in group.groups():
        yield from walk_groups(sub, f"{path.rstrip('/')}/{name}")


@with_rectilinear_grids
def node_exists(zstore: Any, path: str) -> bool:
    """True when any zarr node (array or group, Zarr v2 or v3) is at ``path``."""
    try:
        zarr.open(readable(zstore), path=path or "", mode="r")
    except (FileNotFoundError, KeyError, ValueError):
        return False
    return True


@with_rectilinear_grids
def open_group(store: Any, group: str | None) -> Any:
    """zarr-python's group at ``group`` (v2 or v3, consolidated metadata not used), None when
    nothing is there; an array there is a :class:`NotAGroupError`."""
    try:
        with node_errors(store, group, "group"):  # an array there: NotAGroupError
            return zarr.open_group(
                readable(store), path=group or "", mode="r", use_consolidated=False
            )
    except (FileNotFoundError, KeyError):
        return None
    except Exception as e:  # zarr's GroupNotFoundError and friends
        if "NotFound" in type(e).__name__:
            return None
        raise


def same_metadata(probe: Any, zstore: Any, path: str | None) -> bool:
    """True when the stored array's metadata equals the one this write would create."""
    return not metadata_differences(probe, zstore, path)


@with_rectilinear_grids
def metadata_differences(probe: Any, zstore: Any, path: str | None) -> list[str]:
    """What differs between the stored array's metadata and the one ``probe`` (the array this
    write would create, in memory) has, by the keyword that sets it (``dtype``, ``chunks``,
    ``shards``, ``fill_value``, ``codecs``, ...): one ``"name: stored X, asked Y"`` each, none
    when they are the same (NaN fill values compare equal, as their JSON does)."""
    import json

    from zarr.core.buffer import default_buffer_prototype

    stored = zarr.open_array(readable(zstore), path=path or "", mode="r", zarr_format=3).metadata

    def doc(meta: Any) -> dict[str, Any]:  # the JSON document, as readers will see it
        raw = meta.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes()
        return _by_keyword(json.loads(bytes(raw)))

    have, want = doc(stored), doc(probe.metadata)
    return [
        f"{_LABELS.get(name, name)}: stored {_compact(have.get(name))}, asked "
        f"{_compact(want.get(name))}"
        for name in (*want, *(k for k in have if k not in want))
        if have.get(name) != want.get(name)
    ]


# what each part of the document is called in messages: the keyword, and zarr's name
_LABELS = {
    "dtype": "dtype (data_type)",
    "codecs": "codecs (compressors, filters, serializer)",
}


def _by_keyword(doc: dict[str, Any]) -> dict[str, Any]:
    """A v3 array's JSON document by the ``zarr.create_array`` keyword that sets each part:
    the sharding codec's inner chunk shape is ``chunks``, the chunk grid ``shards``, the other
    codecs (inner, index, outer) ``codecs``."""
    out: dict[str, Any] = {"shape": doc.pop("shape", None), "dtype": doc.pop("data_type", None)}
    grid = doc.pop("chunk_grid", None)
    codecs = list(doc.pop("codecs", None) or [])
    shard = next(
        (c for c in codecs if isinstance(c, dict) and c.get("name") == "sharding_indexed"), None
    )
    shape = grid.get("configuration", {}).get("chunk_shape") if isinstance(grid, dict) else grid
    if shard is not None:
        config = dict(shard.get("configuration") or {})
        out["chunks"] = config.pop("chunk_shape", None)
        out["shards"] = shape
        codecs = [*(c for c in codecs if c is not shard), {"sharding_indexed": config}]
    else:
        out["chunks"] = shape
    out["fill_value"] = doc.pop("fill_value", None)
    out["codecs"] = codecs
    return {**out, **doc}


def _compact(value: Any, limit: int = 300) -> str:
    import json

    text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
