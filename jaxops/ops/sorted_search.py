"""Vectorised ``lower_bound`` of many queries in a sorted table of unsigned keys.

A plain binary search costs ``log2(len(table))`` dependent gathers per query (about 20
for a million entries). Here the key range is first cut into ``buckets`` equal slices
(after subtracting the smallest key and shifting away the low bits that do not fit), a
prefix count gives each bucket's slice of the table, and the binary search then only runs
inside the bucket: as many steps as the fullest bucket needs, decided at run time. For
the inputs Unique sees (many or few distinct keys, any spread) that is a handful of steps.

>>> import jax.numpy as jnp
>>> table = jnp.array([3, 8, 8, 20, 0, 0], jnp.uint32)  # sorted in its first 4 entries
>>> lower_bound(table, 4, jnp.array([8, 3, 20, 4, 0, 99], jnp.uint32)).tolist()
[1, 0, 3, 1, 0, 4]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = [
    "lower_bound",
]

_MAX_BUCKETS = 1 << 18


def _bit_length(v: jax.Array) -> jax.Array:
    return (v.dtype.itemsize * 8 - lax.clz(v)).astype(jnp.int32)


def lower_bound(table: jax.Array, n_valid: jax.Array, queries: jax.Array) -> jax.Array:
    """For each query, the first index ``k < n_valid`` with ``table[k] >= query``, or
    ``n_valid`` when there is none.

    Args:
      table: 1-D unsigned keys, ascending in the first ``n_valid`` entries (rest ignored).
      n_valid: traced int32 scalar, ``0 <= n_valid <= len(table)``.
      queries: unsigned keys of the same dtype, any shape.

    Returns:
      int32 array of the shape of ``queries``.
    """
    length = table.shape[0]
    if length == 0:
        return jnp.zeros(queries.shape, jnp.int32)
    n_buckets = min(_MAX_BUCKETS, max(1, _next_pow2(length) // 4))
    last = jnp.maximum(n_valid - 1, 0)
    low, high = table[0], table[last]
    shift = jnp.maximum(_bit_length(high - low) - (n_buckets.bit_length() - 1), 0).astype(table.dtype)

    def bucket(keys):
        return ((jnp.clip(keys, low, high) - low) >> shift).astype(jnp.int32)

    inside = jnp.arange(length, dtype=jnp.int32) < n_valid
    per_bucket = jnp.zeros((n_buckets,), jnp.int32).at[
        jnp.where(inside, bucket(table), n_buckets)].add(1, mode="drop", indices_are_sorted=True)
    ends = jnp.cumsum(per_bucket, dtype=jnp.int32)
    begins = ends - per_bucket
    steps = _bit_length(jnp.max(per_bucket).astype(jnp.uint32))

    b = bucket(queries)
    lo, hi = begins[b], ends[b]
    # Keys below the table's range all land in bucket 0, above it in the last bucket.
    def halve(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) >> 1
        below = (table[jnp.minimum(mid, length - 1)] < queries) & (mid < hi)
        return jnp.where(below, mid + 1, lo), jnp.where(below, hi, mid)
    lo, _ = lax.fori_loop(0, steps, halve, (lo, hi))
    above = queries > high
    return jnp.where((n_valid == 0) | above, n_valid, lo)


def _next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (``n >= 1``)."""
    return 1 << max(0, (int(n) - 1).bit_length())
