#!/usr/bin/env python
"""Fixed costs per call and per shard: shardwise at ``--head`` against an earlier commit
(``--ref``; both exported with ``git archive``) and tensorstore, interleaved, a fresh process
a case.

Cases: the small W3 dask write (``bench.py case W3 s-w-shards --size small``), its numpy write
(``s-w-numpy``) and its read (``h-sw-array``) beside tensorstore's (``f2-ts-full-nosync``,
``h-ts``); ``stream.py`` specs A and B, variant ``chunks`` (one frame a shard), shardwise and
tensorstore; ``million.py child runs N --run`` (N tiny shards on this process's threads).
Per case: the in-process seconds the script reports (bench: ``wall_s``; stream: ``seconds``;
million: ``wall_s``) and the whole process (launch to exit, the bench cases' check of the
written store included).

    python benchmarks/overhead.py --ref 0684a73 --reps 3 --million 20000 --out F.jsonl
    python benchmarks/overhead.py --ref 0684a73 --reps 5 --only stream,s-w-shards,ts-full \\
        --out F.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from against_ref import export_ref  # noqa: E402

BENCH = [("s-w-shards", "f2-ts-full-nosync"), ("s-w-numpy", None), ("h-sw-array", "h-ts")]


def _run(cmd: list[str], src: Path | None) -> tuple[dict, float]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    whole = time.perf_counter() - t0
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    return (json.loads(lines[-1]) if lines else {"error": out.stderr[-300:]}), whole


def cases(n: int) -> list[tuple[str, list[str], str, bool]]:
    """(name, command, key of the in-process seconds, shardwise: run with both versions)."""
    py, out = sys.executable, []
    for sw, ts in BENCH:
        for case in (sw, ts):
            if case is not None:
                cmd = [py, str(HERE / "bench.py"), "case", "W3", case, "--size", "small"]
                out.append((f"W3 {case}", cmd, "wall_s", case == sw))
    for spec in ("A", "B"):
        for writer in ("shardwise", "tensorstore"):
            cmd = [py, str(HERE / "stream.py"), "case", spec, "chunks", writer, "ROOT"]
            out.append((f"stream {spec} chunks {writer}", cmd, "seconds", writer == "shardwise"))
    cmd = [py, str(HERE / "million.py"), "child", "runs", str(n), "--run"]
    out.append((f"million runs {n}", cmd, "wall_s", True))
    return out


def summary(recs: list[dict]) -> str:
    rows = [
        "| case | version | in-process s (median, min-max) | whole process s |",
        "|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["name"] for r in recs):
        for v in ("ref", "head", "anchor"):
            got = [r for r in recs if r["name"] == name and r["version"] == v and r.get("s")]
            if got:
                s, w = [r["s"] for r in got], [r["whole"] for r in got]
                rows.append(
                    f"| {name} | {v} | {statistics.median(s):.3f} ({min(s):.3f}-{max(s):.3f}) "
                    f"| {statistics.median(w):.2f} ({min(w):.2f}-{max(w):.2f}) |"
                )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True)
    ap.add_argument("--head", default="HEAD", help="the revision measured as head (exported too)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--million", type=int, default=20000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="cases whose name holds one of these (comma list)")
    args = ap.parse_args()
    sha, src = export_ref(args.ref)
    head = export_ref(args.head)[1]
    recs: list[dict] = []
    with open(args.out, "a") as f:
        for rep in range(args.reps):
            for name, cmd, key, sw in cases(args.million):
                if args.only and not any(w in name for w in args.only.split(",")):
                    continue
                order = [("head", head), ("ref", src)] if sw else [("anchor", head)]
                for version, where in order if rep % 2 == 0 else order[::-1]:
                    with tempfile.TemporaryDirectory() as d:
                        got, whole = _run([d + "/a.zarr" if c == "ROOT" else c for c in cmd], where)
                    rec = dict(name=name, version=version, rep=rep, ref=sha, whole=whole)
                    rec.update(s=got.get(key), error=got.get("error"))
                    print(json.dumps(rec), flush=True)
                    f.write(json.dumps(rec) + "\n")
                    recs.append(rec)
    print(summary(recs))


if __name__ == "__main__":
    main()
