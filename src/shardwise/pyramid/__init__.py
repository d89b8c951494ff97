"""Multiscale pyramids: ``shardwise.write_pyramid`` (the front end), the reductions and the
OME-Zarr metadata."""
