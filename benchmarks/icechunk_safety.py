#!/usr/bin/env python
"""Misaligned dask chunks into an icechunk repository: what each writer loses, and its time.

The array: 100 x 100 float64 (values 1..10,000), inner chunks 10 x 10, shards 50 x 50, dask
chunks 25 x 25 (four dask blocks per shard). Each case writes it into a new local-filesystem
repository, merges (where the writer hands back a fork) and commits; the branch is then read
back by zarr-python and compared with the source: ``lost`` is the number of elements that
differ (of 10,000).

Cases:

* ``store_dask``      ``icechunk.dask.store_dask`` into a fork of the session (the array created
  first by zarr-python with the same chunks and shards), the returned fork merged;
* ``xr-default``      ``icechunk.xarray.to_icechunk(ds, session)``: xarray's chunk check refuses
  (the error's type is recorded, nothing is written);
* ``xr-align``        the same with ``align_chunks=True`` (a rechunk to the shards);
* ``xr-unsafe``       the same with ``safe_chunks=False``;
* ``shardwise``       ``shardwise.write_array(source, session, ..., commit=...)``.

Each on the dask schedulers ``sync``, ``threads`` and ``processes`` (2 workers); repetitions are
interleaved (rep 0 of every case, then rep 1, ...), after one write of each case on ``sync``
that is not recorded (the imports and first calls). Per case and scheduler the report gives the
median of ``lost`` with its range over the repetitions, and the median wall time (the write,
the merge and the commit; not the read-back) with its range.

Usage::

    python benchmarks/icechunk_safety.py run [--small] [--reps 5] [--dir D] [--out FILE.jsonl]
    python benchmarks/icechunk_safety.py report FILE.jsonl

``--small``: one repetition on ``sync`` and ``threads`` only (a smoke run: its figures are not
the benchmark's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

SHAPE, INNER, SHARDS, BLOCKS = (100, 100), (10, 10), (50, 50), (25, 25)
CASES = ("store_dask", "xr-default", "xr-align", "xr-unsafe", "shardwise")
SCHEDULERS = ("sync", "threads", "processes")


def source() -> np.ndarray:
    return np.arange(1, SHAPE[0] * SHAPE[1] + 1, dtype="f8").reshape(SHAPE)


def new_repo(root: str) -> Any:
    import icechunk

    return icechunk.Repository.create(icechunk.local_filesystem_storage(root))


def dataset() -> Any:
    import dask.array as da
    import xarray as xr

    return xr.Dataset({"a": (("y", "x"), da.from_array(source(), chunks=BLOCKS))})


ENCODING = {"a": {"chunks": INNER, "shards": SHARDS}}


def w_store_dask(session: Any) -> None:
    import dask.array as da
    import zarr
    from icechunk.dask import store_dask

    zarr.create_array(session.store, name="a", shape=SHAPE, dtype="f8", chunks=INNER, shards=SHARDS)
    fork = session.fork()
    target = zarr.open_array(fork.store, path="a", mode="a")
    session.merge(store_dask(sources=[da.from_array(source(), chunks=BLOCKS)], targets=[target]))
    session.commit("store_dask")


def w_xarray(**kw: Any) -> Callable[[Any], None]:
    def write(session: Any) -> None:
        from icechunk.xarray import to_icechunk

        to_icechunk(dataset(), session, encoding=ENCODING, **kw)
        session.commit("to_icechunk")

    return write


def w_shardwise(session: Any) -> None:
    import dask.array as da

    import shardwise

    shardwise.write_array(
        da.from_array(source(), chunks=BLOCKS),
        session,
        path="a",
        chunks=INNER,
        shards=SHARDS,
        commit="shardwise",
    )


WRITERS: dict[str, Callable[[Any], None]] = {
    "store_dask": w_store_dask,
    "xr-default": w_xarray(),
    "xr-align": w_xarray(align_chunks=True),
    "xr-unsafe": w_xarray(safe_chunks=False),
    "shardwise": w_shardwise,
}


def one(case: str, scheduler: str, root: str) -> dict[str, Any]:
    """One write of ``case`` on ``scheduler`` into a new repository at ``root``."""
    import dask
    import zarr

    repo = new_repo(root)
    session = repo.writable_session("main")
    rec: dict[str, Any] = {"case": case, "scheduler": scheduler}
    conf = {"scheduler": scheduler} | ({"num_workers": 2} if scheduler != "sync" else {})
    started = time.perf_counter()
    try:
        with dask.config.set(conf):
            WRITERS[case](session)
    except Exception as e:  # a writer's refusal is a result (xr-default's)
        rec.update(seconds=time.perf_counter() - started, lost=None, error=type(e).__name__)
        return rec
    rec["seconds"] = time.perf_counter() - started
    back = zarr.open_array(repo.readonly_session("main").store, path="a", mode="r")[:]
    rec.update(lost=int((np.asarray(back) != source()).sum()), error=None)
    return rec


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    reps = 1 if args.small else args.reps
    schedulers = SCHEDULERS[:2] if args.small else SCHEDULERS
    base = tempfile.mkdtemp(prefix="icechunk-safety-", dir=args.dir)
    out: list[dict[str, Any]] = []
    try:
        for case in CASES:  # a warm-up of each case, not recorded: the imports, first calls
            one(case, "sync", os.path.join(base, f"warm-{case}"))
        for rep in range(reps):
            for case in CASES:
                for scheduler in schedulers:
                    root = os.path.join(base, f"{case}-{scheduler}-{rep}")
                    rec = one(case, scheduler, root) | {"rep": rep, "small": args.small}
                    shutil.rmtree(root, ignore_errors=True)
                    out.append(rec)
                    print(json.dumps(rec), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in out)
    return out


def _spread(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


def report(recs: list[dict[str, Any]]) -> str:
    """A table: per case and scheduler, elements lost and seconds (median [min-max])."""
    rows = [
        "| case | scheduler | reps | elements lost of 10,000 | seconds | error |",
        "|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["case"], r["scheduler"]) for r in recs}, key=lambda k: (
        CASES.index(k[0]), SCHEDULERS.index(k[1])))  # fmt: skip
    for case, sched in keys:
        got = [r for r in recs if (r["case"], r["scheduler"]) == (case, sched)]
        lost = [r["lost"] for r in got if r["lost"] is not None]
        errors = sorted({r["error"] for r in got if r["error"]})
        rows.append(
            f"| {case} | {sched} | {len(got)} | {_spread(lost, 'd') if lost else '-'} | "
            f"{_spread([r['seconds'] for r in got], '.3f')} | {', '.join(errors) or '-'} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--small", action="store_true")
    r.add_argument("--reps", type=int, default=5)
    r.add_argument("--dir", default=None)
    r.add_argument("--out", default=None)
    p = sub.add_parser("report")
    p.add_argument("file")
    args = ap.parse_args()
    if args.cmd == "run":
        recs = run(args)
    else:
        with open(args.file) as f:
            recs = [json.loads(x) for x in f if x.strip()]
    print(report(recs))


if __name__ == "__main__":
    main()
