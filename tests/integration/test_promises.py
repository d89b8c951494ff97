"""Every front end and mode keeps its promises through failures and kills (hypothesis).

For each drawn case -- a scenario of ``promisekit.SCENARIOS`` (array, Dataset, DataTree, a
subtree with ``group=``, a pyramid, a conversion; modes ``w-``, ``w``, region, ``region="auto"``,
append), a fault (none, the source raising at block k, the writer SIGKILLed while block k is
held) and a store (local files, S3 on moto) -- the write runs, then is rerun as ``verify``
advises (the same call with ``resume=True`` when verify says the write did not finish; a write
that raised and left verify clean is simply rerun). Then:

* every array holds the values numpy says it must, through xarray's own zarr engine from the root
  (the consolidated metadata as stored) and through zarr-python;
* ``verify`` of the root is clean.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import promisekit as pk
import shardwise
from faultkit import MotoS3, forkserver, moto_s3, unique

pytestmark = [
    pytest.mark.slow,
    # the conversion's source root is consolidated by zarr-python, which warns about it
    pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning"),
]

COUNTS: dict[str, int] = {}


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with moto_s3() as s:
        yield s


@pytest.fixture(scope="module")
def ctx() -> Any:
    return forkserver()


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, pk.Fault]:
    scenario = draw(st.sampled_from(pk.SCENARIOS))
    kind = draw(st.sampled_from(["none", "fail", "kill"]))
    block = draw(st.integers(0, pk.blocks(scenario) - 1))
    return scenario, pk.Fault(kind, block)


def run_case(
    kind: str, where: str, endpoint: str, scenario: str, fault: pk.Fault, ctx: Any
) -> None:
    store = pk.open_store(kind, where, endpoint)
    pk.prepare(scenario, store)
    raised: BaseException | None = None
    if fault.kind == "kill":
        pk.kill_mid_write(ctx, scenario, kind, where, endpoint, fault.block)
    else:
        try:
            pk.write(scenario, store, fault)
        except pk.Injected as e:
            raised = e
        except Exception as e:  # a failed task may reach the caller wrapped
            if "source block" not in str(e):
                raise
            raised = e
    assert fault.kind == "none" or fault.kind == "kill" or raised is not None
    advice = [p for p in shardwise.verify(store).problems if p.kind in ("incomplete", "staged")]
    if fault.kind != "none":
        if advice:
            assert all("resume=True" in p.message for p in advice), advice
            pk.write(scenario, store, pk.Fault("none"), resume=True)
        else:
            pk.write(scenario, store, pk.Fault("none"))
    got = pk.seen_from_root(kind, where, endpoint, scenario)
    for path, want in pk.expected(scenario).items():
        assert path in got, f"{scenario} {fault}: {path} not seen from the root ({sorted(got)})"
        np.testing.assert_array_equal(got[path], want, err_msg=f"{scenario} {fault}: {path}")
        arr = zarr.open_array(store, path=path, mode="r")
        np.testing.assert_array_equal(arr[...], want, err_msg=f"{scenario} {fault}: zarr {path}")
    problems = shardwise.verify(store).problems
    assert not problems, f"{scenario} {fault}: {[str(p) for p in problems]}"
    key = f"{scenario}/{fault.kind}/{kind}"
    COUNTS[key] = COUNTS.get(key, 0) + 1


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases())
def test_every_front_end_keeps_its_promises_on_local_files(
    tmp_path_factory: pytest.TempPathFactory, ctx: Any, case: tuple[str, pk.Fault]
) -> None:
    scenario, fault = case
    where = str(tmp_path_factory.mktemp("p") / "root.zarr")
    run_case("local", where, "", scenario, fault, ctx)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases())
def test_every_front_end_keeps_its_promises_on_s3(
    s3: MotoS3, ctx: Any, case: tuple[str, pk.Fault]
) -> None:
    scenario, fault = case
    run_case("s3", f"promises/{unique()}", s3.endpoint, scenario, fault, ctx)


@pytest.mark.parametrize("scenario", pk.SCENARIOS)
def test_each_scenario_is_right_without_a_fault(tmp_path: Any, ctx: Any, scenario: str) -> None:
    """The plain write of every scenario, so a failure above is the fault's, not the scenario's."""
    run_case("local", str(tmp_path / "root.zarr"), "", scenario, pk.Fault("none"), ctx)
