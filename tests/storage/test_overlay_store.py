"""The dry-run overlay (:class:`shardwise.storage.overlay.Overlay`) as a zarr store.

Two parts: zarr-python's own store conformance suite (``zarr.testing.store.StoreTests``) for an
overlay over a MemoryStore and over a LocalStore, and the overlay's own semantics: writes and
deletes stay in memory until a commit, reads and listings see them, ``commit_deletes`` keeps what
it is told to keep, ``commit_writes`` writes the deepest keys first, and committing equals doing.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from zarr.abc.store import Store
from zarr.core.buffer import Buffer, cpu, default_buffer_prototype
from zarr.core.sync import _collect_aiterator, sync
from zarr.storage import LocalStore, MemoryStore
from zarr.testing.store import StoreTests

from shardwise.storage.overlay import Overlay
from strategies import examples

PROTO = default_buffer_prototype()


def buf(data: bytes) -> Buffer:
    return cpu.Buffer.from_bytes(data)


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes, plus every directory (as ``"dir/"`` -> b"")."""
    out: dict[str, bytes] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel + "/" if p.is_dir() else rel] = b"" if p.is_dir() else p.read_bytes()
    return out


def contents(store: Store) -> dict[str, bytes]:
    """Every key of ``store`` and its bytes, read through the store."""

    async def go() -> dict[str, bytes]:
        out = {}
        for k in sorted(await _collect_aiterator(store.list())):
            v = await store.get(k, PROTO)
            assert v is not None, k
            out[k] = v.to_bytes()
        return out

    return sync(go())


def listed(it: Any) -> list[str]:
    return sorted(sync(_collect_aiterator(it)))


# -- zarr-python's store conformance suite ---------------------------------------------------------


def _asyncio_marked[T](cls: type[T]) -> type[T]:
    """Mark the async tests of ``cls`` (its own and the suite's) for pytest-asyncio, and only
    those: strict mode runs nothing else on an event loop, and refuses the mark on sync tests.
    The suite's functions are wrapped, not marked in place."""
    for name in dir(cls):
        f = getattr(cls, name)
        if name.startswith("test_") and inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def run(*args: Any, _f: Any = f, **kwargs: Any) -> None:
                await _f(*args, **kwargs)

            setattr(cls, name, pytest.mark.asyncio(run))
    return cls


class _OverlayStoreTests(StoreTests[Overlay, cpu.Buffer]):
    """The suite for an overlay; ``set`` puts objects in the base (the reads under test fall
    through to it), ``get`` reads the overlay's own recorded writes (the writes under test stay
    there and never reach the base)."""

    store_cls = Overlay
    buffer_cls = cpu.Buffer

    # the suite's async fixtures, as pytest-asyncio fixtures (the project runs it in strict mode)
    @pytest_asyncio.fixture
    async def store(self, open_kwargs: dict[str, Any]) -> Overlay:
        return await self.store_cls.open(**open_kwargs)

    @pytest_asyncio.fixture
    async def store_not_open(self, store_kwargs: dict[str, Any]) -> Overlay:
        return self.store_cls(**store_kwargs)

    async def get(self, store: Overlay, key: str) -> Buffer:
        assert await store._base.get(key, PROTO) is None, f"{key} reached the base store"
        return store._written[key]

    def test_store_repr(self, store: Overlay) -> None:
        assert repr(store) == f"Overlay({store._base!r})"
        assert repr(store.with_read_only(True)) == f"Overlay({store._base!r}, read_only=True)"

    def test_store_supports_writes(self, store: Overlay) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: Overlay) -> None:
        assert store.supports_listing


@_asyncio_marked
class TestOverlayOverMemoryStore(_OverlayStoreTests):
    @pytest.fixture
    def store_kwargs(self) -> dict[str, Any]:
        return {"base": MemoryStore()}

    async def set(self, store: Overlay, key: str, value: Buffer) -> None:
        assert isinstance(store._base, MemoryStore)
        store._base._store_dict[key] = value


@_asyncio_marked
class TestOverlayOverLocalStore(_OverlayStoreTests):
    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"base": LocalStore(tmp_path / "base")}

    async def set(self, store: Overlay, key: str, value: Buffer) -> None:
        assert isinstance(store._base, LocalStore)
        path = store._base.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value.to_bytes())


# -- the overlay's own semantics -------------------------------------------------------------------


def _local_base(root: Path) -> LocalStore:
    base = LocalStore(root)
    for k in ("zarr.json", "a/zarr.json", "a/c/0", "a/c/1", "b/zarr.json", "b/c/0", "bb/c/0"):
        sync(base.set(k, buf(k.encode())))
    return base


@pytest.fixture
def local(tmp_path: Path) -> tuple[LocalStore, Path]:
    root = tmp_path / "base"
    return _local_base(root), root


def test_writes_and_deletes_stay_in_memory_until_commit(local: tuple[LocalStore, Path]) -> None:
    base, root = local
    before = files(root)
    over = Overlay(base.with_read_only(True))
    sync(over.set("a/c/0", buf(b"new")))
    sync(over.set("n/zarr.json", buf(b"n")))
    sync(over.delete("zarr.json"))
    sync(over.delete_dir("b"))
    assert files(root) == before
    assert over.changes == (["b"], ["zarr.json"], ["a/c/0", "n/zarr.json"])
    over.commit(base)
    after = files(root)
    assert after["a/c/0"] == b"new" and after["n/zarr.json"] == b"n"
    assert "zarr.json" not in after and not any(k.startswith("b/") for k in after)
    assert after["bb/c/0"] == b"bb/c/0"  # "b" is a directory, not a string prefix


def test_a_read_only_view_refuses_writes_and_records_nothing(
    local: tuple[LocalStore, Path],
) -> None:
    base, _ = local
    over = Overlay(base.with_read_only(True))
    view = over.with_read_only(True)
    for write in (
        lambda: view.set("x", buf(b"x")),
        lambda: view.delete("a/c/0"),
        lambda: view.delete_dir("a"),
    ):
        with pytest.raises(ValueError, match="read-only"):
            sync(write())
    assert over.changes == ([], [], [])
    sync(over.with_read_only(False).set("x", buf(b"x")))  # a writable view shares the changes
    assert over.changes == ([], [], ["x"])


def test_reads_see_writes_and_hide_deletes(local: tuple[LocalStore, Path]) -> None:
    base, _ = local
    over = Overlay(base.with_read_only(True))
    sync(over.set("a/c/1", buf(b"new")))
    sync(over.set("a/d/0", buf(b"d")))
    sync(over.delete("a/zarr.json"))
    sync(over.delete_dir("b"))
    got = sync(over.get("a/c/1", PROTO))
    assert got is not None and got.to_bytes() == b"new"
    assert sync(over.get("a/zarr.json", PROTO)) is None
    assert sync(over.get("b/c/0", PROTO)) is None
    assert not sync(over.exists("b/zarr.json")) and sync(over.exists("bb/c/0"))
    assert listed(over.list()) == sorted(
        ["zarr.json", "a/c/0", "a/c/1", "a/d/0", "bb/c/0"]  # each key once
    )
    assert listed(over.list_prefix("a/")) == ["a/c/0", "a/c/1", "a/d/0"]
    assert listed(over.list_prefix("b/")) == []
    assert listed(over.list_dir("")) == ["a", "bb", "zarr.json"]
    assert listed(over.list_dir("a")) == ["c", "d"]
    assert listed(over.list_dir("b")) == []


def test_list_dir_hides_a_directory_whose_keys_are_all_deleted(
    local: tuple[LocalStore, Path],
) -> None:
    base, _ = local
    over = Overlay(base.with_read_only(True))
    sync(over.delete("a/c/0"))
    assert listed(over.list_dir("a")) == ["c", "zarr.json"]  # a/c/1 is still there
    sync(over.delete("a/c/1"))
    assert listed(over.list_dir("a")) == ["zarr.json"]
    sync(over.delete("a/zarr.json"))
    assert listed(over.list_dir("")) == ["b", "bb", "zarr.json"]
    sync(over.set("a/c/1", buf(b"back")))
    assert listed(over.list_dir("")) == ["a", "b", "bb", "zarr.json"]
    assert listed(over.list_dir("a")) == ["c"]


def test_commit_deletes_keeps_keys_and_prefixes_and_leaves_no_empty_dirs(
    local: tuple[LocalStore, Path],
) -> None:
    base, root = local
    sync(base.set("a/lease/holder", buf(b"me")))
    sync(base.set("a/lease/other", buf(b"them")))
    sync(base.set("a/keep/deep/x", buf(b"x")))
    sync(base.set("a/c/sub/2", buf(b"2")))
    over = Overlay(base.with_read_only(True))
    sync(over.delete_dir("a"))
    sync(over.delete("zarr.json"))
    sync(over.delete("bb/c/0"))
    over.commit_deletes(base, keep=["a/lease/holder", "a/keep/", "zarr.json"])
    after = files(root)
    assert after == {
        "zarr.json": b"zarr.json",  # kept as an exact key
        "a/": b"",
        "a/lease/": b"",
        "a/lease/holder": b"me",  # kept as an exact key; its sibling is gone
        "a/keep/": b"",
        "a/keep/deep/": b"",
        "a/keep/deep/x": b"x",  # kept under a "prefix/"
        "b/": b"",
        "b/zarr.json": b"b/zarr.json",
        "b/c/": b"",
        "b/c/0": b"b/c/0",
        "bb/": b"",
        "bb/c/": b"",  # a key delete is a key delete: the LocalStore keeps its directory
    }
    assert not (root / "a/c").exists()  # pruned directory by directory, none left empty


def test_commit_deletes_keep_is_not_a_string_prefix(local: tuple[LocalStore, Path]) -> None:
    base, root = local
    over = Overlay(base.with_read_only(True))
    sync(over.delete_dir("a"))
    sync(over.delete("b/zarr.json"))
    over.commit_deletes(base, keep=["a/c/0x", "b/zarr.jso", "a/c"])
    after = files(root)
    assert "a/" not in after and "b/zarr.json" not in after, after


def test_commit_writes_writes_the_deepest_keys_first() -> None:
    order: list[str] = []

    class Recording(MemoryStore):
        async def set(self, key: str, value: Buffer) -> None:
            order.append(key)
            await super().set(key, value)

    over = Overlay(MemoryStore())
    for k in ("zarr.json", "a/b/c/0", "a/zarr.json", "b/zarr.json", "a/b/zarr.json"):
        sync(over.set(k, buf(k.encode())))
    target = Recording()
    over.commit_writes(target)
    assert order == ["a/b/c/0", "a/b/zarr.json", "a/zarr.json", "b/zarr.json", "zarr.json"]
    assert contents(target) == {k: k.encode() for k in order}


def test_equal_views_and_a_pickled_copy() -> None:
    import pickle

    base = MemoryStore()
    one, two = Overlay(base), Overlay(base)
    assert one == two
    sync(one.set("k", buf(b"1")))
    assert one != two
    assert pickle.loads(pickle.dumps(one)) == one
    sync(two.set("k", buf(b"1")))
    assert one == two
    assert one != one.with_read_only(True)
    with pytest.raises(TypeError):
        hash(one)  # mutable: equal now, not equal after a write


# -- committing equals doing -----------------------------------------------------------------------

_DIRS = ["", "a", "a/b", "b"]
_KEYS = ["x", "y", "a/x", "a/y", "a/b/x", "a/b/y", "b/x", "by/x"]
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from(_KEYS), st.binary(max_size=3)),
        st.tuples(st.just("delete"), st.sampled_from(_KEYS), st.just(b"")),
        st.tuples(st.just("delete_dir"), st.sampled_from(_DIRS), st.just(b"")),
    ),
    max_size=12,
)
_BASE = st.dictionaries(st.sampled_from(_KEYS), st.binary(max_size=3))


def _apply(store: Store, ops: list[tuple[str, str, bytes]]) -> None:
    async def go() -> None:
        for op, key, data in ops:
            if op == "set":
                await store.set(key, buf(data))
            elif op == "delete":
                await store.delete(key)
            else:
                await store.delete_dir(key)

    sync(go())


def _fill(store: Store, base: dict[str, bytes]) -> Store:
    for k, v in base.items():
        sync(store.set(k, buf(v)))
    return store


@examples(40)
@given(base=_BASE, ops=_OPS)
def test_committing_equals_doing_on_memory(base: dict[str, bytes], ops: Any) -> None:
    target, direct = _fill(MemoryStore(), base), _fill(MemoryStore(), base)
    over = Overlay(target.with_read_only(True))
    _apply(over, ops)
    _apply(direct, ops)
    assert contents(over) == contents(direct)  # the overlay shows what doing would give
    assert contents(target) == base  # and did nothing yet
    over.commit(target)
    assert contents(target) == contents(direct)


@examples(20)
@given(base=_BASE, ops=_OPS)
def test_committing_equals_doing_on_local_files(
    fresh_dir: Any, base: dict[str, bytes], ops: Any
) -> None:
    root = fresh_dir("overlay")
    target = _fill(LocalStore(root / "target"), base)
    direct = _fill(LocalStore(root / "direct"), base)
    before = files(root / "target")
    over = Overlay(target.with_read_only(True))
    _apply(over, ops)
    _apply(direct, ops)
    assert contents(over) == contents(direct)
    assert files(root / "target") == before
    over.commit(target)
    assert contents(target) == contents(direct)


def test_a_bad_byte_range_on_a_recorded_write_is_refused_as_zarr_refuses_it() -> None:
    over = Overlay(MemoryStore())
    sync(over.set("c/0", buf(b"\x01\x02\x03\x04")))
    with pytest.raises(TypeError, match=r"Unexpected byte_range, got \(0, 2\)"):
        sync(over.get("c/0", PROTO, byte_range=(0, 2)))  # type: ignore[arg-type]
