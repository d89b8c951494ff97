"""``shardwise inspect``: an array's (or a group's arrays') layout, storage and writer state;
``--plot FILE.png`` draws its shards (:func:`shard_map`)."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..core.cost import counted

if TYPE_CHECKING:
    from ..core.layout import Coord, Layout
    from ..core.svg import Drawing
    from ..storage.store import ShardStore


def inspect_array(
    store: Any, path: str | None = None, storage_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A summary of the array: metadata, stored shards, and the writer's journal state.

    For a group: ``{"store", "path", "group": True, "arrays": [summary, ...]}`` with the summary of
    each array below it (unsharded arrays: shape, dtype and chunks only).
    """
    from ..errors import NotAnArrayError
    from ..storage.nodes import open_zarr_array
    from ..storage.store import resolve_store, store_name

    zstore = resolve_store(store, mode="r", storage_options=storage_options)
    try:
        arr = open_zarr_array(zstore, path)
    except NotAnArrayError as e:
        members = [_inspect_member(zstore, name) for name in e.arrays]
        return {"store": store_name(zstore), "path": path or "", "group": True, "arrays": members}
    return _inspect_one(zstore, path, arr)


def _inspect_member(zstore: Any, name: str) -> dict[str, Any]:
    from ..errors import UnsupportedCodecError
    from ..storage.nodes import open_zarr_array
    from ..storage.store import store_name

    arr = open_zarr_array(zstore, name)
    try:
        return _inspect_one(zstore, name, arr)
    except UnsupportedCodecError as e:
        return {
            "store": store_name(zstore),
            "path": name,
            "shape": list(arr.shape),
            "dtype": str(arr.dtype),
            "chunk_shape": list(arr.chunks),
            "sharded": False,
            "note": str(e),
        }


def _unsharded(meta: Any) -> bool:
    """An array of one dimension or more whose chunks are plain objects (no sharding codec)."""
    codecs = getattr(meta, "codecs", ())
    return bool(meta.shape) and not (codecs and codecs[0].to_dict()["name"] == "sharding_indexed")


def _inspect_one(zstore: Any, path: str | None, arr: Any) -> dict[str, Any]:
    from ..codec.metadata import info_from_metadata, unsharded_info
    from ..durability.journal import BATCH, read_markers
    from ..durability.lease import read_lease
    from ..durability.records import read_records
    from ..storage.store import ShardStore, store_name

    info = unsharded_info(arr.metadata) if _unsharded(arr.metadata) else None
    info = info or info_from_metadata(arr.metadata)
    lay = info.layout
    sstore = ShardStore(zstore, path or "")
    names = sstore.list("")
    stored = [n for n in names if lay.parse_shard_key(n) is not None]
    with ThreadPoolExecutor(8) as pool:
        sizes = [s or 0 for s in pool.map(sstore.size, stored)]
    markers = [m for m in read_markers(sstore).values() if m is not None]
    lease = read_lease(sstore)
    batch = sstore.get(BATCH)
    meta = arr.metadata.to_dict()
    return {
        "store": store_name(zstore),
        "path": path or "",
        "sharded": not _unsharded(arr.metadata),
        "shape": list(lay.shape),
        "dtype": str(info.dtype),
        "fill_value": meta.get("fill_value"),
        "dimension_names": meta.get("dimension_names"),
        "shard_shape": list(lay.shard_shape),
        # a rectilinear grid: the shard extents along each axis (None where an axis is regular)
        "shard_sizes": None
        if lay.is_regular
        else [None if a is None else list(a) for a in lay.shard_sizes or ()],
        "chunk_shape": list(lay.chunk_shape),
        "shard_grid": list(lay.shard_grid),
        "shards_total": lay.nshards,
        "chunks_per_shard": lay.nchunks_per_shard,  # the largest shard's (rectilinear grids)
        "chunks_per_shard_smallest": math.prod(
            min(lay.axis_sizes(d) or (lay.shard_shape[d],)) // c if lay.axis_edges(d) else n // c
            for d, (n, c) in enumerate(zip(lay.shard_shape, lay.chunk_shape, strict=True))
        ),
        "codecs": meta["codecs"],
        "shards_stored": len(stored),
        "objects": sum(not n.startswith(".shardwise/") for n in names),
        "bytes_stored": int(sum(sizes)),
        "raw_bytes": int(info.dtype.itemsize * math.prod(lay.shape)),
        "shards_recorded": len(read_records(sstore)),
        "writes_open": [m.id for m in markers if m.status != "done"],
        "writes_done": sum(m.status == "done" for m in markers),
        "lease": None if lease is None else lease.describe(),
        "batch": None if batch is None else json.loads(batch),
        "costs": _costs(lay, info.dtype.itemsize, meta.get("dimension_names")),
    }


def _costs(lay: Layout, itemsize: int, dims: Any) -> list[str]:
    """What the layout costs the common reads, appends and region writes (the planner's
    report, :func:`shardwise.plan_shards`)."""
    from ..core.geometry import ShardGeometry

    names = tuple(dims) if dims and len(dims) == len(lay.shape) else None
    g = ShardGeometry(
        lay.shape,
        itemsize,
        lay.shard_shape,
        lay.chunk_shape,
        dims=names,
        shard_edges=lay.shard_sizes,
    )
    return g.cost_lines()[3:] if lay.shape else []


def shard_states(sstore: ShardStore, lay: Layout) -> tuple[list[Coord], list[Coord]]:
    """(stored, missing): the shards stored, and those a write recorded that are gone (what
    ``verify`` reports as missing). Every other shard is empty: it reads as the fill value."""
    from ..durability.records import recorded_keys

    stored = [c for c in map(lay.parse_shard_key, sstore.list("")) if c is not None]
    have = set(stored)
    recorded = recorded_keys(sstore, lay)
    missing = [c for c in map(lay.parse_shard_key, recorded) if c is not None and c not in have]
    return stored, missing


def shard_map(
    store: Any, path: str | None = None, storage_options: dict[str, Any] | None = None
) -> Drawing:
    """The picture of a stored array's shards: stored, empty (reads as fill) or missing.

    A notebook shows it (SVG); ``shardwise inspect --plot FILE.png`` writes it as PNG. One
    listing of the array's objects (and of the journal's records, run records read); no
    shard is read.
    """
    from ..codec.metadata import info_from_metadata
    from ..core.picture import stored_picture
    from ..core.svg import Drawing
    from ..storage.nodes import open_zarr_array
    from ..storage.store import ShardStore, resolve_store, store_name

    zstore = resolve_store(store, mode="r", storage_options=storage_options)
    lay = info_from_metadata(open_zarr_array(zstore, path).metadata).layout
    stored, missing = shard_states(ShardStore(zstore, path or ""), lay)
    where = store_name(zstore) + (f" path {path!r}" if path else "")
    caption = [
        f"{where}: array {lay.shape}, {lay.grid_text()}",
        f"{len(stored)} of {lay.nshards} shards stored, {len(missing)} missing",
    ]
    return Drawing(stored_picture(lay, stored, missing, caption))


def _shards_text(d: dict[str, Any]) -> str:
    """The shard shape, or a rectilinear grid's extents per axis (long lists cut)."""
    sizes = d.get("shard_sizes")
    if not sizes:
        return str(tuple(d["shard_shape"]))
    axes = [
        str(s) if a is None else str(a) if len(a) <= 6 else f"[{a[0]}, {a[1]}, ... {len(a)}]"
        for s, a in zip(d["shard_shape"], sizes, strict=True)
    ]
    return f"rectilinear ({', '.join(axes)})"


def print_inspect(d: dict[str, Any]) -> None:
    if d.get("group"):
        arrays = d["arrays"]
        print(
            f"{d['store']}" + (f" path {d['path']!r}" if d["path"] else "") + ": a group of "
            f"{len(arrays)} arrays, {sum(m.get('objects', 0) for m in arrays)} objects of "
            "sharded arrays (inspect one with --path NAME)"
        )
        for m in arrays:
            head = f"  {m['path']}  {tuple(m['shape'])} {m['dtype']}"
            if not m["sharded"]:
                print(f"{head}, not sharded: chunks {tuple(m['chunk_shape'])}")
                continue
            print(
                f"{head}, shards {_shards_text(m)} of inner chunks "
                f"{tuple(m['chunk_shape'])}; {m['shards_stored']} of {m['shards_total']} shards "
                f"stored, {m['bytes_stored'] / 1e6:.2f} MB"
            )
        return
    if not d["sharded"]:
        print("\n".join(_unsharded_rows(d)))
        return
    sharded = bool(d["codecs"]) and d["codecs"][0].get("name") == "sharding_indexed"
    inner = d["codecs"][0].get("configuration", {}) if sharded else {}
    chain = " -> ".join(c["name"] for c in inner.get("codecs", []))
    index = " + ".join(c["name"] for c in inner.get("index_codecs", []))
    index = f"index {index} at the {inner.get('index_location', 'end')}"
    if not sharded:  # a 0-d array: one plain chunk, no sharding codec
        chain = " -> ".join(c["name"] for c in d["codecs"])
        index = "one plain chunk, no shard index"
    # nothing stored (every shard all-fill): no ratio to speak of
    ratio = (
        f"ratio {d['raw_bytes'] / d['bytes_stored']:.2f} to the full raw array"
        if d["bytes_stored"]
        else "every shard reads as the fill value"
    )
    batch = d["batch"]
    rows = [
        f"{d['store']}" + (f" path {d['path']!r}" if d["path"] else ""),
        f"  array    {tuple(d['shape'])} {d['dtype']}, fill {d['fill_value']}"
        + (f", dims {tuple(d['dimension_names'])}" if d["dimension_names"] else ""),
        f"  shards   {_shards_text(d)}: grid {tuple(d['shard_grid'])} = "
        f"{counted(d['shards_total'], 'shard')} of {_per_shard(d)} inner chunks "
        f"{tuple(d['chunk_shape'])}",
        f"  codecs   {chain}; {index}",
        f"  stored   {counted(d['shards_stored'], 'shard')} ({d['objects']} objects with the "
        "metadata), "
        f"{d['bytes_stored'] / 1e6:.2f} MB "
        f"({ratio})",
        f"  journal  {counted(d['shards_recorded'], 'shard record')}, "
        f"{counted(d['writes_done'], 'write')} done, "
        f"{len(d['writes_open'])} open" + (" (resume them)" if d["writes_open"] else ""),
        f"  lease    {d['lease'] or 'free'}",
    ]
    if batch:
        rows.append(f"  batch    open: {batch['nparts']} parts (shardwise batch status)")
    rows += [f"  {line}" for line in d.get("costs", [])]
    print("\n".join(rows))


def _unsharded_rows(d: dict[str, Any]) -> list[str]:
    """``inspect`` of an unsharded array: its layout, its chunk objects, and how to shard it."""
    where = d["store"] + (f" path {d['path']!r}" if d["path"] else "")
    src = d["store"].removeprefix("file://")
    path = f" --path {d['path']}" if d["path"] else ""
    return [
        where,
        f"  array    {tuple(d['shape'])} {d['dtype']}, fill {d['fill_value']}"
        + (f", dims {tuple(d['dimension_names'])}" if d["dimension_names"] else ""),
        f"  chunks   {tuple(d['chunk_shape'])}: grid {tuple(d['shard_grid'])} = "
        f"{d['shards_total']} chunks, not sharded (each chunk its own object)",
        f"  codecs   {' -> '.join(c['name'] for c in d['codecs'])}",
        f"  stored   {d['shards_stored']} chunk objects ({d['objects']} objects with the "
        f"metadata), {d['bytes_stored'] / 1e6:.2f} MB",
        f"  shard it shardwise convert {src}{path} DST --shards SHARDS (the encoded chunks "
        "copied into shards, not decoded); shardwise verify checks its chunks",
    ]


def _per_shard(d: dict[str, Any]) -> str:
    """Inner chunks per shard; a rectilinear grid's from its smallest shard to its largest."""
    few, many = d.get("chunks_per_shard_smallest", d["chunks_per_shard"]), d["chunks_per_shard"]
    return str(many) if few == many else f"{few} to {many}"
