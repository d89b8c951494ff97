"""Consolidated groups inside consolidated groups (survivors of the mutation lane,
`mutation/run.py storage/consolidated`): a write below a group that is consolidated at several
levels re-consolidates every one of them, the deepest first, so each group's consolidated
metadata, including the nested documents of the consolidated groups below it, is what a fresh
consolidation of the store gives, and readers opening any of the groups see the new node.
Each test names the mutants it kills."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore

import shardwise
from shardwise.compat import consolidated_metadata

GROUPS = ("g/h/k", "g/h", "g", "")  # every group consolidated, the deepest first


def nested_store(path: Path) -> None:
    """Groups / > g > h > k, each with consolidated metadata of its own (zarr's own)."""
    zarr.create_group(path).create_group("g").create_group("h").create_group("k")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: consolidated metadata is not in the v3 spec
        for group in GROUPS:
            zarr.consolidate_metadata(str(path), path=group or None)


def stored(path: Path, group: str) -> dict:
    return json.loads((path / group / "zarr.json").read_text())["consolidated_metadata"]


@pytest.mark.parametrize("where", ["g/h/k/x", "g/h/x", "g/x"])
def test_a_write_below_nested_consolidated_groups_refreshes_each_deepest_first(
    tmp_path: Path, where: str
) -> None:
    # kills _groups_above_9 (a group two levels down not refreshed) and _groups_above_19 (the
    # root refreshed before the groups below it: its nested documents of them stale)
    root = tmp_path / "s.zarr"
    nested_store(root)
    x = np.arange(48, dtype="i4").reshape(6, 8)
    shardwise.write_array(x, root, path=where, chunks=(2, 4), shards=(6, 8))
    fresh = LocalStore(root, read_only=True)
    for group in GROUPS:
        assert stored(root, group) == consolidated_metadata(fresh, group), group
        if where.startswith(group):
            below = where[len(group) :].strip("/")
            assert below in stored(root, group)["metadata"], (group, below)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for group in GROUPS:
            if where.startswith(group):
                g = zarr.open_group(root, path=group, mode="r", use_consolidated=True)
                np.testing.assert_array_equal(g[where[len(group) :].strip("/")][:], x)
