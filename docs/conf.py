"""Sphinx configuration of the documentation site (``bash dev.sh docs`` -> ``docs/_build/html``).

The pages are MyST markdown (``docs/*.md``, ``docs/guides/*.md``), the API reference
(``docs/api/*.rst``) is built from the numpydoc docstrings of the public verbs, and the command
line page from the CLI's own argparse parser (``shardwise.cli.parser.parser``). The build runs with
``-W --keep-going``: every warning fails it (numpydoc's validation, a broken link between pages, a
reference to a heading that is not there), in CI through ``tests/project/test_site.py``. Nothing is
fetched at build time: links to numpy, dask, xarray, zarr and icechunk are plain links.
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
