"""Exit status of the ``shardwise`` command, as ``--help`` and docs/cli.md state it."""

from __future__ import annotations

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3
# the reader of the output went away (``shardwise inspect X | head``), as for SIGPIPE
EXIT_PIPE = 141

EXIT_STATUS = (
    "Exit status: 0 success; 1 the array has problems (verify, batch finalize, convert or "
    "reshard --verify); 2 bad usage: no command, an unknown command or option, a missing or "
    "malformed value (a size such as --shard-bytes 64XB, a shape such as --shards a,b, a count "
    "such as --threads 0); 3 refused or failed: no array there (or a group, or a Zarr v2 array "
    "where a v3 array is needed), the store cannot be opened or read (e.g. missing credentials), "
    "bad plan or input, another writer holds the lease, any other error; 143 stopped by SIGTERM, "
    "130 by SIGINT (the shards done are kept, the lease released: --resume finishes); 141 the "
    "reader of its output went away (such as | head), silently. A failure "
    "is one line on stderr; --traceback (or SHARDWISE_TRACEBACK=1) adds the full traceback."
)


class UsageError(Exception):
    """Arguments argparse cannot check on its own (exit status 2)."""
