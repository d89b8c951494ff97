"""What every layer shares at run time, below them all: the encode/decode pool, the unit sizes
of encode work, the memory probes."""
