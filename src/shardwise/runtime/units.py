"""The unit sizes of encode and decode work, shared by the codecs, the engine and the job's
memory estimate."""

SMALL_CHUNK = 64 * 1024  # raw bytes below which zstd chunks are (de)compressed in batches
UNIT_BYTES = 256 * 2**10  # raw bytes of small inner chunks one encode task stacks at a time
