"""Check that the lane's mutants reach the processes tests start (needs mutmut; a minute).

    python mutation/check_children.py

Builds a tiny project in a temporary directory, with run.py as the lane has it: ``double`` is
called only in a forkserver child (``via_child``), its one test checks ``via_child(3) == 6``.
Its two mutants (``x * 3``, ``x / 2``) must come out killed: mutmut sees no call of ``double`` in
the test process, run.py tests them again with every test, and the child imports the mutated
source (``PYTHONPATH``) with the mutant active (``MUTANT_UNDER_TEST``). With the project's own
``src`` on the children's path instead, both survive.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

FILES = {
    "src/tinypkg/__init__.py": """import multiprocessing as mp


def double(x):
    return x * 2


def via_child(x):
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tinypkg"])
    with ctx.Pool(1) as pool:
        return pool.apply(double, (x,))
""",
    "tests/test_tiny.py": """from tinypkg import via_child


def test_double_in_a_child():
    assert via_child(3) == 6
""",
    "pyproject.toml": """[project]
name = "tinypkg"
version = "0"

[tool.mutmut]
source_paths = ["src"]
process_isolation = "forkserver"
pytest_add_cli_args = ["-p", "no:cacheprovider"]
use_git_change_detection = false
""",
    "mutation/modules.toml": """[modules."tiny"]
source = "src/tinypkg/__init__.py"
tests = ["tests/test_tiny.py"]
""",
    "mutation/equivalents.md": "",
}


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for name, text in FILES.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        shutil.copy2(HERE / "run.py", root / "mutation" / "run.py")
        cmd = [sys.executable, str(root / "mutation" / "run.py"), "tiny"]
        subprocess.run(cmd, cwd=root, check=False, stdout=subprocess.DEVNULL)
        data = json.loads((root / "mutation" / "verdicts" / "tiny.json").read_text())
    unkilled = [n for n in data["survived"] + data["no_tests"] if "x_double__" in n]
    print(f"the mutants of double (run only in a forkserver child) not killed: {unkilled}")
    return 1 if unkilled or data["untested"] else 0


if __name__ == "__main__":
    sys.exit(main())
