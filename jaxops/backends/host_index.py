"""Host (numpy) kernels of the index operators: NonZero, MaskedSelect, Unique,
UniqueConsecutive.

Each returns the outputs at their exact shapes as if capacity were unlimited (the
callback layer cuts them to the max shapes); outputs that are not DynArrays (the inverse
indices) already carry the operator's capacity rule: ids at or beyond ``size`` are -1.
Equality and order follow :mod:`jaxops.ops.order_keys`: ``-0.0 == 0.0``, every NaN is one
value sorted after ``+inf`` (``equal_nan=True``) or, with ``equal_nan=False``, a value of
its own (NaNs after ``+inf`` in order of position); a float unique value is taken from its
first occurrence.
"""

from __future__ import annotations

import numpy as np

from jaxops.backends.callback import host_kernel_for
from jaxops.core.float_bits import np_is_nonzero, np_ordered_bits
from jaxops.core.numerics import INDEX_FILL

__all__ = [
    "masked_select", "nonzero", "unique", "unique_consecutive",
]


@host_kernel_for("NonZero")
def nonzero(x, *, size, transpose):
    x = np.asarray(x)
    rows = np.argwhere(np_is_nonzero(x.reshape(1) if x.ndim == 0 else x))  # [n, rank], row-major
    return (rows if transpose else rows.T,)


@host_kernel_for("MaskedSelect")
def masked_select(x, mask, *, size):
    shape = np.broadcast_shapes(np.shape(x), np.shape(mask))
    return (np.broadcast_to(x, shape)[np.broadcast_to(np_is_nonzero(mask), shape)],)


def _items(x: np.ndarray, axis: int | None):
    """The rows being made unique ([n] values or [n, r] slices) and the inverse reshaping."""
    if axis is None:
        return x.reshape(-1), lambda rows: rows
    axis %= x.ndim
    moved = np.moveaxis(x, axis, 0)
    rest = moved.shape[1:]
    return moved.reshape(moved.shape[0], int(np.prod(moved.shape[1:]))), \
        lambda rows: np.moveaxis(rows.reshape((rows.shape[0],) + rest), 0, axis)


def _key_columns(rows: np.ndarray, equal_nan: bool) -> list[np.ndarray]:
    """Comparable key columns, most significant first. With ``equal_nan=False`` a last
    column is ``position + 1`` for a row holding a NaN (0 otherwise): such a row equals no
    other and sorts after its equals in order of position."""
    cols = rows.reshape(rows.shape[0], int(np.prod(rows.shape[1:])))
    keys = []
    for j in range(cols.shape[1]):
        c = cols[:, j]
        if np.issubdtype(c.dtype, np.integer) or c.dtype == np.bool_:
            keys.append(c.astype(np.uint64 if c.dtype.kind in "ub" else np.int64))
        else:  # on the bits: immune to the callback thread's FTZ/DAZ state
            keys.append(np_ordered_bits(c).astype(np.uint64))
    if not equal_nan and cols.dtype.kind not in "biu":
        nan = np.isnan(cols).any(axis=1)
        keys.append(np.where(nan, np.arange(1, cols.shape[0] + 1), 0).astype(np.uint64))
    return keys


def _differs_from_previous(keys: list[np.ndarray], n: int) -> np.ndarray:
    """[n] bool: row i differs from row i-1 (row 0: True)."""
    out = np.ones(n, bool)
    if n:
        out[1:] = False
        for k in keys:
            out[1:] |= k[1:] != k[:-1]
    return out


@host_kernel_for("Unique")
def unique(x, *, size, sorted, axis, equal_nan):
    rows, restore = _items(np.asarray(x), axis)
    n = rows.shape[0]
    keys = _key_columns(rows, equal_nan)
    order = np.lexsort([np.arange(n)] + keys[::-1]) if keys else np.arange(n)
    start = _differs_from_previous([k[order] for k in keys], n)
    group = np.empty(n, np.int64)
    group[order] = np.cumsum(start) - 1
    starts = np.flatnonzero(start)
    first = order[starts]  # the sort is stable: the lowest index of each group
    counts = np.diff(np.append(starts, n))
    uid = group
    if not sorted:  # first-occurrence order
        perm = np.argsort(first, kind="stable")
        rank = np.empty_like(perm)
        rank[perm] = np.arange(len(perm))
        uid, first, counts = rank[group], first[perm], counts[perm]
    cap = n if size is None else size
    inverse = np.where(uid < cap, uid, INDEX_FILL)
    return restore(rows[first]), first, inverse, counts


@host_kernel_for("UniqueConsecutive")
def unique_consecutive(x, *, size, axis, equal_nan):
    rows, restore = _items(np.asarray(x), axis)
    n = rows.shape[0]
    start = _differs_from_previous(_key_columns(rows, equal_nan), n)
    starts = np.flatnonzero(start)
    run = np.cumsum(start) - 1
    cap = n if size is None else size
    return restore(rows[starts]), np.where(run < cap, run, INDEX_FILL), \
        np.diff(np.append(starts, n))

