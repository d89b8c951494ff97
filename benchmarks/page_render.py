"""The benchmarks page from the results ``page.py`` collected: markdown tables (median, min-max,
ratios to shardwise and to the machine's limit), a plot per table (medians with min-max bars)
and the section that says how to get the same figures again."""

from __future__ import annotations

import json
import re
import shlex
import statistics
from pathlib import Path
from typing import Any

from page_catalog import SUITES
from page_suites import LIBS, LIMIT, TOOLS, Suite, rows

COMMAND = "bash dev.sh bench-page"
SIZE_FLAG = {"full": "", "tiny": " --tiny", "quick": " --quick"}
SIZE_TEXT = {
    "full": "the default size (the workloads' full arrays where a run stays in minutes)",
    "quick": "the quick size (small arrays: the ratios are indications, not the published "
    "figures of benchmarks/README.md)",
    "tiny": "the tiny size (a smoke run: its figures say nothing of speed)",
}
LOG = "benchmark-log.md"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _stats(rs: list[dict[str, Any]]) -> dict[str, Any]:
    ss = [r["s"] for r in rs if r["s"] is not None and r["ok"]]
    whole = [r["whole"] for r in rs if r["whole"] is not None and r["ok"]]
    return {
        "n": len(ss),
        "failed": len(rs) - len(ss),
        "med": statistics.median(ss) if ss else None,
        "lo": min(ss) if ss else None,
        "hi": max(ss) if ss else None,
        "whole": statistics.median(whole) if whole else None,
    }


def _table(s: Suite, name: str, rs: list[dict[str, Any]], absent: list[str]) -> list[dict]:
    """The rows of one table: one per case measured, in the suite's order, then the absent."""
    lines = []
    for case, (tool, what) in s.cases.items():
        mine = [r for r in rs if r["case"] == case]
        if mine:
            lines.append({"tool": tool, "case": case, "what": what, **_stats(mine)})
    lim = [r for r in rs if r["tool"] == LIMIT and r["case"] not in s.cases]
    if lim:
        lines.append({"tool": LIMIT, "case": LIMIT, "what": lim[0]["what"], **_stats(lim)})
    mine = [x for x in lines if x["tool"] == s.ref]
    ref = next((x for x in mine if x["case"] == s.ref_case), mine[0] if mine else None)
    limit = next((x for x in lines if x["tool"] == LIMIT), None)
    for x in lines:
        x["x_ref"] = x["med"] / ref["med"] if ref and ref["med"] and x["med"] else None
        x["x_lim"] = x["med"] / limit["med"] if limit and limit["med"] and x["med"] else None
    for tool in absent:
        if any(x["tool"] == tool for x in lines):
            continue
        lines.append({"tool": tool, "case": "", "what": "absent: not installed", "n": 0})
    return lines


def _markdown(lines: list[dict[str, Any]], has_whole: bool, unit: str) -> list[str]:
    head = f"| tool | case | what | n | median {unit} | min-max {unit} | x shardwise | x limit |"
    sep = "|---|---|---|---|---|---|---|---|"
    if has_whole:
        head, sep = head + " whole-process s |", sep + "---|"
    out = [head, sep]
    for x in lines:
        if x["n"] == 0:
            status = "absent" if x["case"] == "" else f"failed ({x['failed']} runs)"
            out.append(f"| {x['tool']} | {x['case']} | {x['what']} | 0 | {status} | | | |"
                       + (" |" if has_whole else ""))  # fmt: skip
            continue
        cells = [
            x["tool"], f"`{x['case']}`", x["what"], str(x["n"]), _fmt(x["med"]),
            f"{_fmt(x['lo'])}-{_fmt(x['hi'])}",
            f"{x['x_ref']:.2f}" if x["x_ref"] else "", f"{x['x_lim']:.2f}" if x["x_lim"] else "",
        ]  # fmt: skip
        if has_whole:
            cells.append(_fmt(x["whole"]))
        if x["failed"]:
            cells[3] += f" ({x['failed']} failed)"
        out.append("| " + " | ".join(cells) + " |")
    return out


def _plot(lines: list[dict[str, Any]], title: str, path: Path, unit: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: small, searchable files
    matplotlib.rcParams["svg.hashsalt"] = "shardwise"  # the same ids every run
    done = [x for x in lines if x["n"]]
    labels = [f"{x['tool']}: {x['case']}" for x in done]
    med = [x["med"] for x in done]
    err = [[x["med"] - x["lo"] for x in done], [x["hi"] - x["med"] for x in done]]
    palette = {"shardwise": "#1f77b4", LIMIT: "#2ca02c"}
    colors = [palette.get(x["tool"], "#999999") for x in done]
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(done) + 1.2))
    ax.barh(range(len(done)), med, xerr=err, color=colors, capsize=3)
    ax.set_yticks(range(len(done)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"{'seconds' if unit == 's' else unit} (median, min-max bars)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def _glance(s: Suite, name: str, lines: list[dict[str, Any]]) -> str:
    """One line of the summary: shardwise's reference case, each peer's best ratio to it."""
    ref = next((x for x in lines if x["n"] and x.get("x_ref") == 1.0), None)
    peers = {}
    for x in lines:
        if x["n"] and x["tool"] not in ("shardwise", LIMIT) and x["x_ref"]:
            peers[x["tool"]] = min(peers.get(x["tool"], x["x_ref"]), x["x_ref"])
    absent = [x["tool"] for x in lines if x["case"] == ""]
    cells = [f"{t} {r:.2f}" for t, r in peers.items()] + [f"{t} absent" for t in absent]
    mine = f"`{ref['case']}` {_fmt(ref['med'])} {s.unit}" if ref else ""
    lim = f"{ref['x_lim']:.2f}" if ref and ref.get("x_lim") else ""
    return f"| {s.key}: {name} | {mine} | {', '.join(cells)} | {lim} |"


def _suite_section(
    s: Suite, recs: list[dict[str, Any]], info: dict[str, Any], out: Path, glance: list[str]
) -> list[str]:
    tools = info["tools"]
    absent = sorted({t for t, _ in s.cases.values() if t != LIMIT and not tools[t]["present"]})
    text = [f"## {s.title}", "", f"`benchmarks/{s.script}`: {s.about}.", ""]
    if s.key in info.get("failed", {}):
        err = info["failed"][s.key].replace("\n", " ").replace("`", "'")[-300:]
        text += [f"**The script failed in this run** (its last words: `{err}`).", ""]
    if not recs:
        return [*text, "Not run in this page's run.", ""]
    if s.source:
        text += [f"From the results of the suites {', '.join(s.source)} (nothing runs).", ""]
    else:
        argv = s.args[info["size"]]  # without the stores' directory (the run's own)
        args = shlex.join(
            a
            for i, a in enumerate(argv)
            if "{dir}" not in a and (i + 1 == len(argv) or "{dir}" not in argv[i + 1])
        )
        cases = f" (and `{s.case_flag}` the cases below)" if s.case_flag else ""
        text += [f"Options of this run: `{args}`{cases}.", ""]
    got = rows(s, recs)
    for name in dict.fromkeys(r["table"] for r in got):
        rs = [r for r in got if r["table"] == name]
        lines = _table(s, name, rs, absent)
        glance.append(_glance(s, name, lines))
        label = f"{s.title.split(':')[0]}: {name}"
        fig = f"{s.key}-{_slug(name)}.svg"
        _plot(lines, label, out / "benchmarks" / fig, s.unit)
        has_whole = any(r["whole"] is not None for r in rs)
        text += [f"### {s.key}: {name}", "", s.caption(name, recs) + ":", ""]
        text += [*_markdown(lines, has_whole, s.unit), ""]
        text += [f"![{label}](benchmarks/{fig})", ""]
    return text


def _reproduce(info: dict[str, Any]) -> list[str]:
    m, tools = info["machine"], info["tools"]
    cmd = COMMAND + SIZE_FLAG[info["size"]]
    vers = []
    for name in [*TOOLS, *LIBS]:
        t = tools.get(name, {"present": False})
        vers.append(f"| {name} | {t['version'] if t['present'] else 'absent (not installed)'} |")
    secs = ", ".join(f"{k} {v:.0f} s" for k, v in info["seconds"].items())
    return [
        "## Reproduce",
        "",
        "Every figure on this page comes from one command, run from the repository root "
        "(`dev.sh` sets up `.venv` first); it writes this page, its plots and the raw results "
        "(`docs/benchmarks/results/`, one JSON line per case and repetition) again on your "
        "machine:",
        "",
        "<!-- docs-test: skip (runs the benchmarks: minutes to tens of minutes) -->",
        "```bash",
        cmd,
        "```",
        "",
        "`--quick` runs small arrays in minutes, `--tiny` is a smoke run of seconds, with no "
        "flag the default size; `python benchmarks/page.py --render` writes the page again "
        "from the results already there. A tool that does not import is not run and is listed "
        "as absent (install it and run the command again).",
        "",
        f"This page: {SIZE_TEXT[info['size']]}, run {info['date']} at commit "
        f"`{info['commit']}`; the run took {secs}.",
        "",
        "| machine | |",
        "|---|---|",
        f"| CPU | {m['cpu']} |",
        f"| cores | {m['cores']} |",
        f"| RAM | {m['ram_gib']} GiB |",
        f"| OS | {m['os']} |",
        f"| disk of the stores | {m['disk']} |",
        f"| load average before the run | {' '.join(map(str, m['load_before']))} |",
        "",
        "| software | version |",
        "|---|---|",
        f"| python | {m['python']} |",
        *vers,
        "",
        "zarrs (zarr-python's Rust codec pipeline; `dev.sh` installs it beside the venv) is "
        "listed for the record: no script of this page measures it. acquire-zarr is installed "
        "the same way (`pip install --no-deps --target .venv/side/acquire-zarr`), and the "
        "stream suite puts it on its cases' path.",
        "",
    ]


def write_page(out: Path) -> None:
    """``out/benchmarks.md`` and its plots from ``out/benchmarks/results/``."""
    res = out / "benchmarks" / "results"
    info = json.loads((res / "run.json").read_text())
    for old in (out / "benchmarks").glob("*.svg"):
        old.unlink()
    tools = info["tools"]
    text = [
        "# Benchmarks",
        "",
        "shardwise side by side with the tools it is compared with, every figure measured in "
        "one run on one machine by the scripts of `benchmarks/` (each case in a fresh process, "
        "repetitions interleaved, every written store read back and compared with its source). "
        "Seconds are medians with their min-max over the repetitions; `x shardwise` is the "
        "median over shardwise's (above 1: slower than shardwise), `x limit` over the "
        "machine's limit for the same bytes where the script measures one (no writer or reader "
        "can beat it). [Reproduce](#reproduce) says how to get every figure again on your "
        f"machine with one command; the [benchmark log]({LOG}) holds the detailed runs, "
        "profiles and the history behind them.",
        "",
        f"**This page is {SIZE_TEXT[info['size']]}**, run {info['date']} on the machine "
        "described under [Reproduce](#reproduce), its load average before the run "
        f"{' '.join(map(str, info['machine']['load_before']))} (1, 5 and 15 minutes; the "
        f"machine has {info['machine']['cores']} cores).",
        "",
        "| tool | version | what |",
        "|---|---|---|",
    ]
    for name, (_, _, what) in TOOLS.items():
        t = tools.get(name, {"present": False})
        text.append(f"| {name} | {t['version'] if t['present'] else 'absent'} | {what} |")
    text.append("")
    body: list[str] = []
    glance: list[str] = []
    for s in SUITES:
        recs = []
        for key in s.source or (s.key,):
            f = res / f"{key}.jsonl"
            recs += (
                [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
                if f.exists()
                else []
            )
        body += _suite_section(s, recs, info, out, glance)
    text += [
        "## At a glance",
        "",
        "Each table's shardwise case, each peer's best case as a multiple of it (above 1: "
        "slower than shardwise) and shardwise's as a multiple of the machine's limit:",
        "",
        "| table | shardwise median | peers, x shardwise | shardwise x limit |",
        "|---|---|---|---|",
        *glance,
        "",
        *body,
        *_reproduce(info),
    ]
    (out / "benchmarks.md").write_text("\n".join(text).rstrip("\n") + "\n")
