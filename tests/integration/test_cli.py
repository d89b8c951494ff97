"""The ``shardwise`` command: in-process through ``main(argv)`` and as the installed entry point
(separate processes: a job array of batch parts runs as real concurrent processes)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr

import shardwise
from faultkit import exe, files
from shardwise.cli import main
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
    assert [p["kind"] for p in out["changes"]] == ["mismatch"]
    assert main(["verify", str(sharded.parent / "nothing")]) == 3


def test_verify_strict_on_a_shard_another_tool_rewrote(
    sharded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zarr.open_array(sharded, mode="r+")[0:10, 0:15] = 1.5  # a sound rewrite of shard c/0/0
    assert main(["verify", str(sharded)]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "note:" in out and "mismatch   c/0/0" in out
    assert main(["verify", str(sharded), "--strict"]) == 1
    assert "1 problem(s)" in capsys.readouterr().out
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
