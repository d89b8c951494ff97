"""Progress bars count shards (and bytes), on the local schedulers and on a distributed client;
off by default in library calls, on by default in the CLI commands that do long work."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import shardwise
from shardwise.cli import main

KW: dict[str, Any] = dict(chunks=(8, 8), shards=(16, 16), fill_value=0)
NSHARDS = 4 * 3


def data() -> np.ndarray:
    return np.random.default_rng(8).integers(1, 100, (64, 48)).astype("int32")


def source() -> da.Array:
    # more dask tasks than shards (blocks that cut shards): the bar must count shards, not tasks
    return da.from_array(data(), chunks=(10, 7))


def final_count(err: str) -> tuple[int, int]:
    """The last ``n/total`` a tqdm bar printed over shards."""
    found = re.findall(r"(\d+)/(\d+) \[[^\]]*shard", err)
    assert found, f"no shard progress bar in {err!r}"
    n, total = found[-1]
    return int(n), int(total)


@pytest.mark.parametrize("scheduler", ["threads", "synchronous"])
def test_write_progress_counts_shards_on_local_schedulers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scheduler: str
) -> None:
    assert len(source().__dask_graph__()) > 2 * NSHARDS
    with dask.config.set(scheduler=scheduler):
        report = shardwise.write_array(source(), tmp_path / "a.zarr", progress=True, **KW)
    err = capsys.readouterr().err
    assert report.shards_written == NSHARDS
    assert final_count(err) == (NSHARDS, NSHARDS)
    assert f"{report.bytes_stored / 1e6:.1f} MB stored" in err
    assert "shardwise: 100%|" in err  # the bar's label (mutation lane: Pipeline.run_62)


def test_write_progress_counts_shards_on_a_distributed_client(
    client: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with dask.config.set(scheduler=client):
        report = shardwise.write_array(source(), str(tmp_path / "a.zarr"), progress=True, **KW)
    err = capsys.readouterr().err
    assert report.shards_written == NSHARDS
    assert final_count(err) == (NSHARDS, NSHARDS)
    np.testing.assert_array_equal(shardwise.open_array(tmp_path / "a.zarr").compute(), data())


def test_to_zarr_progress_counts_the_shards_of_every_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = xr.Dataset(
        {"a": (("y", "x"), data()), "b": (("y", "x"), data() * 2)},
        coords={"y": np.arange(64), "x": np.arange(48)},
    ).chunk({"y": 10, "x": 7})
    with dask.config.set(scheduler="threads"):
        report = shardwise.to_zarr(
            ds, tmp_path / "d.zarr", shards={"y": 16, "x": 16}, progress=True
        )
    err = capsys.readouterr().err
    n, total = final_count(err)
    assert n == total == report.shards_written + report.shards_empty
    assert n >= 2 * NSHARDS  # a and b (and their coordinates)


def test_no_progress_output_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shardwise.write_array(source(), tmp_path / "a.zarr", **KW)
    ds = xr.Dataset({"a": (("y", "x"), data())}).chunk({"y": 10})
    shardwise.to_zarr(ds, tmp_path / "d.zarr", shards={"y": 16, "x": 16})
    shardwise.verify(tmp_path / "a.zarr")
    assert capsys.readouterr().err == ""


def test_cli_shows_progress_when_asked_and_not_with_no_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bars count every shard (by default they show only when stderr is a terminal:
    integration/test_cli.py::test_progress_bars_only_on_a_terminal_unless_asked)."""
    src = tmp_path / "src.zarr"
    shardwise.write_array(data(), src, chunks=(8, 8), shards=(64, 48))
    args = ["reshard", str(src), str(tmp_path / "a.zarr"), "--shards", "16,16", "--progress"]
    assert main(args) == 0
    assert final_count(capsys.readouterr().err) == (NSHARDS, NSHARDS)
    assert main(["verify", str(tmp_path / "a.zarr"), "--progress"]) == 0
    assert final_count(capsys.readouterr().err) == (NSHARDS, NSHARDS)

    args = ["reshard", str(src), str(tmp_path / "b.zarr"), "--shards", "16,16", "--no-progress"]
    assert main(args) == 0
    assert main(["verify", str(tmp_path / "b.zarr"), "--no-progress"]) == 0
    assert "shard" not in capsys.readouterr().err


# a group of three arrays converted with a bar each, in a child process whose stdout and stderr
# are a pseudo-terminal
CONVERT_IN_A_TERMINAL = """
import sys
import numpy as np, zarr, shardwise
src = zarr.open_group(sys.argv[1], mode="w")
for name in "abc":
    src.create_array(name, shape=(64, 48), chunks=(8, 8), dtype="int32")[:] = 1
shardwise.convert(sys.argv[1], sys.argv[2], shards=(16, 16), progress=True)
print("done")
"""


def in_a_terminal(args: list[str], rows: int, cols: int) -> str:
    """What ``args`` printed to a pseudo-terminal of ``rows`` x ``cols`` (0 x 0: one that reports
    no size, as a fresh one does), read to its end."""
    master, slave = pty.openpty()
    if rows or cols:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**os.environ, "COLUMNS": "", "LINES": ""}
    child = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            got = os.read(master, 65536)
        except OSError:  # EIO: the child is gone and its side of the terminal closed
            break
        if not got:
            break
        out += got
    os.close(master)
    assert child.wait() == 0, out
    return out.decode()


def screen_lines(out: str) -> list[str]:
    """The lines a terminal shows after ``out``: each line as its last redraw (a bar redraws
    itself after a carriage return) left it."""
    return [line.split("\r")[-1] for line in out.replace("\r\n", "\n").split("\n")][:-1]


@pytest.mark.parametrize(("rows", "cols"), [(0, 0), (24, 80)], ids=["no-size", "80-columns"])
def test_each_array_leaves_one_line_and_no_empty_one_in_a_terminal(
    tmp_path: Path, rows: int, cols: int
) -> None:
    """A terminal that reports no size (0 x 0) showed no bar and an empty line per array: each
    finished bar is one line, the next bar on the line after it."""
    out = in_a_terminal(
        [sys.executable, "-c", CONVERT_IN_A_TERMINAL, str(tmp_path / "s"), str(tmp_path / "d")],
        rows,
        cols,
    )
    lines = screen_lines(out)
    assert len(lines) == 4, lines
    for name, line in zip("abc", lines, strict=False):
        assert re.fullmatch(rf"copy {name}: 100%\|█+\| 12/12 \[.*, 0\.0 MB stored\]", line), line
        assert len(line) == (cols or 80) - 1  # the width the terminal has, else 80 columns
    assert lines[3] == "done"


# two writes into an icechunk session on threads: each shows its shard bar, then the bar of the
# forks merged into the session and its commit
ICECHUNK_IN_A_TERMINAL = """
import sys, icechunk, numpy as np, shardwise
icechunk.set_logs_filter("error")  # not its warning about local files and concurrent commits
repo = icechunk.Repository.create(icechunk.local_filesystem_storage(sys.argv[1]))
x = np.arange(64 * 48, dtype="int32").reshape(64, 48)
for path in "ab":
    session = repo.writable_session("main")
    shardwise.write_array(
        x, session, path=path, chunks=8, shards=16, progress=True, commit=f"wrote {path}"
    )
print("done")
"""


@pytest.mark.parametrize(("rows", "cols"), [(0, 0), (24, 80)], ids=["no-size", "80-columns"])
def test_the_icechunk_merge_bar_leaves_one_line_and_no_empty_one_in_a_terminal(
    tmp_path: Path, rows: int, cols: int
) -> None:
    """The merge bar of a write into an icechunk session, like the shard bars: in a terminal
    that reports no size it showed nothing and left an empty line; each bar is one line of the
    terminal's width (else 80 columns), the next bar on the line after it."""
    out = in_a_terminal(
        [sys.executable, "-c", ICECHUNK_IN_A_TERMINAL, str(tmp_path / "repo")], rows, cols
    )
    lines = screen_lines(out)
    assert len(lines) == 5, lines
    for shards, merge in (lines[0:2], lines[2:4]):
        assert re.fullmatch(r"shardwise: 100%\|█+\| 12/12 \[.*, 0\.0 MB stored\]", shards)
        assert re.fullmatch(r"shardwise: merge into the session: 100%\|█+\| 12/12 \[.*", merge)
        assert len(shards) == len(merge) == (cols or 80) - 1, (shards, merge)
    assert lines[4] == "done"
