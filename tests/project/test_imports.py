"""``import shardwise`` pays only for what the caller uses: the package's public names are
imported on first use, and each door (``read_array``, ``open_array``) loads its own modules, not
the writers', pyramids', conversion's or xarray's. A user waits for imports too: a full load's
whole-process time counts them.

Each check runs in a fresh interpreter (this one has imported everything already) and reads its
``sys.modules``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardwise

SRC = Path(__file__).resolve().parents[2] / "src"

# what no array read needs: the other front ends, and dask/xarray/pandas for read_array
FRONT_ENDS = ("shardwise.pyramid", "shardwise.conversion", "shardwise.xarray")
WRITERS = ("shardwise.durability", "shardwise.write.target", "shardwise.engine.write")


def fresh(code: str, *args: str) -> dict[str, Any]:
    """Run ``code`` in a new interpreter of this environment, with this checkout's ``src``
    first; it prints one JSON object (its last line of output), returned here."""
    path = [str(SRC), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return out


def loaded(modules: list[str], *prefixes: str) -> list[str]:
    """The modules of ``modules`` that are one of ``prefixes`` or inside one of them."""
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_import_shardwise_loads_no_front_end_and_neither_dask_nor_xarray() -> None:
    got = fresh(
        """
        import json, sys
        import shardwise
        print(json.dumps({"modules": sorted(sys.modules), "file": shardwise.__file__}))
        """
    )
    assert got["file"] == str(SRC / "shardwise" / "__init__.py")  # this checkout, not another
    assert loaded(got["modules"], "dask", "xarray", "pandas", *FRONT_ENDS) == []
    # the errors are there at once: they subclass zarr's, and every caller may catch them
    assert loaded(got["modules"], "shardwise.errors") == ["shardwise.errors"]


def test_read_array_in_a_fresh_process_reads_without_writers_dask_or_xarray(
    tmp_path: Path,
) -> None:
    data = np.arange(40 * 24, dtype="int32").reshape(40, 24)
    shardwise.write_array(data, tmp_path / "a", chunks=(8, 8), shards=(16, 16))
    got = fresh(
        """
        import json, sys
        import shardwise
        out = shardwise.read_array(sys.argv[1])
        print(json.dumps({"modules": sorted(sys.modules), "values": out.tolist(),
                          "dtype": str(out.dtype)}))
        """,
        str(tmp_path / "a"),
    )
    assert got["dtype"] == "int32"
    np.testing.assert_array_equal(np.array(got["values"], dtype="int32"), data)
    assert loaded(got["modules"], "dask", "xarray", "pandas", *FRONT_ENDS, *WRITERS) == []


# how a user picks dask's local schedulers: not at all, by setting, by keyword (name or function)
LOCAL_CHOICES = {
    "default": ("", ""),
    "setting threads": ("dask.config.set(scheduler='threads')", ""),
    "setting sync": ("dask.config.set(scheduler='synchronous')", ""),
    "keyword threads": ("", "scheduler='threads'"),
    "keyword function": ("", "scheduler=dask.threaded.get"),
}


@pytest.mark.parametrize("choice", sorted(LOCAL_CHOICES))
def test_open_array_compute_in_a_fresh_process_loads_no_writer_nor_distributed(
    tmp_path: Path, choice: str
) -> None:
    """open_array needs dask.array (which loads xarray itself, when it is installed), but not
    the writers or the front ends; its compute() on dask's local schedulers, however chosen,
    does not import distributed to look for a client that cannot exist (dask's own scheduler
    lookup would: 0.2 s of a fresh process's read)."""
    data = np.arange(30 * 20, dtype="float32").reshape(30, 20)
    shardwise.write_array(data, tmp_path / "a", chunks=(5, 10), shards=(10, 20))
    setting, keyword = LOCAL_CHOICES[choice]
    got = fresh(
        f"""
        import json, sys
        import shardwise
        import dask, dask.array, dask.threaded
        {setting}
        out = shardwise.open_array(sys.argv[1]).compute({keyword})
        print(json.dumps({{"modules": sorted(sys.modules), "values": out.tolist(),
                          "type": type(out).__name__}}))
        """,
        str(tmp_path / "a"),
    )
    assert got["type"] == "ndarray"
    np.testing.assert_array_equal(np.array(got["values"], dtype="float32"), data)
    found = loaded(got["modules"], "distributed", *FRONT_ENDS, *WRITERS)
    assert found == []


def test_every_public_name_resolves_and_is_listed() -> None:
    got = fresh(
        """
        import json, sys
        import shardwise
        names = list(shardwise.__all__)
        listed = dir(shardwise)
        kinds = {n: type(getattr(shardwise, n)).__name__ for n in names}
        star = {}
        exec("from shardwise import *", star)
        print(json.dumps({"names": names, "listed": listed, "kinds": kinds,
                          "star": sorted(k for k in star if k != "__builtins__"),
                          "version": shardwise.__version__}))
        """
    )
    names = got["names"]
    assert names == shardwise.__all__
    assert set(names) <= set(got["listed"])
    assert got["star"] == sorted(names)
    assert got["version"] == shardwise.__version__
    kinds = got["kinds"]
    assert kinds["batch"] == "module"
    assert kinds["read_array"] == kinds["to_zarr"] == kinds["write_pyramid"] == "function"
    assert kinds["WriteReport"] == kinds["ShardwiseError"] == "type"


def test_the_lazy_names_are_the_objects_of_their_modules() -> None:
    import shardwise.batch as batch_module
    from shardwise import batch, open_dataset, read_array, verify
    from shardwise.durability.verify import verify as verify_function
    from shardwise.engine.load import read_array as read_function
    from shardwise.xarray.opening import open_dataset as open_function

    assert batch is batch_module and shardwise.batch.init is batch_module.init
    assert verify is verify_function and read_array is read_function
    assert open_dataset is open_function


def test_an_unknown_attribute_raises_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="module 'shardwise' has no attribute 'read_arry'"):
        _ = shardwise.read_arry  # type: ignore[attr-defined]
    with pytest.raises(ImportError, match="read_arry"):
        from shardwise import read_arry  # type: ignore[attr-defined]  # noqa: F401
    assert not hasattr(shardwise, "open_zarr")


def shard_files(root: Path) -> dict[str, bytes]:
    """Every shard object under the array at ``root`` (its ``c/`` keys), by key."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in (root / "c").rglob("*")
        if p.is_file()
    }


def test_numpy_write_and_read_in_a_fresh_process_import_no_dask(tmp_path: Path) -> None:
    """A numpy array written and read back in a fresh process: its shard tasks run on this
    process's threads, no dask graph (and no dask, distributed, xarray or pandas import), with
    the write's whole lifecycle (lease, marker, journal: verify finds it clean) and the same
    shard bytes as the dask write of the same array: edge shards, all-fill chunks and a shard
    of fill alone (not stored) included."""
    import dask.array as da

    data = np.arange(70 * 45, dtype="uint16").reshape(70, 45) % 251
    data[:16, :16] = 0  # one whole shard of the fill value, and all-fill chunks elsewhere
    data[40:48, 32:40] = 0
    layout = {"chunks": (8, 8), "shards": (16, 16), "fill_value": 0}
    got = fresh(
        """
        import json, sys
        import numpy as np
        import shardwise
        data = np.arange(70 * 45, dtype="uint16").reshape(70, 45) % 251
        data[:16, :16] = 0
        data[40:48, 32:40] = 0
        rep = shardwise.write_array(data, sys.argv[1], chunks=(8, 8), shards=(16, 16),
                                    fill_value=0)
        back = shardwise.read_array(sys.argv[1])
        print(json.dumps({"modules": sorted(sys.modules), "same": bool((back == data).all()),
                          "written": rep.shards_written, "empty": rep.shards_empty}))
        """,
        str(tmp_path / "numpy"),
    )
    assert loaded(got["modules"], "dask", "distributed", "xarray", "pandas") == []
    assert got["same"] and (got["written"], got["empty"]) == (14, 1)
    assert shardwise.verify(tmp_path / "numpy").ok
    shardwise.write_array(da.from_array(data, chunks=(16, 16)), tmp_path / "dask", **layout)
    ours, theirs = shard_files(tmp_path / "numpy"), shard_files(tmp_path / "dask")
    assert len(ours) == 14 and ours == theirs
