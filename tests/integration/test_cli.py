"""The ``shardwise`` command: in-process through ``main(argv)`` and as the installed entry point
(separate processes: a job array of batch parts runs as real concurrent processes)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import shardwise
from faultkit import exe, files
from shardwise.cli import main, parser
from shardwise.cli.commands import TASK_ID_VARS
from shardwise.durability.lease import Lease
from shardwise.durability.verify import verify
from shardwise.storage.store import ShardStore

SHAPE = (40, 30)


def data() -> np.ndarray:
    return np.random.default_rng(3).standard_normal(SHAPE).astype("float32")


@pytest.fixture
def v2(tmp_path: Path) -> Path:
    root = tmp_path / "v2.zarr"
    z = zarr.create_array(
        root, shape=SHAPE, chunks=(7, 9), dtype="float32", zarr_format=2, attributes={"units": "K"}
    )
    z[...] = data()
    return root


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    root = tmp_path / "s.zarr"
    shardwise.write_array(data(), root, chunks=(5, 5), shards=(10, 15), dimension_names=("y", "x"))
    return root


def test_verify_exit_status_and_json(sharded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(sharded)]) == 0
    assert "OK" in capsys.readouterr().out
    (sharded / "c/1/1").write_bytes((sharded / "c/1/1").read_bytes()[:-1])
    assert main(["verify", str(sharded), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and [p["kind"] for p in out["problems"]] == ["corrupt"]
    assert out["changes"] == []  # a corrupt shard is a problem, never also a sound change
    assert main(["verify", str(sharded.parent / "nothing")]) == 3


def test_verify_strict_on_a_shard_another_tool_rewrote(
    sharded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zarr.open_array(sharded, mode="r+")[0:10, 0:15] = 1.5  # a sound rewrite of shard c/0/0
    assert main(["verify", str(sharded)]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "note:" in out and "mismatch   c/0/0" in out
    assert main(["verify", str(sharded), "--strict"]) == 1
    assert "1 problem;" in capsys.readouterr().out
    (sharded / "c/1/1").unlink()  # a deleted recorded shard is a problem without --strict
    assert main(["verify", str(sharded)]) == 1
    assert "missing" in capsys.readouterr().out


def test_inspect(sharded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(sharded)]) == 0
    text = capsys.readouterr().out
    assert "(40, 30) float32" in text and "grid (4, 2) = 8 shards" in text
    assert "dims ('y', 'x')" in text and "lease    free" in text
    assert main(["inspect", str(sharded), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["shards_stored"] == d["shards_recorded"] == 8 and d["writes_open"] == []
    assert d["bytes_stored"] == sum(len(v) for k, v in files(sharded).items() if k != "zarr.json")


@pytest.mark.parametrize("source", ["v2", "sharded"])
def test_reshard(
    source: str, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src: Path = request.getfixturevalue(source)
    dst = tmp_path / "out.zarr"
    args = [
        "reshard",
        str(src),
        str(dst),
        "--shards",
        "16,30",
        "--chunks",
        "4x6",
        "--compressor",
        "blosc:lz4:3",
        "--crc32c",
        "--verify",
    ]
    assert main(args) == 0
    assert "OK" in capsys.readouterr().out
    z = zarr.open_array(dst)
    np.testing.assert_array_equal(z[...], data())
    assert z.shards == (16, 30) and z.chunks == (4, 6)
    names = [c["name"] for c in z.metadata.to_dict()["codecs"][0]["configuration"]["codecs"]]
    assert names == ["bytes", "blosc", "crc32c"]
    if source == "v2":
        assert dict(z.attrs) == {"units": "K"}
    assert main(args) == 3  # mode w-: exists
    assert "ArrayExistsError" in capsys.readouterr().err
    assert main([*args, "--mode", "w", "--compressor", "gzip:1"]) == 0


def test_reshard_is_refused_while_leased(
    sharded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "out.zarr"
    st = ShardStore(zarr.storage.LocalStore(dst))
    with Lease.acquire(st, purpose="a job that died"):
        args = ["reshard", str(sharded), str(dst), "--shards", "20,30"]
        assert main(args) == 3
        assert "LeaseHeldError" in capsys.readouterr().err
        assert main(["lease", str(dst)]) == 0
        assert "a job that died" in capsys.readouterr().out
        assert main(["lease", str(dst), "--break"]) == 0
        assert "broken" in capsys.readouterr().out
        assert main([*args, "--progress"]) == 0
        assert "2 shards written" in capsys.readouterr().out
    assert main(["lease", str(dst)]) == 0
    assert capsys.readouterr().out.strip() == "free"


def test_usage_errors(sharded: Path, tmp_path: Path) -> None:
    assert main(["batch", "init", str(tmp_path / "b"), "--parts", "2", "--shards", "4,4"]) == 2
    with pytest.raises(SystemExit) as e:
        main(["reshard", str(sharded), str(tmp_path / "o"), "--shards", "a,b"])
    assert e.value.code == 2
    env_free = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLURM_ARRAY_TASK_ID", "PBS_ARRAY_INDEX", "PBS_ARRAYID", "SHARDWISE_PART")
    }
    proc = subprocess.run(
        [*exe(), "batch", "part", str(tmp_path / "b"), "--source", str(sharded)],
        capture_output=True,
        text=True,
        env=env_free,
    )
    assert proc.returncode == 2 and "give --part" in proc.stderr


def test_a_job_array_of_parts_as_processes(sharded: Path, tmp_path: Path) -> None:
    """init, then 3 parts as concurrent processes (SLURM_ARRAY_TASK_ID), then finalize."""
    dst = tmp_path / "batch.zarr"
    cmd = exe()
    init = subprocess.run(
        [
            *cmd,
            "batch",
            "init",
            str(dst),
            "--source",
            str(sharded),
            "--parts",
            "3",
            "--shards",
            "10,30",
            "--crc32c",
        ],
        capture_output=True,
        text=True,
    )
    assert init.returncode == 0, init.stderr
    assert "part 2: [20:40, 0:30]" in init.stdout

    early = subprocess.run([*cmd, "batch", "finalize", str(dst)], capture_output=True, text=True)
    assert early.returncode == 1 and "3 of 3 parts not done" in early.stderr

    jobs = [
        subprocess.Popen(
            [*cmd, "batch", "part", str(dst), "--source", str(sharded)],
            env={**os.environ, "SLURM_ARRAY_TASK_ID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    for i, j in enumerate(jobs):
        out, err = j.communicate(timeout=120)
        assert j.returncode == 0, err
        assert out.startswith(f"part {i}:")
    status = subprocess.run([*cmd, "batch", "status", str(dst)], capture_output=True, text=True)
    assert "done: 3 of 3; to do: []" in status.stdout
    fin = subprocess.run([*cmd, "batch", "finalize", str(dst)], capture_output=True, text=True)
    assert fin.returncode == 0, fin.stderr
    assert "OK" in fin.stdout
    np.testing.assert_array_equal(zarr.open_array(dst)[...], data())
    assert verify(dst).ok
    v = subprocess.run([*cmd, "verify", str(dst)], capture_output=True, text=True)
    assert v.returncode == 0
    (dst / "c/2/0").unlink()
    v = subprocess.run([*cmd, "verify", str(dst)], capture_output=True, text=True)
    assert v.returncode == 1 and "missing" in v.stdout


def test_lease_of_a_part_reads_the_part_count_from_the_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardwise import batch
    from shardwise.durability.lease import part_lease

    plain = tmp_path / "plain.zarr"
    shardwise.write_array(data(), plain, chunks=(5, 5), shards=(10, 15))
    assert main(["lease", str(plain), "--part", "1"]) == 2  # no batch: the count is unknown
    assert "--nparts" in capsys.readouterr().err
    root = tmp_path / "b.zarr"
    batch.init(root, shape=SHAPE, dtype="float32", chunks=(5, 5), shards=(10, 15), parts=4)
    st = ShardStore(zarr.storage.LocalStore(root))
    with Lease.acquire(st, name=part_lease(1, 4), purpose="part 1 on node 7"):
        assert main(["lease", str(root), "--part", "1"]) == 0
        assert "held for" in (out := capsys.readouterr().out) and "node 7" in out
        assert main(["lease", str(root), "--part", "1", "--nparts", "4"]) == 0
        assert "node 7" in capsys.readouterr().out
        assert main(["lease", str(root), "--part", "2"]) == 0
        assert capsys.readouterr().out.strip() == "free"
        assert main(["lease", str(root)]) == 0  # the array: not free while a part is held
        assert capsys.readouterr().out.startswith("part 1 of 4 held for ")
    assert main(["lease", str(root), "--part", "1"]) == 0
    assert capsys.readouterr().out.strip() == "free"


def test_batch_status_after_finalize(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardwise import batch

    root = tmp_path / "b.zarr"
    assert main(["batch", "status", str(root)]) == 3  # nothing there: one line, exit 3
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    batch.init(root, shape=SHAPE, dtype="float32", chunks=(5, 5), shards=(10, 15), parts=2)
    for i in range(2):
        batch.write_part(data(), root, i)
    assert main(["batch", "status", str(root)]) == 0
    assert "done: 2 of 2; to do: []" in capsys.readouterr().out
    assert main(["batch", "finalize", str(root)]) == 0
    capsys.readouterr()
    assert main(["batch", "status", str(root)]) == 0
    out = capsys.readouterr().out
    assert "finalized" in out and "2 parts" in out and "no batch open" in out
    with pytest.raises(FileNotFoundError, match="was finalized"):
        batch.open_batch(root)


# -- the CLI keeps its word: exit codes as --help and docs/cli.md state them, per command --------

ZARR_NAMES = (
    "StorePath",
    "GroupNotFoundError",
    "ContainsArrayError",
    "ContainsGroupError",
    "NodeNotFoundError",
    "NodeTypeValidationError",
)


@pytest.fixture
def stores(tmp_path: Path, sharded: Path, v2: Path) -> dict[str, str]:
    """Named paths for the table: a sharded array, a damaged copy, a Zarr v2 array, a group
    with one array, a directory that is not a store, a path with nothing there."""
    damaged = tmp_path / "damaged.zarr"
    shardwise.write_array(data(), damaged, chunks=(5, 5), shards=(10, 15))
    (damaged / "c/1/1").write_bytes((damaged / "c/1/1").read_bytes()[:-1])
    group = tmp_path / "g.zarr"
    zarr.open_group(group, mode="w")
    shardwise.write_array(data(), group, path="a", chunks=(5, 5), shards=(10, 15))
    (tmp_path / "notastore").mkdir()
    (tmp_path / "notastore" / "notes.txt").write_text("not zarr")
    names = dict(S=sharded, DAMAGED=damaged, V2=v2, G=group, NOTASTORE=tmp_path / "notastore")
    return {k: str(v) for k, v in names.items()} | {"T": str(tmp_path)}


# (arguments, exit status, text on stderr) in order: later rows see what earlier ones wrote
TABLE: dict[str, list[tuple[str, int, str]]] = {
    "inspect": [
        ("inspect {S}", 0, ""),
        ("inspect {G}", 0, ""),
        ("inspect {S} --bogus", 2, "unrecognized arguments: --bogus"),
        ("inspect", 2, "required: store"),
        ("inspect {NOTASTORE}", 3, "no array at the root path of"),
        ("inspect {V2}", 3, "`shardwise convert SRC DST`"),
        ("inspect {G} --path a/zz", 3, "no array at path 'a/zz'"),
        ("inspect {T}/nothing", 3, "no store at"),
    ],
    "verify": [
        ("verify {S}", 0, ""),
        ("verify {G}", 0, ""),
        ("verify {DAMAGED}", 1, ""),
        ("verify {S} --threads 0", 2, "--threads: must be a positive integer, got 0"),
        ("verify {S} --threads many", 2, "--threads: expected a whole number, got 'many'"),
        ("verify {NOTASTORE}", 3, "no array at the root path of"),
        ("verify {V2}", 3, "is a Zarr v2 array"),
        ("verify {T}/nothing", 3, "no store at"),
    ],
    "convert": [
        ("convert {S} {T}/c1.zarr --shard-bytes 1MiB --no-progress", 0, ""),
        ("convert {V2} {T}/c2.zarr --shards 14,18 --verify --no-progress", 0, ""),
        ("convert {S} {T}/c3.zarr --shard-bytes 64XB", 2, "--shard-bytes: must be a positive"),
        ("convert {S} {T}/c3.zarr --shard-bytes lots", 2, "got 'lots'"),
        ("convert {S} {T}/c3.zarr --shards a,b", 2, "argument --shards: shards must be sizes"),
        ("convert {S} {T}/c3.zarr --shards y=a", 2, "argument --shards: shards must be sizes"),
        ("convert {S} {T}/c3.zarr --shards 16,0", 2, "argument --shards: shards must be a shape"),
        ("convert {S} {T}/c3.zarr --shard-bytes 0", 2, "argument --shard-bytes"),
        ("convert {S} {T}/c3.zarr --mode a", 2, "argument --mode: invalid choice"),
        ("convert {S}", 2, "required: dst"),
        ("convert {NOTASTORE} {T}/c3.zarr", 3, "no zarr array or group at the root path"),
        ("convert {G} {T}/c3.zarr --src-path a/x", 3, "no zarr array or group at path 'a/x'"),
        ("convert {S} {T}/c1.zarr", 3, "ArrayExistsError"),
        ("convert {S} {G} --dst-path a/x", 3, "array 'a' in file://"),
    ],
    "reshard": [
        ("reshard {S} {T}/r1.zarr --shards 20,30 --no-progress", 0, ""),
        ("reshard {S} {T}/r2.zarr --chunks 5,0", 2, "argument --chunks: chunks must be sizes"),
        ("reshard {S} {T}/r2.zarr --chunks t=a", 2, "argument --chunks: chunks must be sizes"),
        ("reshard {S} {T}/r2.zarr --shards 20,30 --compressor lz5", 2, "unknown compressor"),
        ("reshard {S} {T}/r2.zarr --shards 20,30 --compressor zstd:x", 2, "--compressor"),
        ("reshard {S} {T}/r2.zarr --shards 20,30 --threads 0", 2, "--threads"),
        ("reshard {NOTASTORE} {T}/r2.zarr --shards 20,30", 3, "no zarr array or group"),
        ("reshard {S} {T}/r1.zarr --shards 20,30", 3, "ArrayExistsError"),
        # convert's grammar: a,b is no shape, 20,0 no positive shape
        ("reshard {S} {T}/r2.zarr --shards a,b", 2, "argument --shards: shards must be sizes"),
        ("reshard {S} {T}/r2.zarr --shards 20,0", 2, "argument --shards: shards must be a shape"),
        ("reshard {S} {T}/r2.zarr --shards t=20", 3, "names dimension(s) ['t'] that array"),
    ],
    "batch": [
        ("batch", 2, "init"),
        (
            "batch init {T}/b.zarr --shape 40,30 --dtype float32 --chunks 5,5 --shards 10,15 "
            "--parts 2",
            0,
            "",
        ),
        ("batch status {T}/b.zarr", 0, ""),
        ("batch finalize {T}/b.zarr", 1, "2 of 2 parts not done"),
        ("batch part {T}/b.zarr --source {S} --part 0 --no-progress", 0, ""),
        ("batch part {T}/b.zarr --source {S} --part 1 --no-progress", 0, ""),
        ("batch finalize {T}/b.zarr", 0, ""),
        (
            "batch init {T}/b2.zarr --shape 4 --dtype float32 --chunks 2 --shards 2 --parts 0",
            2,
            "--parts: must be a positive integer, got 0",
        ),
        (
            "batch init {T}/b2.zarr --shape 4 --dtype flot --chunks 2 --shards 2 --parts 2",
            2,
            "--dtype: expected a data type",
        ),
        (
            "batch init {T}/b2.zarr --shape 4 --dtype float32 --shards 2 --parts 2",
            2,
            "needs --chunks",
        ),
        ("batch init {T}/b2.zarr --shards 2 --parts 2", 2, "needs --source SRC"),
        (
            "batch init {T}/b3.zarr --source {S} --shards 16 --parts 2",
            2,
            "--shards 16 has 1 size(s), but the array has 2 dimension(s) (40, 30)",
        ),
        (
            "batch init {T}/b3.zarr --shape 40,30 --dtype float32 --chunks 5 --shards 10,15 "
            "--parts 2",
            2,
            "--chunks 5 has 1 size(s)",
        ),
        ("batch part {T}/b.zarr --source {S} --part -1", 2, "--part: expected a whole number"),
        ("batch status {T}/b.zarr --bogus", 2, "unrecognized arguments"),
        ("batch init {S} --source {S} --shards 10,15 --parts 2", 3, "ArrayExistsError"),
        ("batch init {T}/b2.zarr --source {V2} --shards 14,9 --parts 2", 0, ""),
        ("batch init {T}/b3.zarr --source {NOTASTORE} --shards 2 --parts 2", 3, "no array at"),
        ("batch part {S} --source {S} --part 0", 3, "no open batch write"),
        ("batch status {T}/nothing", 3, "no store at"),
        ("batch finalize {S}", 3, "no open batch write"),
    ],
    "lease": [
        ("lease {S}", 0, ""),
        ("lease {S} --nparts 0", 2, "--nparts: must be a positive integer"),
        ("lease {S} --part 1", 2, "give --nparts N"),
        ("lease {T}/nothing", 3, "no store at"),
    ],
}


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    # no job-array task id or traceback switch from the environment the tests run in
    env = {k: v for k, v in os.environ.items() if k not in (*TASK_ID_VARS, "SHARDWISE_TRACEBACK")}
    return subprocess.run([*exe(), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("command", sorted(TABLE))
def test_exit_status_per_command(command: str, stores: dict[str, str], tmp_path: Path) -> None:
    """Each command as a process: success 0, problems 1, bad usage 2 (nothing opened),
    refused 3; a failure is one line in shardwise's words, and leaves every store as it was."""
    for row, code, text in TABLE[command]:
        args = row.format(**stores).split()
        before = files(tmp_path, journal=True)
        proc = run(args)
        where = f"{row}: {proc.stderr}"
        assert proc.returncode == code, where
        assert text in proc.stderr, where
        assert not any(name in proc.stderr for name in ZARR_NAMES), where
        if code >= 2:
            assert files(tmp_path, journal=True) == before, where
        if code >= 2 and args != ["batch"]:
            assert len(proc.stderr.splitlines()) == 1, where
            assert proc.stdout == "", where


def test_version_is_the_installed_package_version() -> None:
    from importlib.metadata import version

    proc = run(["--version"])
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        f"shardwise {version('shardwise')}\n",
        "",
    )


def test_progress_bars_only_on_a_terminal_unless_asked(sharded: Path) -> None:
    """A command whose stderr is a file or a pipe (a batch job's log) shows no bar by default;
    ``--progress`` shows it anyway, ``--no-progress`` never."""
    quiet = run(["verify", str(sharded)])
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    shown = run(["verify", str(sharded), "--progress"])
    assert shown.returncode == 0 and "shard/s" in shown.stderr, shown.stderr
    off = run(["verify", str(sharded), "--no-progress"])
    assert off.returncode == 0 and off.stderr == "", off.stderr


def test_a_bare_command_lists_the_commands(tmp_path: Path) -> None:
    proc = run([])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("usage: shardwise")
    for name in ("inspect", "verify", "convert", "reshard", "batch", "lease"):
        assert f"\n    {name} " in proc.stderr, proc.stderr
    assert "Exit status: 0 success; 1" in " ".join(proc.stderr.split())
    nope = run(["nope"])
    assert nope.returncode == 2 and "invalid choice: 'nope'" in nope.stderr


def _parsers(p: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(p.prog, p)]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                out += _parsers(child)
    return out


def test_every_command_and_option_has_help() -> None:
    walked = _parsers(parser())
    progs = {prog for prog, _ in walked}
    assert {"shardwise batch init", "shardwise lease", "shardwise convert"} <= progs
    for prog, p in walked:
        assert p.epilog and p.epilog.startswith("Exit status: 0 success"), prog
        for action in p._actions:
            assert (action.help or "").strip(), (prog, action.option_strings or action.dest)
            if isinstance(action, argparse._SubParsersAction):
                # the one-line help of each command in its parent's listing
                listed = {a.dest: a.help for a in action._choices_actions}
                assert set(listed) == set(action.choices), prog
                assert all((h or "").strip() for h in listed.values()), (prog, listed)


def test_a_reader_gone_is_a_silent_exit_141(sharded: Path) -> None:
    """``shardwise inspect X | head``: the reader of stdout went away (here: a pipe whose read
    end is closed before the command starts). Not a store that cannot be opened: nothing on
    stderr, exit 141 as a tool stopped by SIGPIPE, and the interpreter's exit quiet too."""
    import sys

    r, w = os.pipe()
    os.close(r)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "shardwise.cli", "inspect", str(sharded)],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(w)
    assert (done.returncode, done.stderr) == (141, "")


def test_help_states_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit status: 0 success; 1 the array has problems" in text
    assert "2 bad usage" in text and "3 refused or failed" in text
    page = " ".join((Path(__file__).parents[2] / "docs" / "cli.md").read_text().split())
    assert "Exit status: 0 success; 1 the array has problems" in page
    assert "2 bad usage" in page and "3 refused or failed" in page


# -- zarr's node errors reach Python callers as shardwise errors naming the store and path ------


def _refused(call: Any, kind: type[Exception], builtin: type[Exception]) -> str:
    with pytest.raises(kind) as e:
        call()
    assert isinstance(e.value, builtin) and isinstance(e.value, shardwise.ShardwiseError)
    text = str(e.value)
    assert not any(name in text for name in ZARR_NAMES), text
    return text


def test_an_array_where_a_group_is_wanted(stores: dict[str, str], tmp_path: Path) -> None:
    import xarray as xr

    group = Path(stores["G"])
    before = files(group, journal=True)
    text = _refused(
        lambda: shardwise.open_dataset(group, group="a"), shardwise.NotAGroupError, ValueError
    )
    assert "path 'a' in" in text and str(group) in text and "is an array, not a group" in text
    text = _refused(
        lambda: xr.open_dataset(group / "a", engine="shardwise"),
        shardwise.NotAGroupError,
        ValueError,
    )
    assert str(group / "a") in text
    ds = xr.Dataset({"v": (("y", "x"), data())})
    _refused(
        lambda: shardwise.to_zarr(ds, group, group="a", mode="a"),
        shardwise.NotAGroupError,
        ValueError,
    )
    assert files(group, journal=True) == before  # the refused write wrote nothing


def test_nothing_or_the_other_kind_of_node(stores: dict[str, str], tmp_path: Path) -> None:
    text = _refused(
        lambda: shardwise.convert(stores["NOTASTORE"], tmp_path / "o.zarr"),
        shardwise.ArrayNotFoundError,
        FileNotFoundError,
    )
    assert "no zarr array or group at the root path of" in text and "notastore" in text
    assert not (tmp_path / "o.zarr").exists()
    text = _refused(
        lambda: shardwise.convert(stores["G"], tmp_path / "o.zarr", path="a/x"),
        shardwise.ArrayNotFoundError,
        FileNotFoundError,
    )
    assert "path 'a/x' in" in text
    text = _refused(
        lambda: shardwise.open_array(stores["G"]), shardwise.NotAnArrayError, ValueError
    )
    assert "is a group, not an array" in text and "'a'" in text
    text = _refused(
        lambda: shardwise.open_array(stores["V2"]), shardwise.UnsupportedCodecError, Exception
    )
    assert "`shardwise convert SRC DST`" in text and "reshard" not in text


def test_node_errors_in_memory() -> None:
    mem = zarr.storage.MemoryStore()
    zarr.open_group(mem, mode="w")
    shardwise.write_array(data(), mem, path="a", chunks=(5, 5), shards=(10, 15))
    before = dict(mem._store_dict)
    text = _refused(
        lambda: shardwise.convert(mem, zarr.storage.MemoryStore(), path="b"),
        shardwise.ArrayNotFoundError,
        FileNotFoundError,
    )
    assert "path 'b' in memory://" in text
    _refused(lambda: shardwise.open_array(mem), shardwise.NotAnArrayError, ValueError)
    _refused(lambda: shardwise.open_dataset(mem, group="a"), shardwise.NotAGroupError, ValueError)
    assert dict(mem._store_dict) == before


def test_a_path_inside_an_array_is_refused_before_any_byte(stores: dict[str, str]) -> None:
    group = Path(stores["G"])
    before = files(group, journal=True)
    for call in (
        lambda: shardwise.write_array(np.ones(3), group, path="a/b"),
        lambda: shardwise.convert(stores["S"], group, dst_path="a/b/c"),
    ):
        text = _refused(call, shardwise.PlanError, ValueError)
        assert "array 'a' in" in text and "holds no other nodes" in text
    assert files(group, journal=True) == before  # not even a write marker


def test_a_refusal_names_the_commands_options_not_python_keywords(
    v2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command-line user is told the options to give (``--mode w``, ``--resume``,
    ``--path``), not the keywords of the Python call the message was written for; that call's
    own message keeps them."""
    dst = tmp_path / "dst.zarr"
    assert main(["convert", str(v2), str(dst), "--shards", "20,15"]) == 0
    capsys.readouterr()
    assert main(["convert", str(v2), str(dst), "--shards", "20,15"]) == 3
    err = capsys.readouterr().err
    assert "use --mode w to replace it, or --resume to finish an interrupted conversion" in err
    assert "mode=" not in err and "resume=" not in err
    assert main(["convert", str(v2), str(tmp_path / "o.zarr"), "--shards", "20"]) == 3
    err = capsys.readouterr().err
    assert "give a shape per array (--path), or sizes per dimension name" in err
    with pytest.raises(FileExistsError, match=r"use mode='w' to replace it, or resume=True"):
        shardwise.convert(v2, dst, shards=(20, 15))
