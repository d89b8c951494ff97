"""Every input a user hands over: written as zarr-python writes it, or refused before anything is
created with a shardwise error that says what to do (the store byte-identical after a refusal).

* datetime64/timedelta64 and strings (numpy StringDType, object arrays of Python str) written
  with the bytes zarr-python writes (shards and ``zarr.json``), read back by zarr-python and
  shardwise (tensorstore's zarr3 driver has neither data type);
* a dask-backed ``xarray.DataArray`` given to ``write_array``;
* dask arrays of unknown chunk sizes, Dataset variables named like store keys;
* groups and Zarr v2 arrays given to ``open_array``, ``inspect``, ``verify``;
* the CLI: one line on stderr and the documented exit code for every failure, storage options;
* messages name the store and array (never ``path None`` or ``array '/'``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr

import shardwise
from faultkit import BUCKET, CREDS, exe, files, moto_s3, snapshot
from shardwise.cli import main
from shardwise.codec.metadata import default_compressors
from shardwise.durability.lease import Lease
from shardwise.errors import (
    ArrayExistsError,
    ArrayNotFoundError,
    InvalidValueError,
    LeaseHeldError,
    NotAnArrayError,
    PlanError,
    UnsupportedCodecError,
)
from shardwise.storage.store import ShardStore

STRINGS = np.array(["a", "bé", "", "dddd", "ünïcode ✓", "x" * 40] * 7, dtype=object)


def same_as_zarr_python(ours: Path, theirs: Path) -> None:
    """Every object zarr-python stored is stored by shardwise with the same bytes (and no more)."""
    assert files(ours) == files(theirs)


def times(dtype: str, n: int = 42) -> np.ndarray:
    out = (np.arange(n, dtype="i8") * 7919 - 3000).astype(dtype)
    out[[3, 17]] = np.array("NaT", dtype=dtype)
    return out


# zarr-python's reference arrays get the compressors shardwise gives new arrays by default (zstd
# with its frame checksum), so that the stored bytes can be compared
SAME_CODECS: dict[str, Any] = dict(compressors=default_compressors())


# -- 1. datetime64 / timedelta64 ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["datetime64[ns]", "datetime64[s]", "timedelta64[ms]"])
@pytest.mark.parametrize("source", ["numpy", "dask"])
def test_datetimes_and_timedeltas_as_zarr_python_writes_them(
    tmp_path: Path, dtype: str, source: str, read_zarr: Any
) -> None:
    values = times(dtype)
    data: Any = values if source == "numpy" else da.from_array(values, chunks=9)
    layout: dict[str, Any] = dict(chunks=(5,), shards=(10,))
    shardwise.write_array(data, tmp_path / "s", **layout)
    zarr.create_array(
        tmp_path / "z", shape=values.shape, dtype=values.dtype, **layout, **SAME_CODECS
    )[...] = values
    same_as_zarr_python(tmp_path / "s", tmp_path / "z")
    for got in (read_zarr(tmp_path / "s"), shardwise.open_array(tmp_path / "z").compute()):
        assert got.dtype == values.dtype
        assert np.array_equal(got.view("i8"), values.view("i8"))


def test_datetime_region_write_merges_into_stored_shards(tmp_path: Path, read_zarr: Any) -> None:
    values = times("datetime64[ns]")
    shardwise.write_array(values, tmp_path / "s", chunks=(5,), shards=(10,))
    z = zarr.create_array(
        tmp_path / "z",
        shape=values.shape,
        dtype=values.dtype,
        chunks=(5,),
        shards=(10,),
        **SAME_CODECS,
    )
    z[...] = values
    part = np.arange(12).astype("datetime64[D]").astype("datetime64[ns]")
    shardwise.write_array(part, tmp_path / "s", mode="r+", region=(slice(13, 25),))
    z[13:25] = part
    same_as_zarr_python(tmp_path / "s", tmp_path / "z")
    want = values.copy()
    want[13:25] = part
    assert np.array_equal(read_zarr(tmp_path / "s").view("i8"), want.view("i8"))


# -- 1. strings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "dtype"),
    [
        (lambda: STRINGS, str),  # refused "without loss" before
        (lambda: STRINGS, None),  # object array of str: a string array
        (lambda: da.from_array(STRINGS, chunks=8), str),
        (lambda: STRINGS.astype(np.dtypes.StringDType()), None),
        (lambda: STRINGS.astype(np.dtypes.StringDType()), str),
    ],
    ids=["object-dtype-str", "object", "dask-object", "stringdtype", "stringdtype-dtype-str"],
)
def test_strings_as_zarr_python_writes_them(
    tmp_path: Path, make: Any, dtype: Any, read_zarr: Any
) -> None:
    layout: dict[str, Any] = dict(chunks=(4,), shards=(12,))
    shardwise.write_array(make(), tmp_path / "s", dtype=dtype, **layout)
    zarr.create_array(tmp_path / "z", shape=STRINGS.shape, dtype=str, **layout, **SAME_CODECS)[
        ...
    ] = STRINGS
    same_as_zarr_python(tmp_path / "s", tmp_path / "z")
    assert read_zarr(tmp_path / "s").tolist() == STRINGS.tolist()
    assert shardwise.open_array(tmp_path / "z").compute().tolist() == STRINGS.tolist()


def test_object_strings_into_an_existing_string_array(tmp_path: Path, read_zarr: Any) -> None:
    z = zarr.create_array(tmp_path / "s", shape=STRINGS.shape, dtype=str, chunks=(4,), shards=(12,))
    z[...] = STRINGS
    new = np.array([f"new {i}" for i in range(10)], dtype=object)
    shardwise.write_array(new, tmp_path / "s", mode="r+", region=(slice(5, 15),))
    want = STRINGS.copy()
    want[5:15] = new
    assert read_zarr(tmp_path / "s").tolist() == want.tolist()


@pytest.mark.parametrize(
    ("data", "dtype", "error", "message"),
    [
        # values the given dtype cannot hold: the write is refused; object data without a
        # dtype is an argument shardwise never takes
        (
            np.array(["a", 1, None], dtype=object),
            str,
            PlanError,
            "Python str values only, got 1 of type int",
        ),
        (
            np.array(["a", 1], dtype=object),
            None,
            InvalidValueError,
            r"pass dtype= \(e.g. dtype=str",
        ),
        (
            da.from_array(np.array(["a", "b"], dtype=object), chunks=1),
            None,
            InvalidValueError,
            "pass dtype=",
        ),
    ],
    ids=["non-str-values", "mixed-object", "dask-object-no-dtype"],
)
def test_objects_that_are_not_strings_are_refused_before_anything(
    tmp_path: Path, data: Any, dtype: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        shardwise.write_array(data, tmp_path / "s", dtype=dtype, chunks=(2,), shards=(2,))
    assert files(tmp_path, journal=True) == {}
    # into an existing array: byte-identical
    shardwise.write_array(
        np.array(["x", "y", "z"]), tmp_path / "e", dtype=str, chunks=(1,), shards=(3,)
    )
    before = files(tmp_path / "e", journal=True)
    with pytest.raises(InvalidValueError, match="pass dtype="):
        shardwise.write_array(np.array(["a", 1, None], dtype=object), tmp_path / "e", mode="r+")
    assert files(tmp_path / "e", journal=True) == before


# -- 2. xarray.DataArray given to write_array ---------------------------------------------------


@pytest.mark.parametrize("backing", ["dask", "numpy"])
def test_write_array_takes_a_dataarray(tmp_path: Path, backing: str, read_zarr: Any) -> None:
    values = np.arange(35.0)
    arr = xr.DataArray(da.from_array(values, chunks=5) if backing == "dask" else values, dims="t")
    report = shardwise.write_array(arr, tmp_path / "s", chunks=(5,), shards=(10,))
    assert report.shards_written == 4
    assert np.array_equal(read_zarr(tmp_path / "s"), values)


# -- 3. variables named like store keys ---------------------------------------------------------


@pytest.mark.parametrize("name", ["zarr.json", ".shardwise", ".", ".."])
def test_variables_named_like_store_keys_are_refused(tmp_path: Path, name: str) -> None:
    ds = xr.Dataset({name: ("t", np.arange(10.0))})
    with pytest.raises(InvalidValueError, match="key the store itself uses"):
        shardwise.to_zarr(ds, tmp_path / "new.zarr")
    assert not (tmp_path / "new.zarr").exists()
    path = tmp_path / "a.zarr"
    shardwise.to_zarr(xr.Dataset({"v": ("t", np.arange(10.0))}), path)
    before = files(path, journal=True)
    with pytest.raises(InvalidValueError, match="rename it"):
        shardwise.to_zarr(ds, path, mode="a")
    assert files(path, journal=True) == before


@pytest.mark.parametrize("name", ["zarr.json", ".shardwise", ".."])
def test_tree_groups_named_like_store_keys_are_refused_before_any_byte(
    tmp_path: Path, name: str
) -> None:
    """A DataTree group named ``zarr.json`` once failed after its data was written, leaving a
    store that could not be opened: it is refused before the first byte, into a new store and
    into an existing one (byte-identical)."""
    tree = xr.DataTree(xr.Dataset({"r": ("t", np.arange(4.0))}))
    tree[name] = xr.DataTree(xr.Dataset({"v": ("t", np.arange(4.0))}))
    with pytest.raises(InvalidValueError, match=f"its name {name!r} cannot be stored"):
        shardwise.to_zarr(tree, tmp_path / "new.zarr")
    assert not (tmp_path / "new.zarr").exists()
    path = tmp_path / "a.zarr"
    shardwise.to_zarr(xr.DataTree(xr.Dataset({"r": ("t", np.arange(4.0))})), path)
    before = snapshot(path)
    for mode in ("w", "a"):
        with pytest.raises(InvalidValueError, match="rename it"):
            shardwise.to_zarr(tree, path, mode=mode)
        assert snapshot(path) == before


@pytest.mark.parametrize(
    ("call", "keyword"),
    [
        (lambda p: shardwise.write_array(np.ones(4), p, path="g/zarr.json"), "path"),
        (lambda p: shardwise.write_pyramid(np.ones((8, 8)), p, path="zarr.json"), "path"),
        (lambda p: shardwise.convert(p / "a", p, dst_path="b/zarr.json"), "dst_path"),
        (
            lambda p: shardwise.to_zarr(xr.Dataset({"v": ("t", [1.0])}), p, group="zarr.json"),
            "group",
        ),
    ],
)
def test_node_paths_that_cannot_be_stored_are_refused_before_any_byte(
    tmp_path: Path, call: Any, keyword: str
) -> None:
    shardwise.write_array(np.arange(4.0), tmp_path, path="a")
    before = snapshot(tmp_path)
    with pytest.raises(InvalidValueError, match=f"{keyword}=.*'zarr.json'"):
        call(tmp_path)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("mode", ["w-", "w", "a"])
@pytest.mark.parametrize("group", ["a/c", "a/g", "a/g/h"])
@pytest.mark.parametrize("tree", [False, True], ids=["dataset", "tree"])
def test_to_zarr_into_a_group_inside_an_array_is_refused_before_any_byte(
    tmp_path: Path, group: str, mode: str, tree: bool
) -> None:
    """As write_array's path=: a PlanError naming the array and the group keyword, not zarr's
    FileExistsError or ValueError after the first bytes."""
    shardwise.write_array(np.arange(4.0), tmp_path, path="a")
    before = snapshot(tmp_path)
    ds = xr.Dataset({"v": ("x", np.arange(3.0))})
    obj = xr.DataTree(ds) if tree else ds
    with pytest.raises(PlanError, match=r"array 'a' .* holds no other nodes.*group"):
        shardwise.to_zarr(obj, tmp_path, group=group, mode=mode)
    assert snapshot(tmp_path) == before


# -- 4. unknown dask chunk sizes ----------------------------------------------------------------


def test_unknown_chunk_sizes_are_refused_before_anything(tmp_path: Path) -> None:
    a = da.arange(100, chunks=10)
    b = a[a % 3 == 0]
    with pytest.raises(PlanError, match=r"compute_chunk_sizes\(\)"):
        shardwise.write_array(b, tmp_path / "s", chunks=(5,), shards=(10,))
    assert files(tmp_path, journal=True) == {}
    b.compute_chunk_sizes()
    shardwise.write_array(b, tmp_path / "s", chunks=(5,), shards=(10,))
    assert np.array_equal(shardwise.open_array(tmp_path / "s").compute(), np.arange(0, 100, 3))


# -- 5. groups and Zarr v2 arrays ---------------------------------------------------------------


@pytest.fixture
def dataset_store(tmp_path: Path) -> Path:
    """docs/guides/xarray.md's first example, small: a group of sharded variables."""
    path = tmp_path / "air.zarr"
    ds = xr.Dataset(
        {"t2m": (("time", "lat"), np.random.default_rng(0).random((40, 6)).astype("float32"))},
        coords={"time": np.arange(40), "lat": np.arange(6.0)},
    ).chunk(time=10)
    shardwise.to_zarr(ds, path, shards={"time": 16})
    return path


@pytest.fixture
def v2_array(tmp_path: Path) -> Path:
    root = tmp_path / "v2.zarr"
    zarr.create_array(root, shape=(10,), dtype="i4", chunks=(5,), zarr_format=2)[...] = 1
    return root


def test_open_array_on_a_group_lists_its_arrays(dataset_store: Path) -> None:
    with pytest.raises(NotAnArrayError, match="pass path=") as e:
        shardwise.open_array(dataset_store)
    assert e.value.arrays == ["lat", "t2m", "time"]
    assert "the root group of" in str(e.value) and "'t2m'" in str(e.value)
    got = shardwise.open_array(dataset_store, path="t2m").compute()
    assert got.shape == (40, 6)


def test_open_array_on_a_v2_array_or_nothing(v2_array: Path, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedCodecError, match="is a Zarr v2 array: shardwise reads"):
        shardwise.open_array(v2_array)
    report = shardwise.verify(v2_array)
    assert not report.ok and "Zarr v2 array" in str(report)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArrayNotFoundError, match="no array at the root path of"):
        shardwise.open_array(tmp_path / "empty")


def test_open_array_on_an_unsharded_array_names_it(dataset_store: Path, tmp_path: Path) -> None:
    zarr.create_array(tmp_path / "g", name="plain", shape=(4,), dtype="i4", chunks=(2,))
    with pytest.raises(UnsupportedCodecError, match=r"array 'plain' in file://.*: the array's"):
        shardwise.open_array(tmp_path / "g", path="plain")


def test_write_array_into_a_group_is_refused(dataset_store: Path) -> None:
    before = files(dataset_store, journal=True)
    with pytest.raises(PlanError, match="is a group, not an array: pass path="):
        shardwise.write_array(np.zeros(4), dataset_store, chunks=(2,), shards=(2,), mode="a")
    assert files(dataset_store, journal=True) == before


@pytest.mark.parametrize("mode", ["w-", "a", "r+"])
def test_write_array_onto_a_v2_array_is_refused(v2_array: Path, mode: Any, read_zarr: Any) -> None:
    before = files(v2_array, journal=True)
    with pytest.raises(PlanError, match=r"is a Zarr v2 array: .* mode='w' replaces it"):
        shardwise.write_array(np.zeros(10, "i4"), v2_array, chunks=(5,), shards=(10,), mode=mode)
    assert files(v2_array, journal=True) == before
    shardwise.write_array(np.arange(10, dtype="i4"), v2_array, chunks=(5,), shards=(10,), mode="w")
    assert np.array_equal(read_zarr(v2_array), np.arange(10))
    assert not (v2_array / ".zarray").exists()


def test_cli_inspect_and_verify_a_group(
    dataset_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(dataset_store)]) == 0
    out = capsys.readouterr().out
    assert "a group of 3 arrays" in out
    assert "t2m  (40, 6) float32, shards (16, 6)" in out and "3 of 3 shards stored" in out
    assert main(["inspect", str(dataset_store), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["group"] and [m["path"] for m in d["arrays"]] == ["lat", "t2m", "time"]
    assert main(["inspect", str(dataset_store), "--path", "t2m"]) == 0
    assert "grid (3, 1) = 3 shards" in capsys.readouterr().out
    assert main(["verify", str(dataset_store)]) == 0
    assert "OK" in capsys.readouterr().out


# -- 6. the CLI: one line, documented exit codes, storage options -------------------------------


def test_cli_failures_are_one_line_with_the_documented_exit_code(
    v2_array: Path, dataset_store: Path, tmp_path: Path
) -> None:
    cases = [
        (["inspect", str(v2_array)], "is a Zarr v2 array"),
        (["inspect", str(tmp_path / "nothing")], "ArrayNotFoundError: no store at"),
        (
            ["reshard", str(dataset_store), str(tmp_path / "o"), "--shards", "4"],
            "has 2 dimension(s) (40, 6), but shards (4,) has 1",
        ),
        (["verify", str(dataset_store), "--storage-options", "[1]"], "must be a JSON object"),
    ]
    for args, message in cases:
        proc = subprocess.run([*exe(), *args], capture_output=True, text=True)
        assert proc.returncode == (2 if "JSON" in message else 3), proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr
    proc = subprocess.run(
        [*exe(), "inspect", str(v2_array), "--traceback"], capture_output=True, text=True
    )
    assert proc.returncode == 3 and "Traceback (most recent call last)" in proc.stderr
    for bad in (["reshard", str(dataset_store), "o", "--shards", "a,b"], ["inspect"], ["nope"]):
        proc = subprocess.run([*exe(), *bad], capture_output=True, text=True)
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert "--help)" in proc.stderr
    proc = subprocess.run([*exe(), "--help"], capture_output=True, text=True)
    assert "Exit status: 0 success; 1" in " ".join(proc.stdout.split())


def test_cli_s3_without_credentials_is_one_line_exit_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    with moto_s3() as s3:
        url = f"s3://{BUCKET}/nocreds.zarr"
        code = main(["inspect", url, "--storage-option", f"endpoint_url={s3.endpoint}"])
    err = capsys.readouterr().err
    assert code == 3 and len(err.splitlines()) == 1
    assert err.startswith(f"shardwise inspect: cannot open store {url}: NoCredentialsError")


def test_cli_storage_options_reach_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with moto_s3() as s3:
        opts = {"endpoint_url": s3.endpoint, "key": CREDS["key"], "secret": CREDS["secret"]}
        url = f"s3://{BUCKET}/cli.zarr"
        shardwise.write_array(np.arange(20.0), url, chunks=(5,), shards=(10,), storage_options=opts)
        each = [f"--storage-option={k}={v}" for k, v in opts.items()]
        whole = ["--storage-options", json.dumps(opts)]
        for so in (each, whole):
            assert main(["inspect", url, *so]) == 0
            assert "2 shards" in capsys.readouterr().out
            assert main(["verify", url, *so]) == 0
            assert main(["lease", url, *so]) == 0
            assert capsys.readouterr().out.strip().endswith("free")
        assert main(["batch", "status", url, *each]) == 3  # opened: no batch there
        assert "no open batch write for the root array of s3://" in capsys.readouterr().err
        dst = tmp_path / "copy.zarr"
        assert main(["reshard", url, str(dst), "--shards", "20", *each]) == 0
        assert np.array_equal(shardwise.open_array(dst).compute(), np.arange(20.0))
        capsys.readouterr()  # reshard's progress bar
        assert main(["inspect", url]) == 3  # without the options: no credentials
        assert len(capsys.readouterr().err.splitlines()) == 1


# -- 7. messages name the store and the array ---------------------------------------------------


def test_messages_name_the_root_array(tmp_path: Path) -> None:
    with pytest.raises(ArrayNotFoundError) as e:
        shardwise.write_array(np.zeros(4), tmp_path / "s", chunks=(2,), shards=(2,), mode="r+")
    assert "None" not in str(e.value) and "none at the root path of" in str(e.value)
    shardwise.write_array(np.zeros(4), tmp_path / "s", chunks=(2,), shards=(2,))
    with pytest.raises(FileExistsError) as e2:
        shardwise.write_array(np.zeros(4), tmp_path / "s", chunks=(2,), shards=(2,))
    assert "None" not in str(e2.value) and "the root array of" in str(e2.value)
    held = Lease.acquire(ShardStore(zarr.storage.LocalStore(tmp_path / "s")))
    try:
        with pytest.raises(LeaseHeldError) as e3:
            shardwise.write_array(np.ones(4), tmp_path / "s", mode="r+")
    finally:
        held.release()
    assert "'/'" not in str(e3.value) and "the root array of" in str(e3.value)
    shardwise.write_array(np.zeros(4), tmp_path / "g", path="a/b", chunks=(2,), shards=(2,))
    with pytest.raises(FileExistsError) as e4:
        shardwise.write_array(np.zeros(4), tmp_path / "g", path="a/b", chunks=(2,), shards=(2,))
    assert "array 'a/b' in " in str(e4.value)


def test_cli_usage_without_storage_option_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --storage-option without ``=`` is a usage error (exit 2) naming the option, what it
    takes and what it got, raised before any store is touched: a lease break leaves the lease."""
    root = tmp_path / "a.zarr"
    shardwise.write_array(np.zeros(4), root, chunks=(2,), shards=(2,))
    Lease.acquire(ShardStore(zarr.storage.LocalStore(root)), purpose="a running job")
    before = files(root, journal=True)
    assert ".shardwise/lease" in before
    for cmd in (["inspect", str(root)], ["lease", str(root), "--break"]):
        assert main([*cmd, "--storage-option", "novalue"]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.strip() == f"shardwise {cmd[0]}: --storage-option takes KEY=VALUE, got 'novalue'"
        assert files(root, journal=True) == before


class _OtherWriterFirst(zarr.storage.WrapperStore[Any]):
    """Runs a whole other ``mode="w-"`` write of the same array (another process) just before
    this writer takes its lease: both passed the existence check, the other finished first (the
    window the process race of test_faults.py hits by chance)."""

    def __init__(self, store: Any, root: str, fired: list[bool] | None = None) -> None:
        super().__init__(store)
        self.root, self.fired = root, [False] if fired is None else fired

    def _with_store(self, store: Any) -> _OtherWriterFirst:
        return _OtherWriterFirst(store, self.root, self.fired)  # views share the flag

    def _other_first(self, key: str) -> None:
        if key.endswith(".shardwise/lease") and not self.fired[0]:
            self.fired[0] = True
            code = (
                "import numpy as np, shardwise; shardwise.write_array("
                f"np.full((8, 8), 7, 'int16'), {self.root!r}, chunks=(4, 4))"
            )
            subprocess.run([sys.executable, "-c", code], check=True, timeout=300)

    async def set(self, key: str, value: Any) -> None:
        self._other_first(key)
        await self._store.set(key, value)

    async def set_if_not_exists(self, key: str, value: Any) -> None:
        self._other_first(key)
        await self._store.set_if_not_exists(key, value)


def test_a_write_that_finds_the_array_created_after_its_check_is_refused_as_existing(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "a.zarr")
    store = _OtherWriterFirst(zarr.storage.LocalStore(root), root)
    with pytest.raises(ArrayExistsError, match="created by another writer"):
        shardwise.write_array(np.full((8, 8), 1, "int16"), store, chunks=(4, 4))
    assert store.fired[0]
    # the other writer's array is whole, and this writer left no lease behind
    np.testing.assert_array_equal(shardwise.read_array(root), np.full((8, 8), 7, "int16"))
    assert not list((tmp_path / "a.zarr" / ".shardwise").glob("lease*"))
    rep = shardwise.verify(root)
    assert rep.ok, rep.problems  # the other writer's records and finished marker stayed
