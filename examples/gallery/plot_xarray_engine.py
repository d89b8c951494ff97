"""
xarray: to_zarr, then the shardwise engine
==========================================

:func:`shardwise.to_zarr` writes an xarray Dataset as xarray's ``Dataset.to_zarr`` does (the same
coordinates, attributes and encodings, readable by ``xr.open_zarr``), with every variable a
sharded array written one task per shard. ``xr.open_dataset(..., engine="shardwise")`` reads it
back in shard-aligned dask chunks. Here a year of daily maps of a synthetic temperature field,
written in two parts (the second appended along time), read back and plotted.
"""

import shutil
import tempfile

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr

import shardwise

scratch = tempfile.mkdtemp()
store = f"{scratch}/temperature.zarr"

# %%
# A Dataset of daily maps
# -----------------------
# 365 days of a 2-degree grid: a seasonal cycle that is stronger towards the poles, in dask
# chunks of 30 days.

time = pd.date_range("2024-01-01", periods=365, freq="D")
lat = np.arange(-89.0, 90, 2.0)
lon = np.arange(1.0, 360, 2.0)
day = np.arange(365)[:, None, None]
season = np.cos(2 * np.pi * (day - 196) / 365) * np.sin(np.deg2rad(lat))[None, :, None]
t2m = 288 - 30 * np.sin(np.deg2rad(np.abs(lat)))[None, :, None] ** 2 + 15 * season
t2m = t2m + 2 * np.cos(np.deg2rad(3 * lon))[None, None, :]
ds = xr.Dataset(
    {
        "t2m": (
            ("time", "lat", "lon"),
            t2m.astype("f4"),
            {"units": "K", "long_name": "air temperature"},
        )
    },
    coords={"time": time, "lat": lat, "lon": lon},
).chunk(time=30)
print(ds)

# %%
# Written in two parts
# --------------------
# Shards of 91 days: the first 200 days, then the rest appended along time (the append merges
# into the shard the first part left partly filled, with one task owning it).

shardwise.to_zarr(ds.isel(time=slice(0, 200)), store, shards={"time": 91}, mode="w")
report = shardwise.to_zarr(ds.isel(time=slice(200, None)), store, append_dim="time")
print(report)

# %%
# Read back with the shardwise engine
# -----------------------------------
# ``chunks={}`` opens each variable in its shards' chunks: one dask chunk per shard (365 days
# are 4 shards of 91 and one of 1).

back = xr.open_dataset(store, engine="shardwise", chunks={})
print(back.t2m.encoding["shards"], back.t2m.chunks[0])
xr.testing.assert_identical(back.compute(), ds.compute())
print(
    "identical to what was written; xr.open_zarr reads the same:",
    xr.open_zarr(store).t2m.equals(back.t2m),
)

# %%
# A map and a time series
# -----------------------
# A map reads the shard of its day; a time series at one point reads every shard along time,
# only the inner chunks that hold the point.

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained")
back.t2m.sel(time="2024-07-15").plot(ax=left, cmap="RdYlBu_r")
left.set_title("2024-07-15")
for where in (61.0, 1.0, -45.0):
    back.t2m.sel(lat=where, lon=11.0).plot(ax=right, label=f"lat {where}")
right.set_title("at lon 11")
right.legend(frameon=False)
plt.show()

shutil.rmtree(scratch)  # the stores of this example go
