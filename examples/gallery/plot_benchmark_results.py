"""
A benchmark plot: writes and reads beside tensorstore and zarrista
==================================================================

The benchmarks of ``benchmarks/`` write their measurements as JSON lines in
``benchmarks/results/``; nothing is measured here. This example draws one committed run:
``benchmarks/numpy_paths.py`` of 2026-11-29 (8 interleaved repetitions, one case per fresh
process), ``write_array`` and ``read_array`` of an array in memory beside tensorstore and
zarrista (the zarrs library from Python), the same calls through dask, and the machine's limit
(compression, or decompression into a new array, alone). W1 is a uint16 array of 1024³
(2.15 GB; shards of 256³, inner chunks of 64³), W3 a float32 array of 8192² (0.27 GB; shards of
1024², inner chunks of 32²); ``benchmarks/README.md`` gives the data, the table of this run and
how to run it again.
Bars are medians of the in-process seconds, whiskers the fastest and slowest repetitions. Run it
from a checkout of the repository: it reads the file there.
"""

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

# the repository's benchmarks/results/, found from this script or from the working directory
here = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
results = next(
    p / "benchmarks" / "results" / "numpy-paths-2026-11-29.jsonl"
    for p in (here, *here.parents)
    if (p / "benchmarks" / "results").is_dir()
)
rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
print(len(rows), "measurements from", results.name)

# %%
# Medians and spreads
# -------------------
# One row per case: the median of the repetitions, the fastest and the slowest, in seconds.

CASES = {  # case -> its label on the plot
    "sw-": "shardwise (numpy)",
    "sw-dask-": "shardwise (dask)",
    "ts-": "tensorstore",
    "zr-": "zarrista",
    "limit-": "limit",
}
table = {}
for workload in ("W1", "W3"):
    for op in ("write", "read"):
        for prefix in CASES:
            s = [r["s_in"] for r in rows if r["wl"] == workload and r["case"] == prefix + op]
            assert all(r["ok"] for r in rows if r["case"] == prefix + op)
            table[workload, op, prefix] = (np.median(s), min(s), max(s), len(s))
            print(
                f"{workload} {op:5} {CASES[prefix]:18} {np.median(s):6.2f} s "
                f"({min(s):.2f}-{max(s):.2f}, {len(s)} runs)"
            )

# %%
# The plot
# --------

fig, axes = plt.subplots(1, 4, figsize=(12, 3.6), layout="constrained")
colours = ["#3182bd", "#9ecae1", "#e6550d", "#31a354", "#bdbdbd"]
panels = [(w, o) for w in ("W1", "W3") for o in ("write", "read")]
for ax, (workload, op) in zip(axes, panels, strict=True):
    med, lo, hi, _ = np.array([table[workload, op, p] for p in CASES]).T
    ax.bar(range(len(CASES)), med, color=colours, yerr=[med - lo, hi - med], capsize=3)
    ax.set_xticks(range(len(CASES)), list(CASES.values()), rotation=45, ha="right")
    ax.set_title(f"{workload} {op}")
    ax.set_ylim(0, None)
axes[0].set_ylabel("seconds (median, min-max)")
plt.show()

# %%
# Ratios of the medians to tensorstore (below 1: faster).

for workload in ("W1", "W3"):
    for op in ("write", "read"):
        ts = table[workload, op, "ts-"][0]
        ratios = ", ".join(
            f"{CASES[p]} {table[workload, op, p][0] / ts:.2f}" for p in CASES if p != "ts-"
        )
        print(f"{workload} {op}: {ratios}")
