"""Sphinx configuration of the documentation site (``bash dev.sh docs`` -> ``docs/_build/html``).

The pages are MyST markdown (``docs/*.md``, ``docs/guides/*.md``), the API reference
(``docs/api/*.rst``) is built from the numpydoc docstrings of the public verbs, and the command
line page from the CLI's own argparse parser (``shardwise.cli.parser.parser``). The build runs with
``-W --keep-going``: every warning fails it (numpydoc's validation, a broken link between pages, a
reference to a heading that is not there), in CI through ``tests/project/test_site.py``. Nothing is
fetched at build time: links to numpy, dask, xarray, zarr and icechunk resolve through inventories
kept in ``docs/_inventories`` (see the block at the end).
"""

from __future__ import annotations

import sys
from pathlib import Path

# the checkout this file sits in, before any installed shardwise: the reference documents the
# source next to it (a worktree, a CI checkout), not whatever the venv happens to import
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import shardwise

project = "shardwise"
version = release = shardwise.__version__
copyright = "the shardwise authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    # the command line page, generated from the parser so that it cannot drift from it
    "sphinx_argparse_cli",
    "sphinx.ext.intersphinx",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# headings up to ### get anchors, so [text](page.md#a-heading) links resolve (and fail the build
# when the heading is not there)
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
# option names and quoted messages print as typed: no curly quotes, no "--" turned into a dash
smartquotes = False

# the signature shows names and defaults; the types are in each Parameters section, written for
# readers (``int or str``), where the annotations would print the internal aliases
autodoc_typehints = "none"
# every cross-reference must resolve (a :class:`...` to nothing would render as plain text)
nitpicky = True
# zarr publishes no intersphinx inventory for its errors: ArrayNotFoundError's zarr base is named
# in its docstring instead of linked
nitpick_ignore = [("py:class", "zarr.errors.ArrayNotFoundError")]
autodoc_member_order = "bysource"
autosummary_generate = False  # the index's tables link to the hand-written pages, nothing generated
# the report classes' fields are documented in their own docstrings (Attributes)
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
# numpydoc checks every docstring it renders: each parameter of the signature documented (PR01),
# none that is not in it (PR02), in the signature's order (PR03), each with a type (PR04) and a
# description (PR07); a Returns section where the function returns a value (RT01), described
# (RT03). A violation is a warning, so the -W build fails on it.
numpydoc_validation_checks = {"PR01", "PR02", "PR03", "PR04", "PR07", "RT01", "RT03"}
# the reports, the job and the batch record are results a caller reads, never builds: their
# fields are documented as Attributes, not as constructor parameters (test_apidocs.py checks
# that every field is listed); their methods and properties are still validated
numpydoc_validation_exclude = {
    r"^shardwise\.(WriteReport|WritePlan|VerifyReport|ConvertReport|ArrayReport|ShardGeometry)$",
    r"^shardwise\.durability\.verify\.Problem$",
    r"^shardwise\.batch\.BatchPlan$",
    # made by shardwise.stream (stream_pyramid, stream_dataset, stream_geozarr), never built by
    # a caller: its state is documented as Attributes
    r"^shardwise\.(Stream|StreamPyramid|DatasetStream|GeoZarrStream)$",
}

html_theme = "pydata_sphinx_theme"
html_title = f"shardwise {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
# nothing to copy: no _static directory, so no warning about a missing one
html_static_path: list[str] = []
templates_path: list[str] = []
exclude_patterns = ["_build"]

# --- the gallery (sphinx-gallery) ----------------------------------------------------------------
# examples/gallery/*.py run at every build (each in this process, its printed output and its
# matplotlib figures, and the notebook picture of its last expression: a plan's or a shard map's
# SVG, captured into the page); the pages are generated into docs/gallery/ (not committed).
# An example that raises fails the build (sphinx-gallery's default: the build ends with an error
# listing the failing examples, whatever -W); tests/project/test_site.py checks that every script
# ran and drew. Examples are re-run even when unchanged (run_stale_examples): what a page shows
# is what today's code prints.
extensions.append("sphinx_gallery.gen_gallery")
sphinx_gallery_conf = {
    "examples_dirs": str(Path(__file__).resolve().parents[1] / "examples" / "gallery"),
    "gallery_dirs": "gallery",
    "filename_pattern": r"\.py$",  # every script runs, not only plot_*.py
    "run_stale_examples": True,
    "abort_on_example_error": False,  # run them all, then fail listing every one that raised
    "only_warn_on_example_error": False,
    "capture_repr": ("_repr_html_", "__repr__"),
    "image_scrapers": ("matplotlib",),
    "download_all_examples": False,
    "min_reported_time": 0,
    "show_signature": False,
    "remove_config_comments": True,
}
# --- end of the gallery --------------------------------------------------------------------------
# --- cross-links to python, numpy, dask, xarray, zarr and icechunk ---------------------------
# intersphinx reads each project's inventory from docs/_inventories (written by
# make_inventories.py there, with the real addresses on each project's stable site): the build
# fetches nothing. Types in the numpydoc sections link through numpydoc_xref_aliases: only the
# names listed there (a word not listed stays plain text), each resolved through an inventory or
# this site's own reference, or the -W build fails (nitpicky).
_INVENTORIES = Path(__file__).resolve().parent / "_inventories"
intersphinx_mapping = {
    name: (url, str(_INVENTORIES / f"{name}.inv"))
    for name, url in {
        "python": "https://docs.python.org/3/",
        "numpy": "https://numpy.org/doc/stable/",
        "dask": "https://docs.dask.org/en/stable/",
        "xarray": "https://docs.xarray.dev/en/stable/",
        "zarr": "https://zarr.readthedocs.io/en/stable/",
        "icechunk": "https://icechunk.io/en/stable/",
    }.items()
}
numpydoc_xref_param_type = True
numpydoc_xref_ignore = "all"
_EXTERNAL = [
    "numpy.ndarray", "numpy.dtype", "dask.array.Array", "dask.delayed.Delayed",
    "xarray.Dataset", "xarray.DataArray", "xarray.DataTree", "zarr.Array", "zarr.Group",
    "zarr.abc.store.Store", "zarr.storage.MemoryStore", "zarr.storage.LocalStore",
    "zarr.storage.FsspecStore", "icechunk.Session", "icechunk.Repository",
    "os.PathLike", "pathlib.Path", "int", "float", "str", "dict", "list", "tuple", "slice",
]  # fmt: skip
_OWN = [
    "WriteReport", "WritePlan", "ShardGeometry", "VerifyReport", "ConvertReport",
    "ArrayReport", "Stream", "StreamPyramid", "RegionWriter",
]  # fmt: skip
numpydoc_xref_aliases = {
    # a role, as numpydoc leaves a name mapped to itself unlinked under "all"
    **{name: f":obj:`{name}`" for name in _EXTERNAL},
    **{name: f"shardwise.{name}" for name in _OWN},
    "bool": ":obj:`bool`",  # the class, where numpydoc's default is a label of the python docs
    "Problem": "shardwise.durability.verify.Problem",
    "BatchPlan": "shardwise.batch.BatchPlan",
}
# --- end of the cross-links ------------------------------------------------------------------
