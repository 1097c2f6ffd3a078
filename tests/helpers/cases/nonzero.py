"""Numpy reference of NonZero (ONNX layout) and its rows in the shared op matrix."""

from __future__ import annotations

import numpy as np

import jaxops
from tests.helpers.op_matrix import TRUNCATE, OpCase


def ref_nonzero(x, size=None, transpose=False) -> np.ndarray:
    """ONNX NonZero as ONNX Runtime computes it (a 0-d x is a 1-element vector), keeping
    the first ``size`` results."""
    x = np.atleast_1d(np.asarray(x))
    coords = np.stack(np.nonzero(x != 0)).astype(np.int64)[:, :size]
    return coords.T if transpose else coords


def ref_flatnonzero(x, size=None) -> np.ndarray:
    return np.flatnonzero(np.asarray(x) != 0)[:size]


def _floats_with_specials(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < 0.4] = 0.0
    x[rng.random(shape) < 0.1] = -0.0
    x[rng.random(shape) < 0.1] = np.nan
    return x


CASES = [
    OpCase("nonzero_f32_nan", "NonZero", jaxops.nonzero,
           lambda rng: (_floats_with_specials(rng, (4, 6)),), ref_nonzero),
    OpCase("nonzero_bool_rank4_overflow", "NonZero", TRUNCATE(jaxops.nonzero),
           lambda rng: (rng.random((2, 3, 2, 4)) < 0.5,), ref_nonzero, attrs={"size": 5}),
    OpCase("nonzero_int_transpose", "NonZero", jaxops.nonzero,
           lambda rng: (rng.integers(-1, 2, (5, 3)).astype(np.int32),), ref_nonzero,
           attrs={"transpose": True, "size": 20}),
    OpCase("flatnonzero_rank3", "NonZero", jaxops.flatnonzero,
           lambda rng: (rng.integers(0, 2, (3, 2, 5)).astype(np.int8),), ref_flatnonzero,
           launch_outputs=None),  # launched NonZero would give coordinates, not flat indices
]
