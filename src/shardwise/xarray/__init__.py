"""The xarray front end: the "shardwise" engine and to_zarr (its checks and layout)."""
