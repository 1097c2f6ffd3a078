"""Grouping equal keys: the core of Unique, by sorting or, for a narrow key range, counting.

:func:`group_keys` takes order-preserving unsigned keys (:mod:`jaxops.ops.order_keys`) and
returns the distinct keys in ascending order, how often each occurs, and the group id of
every element. Two strategies give identical results and one is picked at run time:

- **counting** when ``max - min < n`` (a narrow range, e.g. a million labels out of a
  thousand classes): one histogram scatter over ``max - min + 1`` bins and a compaction of
  the non-empty bins; no sort at all.
- **sorting** otherwise: XLA's single-operand sort of the keys, a compaction of the group
  starts, and a bucketed :func:`~jaxops.ops.sorted_search.lower_bound` of every key among
  the distinct ones.

Inputs of up to ``_COUNTING_MIN_N`` keys always sort (cheap there; one branch compiles
faster), and up to ``_STABLE_SORT_MAX_N`` keys they sort ``(key, position)`` pairs instead
of searching: slower per element, but half the compile time, which dominates there.

>>> import jax.numpy as jnp
>>> g = group_keys(jnp.array([7, 3, 7, 7], jnp.uint32))
>>> int(g.n_unique), g.unique_keys[:2].tolist(), g.counts[:2].tolist(), g.group.tolist()
(2, [3, 7], [1, 3], [1, 0, 1, 1])
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxops.ops.compaction import compact_indices
from jaxops.ops.order_keys import rows_differ_from_previous
from jaxops.ops.sorted_search import lower_bound

__all__ = [
    "Groups", "group_dense_ranks", "group_keys", "split_last_group",
]

_COUNTING_MIN_N = 1 << 14
_STABLE_SORT_MAX_N = 1 << 11


class Groups(NamedTuple):
    """Distinct keys of ``n`` keys; arrays of length ``n``, valid in the first ``n_unique``."""

    unique_keys: jax.Array  # ascending; padding repeats the largest key
    n_unique: jax.Array  # int32 scalar
    counts: jax.Array  # int32 occurrences of each distinct key; padding 0
    group: jax.Array  # int32 [n]: index of each element's key in unique_keys


def group_keys(keys: jax.Array) -> Groups:
    """Groups the 1-D unsigned ``keys`` (see the module docstring)."""
    n = keys.shape[0]
    if n <= _STABLE_SORT_MAX_N:
        return _by_sorting(keys, search=False)
    if n <= _COUNTING_MIN_N:
        return _by_sorting(keys)
    low, high = jnp.min(keys), jnp.max(keys)
    return lax.cond(high - low < n, _by_counting, lambda k, _: _by_sorting(k), keys, low)


def group_dense_ranks(rank: jax.Array) -> Groups:
    """The :class:`Groups` of keys given as dense ranks (int32 ``[n]``, every value in
    ``[0, k)`` present for some ``k``): the ranks are the group ids already, so this is one
    histogram — no sort and no compaction. ``unique_keys`` are the ranks (uint32).

    >>> g = group_dense_ranks(jnp.array([1, 0, 1, 1], jnp.int32))
    >>> int(g.n_unique), g.counts.tolist(), g.group.tolist()
    (2, [1, 3, 0, 0], [1, 0, 1, 1])
    """
    n = rank.shape[0]
    n_unique = jnp.max(rank, initial=-1) + 1
    counts = jnp.zeros((n,), jnp.int32).at[rank].add(1, mode="promise_in_bounds")
    ids = jnp.arange(n, dtype=jnp.int32)
    unique_keys = jnp.minimum(ids, jnp.maximum(n_unique - 1, 0)).astype(jnp.uint32)
    return Groups(unique_keys, n_unique.astype(jnp.int32), counts, rank)


def split_last_group(groups: Groups, members: jax.Array) -> Groups:
    """``groups`` with each element of the last group made a group of its own, in order of
    position: what ``equal_nan=False`` asks of the NaN group (NaN has the largest key).
    ``members`` (bool ``[n]``) flags exactly the elements of the last group, or none.

    >>> g = split_last_group(group_keys(jnp.array([9, 3, 9, 9], jnp.uint32)),
    ...                      jnp.array([True, False, True, True]))
    >>> int(g.n_unique), g.counts.tolist(), g.group.tolist()
    (4, [1, 1, 1, 1], [1, 0, 2, 3])
    """
    n = members.shape[0]
    if n == 0:
        return groups
    n_split = jnp.sum(members, dtype=jnp.int32)
    last = groups.n_unique - 1  # the members' group, when there are any
    group = jnp.where(members, last + jnp.cumsum(members, dtype=jnp.int32) - 1, groups.group)
    n_unique = groups.n_unique + jnp.maximum(n_split - 1, 0)
    ids = jnp.arange(n, dtype=jnp.int32)
    split = (n_split > 0) & (ids >= last)
    counts = jnp.where(split, (ids < n_unique).astype(jnp.int32), groups.counts)
    unique_keys = jnp.where(split, groups.unique_keys[jnp.maximum(last, 0)], groups.unique_keys)
    return Groups(unique_keys, n_unique, counts, group)


def _by_sorting(keys: jax.Array, search: bool = True) -> Groups:
    """Sorts the keys alone and searches each one (``search``), or sorts them with their
    positions, which gives every element's group without a search."""
    n = keys.shape[0]
    position = jnp.arange(n, dtype=jnp.int32)
    if search:
        ordered = lax.sort(keys)
    else:
        ordered, perm = lax.sort((keys, position), num_keys=1)
    is_start = rows_differ_from_previous(ordered)
    starts, n_unique = compact_indices(is_start, n, fill_value=n)
    counts = jnp.concatenate([starts[1:], jnp.full((1,), n, jnp.int32)])[:n] - starts
    unique_keys = ordered[jnp.minimum(starts, max(n - 1, 0))]
    if search:
        group = lower_bound(unique_keys, n_unique, keys)
    else:
        group = jnp.zeros((n,), jnp.int32).at[perm].set(
            jnp.cumsum(is_start, dtype=jnp.int32) - 1, unique_indices=True)
    return Groups(unique_keys, n_unique, counts, group)


def _by_counting(keys: jax.Array, low: jax.Array) -> Groups:
    """Counting sort over the ``< n`` bins of the key range (requires ``max - min < n``)."""
    n = keys.shape[0]
    bin_of = (keys - low).astype(jnp.int32)
    per_bin = jnp.zeros((n,), jnp.int32).at[bin_of].add(1, mode="promise_in_bounds")
    bins, n_unique = compact_indices(per_bin > 0, n, fill_value=n - 1)
    valid = jnp.arange(n) < n_unique
    counts = jnp.where(valid, per_bin[bins], 0)
    group_of_bin = jnp.zeros((n,), jnp.int32).at[jnp.where(valid, bins, n)].set(
        jnp.arange(n, dtype=jnp.int32), mode="drop", indices_are_sorted=True)
    unique_keys = jnp.where(valid, bins.astype(keys.dtype) + low, jnp.max(keys))
    return Groups(unique_keys, n_unique, counts, group_of_bin[bin_of])
