"""Every target keeps a store's promises: the table of front ends x modes x targets (local
files, S3 on the moto server, an icechunk session), drawn by hypothesis, gives one outcome per
front end and mode whatever the target: the same refusal (a shardwise error, of one class), or
the same values and the same stored shard bytes.

Each example writes array "0" with a front end of ``test_one_policy`` in a drawn mode, over
nothing or over what the same front end created before (``DATA + 1``), into each of the three
targets; a session's writes are committed, and what is read back is the branch's last commit.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import icechunk
import numpy as np
import pytest
import test_one_policy as table
import xarray as xr
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_one_policy import CHUNKS, DATA, DIMS, EVERY, SHARDS, _ds

import shardwise
from faultkit import MotoS3, moto_s3, unique
from shardwise.errors import ShardwiseError
from shardwise.storage.store import ShardStore

MODES = {
    "write_array": ("w-", "w", "a", "r+"),
    "Dataset": ("w-", "w", "a", "r+"),
    "DataTree": ("w-", "w", "a", "r+"),
    "pyramid level 0": ("w-", "w"),
    "convert": ("w-", "w"),
}


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


class Targets:
    """One fresh target of each kind: its store to write into, and the zarr store to read."""

    def __init__(self, s3: MotoS3) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="policy-targets-"))
        self.s3 = s3.obstore(f"table-{unique()}")
        self.repo = icechunk.Repository.create(
            icechunk.local_filesystem_storage(str(self.tmp / "repo"))
        )

    def write(self, kind: str, name: str, values: np.ndarray, mode: str) -> Any:
        """Front end ``name`` writing ``values`` as array "0" of target ``kind``."""
        where: dict[str, Any] = {}
        if kind == "local":
            root: Any = self.tmp / "local"
        elif kind == "s3":
            root = self.s3
        else:
            root, where = self.repo.writable_session("main"), {"commit": "drawn"}
        if name == "convert":
            src = self.tmp / f"src-{values[0, 0]:g}"
            if not src.exists():
                shardwise.write_array(values, src, path="0", chunks=CHUNKS, shards=SHARDS,
                                      dimension_names=DIMS)  # fmt: skip
            where["src"] = src
        if name in ("Dataset", "DataTree") and mode in ("a", "r+"):
            # into what is there: no encoding (xarray refuses one for an existing variable)
            ds = _ds(da.from_array(values, chunks=(6, 20)))
            obj = xr.DataTree(ds) if name == "DataTree" else ds
            return shardwise.to_zarr(obj, root, mode=mode, consolidated=False, **where)
        table.DATA = values  # the front ends of the table write table.DATA
        try:
            return EVERY[name](root, mode=mode, **where)
        finally:
            table.DATA = DATA

    def read(self, kind: str) -> Any:
        if kind == "local":
            return zarr.storage.LocalStore(self.tmp / "local", read_only=True)
        if kind == "s3":
            return self.s3
        return self.repo.readonly_session("main").store


def outcome(targets: Targets, kind: str, name: str, mode: str, over: bool) -> Any:
    """What the drawn write leaves: its refusal (class, and whether it is shardwise's), or
    the values and shard bytes."""
    if over:  # what the same front end created before, other values
        targets.write(kind, name, DATA + 1, "w-")
    try:
        targets.write(kind, name, DATA, mode)
    except Exception as e:
        return type(e).__name__, isinstance(e, ShardwiseError)
    store = targets.read(kind)
    values = np.asarray(zarr.open_array(store, path="0", mode="r")[:])
    shards = ShardStore(store, "0")
    return values.tobytes(), {k: shards.get(k) for k in sorted(shards.list("c"))}


@pytest.mark.slow
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_every_target_gives_a_front_end_and_mode_one_outcome(s3: MotoS3, data: Any) -> None:
    name = data.draw(st.sampled_from(sorted(MODES)), label="front end")
    mode = data.draw(st.sampled_from(MODES[name]), label="mode")
    over = data.draw(st.booleans(), label="over an array")
    targets = Targets(s3)
    try:
        with dask.config.set(scheduler="threads"):
            seen = {k: outcome(targets, k, name, mode, over) for k in ("local", "s3", "ice")}
    finally:
        shutil.rmtree(targets.tmp, ignore_errors=True)
    assert seen["s3"] == seen["local"], (name, mode, over)
    assert seen["ice"] == seen["local"], (name, mode, over)
    first, second = seen["local"]
    if isinstance(first, str):
        assert second, f"{name} in mode {mode!r}: {first}, not a shardwise error"
    else:
        np.testing.assert_array_equal(np.frombuffer(first, "f4").reshape(DATA.shape), DATA)
