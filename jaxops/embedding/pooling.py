"""``pool``: combine each bag's rows into one vector (``sum``, ``mean``, ``sqrtn``).

The combiners are TensorFlow's (``tf.nn.embedding_lookup_sparse``, TFRA's ``combiner``):
with per-id weights ``w`` (1 when not given),

- ``sum``:   ``Σ w·row``
- ``mean``:  ``Σ w·row / Σ w``
- ``sqrtn``: ``Σ w·row / √(Σ w²)``

An empty bag (and one whose weights sum to 0 for ``mean``) pools to zeros; padding ids take
no part. The cost is one segment sum over the batch's ids, O(N·dim), and the gradient
w.r.t. ``rows`` is the per-id gradient that the row optimizers take with the ids' slots.

>>> import numpy as np, jax.numpy as jnp
>>> from jaxops.embedding import Bags
>>> bags = Bags.from_lengths(np.array([1, 2, 3]), np.array([2, 0, 1]))
>>> rows = jnp.array([[1.0], [3.0], [5.0]])
>>> [pool(rows, bags, m)[:, 0].tolist() for m in ("sum", "mean")]
[[4.0, 0.0, 5.0], [2.0, 0.0, 5.0]]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxops.core.errors import OpArgumentError
from jaxops.embedding.bags import Bags

__all__ = ["POOLINGS", "pool"]

POOLINGS = ("sum", "mean", "sqrtn")


def check_pooling(op: str, mode: str) -> str:
    """``mode`` if it is one of :data:`POOLINGS`, else an error naming ``op``."""
    if mode not in POOLINGS:
        raise OpArgumentError(op, "pooling", f"one of {POOLINGS}", repr(mode))
    return mode


def pool(rows: jax.Array, bags: Bags, mode: str = "sum") -> jax.Array:
    """Pooled rows, float ``[bags.num_bags, dim]``.

    Args:
        rows: float ``[N, dim]``, the row of each id of ``bags`` (padding rows are ignored).
        bags: the bags.
        mode: ``"sum"``, ``"mean"`` or ``"sqrtn"`` (see the module docstring).
    """
    check_pooling("pool", mode)
    n = bags.segment.shape[0]
    if rows.ndim != 2 or rows.shape[0] != n:
        raise OpArgumentError("pool", "rows", f"[{n}, dim], one row per id of bags",
                              f"shape {tuple(rows.shape)}")
    w = jnp.ones(n, rows.dtype) if bags.weights is None else bags.weights.astype(rows.dtype)
    w = jnp.where(bags.valid, w, 0)
    # Padding ids carry segment num_bags, which segment_sum drops.
    total = jax.ops.segment_sum(rows * w[:, None], bags.segment, num_segments=bags.num_bags)
    if mode == "sum":
        return total
    norm = w if mode == "mean" else w * w
    denom = jax.ops.segment_sum(norm, bags.segment, num_segments=bags.num_bags)
    denom = denom if mode == "mean" else jnp.sqrt(denom)
    nonzero = denom != 0
    return jnp.where(nonzero[:, None], total / jnp.where(nonzero, denom, 1)[:, None], 0)
