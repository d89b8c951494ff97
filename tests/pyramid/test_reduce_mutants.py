"""The reductions' edges that the pyramid tests pass through without pinning them (survivors of
the mutation lane, `mutation/run.py pyramid/reduce`): an empty block reduces to the empty block of
the reduced shape (the ceil rule: ``ceil(n / f)`` samples per axis), in the block's dtype, by
every method alike. Each test names the mutants it kills."""

from __future__ import annotations

import numpy as np
import pytest

from shardwise.pyramid.reduce import METHODS, nearest, reduce_block


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize(
    ("shape", "factors", "reduced"),
    [((0, 5), (2, 2), (0, 3)), ((4, 0), (2, 3), (2, 0)), ((0, 7, 3), (4, 2, 1), (0, 4, 3))],
)
@pytest.mark.parametrize("dtype", ["uint8", "int64", "float32"])
def test_an_empty_block_reduces_to_the_empty_block_of_the_reduced_shape(
    method: str,
    shape: tuple[int, ...],
    factors: tuple[int, ...],
    reduced: tuple[int, ...],
    dtype: str,
) -> None:
    # kills mean_7 (an empty block returned unreduced) and mode_17 (np.empty without a shape)
    x = np.zeros(shape, dtype=dtype)
    out = reduce_block(x, factors, method)
    assert out.shape == reduced and out.dtype == x.dtype
    # the same shape as slicing every f-th sample gives (nearest), whatever the method
    assert out.shape == nearest(x, factors).shape
