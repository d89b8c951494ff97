"""HPC batch writes (``shardwise.batch``): one array written by N independent jobs, each a
shard-disjoint part (a SLURM job array, dask-jobqueue workers, preemptible jobs), then checked
and closed once. ``init`` creates the array and the batch record, ``write_part`` writes one part
under that part's lease, ``finalize`` verifies every part and closes the batch; see docs/hpc.md.

A front end over the write pipeline (``shardwise.write``): the steps are in ``run.py``, the
parts of a batch in ``plan.py`` (pure), the batch's state in the store in ``status.py``.

Examples
--------
>>> import numpy as np, zarr, shardwise
>>> store = zarr.storage.MemoryStore()
>>> plan = shardwise.batch.init(store, shape=(64, 64), dtype="u1", chunks=(16, 16),
...                             shards=(32, 32), parts=2)
>>> for part in range(2):  # each part in its own job, in any order
...     _ = shardwise.batch.write_part(np.ones((32, 64), "u1"), store, part)
>>> shardwise.batch.finalize(store).ok
True
"""

from .plan import BatchPlan, check_parts, nearest_aligned, split_parts
from .run import finalize, init, write_part
from .status import open_batch, parts_done, read_finalized

__all__ = [
    "BatchPlan",
    "check_parts",
    "finalize",
    "init",
    "nearest_aligned",
    "open_batch",
    "parts_done",
    "read_finalized",
    "split_parts",
    "write_part",
]
