"""Every public name has an example that runs.

The public names are ``shardwise.__all__`` (verbs, reports, errors, the ``batch`` module), the
verbs and the record of ``shardwise.batch``, and the ``Problem`` a verify report lists. Each
one's docstring has a numpydoc ``Examples`` section with doctest lines, and pytest runs it (its
module is in pyproject's ``testpaths``, collected with ``--doctest-modules``); the test also
runs each example itself, as pytest's doctest collection would, so a name whose example fails
is named here.
"""

from __future__ import annotations

import doctest
import inspect
import io
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from numpydoc.docscrape import NumpyDocString

import shardwise
from shardwise import batch
from shardwise.durability.verify import Problem

ROOT = Path(__file__).resolve().parents[2]
TESTPATHS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
    "testpaths"
]

PUBLIC: dict[str, Any] = {
    **{f"shardwise.{name}": getattr(shardwise, name) for name in shardwise.__all__},
    **{
        f"shardwise.batch.{name}": getattr(batch, name)
        for name in ("init", "write_part", "finalize", "open_batch", "BatchPlan")
    },
    # what a VerifyReport lists
    "shardwise.durability.verify.Problem": Problem,
}


def home(obj: Any) -> ModuleType:
    """The module whose source holds ``obj``'s docstring."""
    module = obj if inspect.ismodule(obj) else inspect.getmodule(obj)
    assert module is not None and module.__file__ is not None, obj
    return module


def examples_of(obj: Any) -> list[doctest.DocTest]:
    """The doctests of ``obj``'s own docstring (not of its members), with its module's
    globals, as pytest's ``--doctest-modules`` collects them."""
    module = home(obj)
    finder = doctest.DocTestFinder(recurse=False)
    return [t for t in finder.find(obj, module=module, globs=vars(module).copy()) if t.examples]


def test_the_public_names_are_the_ones_checked() -> None:
    assert len(PUBLIC) == len(shardwise.__all__) + 6
    assert "shardwise.Stream" in PUBLIC and "shardwise.RegionWriter" in PUBLIC


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_public_name_has_an_example_that_runs(name: str) -> None:
    """The docstring has an ``Examples`` section of doctest lines, its module is collected
    for doctests by pytest, and the example runs with the output it shows."""
    obj = PUBLIC[name]
    section = "\n".join(NumpyDocString(inspect.getdoc(obj) or "")["Examples"])
    assert ">>> " in section, f"{name}: no Examples section with doctest lines"
    source = Path(home(obj).__file__ or "").resolve().relative_to(ROOT).as_posix()
    assert source in TESTPATHS, f"{name}: {source} is not in pyproject's testpaths"
    tests = examples_of(obj)
    assert len(tests) == 1, name
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    result = runner.run(tests[0], out=out.write)
    assert result.attempted > 0 and result.failed == 0, out.getvalue()
