"""The mutation-testing lane: mutmut over shardwise's core modules, one module at a time.

``bash dev.sh mutate [MODULE ...]`` runs this (after installing the ``mutate`` extra). Each module
of ``modules.toml`` gets a work directory of its own, ``build/mutate/<module>/``, holding links to
``src`` and ``tests`` and a ``pyproject.toml`` whose ``[tool.mutmut]`` table is the project's plus
that module's source file (``only_mutate``) and covering tests: mutmut keeps its mutants, its
test-to-function map and its results per module there, so runs of different modules never mix
and a later run only tests the mutants without a result yet.

    python mutation/run.py                 # every module, smallest first
    python mutation/run.py core/layout     # one module
    python mutation/run.py --rerun core/layout   # again the survivors (after new tests)
    python mutation/run.py --sample 0.4 durability/journal  # 40% of the mutants, evenly spread
    python mutation/run.py --report        # the numbers of the runs so far, nothing run

Survivors that are not listed in ``equivalents.md`` (with the reason each cannot be killed) are
printed by name; the exit status is 1 while any module has such survivors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = ROOT / "build" / "mutate"
EQUIVALENTS = HERE / "equivalents.md"
# mutmut's exit codes per mutant (mutmut.stats.status_by_exit_code), grouped for the report
KILLED = {1, 3, 24, -24, 36, 152, 255}  # a test failed, or the mutant ran into the time limit
SURVIVED = {0}
NO_TESTS = {5, 33}


@dataclass(frozen=True)
class Module:
    name: str
    source: str
    tests: list[str]

    @property
    def work(self) -> Path:
        return WORK / self.name.replace("/", "-")


def modules() -> dict[str, Module]:
    table = tomllib.loads((HERE / "modules.toml").read_text())["modules"]
    return {n: Module(n, m["source"], list(m["tests"])) for n, m in table.items()}


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"[tool.mutmut]: cannot write {v!r}")


def pyproject_for(module: Module) -> str:
    """The project's pyproject.toml with the module's keys added to ``[tool.mutmut]`` (which
    must be the file's last table: it is cut off and written anew)."""
    text = (ROOT / "pyproject.toml").read_text()
    head, sep, _ = text.partition("\n[tool.mutmut]\n")
    if not sep:
        raise SystemExit("pyproject.toml has no [tool.mutmut] table")
    common = tomllib.loads(text)["tool"]["mutmut"]
    table = {
        **common,
        "only_mutate": [module.source],
        "pytest_add_cli_args_test_selection": module.tests,
    }
    out = (
        head + "\n[tool.mutmut]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in table.items())
    )
    if tomllib.loads(out)["tool"]["mutmut"] != table:
        raise SystemExit("[tool.mutmut] must be the last table of pyproject.toml")
    return out


def prepare(module: Module) -> None:
    module.work.mkdir(parents=True, exist_ok=True)
    for name in ("src", "tests"):
        link = module.work / name
        if not link.is_symlink():
            link.symlink_to(ROOT / name, target_is_directory=True)
    (module.work / "pyproject.toml").write_text(pyproject_for(module))


def results(module: Module) -> dict[str, int | None]:
    meta = module.work / "mutants" / (module.source + ".meta")
    if not meta.exists():
        return {}
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    return codes


# mutmut 3.8's own first step of `mutmut run` (the mutants and their .meta files, no test run):
# the mutants' names exist only after it, and a sample is chosen among them
GENERATE = """
from mutmut.__main__ import create_mutants
from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir
from pathlib import Path
Path("mutants").mkdir(exist_ok=True)
copy_src_dir()
copy_also_copy_files()
create_mutants(1)
"""


def sample(module: Module, fraction: float) -> list[str]:
    """An evenly spread ``fraction`` of the module's mutants (in source order) that have no
    verdict yet; a later ``--sample`` run adds to the verdicts kept, ``--report`` counts them."""
    prepare(module)
    subprocess.run(
        [sys.executable, "-c", GENERATE], cwd=module.work, check=True, stdout=subprocess.DEVNULL
    )
    names = list(results(module))
    picked = [n for i, n in enumerate(names) if int((i + 1) * fraction) > int(i * fraction)]
    return [n for n in picked if results(module)[n] is None]


def run(module: Module, names: list[str]) -> None:
    prepare(module)
    # one child process: the machine is shared; mutmut runs the selected mutants (all when none)
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", "1", *names]
    print(f"mutate: {module.name}: {' '.join(cmd[1:])}  (in {module.work})", flush=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # mutmut puts mutants/src first on sys.path itself; the project's src stays reachable
    env["PYTHONPATH"] = str(ROOT / "src")
    subprocess.run(cmd, cwd=module.work, env=env, check=False)


def _meta(module: Module) -> dict[str, Any]:
    meta = module.work / "mutants" / (module.source + ".meta")
    return json.loads(meta.read_text()) if meta.exists() else {}


def _function(mutant: str) -> str:
    """``pkg.mod.x_name__mutmut_3`` -> ``x_name``, the key of mutmut's hash_by_function_name."""
    return mutant.rpartition(".")[2].rpartition("__mutmut_")[0]


def keep_verdicts(module: Module, before: dict[str, Any]) -> None:
    """Put back the verdicts mutmut dropped when the module's list of test files grew (it resets
    every verdict on any change of the test selection): a mutant a test killed stays killed when
    tests are added. Not for a function whose source changed since (``before``'s hashes): its
    mutants are new, numbered anew, and need a verdict of their own."""
    data = _meta(module)
    codes = data["exit_code_by_key"]
    old_hash, new_hash = before.get("hash_by_function_name", {}), data["hash_by_function_name"]
    kept = {
        k: c
        for k, c in before.get("exit_code_by_key", {}).items()
        if c is not None
        and codes.get(k, 0) is None
        and old_hash.get(_function(k)) == new_hash.get(_function(k))
    }
    if kept:
        codes.update(kept)
        meta = module.work / "mutants" / (module.source + ".meta")
        meta.write_text(json.dumps(data, indent=4))
        print(f"mutate: {module.name}: {len(kept)} verdicts of the tests before kept", flush=True)


def equivalents() -> dict[str, str]:
    out = {}
    for line in EQUIVALENTS.read_text().splitlines():
        m = re.match(r"- `([\w.]+__mutmut_\d+)`: (.+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def report(module: Module, equivalent: dict[str, str]) -> bool:
    """Print the module's numbers; True when every survivor is listed as equivalent."""
    codes = results(module)
    if not codes:
        print(f"{module.name}: not run yet")
        return False
    untested = sum(c is None for c in codes.values())  # outside a --sample so far
    killed = sum(c in KILLED for c in codes.values())
    survived = [k for k, c in codes.items() if c in SURVIVED]
    no_tests = [k for k, c in codes.items() if c in NO_TESTS]
    other = len(codes) - untested - killed - len(survived) - len(no_tests)
    unkilled = survived + no_tests
    listed = [k for k in unkilled if k in equivalent]
    total = len(codes) - untested  # the score is over the mutants tested
    print(
        f"{module.name}: {len(codes)} mutants, {untested} not tested yet; of the {total} tested: "
        f"{killed} killed, {len(survived)} survived, "
        f"{len(no_tests)} without a covering test, {other} other; "
        f"score {100 * killed / total:.1f}% "
        f"({100 * killed / max(1, total - len(listed)):.1f}% without the "
        f"{len(listed)} equivalent)"
    )
    open_ = sorted(set(unkilled) - set(listed))
    for name in open_:
        print(f"    not killed: {name}")
    return not open_


def main(argv: list[str] | None = None) -> int:
    mods = modules()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("module", nargs="*", help=f"default: all, in order ({', '.join(mods)})")
    p.add_argument("--rerun", action="store_true", help="test the survivors again")
    p.add_argument("--report", action="store_true", help="only print the numbers so far")
    p.add_argument(
        "--sample",
        type=float,
        metavar="FRACTION",
        help="test only this fraction (0 < FRACTION <= 1) of the mutants without a verdict, "
        "evenly spread over the module",
    )
    args = p.parse_args(argv)
    if args.sample is not None and not 0 < args.sample <= 1:
        p.error(f"--sample takes a fraction in (0, 1], not {args.sample}")
    unknown = [n for n in args.module if n not in mods]
    if unknown:
        p.error(f"unknown module {unknown[0]!r}; the lane's modules: {', '.join(mods)}")
    chosen = [mods[n] for n in args.module] if args.module else list(mods.values())
    equivalent = equivalents()
    ok = True
    for module in chosen:
        if not args.report:
            names: list[str] = []
            if args.rerun:
                names = sorted(k for k, c in results(module).items() if c in SURVIVED | NO_TESTS)
                if not names:
                    print(f"mutate: {module.name}: no survivors to test again")
            elif args.sample is not None:
                names = sample(module, args.sample)
                print(f"mutate: {module.name}: a sample of {len(names)} mutants", flush=True)
            if names or not (args.rerun or args.sample):
                before = _meta(module)
                run(module, names)
                if args.rerun:
                    keep_verdicts(module, before)
        ok = report(module, equivalent) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
