"""The private calls into other libraries (``shardwise.compat``) and the exception tree."""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import zarr.errors
from packaging.version import Version

import shardwise
import shardwise.errors as E
from shardwise import compat

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("lib", sorted(compat.CHECKED))
def test_installed_versions_are_inside_the_checked_range(lib: str) -> None:
    lo, hi = compat.CHECKED[lib]
    assert Version(lo) <= Version(version(lib)) < Version(hi), (lib, version(lib))


def test_pyproject_bounds_the_libraries_compat_reaches_into() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["s3"]
    for lib, (_, hi) in compat.CHECKED.items():
        # fsspec comes with s3fs, which pins it to its own version
        name = "s3fs" if lib == "fsspec" else lib
        found = [r for r in reqs if re.match(rf"{name}(\[.*\])?[<>=]", r)]
        assert found and all(f"<{hi}" in r for r in found), (lib, found)


def test_no_private_calls_outside_compat() -> None:
    """Other modules call into other libraries' private names only through compat."""
    pattern = re.compile(
        r"\._(encode_sync|decode_sync|pipe_file|normalize_path|validate_\w+|set_madvise\w*|call_s3)\b"
        r"|import _normalize_path|dask\.threaded"
    )
    src = ROOT / "src" / "shardwise"
    hits = [
        f"{p.relative_to(src)}:{i}"
        for p in sorted(src.rglob("*.py"))
        if p != src / "compat.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_a_missing_private_name_is_a_dependency_error_naming_the_library() -> None:
    class Codec:  # a codec of a zarr that has no synchronous methods
        pass

    with pytest.raises(E.DependencyError, match=r"zarr 3\.\S+ has no synchronous encode"):
        compat.encode_sync(Codec(), b"", None)
    with pytest.raises(E.DependencyError, match="decode"):
        compat.decode_sync(Codec(), b"", None)
    with pytest.raises(E.DependencyError, match="xarray"):
        compat.validate_region_and_encoding(object(), None, {})
    with pytest.raises(E.DependencyError, match="fsspec"):
        compat.pipe_file_async(object(), "k", b"")
    with pytest.raises(E.DependencyError, match="s3fs"):
        compat.s3_call(object(), "get_object")
    assert issubclass(E.DependencyError, E.ShardwiseError)


def test_every_shardwise_error_is_a_builtin_error_too() -> None:
    """Callers can catch shardwise's errors as ShardwiseError or as the builtin kind they are
    (a missing array is a FileNotFoundError, a corrupt shard a ValueError, ...)."""
    errors = [
        c
        for _, c in inspect.getmembers(E, inspect.isclass)
        if issubclass(c, E.ShardwiseError) and c is not E.ShardwiseError
    ]
    assert len(errors) >= 10
    for c in errors:
        builtin = [b for b in c.__mro__ if b.__module__ == "builtins" and b is not object]
        assert builtin[0] is not Exception or c is E.ShardwiseError, c
    assert issubclass(E.ArrayNotFoundError, FileNotFoundError)
    assert issubclass(E.CorruptShardError, ValueError)
    assert issubclass(E.PlanError, ValueError)
    assert issubclass(E.LeaseHeldError, RuntimeError)
    # the public ones are exported
    assert issubclass(E.ArrayExistsError, FileExistsError)
    assert issubclass(E.BatchNotFoundError, FileNotFoundError)
    assert issubclass(E.InvalidTypeError, TypeError)
    for c in errors:  # every one is exported
        assert getattr(shardwise, c.__name__) is c, c


def test_error_tree_splits_arguments_refusals_and_read_only() -> None:
    """Bad arguments are not plan refusals, the read-only engine has its own class, a missing
    array is zarr's own ArrayNotFoundError too, and ``errors.__all__`` lists every class
    errors.py defines (and the package exports each)."""
    assert not issubclass(E.InvalidValueError, E.PlanError)
    assert issubclass(E.InvalidValueError, ValueError)
    assert issubclass(E.ReadOnlyError, ValueError)
    assert not issubclass(E.ReadOnlyError, E.PlanError)
    assert issubclass(E.ArrayNotFoundError, zarr.errors.ArrayNotFoundError)
    assert issubclass(E.ArrayNotFoundError, zarr.errors.NodeNotFoundError)
    with pytest.raises(zarr.errors.ArrayNotFoundError, match="nothing here"):
        raise E.ArrayNotFoundError("nothing here")
    defined = {
        n
        for n, c in vars(E).items()
        if inspect.isclass(c) and issubclass(c, Exception) and c.__module__ == E.__name__
    }
    assert set(E.__all__) == defined
    assert defined <= set(shardwise.__all__)
    for name in defined:  # the docstring's tree names every class
        assert name in (E.__doc__ or ""), name
