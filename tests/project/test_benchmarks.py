"""benchmarks/ runs from the project alone: ``bench.py list`` and a small run (generation, a
shardwise write and read, an anchor, the read store, the report) in fresh subprocesses, the
other scripts' small runs, and the benchmarks page's one command (``page.py --tiny``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench.py"


def bench(tmp: Path, *args: str) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "BENCH_SRC": str(tmp / "src"),
        "BENCH_STORES": str(tmp / "stores"),
    }
    env.pop("BENCH_SIZE", None)
    out = subprocess.run(
        [sys.executable, str(BENCH), *args],
        cwd=tmp,  # any directory: nothing is looked up relative to it
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return out.stdout


def test_bench_list(tmp_path: Path) -> None:
    text = bench(tmp_path, "list")
    for name in ("W1", "W2", "W3", "g-limits", "a-xr-threads", "f2-ts-full-nosync", "s-w-shards"):
        assert name in text
    assert "(8192, 8192)" in text  # the full workloads by default
    assert "(1024, 1024)" in bench(tmp_path, "list", "--size", "small")


@pytest.mark.slow
def test_bench_small_run_and_report(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    bench(
        tmp_path,
        "run",
        "--size",
        "small",
        "--workloads",
        "W3",
        "--cases",
        "s-w-shards,f2-ts-full-nosync,h-sw-array",
        "--reps",
        "1",
        "--out",
        str(out),
    )
    recs = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    env = [r for r in recs if r["case"] == "env"]
    assert env and env[0]["size"] == "small"
    cases = {r["case"]: r for r in recs if r["case"] != "env"}
    assert set(cases) == {"s-w-shards", "f2-ts-full-nosync", "h-sw-array"}
    for r in cases.values():
        assert r["status"] == "ok", r
        assert r["workload"] == "W3" and r["wall_s"] > 0
    assert cases["s-w-shards"]["verify"]["ok"] and cases["f2-ts-full-nosync"]["verify"]["ok"]
    assert cases["h-sw-array"]["read_ok"]
    # every case's store is gone, the read store too; the small source stays for the next run
    assert list((tmp_path / "stores").iterdir()) == []
    assert (tmp_path / "src" / "W3-small.npy").exists()
    text = bench(tmp_path, "report", str(out))
    assert "| W3 | s-w-shards | 1 |" in text
    assert "(1024, 1024)" in text  # the report uses the workloads the run measured


@pytest.mark.slow
def test_reads_small_run(tmp_path: Path) -> None:
    """reads.py generates its own data, then every case reads what tensorstore reads."""
    script = ROOT / "benchmarks" / "reads.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    common = ["--small", "--dir", str(tmp_path / "data"), "--workloads", "W2,W3"]
    out = tmp_path / "reads.jsonl"
    for args in (
        ["gen", *common],
        ["run", *common, "--reps", "1", "--cases", "ts,direct,array,array-graph,mean-dask"],
    ):
        if args[0] == "run":
            args += ["--out", str(out)]
        got = subprocess.run(
            [sys.executable, str(script), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    recs = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    recs = [r for r in recs if r.get("case") not in (None, "env")]
    assert {(r["workload"], r["case"]) for r in recs} == {
        (w, c) for w in ("W2", "W3") for c in ("ts", "direct", "array", "array-graph", "mean-dask")
    }
    assert [r for r in recs if "error" in r] == []
    for wl in ("W2", "W3"):
        mine = {r["case"]: r for r in recs if r["workload"] == wl}
        crc = mine["ts"]["crc"]
        assert all(mine[c]["crc"] == crc for c in ("direct", "array", "array-graph")), mine
        assert mine["mean-dask"]["mean"] == pytest.approx(mine["ts"]["mean"], rel=1e-5)


@pytest.mark.slow
def test_numpy_paths_small_run(tmp_path: Path) -> None:
    """numpy_paths.py on small W3: every library writes and reads, each write read back equal
    by another library, each read equal to the source; the stores are gone after the run."""
    script = ROOT / "benchmarks" / "numpy_paths.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BENCH_SRC": str(tmp_path / "src")}
    env.pop("BENCH_SIZE", None)
    out = tmp_path / "np.jsonl"
    common = ["--small", "--dir", str(tmp_path / "stores"), "--workloads", "W3", "--reps", "1"]
    got = subprocess.run(
        [sys.executable, str(script), "run", *common, "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    recs = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    libs = ("sw", "sw-dask", "ts", "zr", "limit")
    assert {r["case"] for r in recs} == {f"{lib}-{op}" for lib in libs for op in ("write", "read")}
    for r in recs:
        # the limits' frames decompress to the source's chunks; their read equals the source
        assert r["ok"] and r["size"] == "small", r
        assert r["s_whole"] > r["s_in"] > 0 and r["cpu_in"] > 0, r
        # numpy writes and reads run without dask: their processes never import it
        assert r["dask"] == r["case"].startswith("sw-dask"), r
    assert list((tmp_path / "stores").iterdir()) == []
    table = subprocess.run(
        [sys.executable, str(script), "report", str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| W3 | sw-write | 1 |" in table and "| W3 | zr-read | 1 |" in table
    assert "| W3 | limit-read | 1 |" in table and "W3 limit-read: the decompression alone" in table
    (limit_read,) = [r for r in recs if r["case"] == "limit-read"]
    assert 0 < limit_read["s_codec"] < limit_read["s_whole"]


@pytest.mark.slow
def test_pyramid_tiny_run(tmp_path: Path) -> None:
    """pyramid.py on its tiny volume: every case writes 5 levels zarr-python reads, level 0 equal
    to the source, the source read once (on the cluster too, counted in the workers), the
    one-thread cases at the image and its half with their peaks above a baseline, ome-zarr-py's
    levels halved on every axis, and ngff-zarr's levels differ from shardwise's only by the
    rounding of integer means."""
    script = ROOT / "benchmarks" / "pyramid.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BENCH_SRC": str(tmp_path / "src")}
    out = tmp_path / "pyr.jsonl"
    common = ["--tiny", "--reps", "1", "--images", "vol", "--dir", str(tmp_path / "stores")]
    got = subprocess.run(
        [sys.executable, str(script), "run", *common, "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    recs = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    cases = {r["case"]: r for r in recs}
    names = ("level0", "pyramid", "pyramid-cluster", "ngff", "omezarr", "task", "task-half")
    assert set(cases) == {*names, "compare"}
    for name in names:
        r = cases[name]
        side = 32 if name == "task-half" else 64  # the first half of every axis
        assert r["ok"] and r["read"] == r["src_bytes"] == side**3 * 2, r
        assert r["s_in"] > 0 and r["s_whole"] > r["s_in"] and r["rss"] >= r["base_rss"] > 0
        assert len(r["levels"]) == (1 if name == "level0" else 5)
    assert cases["pyramid"]["levels"][-1] == [4, 4, 4]
    assert cases["task-half"]["levels"][-1] == [2, 2, 2]
    assert (
        len(cases["pyramid-cluster"]["worker_rss"])
        == len(cases["pyramid-cluster"]["worker_held"])
        == 2
    )
    levels = cases["compare"]["levels"]
    assert levels[0]["differ"] == 0 and all(lv["max_gap"] <= 1 for lv in levels)
    assert all(lv["rules_hold"] for lv in levels[1:])
    assert list((tmp_path / "stores").iterdir()) == []  # every store removed after the run
    table = subprocess.run(
        [sys.executable, str(script), "report", str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| vol | pyramid-cluster | 1 |" in table and "| vol | ngff | 1 |" in table
    assert "| vol | omezarr | 1 |" in table
    assert "vol: peak memory per task (1 thread, above the baseline): 64x64x64: " in table


@pytest.mark.slow
def test_icechunk_safety_small_run(tmp_path: Path) -> None:
    """icechunk_safety.py --small: every case on sync and threads; what does not depend on the
    order of the threads: shardwise loses nothing, xarray's default check refuses, the aligned
    write and every synchronous one lose nothing; the repositories are gone after the run."""
    script = ROOT / "benchmarks" / "icechunk_safety.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = tmp_path / "ic.jsonl"
    (tmp_path / "repos").mkdir()
    got = subprocess.run(
        [sys.executable, str(script), "run", "--small", "--dir", str(tmp_path / "repos"),
         "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    recs = {(r["case"], r["scheduler"]): r for r in map(json.loads, out.read_text().splitlines())}
    cases = ("store_dask", "xr-default", "xr-align", "xr-unsafe", "shardwise")
    assert set(recs) == {(c, s) for c in cases for s in ("sync", "threads")}
    for (case, sched), r in recs.items():
        assert r["seconds"] > 0, r
        if case == "xr-default":
            assert r["error"] == "ValueError" and r["lost"] is None, r
        elif case in ("shardwise", "xr-align") or sched == "sync":
            assert r["lost"] == 0 and r["error"] is None, r
    assert "| shardwise | threads | 1 | 0 |" in got.stdout
    assert list((tmp_path / "repos").iterdir()) == []


@pytest.mark.slow
def test_icechunk_writes_small_run(tmp_path: Path) -> None:
    """icechunk_writes.py --small on W2 (a Dataset with coordinates): shardwise into a repository
    and icechunk's own to_icechunk, each read back equal shard by shard by zarr-python and its
    coordinates by xarray; one peak-memory run on the synchronous scheduler; the stores and
    repositories are gone after the run, the report has both tables."""
    pytest.importorskip("icechunk")
    script = ROOT / "benchmarks" / "icechunk_writes.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BENCH_SRC": str(tmp_path / "src")}
    env.pop("BENCH_SIZE", None)
    out = tmp_path / "icw.jsonl"
    got = subprocess.run(
        [sys.executable, str(script), "run", "--quick", "--workloads", "W2",
         "--cases", "sw-repo,ic-xr", "--mem-cases", "sw-repo", "--reps", "1",
         "--dir", str(tmp_path / "stores"), "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    recs = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    assert recs[0]["case"] == "env" and recs[0]["size"] == "small" and recs[0]["icechunk"]
    rows = {(r["case"], r["mode"]): r for r in recs[1:]}
    assert set(rows) == {("sw-repo", "time"), ("ic-xr", "time"), ("sw-repo", "mem")}
    for r in rows.values():
        assert r["ok"] and r["coords_ok"] and r["bad_shards"] == 0 and r["size"] == "small", r
        assert r["s_whole"] > r["s_in"] > r["commit_s"] > 0 and r["stored_bytes"] > 0, r
    mem = rows["sw-repo", "mem"]
    assert mem["scheduler"] == "sync" and mem["task_x"] > 0 and mem["malloc_mmap_threshold"]
    assert list((tmp_path / "stores").iterdir()) == []
    table = subprocess.run(
        [sys.executable, str(script), "report", str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| W2 | sw-repo | 1 |" in table and "| W2 | ic-xr | 1 |" in table
    assert "Peak memory per task" in table and "| W2 | sw-repo | " in table.split("Peak")[1]


# the page's suites: the tools each measures in this environment (acquire-zarr hidden by the
# test), and the tables of the tiny size
PAGE_TABLES = {
    "dask": (("W3 writes", "W3 reads"), ("shardwise", "xarray", "tensorstore", "zarr-python")),
    "cluster": (("W3 writes",), ("shardwise", "xarray")),
    "numpy": (("W3 writes", "W3 reads"), ("shardwise", "tensorstore", "zarrista")),
    "reads": (("W3 reads",), ("shardwise", "tensorstore")),
    "loads": (("W3 loads",), ("shardwise", "tensorstore")),
    "pyramid": (("vol writes",), ("shardwise", "ngff-zarr", "ome-zarr")),
    "icechunk": (("W2 writes",), ("shardwise", "icechunk")),
    "memory": (("vol held by the write",), ("shardwise", "ngff-zarr", "ome-zarr")),
    "stream": (("B shards-zstd",), ("shardwise", "tensorstore", "zarr-python")),
    "convert": (("256^3",), ("shardwise",)),
    "rectilinear": (("120 days, months", "120 days, files"), ("shardwise",)),
    "appends": (("2 writers",), ("shardwise",)),
    "regions": (("small volume",), ("shardwise", "zarr-python", "tensorstore")),
    "pyramid-update": (("512^2 image",), ("shardwise",)),
    "million": (("1,000 shards: build", "1,000 shards: write"), ("shardwise", "zarr-python")),
}
# the tools measured in some of a suite's tables only
PAGE_SOME = {"rectilinear": {"xarray"}, "million": {"xarray"}}
# the suites whose scripts measure the machine's limit
PAGE_LIMITS = ("dask", "numpy", "stream", "convert")
PAGE_ABSENT = {"stream": "acquire-zarr"}


@pytest.mark.slow
def test_bench_page_tiny(tmp_path: Path) -> None:
    """``page.py --tiny`` (what ``bash dev.sh bench-page --tiny`` runs) writes the page: a section
    per suite, a table per workload with a row per tool it measured and the limit, a plot per
    table, the machine and the versions, the one command; a tool that does not import is not
    run and is listed as absent, in the tools' table and in every table it belongs to (the
    test hides acquire-zarr, whether ``dev.sh`` installed it beside the venv or not)."""
    hide = tmp_path / "hide"
    for mod in ("acquire_zarr",):  # installed or not, the test hides it
        (hide / mod).mkdir(parents=True)
        (hide / mod / "__init__.py").write_text(
            f"raise ModuleNotFoundError('No module named {mod!r}', name={mod!r})\n"
        )
    env = {**os.environ, "PYTHONPATH": str(hide), "BENCH_SRC": str(tmp_path / "src")}
    env.pop("AQZ_PATH", None)
    out = tmp_path / "docs"
    got = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "page.py"), "--tiny", "--out", str(out),
         "--work", str(tmp_path / "work")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    page = (out / "benchmarks.md").read_text()
    sections = page.split("\n## ")
    assert sections[0].startswith("# Benchmarks\n")
    assert "| acquire-zarr | absent |" in sections[0]
    assert "| tensorstore | 0." in sections[0]  # a version, not absent
    tables = {t.split("\n", 1)[0]: t for s in sections for t in s.split("\n### ")[1:]}
    assert set(tables) == {
        f"{k}: {name}" for k, (names, _) in PAGE_TABLES.items() for name in names
    }
    for key, (names, tools) in PAGE_TABLES.items():
        for name in names:
            table = tables[f"{key}: {name}"]
            rows = [x for x in table.splitlines() if x.startswith("| ") and "---" not in x]
            measured = {x.split(" | ")[0][2:] for x in rows[1:] if " | 0 | " not in x}
            assert set(tools) <= measured, (key, name, rows)
            assert measured <= {*tools, *PAGE_SOME.get(key, ()), "limit"}, (key, name, rows)
            if key in PAGE_LIMITS:
                assert "limit" in measured, (key, name, rows)  # the scripts measuring one
            if key in PAGE_ABSENT:
                tool = PAGE_ABSENT[key]
                assert f"| {tool} |  | absent: not installed | 0 | absent |" in table
            (fig,) = [x for x in table.splitlines() if x.startswith("![")]
            svg = out / fig[fig.index("](") + 2 : -1]
            assert svg.read_text().lstrip().startswith("<?xml"), svg
    assert len(list((out / "benchmarks").glob("*.svg"))) == len(tables)
    # what ran: the scripts' own JSON lines, none of a hidden tool's cases
    results = out / "benchmarks" / "results"
    assert "acquire" not in (results / "stream.jsonl").read_text()
    reproduce = sections[-1]
    assert reproduce.startswith("Reproduce\n")
    assert "```bash\nbash dev.sh bench-page --tiny\n```" in reproduce
    for key in (
        "| CPU | ",
        f"| cores | {os.cpu_count()} |",
        "| RAM | ",
        "| OS | ",
        "| python | 3.",
    ):
        assert key in reproduce, key
    assert "| acquire-zarr | absent (not installed) |" in reproduce
    assert "| icechunk | " in reproduce and "| numpy | " in reproduce
    assert list((tmp_path / "work").glob("stores/*")) == []
