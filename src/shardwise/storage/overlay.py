"""A dry-run overlay of a zarr store: reads fall through, writes and deletes stay in memory.

Code that writes zarr metadata (xarray's ``to_zarr``, ``zarr.create_array``, ...) can run against
an :class:`Overlay` first: it sees the real store, but nothing reaches it. Only when every check
has passed does :meth:`Overlay.commit` apply the recorded changes, so a refused write leaves the
store byte-identical.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.sync import sync

__all__ = ["Overlay", "delete_under", "prune", "read_only"]


def read_only(store: Store) -> Store:
    """A read-only view of ``store`` (the store itself when it has no such view)."""
    try:
        return store.with_read_only(True)
    except NotImplementedError:
        return store


def _byte_slice(buf: Buffer, req: ByteRequest | None) -> Buffer:
    n = len(buf)
    if req is None:
        return buf
    if isinstance(req, RangeByteRequest):
        return buf[req.start : min(req.end, n)]
    if isinstance(req, OffsetByteRequest):
        return buf[req.offset :]
    if isinstance(req, SuffixByteRequest):
        return buf[max(0, n - req.suffix) :]
    # the wording of zarr's own stores, so callers matching on it see the same error
    raise TypeError(f"Unexpected byte_range, got {req!r}")


class Overlay(Store):
    """A dry-run view of ``base``: reads fall through, writes and deletes stay in memory.

    :meth:`commit` applies the recorded changes (prefix deletes, key deletes, then the writes,
    deepest keys first so a group's consolidated metadata lands last) to a writable store.
    """

    def __init__(self, base: Store, *, read_only: bool = False) -> None:
        # ``read_only`` as every zarr store takes it, so ``Overlay.open(base, read_only=True)``
        # and :meth:`with_read_only` give a view that refuses writes
        super().__init__(read_only=read_only)
        self._base = base
        self._written: dict[str, Buffer] = {}
        self._deleted: set[str] = set()
        self._deleted_dirs: list[str] = []

    def with_read_only(self, read_only: bool = False) -> Overlay:
        """A view of the same overlay (same recorded changes) with another read-only flag."""
        view = Overlay(self._base, read_only=read_only)
        view._written, view._deleted, view._deleted_dirs = (
            self._written,
            self._deleted,
            self._deleted_dirs,
        )
        return view

    def __eq__(self, other: object) -> bool:
        # equal when they show the same thing: the same base with the same recorded changes
        # (as zarr's MemoryStore compares its contents), so a pickled copy equals its original;
        # mutable, so not hashable
        return (
            isinstance(other, Overlay)
            and self.read_only == other.read_only
            and self._base == other._base
            and self._deleted_dirs == other._deleted_dirs
            and self._deleted == other._deleted
            and self._written.keys() == other._written.keys()
            and all(v.to_bytes() == other._written[k].to_bytes() for k, v in self._written.items())
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        ro = ", read_only=True" if self.read_only else ""
        return f"Overlay({self._base!r}{ro})"

    def _hidden(self, key: str) -> bool:
        if key in self._written:
            return False
        return key in self._deleted or any(key.startswith(_dir(p)) for p in self._deleted_dirs)

    @property
    def changes(self) -> tuple[list[str], list[str], list[str]]:
        """(deleted prefixes, deleted keys, written keys): what :meth:`commit` would do."""
        return list(self._deleted_dirs), sorted(self._deleted), sorted(self._written)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if key in self._written:
            return _byte_slice(self._written[key], byte_range)
        if self._hidden(key):
            return None
        try:
            return await self._base.get(key, prototype, byte_range)
        except FileNotFoundError:  # the base store does not exist yet
            return None

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return [await self.get(k, prototype, r) for k, r in key_ranges]

    async def exists(self, key: str) -> bool:
        if key in self._written:
            return True
        if self._hidden(key):
            return False
        try:
            return await self._base.exists(key)
        except FileNotFoundError:
            return False

    @property
    def supports_writes(self) -> bool:
        return True

    @property
    def supports_deletes(self) -> bool:
        return True

    @property
    def supports_listing(self) -> bool:
        return True

    @property
    def supports_consolidated_metadata(self) -> bool:
        return bool(getattr(self._base, "supports_consolidated_metadata", True))

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()  # a read-only view records nothing
        self._written[key] = value
        self._deleted.discard(key)

    async def delete(self, key: str) -> None:
        self._check_writable()
        self._written.pop(key, None)
        self._deleted.add(key)

    async def delete_dir(self, prefix: str) -> None:
        self._check_writable()
        d = _dir(prefix)
        for k in [k for k in self._written if k.startswith(d)]:
            del self._written[k]
        self._deleted_dirs.append(prefix)

    async def _base_keys(self, prefix: str) -> AsyncIterator[str]:
        try:
            async for k in self._base.list_prefix(prefix):
                yield k
        except FileNotFoundError:
            return
        except ValueError as e:  # icechunk refuses to list a prefix that names no node
            if "bad key prefix" not in str(e):
                raise
            return

    async def list(self) -> AsyncIterator[str]:  # type: ignore[override]
        async for k in self.list_prefix(""):
            yield k

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        async for k in self._base_keys(prefix):
            if k not in self._written and not self._hidden(k):
                yield k
        for k in list(self._written):
            if k.startswith(prefix):
                yield k

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        d = _dir(prefix)
        seen: set[str] = set()
        try:
            async for child in self._base.list_dir(prefix):
                if child not in seen and await self._visible_child(d + child):
                    seen.add(child)
                    yield child
        except FileNotFoundError:
            pass
        for k in list(self._written):
            if k.startswith(d):
                child = k[len(d) :].split("/", 1)[0]
                if child not in seen:
                    seen.add(child)
                    yield child

    async def _visible_child(self, key: str) -> bool:
        """Whether the base's ``key`` (a key, a directory or both) still shows: a directory
        whose keys are all deleted one by one is gone too. Only a child that recorded deletes
        touch is looked into, so listing a large untouched base stays one listing."""
        sub = key + "/"
        touched = (
            key in self._deleted
            or any(k.startswith(sub) for k in self._deleted)
            or any(sub.startswith(_dir(p)) or _dir(p).startswith(sub) for p in self._deleted_dirs)
        )
        if not touched or await self.exists(key):
            return True
        async for _ in self.list_prefix(sub):
            return True
        return False

    def commit(self, target: Store) -> None:
        """Apply the recorded deletes, then the recorded writes, to ``target``."""
        self.commit_deletes(target)
        self.commit_writes(target)

    def commit_deletes(self, target: Store, keep: Iterable[str] = (), *, dirs: bool = True) -> None:
        """Apply the recorded deletes (prefixes, then keys not written again) to ``target``;
        ``keep``: keys, or prefixes ending in "/", that stay (e.g. a lease the writer holds).
        ``dirs=False``: the prefixes were cleared already (mode "w"'s one clear,
        ``write/clear.py``), only the keys are left."""
        kept = tuple(keep)
        exact = {q for q in kept if not q.endswith("/")}
        prefixes = tuple(q for q in kept if q.endswith("/"))

        def under_prefix(k: str) -> bool:  # ``k``: a key, or a directory ending in "/"
            return k.startswith(prefixes)

        async def go() -> None:
            for p in self._deleted_dirs if dirs else ():
                d = _dir(p)
                if not under_prefix(d):
                    await prune(target, d, kept)
            for k in sorted(self._deleted - set(self._written)):
                if k not in exact and not under_prefix(k) and await target.exists(k):
                    await target.delete(k)

        sync(go())

    def commit_writes(self, target: Store) -> None:
        """Write the recorded objects to ``target``, deepest keys first."""

        async def go() -> None:
            for k in sorted(self._written, key=lambda k: (-k.count("/"), k)):
                await target.set(k, self._written[k])

        sync(go())


def delete_under(target: Store, prefix: str, keep: Iterable[str] = ()) -> None:
    """Delete everything under ``prefix`` ("" for the whole store) but ``keep``: keys, or
    prefixes ending in "/" (relative to the store's root), directory by directory, so that no
    empty directories stay behind on local files."""
    sync(prune(target, _dir(prefix), tuple(keep)))


async def prune(target: Store, d: str, kept: tuple[str, ...]) -> None:
    """Delete what is under prefix ``d`` except ``kept`` (keys, or prefixes ending in "/")."""
    exact = {q for q in kept if not q.endswith("/")}
    prefixes = tuple(q for q in kept if q.endswith("/"))
    if not any(q.startswith(d) for q in kept):
        await target.delete_dir(d.rstrip("/"))
        return
    children = {c.rstrip("/") async for c in target.list_dir(d)}
    for c in sorted(children):
        full = d + c
        # an exact keep keeps a key only: a directory of that name is pruned as any other (a
        # kept "a/c" is no reason to keep "a/c/0")
        if await _is_key(target, full):
            if full not in exact and not full.startswith(prefixes):
                await target.delete(full)
        elif not (full + "/").startswith(prefixes):
            await prune(target, full + "/", kept)
    async for _ in target.list_dir(d):
        return
    await target.delete_dir(d.rstrip("/"))  # emptied: no empty directory stays behind


async def _is_key(target: Store, name: str) -> bool:
    """Whether ``name`` (a child listed under a directory) is a key of ``target``, not a
    directory. An icechunk store answers a node's path (a group or an array: ``a/0``, not a
    zarr key) with an ``InvalidInputError`` ("invalid zarr key format") instead of False."""
    try:
        return bool(await target.exists(name))
    except Exception as e:
        if type(e).__module__.startswith("icechunk") and type(e).__name__ == "InvalidInputError":
            return False
        raise


def _dir(prefix: str) -> str:
    return prefix if prefix == "" or prefix.endswith("/") else prefix + "/"
