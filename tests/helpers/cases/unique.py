"""Plain-Python references of Unique and UniqueConsecutive and their op-matrix rows.

The equality rules are written out here independently of the library: ``-0.0 == 0.0``,
every NaN equal to every NaN and ordered after ``+inf``; slices compare element by element,
lexicographically. With ``equal_nan=False`` an item (value or slice) holding a NaN equals
nothing else: its key also carries its position, so it sorts after its equals, in order of
position. A unique value is the item at its first occurrence.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

import jaxops
from tests.helpers.op_matrix import TRUNCATE, OpCase


def _key(item, position, equal_nan):
    """Sort / equality key of one value or one flattened slice at ``position``."""
    flat = np.atleast_1d(np.asarray(item)).reshape(-1)
    if flat.dtype.kind not in "biu":  # floats, including ml_dtypes' bfloat16
        f = flat.astype(np.float64)
        apart = not equal_nan and bool(np.isnan(f).any())
        return tuple((1, 0.0) if np.isnan(v) else (0, v + 0.0) for v in f) + \
            ((position + 1 if apart else 0),)
    return tuple(int(v) for v in flat)


def _items(x, axis):
    x = np.asarray(x)
    if axis is None:
        return x.reshape(-1), None
    moved = np.moveaxis(x, axis, 0)
    return moved.reshape(moved.shape[0], math.prod(moved.shape[1:])), moved.shape[1:]


def _y(x, items, rest, axis, picks):
    y = items[np.asarray(picks, np.int64)]
    if axis is None:
        return y
    return np.moveaxis(y.reshape((len(picks),) + rest), 0, axis % np.ndim(x))


def ref_unique(x, size=None, sorted=True, axis=None, equal_nan=True):
    """(y, indices, inverse_indices, counts) of ONNX Unique, first ``size`` kept."""
    items, rest = _items(x, axis)
    keys = [_key(items[i], i, equal_nan) for i in range(items.shape[0])]
    groups: dict = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    order = builtins.sorted(groups) if sorted else list(groups)  # dicts keep first-occurrence order
    uid = {k: j for j, k in enumerate(order)}
    first = [groups[k][0] for k in order][:size]
    counts = [len(groups[k]) for k in order][:size]
    cap = len(order) if size is None else size
    inverse = [uid[k] for k in keys]
    inverse = [u if u < cap else -1 for u in inverse]
    return (_y(x, items, rest, axis, first), np.asarray(first, np.int64),
            np.asarray(inverse, np.int64), np.asarray(counts, np.int64))


def ref_unique_consecutive(x, size=None, axis=None, equal_nan=True):
    """(y, inverse_indices, counts) of torch.unique_consecutive with the rules above."""
    items, rest = _items(x, axis)
    keys = [_key(items[i], i, equal_nan) for i in range(items.shape[0])]
    starts, inverse = [], []
    for i in range(items.shape[0]):
        if i == 0 or keys[i] != keys[i - 1]:
            starts.append(i)
        inverse.append(len(starts) - 1)
    ends = starts[1:] + [items.shape[0]]
    counts = [e - s for s, e in zip(starts, ends)][:size]
    cap = len(starts) if size is None else size
    return (_y(x, items, rest, axis, starts[:size]),
            np.asarray([u if u < cap else -1 for u in inverse], np.int64),
            np.asarray(counts, np.int64))


def unique_all(x, **attrs):
    return jaxops.unique(x, return_index=True, return_inverse=True, return_counts=True, **attrs)


def unique_consecutive_all(x, **attrs):
    return jaxops.unique_consecutive(x, return_inverse=True, return_counts=True, **attrs)


def floats_with_ties(rng, shape, values=5):
    x = rng.integers(-values, values, shape).astype(np.float32)
    x[rng.random(shape) < 0.15] = np.nan
    x[(x == 0) & (rng.random(shape) < 0.5)] = -0.0
    return x


def _launched(outs):
    return tuple(outs)


CASES = [
    OpCase("unique_int_sorted", "Unique", unique_all,
           lambda rng: (rng.integers(0, 6, 20).astype(np.int32),), ref_unique,
           launch_outputs=_launched),
    OpCase("unique_float_nan_first_order", "Unique", unique_all,
           lambda rng: (floats_with_ties(rng, (3, 7)),), ref_unique, attrs={"sorted": False},
           launch_outputs=_launched),
    OpCase("unique_rows_axis1", "Unique", unique_all,
           lambda rng: (rng.integers(0, 2, (2, 6, 2)).astype(np.int8),), ref_unique,
           attrs={"axis": 1}, launch_outputs=_launched),
    OpCase("unique_overflow", "Unique", TRUNCATE(unique_all),
           lambda rng: (rng.integers(0, 9, 25).astype(np.int32),), ref_unique,
           attrs={"size": 4}, launch_outputs=_launched),
    OpCase("unique_float_nans_apart", "Unique", unique_all,
           lambda rng: (floats_with_ties(rng, (3, 7)),), ref_unique, attrs={"equal_nan": False},
           launch_outputs=_launched),
    OpCase("unique_consecutive", "UniqueConsecutive", unique_consecutive_all,
           lambda rng: (floats_with_ties(rng, 24, values=2),), ref_unique_consecutive,
           launch_outputs=_launched),
    OpCase("unique_consecutive_nans_apart", "UniqueConsecutive", unique_consecutive_all,
           lambda rng: (floats_with_ties(rng, 24, values=2),), ref_unique_consecutive,
           attrs={"equal_nan": False}, launch_outputs=_launched),
    OpCase("unique_consecutive_axis0_overflow", "UniqueConsecutive", TRUNCATE(unique_consecutive_all),
           lambda rng: (rng.integers(0, 2, (12, 2)).astype(np.int32),), ref_unique_consecutive,
           attrs={"axis": 0, "size": 3}, launch_outputs=_launched),
]
