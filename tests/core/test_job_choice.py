"""The choice of ``strategy="auto"`` (core/job.py), pure: every branch with its figures and the
reason the job records and prints.

One geometry throughout: a 512 x 512 uint16 array in 256 x 256 shards (128 KiB raw each) of
64 x 64 inner chunks. The figures are worked out by hand in the comments, not from the module's
constants: a direct task holds its shard's block, the encoded chunks and the joined shard (3 x
128 KiB = 384 KiB) plus, for a misaligned source, the whole source blocks its rechunk joins.
"""

from __future__ import annotations

import pytest

from shardwise.core.job import WritePlan, make_job
from shardwise.core.layout import Layout
from shardwise.core.plan import ShardPlan
from shardwise.errors import PlanError

KiB = 2**10
LAYOUT = Layout((512, 512), (256, 256), (64, 64))
WHOLE = ShardPlan(LAYOUT, (slice(0, 512), slice(0, 512)))
ALIGNED = ((256, 256), (256, 256))
SUB = ((128,) * 4, (128,) * 4)  # four blocks of 128 x 128 inside each shard
# blocks crossing shard edges: shard rows [0, 256) touch blocks [0, 192) and [192, 384): a span
# of 384 rows (the second shard's blocks span 320); 384 x 384 x 2 bytes = 288 KiB of blocks
CROSS = ((192, 192, 128), (192, 192, 128))


def job(chunks: tuple[tuple[int, ...], ...] | None, **kw: object) -> WritePlan:
    kw.setdefault("memory_limit", 2**30)
    return make_job(WHOLE, chunks, 2, **kw)  # type: ignore[arg-type]


def test_aligned_dask_chunks_are_direct_on_any_scheduler() -> None:
    for local in (True, False):
        j = job(ALIGNED, runs_locally=local)
        assert (j.strategy, j.peak_per_task, j.bytes_rechunked) == ("direct", 384 * KiB, 0)
        assert j.reason == "direct: dask chunks are the shard pieces"


def test_misaligned_on_local_threads_is_rechunked_in_memory() -> None:
    # sub-shard blocks: a shard's four blocks are 128 KiB together, so 384 + 128 KiB
    j = job(SUB, runs_locally=True, memory_limit=1024 * KiB)
    assert (j.strategy, j.tasks, j.peak_per_task) == ("direct", 4, 512 * KiB)
    assert j.bytes_rechunked == 512 * KiB and j.bytes_staged == 0
    assert j.reason == (
        "direct: misaligned, rechunked in memory on local threads "
        "(peak 512.0 KiB <= budget 1.0 MiB)"
    )
    # crossing blocks: 384 + 288 KiB
    j = job(CROSS, runs_locally=True, memory_limit=672 * KiB)
    assert (j.strategy, j.peak_per_task) == ("direct", 672 * KiB)
    assert "(peak 672.0 KiB <= budget 672.0 KiB)" in j.reason


def test_misaligned_direct_task_over_the_budget_is_staged() -> None:
    j = job(CROSS, runs_locally=True, memory_limit=671 * KiB)
    assert j.strategy == "staged" and j.block_tasks == 9
    assert j.reason == "staged: a shard's direct task (672.0 KiB) exceeds the budget (671.0 KiB)"
    assert j.blocks == CROSS  # the source's blocks: their edges already are inner-chunk edges
    # and an aligned source whose shards do not fit: staged too, with the same figures
    j = job(ALIGNED, runs_locally=True, memory_limit=383 * KiB)
    assert j.strategy == "staged"
    assert j.reason == "staged: a shard's direct task (384.0 KiB) exceeds the budget (383.0 KiB)"


def test_misaligned_on_a_distributed_scheduler_is_staged() -> None:
    for chunks in (SUB, CROSS):
        j = job(chunks, runs_locally=False)
        assert j.strategy == "staged" and j.bytes_rechunked == 0 and j.bytes_staged == 512 * KiB
        assert j.reason == "staged: distributed scheduler, staging moves less"


def test_numpy_sources_and_trivial_plans_are_direct() -> None:
    j = job(None, runs_locally=False)
    assert (j.strategy, j.peak_per_task) == ("direct", 384 * KiB)
    assert j.reason == "direct: no dask graph, each shard's piece read from the source in its task"
    empty = make_job(ShardPlan(LAYOUT, (slice(0, 0), slice(0, 512))), ((0,), (512,)), 2)
    assert empty.strategy == "direct" and empty.tasks == 0
    assert empty.reason == "direct: nothing to stage (0-d array or empty region)"


def test_shared_partial_shards_stay_direct_whatever_the_scheduler() -> None:
    # rows 0:300 cover the second row of shards in part: merged, committed conditionally
    plan = ShardPlan(LAYOUT, (slice(0, 300), slice(0, 512)))
    for local in (True, False):
        j = make_job(plan, ((100,) * 3, (512,)), 2, shared=True, runs_locally=local)
        assert j.strategy == "direct" and plan.npartial == 2
        assert j.reason == (
            "direct: shards shared with other writers are merged and committed conditionally"
        )


def test_an_explicit_strategy_is_kept_with_its_figures() -> None:
    j = job(ALIGNED, strategy="staged", runs_locally=True)
    assert j.strategy == "staged" and j.reason == "staged: asked for (strategy='staged')"
    j = job(SUB, strategy="direct", runs_locally=False)
    assert (j.strategy, j.peak_per_task) == ("direct", 512 * KiB)
    assert j.reason == "direct: asked for (strategy='direct')"
    # its refusal names the blocks the rechunk joins, with the figures
    tight = job(SUB, strategy="direct", memory_limit=511 * KiB)
    with pytest.raises(PlanError, match=r"rechunk joins\) needs about 512\.0 KiB.*511\.0 KiB"):
        tight.validate()


def test_the_printout_shows_the_reason() -> None:
    text = str(job(SUB, runs_locally=True, memory_limit=1024 * KiB))
    lines = text.splitlines()
    assert lines[0] == "WritePlan (direct, chosen by 'auto')"
    assert lines[1] == (
        "  reason: direct: misaligned, rechunked in memory on local threads "
        "(peak 512.0 KiB <= budget 1.0 MiB)"
    )
    assert "peak memory per task: ~512.0 KiB (budget 1.0 MiB: memory_limit=)" in text
