"""S3's range merge: the new shard built by a multipart upload from ranges of the old one.

Unchanged ranges go as ``UploadPartCopy`` parts (S3 copies them inside the service, with
``x-amz-copy-source-if-match``: only from the version read), the changed chunks and the index as
uploaded parts, the index last; ``CompleteMultipartUpload`` carries ``If-Match`` with the
version read (S3 honours it since 2024-11), so the commit is conditional as every shared
commit is (:mod:`.conditional`). Every part but the last must be at least 5 MiB
(:data:`MIN_PART`): :func:`plan_parts` keeps ranges of that size as copies and uploads the rest,
reading small ranges between changed chunks (and the bytes a too-small uploaded part borrows
from the next range) from the old object. A failed or conflicting merge aborts its upload; a
killed one leaves an invisible upload that a resume's clean-up aborts
(:func:`~shardwise.storage.s3.abort_multipart_uploads`); the old object stays whole.

The requests go through botocore (:func:`~shardwise.storage.s3.multipart_client`, the
project's multipart path): obstore has no ``UploadPartCopy``. Stores reached through s3fs merge
whole objects (their client runs on fsspec's own event loop, not from a task's thread).

A 3-byte changed chunk borrows the head of the next range to make a 5 MiB part; a range too
short to leave 5 MiB behind is uploaded whole:

>>> for part in plan_parts([(0, 8 << 20), b"new", (9 << 20, 12 << 20), b"index"]):
...     print(part)
('copy', (0, 8388608))
('upload', [b'new', (9437184, 5242877)])
('copy', (14680061, 7340035))
('upload', [b'index'])
>>> plan_parts([(0, 8 << 20), b"new", (9 << 20, 8 << 20), b"index"])
[('copy', (0, 8388608)), ('upload', [b'new', (9437184, 8388608), b'index'])]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import s3
from .conditional import CONFLICT
from .meter import count
from .store import ShardStore

MIN_PART = 5 << 20  # S3's smallest part but the last
MAX_PART = 5 << 30  # S3's largest part

Part = tuple[str, Any]  # ("copy", (offset, nbytes)) or ("upload", [segments])


def client_of(store: ShardStore) -> tuple[s3.Call, str, str] | None:
    return s3.multipart_client(store)


def plan_parts(segments: Sequence[Any], *, min_part: int | None = None) -> list[Part]:
    """The parts of a multipart upload of ``segments`` (``(offset, nbytes)`` ranges of the old
    object, or bytes-like): ranges of ``min_part`` bytes (:data:`MIN_PART`) or more are
    copied, everything else uploaded in parts of at least ``min_part`` (the last may be
    smaller), taking the head of the next range when an uploaded part would be too small."""
    min_part = MIN_PART if min_part is None else min_part
    parts: list[Part] = []
    pending: list[Any] = []
    size = 0
    for seg in segments:
        n = seg[1] if isinstance(seg, tuple) else len(seg)
        if isinstance(seg, tuple) and n >= min_part:
            if pending and size < min_part:
                need = min_part - size
                if n - need < min_part:  # too little would be left to copy: upload it all
                    pending, size = [*pending, seg], size + n
                    continue
                pending.append((seg[0], need))
                seg = (seg[0] + need, n - need)
            if pending:
                parts.append(("upload", pending))
                pending, size = [], 0
            parts.extend(("copy", r) for r in _split(seg))
        else:
            pending, size = [*pending, seg], size + n
    if pending:
        parts.append(("upload", pending))
    return parts


def _split(seg: tuple[int, int]) -> list[tuple[int, int]]:
    o, n = seg
    k = -(-n // MAX_PART)
    step_ = -(-n // k)
    return [(o + a, min(step_, n - a)) for a in range(0, n, step_)]


def open_s3(store: ShardStore, name: str, step: Callable[[str], None]) -> S3Source | None:
    """The object ``name`` open for a splice (None: missing, or not an S3 store); ``step``
    is called with the name of each step of a commit (tests stop a merge there)."""
    target = client_of(store)
    if target is None:
        return None
    call, bucket, prefix = target
    key = "/".join(p for p in (prefix, store.key(name)) if p)
    try:
        head = call("head_object", Bucket=bucket, Key=key)
    except Exception as e:  # botocore's ClientError
        if _code(e) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    count("size")
    if int(head["ContentLength"]) < 2 * MIN_PART:  # no range worth a copy: merged whole
        return None
    src = S3Source(call, bucket, key, int(head["ContentLength"]), head["ETag"],
                   _version(head))  # fmt: skip
    src.step = step
    return src


class S3Source:
    """One version of an S3 object, open for a splice (see the module's docstring)."""

    kind = "s3 ranges"

    def __init__(
        self, call: s3.Call, bucket: str, key: str, size: int, etag: str, version: Any
    ) -> None:
        self.call, self.bucket, self.key, self.size = call, bucket, key, size
        self.etag = etag
        self.step: Callable[[str], None] = lambda _: None
        self.generation = (etag, version)  # as conditional's obstore generations

    def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        out = []
        for o, n in ranges:
            if n == 0:
                out.append(b"")
                continue
            got = self.call("get_object", Bucket=self.bucket, Key=self.key,
                            Range=f"bytes={o}-{o + n - 1}", IfMatch=self.etag)  # fmt: skip
            data = got["Body"].read()
            count("get", len(data))
            out.append(data)
        return out

    def close(self) -> None:
        pass

    def worth_copying(self, ranges: Sequence[tuple[int, int]]) -> bool:
        """Some untouched range fills a part (else one whole put does better)."""
        return any(n >= MIN_PART for _, n in ranges)

    def worth(self, segments: Sequence[Any]) -> bool:
        """Whether a splice copies anything (else one whole put does better)."""
        return any(kind == "copy" for kind, _ in plan_parts(segments))

    def commit(self, segments: Sequence[Any]) -> Any:
        where = dict(Bucket=self.bucket, Key=self.key)
        upload = self.call("create_multipart_upload", **where)["UploadId"]
        count("put")
        try:
            done = [self._part(n, part, upload) for n, part in enumerate(plan_parts(segments), 1)]
            self.step("complete")
            got = self.call("complete_multipart_upload", **where, UploadId=upload,
                            MultipartUpload={"Parts": done}, IfMatch=self.etag)  # fmt: skip
            count("put")
        except BaseException as e:
            try:
                self.call("abort_multipart_upload", **where, UploadId=upload)
                count("delete")
            except Exception:
                pass  # a resume's clean-up aborts it
            if isinstance(e, Exception) and _code(e) in (
                "PreconditionFailed",
                "412",
                "ConditionalRequestConflict",
                "409",
            ):
                return CONFLICT  # fmt: skip
            raise
        self.step("committed")  # the new shard stored, its record not yet
        return (got["ETag"], _version(got))

    def _part(self, number: int, part: Part, upload: str) -> dict[str, Any]:
        self.step("part")
        kind, what = part
        where = dict(Bucket=self.bucket, Key=self.key, UploadId=upload, PartNumber=number)
        if kind == "copy":
            o, n = what
            got = self.call("upload_part_copy", **where,
                            CopySource={"Bucket": self.bucket, "Key": self.key},
                            CopySourceRange=f"bytes={o}-{o + n - 1}",
                            CopySourceIfMatch=self.etag)  # fmt: skip
            count("copy", n)
            return {"PartNumber": number, "ETag": got["CopyPartResult"]["ETag"]}
        ranges = [s for s in what if isinstance(s, tuple)]
        read = iter(self.read(ranges))
        body = b"".join(next(read) if isinstance(s, tuple) else bytes(s) for s in what)
        got = self.call("upload_part", **where, Body=body)
        count("put", len(body))
        return {"PartNumber": number, "ETag": got["ETag"]}


def _version(answer: dict[str, Any]) -> Any:
    """An answer's version as obstore gives it (None for an unversioned object, which
    botocore may give as "null")."""
    v = answer.get("VersionId")
    return None if v in (None, "null") else v


def _code(e: BaseException) -> str:
    err = getattr(e, "response", {}).get("Error", {})
    return str(err.get("Code", ""))
