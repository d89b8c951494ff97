"""The same shardwise cases with this checkout's code and with an earlier commit's, interleaved.

For "no slower than before" questions: ``bench.py case`` runs each case in a fresh process; here
the case runs once with this checkout's ``src`` and once with the ``src`` of ``--ref`` (exported
with ``git archive`` into a temp dir and put first on ``PYTHONPATH``), alternating which goes
first, ``--reps`` times. The case code (``bench.py``) is this checkout's for both, so a case must
only use API the earlier commit has. Each run is one JSON line in ``--out`` with ``version`` =
``head`` or ``ref``; the summary gives medians, spreads and the head/ref ratio.

    python benchmarks/against_ref.py --ref 5d1f553 --workloads W3,W1,W2 --reps 3 \\
        --out benchmarks/results/against-ref.jsonl
    python benchmarks/against_ref.py --ref 5d1f553 --workloads W3,W1 \\
        --cases s-w-shards,s-w-numpy,h-sw-array --out benchmarks/results/against-ref.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# the shard-aligned write of each workload (W2 through to_zarr, as its users write it)
CASES = {"W1": ["s-w-shards"], "W2": ["s-xr-w"], "W3": ["s-w-shards"]}


def export_ref(ref: str) -> tuple[str, Path]:
    """The full commit id of ``ref`` and a directory holding its ``src``."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", ref], check=True, capture_output=True, text=True
    ).stdout.strip()
    dest = Path(tempfile.gettempdir()) / f"shardwise-ref-{sha[:12]}"
    if not (dest / "src" / "shardwise").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", sha, "src"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return sha, dest / "src"


def run_case(wl: str, case: str, rep: int, size: str, src: Path | None) -> dict:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    fd, tmp = tempfile.mkstemp(prefix="against-ref-", suffix=".jsonl")
    os.close(fd)
    cmd = [sys.executable, str(HERE / "bench.py"), "case", wl, case, "--rep", str(rep)]
    subprocess.run([*cmd, "--size", size, "--out", tmp], env=env, check=False)
    with open(tmp) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    os.unlink(tmp)
    return lines[-1] if lines else {"workload": wl, "case": case, "status": "failed"}


def imported_from(src: Path | None) -> str:
    """Where a case process with this ``src`` imports shardwise from."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    code = "import shardwise; print(shardwise.__file__)"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def summary(recs: list[dict]) -> str:
    rows = ["| workload | case | head wall s (median, min-max) | ref wall s | head/ref |"]
    rows.append("|---|---|---|---|---|")
    keys = sorted({(r["workload"], r["case"]) for r in recs})
    for wl, case in keys:
        walls = {}
        for v in ("head", "ref"):
            walls[v] = [
                r["wall_s"]
                for r in recs
                if (r["workload"], r["case"], r.get("version")) == (wl, case, v) and "wall_s" in r
            ]
        if not walls["head"] or not walls["ref"]:
            rows.append(f"| {wl} | {case} | failed | failed | |")
            continue
        h, f = statistics.median(walls["head"]), statistics.median(walls["ref"])
        rows.append(
            f"| {wl} | {case} | {h:.2f} ({min(walls['head']):.2f}-{max(walls['head']):.2f}) "
            f"| {f:.2f} ({min(walls['ref']):.2f}-{max(walls['ref']):.2f}) | {h / f:.2f}x |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the earlier commit (any git revision)")
    ap.add_argument("--workloads", default="W3,W1,W2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size", default="full", choices=["full", "small"])
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--cases", default=None, help="bench.py cases to run for every workload (default: CASES)"
    )
    args = ap.parse_args()
    sha, src = export_ref(args.ref)
    where_from = {v: imported_from(w) for v, w in (("head", None), ("ref", src))}
    assert where_from["ref"].startswith(str(src)), where_from  # the ref's code, not this one's
    print(f"shardwise from: {where_from}", flush=True)
    recs: list[dict] = []
    with open(args.out, "a") as out:
        for rep in range(args.reps):
            for wl in args.workloads.split(","):
                for case in args.cases.split(",") if args.cases else CASES[wl]:
                    order = [("head", None), ("ref", src)]
                    for version, where in order if rep % 2 == 0 else order[::-1]:
                        rec = run_case(wl, case, rep, args.size, where)
                        rec.update(version=version, ref=sha, shardwise=where_from[version])
                        print(
                            f"{wl} {case} rep {rep} {version}: {rec.get('wall_s', 'failed')}",
                            flush=True,
                        )
                        out.write(json.dumps(rec, default=str) + "\n")
                        out.flush()
                        recs.append(rec)
    print(summary(recs))


if __name__ == "__main__":
    main()
