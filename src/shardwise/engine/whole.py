"""Full loads of an opened array as one read into one output, whatever door computes them.

``xr.open_dataset(p, engine="shardwise", chunks={})`` builds its dask arrays itself, with
``dask.array.from_array`` over xarray's lazy wrappers of our backend array: plain dask arrays, one
getter task per block. Computing one whole (``.load()``, ``.values``, ``.compute()``,
``np.asarray``, ``dask.compute`` of several) would run every block task, each allocating its
block, then dask's ``finalize`` task copies them all, on one thread, into a new array: twice the
output in fresh memory and a copy ``read_array`` never makes.

Dask hands every array graph to the ``array_optimize`` function of its configuration before it
runs it, with the ``finalize`` task of each computed collection in it. :func:`optimize` (installed
there by :func:`install` when shardwise opens an array or a dataset) rewrites it first: where a
``finalize`` task takes exactly every block of a ``from_array`` layer whose source is shardwise's
(and nothing else in the graph uses those blocks), it takes instead the result of one
``shardwise-whole-`` task, ``source[...]`` -- which the backend array serves with
``read_selection``, every inner chunk decoded into its place in one output on the shared pool --
and the block tasks go. dask's ``finalize`` (and our ``assemble``) become :func:`unpack`, which
hands that output over as it is (dask's would copy a lone block); xarray's postcompute of a
Dataset or DataArray finalizes each variable with dask's, so there the output travels as a
:class:`Fresh` array whose ``copy()`` is the output itself. Then dask's own optimization runs.

Everything else is left to dask: a slice, a reduction, arithmetic or a rechunk of the array uses
its blocks, so its graph keeps them (and reads per shard, or only what a slice touches). Graphs
bound for a distributed client or another scheduler set as the default keep their blocks too
(there the blocks spread the reads over the workers), and so do graphs computed under a dask
callback (a progress bar or profiler counts the tasks it expects), as ``ShardArray.compute`` does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..compat import dask_task_spec as _spec
from ..compat import default_runs_locally
from .read import ShardReader

__all__ = ["install", "optimize", "read_whole", "shardwise_source"]

# how deep xarray's lazy wrappers (adapter, copy-on-write, cached, lazily indexed, CF decoding)
# may nest over the backend array before we stop looking
_MAX_WRAPPERS = 12


def install() -> None:
    """Make :func:`optimize` dask's array optimization, unless one is configured already (a
    user's ``dask.config.set(array_optimize=...)`` is left alone: whole loads then run as
    dask's block graph). It stays in dask's global configuration, which worker processes
    inherit (pickled: by reference); a cluster that sends the configuration as JSON
    (distributed's SSHCluster) cannot serialize it."""
    import dask

    if "array_optimize" not in dask.config.config:
        dask.config.set({"array_optimize": optimize})


def optimize(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """Dask's array optimization, after whole reads replace the block graphs of whole loads."""
    from dask.array.optimization import optimize as dask_optimize

    return dask_optimize(whole_reads(dsk), keys, **kwargs)


def shardwise_source(obj: Any) -> bool:
    """True when ``obj`` is, or lazily wraps (through ``.array``), an array read by a
    :class:`ShardReader` (the backend array of the xarray engine, open_array's view)."""
    for _ in range(_MAX_WRAPPERS):
        if isinstance(getattr(obj, "reader", None), ShardReader):
            return True
        obj = getattr(obj, "array", None)
        if obj is None:
            return False
    return False


def read_whole(source: Any, fresh: bool = False) -> np.ndarray:
    """All of ``source``: what the block tasks would have read, in one output; with ``fresh``,
    as a :class:`Fresh` array (for a finalizer that copies what it is given)."""
    out = np.asarray(source[tuple(slice(None) for _ in source.shape)])
    return out.view(Fresh) if fresh else out


class Fresh(np.ndarray):  # type: ignore[type-arg]
    """An output read for one result alone, on its way through xarray's postcompute: dask's
    ``finalize`` there copies a lone block (in case it is a buffer held by the graph); this one
    is not, and its first ``copy()`` (that one) hands over the same memory as a plain array
    instead. Any later ``copy()`` copies."""

    handed = False

    def copy(self, order: Any = "C") -> np.ndarray:  # type: ignore[override]
        if self.handed:
            return np.array(self, order=order, subok=False)
        self.handed = True
        return self.view(np.ndarray)


def unpack(results: Any, *_: Any) -> Any:
    """The lone result in ``results`` (nested one level per axis), as it is: dask's ``finalize``
    would copy it, but it was read for this result alone."""
    while isinstance(results, list | tuple):
        (results,) = results
    return results


def whole_reads(dsk: Any) -> Any:
    """``dsk`` with each whole load of a shardwise source as one read (see the module); the
    graph itself when there is none, or when the graph is not bound for a local scheduler."""
    from dask.highlevelgraph import HighLevelGraph

    if not isinstance(dsk, HighLevelGraph) or _spec() is None:
        return dsk
    users: dict[str, int] = {}
    for deps in dsk.dependencies.values():
        for dep in deps:
            users[dep] = users.get(dep, 0) + 1
    sources = {
        name: key
        for name in dsk.layers
        if users.get(name) == 1 and (key := _getter_source(dsk, name)) is not None
    }
    if not sources or not default_runs_locally():  # graphs of other arrays pay no more
        return dsk
    layers = dict(dsk.layers)
    dependencies = {k: set(v) for k, v in dsk.dependencies.items()}
    changed = False
    for name in list(layers):
        if name.startswith("finalize-") and dependencies[name] & sources.keys():
            changed |= _rewrite(dsk, layers, dependencies, name, sources)
    return HighLevelGraph(layers, dependencies) if changed else dsk


def _rewrite(
    dsk: Any,
    layers: dict[str, Any],
    dependencies: dict[str, set[str]],
    name: str,
    sources: dict[str, str],
) -> bool:
    """In the finalize layer ``name``, each complete block structure of a layer of ``sources``
    becomes one ``shardwise-whole-`` task's result, nested as deep (dask's ``finalize``, our
    ``assemble`` and xarray's postcompute unpack a lone block as it is, without a copy); the
    blocks layers go. False when there is nothing to rewrite."""
    spec = _spec()
    from dask.highlevelgraph import MaterializedLayer

    task = _single_task(layers[name])
    if task is None:
        return False
    from dask.array.core import finalize

    from .assemble import assemble

    done: dict[str, str] = {}
    args = tuple(_replace(a, dsk, sources, done) for a in task.args)
    func = unpack if task.func in (finalize, assemble) else task.func
    new = spec.Task(name, func, *args, **task.kwargs)
    if not done or any(isinstance(k, tuple) and k[0] in done for k in new.dependencies):
        return False  # nothing whole, or blocks still wanted one by one
    if func is not unpack and not _xarray_postcompute(func):
        return False  # a finalizer we do not know: it might keep or copy what it is given
    layers[name] = MaterializedLayer({name: new})
    for blocks, whole in done.items():
        read = spec.Task(whole, read_whole, spec.TaskRef(sources[blocks]), func is not unpack)
        layers[whole] = MaterializedLayer({whole: read})
        dependencies[whole] = {sources[blocks]}
        del layers[blocks], dependencies[blocks]
    dependencies[name] = (dependencies[name] - done.keys()) | set(done.values())
    return True


def _xarray_postcompute(func: Any) -> bool:
    """True for the postcompute of an xarray Dataset or DataArray (each of its variables goes
    through dask's ``finalize``, which copies a lone block: see :class:`Fresh`)."""
    owner = getattr(func, "__self__", None)  # a Dataset, or the DataArray class
    kind = owner if isinstance(owner, type) else type(owner)
    return kind.__module__.startswith("xarray.") and getattr(func, "__name__", "") in (
        "_dask_postcompute",
        "_dask_finalize",
    )


def _replace(node: Any, dsk: Any, sources: dict[str, str], done: dict[str, str]) -> Any:
    """``node`` (an argument of a finalize task) with every nested list that holds exactly the
    blocks of one layer of ``sources`` replaced by the ``shardwise-whole-`` task's result."""
    spec = _spec()

    if not isinstance(node, spec.List):
        return node
    keys = node.dependencies
    names = {k[0] if isinstance(k, tuple) else None for k in keys}
    blocks = next(iter(names)) if len(names) == 1 else None
    if (
        isinstance(blocks, str)
        and blocks in sources
        and blocks not in done
        and keys == set(dsk.layers[blocks].get_output_keys())
    ):
        done[blocks] = whole = f"shardwise-whole-{blocks}"
        out: Any = spec.TaskRef(whole)
        while isinstance(node, spec.List):  # one level per axis
            out, node = spec.List(out), node.args[0]
        return out
    return spec.List(*(_replace(a, dsk, sources, done) for a in node.args))


def _single_task(layer: Any) -> Any:
    """The one task of a materialized one-task layer (a finalize layer), else None."""
    spec = _spec()
    from dask.highlevelgraph import MaterializedLayer

    if not isinstance(layer, MaterializedLayer) or len(layer.mapping) != 1:
        return None
    (task,) = layer.mapping.values()
    return task if isinstance(task, spec.Task) else None


def _getter_source(dsk: Any, name: str) -> str | None:
    """The key of the source array when layer ``name`` is ``from_array``'s getter layer over a
    shardwise source held in its own layer (not inlined, no lock); else None."""
    spec = _spec()
    from dask.array.core import getter, getter_nofancy
    from dask.blockwise import Blockwise

    layer = dsk.layers.get(name)
    if not isinstance(layer, Blockwise) or len(layer.indices) != 2:
        return None
    task = layer.task
    if task.func not in (getter, getter_nofancy) or len(task.args) != 2:
        return None
    if set(task.kwargs) - {"asarray", "lock"} or task.kwargs.get("lock"):
        return None  # a lock, or anything else we would not honour
    (ref, no_index), (slices, _) = layer.indices
    if not isinstance(ref, spec.TaskRef) or no_index is not None or slices not in layer.io_deps:
        return None
    key = ref.key
    if not isinstance(key, str):
        return None
    source = dsk.layers.get(key)
    if source is None or dsk.dependencies.get(name) != {key}:
        return None
    value = source.get(key)
    value = value.value if isinstance(value, spec.DataNode) else value
    return key if shardwise_source(value) else None
