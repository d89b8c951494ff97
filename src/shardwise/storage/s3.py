"""What is particular to object stores reached over S3's API, in one place.

Client discovery
    :func:`obstore_of` (zarr's ``ObjectStore`` over obstore: S3, and GCS and Azure, whose
    conditional puts obstore offers the same way), :func:`s3fs_of` (zarr's ``FsspecStore`` over
    s3fs), :func:`s3_client` (a botocore-style ``call(method, **kw)`` for either, used for
    multipart uploads) and :func:`multipart_client`.
Multipart uploads
    :func:`abort_multipart_uploads`: the invisible leftovers of killed writers.
Create if absent
    :func:`create_if_absent`: ``If-None-Match: *`` through s3fs (zarr's ``FsspecStore`` checks
    then sets, which is not atomic).
Conditional puts
    versioned gets and heads and puts with ``If-Match`` / ``If-None-Match`` through obstore
    (``obstore_*``) and s3fs (``s3fs_*``); a generation is ``(ETag, version)`` and a put whose
    precondition failed returns None. :mod:`shardwise.storage.conditional` builds on them.
"""

from __future__ import annotations

import datetime
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from zarr.core.sync import sync

from ..compat import pipe_file_async, s3_call
from .store import ShardStore

Call = Callable[..., Any]


# -- client discovery -----------------------------------------------------------------------------


def obstore_of(zstore: Any) -> Any | None:
    """The obstore store (S3, GCS or Azure) inside a zarr ``ObjectStore``, else None."""
    inner = getattr(zstore, "store", None)
    return inner if type(inner).__name__ in ("S3Store", "GCSStore", "AzureStore") else None


def s3fs_of(zstore: Any) -> Any | None:
    """The s3fs filesystem of a zarr ``FsspecStore`` on S3, else None."""
    fs = getattr(zstore, "fs", None)
    if fs is not None and "s3" in (getattr(fs, "protocol", None) or ()):
        return fs
    return None


def bucket_prefix(zstore: Any) -> tuple[str, str]:
    """The bucket and key prefix of an s3fs-backed zarr store."""
    bucket, _, prefix = str(zstore.path).strip("/").partition("/")
    return bucket, prefix


def s3_client(zstore: Any) -> tuple[Call, str, str] | None:
    """(call(method, **kw), bucket, key prefix) for an S3-backed zarr store, else None."""
    inner: Any = getattr(zstore, "store", None)
    if type(inner).__name__ == "S3Store":
        cfg = dict(inner.config)
        opts = dict(inner.client_options or {})
        endpoint = cfg.get("endpoint") or cfg.get("aws_endpoint")
        if endpoint and not str(endpoint).startswith("http"):
            endpoint = ("http://" if opts.get("allow_http") == "true" else "https://") + endpoint
        client = botocore_client(
            endpoint,
            cfg.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            cfg.get("access_key_id"),
            cfg.get("secret_access_key"),
            cfg.get("session_token") or cfg.get("token"),
        )

        def call(method: str, **kw: Any) -> Any:
            return getattr(client, method)(**kw)

        prefix = (inner.prefix or "").strip("/")
        return call, str(cfg["bucket"]), prefix
    fs = s3fs_of(zstore)
    if fs is not None:
        bucket, prefix = bucket_prefix(zstore)
        return fs.call_s3, bucket, prefix
    return None


# A botocore client is thread-safe and costs 0.1-0.3 s to build (its service model is loaded per
# session), a merge or multipart upload asks for one each time: one client per endpoint and
# credentials per process (a forked child builds its own: a client's connections are not shared
# across processes).
_CLIENTS: dict[tuple[Any, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()
_CLIENTS_PID = [os.getpid()]


def botocore_client(endpoint: Any, region: str, key: Any, secret: Any, token: Any) -> Any:
    """This process's botocore S3 client for these settings, built once."""
    import botocore.session

    settings = (endpoint, region, key, secret, token)
    with _CLIENTS_LOCK:
        if _CLIENTS_PID[0] != os.getpid():
            _CLIENTS.clear()
            _CLIENTS_PID[0] = os.getpid()
        client = _CLIENTS.get(settings)
        if client is None:
            client = _CLIENTS[settings] = botocore.session.get_session().create_client(
                "s3",
                endpoint_url=endpoint,
                region_name=region,
                aws_access_key_id=key,
                aws_secret_access_key=secret,
                aws_session_token=token,
            )
    return client


def multipart_client(store: ShardStore) -> tuple[Call, str, str] | None:
    """An S3 client for multipart uploads to ``store`` (obstore's S3 stores; s3fs stores are
    written whole: their client runs on fsspec's own event loop, not from any thread)."""
    try:
        from obstore.store import S3Store
    except ImportError:  # obstore is optional
        return None
    if not isinstance(getattr(store.store, "store", None), S3Store):
        return None
    return s3_client(store.store)


# -- multipart uploads ----------------------------------------------------------------------------


def abort_multipart_uploads(
    store: ShardStore, keys: Iterable[str], before: datetime.datetime | None = None
) -> list[str]:
    """Abort the unfinished multipart uploads of ``keys`` (S3 only) started before ``before``.

    An upload abandoned by a killed writer is invisible but keeps its parts (and their cost)
    until aborted. Returns the keys whose uploads were aborted.
    """
    target = s3_client(store.store)
    if target is None:
        return []
    call, bucket, prefix = target
    full = {"/".join(p for p in (prefix, store.key(k)) if p): k for k in keys}
    if not full:
        return []
    list_prefix = "/".join(p for p in (prefix, store.path) if p)
    aborted = []
    kw: dict[str, Any] = {"Bucket": bucket, "Prefix": list_prefix + "/" if list_prefix else ""}
    while True:
        page = call("list_multipart_uploads", **kw)
        for up in page.get("Uploads", []):
            started = up.get("Initiated")
            if up["Key"] not in full or (before is not None and started and started >= before):
                continue
            call("abort_multipart_upload", Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
            aborted.append(full[up["Key"]])
        if not page.get("IsTruncated"):
            return aborted
        kw["KeyMarker"] = page.get("NextKeyMarker")
        kw["UploadIdMarker"] = page.get("NextUploadIdMarker")


# -- create if absent -----------------------------------------------------------------------------


def create_if_absent(zstore: Any, fs: Any, key: str, data: bytes) -> None:
    """Create ``key`` of the s3fs store ``zstore`` (filesystem ``fs``) with ``data`` unless it
    exists (then leave it untouched): one put with ``If-None-Match: *``."""
    try:
        # zarr's fs is asynchronous (no loop of its own): run the coroutine on zarr's loop
        path = f"{zstore.path.rstrip('/')}/{key}"
        sync(pipe_file_async(fs, path, data, mode="create"))
    except (FileExistsError, OSError) as e:
        if "PreconditionFailed" not in repr(e) and not isinstance(e, FileExistsError):
            raise


# -- conditional puts -----------------------------------------------------------------------------


def _joined(parts: Sequence[Any]) -> Any:
    return parts[0] if len(parts) == 1 else b"".join(parts)


def obstore_get(inner: Any, key: str) -> tuple[bytes | None, Any]:
    """The object's bytes and generation, ``(None, None)`` when it is missing."""
    import obstore
    from obstore.exceptions import NotFoundError

    try:
        got = obstore.get(inner, key)
    except (NotFoundError, FileNotFoundError):
        return None, None
    data = got.bytes().to_bytes()
    return data, (got.meta["e_tag"], got.meta["version"])


def obstore_head(inner: Any, key: str) -> Any:
    import obstore
    from obstore.exceptions import NotFoundError

    try:
        meta = obstore.head(inner, key)
    except (NotFoundError, FileNotFoundError):
        return None
    return (meta["e_tag"], meta["version"])


def obstore_put_if(inner: Any, key: str, parts: Sequence[Any], expected: Any) -> Any | None:
    """Put ``parts`` if the object has generation ``expected`` (None: is absent); the new
    generation, or None when the precondition failed."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    mode: Any = "create"
    if expected is not None:
        mode = {"e_tag": expected[0]}
        if expected[1] is not None:
            mode["version"] = expected[1]
    try:
        # one request: a multipart upload would not carry the precondition
        res = obstore.put(inner, key, _joined(parts), mode=mode, use_multipart=False)
    except (AlreadyExistsError, PreconditionError):
        return None
    return (res["e_tag"], res["version"])


def precondition_failed(e: BaseException) -> bool:
    """True when an s3fs error is S3's answer to a failed ``If-Match`` / ``If-None-Match``."""
    seen = [e, e.__cause__, e.__context__]
    return isinstance(e, FileExistsError) or any(
        x is not None and ("PreconditionFailed" in repr(x) or "412" in str(x)) for x in seen
    )


def s3fs_get(fs: Any, bucket: str, key: str) -> tuple[bytes | None, Any]:
    async def go() -> tuple[bytes | None, Any]:
        try:
            resp = await s3_call(fs, "get_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None, None
        body = resp["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return bytes(data), (resp["ETag"], resp.get("VersionId"))

    return sync(go())


def s3fs_head(fs: Any, bucket: str, key: str) -> Any:
    try:
        resp = sync(s3_call(fs, "head_object", Bucket=bucket, Key=key))
    except FileNotFoundError:
        return None
    return (resp["ETag"], resp.get("VersionId"))


def s3fs_put_if(fs: Any, bucket: str, key: str, parts: Sequence[Any], expected: Any) -> Any | None:
    """As :func:`obstore_put_if`, through s3fs: ``PutObject`` with ``IfMatch`` /
    ``IfNoneMatch``."""
    cond = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected[0]}
    try:
        resp = sync(
            s3_call(fs, "put_object", Bucket=bucket, Key=key, Body=bytes(_joined(parts)), **cond)
        )
    except OSError as e:
        if precondition_failed(e):
            return None
        raise
    return (resp["ETag"], resp.get("VersionId"))
