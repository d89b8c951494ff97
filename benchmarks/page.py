#!/usr/bin/env python
"""The benchmarks page: one command runs a curated suite of the benchmark scripts side by side
with the tools each compares against, then writes the page (tables, plots, the machine, the
versions and the command) from what it measured.

    bash dev.sh bench-page            # the default size (about 2 hours on 2 cores, estimated)
    bash dev.sh bench-page --quick    # small arrays, minutes
    python benchmarks/page.py --tiny --out DIR   # seconds: the test's size

Every suite (``page_catalog.py``) runs its script with its own options: every case in a fresh
process, repetitions interleaved, every store checked (see each script). Their JSON lines are
kept under ``OUT/benchmarks/results/``, the plots under ``OUT/benchmarks/``, the page is
``OUT/benchmarks.md`` (``OUT`` is ``docs`` by default: the site renders the committed files,
nothing runs at build time). A tool that does not import in this environment is not run: the
page lists it as absent.

``--render`` writes the page again from the results already in ``OUT`` (nothing runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import page_render  # noqa: E402
from page_catalog import SUITES  # noqa: E402
from page_suites import LIBS, TOOLS  # noqa: E402

PROBE = """
import importlib, importlib.metadata as md, json, sys
out = {}
for name, (mod, dist) in json.loads(sys.argv[1]).items():
    try:
        importlib.import_module(mod)
    except Exception as e:
        out[name] = {"present": False, "why": type(e).__name__ + ": " + str(e)[:120]}
        continue
    try:
        version = md.version(dist)
    except md.PackageNotFoundError:
        version = getattr(sys.modules[mod], "__version__", "?")
    out[name] = {"present": True, "version": version}
print(json.dumps(out))
"""


def script_env(work: Path) -> dict[str, str]:
    """The environment every script runs in: this checkout's ``src`` first, the sources and
    stores under ``work``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env.setdefault("BENCH_SRC", str(work / "src"))
    env["BENCH_STORES"] = str(work / "stores")
    env.pop("BENCH_SIZE", None)
    side = Path(sys.prefix) / "side" / "acquire-zarr"  # dev.sh installs it there (pip --target)
    if side.is_dir() and "AQZ_PATH" not in env:
        env["AQZ_PATH"] = str(side)  # stream.py puts it on its cases' path
    return env


def probe(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Which tools and libraries import in the scripts' environment, and their versions."""
    names = {k: (m, d) for k, (m, d, _) in TOOLS.items()}
    names.update({k: (k.replace("-", "_"), k) for k in LIBS})
    # zarrs (zarr-python's Rust codec pipeline) and acquire-zarr: dev.sh installs them beside
    # the venv, not in it
    side = [str(Path(sys.prefix) / "side" / "zarrs"), env.get("AQZ_PATH", "")]
    env = {**env, "PYTHONPATH": os.pathsep.join([env.get("PYTHONPATH", ""), *side])}
    got = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(names)],
        env=env, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return json.loads(got.stdout)  # type: ignore[no-any-return]


def machine(work: Path) -> dict[str, Any]:
    """CPU model, cores, RAM, OS and the filesystem the stores were written to."""
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(next(x for x in f if x.startswith("MemTotal")).split()[1])
    df = subprocess.run(
        ["df", "-h", "--output=source,fstype,size", str(work)],
        capture_output=True, text=True, check=False,
    ).stdout.splitlines()  # fmt: skip
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kib / 2**20, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "disk": " ".join(df[-1].split()) if len(df) > 1 else "?",
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }


def commit() -> str:
    got = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return got.stdout.strip() or "?"


def run_suite(suite: Any, size: str, present: dict[str, bool], res: Path, work: Path) -> float:
    """Run one suite's script into ``res/<key>.jsonl``; its wall seconds (``RuntimeError`` with
    the end of its output if it fails)."""
    out = res / f"{suite.key}.jsonl"
    out.unlink(missing_ok=True)
    stores = str(work / "stores")
    script = [sys.executable, str(HERE / suite.script)]
    prepare = suite.prepare.get(size)  # a generation step first, if the suite has one
    cmds = [[*script, *(a.replace("{dir}", stores) for a in prepare)]] if prepare else []
    cmds.append([*script, *suite.argv(size, present, str(out), stores)])
    env = script_env(work)
    (work / "stores").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for cmd in cmds:
        print(f"page: {suite.key}: {shlex.join(cmd[1:])}", file=sys.stderr, flush=True)
        got = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, check=False)
        with open(work / f"{suite.key}.log", "a") as log:
            log.write(got.stdout + got.stderr)
        if got.returncode != 0:
            raise RuntimeError(got.stderr.strip()[-600:])
    if suite.finish:
        suite.finish(suite, size, str(out), env)
    return time.perf_counter() - t0


def run(size: str, out: Path, work: Path, only: list[str]) -> None:
    res = out / "benchmarks" / "results"
    res.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = script_env(work)
    tools = probe(env)
    present = {k: v["present"] for k, v in tools.items()}
    info: dict[str, Any] = {
        "size": size,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "machine": machine(work),
        "tools": tools,
        "seconds": {},
    }
    t0 = time.perf_counter()
    for suite in SUITES:
        if (only and suite.key not in only) or suite.source:  # a source's suites ran it
            continue
        try:
            info["seconds"][suite.key] = round(run_suite(suite, size, present, res, work), 1)
        except RuntimeError as e:  # the page says so; the other suites still run
            print(f"page: {suite.script} failed:\n{e}", file=sys.stderr, flush=True)
            info.setdefault("failed", {})[suite.key] = str(e)
    info["seconds"]["total"] = round(time.perf_counter() - t0, 1)
    (res / "run.json").write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(work / "stores", ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", dest="size", action="store_const", const="quick")
    g.add_argument("--tiny", dest="size", action="store_const", const="tiny")
    ap.set_defaults(size="full")
    ap.add_argument("--out", default=str(ROOT / "docs"), help="the page's directory (docs)")
    ap.add_argument("--work", default="/tmp/shardwise-bench-page", help="sources and stores")
    ap.add_argument("--only", default="", help="comma-separated suites (default: all)")
    ap.add_argument("--render", action="store_true", help="only write the page again")
    a = ap.parse_args()
    out = Path(a.out)
    if not a.render:
        run(a.size, out, Path(a.work), [s for s in a.only.split(",") if s])
    page_render.write_page(out)
    print(f"page: {out / 'benchmarks.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
