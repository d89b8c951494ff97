"""The mutation lane's verdicts are kept in the repository: ``dev.sh mutate --report`` on a clone
without ``build/mutate`` prints the numbers of ``mutation/verdicts/*.json`` and says when a
module's source has changed since they were measured; no kept verdict claims a score on a source
that changed since (it is run again, or withdrawn: ``mutation/run.py --withdraw``), and every
survivor a kept verdict names is listed as equivalent or is killed. Nothing here runs mutmut."""

from __future__ import annotations

import hashlib
import json
import re
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
    data = next(d for d in kept().values() if "withdrawn" not in d)
    with (root / data["source"]).open("a") as f:
        f.write("\n# changed\n")
    out = report(root)
    assert numbers(data) in out
    assert f"stale: {data['source']} has changed since it was measured" in out


def test_no_kept_verdict_claims_a_score_on_a_changed_source() -> None:
    """A verdict measured on another source than the module's now is no figure of the code as it
    is: the module is run again (``mutation/run.py --rerun MODULE``, or ``--sample``), or its
    verdicts are withdrawn (``mutation/run.py --withdraw MODULE``: kept, with no score)."""
    stale = []
    for name, data in kept().items():
        now = hashlib.sha256((ROOT / data["source"]).read_bytes()).hexdigest()[:12]
        if data["source_sha256"] != now and "withdrawn" not in data:
            stale.append(f"{name} (measured on {data['source_sha256']}, the source is now {now})")
    assert not stale, "stale verdicts claiming a score: " + "; ".join(stale)


def test_every_survivor_of_a_kept_verdict_is_listed_as_equivalent() -> None:
    """A survivor is killed by a test (and the verdict measured again) or listed in
    ``equivalents.md`` with why no test can kill it: the report names no open survivor."""
    listed = set(re.findall(r"^- `([\w.]+__mutmut_\d+)`: ", _equivalents(), re.MULTILINE))
    open_ = [
        s
        for data in kept().values()
        if "withdrawn" not in data
        for s in data["survived"] + data["no_tests"]
        if s not in listed
    ]
    assert not open_, open_


def test_withdrawn_verdicts_are_reported_without_a_score(tmp_path: Path) -> None:
    root = clone(tmp_path)
    name, data = next((n, d) for n, d in kept().items() if "withdrawn" not in d)
    with (root / data["source"]).open("a") as f:
        f.write("\n# changed\n")
    cmd = [sys.executable, str(root / "mutation" / "run.py"), "--withdraw", name]
    subprocess.run(cmd, cwd=root, check=True, capture_output=True)
    out = report(root)
    line = next(x for x in out.splitlines() if x.startswith(f"{name}: "))
    assert numbers(data) in line and line.endswith("no score (withdrawn)"), line
    assert "withdrawn, no score claimed" in out
    # the verdict kept in the clone is marked, its counts as they were
    summary = root / "mutation" / "verdicts" / (name.replace("/", "-") + ".json")
    assert "withdrawn" in json.loads(summary.read_text())


def _equivalents() -> str:
    return (MUTATION / "equivalents.md").read_text()


def test_modules_whose_tests_import_icechunk_start_the_fork_server_without_them() -> None:
    """Importing icechunk starts its runtime's threads; mutmut's fork server, warmed up by
    collecting the tests, would hand its children a runtime without them: every mutant would hang
    to the time limit and count as killed. Such modules skip the warm-up, and their mutmut table
    reaches the ``[tool.mutmut]`` the lane writes for them."""
    sys.path.insert(0, str(MUTATION))
    try:
        import run  # mutation/run.py
    finally:
        sys.path.remove(str(MUTATION))
    for name, module in run.modules().items():
        texts = [(ROOT / t.split("::")[0]).read_text() for t in module.tests]
        if not any(re.search(r"^\s*(import|from) icechunk\b", t, re.MULTILINE) for t in texts):
            continue
        table = tomllib.loads(run.pyproject_for(module))["tool"]["mutmut"]
        assert table.get("forkserver_warmup") == "none", name
