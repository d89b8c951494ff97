"""The ``shardwise`` argument parser: every value is checked here, so a malformed one is a
usage error (exit 2) naming the option before any store is opened."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, NoReturn

from . import commands
from .status import EXIT_STATUS, EXIT_USAGE


def _shape(text: str) -> tuple[int, ...]:
    """Sizes like ``256,256,64`` (or ``256x256x64``), each a whole number >= 1."""
    try:
        shape = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive sizes like 256,256,64, got {text!r}"
        ) from None
    return shape


def _shards_arg(text: str, chunks: bool = False) -> Any:
    """``256,256,64`` (a shape), ``time=365,lat=90`` (sizes per dimension name; a size may
    be shard extents ``31/28/31``), a target
    (``2GB``, ``XY``), ``auto`` or ``none`` (unsharded), parsed as :func:`shardwise.convert`
    then checks and rounds it (core/shardspec.py); ``chunks``: a shape or sizes by name."""
    from ..core.shardspec import check_chunks, check_shards, parse_shards

    if not chunks and text.strip().lower() in ("none", "auto"):
        return None if text.strip().lower() == "none" else "auto"
    try:
        # sizes below 1 are bad usage (2) like unparsable text, before any store is opened
        return (check_chunks if chunks else check_shards)(parse_shards(text))
    except (ValueError, TypeError) as e:
        what = "chunks must be sizes like 64,64 or name=size pairs like time=10, got "
        raise argparse.ArgumentTypeError(what + repr(text) if chunks else str(e)) from None


def _checked(option: str, check: Callable[[str, Any], Any], convert: Any = str) -> Any:
    """An argparse ``type`` that runs a :mod:`shardwise.core.args` check: its refusal is a usage
    error naming ``option``, with the check's own account of what the option accepts."""
    from ..errors import InvalidTypeError, InvalidValueError

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        try:
            return check(option, value)
        except (InvalidTypeError, InvalidValueError) as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{option} ")) from None

    return parse


def _size(option: str) -> Any:
    from ..core.args import byte_size

    return _checked(option, byte_size)


def _positive(option: str) -> Any:
    from ..core.args import positive_int

    return _checked(option, positive_int, int)


def _index(text: str) -> int:
    """A part number or a job array's first index: a whole number >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {n}")
    return n


def _dtype(text: str) -> str:
    """A ``--dtype`` zarr understands (float32, <i4, string, datetime64[s], ...)."""
    from zarr.core.dtype import parse_dtype

    try:
        parse_dtype(text, zarr_format=3)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected a data type such as float32, int16, <i4, string or datetime64[s], "
            f"got {text!r}"
        ) from None
    return text


def _compressor(text: str) -> str:
    """A ``--compressor`` spec, checked by building it (``zstd:x`` or ``lz5`` is bad usage)."""
    try:
        commands.compressors(text, False)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(
            f"expected zstd[:level], gzip[:level], blosc[:cname[:clevel]], none or auto, got "
            f"{text!r} ({e})"
        ) from None
    return text


def _levels(text: str) -> Any:
    """``--levels``: ``auto`` or a count of levels, level 0 included (checked as
    write_pyramid checks ``levels=``)."""
    from ..pyramid.options import levels

    return _checked("--levels", lambda _, v: v if v == "auto" else levels(v), _auto_or_int)(text)


def _auto_or_int(text: str) -> Any:
    return text if text == "auto" else int(text)


def _png(text: str) -> str:
    """A ``--plot`` file: a .png name in a directory that exists."""
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"expected a file name ending in .png, got {text!r}")
    folder = os.path.dirname(text) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"no directory {folder!r} to write {text!r} into")
    return text


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (exit 2), like every other failure."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _common_args(q: argparse.ArgumentParser) -> None:
    q.add_argument(
        "--storage-option",
        dest="storage_option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec storage option for every store this command opens, e.g. "
        "endpoint_url=http://host:9000 or anon=true (VALUE is read as JSON when it parses, "
        "else as a string); repeat for more",
    )
    q.add_argument(
        "--storage-options",
        dest="storage_options_json",
        default=None,
        metavar="JSON",
        help="fsspec storage options as one JSON object, e.g. '{\"anon\": true}'",
    )
    q.add_argument(
        "--traceback",
        action="store_true",
        help="on failure, print the full traceback (also: SHARDWISE_TRACEBACK=1)",
    )


def _store_args(q: argparse.ArgumentParser) -> None:
    q.add_argument("store", help="array location: a local directory or a URL (s3://...)")
    q.add_argument("--path", default=None, help="the array's path inside the store")
    _common_args(q)


def _threads_arg(q: argparse.ArgumentParser, what: str) -> None:
    q.add_argument("--threads", type=_positive("--threads"), default=None, metavar="N", help=what)


def _progress_arg(q: argparse.ArgumentParser) -> None:
    q.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar over the shards done and the bytes moved on stderr (default: on "
        "when stderr is a terminal, off in a batch job's log)",
    )


def _write_args(q: argparse.ArgumentParser) -> None:
    q.add_argument("--resume", action="store_true", help="continue an interrupted write")
    q.add_argument(
        "--break-lease",
        action="store_true",
        help="take over the lease of a writer known to be gone",
    )
    q.add_argument("--fsync", action="store_true", help="fsync every shard (local files)")
    _threads_arg(q, "inner-chunk codec threads (default: the cores)")
    q.add_argument(
        "--scheduler",
        default=None,
        help="threads (default), processes, synchronous, or a dask scheduler address",
    )
    _progress_arg(q)


def _codec_args(q: argparse.ArgumentParser, layout: bool = False) -> None:
    """The layout options: ``batch init``'s shapes; convert's and reshard's grammar
    (``layout``: shapes, sizes per dimension name, targets, ``none``)."""
    shards = "shard shape (256,256)" + (
        ", sizes per dimension name (time=365), shard extents joined by / for an axis "
        "(time=31/28/31 or 31/28/31,181,360: a rectilinear grid, the extents summing to the "
        'axis length), a byte size (2GB), axis names (XY, "one per time step"), auto '
        "(default: of --shard-bytes) or none (unsharded)" * layout
    )
    q.add_argument("--shards", type=_shards_arg if layout else _shape, help=shards,
                   **(dict(default="auto") if layout else dict(required=True)))  # fmt: skip
    if layout:
        size = "target shard size, e.g. 64MiB (default 64 MiB)"
        q.add_argument("--shard-bytes", type=_size("--shard-bytes"), metavar="SIZE", help=size)
    chunks = "inner chunk shape (64,64)" + " or sizes per dimension name (time=10)" * layout
    q.add_argument("--chunks", type=(lambda t: _shards_arg(t, True)) if layout else _shape,
                   default=None, help=f"{chunks} (default: the source's chunks)")  # fmt: skip
    q.add_argument(
        "--compressor",
        type=_compressor,
        default=None,
        help="zstd[:level], gzip[:level], blosc[:cname[:clevel]], none, auto (auto: zstd "
        "with its frame checksum; default: reshard keeps the source's codecs, batch init "
        "uses auto)",
    )
    q.add_argument("--crc32c", action="store_true", help="checksum every inner chunk")


def _target_args(q: argparse.ArgumentParser, src_help: str) -> None:
    """convert's and reshard's source and destination."""
    q.add_argument("src", help=src_help)
    q.add_argument("dst", help="destination store: a local directory or a URL")
    q.add_argument(
        "--src-path",
        "--path",
        dest="src_path",
        default=None,
        help="the source array's or group's path inside SRC",
    )
    q.add_argument("--dst-path", default=None, help="the path to write to inside DST")
    _common_args(q)


def _finish_args(q: argparse.ArgumentParser, verify_help: str) -> None:
    q.add_argument(
        "--mode",
        default="w-",
        choices=["w-", "w"],
        help="w- (default): refuse when DST already holds an array; w: replace it",
    )
    q.add_argument("--no-lease", action="store_true", help="do not take the write lease")
    q.add_argument("--verify", action="store_true", help=verify_help)


def _add_inspect_verify(sub: Any) -> None:
    q = sub.add_parser("inspect", help="show an array's layout, storage and writer state")
    _store_args(q)
    q.add_argument("--json", action="store_true", help="print the summary as JSON")
    q.add_argument(
        "--plot",
        type=_png,
        default=None,
        metavar="FILE.png",
        help="also draw the array's shards (stored, empty, missing) into this PNG file "
        "(needs matplotlib; N-D arrays: one panel per shard of the leading axes)",
    )
    q.set_defaults(func=commands.cmd_inspect)

    q = sub.add_parser("verify", help="check every shard; exit 1 on any problem")
    _store_args(q)
    _threads_arg(q, "shards checked at a time (default: the cores)")
    q.add_argument(
        "--strict",
        action="store_true",
        help="shards written or changed by another tool (sound, but not as shardwise recorded "
        "them) are problems (exit 1), not notes",
    )
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    _progress_arg(q)
    q.set_defaults(func=commands.cmd_verify)


def _add_convert_reshard(sub: Any) -> None:
    q = sub.add_parser(
        "convert",
        help="convert a zarr v2/v3 array or group into sharded v3 (copies encoded chunks)",
    )
    _target_args(q, "source zarr array or group (v2 or v3)")
    _codec_args(q, layout=True)
    _pyramid_args(q)
    _write_args(q)
    _finish_args(q, "check the result against the source; exit 1 when it differs")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.set_defaults(func=commands.cmd_convert)

    q = sub.add_parser(
        "reshard", help="copy an array or group into new shards or chunks (convert's options)"
    )
    _target_args(q, "source zarr array or group (any zarr format and chunking)")
    _codec_args(q, layout=True)
    _write_args(q)
    _finish_args(q, "verify the result afterwards; exit 1 when it differs")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.set_defaults(func=commands.cmd_reshard)


def _pyramid_args(q: argparse.ArgumentParser) -> None:
    """convert's pyramid: the keywords of ``convert(pyramid={...})`` under their own names."""
    q.add_argument(
        "--pyramid",
        action="store_true",
        help="write the array as an OME-Zarr 0.5 pyramid at DST: level 0 the array (group "
        "member 0), levels 1.. reduced from it in the same graph (the source read once)",
    )
    q.add_argument(
        "--levels",
        type=_levels,
        default=None,
        metavar="N",
        help="with --pyramid: the number of levels, level 0 included, or auto (the default: "
        "until the image fits one inner chunk)",
    )
    q.add_argument(
        "--factors",
        type=_positive("--factors"),
        default=None,
        metavar="F",
        help="with --pyramid: the reduction of each space axis from one level to the next "
        "(default 2)",
    )
    q.add_argument(
        "--method",
        choices=["mean", "nearest", "mode"],
        default=None,
        help="with --pyramid: mean (default), nearest or mode (labels)",
    )


def _add_batch(sub: Any) -> None:
    q = sub.add_parser("batch", help="HPC batch writes in shard-disjoint parts")
    bsub = q.add_subparsers(dest="batch_cmd", metavar="STEP", help="the step of the batch")
    b = bsub.add_parser("init", help="write the metadata and split the array into parts")
    _store_args(b)
    b.add_argument("--parts", type=_positive("--parts"), required=True, help="the number of parts")
    b.add_argument("--source", default=None, help="take shape, dtype, fill value from this array")
    b.add_argument("--source-path", default=None, help="the source array's path inside SOURCE")
    b.add_argument("--shape", type=_shape, default=None, help="array shape (without --source)")
    b.add_argument(
        "--dtype", type=_dtype, default=None, help="data type, e.g. float32 (without --source)"
    )
    b.add_argument("--fill-value", type=float, default=None, help="fill value (default: 0)")
    b.add_argument(
        "--mode",
        default="w-",
        choices=["w-", "w", "r+"],
        help="w- (default): refuse an existing array; w: replace it; r+: write into it",
    )
    b.add_argument(
        "--break-lease", action="store_true", help="take over the lease of a writer known gone"
    )
    _codec_args(b)
    b = bsub.add_parser("part", help="write one part (default: the job-array task id)")
    _store_args(b)
    b.add_argument("--source", required=True, help="the array to copy the part from")
    b.add_argument("--source-path", default=None, help="the source array's path inside SOURCE")
    b.add_argument(
        "--part", type=_index, default=None, help="the part to write (default: the task id)"
    )
    b.add_argument(
        "--index-base",
        type=_index,
        default=0,
        help="first task id of the job array (1 for PBS/SGE arrays numbered from 1)",
    )
    _write_args(b)
    b = bsub.add_parser("finalize", help="check all parts and verify; exit 1 on problems")
    _store_args(b)
    _threads_arg(b, "shards checked at a time (default: the cores)")
    b = bsub.add_parser("status", help="which parts are done")
    _store_args(b)
    q.set_defaults(func=commands.cmd_batch)


def _add_lease(sub: Any) -> None:
    q = sub.add_parser("lease", help="show (or break) an array's write lease")
    _store_args(q)
    q.add_argument(
        "--break",
        dest="break_",
        action="store_true",
        help="remove the lease: only when its holder is known to be gone",
    )
    q.add_argument("--part", type=_index, default=None, help="a batch part's lease instead")
    q.add_argument(
        "--nparts",
        type=_positive("--nparts"),
        default=None,
        help="the batch's part count (default: read from the open batch)",
    )
    q.set_defaults(func=commands.cmd_lease)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="shardwise",
        description="Inspect, verify, convert and batch-write Zarr v3 sharded arrays.",
        epilog=EXIT_STATUS,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    # not required=True: a bare `shardwise` prints the help listing the commands (exit 2)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", help="one of")
    _add_inspect_verify(sub)
    _add_convert_reshard(sub)
    _add_batch(sub)
    _add_lease(sub)
    _state_exit_status(p)
    return p


def _version() -> str:
    """The installed package's version (its metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardwise")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def _state_exit_status(p: argparse.ArgumentParser) -> None:
    """Every command's --help ends with the exit status, as the top level's does."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.epilog = EXIT_STATUS
                _state_exit_status(child)
