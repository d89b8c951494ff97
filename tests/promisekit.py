"""Writes through every front end and mode, failed or killed at a chosen block, then rerun as
``verify`` advises: the scenarios of ``integration/test_promises.py``.

A scenario prepares a store (a consolidated root with what the mode needs), then writes a
source whose values follow from their row (a row written to the wrong place, twice or not at
all shows), split by dask blocks that cut shards. A fault is injected at source block ``k``:
``fail`` raises there (in this process), ``kill`` holds the block in a child process until the
parent has seen it reached, then SIGKILLs the child. The rerun is the same call with a good
source and ``resume=True`` when ``verify`` advises it. Expected values are built with numpy and
xarray alone.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

CHUNK, SHARD, WIDTH, BLOCK = 2, 4, 6, 3  # inner chunks 2 rows, shards 4 rows, dask blocks 3 rows
ENC = {"chunks": (CHUNK, WIDTH), "shards": (SHARD, WIDTH)}
ENC1 = {"chunks": (CHUNK,), "shards": (SHARD,)}


class Injected(RuntimeError):
    """The failure a ``fail`` scenario raises from its source."""


def rows(t0: int, n: int, salt: int = 0) -> np.ndarray:
    """``n`` rows from row ``t0``: every value follows from its row (and ``salt``)."""
    t = np.arange(t0, t0 + n, dtype="int64")
    return (t[:, None] * 10 + np.arange(WIDTH) + salt * 100_000).astype("int64")


def dataset(t0: int, n: int, salt: int = 0, name: str = "v") -> xr.Dataset:
    return xr.Dataset(
        {name: (("t", "x"), rows(t0, n, salt)), "w": (("t",), rows(t0, n, salt)[:, 0] + 0.5)},
        coords={"t": np.arange(t0, t0 + n, dtype="int64"), "x": np.arange(WIDTH)},
    )


def encoding(ds: xr.Dataset) -> dict[str, Any]:
    return {k: (ENC if ds[k].ndim == 2 else ENC1) for k in list(ds.variables) if k != "x"}


def tree(t0: int, n: int, salt: int = 0, dim: str = "t") -> xr.DataTree:
    """A root holding the ``dim`` coordinate and two children inheriting it."""
    root = xr.Dataset(coords={dim: np.arange(t0, t0 + n, dtype="int64")})
    a = xr.Dataset({"v": ((dim, "x"), rows(t0, n, salt))}, coords={"x": np.arange(WIDTH)})
    b = xr.Dataset({"u": ((dim,), rows(t0, n, salt)[:, 1] * 2)})
    return xr.DataTree.from_dict({"/": root, "/a": a, "/b": b})


def tree_encoding(dim: str = "t") -> dict[str, Any]:
    return {"/": {dim: ENC1}, "/a": {"v": ENC}, "/b": {"u": ENC1}}


# -- faults ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    kind: str  # "none" | "fail" | "kill"
    block: int = 0  # the source block (along rows) where it strikes


def _strike(block: np.ndarray, fault: Fault, reached: Any, block_info: Any = None) -> np.ndarray:
    if block_info is None or block_info[0]["chunk-location"][0] != fault.block:
        return block
    if fault.kind == "fail":
        raise Injected(f"source block {fault.block} failed")
    if fault.kind == "kill":
        reached.set()
        threading.Event().wait(600)  # killed here
        raise RuntimeError("the writer was never killed")
    return block


def faulty(x: Any, fault: Fault, reached: Any = None) -> Any:
    """``x`` (numpy or dask) as a dask array of BLOCK-row blocks carrying ``fault``."""
    import dask.array as da

    arr = x if isinstance(x, da.Array) else da.from_array(np.asarray(x), chunks=BLOCK)
    arr = arr.rechunk({0: BLOCK})
    if fault.kind == "none":
        return arr
    return arr.map_blocks(_strike, fault, reached, dtype=arr.dtype, meta=arr._meta)


def faulty_dataset(ds: xr.Dataset, fault: Fault, reached: Any = None) -> xr.Dataset:
    out = ds.copy()
    for k, v in ds.data_vars.items():
        out[k] = (v.dims, faulty(v.values, fault, reached))
    return out


def faulty_tree(t: xr.DataTree, fault: Fault, reached: Any = None) -> xr.DataTree:
    nodes = {}
    for node in t.subtree:
        ds = node.to_dataset(inherit=False)
        nodes[node.path] = faulty_dataset(ds, fault, reached) if ds.data_vars else ds
    return xr.DataTree.from_dict(nodes)


# -- stores ---------------------------------------------------------------------------------------


def open_store(kind: str, where: str, endpoint: str = "") -> Any:
    """A local path, or an obstore S3 store of the moto server at ``endpoint``."""
    if kind == "local":
        return where
    from faultkit import MotoS3

    return MotoS3(endpoint, None).obstore(where)


# -- scenarios -----------------------------------------------------------------------------------

SCENARIOS = (
    "array-w-",
    "array-w",
    "array-region",
    "dataset-w-",
    "dataset-w",
    "dataset-append",
    "dataset-region",
    "dataset-region-auto",
    "tree-w-",
    "tree-w",
    "tree-region-auto",
    "subtree-w",
    "subtree-append",
    "pyramid-w-",
    "convert-w-",
    "batch-part",
)

BASE_ROWS, NEW_ROWS, REGION = 8, 10, (3, 11)


def blocks(scenario: str) -> int:
    """How many source blocks (along rows) the scenario's write has."""
    n = REGION[1] - REGION[0] if "region" in scenario else NEW_ROWS
    if scenario.startswith("pyramid"):
        n = 16
    if scenario.startswith("convert"):
        return -(-NEW_ROWS // SHARD)  # the fault strikes in a target shard's copy task
    if scenario.startswith("batch"):
        return 3  # part 1 is rows 8..16: source blocks 2..5, struck from block 3 on
    return -(-n // BLOCK)


def prepare(scenario: str, store: Any) -> None:
    """What is at the target before the write: a consolidated root for every scenario."""
    import shardwise

    front, mode = scenario.split("-", 1)
    if front == "tree":
        if mode != "w-":
            shardwise.to_zarr(tree(0, 16, salt=9), store, encoding=tree_encoding())
        return
    base = dataset(0, 16 if "region" in mode else BASE_ROWS, salt=9)
    if front == "array" and mode == "w-":
        base = base.drop_vars("v")
    if front == "dataset" and mode == "w-":
        return
    if front == "batch":
        shardwise.to_zarr(base, store, encoding=encoding(base))
        shardwise.batch.init(
            store, path="bat", shape=(16, WIDTH), dtype="int64", parts=2, mode="w-",
            dimension_names=("r", "c"), **ENC,
        )  # fmt: skip
        shardwise.batch.write_part(rows(0, 16, salt=1), store, 0, path="bat")
        return
    if front == "convert":
        import zarr

        src = zarr.open_group(store, mode="w", zarr_format=3).create_array(
            "src",
            shape=(NEW_ROWS, WIDTH),
            chunks=(CHUNK, WIDTH),
            dtype="int64",
            dimension_names=("r", "c"),
        )
        src[...] = rows(0, NEW_ROWS)
        zarr.consolidate_metadata(store)  # a root as xarray and shardwise leave it
        return
    shardwise.to_zarr(base, store, encoding=encoding(base))


def write(
    scenario: str, store: Any, fault: Fault, reached: Any = None, resume: bool = False
) -> Any:
    """The scenario's write, its source carrying ``fault``."""
    import shardwise

    front, mode = scenario.split("-", 1)
    kw: dict[str, Any] = {"resume": resume} if resume else {}
    if front == "array":
        r = slice(*REGION) if mode == "region" else slice(0, NEW_ROWS)
        x = faulty(rows(r.start, r.stop - r.start, salt=1), fault, reached)
        if mode == "region":
            return shardwise.write_array(
                x, store, path="v", mode="r+", region=(r, slice(None)), **kw
            )
        return shardwise.write_array(
            x, store, path="arr", mode=mode, dimension_names=("r", "c"), **ENC, **kw
        )
    if front == "dataset":
        if mode == "append":
            ds = faulty_dataset(dataset(BASE_ROWS, NEW_ROWS, salt=1), fault, reached)
            return shardwise.to_zarr(ds, store, append_dim="t", **kw)
        if mode.startswith("region"):
            ds = faulty_dataset(dataset(*_span(REGION), salt=1), fault, reached)
            region: Any = "auto" if mode == "region-auto" else {"t": slice(*REGION)}
            if mode == "region":
                ds = ds.drop_vars(["t", "x"])
            return shardwise.to_zarr(ds, store, mode="r+", region=region, **kw)
        ds = faulty_dataset(dataset(0, NEW_ROWS, salt=1), fault, reached)
        return shardwise.to_zarr(ds, store, mode=mode, encoding=encoding(ds), **kw)
    if front == "tree":
        if mode == "region-auto":
            t = faulty_tree(tree(*_span(REGION), salt=1), fault, reached)
            return shardwise.to_zarr(t, store, mode="r+", region="auto", **kw)
        t = faulty_tree(tree(0, NEW_ROWS, salt=1), fault, reached)
        return shardwise.to_zarr(t, store, mode=mode, encoding=tree_encoding(), **kw)
    if front == "subtree":  # its own dimension "s": the root's "t" has other rows
        if mode == "append":
            return _subtree_append(store, fault, reached, kw)
        t = faulty_tree(tree(0, NEW_ROWS, salt=1, dim="s"), fault, reached)
        enc = tree_encoding("s")
        return shardwise.to_zarr(t, store, group="g", mode="w", encoding=enc, **kw)
    if front == "pyramid":
        x = faulty(_image(), fault, reached)
        return shardwise.write_pyramid(
            x, store, path="img", dims=("y", "x"), levels=2, chunks=(2, 4), shards=(4, 8), **kw
        )
    if front == "convert":
        disarm_convert()
        if fault.kind != "none":
            _arm_convert(fault, reached)
        return shardwise.convert(store, store, path="src", dst_path="dst", shards=(4, WIDTH), **kw)
    if front == "batch":
        struck = Fault(fault.kind, fault.block + 3)
        x = faulty(rows(0, 16, salt=1), struck, reached)
        shardwise.batch.write_part(x, store, 1, path="bat", **kw)
        return shardwise.batch.finalize(store, path="bat")
    raise AssertionError(scenario)


def _span(region: tuple[int, int]) -> tuple[int, int]:
    return region[0], region[1] - region[0]


def _image() -> np.ndarray:
    return (np.arange(16)[:, None] * 100 + np.arange(16)).astype("float32")


def _subtree_append(store: Any, fault: Fault, reached: Any, kw: dict[str, Any]) -> Any:
    import shardwise

    first = tree(0, BASE_ROWS, salt=1, dim="s")
    if not kw.get("resume"):
        # the subtree's first rows, written whole before the (faulty) append
        shardwise.to_zarr(first, store, group="g", mode="w", encoding=tree_encoding("s"))
    more = faulty_tree(tree(BASE_ROWS, NEW_ROWS, salt=1, dim="s"), fault, reached)
    return shardwise.to_zarr(more, store, group="g", append_dim="s", **kw)


def _arm_convert(fault: Fault, reached: Any) -> None:
    """convert reads its own source: the fault strikes in the task of target shard row
    ``block`` (the copy task of each target shard)."""
    from shardwise.conversion.copy import ShardCopier

    original = ShardCopier.task
    if getattr(original, "faulted", False):
        original = original.original  # type: ignore[attr-defined]

    def struck(self: Any, shard: Any) -> Any:
        _strike(np.zeros(1), fault, reached, [{"chunk-location": (shard[0],)}])
        return original(self, shard)

    struck.faulted, struck.original = True, original  # type: ignore[attr-defined]
    ShardCopier.task = struck  # type: ignore[method-assign]


def disarm_convert() -> None:
    from shardwise.conversion.copy import ShardCopier

    if getattr(ShardCopier.task, "faulted", False):
        ShardCopier.task = ShardCopier.task.original  # type: ignore[attr-defined]


# -- what must be there ----------------------------------------------------------------------------


def expected(scenario: str) -> dict[str, np.ndarray]:
    """The values every reader must see, by array path from the root."""
    front, mode = scenario.split("-", 1)
    if front == "array":
        if mode == "region":
            v = rows(0, 16, salt=9)
            v[slice(*REGION)] = rows(REGION[0], REGION[1] - REGION[0], salt=1)
            return {"v": v}
        kept = {"v": rows(0, BASE_ROWS, salt=9)} if mode == "w" else {}
        return {"arr": rows(0, NEW_ROWS, salt=1), **kept}
    if front == "dataset":
        if mode == "append":
            return {"v": np.concatenate([rows(0, BASE_ROWS, 9), rows(BASE_ROWS, NEW_ROWS, 1)])}
        if mode.startswith("region"):
            v = rows(0, 16, salt=9)
            v[slice(*REGION)] = rows(REGION[0], REGION[1] - REGION[0], salt=1)
            return {"v": v}
        return {"v": rows(0, NEW_ROWS, salt=1)}
    if front == "tree":
        if mode == "region-auto":
            v = rows(0, 16, salt=9)
            v[slice(*REGION)] = rows(REGION[0], REGION[1] - REGION[0], salt=1)
            return {"a/v": v, "b/u": v[:, 1] * 2}
        v = rows(0, NEW_ROWS, salt=1)
        return {"a/v": v, "b/u": v[:, 1] * 2}
    if front == "subtree":
        n = NEW_ROWS + (BASE_ROWS if mode == "append" else 0)
        v = rows(0, n, salt=1)
        return {"v": rows(0, BASE_ROWS, salt=9), "g/a/v": v, "g/b/u": v[:, 1] * 2}
    if front == "pyramid":
        img = _image()
        return {"img/0": img, "img/1": img.reshape(8, 2, 8, 2).mean(axis=(1, 3))}
    if front == "convert":
        return {"dst": rows(0, NEW_ROWS)}
    if front == "batch":
        return {"bat": rows(0, 16, salt=1), "v": rows(0, BASE_ROWS, salt=9)}
    raise AssertionError(scenario)


def seen_from_root(
    kind: str, root: Any, endpoint: str = "", scenario: str = ""
) -> dict[str, np.ndarray]:
    """Every array that xarray's own zarr engine finds from the root (consolidated metadata as
    stored), by path. An OME pyramid's group holds levels of other sizes along one dimension,
    which xarray cannot open as one dataset: there zarr-python's consolidated view of the root."""
    if scenario.startswith("pyramid"):
        import zarr

        g = zarr.open_consolidated(open_store(kind, root, endpoint), mode="r")
        return {name: np.asarray(a[...]) for name, a in g.arrays()} | {
            f"img/{name}": np.asarray(a[...])
            for name, a in g["img"].arrays()  # type: ignore[union-attr]
        }
    so = _storage_options(kind, endpoint)
    t = xr.open_datatree(root if kind == "local" else _url(root), engine="zarr", **so)
    out: dict[str, np.ndarray] = {}
    for node in t.subtree:
        for name, var in node.to_dataset(inherit=False).variables.items():
            out[f"{node.path.strip('/')}/{name}".strip("/")] = np.asarray(var.values)
    return out


def _storage_options(kind: str, endpoint: str) -> dict[str, Any]:
    if kind == "local":
        return {}
    from faultkit import CREDS

    return {
        "storage_options": {
            "key": CREDS["key"],
            "secret": CREDS["secret"],
            "client_kwargs": {"endpoint_url": endpoint, "region_name": CREDS["region"]},
        }
    }


def _url(where: str) -> str:
    from faultkit import BUCKET

    return f"s3://{BUCKET}/{where}"


# -- a writer to kill ------------------------------------------------------------------------------


def killed_writer(
    scenario: str, kind: str, where: str, endpoint: str, block: int, reached: Any
) -> None:
    """The child: the scenario's write with source block ``block`` held until SIGKILL."""
    import dask

    with dask.config.set(scheduler="threads", num_workers=4):
        write(scenario, open_store(kind, where, endpoint), Fault("kill", block), reached)


def kill_mid_write(
    ctx: Any, scenario: str, kind: str, where: str, endpoint: str, block: int
) -> None:
    reached = ctx.Event()
    p = ctx.Process(target=killed_writer, args=(scenario, kind, where, endpoint, block, reached))
    p.start()
    try:
        if not reached.wait(timeout=300):
            raise AssertionError(f"{scenario}: the writer never reached block {block}")
    finally:
        if p.pid is not None and p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join(timeout=60)
