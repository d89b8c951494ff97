"""Pure values and math: the shard grid, default sizes, the write plan and job (no I/O)."""
