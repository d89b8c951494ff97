"""
Plan pictures: who writes which shard
=====================================

:func:`shardwise.plan_write` takes what :func:`shardwise.write_array` takes and writes nothing:
it returns the plan, which prints what the write will do and, in a notebook (or here), draws
it. Each rectangle is a shard, labelled with the task that owns it (``T0``, ``T1``, ...); the
thick outline is the region written, the dashed lines the dask blocks over it, and the colour
says what happens to the shard (blue: written by a direct task, orange: by a staged one; the
darker shade: merged with what is stored; grey: not written).
"""

import shutil
import tempfile

import dask.array as da
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import shardwise

scratch = tempfile.mkdtemp()  # the stores of this example (plan_write writes nothing there)

# %%
# A dask array whose blocks cross the shards
# ------------------------------------------
# Blocks of 500 x 700 over shards of 1000 x 1000: each shard task gathers the pieces of the blocks
# it needs (the dashed lines cut through the shards), so no two tasks write the same shard.

x = da.random.random((2000, 3000), chunks=(500, 700))
plan = shardwise.plan_write(x, f"{scratch}/misaligned.zarr", chunks=(100, 100), shards=(1000, 1000))
print(plan.strategy, plan.shards, "shards,", plan.tasks, "tasks")
plan

# %%
# The same array, one block per shard
# -----------------------------------
# Rechunked to the shards, every block is one shard's piece: nothing is moved between tasks
# (``bytes to move`` of the printout: rechunk 0 B).

aligned = x.rechunk((1000, 1000))
plan = shardwise.plan_write(
    aligned, f"{scratch}/aligned.zarr", chunks=(100, 100), shards=(1000, 1000)
)
print(plan.bytes_rechunked, "bytes rechunked")
plan

# %%
# A region written into a stored array
# ------------------------------------
# A write of a region (``mode="r+"``) owns the shards it touches: those it covers whole are
# written, those it covers in part are merged with what is stored (darker), the others are left
# alone (grey).

store = f"{scratch}/stored.zarr"
shardwise.write_array(np.zeros((2000, 3000), "f8"), store, chunks=(100, 100), shards=(1000, 1000))
patch = da.ones((1200, 1500), chunks=(600, 750))
plan = shardwise.plan_write(patch, store, region=(slice(500, 1700), slice(1000, 2500)), mode="r+")
print(plan.shards, "shards touched")
plan

# %%
# A memory budget that a shard does not fit
# -----------------------------------------
# A direct task holds a shard and the blocks it gathers. When a shard does not fit the budget
# (``memory_limit``), the plan is *staged*: block tasks write pieces, then one task per shard
# assembles them (orange); the plan says why.

big = da.zeros((4096, 4096), chunks=(1024, 4096), dtype="f4")
plan = shardwise.plan_write(
    big, f"{scratch}/staged.zarr", chunks=(256, 256), shards=(4096, 4096), memory_limit="96MiB"
)
print(plan.reason)
plan

# %%
# A Dataset, variable by variable
# -------------------------------
# ``shardwise.to_zarr`` writes each variable of a Dataset as an array of its own.
# :func:`shardwise.plan_shards` chooses (and explains) the shards of each; here one shard per
# time step (``target="XY"``: whole maps), so a map reads one shard. The plan of a variable's dask
# data draws its write: one panel per shard of the leading axis (time), the dask blocks of 4 time
# steps each cut across 4 shards.

ds = xr.Dataset(
    {
        "temperature": (("time", "y", "x"), np.random.rand(8, 180, 360).astype("f4")),
        "land": (("y", "x"), np.ones((180, 360), "u1")),
    },
    coords={"time": np.arange(8), "y": np.linspace(-89.5, 89.5, 180), "x": np.arange(360.0)},
).chunk({"time": 4})
for name, var in ds.data_vars.items():
    geometry = shardwise.plan_shards(var.shape, var.dtype, dims=var.dims, target="XY")
    print(f"{name}: shards {geometry.shards}, inner chunks {geometry.chunks}")

# %%
# The report of one variable's shards (what a map read, a time series and appends cost), and
# the picture of its write.

temperature = ds["temperature"]
geometry = shardwise.plan_shards(
    temperature.shape, temperature.dtype, dims=temperature.dims, target="XY", chunks=(1, 90, 180)
)
print(geometry)
plan = shardwise.plan_write(
    temperature.data, f"{scratch}/climate.zarr", shards=geometry.shards, chunks=geometry.chunks
)
plan

# %%
# Shard sizes: tasks against memory
# ---------------------------------
# A plan's figures, without its picture, for one array and several shard shapes: fewer, larger
# shards mean fewer tasks and objects, and more memory per task (a task holds its shard and the
# pieces it gathers).

shapes = [(200, 300), (500, 500), (500, 1000), (1000, 1000), (1000, 1500), (2000, 3000)]
plans = [
    shardwise.plan_write(x, f"{scratch}/sizes.zarr", chunks=(100, 100), shards=shape)
    for shape in shapes
]
for shape, plan in zip(shapes, plans, strict=True):
    tasks = f"{plan.tasks} task" + ("s" if plan.tasks != 1 else "")
    print(f"shards {shape}: {tasks}, ~{plan.peak_per_task / 2**20:.0f} MiB per task")

fig, ax = plt.subplots(figsize=(6, 3.4), layout="constrained")
ax.plot([p.tasks for p in plans], [p.peak_per_task / 2**20 for p in plans], "o-")
for shape, plan in zip(shapes, plans, strict=True):
    ax.annotate(
        f"{shape[0]} x {shape[1]}",
        (plan.tasks, plan.peak_per_task / 2**20),
        textcoords="offset points",
        xytext=(6, 4),
        fontsize=8,
    )
ax.set_xscale("log")
ax.set_xlabel("shard tasks (one per shard)")
ax.set_ylabel("peak memory per task (MiB)")
ax.set_title("a 2000 x 3000 float64 array in dask blocks of 500 x 700")
plt.show()

shutil.rmtree(scratch)  # the stores of this example go
