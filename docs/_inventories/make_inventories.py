"""Write the intersphinx inventories of the projects the documentation links to (numpy, dask,
xarray, zarr, icechunk, python), so that the build fetches nothing: ``conf.py`` reads these files.

Each inventory lists only the objects the site references, each with its real address on its
project's stable documentation. To link one more object: add a line to ``ENTRIES`` (the object's
full name, its role, and its page on that site, ``$`` standing for the name as an anchor), run
``python docs/_inventories/make_inventories.py`` and commit the ``.inv`` files it rewrites.
The format is Sphinx's (version 2: four header lines, then zlib-compressed lines of
``name domain:role priority uri display-name``), which ``sphinx.util.inventory`` reads.
"""

from __future__ import annotations

import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent

# project -> (its stable documentation, as in conf.py's intersphinx_mapping)
SITES = {
    "python": "https://docs.python.org/3/",
    "numpy": "https://numpy.org/doc/stable/",
    "dask": "https://docs.dask.org/en/stable/",
    "xarray": "https://docs.xarray.dev/en/stable/",
    "zarr": "https://zarr.readthedocs.io/en/stable/",
    "icechunk": "https://icechunk.io/en/stable/",
}

# project -> [(full name, role, page relative to the site)]
ENTRIES: dict[str, list[tuple[str, str, str]]] = {
    "python": [
        ("int", "py:class", "library/functions.html#$"),
        ("float", "py:class", "library/functions.html#$"),
        ("str", "py:class", "library/stdtypes.html#$"),
        ("bool", "py:class", "library/functions.html#$"),
        ("dict", "py:class", "library/stdtypes.html#$"),
        ("list", "py:class", "library/stdtypes.html#$"),
        ("tuple", "py:class", "library/stdtypes.html#$"),
        ("slice", "py:class", "library/functions.html#$"),
        ("os.PathLike", "py:class", "library/os.html#$"),
        ("pathlib.Path", "py:class", "library/pathlib.html#$"),
        ("ValueError", "py:exception", "library/exceptions.html#$"),
        ("TypeError", "py:exception", "library/exceptions.html#$"),
        ("KeyError", "py:exception", "library/exceptions.html#$"),
        ("RuntimeError", "py:exception", "library/exceptions.html#$"),
        ("FileExistsError", "py:exception", "library/exceptions.html#$"),
        ("FileNotFoundError", "py:exception", "library/exceptions.html#$"),
        ("PermissionError", "py:exception", "library/exceptions.html#$"),
        ("ImportError", "py:exception", "library/exceptions.html#$"),
        ("IndexError", "py:exception", "library/exceptions.html#$"),
        ("OSError", "py:exception", "library/exceptions.html#$"),
        ("KeyboardInterrupt", "py:exception", "library/exceptions.html#$"),
        ("Exception", "py:exception", "library/exceptions.html#$"),
        ("None", "py:data", "library/constants.html#$"),
        ("True", "py:data", "library/constants.html#$"),
        ("False", "py:data", "library/constants.html#$"),
        ("callable", "py:function", "library/functions.html#$"),
        ("iterable", "std:term", "glossary.html#term-iterable"),
        ("sequence", "std:term", "glossary.html#term-sequence"),
        ("hashable", "std:term", "glossary.html#term-hashable"),
    ],
    "numpy": [
        ("numpy.ndarray", "py:class", "reference/generated/numpy.ndarray.html#$"),
        ("numpy.dtype", "py:class", "reference/generated/numpy.dtype.html#$"),
        ("numpy.asarray", "py:function", "reference/generated/numpy.asarray.html#$"),
        ("array_like", "std:term", "glossary.html#term-array_like"),
        ("arrays.scalars", "std:label", "reference/arrays.scalars.html#arrays-scalars"),
    ],
    "dask": [
        ("dask.array.Array", "py:class", "generated/dask.array.Array.html#$"),
        ("dask.array.from_array", "py:function", "generated/dask.array.from_array.html#$"),
        ("dask.array.store", "py:function", "generated/dask.array.store.html#$"),
        ("dask.array.to_zarr", "py:function", "generated/dask.array.to_zarr.html#$"),
        ("dask.compute", "py:function", "api.html#$"),
        ("dask.delayed.Delayed", "py:class", "delayed-api.html"),
    ],
    "xarray": [
        ("xarray.Dataset", "py:class", "generated/xarray.Dataset.html#$"),
        ("xarray.DataArray", "py:class", "generated/xarray.DataArray.html#$"),
        ("xarray.DataTree", "py:class", "generated/xarray.DataTree.html#$"),
        ("xarray.open_dataset", "py:function", "generated/xarray.open_dataset.html#$"),
        ("xarray.open_datatree", "py:function", "generated/xarray.open_datatree.html#$"),
        ("xarray.open_zarr", "py:function", "generated/xarray.open_zarr.html#$"),
        ("xarray.Dataset.to_zarr", "py:method", "generated/xarray.Dataset.to_zarr.html#$"),
        ("xarray.DataArray.to_zarr", "py:method", "generated/xarray.DataArray.to_zarr.html#$"),
        ("xarray.DataTree.to_zarr", "py:method", "generated/xarray.DataTree.to_zarr.html#$"),
    ],
    "zarr": [
        ("zarr.Array", "py:class", "api/zarr/array/#$"),
        ("zarr.Group", "py:class", "api/zarr/group/#$"),
        ("zarr.open_array", "py:function", "api/zarr/functions/open_array/#$"),
        ("zarr.open_group", "py:function", "api/zarr/functions/open_group/#$"),
        ("zarr.create_array", "py:function", "api/zarr/functions/create_array/#$"),
        ("zarr.abc.store.Store", "py:class", "api/zarr/abc/store/#$"),
        ("zarr.storage.StoreLike", "py:data", "api/zarr/storage/#$"),
        ("zarr.storage.MemoryStore", "py:class", "api/zarr/storage/#$"),
        ("zarr.storage.LocalStore", "py:class", "api/zarr/storage/#$"),
        ("zarr.storage.FsspecStore", "py:class", "api/zarr/storage/#$"),
        ("zarr.storage.ObjectStore", "py:class", "api/zarr/storage/#$"),
        ("zarr.errors.ArrayNotFoundError", "py:exception", "api/zarr/errors/#$"),
    ],
    "icechunk": [
        ("icechunk.Repository", "py:class", "reference/#$"),
        ("icechunk.Session", "py:class", "reference/session/#icechunk.session.Session"),
        ("icechunk.IcechunkStore", "py:class", "reference/#$"),
    ],
}


def inventory(project: str, entries: list[tuple[str, str, str]]) -> bytes:
    """The bytes of a version 2 inventory of ``entries`` (name, role, page)."""
    head = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n"
        "# Version: stable\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    # terms and labels have priority -1 (as Sphinx writes them), objects 1
    body = "".join(
        f"{name} {role} {-1 if role.startswith('std:') else 1} {page} -\n"
        for name, role, page in sorted(entries)
    )
    return head.encode() + zlib.compress(body.encode(), 9)


def main() -> None:
    for project, entries in ENTRIES.items():
        (HERE / f"{project}.inv").write_bytes(inventory(project, entries))


if __name__ == "__main__":
    main()
