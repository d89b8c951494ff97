"""examples/demo.py reads correctly end to end: the shard count it reports matches what the
write reported and what is stored under the chunk prefix, and it leaves no directory behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_demo(tmp: Path, *args: str) -> str:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_demo_counts_shard_objects_and_removes_its_temp_dir(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    text = run_demo(tmp)
    written = int(re.search(r"(\d+) shards written", text).group(1))  # type: ignore[union-attr]
    stored = int(re.search(r"zarr\.json \+ (\d+) shard objects", text).group(1))  # type: ignore[union-attr]
    assert written == stored == 15
    assert "15 shards written, 1 all-fill shard skipped (0 deleted), " in text
    assert text.rstrip().splitlines()[-2] == "OK"
    assert list(tmp.iterdir()) == []  # nothing left behind


def test_demo_into_a_named_directory_keeps_it(tmp_path: Path) -> None:
    out = tmp_path / "mine.zarr"
    text = run_demo(tmp_path, str(out))
    shards = [p for p in (out / "c").rglob("*") if p.is_file()]
    assert f"zarr.json + {len(shards)} shard objects" in text
    assert f"{len(shards)} shards written" in text
    assert text.rstrip().splitlines()[-1] == "OK"
