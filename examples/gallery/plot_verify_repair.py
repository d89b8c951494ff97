"""
A lost shard: seen, verified, repaired
======================================

Every write records the shards it stored (the journal, beside the array). A shard object that a
write recorded and that is gone (a bucket's lifecycle rule, a partial copy, a stray ``rm``) would
read as the fill value without a word: :func:`shardwise.verify` finds it, the shard map draws it
in red, and a region write of that shard's data puts it back.
"""

import shutil
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import shardwise
from shardwise.cli.inspection import shard_map

scratch = tempfile.mkdtemp()
store = f"{scratch}/terrain.zarr"

# %%
# An array of 6 x 8 shards
# ------------------------

y, x = np.mgrid[0:768, 0:1024]
terrain = (np.sin(x / 90) + np.cos(y / 70) + np.sin((x + y) / 40) / 2).astype("f4")
shardwise.write_array(terrain, store, chunks=(32, 32), shards=(128, 128), mode="w")
print("verify:", shardwise.verify(store).ok)

# %%
# A shard goes missing
# --------------------
# Its object is removed from under the array (``c/<row>/<column>``): a read now gets the fill
# value there, and nothing else tells.

Path(store, "c", "2", "5").unlink()
hole = shardwise.read_array(store)
print("read as fill:", bool((hole[256:384, 640:768] == 0).all()))

report = shardwise.verify(store)
print("verify:", report.ok)
for problem in report.problems:
    print(" ", problem.kind, problem.key, "-", problem.message)

# %%
# The shard map draws it in red: recorded by a write, gone from the store.

shard_map(store)

# %%
# Repaired by a region write
# --------------------------
# The region of that shard, written again from the source (``mode="r+"``: into the existing
# array), stores it and records it again.

rows, cols = slice(256, 384), slice(640, 768)
shardwise.write_array(terrain[rows, cols], store, region=(rows, cols), mode="r+")
print("verify:", shardwise.verify(store).ok)
repaired = shardwise.read_array(store)
print("equal to the source:", np.array_equal(repaired, terrain))

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
for ax, image, title in zip(
    axes, (hole, repaired), ("read with the shard missing", "read after the repair"), strict=True
):
    ax.imshow(image, cmap="terrain")
    ax.set_title(title)
    ax.add_patch(plt.Rectangle((640, 256), 128, 128, fill=False, edgecolor="red", lw=1.5))
plt.show()

shutil.rmtree(scratch)  # the stores of this example go
