"""The reductions of one block into the next level: pure numpy functions of an array and a
factor per axis.

Every function reduces each block of ``factors`` samples (the ceil rule: the last block along
an axis holds the samples present, possibly fewer) into one sample:

* ``mean``: the mean of the samples. Floats accumulate in float64 (float16/32) and are cast
  back; integers are exact, with no overflow at any value (block sums in int64 for dtypes up
  to 32 bits; 64-bit values as quotient and remainder by the block's count, each summed
  without leaving the dtype's range) and rounded to the nearest integer, halves to even (as
  ``numpy.rint``).
* ``nearest``: the block's first sample (labels: no value is made up).
* ``mode``: the most frequent value of the block (labels), ties to the smallest value. NaN is
  a value like the others (every NaN the same one), larger than every number.

>>> import numpy as np
>>> mean(np.array([[1, 2, 3], [4, 5, 6]], dtype=np.uint8), (2, 2))
array([[3, 4]], dtype=uint8)
>>> mode(np.array([[1, 2, 7], [1, 7, 7]]), (2, 2))
array([[1, 7]])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["METHODS", "mean", "mode", "nearest", "reduce_block"]


def _counts(shape: Sequence[int], factors: Sequence[int]) -> np.ndarray:
    """Samples per output block (the last block along an axis may hold fewer), broadcast."""
    out = np.ones((1,) * len(shape), dtype=np.int64)
    for axis, (n, f) in enumerate(zip(shape, factors, strict=True)):
        sizes = np.diff(np.append(np.arange(0, n, f), n))
        out = out * sizes.reshape([-1 if i == axis else 1 for i in range(len(shape))])
    return out


def _block_sums(x: np.ndarray, factors: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """The sum of each block, accumulated in ``dtype``: per axis in order, the strided slices
    of each offset in a block added up (a few vectorized passes; several times faster than
    ``np.add.reduceat``), the shorter slices of a partial last block into their prefix. The
    first two slices are added straight into ``dtype`` (no widened copy of the block), then
    the others in place: the same additions in the same order as a widened copy would make,
    so float sums are bit for bit the same."""
    out = x
    for axis, f in enumerate(factors):
        n = out.shape[axis]
        if f == 1 or n == 0:
            continue
        head = (slice(None),) * axis
        parts = [out[(*head, slice(j, None, f))] for j in range(min(f, n))]
        m = parts[0].shape[axis]
        if len(parts) > 1 and parts[1].shape[axis] == m:
            acc = np.add(parts[0], parts[1], dtype=dtype)
            parts = parts[2:]
        else:
            acc = parts[0].astype(dtype)
            parts = parts[1:]
        for part in parts:
            if part.shape[axis] == m:
                np.add(acc, part, out=acc)
            else:
                acc[(*head, slice(0, part.shape[axis]))] += part
        out = acc
    return out.astype(dtype, copy=False)


SLAB_BYTES = 1 << 20
"""The input a mean reduces at a time: a slab of whole blocks along the first axis. Its
temporaries (the wider sums) stay in cache and are reused by the allocator instead of being
mapped and faulted in afresh for each block (a 256^3 uint16 block: 36 ms in 1 MiB slabs,
70 ms at once)."""


def mean(x: np.ndarray, factors: Sequence[int], *, slab: int = SLAB_BYTES) -> np.ndarray:
    """The mean of each block, in ``x``'s dtype (see the module's rules), computed ``slab``
    bytes of ``x`` at a time along the first axis (each slab whole blocks: the same sums as
    at once)."""
    if x.size == 0 or all(f == 1 for f in factors):
        return _reduced_empty(x, factors) if x.size == 0 else x.copy()
    f0 = factors[0]
    plane = x.itemsize * (x.size // x.shape[0])
    rows = max(1, slab // (plane * f0)) * f0
    if rows >= x.shape[0]:
        return _mean(x, factors)
    out = _reduced_empty(x, factors)
    for z in range(0, x.shape[0], rows):
        part = _mean(x[z : z + rows], factors)
        out[z // f0 : z // f0 + part.shape[0]] = part
    return out


def _mean(x: np.ndarray, factors: Sequence[int]) -> np.ndarray:
    n = _counts(x.shape, factors)
    if x.dtype.kind in "iu":
        return _integer_mean(x, factors, n)
    wide = np.result_type(x.dtype, np.float64)  # float64, or complex128 for complex data
    sums = _block_sums(x, factors, wide)
    sums /= n  # in place: the sums are this call's own array
    out: np.ndarray = sums.astype(x.dtype)
    return out


def _reduced_empty(x: np.ndarray, factors: Sequence[int]) -> np.ndarray:
    shape = tuple(-(-n // f) for n, f in zip(x.shape, factors, strict=True))
    return np.empty(shape, dtype=x.dtype)


def _sum_dtype(dt: np.dtype, k: int) -> np.dtype | None:
    """The narrowest integer dtype (of ``dt``'s signedness, no narrower than ``dt``) that
    holds ``k`` samples' sum plus ``k`` (the rounding's headroom), or None where only the
    64-bit quotient and remainder path is exact. Narrow sums are what keeps a 16-bit block's
    reduction fast: an int64 copy of a 32 MiB uint16 block is 128 MiB to allocate, fault in
    and stream through, int32 half that."""
    info = np.iinfo(dt)
    bound = max(-int(info.min), int(info.max)) * k + k
    for c in ("int16", "int32", "int64") if dt.kind == "i" else ("uint16", "uint32", "uint64"):
        cand = np.dtype(c)
        if cand.itemsize >= dt.itemsize and bound <= np.iinfo(cand).max:
            return cand
    return None  # 64-bit data: no wider integer


def _integer_mean(x: np.ndarray, factors: Sequence[int], n: np.ndarray) -> np.ndarray:
    """Exact integer block means. Up to 32-bit data the block sums fit a wider integer:
    summed there and rounded. 64-bit data: with ``x = q * k + r`` (``k`` the largest block
    count, q rounded toward zero, ``|r| < k``), the sum of q over a block stays between the
    smallest and the largest value the dtype holds, and the sum of r below k * k, so nothing
    overflows."""
    k = int(n.max(initial=1))
    dt = x.dtype
    acc = _sum_dtype(dt, k)
    if acc is not None:  # the block sums fit ``acc``: one pass, exact
        sums = _block_sums(x, factors, acc)
        if int(n.min()) == k and k & (k - 1) == 0:
            return _power_of_two_mean(sums, k).astype(dt)
        kk = acc.type(k) if int(n.min()) == k else n.astype(acc)
        whole, rest = np.divmod(sums, kk)
        return _rounded(whole, rest, kk).astype(dt)
    big = np.dtype(np.int64) if dt.kind == "i" else np.dtype(np.uint64)
    q, r = np.divmod(x.astype(big, copy=False), big.type(k))
    if dt.kind == "i":  # toward zero: k floored quotients of the minimum sum below it
        neg = (r != 0) & (q < 0)
        q = q + neg
        r = r - neg * big.type(k)
    qs = _block_sums(q, factors, big)  # sum of q: a block holds at most k samples
    rs = _block_sums(r, factors, big)
    if np.all(n == k):
        # sum = qs * k + rs, so mean = qs + rs / k
        whole, rest = np.divmod(rs, big.type(k))
        return _rounded(qs + whole, rest, np.asarray(k, dtype=big)).astype(dt)
    # partial edge blocks: mean = (qs * k + rs) / n, done as exact fractions of small numbers
    nn = np.broadcast_to(n, qs.shape).astype(big)
    a, b = np.divmod(qs, nn)  # qs = a * n + b, 0 <= b < n
    whole, rest = np.divmod(b * big.type(k) + rs, nn)  # |b * k + rs| < 2 * n * k
    return _rounded(a * big.type(k) + whole, rest, nn).astype(dt)


def _power_of_two_mean(sums: np.ndarray, k: int) -> np.ndarray:
    """``sums / k`` rounded half to even for blocks of ``k = 2**s`` samples, in place in
    ``sums`` (headroom of ``k`` above the largest sum, see :func:`_sum_dtype`): with
    ``sums = q * k + r``, ``(sums + k/2 - 1 + (q & 1)) >> s`` is q below a half, q + 1 above,
    and at a half q + 1 exactly when q is odd. Shifts floor, as divmod does, for negative
    sums too; five passes over the reduced block and no temporaries, where divmod and the
    comparisons take a dozen."""
    if k == 1:  # blocks of one sample (axes of one sample): the sums are the means
        return sums
    shift = k.bit_length() - 1
    odd = np.right_shift(sums, shift)
    odd &= 1
    sums += odd
    sums += k // 2 - 1
    sums >>= shift
    return sums


def _rounded(whole: np.ndarray, rest: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``whole + rest / n`` (``0 <= rest < n``) rounded to the nearest integer, halves to
    even."""
    twice = rest * 2
    up = (twice > n) | ((twice == n) & (whole % 2 == 1))
    out: np.ndarray = whole + up.astype(whole.dtype)
    return out


def nearest(x: np.ndarray, factors: Sequence[int]) -> np.ndarray:
    """The first sample of each block."""
    return x[tuple(slice(None, None, f) for f in factors)].copy()


def mode(x: np.ndarray, factors: Sequence[int]) -> np.ndarray:
    """The most frequent value of each block, ties to the smallest value; NaN counts as one
    value, after every number (numpy's sort order)."""
    out_shape = tuple(-(-n // f) for n, f in zip(x.shape, factors, strict=True))
    if x.size == 0:
        return np.empty(out_shape, dtype=x.dtype)
    pad = [(0, o * f - n) for o, f, n in zip(out_shape, factors, x.shape, strict=True)]
    values = _windows(np.pad(x, pad, mode="edge"), factors)
    valid = _windows(np.pad(np.ones(x.shape, dtype=bool), pad), factors)
    # the samples of each block in order, the padding after them (counted as absent)
    order = np.lexsort((values, ~valid), axis=-1)
    v = np.take_along_axis(values, order, axis=-1)
    ok = np.take_along_axis(valid, order, axis=-1)
    # run lengths of equal values among the present samples: the longest run wins, the first
    # (smallest value) on ties, as argmax takes the first maximum
    new = np.ones(v.shape, dtype=bool)
    new[:, 1:] = v[:, 1:] != v[:, :-1]
    if v.dtype.kind in "fc":  # NaN is a value: every NaN one run (sorted after the numbers)
        nan = np.isnan(v)
        new[:, 1:] &= ~(nan[:, 1:] & nan[:, :-1])
    run_id = np.cumsum(new, axis=-1) - 1
    lengths = np.zeros(v.shape, dtype=np.int64)
    rows = np.broadcast_to(np.arange(v.shape[0])[:, None], v.shape)
    np.add.at(lengths, (rows, run_id), ok.astype(np.int64))
    best = np.argmax(lengths, axis=-1)
    first = np.argmax(run_id == best[:, None], axis=-1)
    return v[np.arange(v.shape[0]), first].reshape(out_shape)


def _windows(x: np.ndarray, factors: Sequence[int]) -> np.ndarray:
    """``x`` (whole blocks) as one row of samples per block, blocks in C order."""
    split: list[int] = []
    for n, f in zip(x.shape, factors, strict=True):
        split += [n // f, f]
    nd = x.ndim
    moved = x.reshape(split).transpose([*range(0, 2 * nd, 2), *range(1, 2 * nd, 2)])
    return moved.reshape(-1, int(np.prod(factors)))


METHODS: dict[str, Callable[[np.ndarray, Sequence[int]], np.ndarray]] = {
    "mean": mean,
    "nearest": nearest,
    "mode": mode,
}


def reduce_block(x: np.ndarray, factors: Sequence[int], method: str) -> np.ndarray:
    """One block of a level reduced by ``method`` into its block of the next level."""
    return METHODS[method](np.asarray(x), tuple(factors))
