"""Numpy reference of MaskedSelect (with its gradient) and its rows in the op matrix."""

from __future__ import annotations

import numpy as np

import jaxops
from tests.helpers.op_matrix import TRUNCATE, OpCase


def ref_masked_select(x, mask, size=None) -> np.ndarray:
    xb, mb = np.broadcast_arrays(np.asarray(x), np.asarray(mask) != 0)
    return xb[mb][:size]


def ref_masked_select_grad(x, mask, ct, size=None):
    """d sum(ct * y) / dx: each selected element's cotangent, summed over broadcast copies."""
    x = np.asarray(x)
    shape = np.broadcast_shapes(x.shape, np.shape(mask))
    picked = np.flatnonzero(np.broadcast_to(np.asarray(mask) != 0, shape))[:size]
    grad = np.zeros(shape, np.float64)
    grad.reshape(-1)[picked] = ct[:picked.size]
    axes = tuple(range(len(shape) - x.ndim))
    grad = grad.sum(axis=axes)
    keep = tuple(k for k, d in enumerate(x.shape) if d == 1 and grad.shape[k] != 1)
    return [grad.sum(axis=keep, keepdims=True).astype(x.dtype)]


CASES = [
    OpCase("masked_select_f32", "MaskedSelect", jaxops.masked_select,
           lambda rng: (rng.standard_normal((4, 5)).astype(np.float32), rng.random((4, 5)) < 0.5),
           ref_masked_select, grad_argnums=(0,), grad_reference=ref_masked_select_grad),
    OpCase("masked_select_broadcast", "MaskedSelect", jaxops.masked_select,
           lambda rng: (rng.standard_normal((1, 5)).astype(np.float32), rng.random((3, 1, 5)) < 0.5),
           ref_masked_select, grad_argnums=(0,), grad_reference=ref_masked_select_grad),
    OpCase("masked_select_overflow_u8mask", "MaskedSelect", TRUNCATE(jaxops.masked_select),
           lambda rng: (rng.integers(-9, 9, (6, 4)).astype(np.int32),
                        rng.integers(0, 3, (6, 4)).astype(np.uint8)),
           ref_masked_select, attrs={"size": 7}),
    OpCase("masked_select_overflow_grad", "MaskedSelect", TRUNCATE(jaxops.masked_select),
           lambda rng: (rng.standard_normal(30).astype(np.float32), rng.random(30) < 0.7),
           ref_masked_select, attrs={"size": 9}, grad_argnums=(0,),
           grad_reference=ref_masked_select_grad),
]
