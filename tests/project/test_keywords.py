"""Every public keyword of every public verb, fed wrong types and values: the call is refused
with a shardwise error that is also the builtin a caller expects (``InvalidTypeError`` is a
``TypeError``, ``InvalidValueError`` a ``ValueError``), whose message names the keyword and what
it accepts, and the store is byte-identical afterwards (a new store is not created).

To cover a new keyword, add a row to ``CASES`` (or a kind to ``KINDS``): ``(verb, keyword, bad
value, error, words the message must hold)``. ``VERBS`` says how each verb is called against the
stores the ``root`` fixture prepares. The layout keywords (``shards=``, ``chunks=``,
``shard_bytes=``) are the shard-shape rule's and tested with it.

Also here: sizes as dask users write them ("256MiB"), plans too large to list, unknown dask
chunks through ``to_zarr``, and the report of an all-fill write.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.storage import MemoryStore

import shardwise
from faultkit import snapshot
from shardwise import batch
from shardwise.errors import (
    InvalidTypeError,
    InvalidValueError,
    OutputError,
    PlanError,
    SelectionError,
    ShardwiseError,
)

X = np.arange(64, dtype="f4").reshape(8, 8)
LAYOUT: dict[str, Any] = dict(chunks=(2, 2), shards=(4, 4))


def dataset() -> xr.Dataset:
    return xr.Dataset({"v": (("t", "y"), X)}, coords={"t": np.arange(8)})


# how each verb is called against ``root`` (see the fixture): ``kw`` is the keyword under test
VERBS: dict[str, Callable[..., Any]] = {
    "write_array": lambda root, **kw: shardwise.write_array(X, root / "new", **LAYOUT, **kw),
    "write_array layout": lambda root, **kw: shardwise.write_array(X, root / "new", **kw),
    "write_array r+": lambda root, **kw: shardwise.write_array(
        X[:4], root / "a", mode="r+", region=kw.pop("region", (slice(0, 4), slice(None))), **kw
    ),
    "plan_write": lambda root, **kw: shardwise.plan_write(X, root / "new", **LAYOUT, **kw),
    "open_array": lambda root, **kw: shardwise.open_array(root / "a", **kw),
    "read_array": lambda root, **kw: shardwise.read_array(root / "a", **kw),
    "to_zarr": lambda root, **kw: shardwise.to_zarr(dataset(), root / "new.zarr", **kw),
    "to_zarr a": lambda root, **kw: shardwise.to_zarr(dataset(), root / "ds.zarr", mode="a", **kw),
    "open_dataset": lambda root, **kw: shardwise.open_dataset(root / "ds.zarr", **kw),
    "convert": lambda root, **kw: shardwise.convert(root / "a", root / "conv", **kw),
    "verify": lambda root, **kw: shardwise.verify(root / "a", **kw),
    "batch.init": lambda root, **kw: batch.init(
        root / "new-batch", **{"shape": (8, 8), "dtype": "f4", **LAYOUT, "parts": 2, **kw}
    ),
    "batch.write_part": lambda root, **kw: batch.write_part(
        X, root / "bt", kw.pop("part", 0), **kw
    ),
    "batch.finalize": lambda root, **kw: batch.finalize(root / "bt", **kw),
    "write_pyramid": lambda root, **kw: shardwise.write_pyramid(X, root / "pyr", **LAYOUT, **kw),
}

T, V = InvalidTypeError, InvalidValueError
FLAG = [("yes", T, "True or False"), (1, T, "True or False"), (None, T, "True or False")]
OPTIONAL_FLAG = [("no", T, "True, False or None"), (0, T, "True, False or None")]
THREADS = [("2", T, "positive integer"), (1.5, T, "positive integer"), (True, T, "positive")]
THREADS += [(0, V, "positive integer"), (-1, V, "positive integer")]
BYTES = [("lots", V, "256MiB"), ([1], T, "256MiB"), (0, V, "positive"), ("-1MiB", V, "bytes")]
PATH = [(5, T, "string or None"), (b"a", T, "string or None")]
OPTIONS = [(5, T, "dict or None"), ("anon=1", T, "dict or None")]
REGION = [(5, T, "tuple of slices"), ((0, 4), T, "tuple of slices")]
REGION += [((slice(0, "4"), slice(None)), T, "integer bounds")]
STRATEGY = [("fast", V, "'staged'"), (1, T, "'staged'")]

# the kinds of keywords, and the verbs that take each: every pair is a case
KINDS: dict[str, tuple[list[tuple[Any, type, str]], dict[str, list[str]]]] = {
    "flag": (
        FLAG,
        {
            "write_array": ["write_empty_chunks", "fsync", "compute", "progress", "resume"],
            "write_array r+": ["break_lease", "resume", "dry_run"],
            "plan_write": ["fsync", "progress"],
            "open_array": ["cache_indexes"],
            "to_zarr": ["compute", "fsync", "progress", "resume"],
            "to_zarr a": ["break_lease"],
            "open_dataset": ["cache_indexes"],
            "convert": ["resume", "verify", "progress", "break_lease", "fsync"],
            "verify": ["strict", "progress"],
            "batch.init": ["break_lease"],
            "batch.write_part": ["resume", "break_lease", "fsync", "progress"],
            "write_pyramid": ["resume", "compute", "fsync", "progress", "write_empty_chunks"],
        },
    ),
    "optional flag": (
        OPTIONAL_FLAG,
        {
            "write_array": ["lease"],
            "write_pyramid": ["lease"],
            "convert": ["lease"],
            "batch.init": ["lease"],
            "batch.write_part": ["lease"],
            # write_empty_chunks: None is Dataset.to_zarr's default (zarr's setting)
            "to_zarr": ["consolidated", "safe_shards", "lease", "write_empty_chunks"],
            "open_dataset": ["consolidated"],
        },
    ),
    "threads": (
        THREADS,
        {
            v: ["threads"]
            for v in (
                "write_array",
                "plan_write",
                "open_array",
                "read_array",
                "to_zarr",
                "open_dataset",
                "convert",
                "verify",
                "batch.write_part",
                "batch.finalize",
                "write_pyramid",
            )
        },
    ),
    "bytes": (
        BYTES,
        {v: ["memory_limit"] for v in ("write_array", "to_zarr", "write_pyramid")},
    ),
    "path": (
        PATH,
        {
            "write_array": ["path"],
            "write_pyramid": ["path"],
            "open_array": ["path"],
            "read_array": ["path"],
            "to_zarr": ["group"],
            "open_dataset": ["group"],
            "convert": ["path", "dst_path"],
            "verify": ["path"],
            "batch.init": ["path"],
            "batch.finalize": ["path"],
        },
    ),
    "options": (
        OPTIONS,
        {
            v: ["storage_options"]
            for v in (
                "write_array",
                "open_array",
                "read_array",
                "to_zarr",
                "open_dataset",
                "convert",
                "verify",
                "batch.init",
                "batch.write_part",
                "batch.finalize",
                "write_pyramid",
            )
        },
    ),
    "region": (REGION, {"write_array r+": ["region"]}),
    "strategy": (
        STRATEGY,
        {v: ["strategy"] for v in ("write_array", "to_zarr", "write_pyramid")},
    ),
}

CASES: list[tuple[str, str, Any, type, list[str]]] = [
    (verb, kw, value, error, [kw, words])
    for values, verbs in KINDS.values()
    for verb, kws in verbs.items()
    for kw in kws
    for value, error, words in values
] + [
    ("write_array", "mode", "x", V, ["mode", "'w-'"]),
    ("write_array", "mode", 1, T, ["mode", "'w-'"]),
    ("to_zarr", "mode", "replace", V, ["mode", "'w-'"]),
    ("convert", "mode", "a", V, ["mode", "'w-'"]),
    ("batch.init", "mode", "a", V, ["batch init mode", "'r+'"]),
    ("write_array", "zarr_format", 2, V, ["zarr_format", "3"]),
    ("write_array", "dtype", "notadtype", T, ["dtype='notadtype'"]),
    ("write_array", "fill_value", "abc", T, ["fill_value='abc'"]),
    ("write_array", "fill_value", [1, 2], T, ["fill_value=[1, 2]"]),
    ("write_array", "dimension_names", 1, T, ["dimension_names=1"]),
    ("write_array", "attributes", 5, T, ["attributes=5"]),
    ("write_array", "compressors", "zstd", T, ["compressors='zstd'"]),
    ("write_array", "filters", 5, T, ["filters=5"]),
    ("write_array", "serializer", 5, T, ["serializer=5"]),
    ("write_array", "chunk_key_encoding", "slash", T, ["chunk_key_encoding='slash'"]),
    ("open_array", "chunks", "lots", V, ["chunks", "'auto'"]),
    ("open_array", "chunks", 0, V, ["chunks", "positive"]),
    ("open_array", "chunks", (0, 4), V, ["chunks", "positive"]),
    ("write_array layout", "shards", (8,), V, ["shards=(8,)", "2 dimension(s)"]),
    ("write_array layout", "chunks", (2, 2, 2), V, ["chunks=(2, 2, 2)", "2 dimension(s)"]),
    ("write_array layout", "shards", (0, 8), V, ["shards=(0, 8)", "positive"]),
    ("to_zarr", "shards", 10, T, ["shards", "a shape (10, 10)", "(int)"]),
    ("to_zarr", "shards", "10", V, ["shards", "a byte size ('2GB')", "'10'"]),
    ("to_zarr", "shards", (4,), V, ["shards=(4,)", "'v' has 2 dimension(s)", "{'t': 4}"]),
    ("to_zarr", "shards", [0, 4], V, ["shards", "positive sizes"]),
    ("to_zarr", "group", "g/zarr.json", V, ["group='g/zarr.json'", "'zarr.json'"]),
    ("to_zarr", "group", "g//h", V, ["group='g//h'", "empty name"]),
    ("to_zarr", "group", "..", V, ["group='..'", "directories"]),
    ("write_array", "path", "a/zarr.json", V, ["path='a/zarr.json'", "'zarr.json'"]),
    ("write_array", "path", "g/.shardwise", V, ["path='g/.shardwise'", "records"]),
    ("write_pyramid", "path", "p//q", V, ["path='p//q'", "empty name"]),
    ("write_pyramid", "name", "a/b", V, ["name='a/b'", "contains '/'"]),
    ("convert", "dst_path", "x/zarr.json", V, ["dst_path='x/zarr.json'", "'zarr.json'"]),
    ("read_array", "selection", "abc", SelectionError, ["'abc'", "basic selections"]),
    ("read_array", "selection", 1.5, SelectionError, ["1.5", "basic selections"]),
    ("read_array", "out", [1], OutputError, ["out=", "numpy array"]),
    ("read_array", "out", np.zeros((8, 8), "f8"), OutputError, ["out=", "float32"]),
    ("to_zarr", "encoding", 5, T, ["encoding", "dict or None"]),
    ("to_zarr", "encoding", {"v": "foo"}, V, ["encoding['v']", "dictionary"]),
    ("to_zarr", "append_dim", "nope", V, ["append_dim='nope'", "dimensions"]),
    ("to_zarr a", "region", slice(None), T, ["region", "must be a dict"]),
    ("to_zarr a", "region", "all", V, ["region", "'auto'"]),
    ("to_zarr a", "region", {"nope": slice(0, 8)}, V, ["region", "['nope']"]),
    ("to_zarr a", "append_dim", ["t"], T, ["append_dim", "dimension name"]),
    ("open_dataset", "chunks", "lots", V, ["chunks", "'shards'"]),
    ("open_dataset", "chunks", 1.5, T, ["chunks", "'shards'"]),
    ("convert", "compressors", "zstd", T, ["compressors='zstd'"]),
    ("batch.init", "fill_value", "abc", T, ["fill_value='abc'"]),
    ("batch.init", "dtype", "nope", T, ["dtype='nope'"]),
    ("batch.init", "shape", "x", T, ["shape", "non-negative ints"]),
    ("batch.init", "parts", 0, V, ["parts", "positive integer"]),
    ("batch.init", "parts", "2", T, ["parts", "list of regions"]),
    ("batch.write_part", "part", "0", T, ["part must be an int"]),
    ("batch.write_part", "part", 7, V, ["part 7", "0..1"]),
    ("write_pyramid", "mode", "a", V, ["mode", "'w-'"]),
    ("write_pyramid", "levels", 0, V, ["levels", "positive integer"]),
    ("write_pyramid", "factors", [2], V, ["factors", "one int per axis"]),
    ("write_pyramid", "method", "max", V, ["method", "'nearest'"]),
    ("write_pyramid", "dims", "yx", T, ["dims", "sequence of axis names"]),
    ("write_pyramid", "scale", 2.0, T, ["scale", "mapping"]),
    ("write_pyramid", "units", {"x": 1}, T, ["units['x']", "str"]),
    ("write_pyramid", "compressors", "zstd", T, ["compressors='zstd'"]),
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An array ``a``, a dataset ``ds.zarr`` and an open batch ``bt`` with its parts written."""
    shardwise.write_array(X, tmp_path / "a", **LAYOUT)
    shardwise.to_zarr(dataset(), tmp_path / "ds.zarr")
    batch.init(tmp_path / "bt", shape=(8, 8), dtype="f4", **LAYOUT, parts=2)
    return tmp_path


def _id(case: tuple[str, str, Any, type, list[str]]) -> str:
    verb, kw, value, _, _ = case
    return f"{verb}-{kw}={value!r}"[:60]


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_wrong_keyword_is_refused_and_nothing_is_written(
    root: Path, case: tuple[str, str, Any, type, list[str]]
) -> None:
    verb, kw, value, error, words = case
    before = snapshot(root)
    with pytest.raises(error) as caught:
        VERBS[verb](root, **{kw: value})
    assert isinstance(caught.value, ShardwiseError)
    builtin = TypeError if error is T else ValueError if error is V else None
    assert builtin is None or isinstance(caught.value, builtin)
    for w in words:
        assert w in str(caught.value), (w, str(caught.value))
    assert snapshot(root) == before


def test_every_public_verb_has_cases() -> None:
    """The table covers every verb of ``shardwise.__all__`` (and the batch verbs)."""
    verbs = {"write_array", "plan_write", "open_array", "read_array", "to_zarr"}
    verbs |= {"open_dataset", "convert", "verify", "batch.init", "batch.write_part"}
    verbs |= {"batch.finalize", "write_pyramid"}
    assert {v for v in verbs if v in shardwise.__all__ or v.startswith("batch.")} == verbs
    assert verbs <= {verb.split(" ")[0] for verb, *_ in CASES}


# -- any wrong value, drawn ------------------------------------------------------------------------

NOT_BOOL = st.one_of(
    st.integers(), st.text(max_size=5), st.floats(), st.none(), st.lists(st.none())
)
NOT_COUNT = st.one_of(
    st.integers(max_value=0), st.text(max_size=5), st.floats(), st.booleans(), st.tuples()
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    flag=st.sampled_from(["fsync", "compute", "progress", "resume", "write_empty_chunks"]),
    value=NOT_BOOL,
)
def test_any_non_bool_flag_is_refused_before_the_store_is_touched(flag: str, value: Any) -> None:
    held: dict[str, Any] = {}
    with pytest.raises(InvalidTypeError, match=f"{flag} must be True or False"):
        shardwise.write_array(X, MemoryStore(held), **LAYOUT, **{flag: value})
    assert held == {}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=NOT_COUNT, verb=st.sampled_from(["write_array", "to_zarr"]))
def test_any_non_positive_thread_count_is_refused(value: Any, verb: str) -> None:
    held: dict[str, Any] = {}
    with pytest.raises((InvalidTypeError, InvalidValueError), match="threads must be a posit"):
        if verb == "write_array":
            shardwise.write_array(X, MemoryStore(held), **LAYOUT, threads=value)
        else:
            shardwise.to_zarr(dataset(), MemoryStore(held), threads=value)
    assert held == {}


# -- what is accepted ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given_limit", "expected"),
    [("256MiB", 256 * 2**20), ("1.5GB", 1_500_000_000), ("64 kB", 64_000), (2**20, 2**20)],
)
def test_memory_limit_takes_what_dask_takes(given_limit: Any, expected: int) -> None:
    job = shardwise.plan_write(X, MemoryStore(), **LAYOUT, memory_limit=given_limit)
    assert job.memory_limit == expected and job.memory_limit_from == "memory_limit="


def test_numpy_values_are_accepted_for_flags_and_counts(tmp_path: Path) -> None:
    rep = shardwise.write_array(
        X, tmp_path / "n", **LAYOUT, fsync=np.bool_(False), threads=np.int64(2)
    )
    assert rep.shards_written == 4
    assert np.array_equal(shardwise.read_array(tmp_path / "n", threads=np.int32(1)), X)


# -- plans too large to list, unknown chunks -------------------------------------------------------


def test_a_plan_of_2_to_the_32_shards_is_refused_with_the_count() -> None:
    held: dict[str, Any] = {}
    data = da.zeros((2**32,), dtype="u1", chunks=2**30)
    with pytest.raises(PlanError, match="4,294,967,296 shard tasks") as caught:
        shardwise.plan_write(data, MemoryStore(held), chunks=(1,), shards=(1,))
    assert "larger shards" in str(caught.value)
    assert held == {}


def test_unknown_dask_chunks_are_refused_alike_by_write_array_and_to_zarr(tmp_path: Path) -> None:
    x = da.from_array(np.arange(10.0), chunks=5)
    unknown = x[x > 3]
    with pytest.raises(PlanError, match="unknown chunk sizes") as by_array:
        shardwise.write_array(unknown, tmp_path / "a")
    ds = xr.Dataset({"v": ("x", unknown)})
    with pytest.raises(PlanError, match="unknown chunk sizes") as by_dataset:
        shardwise.to_zarr(ds, tmp_path / "b.zarr")
    assert "compute_chunk_sizes()" in str(by_array.value)
    assert "variable 'v': " in str(by_dataset.value)
    assert str(by_dataset.value).endswith(str(by_array.value)[-60:])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b.zarr").exists()


# -- no warnings the user did not cause, reports that say what happened ----------------------------


def test_default_to_zarr_warns_nothing_and_open_zarr_reads_it_without_warnings(
    tmp_path: Path,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shardwise.to_zarr(dataset(), tmp_path / "d.zarr")
        got = xr.open_zarr(tmp_path / "d.zarr").load()
    xr.testing.assert_identical(got, dataset())


def test_report_of_an_all_fill_write_says_nothing_was_stored(tmp_path: Path) -> None:
    rep = shardwise.write_array(np.zeros((8, 8), "f4"), tmp_path / "z", **LAYOUT, fill_value=0)
    text = str(rep)
    assert rep.shards_written == 0 and rep.shards_empty == 4
    assert text.startswith("0 shards written, 4 all-fill shards skipped (0 deleted)")
    assert "the 0.0 MB of data all equal the fill value: nothing stored" in text
    assert "nan" not in text and "ratio" not in text and "MB of data written" not in text
    mixed = shardwise.write_array(X, tmp_path / "m", **LAYOUT, fill_value=0)
    assert "4 shards written" in str(mixed) and "(ratio " in str(mixed)


@pytest.mark.parametrize("shards", [(4, 4), [4, 4], (np.int64(4), 4)])
def test_to_zarr_takes_a_shape_for_shards_as_write_array_does(tmp_path: Path, shards: Any) -> None:
    """``shards=(4, 4)`` gives its sizes, by position, to the dimensions of the data variables
    (the coordinates take the sizes of their dimensions): the layout of ``{"t": 4, "y": 4}``."""
    shardwise.to_zarr(dataset(), tmp_path / "shape.zarr", shards=shards)
    shardwise.to_zarr(dataset(), tmp_path / "named.zarr", shards={"t": 4, "y": 4})
    for store in ("shape.zarr", "named.zarr"):
        group = zarr.open_group(tmp_path / store, mode="r")
        assert {n: a.shards for n, a in group.arrays()} == {"v": (4, 4), "t": (4,)}
    with xr.open_dataset(tmp_path / "shape.zarr", engine="shardwise") as back:
        xr.testing.assert_identical(back.load(), dataset())


def test_to_zarr_takes_a_shape_for_the_shards_of_a_tree(tmp_path: Path) -> None:
    tree = xr.DataTree.from_dict({"/": dataset(), "/g": xr.Dataset({"w": (("t", "y"), X * 2)})})
    shardwise.to_zarr(tree, tmp_path / "t.zarr", shards=(2, 8))
    assert zarr.open_array(tmp_path / "t.zarr/g/w", mode="r").shards == (2, 8)
    assert zarr.open_array(tmp_path / "t.zarr/v", mode="r").shards == (2, 8)


def test_to_zarr_takes_the_none_of_every_keyword_it_shares_with_dataset_to_zarr(
    tmp_path: Path,
) -> None:
    """``None`` is ``Dataset.to_zarr``'s default of each of these keywords: shardwise takes it
    with xarray's meaning (``write_empty_chunks=None``: zarr's ``array.write_empty_chunks``)."""
    nones = dict.fromkeys(
        ("mode", "group", "encoding", "consolidated", "append_dim", "region"), None
    )
    empty = xr.Dataset({"v": (("t", "y"), np.full((8, 8), np.nan, "f4"))})  # the fill value
    shardwise.to_zarr(
        empty, tmp_path / "a.zarr", **nones, storage_options=None, write_empty_chunks=None
    )
    stored = [p for p in (tmp_path / "a.zarr" / "v" / "c").rglob("*") if p.is_file()]
    assert stored == []  # zarr's default: empty chunks are not stored
    with zarr.config.set({"array.write_empty_chunks": True}):
        shardwise.to_zarr(empty, tmp_path / "b.zarr", write_empty_chunks=None)
    stored = [p for p in (tmp_path / "b.zarr" / "v" / "c").rglob("*") if p.is_file()]
    assert stored != []
    with xr.open_zarr(tmp_path / "b.zarr") as back:
        xr.testing.assert_identical(back.load(), empty)


@pytest.mark.parametrize("verb", ["write_array", "to_zarr", "write_pyramid", "convert"])
def test_an_unknown_write_keyword_names_the_verb_it_was_given_to(verb: str) -> None:
    """The one check of a write's keywords (WriteOptions.checked) names the public call a
    keyword it does not take was given to, whichever front end asks, with the nearest it
    takes."""
    from shardwise.write.options import WriteOptions

    with pytest.raises(InvalidTypeError) as e:
        WriteOptions.checked(verb=verb, fsynk=True)
    assert str(e.value) == f"'fsynk' is not a keyword of {verb} (did you mean 'fsync'?)"


def test_write_arrays_keywords_are_the_records() -> None:
    """write_array hands its keywords to WriteOptions.checked by name: its signature lists
    every keyword the record takes and no other (but ``commit``, the icechunk session's), each
    keyword-only and documented."""
    import inspect

    from shardwise.write.options import WriteOptions

    params = inspect.signature(shardwise.write_array).parameters
    keywords = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == WriteOptions.keywords() | {"commit"}
    assert set(params) - keywords == {"data", "store"}
    doc = inspect.getdoc(shardwise.write_array) or ""
    documented = set(re.findall(r"^(\w+(?:, \w+)*) :", doc, re.M))
    assert keywords <= {n for names in documented for n in names.split(", ")}


def test_to_zarr_checks_the_keywords_it_shares_with_write_array_by_its_record() -> None:
    """to_zarr hands WriteOptions.checked every keyword it shares with write_array, but those
    xarray gives a meaning of its own (shards by dimension name, xarray's modes, a region by
    dimension name, an append_dim by dimension name, write_empty_chunks=None): one check, one
    message, for both calls."""
    import inspect

    from shardwise.write.options import WriteOptions
    from shardwise.xarray.writer import _RECORDED

    params = set(inspect.signature(shardwise.to_zarr).parameters)
    xarrays = {"shards", "mode", "region", "append_dim", "write_empty_chunks"}
    assert (params & WriteOptions.keywords()) - xarrays == _RECORDED


def test_a_batch_part_names_itself_and_write_array_for_an_unknown_keyword(tmp_path: Path) -> None:
    """batch.write_part passes its **keywords on to write_array: one neither takes names both,
    and one a part decides itself (mode, region) is refused, naming write_part; the store
    byte-identical."""
    root = tmp_path / "b.zarr"
    batch.init(root, shape=(8, 8), dtype="uint8", chunks=(2, 2), shards=(4, 4), parts=2)
    before = snapshot(root)
    values = np.ones((8, 8), "uint8")
    with pytest.raises(InvalidTypeError) as e:
        batch.write_part(values, root, 0, thread=2)
    assert str(e.value) == (
        "'thread' is not a keyword of write_array (did you mean 'threads'?), which "
        "batch.write_part passes its keywords to"
    )
    for name, value in (("mode", "w"), ("region", (slice(0, 4), ...)), ("verb", "x")):
        with pytest.raises(
            InvalidTypeError, match=f"{name!r} is not a keyword of batch.write_part"
        ):
            batch.write_part(values, root, 0, **{name: value})
    assert snapshot(root) == before
