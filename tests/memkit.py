"""Peak resident memory of one operation, native allocations included.

tracemalloc sees only what Python's allocator hands out: the buffers zstd, blosc or numpy's C code
allocate escape it. Here an operation runs in a fresh interpreter and is measured by the kernel's
count of resident pages: the high-water mark (``VmHWM``) over the baseline taken just before it.

``peak_rss(case, **kwargs)`` starts ``python -c ...`` in a new process that

1. imports the module defining ``case`` (a plain top-level function of a test module) and every
   ``shardwise`` submodule, so lazy imports are paid before the baseline;
2. calls ``case(**kwargs)``: it builds and touches its input (so the input is resident before the
   baseline) and returns the operation, a function of no arguments, not yet run;
3. collects garbage and returns freed heap memory to the kernel (``malloc_trim``: memory the
   set-up freed would otherwise be reused unseen by the operation), resets the high-water mark
   (``/proc/self/clear_refs``) and reads the resident size: the baseline;
4. runs the operation once and reads the high-water mark: ``peak`` is it less the baseline.

The operation's result stays alive until the mark is read (an output array counts), then
``digest`` summarises it so the test can check the operation did its work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MiB = 2**20
TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"

_CHILD = textwrap.dedent(
    """
    import ctypes, gc, importlib.util, json, pkgutil, sys
    sys.path[:0] = [sys.argv[1]]
    import dask.array, distributed, memkit, shardwise, zarr  # shardwise imports them lazily
    for mod in pkgutil.walk_packages(shardwise.__path__, "shardwise."):
        if not mod.name.endswith("__main__"):  # lazy imports before the baseline
            importlib.import_module(mod.name)
    spec = importlib.util.spec_from_file_location("memcase", sys.argv[2])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    op = getattr(module, sys.argv[3])(**json.loads(sys.argv[4]))
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    memkit.reset_high_water()
    baseline = memkit.status_bytes("VmRSS")
    result = op()
    peak = memkit.status_bytes("VmHWM") - baseline
    print(json.dumps({"peak": peak, "baseline": baseline, "digest": memkit.digest(result)}))
    """
)


@dataclass(frozen=True)
class Measured:
    peak: int  # bytes: the high-water mark of the operation over the baseline
    baseline: int  # bytes resident before it (interpreter, imports, input)
    digest: Any  # digest() of what the operation returned

    @property
    def mib(self) -> float:
        return round(self.peak / MiB, 1)


def status_bytes(field: str) -> int:
    """A ``kB`` field of /proc/self/status (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def reset_high_water() -> None:
    """Set this process's resident high-water mark to its current resident size (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def digest(value: Any) -> Any:
    """What an operation returned, small enough to print: an array's shape and sum."""
    if isinstance(value, np.ndarray):
        return {"shape": list(value.shape), "sum": float(value.sum(dtype="f8"))}
    return None


def peak_rss(case: Any, **kwargs: Any) -> Measured:
    """Measure the operation ``case(**kwargs)`` returns in a fresh process (see the module doc).
    ``kwargs`` travel as JSON (pass paths as ``str``)."""
    module = sys.modules[case.__module__]
    assert module.__file__ is not None
    path = [str(SRC), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    args = [str(TESTS), module.__file__, case.__name__, json.dumps(kwargs)]
    got = subprocess.run(
        [sys.executable, "-c", _CHILD, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr[-4000:]
    out = json.loads(got.stdout.strip().splitlines()[-1])
    return Measured(int(out["peak"]), int(out["baseline"]), out["digest"])


def smooth(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Compressible uint16 data (a slow ramp along every axis plus a little noise), so zstd does
    real work and its encoded chunks are smaller than the raw ones."""
    rng = np.random.default_rng(seed)
    ramp = sum(
        np.arange(n).reshape([-1 if i == j else 1 for j in range(len(shape))]) // 8
        for i, n in enumerate(shape)
    )
    return (ramp + rng.integers(0, 2, size=shape)).astype("uint16")
