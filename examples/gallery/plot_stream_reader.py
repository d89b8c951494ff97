"""
A stream of frames, read while it is written
============================================

:func:`shardwise.stream` appends frames (a camera, a detector, a simulation's time steps) to a
sharded array as they come. Frames are buffered in the open shard-row and each full shard is
encoded and stored whole in the background; only then does the array's shape grow, so a reader
never sees a torn shard. ``flush()`` also stores the partial shard-row, so that a reader sees
every frame appended so far.

Here a spot drifts across a 128 x 128 detector for 96 frames, in shards of 16 frames; twice during
the stream a reader opens the array with :func:`shardwise.open_array` and looks at what is there.
"""

import shutil
import tempfile

import matplotlib.pyplot as plt
import numpy as np

import shardwise

scratch = tempfile.mkdtemp()
store = f"{scratch}/detector.zarr"


def frame(t: int) -> np.ndarray:
    """A drifting spot on a faint background, brighter as time goes."""
    y, x = np.mgrid[0:128, 0:128]
    cy, cx = 64 + 40 * np.sin(t / 15), 20 + t
    spot = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / 40) * (200 + 8 * t)
    return (spot + 10).astype("u2")


# %%
# The stream, and a reader twice in its middle
# --------------------------------------------

seen = {}  # frames appended when the reader looked -> what the reader read
with shardwise.stream(
    store, shape=(None, 128, 128), dtype="u2", chunks=(1, 64, 64), shards=(16, 128, 128)
) as s:
    print(s)
    for t in range(96):
        s.append(frame(t))
        if t + 1 in (24, 60):
            s.flush()  # the frames of the open shard-row stored too
            reader = shardwise.open_array(store)
            print(f"after {t + 1} appends a reader sees {reader.shape}, chunks {reader.chunks[0]}")
            seen[t + 1] = reader.compute()
print(s.report.notes[-1])

# %%
# The finished array, read whole: every frame in order.

movie = shardwise.open_array(store).compute()
print(movie.shape, movie.dtype)
assert all(np.array_equal(movie[t], frame(t)) for t in range(96))
assert all(np.array_equal(movie[: len(part)], part) for part in seen.values())

# %%
# What each reader saw, and the whole stream
# ------------------------------------------
# Left: the last frame each reader read, and the last of the stream. Right: the brightest pixel
# of every frame, as each reader read it and as the finished array holds it.

fig = plt.figure(figsize=(11, 3.4), layout="constrained")
panels = fig.subfigures(1, 2, width_ratios=[3, 2])
axes = panels[0].subplots(1, 3)
for ax, (n, frames) in zip(axes, [*seen.items(), (96, movie)], strict=True):
    ax.imshow(frames[-1], cmap="inferno", vmin=0, vmax=movie.max())
    ax.set_title(f"frame {n - 1} (of {n} read)")
    ax.set_axis_off()
ax = panels[1].subplots()
ax.plot(movie.max(axis=(1, 2)), color="0.7", lw=6, label="finished array")
for (n, frames), style in zip(seen.items(), ("-", ":"), strict=True):
    ax.plot(frames.max(axis=(1, 2)), style, lw=2.5, label=f"reader after {n} appends")
ax.set_xlabel("frame")
ax.set_ylabel("brightest pixel")
ax.legend(frameon=False)
plt.show()

shutil.rmtree(scratch)  # the stores of this example go
