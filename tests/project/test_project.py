"""The newcomer path: packaging metadata, the notebook extra, what dev.sh says it does and the
set-up the README and Getting started give."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression() -> None:
    assert PYPROJECT["project"]["license"] == "MIT"
    # SPDX license strings need setuptools >= 77
    assert "setuptools>=77" in PYPROJECT["build-system"]["requires"]


def test_notebook_extra_brings_jupyter_and_widgets() -> None:
    extra = PYPROJECT["project"]["optional-dependencies"]["notebook"]
    names = {d.split(">")[0].split("=")[0].split("[")[0] for d in extra}
    assert {"jupyterlab", "ipywidgets", "ipykernel", "matplotlib"} <= names


def test_getting_started_says_how_to_use_the_venv_and_open_the_notebook() -> None:
    """The README gives the two commands and sends a newcomer to Getting started, which says
    how to use the venv and open the notebook."""
    readme = (ROOT / "README.md").read_text()
    assert "bash dev.sh demo" in readme and "bash dev.sh test" in readme
    assert "(docs/getting-started.md)" in readme
    text = (ROOT / "docs" / "getting-started.md").read_text()
    for s in (
        ".venv/bin/python",
        "source .venv/bin/activate",
        ".venv/bin/shardwise",
        "pip install -e '.[notebook]'",
        ".venv/bin/jupyter lab notebooks/quickstart.ipynb",
    ):
        assert s in text, s


def test_readme_is_the_front_page() -> None:
    """The README is short and sends a reader into the site: under 200 lines, every relative link
    to a file that is there, every page of the site's top level linked."""
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert [link for link in local if not (ROOT / link).is_file()] == []
    for page in ("getting-started", "concepts", "guides/index", "cli", "design", "changelog"):
        assert f"docs/{page}.md" in local, page


def test_dev_sh_says_what_it_does(tmp_path: Path) -> None:
    # an installed venv (stamp newer than pyproject.toml): dev.sh skips the install and says so
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    (venv / ".shardwise-installed").touch()
    stamp = venv / ".shardwise-installed"
    mtime = (ROOT / "pyproject.toml").stat().st_mtime + 10
    os.utime(stamp, (mtime, mtime))
    env = {**os.environ, "SHARDWISE_VENV": str(venv), "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        ["bash", str(ROOT / "dev.sh"), "demo", str(tmp_path / "demo.zarr")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    said = [line for line in out.stderr.splitlines() if line.startswith("dev.sh: ")]
    version = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    assert said[0].startswith(f"dev.sh: Python: {py} ({version}")
    assert "is installed in" in said[1]
    assert said[-1] == "dev.sh: running examples/demo.py"
    assert out.stdout.rstrip().endswith("OK")


def test_design_md_maps_every_module() -> None:
    """docs/design.md's module map names every module of the package (a newcomer's map)."""
    text = (ROOT / "docs" / "design.md").read_text()
    mapped = text[text.index("## Module map") : text.index("### A write, step by step")]
    src = ROOT / "src" / "shardwise"
    modules = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.py"))
    missing = [m for m in modules if not m.endswith("__init__.py") and m not in mapped]
    assert missing == []


def test_every_docstring_example_runs_as_a_doctest() -> None:
    """pytest collects the doctests of every module whose docstrings have examples."""
    options = PYPROJECT["tool"]["pytest"]["ini_options"]
    assert "--doctest-modules" in options["addopts"].split()
    src = ROOT / "src" / "shardwise"
    with_examples = sorted(
        p.relative_to(ROOT).as_posix() for p in src.rglob("*.py") if ">>> " in p.read_text()
    )
    assert with_examples, "the package has docstring examples"
    listed = set(options["testpaths"])
    assert [m for m in with_examples if m not in listed] == []


def test_tests_mirror_the_package() -> None:
    """Each test module sits in the folder of the package part it tests (or project/integration,
    or hpc: runs on a real batch scheduler), its basename unique (no __init__.py: tests/ is on
    sys.path), and tests/README.md maps it."""
    tests, src = ROOT / "tests", ROOT / "src" / "shardwise"
    rooms = {p.name for p in src.iterdir() if (p / "__init__.py").exists()}
    modules = sorted(tests.rglob("test_*.py"))
    assert modules
    places = rooms | {"project", "integration", "hpc"}
    assert [p for p in modules if p.parent.name not in places] == []
    assert len({p.name for p in modules}) == len(modules)
    assert list(tests.rglob("__init__.py")) == []
    mapping = (tests / "README.md").read_text()
    assert [p for p in modules if p.relative_to(tests).as_posix() not in mapping] == []
