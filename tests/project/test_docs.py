"""Every ```python and ```bash block of README.md and of every page of the site (docs/**/*.md)
runs as written.

A document's blocks run in the order a reader meets them, in one fresh process per document whose
working directory is a temp directory set up like the repository root (its top-level entries and
``.venv`` linked in, so ``.venv/bin/python examples/demo.py`` works there); whatever the blocks
write lands in that temp directory. The python blocks share one namespace, as if pasted one after
another into one interpreter; the bash blocks run with ``bash -e`` and the venv's ``bin`` first on
``PATH``.

Conventions in the documents (HTML comments, invisible when rendered), on the line(s) right before
a block:

* ``<!-- docs-test: skip (REASON) -->``: the block is not run; each such block is reported as a
  skipped test with its reason (``pytest -rs`` lists them), never silently;
* ``<!-- docs-test: cluster -->``: the block runs with a ``dask.distributed`` client of a real
  ``LocalCluster`` (2 worker processes) active;
* ``<!-- docs-test: file NAME -->``: the block is the content of the file NAME (a script a later
  block runs): it is written into the working directory, not run.

A ```text block right after a python or bash block (only blank lines between) is that block's
printed output: what the block prints to stdout must match it, line ends stripped, where ``...``
matches any text (also across lines).

Commands that must never run in a test (set-up, the whole suite, a scheduler) are listed in
``MUST_BE_MARKED`` with the reason; a block holding one without a ``skip`` marker fails the test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the README and every markdown page of the site, its guides included (not a build's copies)
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts),
]
RUNNABLE = ("python", "bash")

# reviewed: commands a docs block may show but the test must not run, and why
MUST_BE_MARKED = {
    r"\bdev\.sh\b": "sets up a venv and runs the whole suite",
    r"\bpip install\b": "installs packages",
    r"\bjupyter\b": "starts a notebook server",
    r"(?m)(-m pytest|^\s*pytest)\b": "runs (part of) the test suite",
    r"\b(sbatch|srun|squeue)\b|#SBATCH": "needs SLURM",
    r"\bdask_jobqueue\b": "needs a batch scheduler (dask-jobqueue)",
    r"s3://": "needs an S3 server",
}

MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<kind>skip|cluster|file)\b\s*(?P<arg>.*?)\s*-->")
# a code block (```python) or a MyST directive (```{toctree}, ```{include} FILE): the latter
# never runs
FENCE = re.compile(r"^```(?:(?P<lang>[\w+-]*)\s*|(?P<directive>\{[\w:-]+\}).*)$")


@dataclass
class Block:
    """One fenced code block: its language, code, line (1-based, of the opening fence), the
    docs-test marker before it, and the ```text block after it (the expected output)."""

    lang: str
    code: str
    line: int
    kind: str = "run"  # run | skip | cluster | file
    arg: str = ""
    expected: str | None = None


def parse(text: str) -> list[Block]:
    """The fenced blocks of a markdown text, with their markers and expected outputs attached."""
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: tuple[str, str] | None = None  # a marker waiting for its block
    after_code = False  # only blank lines since the last runnable block closed
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            mark = MARKER.search(lines[i])
            if mark:
                pending = (mark["kind"], mark["arg"].strip("() "))
            elif lines[i].strip():
                if pending is not None:
                    raise ValueError(f"line {i + 1}: a docs-test marker not right before a block")
                after_code = False
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"line {i + 1}: unclosed code block")
        code = "\n".join(lines[i + 1 : end]) + "\n"
        lang = m["lang"] if m["directive"] is None else m["directive"]
        if lang == "text" and after_code and pending is None:
            blocks[-1].expected = code
        else:
            block = Block(lang, code, i + 1)
            if pending is not None:
                block.kind, block.arg = pending
                pending = None
            blocks.append(block)
        after_code = lang in RUNNABLE
        i = end + 1
    if pending is not None:
        raise ValueError("a docs-test marker at the end, with no block after it")
    return blocks


def runnable(doc: Path) -> list[Block]:
    return [b for b in parse(doc.read_text()) if b.lang in RUNNABLE]


def unmarked_commands(block: Block) -> list[str]:
    """Reasons of the MUST_BE_MARKED commands an unskipped block holds."""
    if block.kind == "skip":
        return []
    return [why for pat, why in MUST_BE_MARKED.items() if re.search(pat, block.code)]


def output_matches(expected: str, printed: str) -> bool:
    """``printed`` matches ``expected``, line ends and surrounding blank lines ignored, where
    ``...`` in ``expected`` stands for any text."""

    def norm(s: str) -> str:
        return "\n".join(line.rstrip() for line in s.strip("\n").splitlines())

    pattern = ".*?".join(re.escape(part) for part in norm(expected).split("..."))
    return re.fullmatch(pattern, norm(printed), flags=re.DOTALL) is not None


# -- the tests ------------------------------------------------------------------------------------


def _rel(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


SKIPPED = [
    pytest.param(doc, b, id=f"{_rel(doc)}:{b.line}")
    for doc in DOCS
    for b in runnable(doc)
    if b.kind == "skip"
]


@pytest.mark.parametrize(("doc", "block"), SKIPPED)
def test_marked_block_is_reported_not_run(doc: Path, block: Block) -> None:
    assert block.arg, f"{_rel(doc)}:{block.line}: a skip marker needs its reason in ()"
    pytest.skip(f"{_rel(doc)}:{block.line} not run: {block.arg}")


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_commands_that_must_not_run_are_marked(doc: Path) -> None:
    blocks = runnable(doc)
    bad = [(b.line, why) for b in blocks for why in unmarked_commands(b)]
    assert not bad, f"{_rel(doc)}: blocks to mark <!-- docs-test: skip (why) -->: {bad}"
    unnamed = [b.line for b in blocks if b.kind == "file" and not b.arg]
    assert not unnamed, f"{_rel(doc)}: file markers without a file name at lines {unnamed}"


@pytest.mark.slow  # a process per document, processes and a cluster inside
@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_document_runs_as_written(doc: Path, tmp_path: Path) -> None:
    blocks = runnable(doc)
    assert not any(unmarked_commands(b) for b in blocks)  # see the test above
    work = _sandbox(tmp_path)
    results = _run(blocks, work, tmp_path)
    for b, r in zip(blocks, results, strict=False):
        where = f"{_rel(doc)}:{b.line} ({b.lang})"
        assert r["error"] is None, f"{where} fails as written:\n{b.code}\n{r['error']}"
        if b.expected is not None:
            assert output_matches(b.expected, r["out"]), (
                f"{where} printed\n{r['out']}\nwhile the document shows\n{b.expected}"
            )
    assert len(results) == len(blocks)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_documented_batch_part_resumes(doc: Path) -> None:
    """A ``batch part`` in a document's code is run again after a kill or a requeue: without
    ``--resume`` the rerun would write every shard of its part again."""
    for block in parse(doc.read_text()):
        if block.lang not in RUNNABLE:
            continue
        # a command's continued lines joined into one
        for command in block.code.replace("\\\n", " ").splitlines():
            for part in command.split("shardwise batch part")[1:]:
                words = part.split("&")[0].split(";")[0].split()
                assert "--resume" in words, (_rel(doc), block.line, command)


def test_parse_attaches_markers_and_outputs() -> None:
    text = "\n".join(
        [
            "Intro.",
            "```python",
            "print(1)",
            "```",
            "",
            "```text",
            "1",
            "```",
            "<!-- docs-test: skip (needs SLURM) -->",
            "```bash",
            "sbatch job.sh",
            "```",
            "Prose, then a text block that is no output:",
            "```text",
            "a listing",
            "```",
            "<!-- docs-test: file part.py -->",
            "",
            "```python",
            "x = 1",
            "```",
        ]
    )
    blocks = parse(text)
    assert [(b.lang, b.line, b.kind, b.arg) for b in blocks] == [
        ("python", 2, "run", ""),
        ("bash", 10, "skip", "needs SLURM"),
        ("text", 14, "run", ""),
        ("python", 19, "file", "part.py"),
    ]
    assert blocks[0].expected == "1\n"
    assert blocks[1].expected is None and blocks[3].expected is None
    assert unmarked_commands(blocks[1]) == []
    assert unmarked_commands(Block("bash", "sbatch x.sh\n", 1)) == ["needs SLURM"]
    with pytest.raises(ValueError, match="not right before a block"):
        parse("<!-- docs-test: cluster -->\nprose\n```python\nx\n```\n")


def test_output_wildcards() -> None:
    assert output_matches("wrote 4 shards in ... s\n", "wrote 4 shards in 0.31 s  \n\n")
    assert output_matches("a\n...\nz", "a\nb\nc\nz")
    assert not output_matches("wrote 4 shards", "wrote 5 shards")
    assert not output_matches("a\nb", "a\nb\nc")


# -- running a document in its own process -------------------------------------------------------


def _sandbox(tmp: Path) -> Path:
    """A directory that looks like the repository root to a reader's commands: the top-level
    entries linked in, ``.venv`` the venv running the tests; new files land in it, not in the
    repository."""
    work = tmp / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in ("build", "dist"):
            (work / entry.name).symlink_to(entry)
    (work / ".venv").symlink_to(sys.prefix)
    return work


def _run(blocks: list[Block], work: Path, tmp: Path) -> list[dict[str, str | None]]:
    spec, out = tmp / "blocks.json", tmp / "results.json"
    spec.write_text(json.dumps([asdict(b) for b in blocks]))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT / "src"),
        "TMPDIR": str(tmp),
        "MPLBACKEND": "Agg",
    }
    proc = subprocess.run(
        [sys.executable, __file__, str(spec), str(out)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results: list[dict[str, str | None]] = json.loads(out.read_text())
    return results


def _warning_filters() -> None:
    """The suite's warning filters (pyproject.toml): a documented snippet must not warn either."""
    import builtins
    import warnings

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for spec in conf["tool"]["pytest"]["ini_options"]["filterwarnings"]:
        action, message, category, module = [*spec.split(":"), "", "", ""][:4]
        cat = getattr(builtins, category, Warning) if category else Warning
        warnings.filterwarnings(action, message=message, category=cat, module=module)  # type: ignore[arg-type]


def _cluster(stack: Any) -> None:
    """A client of a real LocalCluster (worker processes), closed when ``stack`` closes."""
    from distributed import Client, LocalCluster

    cluster = stack.enter_context(
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")
    )
    stack.enter_context(Client(cluster))


def _run_block(block: dict[str, str], namespace: dict[str, object]) -> str:
    import contextlib
    import io

    if block["kind"] == "file":
        Path(block["arg"]).write_text(block["code"])
        return ""
    if block["lang"] == "bash":
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block["code"]],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode:
            raise RuntimeError(f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
        return proc.stdout
    buf = io.StringIO()
    with contextlib.ExitStack() as stack:
        if block["kind"] == "cluster":
            _cluster(stack)
        with contextlib.redirect_stdout(buf):
            exec(compile(block["code"], f"block@{block['line']}", "exec"), namespace)
    return buf.getvalue()


def main(spec: str, out: str) -> None:
    """Run the blocks of ``spec`` in order; write each one's output (or its error) to ``out``,
    stopping at the first error."""
    import traceback

    sys.path[0] = os.getcwd()  # as for a reader's interpreter: the working directory, not tests/
    _warning_filters()
    results: list[dict[str, str | None]] = []
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in json.loads(Path(spec).read_text()):
        if block["kind"] == "skip":
            results.append({"out": "", "error": None})
            continue
        try:
            results.append({"out": _run_block(block, namespace), "error": None})
        except BaseException:
            results.append({"out": "", "error": traceback.format_exc()})
            break
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
