"""
A pyramid, level by level
=========================

:func:`shardwise.write_pyramid` writes an image and its reductions (each level half the size of
the one before along the space axes) as one OME-Zarr 0.5 multiscale image: one array per level,
all written in one pass with one task per shard of each level. Here a synthetic two-channel
image is written, then each level is read back with :func:`shardwise.open_array` and drawn.
"""

import shutil
import tempfile

import dask.array as da
import matplotlib.pyplot as plt
import numpy as np
import zarr

import shardwise

scratch = tempfile.mkdtemp()
store = f"{scratch}/cells.zarr"

# %%
# An image of 2 channels, 1024 x 1536 pixels
# ------------------------------------------
# Channel 0: rings; channel 1: stripes that narrow from left to right (10 pixels apart at the
# right edge), so that each reduction (the mean of 2 x 2 pixels) shows what it keeps: stripes
# narrower than a few pixels of a level average out to grey. A dask array in blocks of 512 x 512.

y, x = np.mgrid[0:1024, 0:1536]
rings = np.cos(np.hypot(y - 512, x - 768) / 12) * np.exp(-np.hypot(y - 512, x - 768) / 600)
stripes = np.sin(x**2 / 5000 + y / 100)
image = np.stack([rings, stripes]).astype("f4")
source = da.from_array(image, chunks=(1, 512, 512))

report = shardwise.write_pyramid(
    source,
    store,
    dims=("c", "y", "x"),
    levels=4,
    factors=2,
    method="mean",
    chunks=(1, 128, 128),
    shards=(1, 512, 512),
    scale={"y": 0.65, "x": 0.65},
    units={"y": "micrometer", "x": "micrometer"},
    mode="w",
)
print(report.shards_written, "shards written over all levels")

# %%
# The OME-Zarr metadata
# ---------------------
# Each level is an array of the group (``0``, ``1``, ...), with its pixel size: the scale doubles
# from level to level.

multiscale = zarr.open_group(store, mode="r").attrs["ome"]["multiscales"][0]
for level in multiscale["datasets"]:
    scale = level["coordinateTransformations"][0]["scale"]
    array = zarr.open_array(store, path=level["path"], mode="r")
    print(f"level {level['path']}: shape {array.shape}, shards {array.shards}, pixel {scale[1:]}")

# %%
# Each level read back and drawn
# ------------------------------
# ``open_array`` returns a dask array in shard-aligned chunks; ``.compute()`` reads it. Every
# level is drawn at the same size on the page, so the coarser ones show their pixels.

levels = [shardwise.open_array(store, path=d["path"]) for d in multiscale["datasets"]]
fig, axes = plt.subplots(2, len(levels), figsize=(12, 4.6), layout="constrained")
for k, level in enumerate(levels):
    pixels = level.compute()
    for c in range(2):
        axes[c, k].imshow(pixels[c], cmap="magma" if c == 0 else "cividis")
        axes[c, k].set_xticks([])
        axes[c, k].set_yticks([])
    axes[0, k].set_title(f"level {k}: {pixels.shape[1]} x {pixels.shape[2]}")
axes[0, 0].set_ylabel("channel 0")
axes[1, 0].set_ylabel("channel 1")
plt.show()

# %%
# A detail at every level
# -----------------------
# The same 64 x 64 micrometre corner of channel 0 at each level: a quarter of the pixels at each
# step down, each the mean of the four below it. Only the shards that hold the corner are read.

fig, axes = plt.subplots(1, len(levels), figsize=(12, 3.2), layout="constrained")
for k, level in enumerate(levels):
    side = 98 // 2**k  # 64 micrometres at 0.65 micrometre per pixel on level 0
    corner = level[0, 512 // 2**k : 512 // 2**k + side, 768 // 2**k : 768 // 2**k + side]
    axes[k].imshow(corner.compute(), cmap="magma", interpolation="nearest")
    axes[k].set_title(f"level {k}: {side} x {side} pixels")
    axes[k].set_axis_off()
plt.show()

# %%
# The reduction is the mean: level 1 is level 0 averaged over 2 x 2 blocks.

level0, level1 = levels[0][0].compute(), levels[1][0].compute()
means = level0.reshape(512, 2, 768, 2).mean(axis=(1, 3))
print("level 1 is the 2 x 2 mean of level 0:", np.allclose(level1, means, atol=1e-6))

shutil.rmtree(scratch)  # the stores of this example go
