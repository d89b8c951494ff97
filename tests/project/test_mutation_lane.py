"""The mutation lane's verdicts are kept in the repository: ``dev.sh mutate --report`` on a clone
without ``build/mutate`` prints the numbers of ``mutation/verdicts/*.json`` and says when a
module's source has changed since they were measured. Nothing here runs mutmut."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MUTATION = ROOT / "mutation"


def kept() -> dict[str, dict[str, Any]]:
    out = {}
    for f in sorted((MUTATION / "verdicts").glob("*.json")):
        data = json.loads(f.read_text())
        out[data["module"]] = data
    return out


def clone(tmp_path: Path) -> Path:
    """What a fresh clone has of the lane: mutation/ and the modules' sources, no build/."""
    shutil.copytree(MUTATION, tmp_path / "mutation", ignore=shutil.ignore_patterns("__pycache__"))
    table = tomllib.loads((MUTATION / "modules.toml").read_text())["modules"]
    for m in table.values():
        (tmp_path / m["source"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / m["source"], tmp_path / m["source"])
    return tmp_path


def report(root: Path) -> str:
    cmd = [sys.executable, str(root / "mutation" / "run.py"), "--report"]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
    assert done.returncode in (0, 1), done.stderr  # 1: survivors not listed as equivalent
    return done.stdout


def numbers(data: dict[str, Any]) -> str:
    tested = data["mutants"] - data["untested"]
    return (
        f"{data['module']}: {data['mutants']} mutants, {data['untested']} not tested yet; "
        f"of the {tested} tested: {data['killed']} killed, {len(data['survived'])} survived, "
        f"{len(data['no_tests'])} without a covering test"
    )


def test_every_kept_summary_is_of_a_module_of_the_lane() -> None:
    table = tomllib.loads((MUTATION / "modules.toml").read_text())["modules"]
    assert kept(), "no verdicts kept in mutation/verdicts/"
    for name, data in kept().items():
        assert name in table, name
        assert data["source"] == table[name]["source"]


def test_report_on_a_clone_prints_the_kept_verdicts(tmp_path: Path) -> None:
    root = clone(tmp_path)
    assert not (root / "build").exists()
    out = report(root)
    equivalent = (MUTATION / "equivalents.md").read_text()
    for name, data in kept().items():
        assert numbers(data) in out, (name, out)
        assert f"(kept in mutation/verdicts/{name.replace('/', '-')}.json" in out, out
        for survivor in data["survived"] + data["no_tests"]:
            assert survivor in out or f"`{survivor}`" in equivalent, survivor


def test_report_says_when_a_kept_summary_is_stale(tmp_path: Path) -> None:
    root = clone(tmp_path)
    data = next(iter(kept().values()))
    with (root / data["source"]).open("a") as f:
        f.write("\n# changed\n")
    out = report(root)
    assert numbers(data) in out
    assert f"stale: {data['source']} has changed since it was measured" in out
