"""The ``shardwise`` command: inspect, verify, convert (and reshard), batch (HPC parts), lease.

Exit status: 0 success; 1 the array has problems (``verify``, ``batch finalize``, ``convert`` or
``reshard --verify``); 2 bad usage (arguments: no command, an unknown option, a malformed size,
shape or count); 3 refused or failed: no array there (or a group, or a Zarr v2 array where a v3
array is needed), the store cannot be opened or read (e.g. missing credentials), bad plan or
input, another writer holds the lease, any other error; 143 stopped by SIGTERM, 130 by SIGINT
(Ctrl-C): the shards done are kept, the lease is released, and ``--resume`` finishes the work
(:mod:`shardwise.runtime.signals`). A failure is one line on stderr; --traceback (or
SHARDWISE_TRACEBACK=1) adds the full traceback. Messages of the ``shardwise`` logger (a lease
taken over from a writer that is gone, a stop) are lines on stderr too. The wording of
``--help`` is :data:`~shardwise.cli.status.EXIT_STATUS`.

The modules: :mod:`.parser` (arguments, every value checked there), :mod:`.commands` (what each
command does), :mod:`.inspection` (``inspect``), :mod:`.status` (exit codes).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..errors import ShardwiseError
from ..runtime import pool as _pool
from ..runtime.signals import Interrupted, stop_on_signals
from .commands import compressors, open_source, storage_options
from .inspection import inspect_array
from .parser import parser
from .status import EXIT_FAILED, EXIT_OK, EXIT_PIPE, EXIT_PROBLEMS, EXIT_USAGE, UsageError

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "UsageError",
    "compressors",
    "inspect_array",
    "main",
    "open_source",
    "parser",
    "storage_options",
]


# a keyword of the Python call a message names -> (the command's arguments that stand for it,
# the option a command-line user gives instead)
_OPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "mode='w'": (("mode",), "--mode w"),
    "resume=True": (("resume",), "--resume"),
    "break_lease=True": (("break_lease",), "--break-lease"),
    "strict=True": (("strict",), "--strict"),
    "path=)": (("path", "src_path"), "--path)"),
}


def _one_line(e: BaseException, args: argparse.Namespace | None = None) -> str:
    """The error in one line; for a command (``args``), a keyword of the Python call its
    message names as the command's option (``mode='w'``: ``--mode w``), where the message
    does not already speak of Python."""
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    if args is not None and "Python" not in text:
        for keyword, (dests, option) in _OPTIONS.items():
            if any(hasattr(args, dest) for dest in dests):
                text = text.replace(keyword, option)
    return f"{type(e).__name__}: {text}".rstrip(": ")


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.cmd is None or (args.cmd == "batch" and args.batch_cmd is None):
        sub = p if args.cmd is None else _subparser(p, "batch")
        sub.print_help(sys.stderr)
        return EXIT_USAGE
    if getattr(args, "progress", False) is None:  # a bar only where someone watches it
        args.progress = sys.stderr.isatty()
    show = args.traceback or os.environ.get("SHARDWISE_TRACEBACK", "") not in ("", "0")
    name = f"shardwise {args.cmd}" + (f" {args.batch_cmd}" if args.cmd == "batch" else "")
    try:
        args.storage_options = storage_options(args)
        with _log_lines(name), stop_on_signals():
            code: int = args.func(args)
            sys.stdout.flush()  # a reader gone (``| head``) is seen here, not at exit
    except (UsageError, argparse.ArgumentTypeError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Interrupted as e:
        again = " (--resume finishes it)" if hasattr(args, "resume") else ""
        print(f"{name}: {e}: the shards done are kept{again}", file=sys.stderr)
        if _pool.busy():  # tasks past the grace: the scheduler's SIGKILL would come next
            sys.stderr.flush()
            os._exit(e.exit_status)
        return e.exit_status
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line, whatever failed (the store, the input, a bug)
        if isinstance(e, BrokenPipeError) and _reader_gone():  # ``shardwise inspect X | head``
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # a silent exit
            return EXIT_PIPE
        if show:
            import traceback

            traceback.print_exc()
        where = getattr(args, "store", None) or getattr(args, "src", None)
        hint = "" if show else " (--traceback for details)"
        if isinstance(e, ShardwiseError):
            print(f"{name}: {_one_line(e, args)}", file=sys.stderr)
        elif where and not isinstance(e, ValueError | FileNotFoundError | FileExistsError):
            print(f"{name}: cannot open store {where}: {_one_line(e)}{hint}", file=sys.stderr)
        else:
            print(f"{name}: {_one_line(e)}{hint}", file=sys.stderr)
        return EXIT_FAILED
    return code


def _reader_gone() -> bool:
    """Whether the reader of stdout went away (the read end of its pipe closed): not a failure
    to report, unlike a broken connection to a store."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no fileno, no poll on this platform
        return False


@contextmanager
def _log_lines(name: str) -> Iterator[None]:
    """The ``shardwise`` logger's messages (a lease taken over, a stop) as lines on stderr."""
    log = logging.getLogger("shardwise")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{name}: %(message)s"))
    level = log.level
    log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _subparser(p: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise KeyError(name)
