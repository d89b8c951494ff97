"""Dask graphs over the shared pool: shard writers and readers, fetches, assembly, progress."""
