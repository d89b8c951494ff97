"""The documentation site (docs/, ``bash dev.sh docs``) builds with warnings as errors; its API
reference (docs/api/) documents every public name with the parameters of its signature, and its
command line page every command and option of the parser; its gallery (examples/gallery/, run by
sphinx-gallery at every build) a page per script, with what the script printed and drew.

The build runs once per module into a temp directory (``sphinx-build -W --keep-going``, as
``dev.sh docs`` runs it; the gallery's pages are generated into docs/gallery/, not committed);
the tests read the HTML it wrote. Other builds, of a page documenting a function whose docstring
misses a parameter, of pages linking to what is not there and of a gallery whose example raises,
prove that the configuration fails the build on them rather than only warning.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import inspect
import re
import runpy
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shardwise
from shardwise import batch
from shardwise.cli.parser import parser
from shardwise.durability.verify import Problem

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONF = DOCS / "conf.py"
GALLERY = ROOT / "examples" / "gallery"  # the gallery's scripts; their pages: docs/gallery/

# public name -> the page documenting it (the functions each have their own page)
VERB_PAGES = {
    name: f"{name}.html"
    for name in (
        "write_array",
        "plan_write",
        "plan_shards",
        "open_array",
        "read_array",
        "to_zarr",
        "to_icechunk",
        "open_dataset",
        "open_datatree",
        "convert",
        "verify",
        "write_pyramid",
        "stream",
    )
}
BATCH_VERBS = ("init", "write_part", "finalize", "open_batch")
REPORTS: dict[str, type[Any]] = {
    "shardwise.WriteReport": shardwise.WriteReport,
    "shardwise.WritePlan": shardwise.WritePlan,
    "shardwise.ShardGeometry": shardwise.ShardGeometry,
    "shardwise.VerifyReport": shardwise.VerifyReport,
    "shardwise.ConvertReport": shardwise.ConvertReport,
    "shardwise.ArrayReport": shardwise.ArrayReport,
    "shardwise.durability.verify.Problem": Problem,
    "shardwise.batch.BatchPlan": batch.BatchPlan,
}


def sphinx_build(src: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``sphinx-build -W --keep-going`` of ``src`` into ``out``, as ``dev.sh docs`` runs it."""
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", src, out],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site") / "html"
    done = sphinx_build(DOCS, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # -q: only warnings would be printed
    return out / "api"


@pytest.fixture(scope="module")
def site(built: Path) -> Path:
    return built.parent


def entry(page: str, name: str) -> str:
    """The HTML of the entry of ``name`` on ``page``: from its anchor to the next entry that is
    not one of its members."""
    start = page.find(f'id="{name}"')
    assert start >= 0, f"{name} is not documented on the page"
    nxt = re.compile(r'id="(shardwise\.[\w.]+)"')
    end = len(page)
    for m in nxt.finditer(page, start + 1):
        if not m.group(1).startswith(name + "."):
            end = m.start()
            break
    return page[start:end]


def fields(block: str) -> dict[str, list[str]]:
    """The numpydoc sections of an entry (Parameters, Returns, Raises, Attributes, ...) and the
    names each lists (Returns and Raises list types; Parameters and Attributes names)."""
    out: dict[str, list[str]] = {}
    heads = list(re.finditer(r'<dt class="field-(?:odd|even)">(\w[\w ]*)<span', block))
    for i, head in enumerate(heads):
        # a member's own sections (a method's Parameters) are not this entry's
        body_end = heads[i + 1].start() if i + 1 < len(heads) else len(block)
        member = re.search(r'id="shardwise\.', block[head.end() : body_end])
        body = block[head.end() : head.end() + member.start() if member else body_end]
        # "filters, serializer : ..." documents two parameters in one entry
        names = [
            one for n in re.findall(r"<dt><strong>(.*?)</strong>", body) for one in n.split(", ")
        ]
        if not names:  # Returns, Raises: the types are the terms
            names = [
                re.sub(r"<[^>]+>", "", t).strip()
                for t in re.findall(r"<dt>(.*?)</dt>", body, flags=re.S)
            ]
        out.setdefault(head.group(1), []).extend(html.unescape(n) for n in names)
    return out


def signature_names(func: Callable[..., Any]) -> list[str]:
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(p.kind, "") + p.name for p in inspect.signature(func).parameters.values()]


def documented(out: Path, page: str, name: str) -> dict[str, list[str]]:
    return fields(entry((out / page).read_text(), name))


def test_every_public_name_has_an_entry(built: Path) -> None:
    """Every name in ``shardwise.__all__`` is documented (a new public name without a page
    fails here), and the index links every page."""
    pages = {p.name: p.read_text() for p in built.glob("*.html")}
    for name in shardwise.__all__:
        full = f"shardwise.{name}"
        anchors = (f'id="{full}"', f'id="module-{full}"')  # batch is a module
        where = [p for p, text in pages.items() if any(a in text for a in anchors)]
        assert where, f"{full} has no entry in the API reference"
    index = pages["index.html"]
    for page in [*VERB_PAGES.values(), "batch.html", "reports.html", "errors.html"]:
        assert f'href="{page}' in index, page


@pytest.mark.parametrize("name", sorted(VERB_PAGES))
def test_each_verb_page_lists_its_parameters_returns_and_raises(built: Path, name: str) -> None:
    func = getattr(shardwise, name)
    sections = documented(built, VERB_PAGES[name], f"shardwise.{name}")
    assert sections["Parameters"] == signature_names(func)
    assert sections["Returns"], f"{name}: no Returns"
    assert sections["Raises"], f"{name}: no Raises"
    # what a refusal raises is a shardwise error, each documented on the errors page
    for error in sections["Raises"]:
        for one in error.split(", "):
            assert one in shardwise.__all__, f"{name} raises {one!r}, not a public error"


@pytest.mark.parametrize("name", BATCH_VERBS)
def test_each_batch_verb_lists_its_parameters(built: Path, name: str) -> None:
    sections = documented(built, "batch.html", f"shardwise.batch.{name}")
    assert sections["Parameters"] == signature_names(getattr(batch, name))
    assert sections["Returns"]


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_each_report_lists_every_field(built: Path, name: str) -> None:
    """The reports, the job and the batch record are read, not built: their fields are
    Attributes (numpydoc's parameter checks are off for them), every one listed in order."""
    cls = REPORTS[name]
    page = "batch.html" if name.startswith("shardwise.batch.") else "reports.html"
    sections = documented(built, page, name)
    assert sections["Attributes"] == [f.name for f in dataclasses.fields(cls)]


def test_each_error_says_which_builtin_it_is(built: Path) -> None:
    page = (built / "errors.html").read_text()
    errors = [n for n in shardwise.__all__ if n.endswith("Error")]
    for name in errors:
        block = entry(page, f"shardwise.{name}")
        cls = getattr(shardwise, name)
        assert "Bases:" in block or name == "ShardwiseError", name
        # the builtin it also is, named on the page as the docstring says it
        builtin = next((b for b in cls.__mro__[1:] if b.__module__ == "builtins"), None)
        if name != "ShardwiseError" and builtin is not Exception:
            assert builtin is not None and builtin.__name__ in block, (name, builtin)
    # the errors with constructor arguments document them (numpydoc checks them)
    for name in ("CorruptShardError", "NotAnArrayError", "ShardConflictError", "VerifyError"):
        params = fields(entry(page, f"shardwise.{name}"))["Parameters"]
        assert params == signature_names(getattr(shardwise, name)), name


def test_validation_fails_the_build_on_an_undocumented_parameter(tmp_path: Path) -> None:
    """The configuration's numpydoc checks are errors under -W: a function whose docstring
    misses a parameter (PR01) and lacks its Returns (RT01) fails the build, naming both."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "badmod.py").write_text(
        'def verb(store, threads=None):\n    """Do it.\n\n    Parameters\n    ----------\n'
        '    store : str\n        Where.\n    """\n    return store\n'
    )
    _own_conf(src)
    (src / "index.rst").write_text("Bad\n===\n\n.. autofunction:: badmod.verb\n")
    done = sphinx_build(src, tmp_path / "out")
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "PR01" in said and "threads" in said and "RT01" in said, said


def test_docs_extra_is_in_the_test_extra() -> None:
    """CI installs only ``.[test]``: it must bring what the docs build needs."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(extras["docs"]) <= set(extras["test"])
    names = {re.split(r"[<>=\[]", d)[0] for d in extras["docs"]}
    assert names == {
        "sphinx",
        "numpydoc",
        "pydata-sphinx-theme",
        "myst-parser",
        "sphinx-argparse-cli",
        "sphinx-gallery",
        "matplotlib",
    }


def _own_conf(src: Path, gallery: Path | None = None) -> None:
    """A ``conf.py`` in ``src`` that runs the site's own configuration as if it sat there; its
    gallery is the scripts of ``gallery`` (none: no gallery, the site's examples are not run)."""
    text = (
        f"__file__ = {str(CONF)!r}\nexec(open(__file__).read())\n"
        f"import sys\nsys.path.insert(0, {str(src)!r})\n"
    )
    if gallery is None:
        text += 'extensions.remove("sphinx_gallery.gen_gallery")\n'
    else:
        text += f'sphinx_gallery_conf["examples_dirs"] = {str(gallery)!r}\n'
    (src / "conf.py").write_text(text)


def _commands(p: argparse.ArgumentParser, words: tuple[str, ...] = ("shardwise",)) -> Any:
    """Each command of the parser (``shardwise``, ``shardwise batch init`` ...) with its parser."""
    yield words, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*words, name))


def test_every_command_and_option_has_an_entry(site: Path) -> None:
    """The command line page is generated from the parser: every command, every option string
    and every positional argument of ``shardwise`` has its entry (an anchor) there, and the
    page says what ``--help`` says of each option."""
    page = (site / "cli.html").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    missing = []
    for words, p in _commands(parser()):
        prefix = "-".join(words)
        if len(words) > 1 and f'id="{prefix}"' not in page:  # the page is the top level's
            missing.append(" ".join(words))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            names = action.option_strings or [action.dest]
            missing += [f"{' '.join(words)} {n}" for n in names if f'id="{prefix}-{n}"' not in page]
            if action.help and action.help != argparse.SUPPRESS and "%" not in action.help:
                assert " ".join(action.help.split()) in " ".join(text.split()), (words, names)
    assert missing == [], f"no entry on the command line page for {missing}"


def test_every_public_name_is_exported_and_listed() -> None:
    """The lazy exports are the public names: nothing importable from ``shardwise`` by name is
    left out of ``__all__`` (so out of the reference, which the test above checks), and
    ``dir(shardwise)`` lists the public names, the errors' module and the version only."""
    lazy = set(shardwise._LAZY) | set(shardwise._MODULES)  # type: ignore[attr-defined]
    assert lazy <= set(shardwise.__all__)
    public = {n for n in dir(shardwise) if not n.startswith("_")}
    assert public == {*shardwise.__all__, "errors"}, public ^ {*shardwise.__all__, "errors"}
    assert "__version__" in dir(shardwise)


def test_a_broken_link_or_reference_fails_the_build(tmp_path: Path) -> None:
    """The site's configuration makes a link to a page or a heading that is not there, and a
    reference to a document or a name that is not there, an error of the ``-W`` build."""
    src = tmp_path / "src"
    src.mkdir()
    _own_conf(src)
    (src / "index.md").write_text(
        "# Home\n\n```{toctree}\nother\n```\n\n## A heading\n\n"
        "[fine](#a-heading), [fine too](other.md#there).\n"
    )
    (src / "other.md").write_text("# Other\n\n## There\n\nBack [home](index.md#a-heading).\n")
    assert sphinx_build(src, tmp_path / "ok").returncode == 0
    (src / "other.md").write_text(
        "# Other\n\n## There\n\n[a page](nowhere.md), [a heading](index.md#no-such-heading), "
        "{doc}`api/nothing` and {func}`shardwise.no_such_verb`.\n"
    )
    done = sphinx_build(src, tmp_path / "bad")
    assert done.returncode != 0
    said = done.stdout + done.stderr
    for what in ("nowhere.md", "no-such-heading", "api/nothing", "shardwise.no_such_verb"):
        assert what in said, (what, said)


def test_every_gallery_example_ran_and_drew(site: Path) -> None:
    """The gallery (examples/gallery/, sphinx-gallery) has one page per script, each linked
    from the gallery's index, with the printed output of its run and at least one figure
    drawn by it (a matplotlib image, written); the index is in the site's navigation."""
    scripts = sorted(p.stem for p in GALLERY.glob("*.py"))
    assert len(scripts) >= 5, scripts
    pages = sorted(p.stem for p in (site / "gallery").glob("*.html") if p.stem.startswith("plot_"))
    assert pages == scripts
    index = (site / "gallery" / "index.html").read_text()
    assert 'href="gallery/index.html"' in (site / "index.html").read_text()
    for name in scripts:
        page = (site / "gallery" / f"{name}.html").read_text()
        assert f'href="{name}.html' in index, name
        assert "sphx-glr-script-out" in page, f"{name}: no printed output"
        assert "Traceback" not in page, name
        images = set(re.findall(rf'src="../_images/(sphx_glr_{name}_\d+\.png)"', page))
        assert images, f"{name}: no figure"
        for image in images:
            assert (site / "_images" / image).stat().st_size > 1000, image
    # the plan pictures are the plans' own (their notebook SVG), one per plan shown
    plans = (site / "gallery" / "plot_plan_pictures.html").read_text()
    assert plans.count('<svg xmlns="http://www.w3.org/2000/svg" class="shardwise') == 5
    # the shard map of a stored array: stored and empty shards, as inspect draws them
    shard_map = (site / "gallery" / "plot_shard_map.html").read_text()
    assert 'class="shard stored"' in shard_map and 'class="shard empty"' in shard_map
    # and a shard recorded but gone, as verify reports it
    lost = (site / "gallery" / "plot_verify_repair.html").read_text()
    assert lost.count('class="shard missing"') == 1 and "missing c/2/5" in lost


# what each gallery script prints, as its page shows it: tests/project/gallery/<script>.txt, the
# page's output blocks one after another (what the script prints when run), ``...`` where values
# vary
PRINTED = Path(__file__).with_name("gallery")


def printed(page: str) -> str:
    """The printed output a gallery page (sphinx-gallery's generated rST) shows: its output
    blocks in order, each dedented: what the script printed."""
    blocks, lines = [], page.splitlines()
    for i, line in enumerate(lines):
        if line != ".. rst-class:: sphx-glr-script-out":
            continue
        start = next(j for j in range(i + 1, len(lines)) if lines[j].strip()) + 1
        assert lines[start - 1] == " .. code-block:: none", lines[start - 1]
        body = []
        for text in lines[start:]:
            if text.strip() and not text.startswith("    "):
                break
            body.append(text[4:])
        blocks.append("\n".join(body).strip("\n"))
    return "\n".join(blocks)


@pytest.mark.parametrize("name", sorted(p.stem for p in GALLERY.glob("*.py")))
def test_every_gallery_page_shows_what_its_script_prints(site: Path, name: str) -> None:
    """The printed output of each gallery script, as its page shows it, is the text kept in
    tests/project/gallery/ (``...`` where a value varies: a temp directory, a write id, a
    time): a message or a figure that changed shows here, not only on the page."""
    from test_docs import output_matches

    shown = printed((DOCS / "gallery" / f"{name}.rst").read_text())
    expected = (PRINTED / f"{name}.txt").read_text()
    assert output_matches(expected, shown), f"{name} printed:\n{shown}"


def test_a_failing_gallery_example_fails_the_build(tmp_path: Path) -> None:
    """An example that raises fails the ``-W`` build, naming the script and the error, after
    the other examples ran; one that runs is built."""
    src, gallery = tmp_path / "src", tmp_path / "examples"
    src.mkdir()
    gallery.mkdir()
    (gallery / "GALLERY_HEADER.rst").write_text("Gallery\n=======\n")
    (gallery / "plot_fine.py").write_text('"""\nFine\n====\n"""\n\nprint("it ran")\n')
    (gallery / "plot_broken.py").write_text(
        '"""\nBroken\n======\n"""\n\nraise ValueError("the example broke")\n'
    )
    _own_conf(src, gallery)
    (src / "index.md").write_text("# Home\n\n```{toctree}\ngallery/index\n```\n")
    done = sphinx_build(src, tmp_path / "out")
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "plot_broken.py" in said and "the example broke" in said, said
    assert "it ran" in (src / "gallery" / "plot_fine.rst").read_text()


INVENTORIES = DOCS / "_inventories"


def test_the_cross_links_read_inventories_kept_in_the_repository(tmp_path: Path) -> None:
    """intersphinx reads every project's inventory from a file in docs/_inventories (nothing is
    fetched at build time), each one what make_inventories.py writes (the committed files are
    not stale), and every entry points into that project's stable site."""
    from sphinx.util.inventory import InventoryFile

    conf = runpy.run_path(str(CONF))
    mapping = conf["intersphinx_mapping"]
    assert set(mapping) == {"python", "numpy", "dask", "xarray", "zarr", "icechunk"}
    maker = runpy.run_path(str(INVENTORIES / "make_inventories.py"))
    for name, (url, inventory) in mapping.items():
        path = Path(inventory)
        assert path.parent == INVENTORIES and path.is_file(), (name, inventory)
        assert url == maker["SITES"][name] and url.startswith("https://")
        assert path.read_bytes() == maker["inventory"](name, maker["ENTRIES"][name]), name
        with path.open("rb") as f:
            loaded = InventoryFile.load(f, url, lambda base, page: base + page)
        entries = [(n, item) for role in loaded.values() for n, item in role.items()]
        assert len(entries) == len(maker["ENTRIES"][name]), name
        for _, item in entries:
            assert item.uri.startswith(url), item


# a page of the reference -> the addresses on the other projects' sites its types link to
CROSS_LINKS = {
    "write_array.html": [
        "https://numpy.org/doc/stable/reference/generated/numpy.ndarray.html#numpy.ndarray",
        "https://docs.dask.org/en/stable/generated/dask.array.Array.html#dask.array.Array",
        "https://docs.xarray.dev/en/stable/generated/xarray.DataArray.html#xarray.DataArray",
        "https://zarr.readthedocs.io/en/stable/api/zarr/abc/store/#zarr.abc.store.Store",
        "https://icechunk.io/en/stable/reference/session/#icechunk.session.Session",
    ],
    "to_zarr.html": [
        "https://docs.xarray.dev/en/stable/generated/xarray.Dataset.html#xarray.Dataset",
        "https://docs.xarray.dev/en/stable/generated/xarray.DataTree.html#xarray.DataTree",
        "https://docs.dask.org/en/stable/delayed-api.html",
    ],
}


@pytest.mark.parametrize("page", sorted(CROSS_LINKS))
def test_the_types_on_the_api_pages_link_to_the_projects_docs(built: Path, page: str) -> None:
    """A parameter typed ``xarray.Dataset`` (or numpy, dask, zarr, icechunk) links to that
    object's page on its project's site; the build's -W (nitpicky) fails on one that does not
    resolve."""
    text = (built / page).read_text()
    for address in CROSS_LINKS[page]:
        assert f'href="{address}"' in text, (page, address)
