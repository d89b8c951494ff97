"""The backend of :class:`~shardwise.storage.store.ShardStore` for every zarr store but a local
directory: zarr's async API run on zarr's own event loop, every request retried by
:data:`~shardwise.storage.retry.STORE_REQUESTS`; a suffix read fetches the size alongside."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from zarr.abc.store import RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from .retry import STORE_REQUESTS


@dataclass(frozen=True)
class ZarrStoreBackend:
    """Any zarr store, through its async API on zarr's event loop; every request is retried
    by :data:`~shardwise.storage.retry.STORE_REQUESTS`."""

    store: Store
    root: None = None

    def get(self, key: str) -> bytes | None:
        buf = _again(lambda: self.store.get(key, default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def size(self, key: str) -> int | None:
        try:
            return int(_again(lambda: self.store.getsize(key)))
        except FileNotFoundError:
            return None

    def get_suffix(self, key: str, n: int) -> tuple[bytes, int] | None:
        store = self.store

        async def go() -> tuple[Any, int] | None:
            proto = default_buffer_prototype()
            size, buf = await asyncio.gather(
                store.getsize(key),
                store.get(key, proto, SuffixByteRequest(n)),
                return_exceptions=True,
            )
            for got in (size, buf):
                if isinstance(got, FileNotFoundError):
                    return None
            if isinstance(size, BaseException):
                raise size
            if isinstance(buf, BaseException):
                if size >= n:
                    raise buf
                # S3 via obstore refuses a suffix range on an empty object: fetch it whole
                buf = await store.get(key, proto)
            return (None, size) if buf is None else (buf, size)

        got = _again(go)
        if got is None or got[0] is None:
            return None
        return got[0].to_bytes(), int(got[1])

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        proto = default_buffer_prototype()

        async def go() -> list[Any]:
            return await asyncio.gather(
                *(self.store.get(key, proto, RangeByteRequest(o, o + n)) for o, n in ranges)
            )

        out = []
        for buf in _again(go):
            if buf is None:
                raise FileNotFoundError(f"{key!r} disappeared while it was being read")
            out.append(buf.to_bytes())
        return out

    def put(self, key: str, parts: Sequence[Any]) -> None:
        joined = parts[0] if len(parts) == 1 else b"".join(parts)
        buf = default_buffer_prototype().buffer.from_bytes(joined)
        _again(lambda: self.store.set(key, buf))

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            _again(lambda: self.store.delete(key))

    def list(self, prefix: str) -> list[str]:
        async def go() -> list[str]:
            return [k async for k in self.store.list_prefix(prefix + "/" if prefix else "")]

        return sorted(_again(go))


def _again[T](make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run an idempotent store request on zarr's loop under :data:`STORE_REQUESTS`."""
    return STORE_REQUESTS.call(lambda: sync(make()))
