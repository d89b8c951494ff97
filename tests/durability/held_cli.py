"""The ``shardwise`` command with one block of its source held back (run as a script by tests
that stop a batch part mid-write, whatever the machine's speed)::

    python held_cli.py FLAG ROW COL ARGS...

The task of source block (ROW, COL) creates ``FLAG.held`` when it starts and waits until
``FLAG.go`` exists (never, for a test that kills the process): the other blocks' shards commit
meanwhile. Only the source is instrumented; the store and the command are the real ones.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import shardwise.cli.commands as commands
from shardwise.cli import main

opened = commands.open_source
flag, held = "", (-1, -1)


def hold(block: Any, block_info: Any = None) -> Any:
    if block_info is not None and tuple(block_info[0]["chunk-location"]) == held:
        Path(f"{flag}.held").touch()
        t0 = time.monotonic()
        while not Path(f"{flag}.go").exists() and time.monotonic() - t0 < 600:
            time.sleep(0.02)
    return block


def open_held(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    data, arr = opened(*args, **kwargs)
    return data.map_blocks(hold, dtype=data.dtype, meta=data._meta), arr


if __name__ == "__main__":  # imported by the doctest collection too: then it does nothing
    flag, held = sys.argv[1], (int(sys.argv[2]), int(sys.argv[3]))
    commands.open_source = open_held
    sys.exit(main(sys.argv[4:]))
