"""Dask graphs and the thread pool: shard writers and readers, fetches, assembly, progress."""
