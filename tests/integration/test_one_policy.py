"""One write policy (write/intent.py): the same source, target, mode, region and resume through
every front end give the same strategy, the same lease kind, the same refusal (class and message)
and the same stored bytes.

The front ends: ``write_array``, a batch part (``shardwise.batch``), ``to_zarr`` of a Dataset and
of a one-node DataTree, ``write_pyramid``'s level 0 and ``convert``; each into a store and (all but
the batch part) into an icechunk session, and those that append, appending. Each writes the array
at key ``"0"`` of a fresh local store (a pyramid's level 0 is there, a Dataset's variable named
"0"), so their messages name the same path. The pipeline says how it writes each array (strategy
and lease) on the ``shardwise`` logger at debug level; that line is what the strategy and lease
columns read.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from zarr.storage import LocalStore

import shardwise
from shardwise import batch
from shardwise.durability.lease import Lease
from shardwise.storage.store import ShardStore

SHAPE, CHUNKS, SHARDS = (24, 20), (4, 5), (8, 10)
DIMS = ("y", "x")
DATA = np.arange(np.prod(SHAPE), dtype="float32").reshape(SHAPE)
ROWS = slice(2, 14)  # a region whose edges split shards: rows 0..8 and 8..16 in part

Run = Callable[..., Any]


def _source() -> Any:
    """A dask source misaligned with the shards: on threads write_array writes it direct."""
    return da.from_array(DATA, chunks=(6, 20))


def _ds(values: Any) -> xr.Dataset:
    return xr.Dataset({"0": (DIMS, values)})


def _to_zarr(root: Path, values: Any, tree: bool, region: slice | None, **kw: Any) -> Any:
    ds = _ds(values)
    obj: Any = xr.DataTree(ds) if tree else ds
    where = {"region": {"y": region}} if region is not None else {}
    encoding = {} if region is not None else {"0": {"chunks": CHUNKS}}  # a new array's only
    return shardwise.to_zarr(
        obj,
        root,
        shards={"y": SHARDS[0], "x": SHARDS[1]},
        encoding={"/": encoding} if tree else encoding,
        consolidated=False,
        **where,
        **kw,
    )


def write_array(root: Path, region: slice | None = None, **kw: Any) -> Any:
    values = _source() if region is None else _source()[region]
    where = {"region": (region, slice(None))} if region is not None else {}
    return shardwise.write_array(
        values, root, path="0", chunks=CHUNKS, shards=SHARDS, dimension_names=DIMS, **where, **kw
    )


def dataset(root: Path, region: slice | None = None, **kw: Any) -> Any:
    values = _source() if region is None else _source()[region]
    return _to_zarr(root, values, False, region, **kw)


def datatree(root: Path, region: slice | None = None, **kw: Any) -> Any:
    values = _source() if region is None else _source()[region]
    return _to_zarr(root, values, True, region, **kw)


def batch_part(root: Path, region: slice | None = None, **kw: Any) -> Any:
    assert region is None and kw.pop("mode") == "w-"  # a part writes into its batch's array
    batch.init(root, path="0", shape=SHAPE, dtype="float32", chunks=CHUNKS, shards=SHARDS,
               parts=1, dimension_names=DIMS)  # fmt: skip
    return batch.write_part(_source(), root, 0, path="0", **kw)


def pyramid(root: Path, region: slice | None = None, **kw: Any) -> Any:
    assert region is None
    return shardwise.write_pyramid(
        _source(), root, levels=1, dims=DIMS, chunks=CHUNKS, shards=SHARDS, **kw
    )


def convert(root: Any, region: slice | None = None, **kw: Any) -> Any:
    assert region is None
    src = kw.pop("src", None) or root.with_name(root.name + "-src")
    if not src.exists():
        shardwise.write_array(DATA, src, path="0", chunks=CHUNKS, shards=SHARDS,
                              dimension_names=DIMS)  # fmt: skip
    kw.pop("strategy", None)  # a conversion copies: no strategy to choose
    return shardwise.convert(src, root, path="0", dst_path="0", shards=SHARDS, **kw)


def convert_group(root: Path, region: slice | None = None, **kw: Any) -> Any:
    """convert of a group (the source's root, holding array "0") onto the root of ``root``."""
    assert region is None
    src = root.with_name(root.name + "-src")
    if not src.exists():
        shardwise.write_array(DATA, src, path="0", chunks=CHUNKS, shards=SHARDS,
                              dimension_names=DIMS)  # fmt: skip
    return shardwise.convert(src, root, shards=SHARDS, **kw)


EVERY: dict[str, Run] = {
    "write_array": write_array,
    "batch part": batch_part,
    "Dataset": dataset,
    "DataTree": datatree,
    "pyramid level 0": pyramid,
    "convert": convert,
}
REGIONS = {k: EVERY[k] for k in ("write_array", "Dataset", "DataTree")}


def shards(root: Path) -> dict[str, bytes]:
    """The stored shard objects of array "0"."""
    top = root / "0"
    return {
        p.relative_to(top).as_posix(): p.read_bytes()
        for p in sorted(top.rglob("*"))
        if p.is_file() and p.relative_to(top).parts[0] == "c"
    }


def how(caplog: pytest.LogCaptureFixture, root: Path, run: Callable[[], Any]) -> tuple[str, str]:
    """Run ``run``; the strategy and lease kind the pipeline wrote array "0" of ``root`` with."""
    line = re.compile(rf"^array '0' in file://{re.escape(str(root))}: (\w+) write, (\w+) lease")
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="shardwise"):
        run()
    found = [m.groups() for r in caplog.records if (m := line.search(r.getMessage()))]
    assert len(found) == 1, [r.getMessage() for r in caplog.records]
    return found[0]


@pytest.fixture(autouse=True)
def _threads() -> Any:
    with dask.config.set(scheduler="threads"):
        yield


def test_a_create_is_written_alike_by_every_front_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A misaligned dask source on threads: every front end writes it direct (write_array's
    rule: the pyramid's level 0 asks the scheduler as write_array does) under the array's
    exclusive lease (a batch part under its part's), and stores the same bytes."""
    seen = {}
    for name, run in EVERY.items():
        root = tmp_path / name.replace(" ", "-")
        creating = lambda run=run, root=root: run(root, mode="w-")  # noqa: E731
        seen[name] = (how(caplog, root, creating), shards(root))
    want = seen["write_array"]
    assert want[0] == ("direct", "exclusive")
    assert len(want[1]) == 6
    for name, (kind, stored) in seen.items():
        expected = {
            "batch part": ("direct", "part"),
            "convert": ("copy", "exclusive"),
        }.get(name, want[0])
        assert kind == expected, name
        assert stored == want[1], name
        np.testing.assert_array_equal(shardwise.read_array(tmp_path / name.replace(" ", "-"),
                                                           path="0"), DATA)  # fmt: skip


def test_a_variable_an_append_creates_is_created_as_write_array_creates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An append that brings a new variable creates its array: the exclusive lease and the
    journal's clear of write_array's create, while the appended array is written beside other
    appenders (a shared lease); the new array holds the same bytes as write_array's."""
    root = tmp_path / "appended"
    xr.Dataset({"a": (DIMS, DATA)}).pipe(
        lambda ds: shardwise.to_zarr(ds, root, shards={"y": SHARDS[0], "x": SHARDS[1]})
    )
    grown = xr.Dataset({"a": (DIMS, DATA), "0": (("x",), DATA[0])}).chunk(y=6)
    line = re.compile(rf"^array '(\w+)' in file://{re.escape(str(root))}: (\w+) write, (\w+) lease")
    with caplog.at_level(logging.DEBUG, logger="shardwise"):
        shardwise.to_zarr(grown, root, append_dim="y", shards={"y": SHARDS[0], "x": SHARDS[1]},
                          encoding={"0": {"chunks": CHUNKS[1:]}})  # fmt: skip
    seen = {m[1]: m.groups()[1:] for r in caplog.records if (m := line.search(r.getMessage()))}
    assert seen == {"0": ("direct", "exclusive"), "a": ("direct", "shared")}, seen
    alone = tmp_path / "alone"
    shardwise.write_array(DATA[0], alone, path="0", chunks=CHUNKS[1:], shards=SHARDS[1:])
    assert [p.read_bytes() for p in sorted((root / "0" / "c").rglob("*")) if p.is_file()] == [
        p.read_bytes() for p in sorted((alone / "0" / "c").rglob("*")) if p.is_file()
    ]


@pytest.mark.parametrize("strategy", ["auto", "staged"])
def test_a_region_that_splits_shards_is_written_alike(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, strategy: str
) -> None:
    """A region write into an existing array whose edges split shards: with "auto" it runs
    beside other writers (direct, shared lease, conditional merges); an explicit "staged"
    merges unconditionally, so it holds the exclusive lease: write_array and to_zarr (Dataset
    and DataTree) alike, never a refusal of one and a quiet lease of the other."""
    seen = {}
    for name, run in REGIONS.items():
        root = tmp_path / name
        run(root, mode="w-")
        writing = lambda run=run, root=root: run(  # noqa: E731
            root, region=ROWS, mode="r+", strategy=strategy
        )
        seen[name] = (how(caplog, root, writing), shards(root))
    expected = ("direct", "shared") if strategy == "auto" else ("staged", "exclusive")
    for name, (kind, stored) in seen.items():
        assert kind == expected, name
        assert stored == seen["write_array"][1], name


def test_a_held_lease_is_refused_alike(tmp_path: Path) -> None:
    """Another job holds the array's lease: every front end replacing the array (mode "w")
    refuses with the same LeaseHeldError and message, and leaves the store as it was."""
    seen = {}
    for name, run in EVERY.items():
        if name == "batch part":
            continue  # a part writes into its batch's array, never replaces it
        root = tmp_path / name.replace(" ", "-")
        run(root, mode="w-")
        before = shards(root)
        held = Lease.acquire(ShardStore(LocalStore(root), "0"), purpose="the other job")
        with held, pytest.raises(shardwise.LeaseHeldError) as e:
            run(root, mode="w")
        assert shards(root) == before
        seen[name] = str(e.value).replace(str(root), "ROOT")
    assert "the other job" in seen["write_array"]
    for name, message in seen.items():
        assert message.split(" held for ")[0] == seen["write_array"].split(" held for ")[0], name


def test_a_lease_on_an_array_mode_w_drops_is_refused_alike(tmp_path: Path) -> None:
    """Another job writes array "old" of the group a mode "w" write replaces: to_zarr (Dataset,
    DataTree), write_pyramid and convert of a group refuse with the same message (the lease
    command reports it held; the one clear, write/clear.py), leaving the store as it was;
    break_lease=True replaces the group (convert deleted the other job's lease)."""
    seen = {}
    runs = {**{k: EVERY[k] for k in ("Dataset", "DataTree", "pyramid level 0")},
            "convert of a group": convert_group}  # fmt: skip
    for name, run in runs.items():
        root = tmp_path / name.replace(" ", "-")
        run(root, mode="w-")
        shardwise.write_array(DATA, root, path="old", chunks=CHUNKS, shards=SHARDS)
        before = shards(root)
        with Lease.acquire(ShardStore(LocalStore(root), "old"), purpose="the other job"):
            with pytest.raises(shardwise.LeaseHeldError) as e:
                run(root, mode="w")
            assert shards(root) == before and (root / "old" / "zarr.json").exists()
            run(root, mode="w", break_lease=True)
        assert not (root / "old").exists()
        seen[name] = str(e.value)
    assert "mode='w' would delete 'old/.shardwise/lease'" in seen["Dataset"]
    assert len(set(seen.values())) == 1, seen


def test_mode_w_minus_clears_alike(tmp_path: Path) -> None:
    """Mode "w-" creates the array and clears only the stale journal at its path, in every
    front end that creates it (convert cleared everything there)."""
    for name in ("write_array", "pyramid level 0", "convert"):
        root = tmp_path / name.replace(" ", "-")
        (root / "0").mkdir(parents=True)
        (root / "0" / "notes.txt").write_text("not ours")
        (root / "0" / ".shardwise").mkdir()
        (root / "0" / ".shardwise" / "stale").write_text("a journal file of no write")
        EVERY[name](root, mode="w-")
        assert (root / "0" / "notes.txt").read_text() == "not ours", name
        assert not (root / "0" / ".shardwise" / "stale").exists(), name


def test_mode_w_minus_over_a_finished_write_is_refused_alike(tmp_path: Path) -> None:
    """Mode "w-" over what a finished write stored: every front end that creates refuses with
    ArrayExistsError and the same advice (to_zarr raised xarray's bare FileExistsError), and
    leaves every file as it was. With ``resume=True`` every front end finds nothing left to do
    (test_a_resume_over_a_finished_write_does_nothing_alike); over other metadata every resume
    is refused."""
    advice = {}
    for name, run in EVERY.items():
        if name == "batch part":
            continue  # a part writes into its batch's array, never creates it
        root = tmp_path / name.replace(" ", "-")
        run(root, mode="w-")
        before = files(root)
        with pytest.raises(shardwise.ArrayExistsError) as e:
            run(root, mode="w-")
        advice[name] = str(e.value).rsplit(" already exists ", 1)[-1]
        assert files(root) == before, name
        assert _resume_report(name, run(root, mode="w-", resume=True))[2], name  # nothing to do
        assert files(root) == before, name
    assert set(advice.values()) == {"(use mode='w' to replace it)", advice["convert"]}, advice
    for name in ("write_array", "Dataset", "DataTree"):
        root = tmp_path / f"{name}-other"
        EVERY[name](root, mode="w-")
        before = files(root)
        with pytest.raises(shardwise.ArrayExistsError, match="nothing to resume"):
            if name == "write_array":
                shardwise.write_array(DATA, root, path="0", chunks=(2, 5), shards=SHARDS,
                                      dimension_names=DIMS, mode="w-", resume=True)  # fmt: skip
            else:
                _to_zarr(root, _source().astype("float64"), name == "DataTree", None,
                         mode="w-", resume=True)  # fmt: skip
        assert files(root) == before, name


def _resume_report(name: str, report: Any) -> tuple[int, int, bool, str]:
    """What a resume's report says: shards written, shards done before, nothing to do, text
    (a conversion's: its one array's)."""
    if name.startswith("convert"):
        assert len(report.arrays) == 1, report
        one = report.arrays[0]
        return one.shards_written, one.shards_skipped, report.nothing_to_do, str(report)
    return report.shards_written, report.shards_skipped, report.nothing_to_do, str(report)


@pytest.mark.parametrize("name", [*EVERY, "convert group"])
def test_a_resume_over_a_finished_write_does_nothing_alike(tmp_path: Path, name: str) -> None:
    """``resume=True`` over a write that finished gives one answer from every front end
    (to_zarr of a Dataset or a DataTree refused it): nothing is written, every file of the
    store (journal included) keeps its bytes, inode and modification time, and the report
    says there was nothing to do, counting the shards found done."""
    run = convert_group if name == "convert group" else EVERY[name]
    root = tmp_path / name.replace(" ", "-")
    first = run(root, mode="w-")
    assert not getattr(first, "nothing_to_do", False)
    before = files(root)
    written, skipped, idle, text = _resume_report(name, run(root, mode="w-", resume=True))
    assert files(root) == before
    assert (written, idle) == (0, True), text
    assert skipped >= 6, text  # array "0" alone has 3 x 2 shards, all done before
    assert "nothing to do: the write had finished" in text


@pytest.mark.parametrize("name", ["write_array", "Dataset", "DataTree"])
@pytest.mark.parametrize("mode", ["a", "r+"])
def test_a_resume_into_a_finished_write_does_nothing_alike(
    tmp_path: Path, name: str, mode: str
) -> None:
    """The same in modes "a" and "r+" (into the array, the whole of it or a region whose
    edges split shards): resumed over its finished write, nothing is written (to_zarr
    rewrote the metadata and its 0-d variables in mode "a") and the report says so."""
    run = EVERY[name]
    root = tmp_path / name
    run(root, mode="w-")
    where: dict[str, Any] = {}
    if mode == "r+":
        where["region"] = ROWS
        run(root, mode=mode, **where)
    before = files(root)
    if name != "write_array" and mode == "a":  # no encoding: the arrays keep theirs (xarray)
        obj: Any = xr.DataTree(_ds(_source())) if name == "DataTree" else _ds(_source())
        report = shardwise.to_zarr(obj, root, mode="a", resume=True, consolidated=False)
    else:
        report = run(root, mode=mode, resume=True, **where)
    assert files(root) == before
    assert report.shards_written == 0 and report.nothing_to_do, str(report)


@pytest.mark.parametrize("name", ["Dataset", "DataTree"])
def test_a_resume_over_a_finished_tree_changed_since_is_refused(tmp_path: Path, name: str) -> None:
    """to_zarr's resume over its finished write with a shard deleted since (its record left):
    refused, naming how to finish it, before anything is written; then mode "a" with resume
    writes that shard again, the rest skipped."""
    root = tmp_path / name
    EVERY[name](root, mode="w-")
    (root / "0" / "c" / "1" / "0").unlink()
    before = files(root)
    with pytest.raises(shardwise.ArrayExistsError, match=r"changed since .* mode='a' with resume"):
        EVERY[name](root, mode="w-", resume=True)
    assert files(root) == before
    obj: Any = xr.DataTree(_ds(_source())) if name == "DataTree" else _ds(_source())
    again = shardwise.to_zarr(obj, root, mode="a", resume=True, consolidated=False)
    assert again.shards_written == 1 and not again.nothing_to_do
    np.testing.assert_array_equal(xr.open_zarr(root, consolidated=False)["0"].values, DATA)
    assert shardwise.verify(root, path="0").ok


def files(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``root``: its bytes, inode and modification time (a file deleted and
    written again, even with the same bytes, differs)."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_one_create_refuses_another_writers_array(tmp_path: Path) -> None:
    """An array created by another writer between a write's check and its create: the one
    create (write_array's, a pyramid level's, convert's) raises ArrayExistsError and leaves the
    other writer's array as it was (the pyramid raised zarr's ContainsArrayError)."""
    from shardwise.pyramid.target import create_level
    from shardwise.write.create import create_in_memory
    from shardwise.write.intent import create_metadata

    kwargs = dict(shape=SHAPE, dtype="float32", chunks=CHUNKS, shards=SHARDS)
    probe = create_in_memory(kwargs)
    root = tmp_path / "raced"
    shardwise.write_array(DATA, root, path="0", chunks=CHUNKS, shards=(4, 5))  # the other's
    before = (root / "0" / "zarr.json").read_bytes()
    for create in (create_metadata, create_level):
        with pytest.raises(shardwise.ArrayExistsError, match="was created by another writer"):
            create(LocalStore(root), "0", kwargs, probe)
    assert (root / "0" / "zarr.json").read_bytes() == before


def test_only_the_worker_settings_travel_with_the_shard_tasks(tmp_path: Path) -> None:
    """write_array's keywords are one WriteOptions, checked once at the API edge; what the
    pipeline hands the shard tasks is the small WriteSettings inside it (write_empty_chunks,
    threads, and supersede, which only a stream sets): what the caller decided (mode, lease,
    resume, ...) stays on the client."""
    import pickle
    from dataclasses import fields

    from shardwise.engine.write import WriteSettings
    from shardwise.write.options import WriteOptions
    from shardwise.write.target import prepare_write

    options = WriteOptions.checked(
        chunks=CHUNKS, shards=SHARDS, mode="w", resume=True, lease=False, threads=2,
        write_empty_chunks=True, memory_limit="64MiB",
    )  # fmt: skip
    assert options.memory_limit == 64 * 2**20  # checked into bytes, once
    sent = prepare_write(DATA, str(tmp_path / "s.zarr"), options).write.options
    assert sent is options.settings == WriteSettings(write_empty_chunks=True, threads=2)
    assert {f.name for f in fields(sent)} == {"write_empty_chunks", "threads", "supersede"}
    assert len(pickle.dumps(sent)) < 200


def test_the_pipeline_refuses_a_write_it_was_not_planned_for(tmp_path: Path) -> None:
    """Pipeline checks every write on entry (check_write): a source of another shape than the
    region, a plan off the array's grid, a job over its memory budget are refused with
    PlanError before a lease, a marker or a byte; the planned write itself passes."""
    from dataclasses import replace

    from shardwise.core.layout import Layout
    from shardwise.core.plan import ShardPlan
    from shardwise.errors import PlanError
    from shardwise.write.options import WriteOptions
    from shardwise.write.pipeline import Pipeline
    from shardwise.write.target import prepare_write

    root = tmp_path / "p.zarr"
    options = WriteOptions.checked(chunks=CHUNKS, shards=SHARDS)
    prepared = prepare_write(DATA, str(root), options)
    w = prepared.write
    assert w.job is prepared.job
    before = sorted(p.name for p in tmp_path.rglob("*"))
    other = ShardPlan(Layout(SHAPE, (4, 10), CHUNKS), w.plan.region)
    tight = replace(prepared.job, memory_limit=1)
    bad = {
        "the source's shape": replace(w, source=DATA[:5]),
        "not the array's": replace(w, plan=other, job=None),
        "memory_limit": replace(w, job=tight),
    }
    for words, write in bad.items():
        with pytest.raises(PlanError, match=words):
            Pipeline([write], lease=True)
    at_path = replace(w, source=DATA[:5], store=replace(w.store, path="g/a"))
    with pytest.raises(PlanError, match=r"^the write of array 'g/a' in "):
        Pipeline([at_path], lease=True)  # the array named (mutation lane: check_write_50)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    Pipeline([w], lease=True)  # checked, not entered: nothing taken


def test_the_pyramids_jobs_are_roles_of_the_one_job_maker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GeoZarr's small variables (y, x, the grid mapping) are written direct whatever strategy
    is asked, a reduced level direct where its shard task fits half the budget: both are roles
    of the one job maker (job_for), not overrides of it in the pyramid's modules."""
    from shardwise.core.layout import Layout
    from shardwise.core.plan import ShardPlan
    from shardwise.write.intent import job_for

    ds = xr.Dataset(
        {"v": (DIMS, DATA), "crs": ((), 0)},
        coords={"y": np.arange(SHAPE[0]), "x": np.arange(SHAPE[1])},
    )
    root = tmp_path / "geo"
    line = re.compile(r"^array '([^']+)' in file://.*: (\w+) write")
    with caplog.at_level(logging.DEBUG, logger="shardwise"):
        shardwise.write_pyramid(ds, root, layout="geozarr", levels=2, chunks=CHUNKS,
                                shards=SHARDS, strategy="staged")  # fmt: skip
    kinds = dict(m.groups() for r in caplog.records if (m := line.search(r.getMessage())))
    assert kinds == {
        "0/v": "staged", "1/v": "staged", "0/y": "direct", "0/x": "direct",
        "0/crs": "direct", "1/y": "direct", "1/x": "direct", "1/crs": "direct",
    }  # fmt: skip
    plan = ShardPlan(Layout(SHAPE, SHARDS, CHUNKS), (slice(0, SHAPE[0]), slice(0, SHAPE[1])))
    whole = job_for(plan, DATA, DATA.dtype, strategy="staged", role="whole")
    assert whole.strategy == "direct"
    # on processes (not threads: no rechunk in memory) a misaligned array is staged; a reduced
    # level is direct where its shard task (1920 bytes with its source blocks) fits half the
    # budget
    tiny = da.from_array(DATA, chunks=(3, 20))
    with dask.config.set(scheduler="processes"):
        for limit, role, kind in [(4000, "array", "staged"), (4000, "reduced", "direct"),
                                  (3000, "reduced", "staged")]:  # fmt: skip
            job = job_for(plan, tiny, DATA.dtype, memory_limit=limit, role=role)  # type: ignore[arg-type]
            assert job.strategy == kind, (limit, role, job.reason)


def test_a_pyramids_tree_is_one_part_of_the_one_graph_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pyramid levels written direct whose shards nest are ArrayWrites linked into one
    tree: the pipeline's one graph builder (build_part) takes them together as one part, no
    builder of the pyramid's own; the levels read back as the image reduced."""
    from shardwise.write import pipeline

    built: list[list[Any]] = []
    real = pipeline.build_part

    def seen(writes: Any) -> Any:
        built.append([w for w, _ in writes])
        return real(writes)

    monkeypatch.setattr(pipeline, "build_part", seen)
    image = np.arange(64 * 64, dtype="float32").reshape(64, 64)
    root = tmp_path / "tree"
    report = shardwise.write_pyramid(image, root, levels=3, chunks=8, shards=16)
    assert [[(w.prefix, w.tree.level) for w in ws] for ws in built] == [
        [("0", 0), ("1", 1), ("2", 2)]
    ]
    assert report.shards_written == 16 + 4 + 1
    level1 = image.reshape(32, 2, 32, 2).mean(axis=(1, 3))
    np.testing.assert_array_equal(shardwise.read_array(root, path="1"), level1)


def test_a_dataset_is_checked_as_a_tree_of_one_node(tmp_path: Path) -> None:
    """to_zarr's one check (xarray/tree.py:check_tree) takes a Dataset as a tree of one node:
    the same xarray pass into the overlay, the same writes and jobs as for the one-node
    DataTree, for a create and a region write alike."""
    from shardwise.xarray.tree import check_tree

    def checked(obj: Any, root: Path, **kw: Any) -> Any:
        given: dict[str, Any] = dict(
            shards={"y": SHARDS[0], "x": SHARDS[1]}, encoding=None, mode=None,
            append_dim=None, region=None, group=None, consolidated=False,
            storage_options=None, safe_shards=None, shard_bytes="64MiB", strategy="auto",
            memory_limit=None, resume=False, write_inherited_coords=False,
        )  # fmt: skip
        xw = check_tree(obj, root, **{**given, **kw})
        jobs = [xw.jobs.get(id(w)) for w in xw.writes]
        return (
            xw.overlay.changes,
            xw.mode,
            [(w.path, w.region, w.shape) for w in xw.writes],
            [None if j is None else (j.strategy, j.plan) for j in jobs],
        )

    ds = _ds(_source())
    root = tmp_path / "one"
    assert checked(ds, root) == checked(xr.DataTree(ds), root)
    dataset(root, mode="w-")
    part = _ds(_source()[ROWS])
    region = {"region": {"y": ROWS}, "mode": "r+"}
    assert checked(part, root, **region) == checked(xr.DataTree(part), root, **region)


def test_xarray_modules_share_no_private_names() -> None:
    """The modules of xarray/ import no underscore name of another module: what they share
    is named as shared (xarray's front end checks a Dataset and a DataTree by one function)."""
    import ast

    package = Path(shardwise.__file__).parent
    crossing = []
    for path in sorted((package / "xarray").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (
                node.level or "shardwise" in (node.module or "")
            ):
                crossing += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert crossing == []


def _decided(
    caplog: pytest.LogCaptureFixture, root: Path, run: Callable[[], Any]
) -> tuple[tuple[str, str, str], Any]:
    """Run ``run``; the strategy, lease kind and clear the pipeline wrote array "0" with, and
    what ``run`` returned."""
    line = re.compile(
        rf"^array '0' in file://{re.escape(str(root))}: (\w+) write, (\w+) lease, clear (\w+)"
    )
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="shardwise"):
        out = run()
    found = [m.groups() for r in caplog.records if (m := line.search(r.getMessage()))]
    assert len(found) == 1, [r.getMessage() for r in caplog.records]
    return found[0], out


def _failing(values: Any) -> Any:
    """``values`` (a dask array) whose last row block raises: the write is interrupted."""

    def f(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        assert block_info is not None
        if block_info[0]["chunk-location"][0] == len(values.chunks[0]) - 1:
            raise RuntimeError("interrupted")
        return block

    return values.map_blocks(f, dtype=values.dtype)


def _recorded(root: Path) -> int:
    records = root / "0" / ".shardwise" / "shards"
    return sum(1 for p in records.rglob("*") if p.is_file()) if records.exists() else 0


def test_to_zarrs_variables_are_decided_by_the_one_resolve(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """to_zarr asks write/intent.py:resolve what is at each variable's path, as write_array
    does: a create in mode "w-" clears the stale journal there, a mode "w" replace clears the
    old array (under its lease), and a resumed "w-" create of an interrupted write keeps its
    array and adopts its marker (clears nothing), skipping exactly the shards it recorded;
    the bytes are write_array's."""
    seen: dict[str, list[tuple[str, str, str]]] = {}
    stored: dict[str, dict[str, bytes]] = {}
    for name in ("write_array", "Dataset", "DataTree"):
        run, root, again = EVERY[name], tmp_path / name, tmp_path / f"{name}-resumed"
        seen[name] = [
            _decided(caplog, root, functools.partial(run, root, mode="w-"))[0],
            _decided(caplog, root, functools.partial(run, root, mode="w"))[0],
        ]
        with pytest.raises(RuntimeError, match="interrupted"):
            _interrupted(name, again)
        before = _recorded(again)
        decided, report = _decided(
            caplog, again, functools.partial(run, again, mode="w-", resume=True)
        )
        seen[name].append(decided)
        assert report.shards_skipped == before, name
        assert report.shards_written + before == 6, name
        stored[name] = shards(again)
    assert seen["write_array"] == [
        ("direct", "exclusive", "journal"),
        ("direct", "exclusive", "all"),
        ("direct", "exclusive", "none"),
    ]
    # mode "w": to_zarr's old arrays go with the group xarray's pass replaces (write/clear.py),
    # before the metadata (committed first with compute=False): the array's own clear is then
    # its journal's
    replaced = [
        *seen["write_array"][:1],
        ("direct", "exclusive", "journal"),
        seen["write_array"][2],
    ]
    assert seen["Dataset"] == replaced and seen["DataTree"] == replaced
    assert stored["Dataset"] == stored["write_array"] == stored["DataTree"]


def _interrupted(name: str, root: Path) -> Any:
    """An interrupted "w-" create of array "0" through front end ``name`` (its last rows fail)."""
    values = _failing(_source())
    if name == "write_array":
        return shardwise.write_array(
            values, root, path="0", chunks=CHUNKS, shards=SHARDS, dimension_names=DIMS, mode="w-"
        )
    return _to_zarr(root, values, name == "DataTree", None, mode="w-")


# the icechunk-session column: every front end that takes a session, through the one executor
SESSIONS = ("write_array", "Dataset", "DataTree", "pyramid level 0", "convert")


def _repo(path: Path) -> Any:
    import icechunk

    return icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)))


def session_shards(repo: Any) -> dict[str, bytes]:
    """The shard objects of array "0" in the branch's last commit."""
    store = ShardStore(repo.readonly_session("main").store, "0")
    return {k: store.get(k) or b"" for k in sorted(store.list("c"))}


@pytest.mark.parametrize("name", SESSIONS)
def test_a_create_into_an_icechunk_session_is_written_alike(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """Into an icechunk session every front end writes the bytes it writes into a store (its
    shard tasks direct into forks, no lease), commits once, and refuses mode "w-" over what
    it committed as it does on a store, the new session left without a change."""
    plain = tmp_path / "plain"
    EVERY["write_array"](plain, mode="w-")
    repo, run = _repo(tmp_path / "repo"), EVERY[name]
    kw: dict[str, Any] = {"src": tmp_path / "src"} if name == "convert" else {}
    if name == "convert":
        shardwise.write_array(DATA, kw["src"], path="0", chunks=CHUNKS, shards=SHARDS,
                              dimension_names=DIMS)  # fmt: skip
    line = re.compile(r"^array '0' in .*: (\w+) write, (\w+) lease")
    with caplog.at_level(logging.DEBUG, logger="shardwise"):
        run(repo.writable_session("main"), mode="w-", commit="created", **kw)
    found = [m.groups() for r in caplog.records if (m := line.search(r.getMessage()))]
    assert found == [("copy" if name == "convert" else "direct", "none")], found
    assert next(s.message for s in repo.ancestry(branch="main")) == "created"
    assert session_shards(repo) == shards(plain) and len(shards(plain)) == 6
    again = repo.writable_session("main")
    with pytest.raises(shardwise.ArrayExistsError) as e:
        run(again, mode="w-", commit="again", **kw)
    on_store_root = tmp_path / "store"
    run(on_store_root, mode="w-", **kw)
    with pytest.raises(shardwise.ArrayExistsError) as on_store:
        run(on_store_root, mode="w-", **kw)
    assert not again.has_uncommitted_changes
    # the same advice; the subject named as the target is (a store's path, the session)
    tail = str(e.value).rsplit(" already ", 1)[-1]
    assert tail == str(on_store.value).rsplit(" already ", 1)[-1]


def append(root: Any, name: str, **kw: Any) -> Any:
    """Rows DATA appended along "y" to array "0" by front end ``name``."""
    if name == "write_array":
        return shardwise.write_array(_source(), root, path="0", append_dim="y", **kw)
    ds = _ds(_source())
    obj: Any = xr.DataTree(ds) if name == "DataTree" else ds
    return shardwise.to_zarr(obj, root, append_dim="y", consolidated=False, **kw)


APPENDS = ("write_array", "Dataset", "DataTree")


@pytest.mark.parametrize("into", ["store", "session"])
def test_an_append_is_written_alike(tmp_path: Path, into: str) -> None:
    """The append column: every front end that appends grows array "0" by DATA's rows into a
    store and into an icechunk session, storing the bytes of the whole array written at once
    (the appended rows start on a shard boundary), its report naming the rows it wrote."""
    whole = tmp_path / "whole"
    shardwise.write_array(np.concatenate([DATA, DATA]), whole, path="0", chunks=CHUNKS,
                          shards=SHARDS, dimension_names=DIMS)  # fmt: skip
    for name in APPENDS:
        if into == "store":
            root = tmp_path / name
            EVERY[name](root, mode="w-")
            report = append(root, name)
            stored = shards(root)
        else:
            repo = _repo(tmp_path / f"{name}-repo")
            EVERY[name](repo.writable_session("main"), mode="w-", commit="created")
            report = append(repo.writable_session("main"), name, commit="appended")
            stored = session_shards(repo)
        assert report.shards_written == 6, (name, str(report))
        assert stored == shards(whole), name


@pytest.mark.parametrize("name", ["write_array", "Dataset", "DataTree"])
def test_mode_r_plus_over_nothing_is_refused_alike(tmp_path: Path, name: str) -> None:
    """Mode "r+" writes into what is there: over nothing (no directory, or an empty one)
    every front end that takes it refuses with shardwise's ArrayNotFoundError (to_zarr raised
    zarr's GroupNotFoundError, or a bare FileNotFoundError without the directory) and creates
    nothing."""
    ds = _ds(_source())
    for root in (tmp_path / f"{name}-none", tmp_path / f"{name}-empty"):
        if root.name.endswith("empty"):
            root.mkdir()
        with pytest.raises(shardwise.ArrayNotFoundError, match="r\\+"):
            if name == "write_array":
                shardwise.write_array(DATA, root, path="0", mode="r+")
            else:
                obj: Any = xr.DataTree(ds) if name == "DataTree" else ds
                shardwise.to_zarr(obj, root, mode="r+")
        assert not root.exists() or not any(root.iterdir()), name
