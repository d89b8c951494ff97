"""Three unmodified readers (zarr-python, tensorstore, xarray's zarr engine) reading a stream's
array while it is written.

The writer is held at chosen states of its seals (the shards of a shard-row put, the shape not
grown; the shape grown; a flush returned) and the readers read there: each sees exactly the
frames committed, equal to numpy. A free-running poller thread reads with all three while a
stream runs; the writer waits at every shape commit for a read of the poller that began after
it (a state, never a time), so the poller is shown to have read every intermediate length while
the seals ran beside it, each read equal to numpy.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import shardwise
from shardwise.storage.store import ShardStore
from shardwise.write import streams

FRAME = (6, 5)
STEP = 4
LAYOUT: dict[str, Any] = dict(
    shape=(None, *FRAME), dtype="u2", chunks=(2, 3, 5), shards=(STEP, 3, 5), path="v",
    dimension_names=("t", "y", "x"),
)  # fmt: skip


def frames(n: int) -> np.ndarray:
    return np.random.default_rng(11).integers(0, 60000, size=(n, *FRAME)).astype("u2")


READERS = ("zarr-python", "tensorstore", "xarray")


def read_three(root: str) -> dict[str, np.ndarray]:
    """The array ``v`` as zarr-python, tensorstore and xarray's zarr engine read it now."""
    import tensorstore as ts
    import xarray as xr

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{root}/v"}}
    with xr.open_dataset(root, engine="zarr", consolidated=False) as ds:
        by_xarray = ds["v"].values
    return {
        "zarr-python": np.asarray(zarr.open_array(root, path="v", mode="r")[...]),
        "tensorstore": np.asarray(ts.open(spec, read=True).result().read().result()),
        "xarray": by_xarray,
    }


def on_commit(monkeypatch: pytest.MonkeyPatch, then: Any) -> None:
    """Call ``then(length)`` after every shape commit of the array ``v`` (its ``zarr.json``
    put), in the thread that committed it, before the stream goes on."""
    put = ShardStore.put

    def hooked(self: ShardStore, name: str, data: Any) -> None:
        put(self, name, data)
        if name == "zarr.json" and self.path == "v":
            then(int(json.loads(bytes(data))["shape"][0]))

    monkeypatch.setattr(ShardStore, "put", hooked)


def test_three_readers_read_the_committed_frames_at_each_state_of_a_seal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = frames(14)
    root = str(tmp_path / "a.zarr")
    zarr.open_group(root, mode="w", zarr_format=3)
    states: list[tuple[str, int]] = []

    def read_at(state: str, n: int) -> None:
        for name, got in read_three(root).items():
            assert got.shape == (n, *FRAME), (state, name, got.shape)
            np.testing.assert_array_equal(got, x[:n], err_msg=f"{name} at {state}")
        states.append((state, n))

    s = shardwise.stream(root, **LAYOUT)
    monkeypatch.setattr(streams, "after_store", lambda end: read_at(f"stored to {end}", s.stored))
    on_commit(monkeypatch, lambda n: read_at("committed", n))
    for a, b in ((0, 5), (5, 11), (11, 14)):
        s.append(x[a:b])  # a shard-row sealed inside each batch
        s.flush()  # the partial one shown
        read_at("flushed", b)
    monkeypatch.undo()  # the hooks off: close finishes the write
    s.close()
    assert states == [
        ("stored to 4", 0), ("committed", 4), ("stored to 5", 4), ("committed", 5), ("flushed", 5),
        ("stored to 8", 5), ("committed", 8), ("stored to 11", 8), ("committed", 11),
        ("flushed", 11),
        ("stored to 12", 11), ("committed", 12), ("stored to 14", 12), ("committed", 14),
        ("flushed", 14),
    ]  # fmt: skip
    for got in read_three(root).values():
        np.testing.assert_array_equal(got, x)


class Poller(threading.Thread):
    """Reads the array with the three readers, pass after pass, until stopped: every read's
    values against numpy, the lengths each pass found, any error kept."""

    def __init__(self, root: str, x: np.ndarray) -> None:
        super().__init__(daemon=True)
        self.root, self.x = root, x
        self.cond = threading.Condition()
        self.commits: list[int] = []  # the lengths committed so far (the writer's hook)
        self.passes: list[tuple[int, dict[str, int]]] = []  # (commits when begun, lengths)
        self.errors: list[BaseException] = []
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            with self.cond:
                begun = len(self.commits)
            try:
                got = read_three(self.root) if Path(self.root, "v", "zarr.json").exists() else {}
                for name, a in got.items():
                    np.testing.assert_array_equal(a, self.x[: len(a)], err_msg=name)
            except BaseException as e:
                self.errors.append(e)
                got = {}
            with self.cond:
                self.passes.append((begun, {k: len(a) for k, a in got.items()}))
                self.cond.notify_all()

    def committed(self, n: int) -> None:
        """The writer's hook: count the commit, then wait for a pass begun after it."""
        with self.cond:
            self.commits.append(n)
            mine = len(self.commits)
            ok = self.cond.wait_for(
                lambda: any(b >= mine for b, _ in self.passes) or self.errors, 120
            )
            assert ok, "the poller made no pass after the commit"


def test_a_free_running_poller_reads_every_intermediate_length_with_three_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = frames(30)
    root = str(tmp_path / "a.zarr")
    zarr.open_group(root, mode="w", zarr_format=3)
    poller = Poller(root, x)
    on_commit(monkeypatch, poller.committed)
    poller.start()
    try:
        with shardwise.stream(root, **LAYOUT) as s:
            for i in range(30):
                s.append(x[i])  # one frame at a time, the seals in the background
                if i == 13:
                    s.flush()
    finally:
        poller.stop = True
        poller.join(120)
    assert poller.errors == []
    lengths = {n for _, seen in poller.passes for n in seen.values()}
    # every length committed was read by all three (the writer waited for a pass after it)
    for i, n in enumerate(poller.commits, start=1):
        after = [seen for begun, seen in poller.passes if begun >= i]
        assert after and after[0] == dict.fromkeys(READERS, n), (n, after[:1])
    assert 14 in poller.commits and poller.commits[-1] == 30  # the flush, the close
    intermediate = sorted(n for n in lengths if 0 < n < 30)
    assert 14 in intermediate and len(intermediate) >= 3, intermediate
