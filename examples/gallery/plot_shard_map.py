"""
Shard maps: what is stored, and how big
=======================================

A sharded array stores one object per shard, and none for a shard that holds only the fill value
(``write_empty_chunks=False``, the default): it reads as the fill value. This example writes an
array whose middle is empty, then looks at what is stored three ways: the summary of
``shardwise inspect``, the shard map (the picture ``shardwise inspect --plot`` draws, here as a
notebook shows it) and a matplotlib map of the size of every stored shard.
"""

import shutil
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import shardwise
from shardwise.cli import main as shardwise_command
from shardwise.cli.inspection import shard_map

scratch = tempfile.mkdtemp()
store = f"{scratch}/field.zarr"

# %%
# An array with an empty hole
# ---------------------------
# 2048 x 3072 float32, shards of 256 x 256 (8 x 12 shards), inner chunks of 64 x 64. The values
# are rounded to a step that grows from left to right, so the shards compress less and less
# well; a disc in the middle is all zeros (the fill value).

y, x = np.mgrid[0:2048, 0:3072].astype("f4")
rng = np.random.default_rng(0)
field = np.sin(x / 300) * np.cos(y / 200) + 0.05 * rng.standard_normal(x.shape, dtype="f4")
step = 0.5 / (1 + x / 200)  # coarse on the left, fine on the right
field = (np.round(field / step) * step).astype("f4")
field[(y - 1024) ** 2 + (x - 1536) ** 2 < 700**2] = 0
report = shardwise.write_array(
    field, store, chunks=(64, 64), shards=(256, 256), fill_value=0, mode="w"
)
print(report.shards_written, "shards written,", report.shards_empty, "all fill (not stored)")

# %%
# What ``shardwise inspect`` says
# -------------------------------

assert shardwise_command(["inspect", store]) == 0  # its exit status: 0, the array is there

# %%
# The shard map
# -------------
# One listing of the array's objects, no shard read: green is stored, grey is empty (reads as
# the fill value), red would be a shard that a write recorded and that is gone.

shard_map(store)

# %%
# The size of every shard
# -----------------------
# The shards are files under ``c/`` (``c/<row>/<column>``, zarr's default key encoding): their
# sizes, drawn on the shard grid next to the data.

rows, cols = 2048 // 256, 3072 // 256
sizes = np.full((rows, cols), np.nan)
for f in Path(store, "c").glob("*/*"):
    sizes[int(f.parent.name), int(f.name)] = f.stat().st_size / 2**10
print(f"{np.isfinite(sizes).sum():.0f} shards stored, {np.nansum(sizes) / 2**10:.1f} MiB")
print(f"smallest {np.nanmin(sizes):.0f} KiB, largest {np.nanmax(sizes):.0f} KiB")

back = shardwise.read_array(store)
assert np.array_equal(back, field)

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained")
left.imshow(back, cmap="RdBu_r")
left.set_title("the array, read back")
image = right.imshow(sizes, cmap="viridis", extent=(0, 3072, 2048, 0))
right.set_xticks(range(0, 3073, 256), minor=True)
right.set_yticks(range(0, 2049, 256), minor=True)
right.grid(which="minor", color="white", lw=0.5)
right.set_title("stored size of each shard (white: not stored)")
fig.colorbar(image, ax=right, label="KiB")
plt.show()

shutil.rmtree(scratch)  # the stores of this example go
