"""Appends at the edges the append and resume tests pass through without pinning them
(survivors of the mutation lane, `mutation/run.py write/appends`, and the gaps its review
named): an append that asks for consolidated metadata on a store written without it leaves the
root consolidated, showing every row appended, as xarray's own engine does; an append resumed
with ``compute=False`` after its source failed writes nothing at the call and appends the rows
once when computed; an append that gives its rows back drops only the shards it stored (another
write's past its start are kept); a shard counts as whole only with its recorded bytes; an
append whose metadata commit fails part-way leaves the root's document as it was (the deepest
documents first). Each test names what it kills. Real stores: local files (one refusing a put)."""

from __future__ import annotations

import json
import uuid
import warnings
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import xarray as xr
from zarr.storage import LocalStore

import shardwise
from faultkit import snapshot
from shardwise.durability.journal import WriteMarker, marker_name, now, region_list
from shardwise.storage.store import ShardStore
from shardwise.write.giveback import drop_stored, whole_object

ENC = {"v": {"chunks": (2, 3), "shards": (4, 3)}, "t": {"chunks": (2,), "shards": (4,)}}


def rows(lo: int, hi: int) -> xr.Dataset:
    t = np.arange(lo, hi, dtype="int64")
    return xr.Dataset(
        {"v": (("t", "x"), t[:, None] * 4.0 + np.arange(3))}, coords={"t": t, "x": np.arange(3)}
    )


def root_doc(root: Path) -> dict:
    return json.loads((root / "zarr.json").read_text())


@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
def test_an_append_asking_for_consolidated_metadata_consolidates_the_store(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.zarr", tmp_path / "theirs.zarr"
    shardwise.to_zarr(rows(0, 6), ours, encoding=ENC, consolidated=False)
    rows(0, 6).to_zarr(theirs, encoding=ENC, consolidated=False)
    assert root_doc(ours).get("consolidated_metadata") is None
    shardwise.to_zarr(rows(6, 11), ours, append_dim="t", consolidated=True)
    rows(6, 11).to_zarr(theirs, append_dim="t", consolidated=True)
    for root in (ours, theirs):
        meta = root_doc(root)["consolidated_metadata"]["metadata"]
        assert meta["v"]["shape"] == [11, 3] and meta["t"]["shape"] == [11], root.name
        with xr.open_zarr(root, consolidated=True) as ds:
            xr.testing.assert_identical(ds.load(), rows(0, 11))
    assert shardwise.verify(ours).ok


def test_an_append_resumed_with_compute_false_appends_once_when_computed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "s.zarr"
    shardwise.to_zarr(rows(0, 6), root, encoding=ENC)

    def fail(block: np.ndarray) -> np.ndarray:
        raise RuntimeError("source failed")

    bad = rows(6, 10)
    failing = da.from_array(bad.v.values, chunks=(2, 3)).map_blocks(fail, dtype="f8")
    bad["v"] = bad.v.copy(data=failing)
    with pytest.raises(RuntimeError, match="source failed"):
        shardwise.to_zarr(bad, root, append_dim="t")
    with xr.open_zarr(root) as ds:
        assert ds.sizes["t"] == 6  # the failed append gave its rows back
    delayed = shardwise.to_zarr(rows(6, 10), root, append_dim="t", resume=True, compute=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with xr.open_zarr(root, consolidated=False) as ds:
            assert ds.sizes["t"] == 10  # the rows reserved at the call, written at compute
    delayed.compute()
    for consolidated in (None, False):
        with xr.open_zarr(root, consolidated=consolidated) as ds:
            xr.testing.assert_identical(ds.load(), rows(0, 10))
    assert shardwise.verify(root).ok


def _stored(root: Path) -> tuple[ShardStore, dict[str, str]]:
    """A 12-row array of three shards written by one write_array, its store and snapshot."""
    x = np.arange(24, dtype="int16").reshape(12, 2)
    shardwise.write_array(x, root, chunks=(2, 2), shards=(4, 2))
    return ShardStore(LocalStore(root)), snapshot(root)


def test_a_given_back_append_drops_only_the_shards_it_stored(tmp_path: Path) -> None:
    # kills _drop_stored_3 (every marker's write taken for the append's: the shards another write
    # recorded past the append's start deleted with their records)
    store, before = _stored(tmp_path / "a")
    region = (slice(12, 16), slice(0, 2))  # an append's marker: it stored nothing yet
    marker = WriteMarker(
        id=uuid.uuid4().hex,
        region=region_list(region),
        shape=[16, 2],
        status="open",
        started=now(),
        append={"dim": "t", "axis": 0, "id": "the append", "holder": None},
    )
    store.put(marker_name(region), marker.to_bytes())
    drop_stored(store, 0, 4, "the append")
    after = snapshot(tmp_path / "a")
    assert {k: v for k, v in after.items() if k in before} == before  # the other write's shards


def test_a_shard_counts_as_whole_only_with_its_recorded_bytes(tmp_path: Path) -> None:
    # kills _whole_14 (a shard of the recorded size but other bytes counted as whole: the open
    # marker of a rewritten array closed over a torn shard)
    store, _ = _stored(tmp_path / "a")
    # recorded, and never stored
    assert whole_object(store, "c/1/0") and whole_object(store, "c/5/0")
    shard = tmp_path / "a" / "c" / "1" / "0"
    raw = bytearray(shard.read_bytes())
    raw[0] ^= 0xFF  # the same size, other bytes
    shard.write_bytes(bytes(raw))
    assert not whole_object(store, "c/1/0")


class RefusingNewVariable(LocalStore):
    """Local files that refuse to store the document of the variable ``zz`` (a failed put)."""

    async def set(self, key: str, value: Any, byte_range: Any = None) -> None:
        if key == "zz/zarr.json":
            raise PermissionError(f"refused: {key}")
        await super().set(key, value)


@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
def test_an_append_whose_metadata_commit_fails_leaves_the_root_document(tmp_path: Path) -> None:
    # kills commit_metadata_6 (the documents committed in key order: the root's before that of
    # the variable the append adds, so a failure between them leaves the root's consolidated
    # metadata naming an array that is not there)
    root = tmp_path / "s.zarr"
    shardwise.to_zarr(rows(0, 6), root, encoding=ENC, consolidated=True)
    before = (root / "zarr.json").read_bytes()
    more = rows(6, 11).assign(zz=("x", np.arange(3.0)))
    with pytest.raises(PermissionError, match=r"zz/zarr\.json"):
        shardwise.to_zarr(more, RefusingNewVariable(root), append_dim="t", consolidated=True)
    assert (root / "zarr.json").read_bytes() == before
    assert not (root / "zz" / "zarr.json").exists()
