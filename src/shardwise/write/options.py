"""What one write call decided, as one value checked once where the call comes in.

Two records carry a write's keywords, so that no front end passes them on by name:

- :class:`~shardwise.engine.write.WriteSettings`: what travels to the workers with every shard
  task (``write_empty_chunks``, ``threads``; ``fsync`` travels in the task's ``ShardStore``).
- :class:`WriteOptions`: what the call decided and the client acts on (mode, region,
  append_dim, resume, lease, strategy, memory limit, compute, progress, dry run, the new
  array's ``zarr.create_array`` keywords), with the worker record inside it. ``write_array`` and a
  batch part build it with :meth:`WriteOptions.checked`, which refuses a keyword of the wrong
  type or value before the store is looked at (``write_array`` hands it the keywords of its
  signature named by :meth:`WriteOptions.keywords`, declared once there); ``write_pyramid``,
  ``convert`` and ``to_zarr`` check the keywords they share with ``write_array`` by the same
  method (``to_zarr``: but those xarray means its own way, its modes, a region and shards by
  dimension name, ``write_empty_chunks=None``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from ..core import args
from ..core.job import STRATEGIES, Strategy
from ..core.layout import RegionArg
from ..engine.write import Mode, WriteSettings
from ..errors import InvalidTypeError, InvalidValueError

MODES = ("w", "w-", "a", "r+")

# the keywords of zarr.create_array a write takes for a new array, and their defaults
# (``WriteOptions.create``; "auto": shardwise's default)
CREATE_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    dict(
        chunks="auto",
        shards=None,
        dtype=None,
        fill_value=None,
        compressors="auto",
        filters="auto",
        serializer="auto",
        dimension_names=None,
        attributes=None,
        chunk_key_encoding=None,
    )
)

# the flags, checked in this order (that of write_array's signature)
_FLAGS = ("fsync", "compute", "progress", "resume", "break_lease", "dry_run")

# what WriteOptions.checked takes besides the record's own fields and CREATE_DEFAULTS: the
# format (checked, not kept) and what the worker record and the memory limit are built from
_BUILT = ("zarr_format", "threads", "write_empty_chunks", "memory_limit")


@dataclass(frozen=True)
class WriteOptions:
    """What one write call decided (never sent to the workers: ``settings`` is what is).

    Built by :meth:`checked` at the API edge; ``create`` holds the ``zarr.create_array``
    keywords for a new array (those the caller left out: their defaults)."""

    mode: Mode = "w-"
    path: str | None = None
    region: RegionArg | None = None
    append_dim: int | str | None = None
    storage_options: dict[str, Any] | None = None
    fsync: bool = False
    compute: bool = True
    progress: bool = False
    resume: bool = False
    lease: bool | None = None
    break_lease: bool = False
    strategy: Strategy = "auto"
    memory_limit: int | None = None
    dry_run: bool = False
    settings: WriteSettings = field(default_factory=WriteSettings)
    create: Mapping[str, Any] = CREATE_DEFAULTS

    @classmethod
    def keywords(cls) -> frozenset[str]:
        """The names :meth:`checked` takes from a front end: every keyword of
        :func:`~shardwise.write_array` but ``commit`` (the icechunk session's)."""
        own = {f.name for f in fields(cls)} - {"settings", "create"}
        return frozenset(own | set(CREATE_DEFAULTS) | set(_BUILT))

    @classmethod
    def checked(
        cls,
        *,
        modes: tuple[str, ...] = MODES,
        verb: str = "write_array",
        via: str | None = None,
        zarr_format: Any = 3,
        threads: Any = None,
        write_empty_chunks: Any = False,
        memory_limit: Any = None,
        **keywords: Any,
    ) -> WriteOptions:
        """The record of :func:`~shardwise.write_array`'s keywords (those given; the others
        take its defaults), every one checked, in the order of its signature so that the
        first one wrong is named: :class:`InvalidTypeError` or :class:`InvalidValueError`.
        ``modes``: the modes this front end takes; ``verb``: the public call these keywords
        were given to, named when one is refused (``via``: the call that passed its own
        ``**keywords`` on to ``verb``, e.g. ``batch.write_part`` to ``write_array``)."""
        own = {f.name for f in fields(cls)} - {"settings", "create", "memory_limit"}
        _refuse_unknown(keywords, own | set(CREATE_DEFAULTS), verb, via)
        if type(zarr_format) is not int or zarr_format != 3:
            raise InvalidValueError(
                f"zarr_format must be 3 (shardwise writes Zarr format 3 only), got {zarr_format!r}"
            )
        given = {k: v for k, v in keywords.items() if k in own}
        if "mode" in given and given["mode"] is None:  # write_array's: "a" with append_dim
            given["mode"] = "a" if given.get("append_dim") is not None else cls.mode
        args.choice("mode", given.get("mode", cls.mode), modes)
        args.choice("strategy", given.get("strategy", cls.strategy), STRATEGIES)
        settings = WriteSettings(
            write_empty_chunks=write_empty_chunks, threads=args.thread_count("threads", threads)
        )
        limit = args.optional_byte_size("memory_limit", memory_limit)
        args.flags(
            write_empty_chunks=write_empty_chunks,
            **{k: given[k] for k in _FLAGS if k in given},
        )
        args.optional_flags(lease=given.get("lease"))
        args.store_path("path", given.get("path"))
        args.mapping("storage_options", given.get("storage_options"))
        args.region("region", given.get("region"))
        _check_append(given.get("append_dim"), given.get("mode", cls.mode), given.get("region"))
        create = {**CREATE_DEFAULTS, **{k: v for k, v in keywords.items() if k in CREATE_DEFAULTS}}
        return cls(**given, memory_limit=limit, settings=settings, create=create)


def _check_append(append_dim: Any, mode: Any, region: Any) -> None:
    """Refuse an ``append_dim`` that is not an axis (an int) or a dimension name (a str), or
    that comes with a mode other than "a" or with ``region`` (as ``to_zarr`` refuses them)."""
    if append_dim is None:
        return
    if not isinstance(append_dim, int | str) or isinstance(append_dim, bool):
        raise InvalidTypeError(
            f"append_dim must be an axis (int), a dimension name (str) or None, got "
            f"{append_dim!r} of type {type(append_dim).__name__}"
        )
    if mode != "a":
        raise InvalidValueError(
            f"append_dim needs mode='a' (or None), got mode={mode!r} (an append writes into an "
            "existing array)"
        )
    if region is not None:
        raise InvalidValueError(
            "append_dim and region cannot be given together: an append writes at the end of "
            "the array"
        )


def _refuse_unknown(
    keywords: Mapping[str, Any], known: set[str], verb: str = "write_array", via: str | None = None
) -> None:
    """An :class:`InvalidTypeError` naming a keyword ``verb`` (the public call it was given to:
    ``write_array``, ``write_pyramid``, ``convert``, ...) does not take, and the nearest it
    takes, as Python names an unexpected keyword argument; ``via``: the call that passed its
    ``**keywords`` on to ``verb``."""
    taken = known | set(_BUILT)
    for name in sorted(set(keywords) - known):
        near = difflib.get_close_matches(name, sorted(taken), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        passed = f", which {via} passes its keywords to" if via else ""
        raise InvalidTypeError(f"{name!r} is not a keyword of {verb}{hint}{passed}")
