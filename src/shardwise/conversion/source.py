"""The source of a conversion as a dask array, for re-encoding and for the check by value."""

from __future__ import annotations

import gzip
import lzma
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compat import with_rectilinear_grids
from ..errors import CorruptShardError
from .plan import ArrayPlan, SourceChunks


@with_rectilinear_grids
def source_array(plan: ArrayPlan, zsrc: Any) -> Any:
    """The source array of ``plan`` as a dask array (a sharded v3 one read by shardwise). A
    source chunk that does not decode raises :class:`CorruptShardError` naming its store key."""
    import dask.array as da
    import zarr
    from dask.base import tokenize

    arr = zarr.open_array(zsrc, path=plan.src_path, mode="r")
    if plan.source.shard_codec is not None:
        from ..api import open_array

        return open_array(zsrc, path=plan.src_path)  # a dask chunk per shard
    if plan.source.rectilinear:  # zarr-python's rectilinear chunks, read its largest at a time
        objects = chunks = plan.source.chunk_shape
    else:
        objects = getattr(arr, "shards", None) or arr.chunks  # the grid of its stored objects
        chunks = tuple(int(c) for c in arr.chunks)
    reader = _Chunks(arr, plan.src_path, plan.source, tuple(int(c) for c in objects))
    return da.from_array(
        reader, chunks=chunks, name=f"source-{tokenize(arr, plan.src_path, chunks)}"
    )


# what decoders raise for bytes that do not decode: numcodecs' zstd and blosc (RuntimeError),
# zlib and gzip (zlib.error, gzip.BadGzipFile, EOFError), bz2 (an OSError raised in bz2, told
# from the store's OSErrors by where it was raised), lzma (LZMAError), zarr's checksums and
# sizes (ValueError)
_DECODE_ERRORS = (RuntimeError, ValueError, EOFError, OSError, zlib.error, lzma.LZMAError)


@dataclass(frozen=True)
class _Chunks:
    """A zarr array read one chunk at a time; what fails to decode is named by its key."""

    arr: Any
    path: str
    source: SourceChunks
    objects: tuple[int, ...]  # the shape of one stored object: a chunk, or a shard

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.arr.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = np.dtype(self.arr.dtype)
        return dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, sel: Any) -> Any:
        try:
            return self.arr[sel]
        except _DECODE_ERRORS as e:
            if isinstance(e, OSError) and not _decoder_error(e):
                raise  # the store's (a file or a connection), not the chunk's
            sel = sel if isinstance(sel, tuple) else (sel,)
            first = [s.start or 0 if isinstance(s, slice) else 0 for s in sel]
            coords = [a // c for a, c in zip(first, self.objects, strict=False)]
            key = "/".join(p for p in (self.path, self.source.key(coords)) if p)
            raise CorruptShardError(
                key, f"source chunk does not decode: {type(e).__name__}: {e}"
            ) from e


def _decoder_error(e: OSError) -> bool:
    """Whether an OSError is a decoder's (gzip's bad file, or raised inside bz2), not the
    store's."""
    if isinstance(e, gzip.BadGzipFile):
        return True
    tb, last = e.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and "bz2" in str(last.tb_frame.f_globals.get("__name__", ""))
