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

After each run a module's verdicts are summed up in ``mutation/verdicts/<module>.json`` (kept in
the repository: counts, the survivors' names, a hash of the source file they were measured on);
``--report`` reads them where ``build/mutate`` holds no run of the module (a fresh clone) and says
when the source has changed since, and when fewer than 30% of a module's mutants are tested
(no figure yet: ``--sample`` adds to them).

A verdict measured on a source that has changed since is *stale*: its score is no figure of the
code as it is, and ``tests/project/test_mutation_lane.py`` fails (in CI) while a kept verdict
is stale and still claims its score. Run the module again (``--rerun`` or ``--sample``: mutmut
tests anew the mutants of every function whose source changed), or, where it cannot be run now,
withdraw the claim; the report then prints the old counts marked as withdrawn, with no score:

    python mutation/run.py --withdraw durability/lease   # the source changed, no run yet

Mutants reach the processes tests start: mutmut activates a mutant through the environment
variable ``MUTANT_UNDER_TEST``, which children inherit, and ``PYTHONPATH`` names the mutated
source tree (``mutants/src``), so a forkserver child, a worker process or a CLI subprocess runs
the mutated code too. mutmut maps tests to functions by the calls it sees in the test process
only, so the mutants of a function only children run come out "without a covering test": each
such mutant is then tested again with every test of its module.

A module's ``mutmut`` table in ``modules.toml`` adds keys of its own to ``[tool.mutmut]``: the
icechunk modules start the fork server without importing their tests (``forkserver_warmup =
"none"``), as importing icechunk starts its runtime's threads, which a forked child lacks: every
mutant would hang until the time limit and count as killed. The report counts the mutants killed
by the time limit apart, so a lane where they all are shows.

Survivors that are not listed in ``equivalents.md`` (with the reason each cannot be killed) are
printed by name; the exit status is 1 while any module has such survivors.
"""

from __future__ import annotations

import argparse
import hashlib
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
VERDICTS = HERE / "verdicts"
# mutmut's exit codes per mutant (mutmut.stats.status_by_exit_code), grouped for the report
KILLED = {1, 3, 24, -24, 36, 152, 255}  # a test failed, or the mutant ran into the time limit
TIMED_OUT = {24, -24, 36, 152, 255}  # of those: the time limit (mutmut.stats.status_by_exit_code)
SURVIVED = {0}
NO_TESTS = {5, 33}
FIGURE = 0.3  # the least share of a module's mutants tested for its score to be a figure


@dataclass(frozen=True)
class Module:
    name: str
    source: str
    tests: list[str]
    # the module's own [tool.mutmut] keys (modules.toml's ``mutmut`` table of the module)
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def work(self) -> Path:
        return WORK / self.name.replace("/", "-")

    @property
    def summary(self) -> Path:
        return VERDICTS / (self.name.replace("/", "-") + ".json")

    def source_hash(self) -> str:
        return hashlib.sha256((ROOT / self.source).read_bytes()).hexdigest()[:12]


def modules() -> dict[str, Module]:
    table = tomllib.loads((HERE / "modules.toml").read_text())["modules"]
    return {
        n: Module(n, m["source"], list(m["tests"]), tuple(m.get("mutmut", {}).items()))
        for n, m in table.items()
    }


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
        **dict(module.options),
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
    # there before mutmut starts: a PYTHONPATH entry missing at start is never looked in again
    (module.work / "mutants" / "src").mkdir(parents=True, exist_ok=True)


def measured(module: Module) -> Path:
    """Where a run in ``build/mutate`` notes the hash of the source it mutated."""
    return module.work / "source_sha256"


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
    measured(module).write_text(module.source_hash() + "\n")  # mutmut copies the source now
    # one child process: the machine is shared; mutmut runs the selected mutants (all when none)
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", "1", *names]
    print(f"mutate: {module.name}: {' '.join(cmd[1:])}  (in {module.work})", flush=True)
    # mutmut puts mutants/src first on sys.path of its own processes; PYTHONPATH puts it there in
    # every process a test starts (a forkserver, a worker, the CLI), which inherit the mutant's
    # name (MUTANT_UNDER_TEST) from the environment: they run the mutated code too
    env = {**os.environ, "PYTHONPATH": str(module.work / "mutants" / "src")}
    subprocess.run(cmd, cwd=module.work, env=env, check=False)


def reach_children(module: Module) -> None:
    """Test the mutants mutmut found no covering test for with every test of the module: mutmut
    sees the calls of its test process only, not those of the processes tests start."""
    unreached = sorted(k for k, c in results(module).items() if c in NO_TESTS)
    stats_file = module.work / "mutants" / "mutmut-stats.json"
    if not unreached or not stats_file.exists():
        return
    stats = json.loads(stats_file.read_text())
    every_test = sorted(stats["duration_by_test"])
    for name in unreached:
        stats["tests_by_mangled_function_name"][name.partition("__mutmut_")[0]] = every_test
    stats_file.write_text(json.dumps(stats, indent=4))
    print(
        f"mutate: {module.name}: {len(unreached)} mutants without a covering test in the test "
        f"process: again with all {len(every_test)} tests (child processes run them too)",
        flush=True,
    )
    run(module, unreached)


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


def verdicts(module: Module) -> dict[str, Any]:
    """The module's verdicts of the runs kept in ``build/mutate`` (empty when none)."""
    codes = results(module)
    if not codes:
        return {}
    noted = measured(module)
    return {
        "module": module.name,
        "source": module.source,
        # the source the mutants were made of (a run before this note: the source as it is)
        "source_sha256": noted.read_text().strip() if noted.exists() else module.source_hash(),
        "mutants": len(codes),
        "untested": sum(c is None for c in codes.values()),  # outside a --sample so far
        "killed": sum(c in KILLED for c in codes.values()),
        "timed_out": sum(c in TIMED_OUT for c in codes.values()),  # of the killed
        "survived": sorted(k for k, c in codes.items() if c in SURVIVED),
        "no_tests": sorted(k for k, c in codes.items() if c in NO_TESTS),
    }


def keep_summary(module: Module) -> None:
    """Write the module's verdicts to ``mutation/verdicts/`` (kept in the repository)."""
    data = verdicts(module)
    if data:
        VERDICTS.mkdir(exist_ok=True)
        module.summary.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def stale(module: Module, data: dict[str, Any]) -> bool:
    """True when ``data`` (verdicts) were measured on another source than the module's now."""
    return bool(data["source_sha256"] != module.source_hash())


def withdraw(module: Module) -> None:
    """Mark the kept verdicts of a module whose source changed as no longer claiming a score."""
    if not module.summary.exists():
        raise SystemExit(f"{module.name}: no verdicts kept in mutation/verdicts/ to withdraw")
    data = json.loads(module.summary.read_text())
    if not stale(module, data):
        raise SystemExit(f"{module.name}: its kept verdicts are of {module.source} as it is")
    data["withdrawn"] = f"{module.source} changed since (now {module.source_hash()})"
    module.summary.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    print(f"{module.name}: kept verdicts withdrawn ({data['withdrawn']})")


def report(module: Module, equivalent: dict[str, str]) -> bool:
    """Print the module's numbers (of ``build/mutate``, else of its summary in the repository);
    True when every survivor is listed as equivalent."""
    data, kept = verdicts(module), ""
    if not data and module.summary.exists():
        data = json.loads(module.summary.read_text())
        kept = f"    (kept in mutation/verdicts/{module.summary.name}"
    if not data:
        print(f"{module.name}: not run yet")
        return False
    if not stale(module, data):
        kept += f", measured on {module.source} as it is)" if kept else ""
    elif "withdrawn" in data:
        kept += f"; withdrawn, no score claimed: {data['withdrawn']})"
    else:
        kept = (kept or "    (in build/mutate") + (
            f"; stale: {module.source} has changed since it was measured)"
        )
    survived, no_tests = data["survived"], data["no_tests"]
    killed, total = data["killed"], data["mutants"] - data["untested"]  # the score: of the tested
    other = total - killed - len(survived) - len(no_tests)
    unkilled = survived + no_tests
    listed = [k for k in unkilled if k in equivalent]
    score = (
        "no score (withdrawn)"
        if "withdrawn" in data
        else f"score {100 * killed / max(1, total):.1f}% "
        f"({100 * killed / max(1, total - len(listed)):.1f}% without the "
        f"{len(listed)} equivalent)"
    )
    print(
        f"{module.name}: {data['mutants']} mutants, {data['untested']} not tested yet; of the "
        f"{total} tested: {killed} killed, {len(survived)} survived, "
        f"{len(no_tests)} without a covering test, {other} other; {score}"
    )
    if total < FIGURE * data["mutants"]:
        share = 100 * total / data["mutants"]
        print(f"    a {share:.0f}% sample: below the {FIGURE:.0%} of a figure")
    if data.get("timed_out"):
        print(f"    {data['timed_out']} of the killed by the time limit (no test failed)")
    if kept:
        print(kept)
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
        "--withdraw",
        action="store_true",
        help="mark the named modules' stale kept verdicts as claiming no score (nothing run)",
    )
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
    if args.withdraw:
        if not args.module:
            p.error("--withdraw takes the modules whose kept verdicts to withdraw")
        for module in chosen:
            withdraw(module)
        return 0
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
                if args.rerun or args.sample is not None:
                    keep_verdicts(module, before)
                reach_children(module)
                keep_summary(module)
        ok = report(module, equivalent) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
