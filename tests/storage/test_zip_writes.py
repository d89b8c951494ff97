"""Writes into a zarr ``ZipStore``: an archive only appends, so it cannot delete the lease a
write holds, and every front end applies one rule (durability/lease.py ``lease_wanted``): by
default no lease there, ``lease=True`` refused before anything is written, and on stores that
can delete the default lease is kept. ``to_zarr``'s DataTree case is in
xarray/test_datatree_suite.py."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore, MemoryStore, ZipStore

import shardwise
from shardwise import InvalidValueError, LeaseHeldError
from shardwise.durability.lease import Lease, lease_wanted
from shardwise.storage.store import ShardStore

# zipfile warns when an entry is written again (a write marker: "open", then "done"); a ZipStore
# reads the last one, as the read-backs below check
pytestmark = pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")

KW = dict(chunks=(4, 4), shards=(8, 8))
IMAGE = np.arange(32 * 24, dtype="float64").reshape(32, 24)


def data() -> np.ndarray:
    return np.random.default_rng(7).integers(1, 1000, (24, 20)).astype("int32")


def names(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as z:
        return z.namelist()


def reopened(path: Path) -> ZipStore:
    return ZipStore(path, mode="r", read_only=True)


@pytest.mark.parametrize(
    ("lease", "compute", "deletes", "wanted"),
    [
        (None, True, True, True),
        (None, False, True, False),
        (None, True, False, False),
        (None, False, False, False),
        (False, True, True, False),
        (False, True, False, False),
        (True, False, True, True),
        (True, True, True, True),
    ],
)
def test_the_lease_rule(lease: bool | None, compute: bool, deletes: bool, wanted: bool) -> None:
    """The default holds a lease when the write computes now on a store that can delete; a
    given ``lease`` is kept where it can be."""
    assert lease_wanted(lease, compute, deletes, "SomeStore") is wanted


@pytest.mark.parametrize("compute", [True, False])
def test_the_lease_rule_refuses_true_where_nothing_can_be_deleted(compute: bool) -> None:
    with pytest.raises(InvalidValueError) as e:
        lease_wanted(True, compute, False, "ZipStore")
    assert isinstance(e.value, ValueError)
    assert "lease=True" in str(e.value) and "ZipStore cannot" in str(e.value)
    assert "lease=None or lease=False" in str(e.value)


@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_write_array_into_a_zip_store_holds_no_lease(tmp_path: Path, kind: str) -> None:
    """The default lease on a ZipStore: the write finishes (it failed first when it looked for
    an array at the path, zarr opening the writable archive read-only, then at its end, unable
    to delete the lease), the archive holds no lease object, zarr-python reads it back."""
    values = data()
    source: Any = values if kind == "numpy" else da.from_array(values, chunks=(5, 7))
    path = tmp_path / "a.zip"
    store = ZipStore(path, mode="w")
    report = shardwise.write_array(source, store, path="v", **KW)
    store.close()
    assert report.shards_written == 9
    assert [n for n in names(path) if n.startswith("v/c/")]
    assert not [n for n in names(path) if "lease" in n], names(path)
    np.testing.assert_array_equal(zarr.open_array(reopened(path), path="v", mode="r")[...], values)
    assert shardwise.verify(reopened(path), path="v").ok


def test_write_pyramid_into_a_zip_store_holds_no_lease(tmp_path: Path) -> None:
    """A 2-level pyramid into a ZipStore with the default lease: no lease object in the archive,
    both levels read back (level 1: the 2x2 block means of level 0)."""
    path = tmp_path / "p.zip"
    store = ZipStore(path, mode="w")
    report = shardwise.write_pyramid(IMAGE, store, levels=2, chunks=8, shards=16)
    store.close()
    assert report.shards_written == 4 + 1  # level 0: 2 x 2 shards of 16, level 1: one
    assert not [n for n in names(path) if "lease" in n], names(path)
    level0 = zarr.open_array(reopened(path), path="0", mode="r")[...]
    level1 = zarr.open_array(reopened(path), path="1", mode="r")[...]
    np.testing.assert_array_equal(level0, IMAGE)
    np.testing.assert_allclose(level1, IMAGE.reshape(16, 2, 12, 2).mean(axis=(1, 3)))
    assert "ome" in zarr.open_group(reopened(path), mode="r").attrs


WRITERS: dict[str, Callable[[Any, bool | None], Any]] = {
    "write_array": lambda store, lease: shardwise.write_array(
        data(), store, path="b", lease=lease, **KW
    ),
    "write_pyramid": lambda store, lease: shardwise.write_pyramid(
        IMAGE, store, path="p", levels=2, chunks=8, shards=16, lease=lease
    ),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_lease_true_on_a_zip_store_is_refused_and_the_archive_left_as_it_was(
    tmp_path: Path, writer: str
) -> None:
    """``lease=True`` cannot be held on an archive: refused before anything is written, naming
    the keyword and the store; the archive (an array written before) is byte-identical, and a
    close after the refusal adds nothing (zipfile writes on close only what was added)."""
    path = tmp_path / "a.zip"
    store = ZipStore(path, mode="w")
    shardwise.write_array(data(), store, path="first", **KW)
    store.close()
    before = path.read_bytes()
    store = ZipStore(path, mode="a")
    with pytest.raises(InvalidValueError) as e:
        WRITERS[writer](store, True)
    store.close()
    assert "lease=True" in str(e.value) and "ZipStore" in str(e.value)
    assert path.read_bytes() == before
    np.testing.assert_array_equal(zarr.open_array(reopened(path), path="first")[...], data())


def test_convert_into_a_zip_store_holds_no_lease_and_refuses_lease_true(tmp_path: Path) -> None:
    """``convert`` writes through write_array's pipeline and takes its rule: by default no lease
    on an archive; ``lease=True`` refused before anything (a group, an array) is written."""
    src = MemoryStore()
    a = zarr.create_array(src, shape=(24, 20), chunks=(4, 4), dtype="int32", zarr_format=2)
    a[...] = data()
    path = tmp_path / "c.zip"
    store = ZipStore(path, mode="w")
    shardwise.convert(src, store, dst_path="c", shards=(8, 8))
    store.close()
    assert not [n for n in names(path) if "lease" in n], names(path)
    np.testing.assert_array_equal(zarr.open_array(reopened(path), path="c")[...], data())
    before = path.read_bytes()
    store = ZipStore(path, mode="a")
    with pytest.raises(InvalidValueError, match=r"lease=True .* ZipStore cannot"):
        shardwise.convert(src, store, dst_path="d", shards=(8, 8), lease=True)
    store.close()
    assert path.read_bytes() == before


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_store_that_can_delete_is_still_leased_by_default(tmp_path: Path, writer: str) -> None:
    """On a LocalStore the default still holds the lease: a write into a path another writer
    leases is refused before anything is written (only that lease is there)."""
    root = tmp_path / "l.zarr"
    leased = ShardStore(LocalStore(root), "b" if writer == "write_array" else "p/0")
    with Lease.acquire(leased, purpose="another job"):
        with pytest.raises(LeaseHeldError, match="another job"):
            WRITERS[writer](LocalStore(root), None)
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
            f"{leased.path}/.shardwise/lease"
        ]


def test_batch_into_a_zip_store_takes_the_lease_rule(tmp_path: Path) -> None:
    """``batch.init`` and ``batch.write_part`` take the rule of every front end: by default no
    lease on an archive (the part written, no lease object in it, zarr-python reads it back);
    ``lease=True`` refused before anything is written, the archive byte-identical. (finalize
    removes the batch record, which an archive cannot.)"""
    from shardwise import batch

    path = tmp_path / "b.zip"
    store = ZipStore(path, mode="w")
    shardwise.write_array(data(), store, path="first", **KW)
    store.close()
    before = path.read_bytes()
    store = ZipStore(path, mode="a")
    with pytest.raises(InvalidValueError, match=r"lease=True .* ZipStore cannot"):
        batch.init(store, path="b", shape=(24, 20), dtype="int32", parts=3, lease=True, **KW)
    store.close()
    assert path.read_bytes() == before
    store = ZipStore(path, mode="a")
    plan = batch.init(store, path="b", shape=(24, 20), dtype="int32", parts=3, **KW)
    store.close()
    opened = path.read_bytes()
    store = ZipStore(path, mode="a")
    with pytest.raises(InvalidValueError, match=r"lease=True .* ZipStore cannot"):
        batch.write_part(data(), store, 1, path="b", lease=True)
    store.close()
    assert path.read_bytes() == opened
    store = ZipStore(path, mode="a")
    report = batch.write_part(data(), store, 1, path="b")
    store.close()
    assert report.shards_written == 3  # part 1: one row of 3 shards
    assert not [n for n in names(path) if "lease" in n], names(path)
    assert "b/.shardwise/parts/1.json" in names(path)
    back = zarr.open_array(reopened(path), path="b")[plan.region(1)]
    np.testing.assert_array_equal(back, data()[plan.region(1)])
