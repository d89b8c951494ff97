"""The I/O edge: the shard store and backends, retries, S3, conditional commits, overlay."""
