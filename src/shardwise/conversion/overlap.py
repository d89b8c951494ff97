"""Refuse a conversion whose destination is its source, lies inside it, or contains it.

``convert`` with ``mode="w"`` clears the destination before it reads the source: were they the
same objects, the source would be gone before its first chunk is copied. A store is reduced to
*where its objects live* (a namespace and a key prefix): local directories by their resolved real
path (symlinks and relative paths resolved), a zarr ``MemoryStore`` by the dict that holds its
objects, S3 by endpoint, bucket and prefix, GCS by bucket and prefix, Azure by account, container
and prefix (through fsspec and obstore alike: both name the same objects), an icechunk store by
its session, anything else by the store object itself. Two nodes overlap when their namespaces
are equal and one key prefix (store root + node path) is the other or lies below it.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import PlanError
from ..storage.store import join, store_name

Place = tuple[tuple[str, ...], str]  # (namespace, key prefix inside it)


def _unwrap(store: Any) -> Any:
    from zarr.storage import WrapperStore

    while isinstance(store, WrapperStore):
        store = store._store
    return store


def _local(path: str) -> Place:
    return ("file",), os.path.realpath(os.path.abspath(path)).strip("/")


# object stores by the service whose buckets they name (fsspec protocols, obstore classes)
_SERVICES = {
    "s3": "s3",
    "s3a": "s3",
    "S3Store": "s3",
    "gs": "gs",
    "gcs": "gs",
    "GCSStore": "gs",
    "az": "az",
    "abfs": "az",
    "abfss": "az",
    "AzureStore": "az",
}


def _fsspec_place(store: Any) -> Place:
    fs = store.fs
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if "file" in protocols or "local" in protocols:
        return _local(store.path)
    service = next((_SERVICES[p] for p in protocols if p in _SERVICES), None)
    if service is not None:  # the path is "bucket/prefix"
        if service == "s3":
            kwargs = getattr(fs, "client_kwargs", None) or {}
            where = getattr(fs, "endpoint_url", None) or kwargs.get("endpoint_url")
        else:
            where = getattr(fs, "account_name", None) if service == "az" else None
        return (service, str(where or "").rstrip("/")), store.path.strip("/")
    if "memory" in protocols:  # fsspec's memory filesystem is one per process
        return ("fsspec-memory",), store.path.strip("/")
    return (protocols[0], str(id(fs))), store.path.strip("/")


def _obstore_place(store: Any) -> Place:
    inner = store.store
    kind = type(inner).__name__
    prefix = str(getattr(inner, "prefix", None) or "").strip("/")
    if kind == "LocalStore":
        return _local("/" + prefix)
    config = getattr(inner, "config", None) or {}
    bucket = config.get("bucket") or config.get("container_name") or config.get("container")
    if bucket is None or kind not in _SERVICES:  # an obstore MemoryStore and the like
        return (kind, str(id(inner))), prefix
    service = _SERVICES[kind]
    where = config.get("endpoint") if service == "s3" else config.get("account_name")
    if service == "gs":
        where = None
    return (service, str(where or "").rstrip("/")), join(str(bucket), prefix)


def place(store: Any) -> Place:
    """Where the objects of zarr ``store`` live: (namespace, key prefix)."""
    from zarr.storage import FsspecStore, LocalStore, MemoryStore, ObjectStore

    store = _unwrap(store)
    if isinstance(store, LocalStore):
        return _local(str(store.root))
    if isinstance(store, MemoryStore):
        return ("memory", str(id(store._store_dict))), ""
    if isinstance(store, FsspecStore):
        return _fsspec_place(store)
    if isinstance(store, ObjectStore):
        return _obstore_place(store)
    return (type(store).__name__, str(id(store))), ""


def _session(store: Any) -> Any:
    """The icechunk session whose store ``store`` is, else None. Two stores of one session
    (``session.store`` is a new object at each call) name the same objects; those of two
    sessions do not (a copy from another session, even of the same snapshot, reads what that
    session holds, whatever this one clears)."""
    from ..storage.icechunk import is_icechunk_store

    store = _unwrap(store)
    return store.session if is_icechunk_store(store) else None


def _inside(inner: str, outer: str) -> bool:
    return not outer or inner == outer or inner.startswith(outer + "/")


def refuse_overlap(zsrc: Any, src_path: str, zdst: Any, dst_path: str) -> None:
    """Raise :class:`PlanError` when the node at ``dst_path`` in ``zdst`` is the node at
    ``src_path`` in ``zsrc``, lies inside it, or contains it."""
    sessions = _session(zsrc), _session(zdst)
    if sessions != (None, None):  # an icechunk store: the same objects within one session
        if None in sessions or sessions[0] != sessions[1]:
            return
        root_src = root_dst = ""
    else:
        (ns_src, root_src), (ns_dst, root_dst) = place(zsrc), place(zdst)
        if ns_src != ns_dst:
            return
    a, b = join(root_src, src_path), join(root_dst, dst_path)
    if not (_inside(a, b) or _inside(b, a)):
        return
    how = "is" if a == b else "lies inside" if _inside(b, a) else "contains"
    raise PlanError(
        f"the destination {store_name(zdst)} path {dst_path or '/'!r} {how} the source "
        f"{store_name(zsrc)} path {src_path or '/'!r}: convert never writes over its own "
        "source (it would be cleared before it is read). To reshard in place, convert to "
        "another location, verify it, then swap it in (rename or move) and delete the old one"
    )
