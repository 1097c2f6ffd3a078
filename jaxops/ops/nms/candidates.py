"""The candidates of NMS: score filter, the best ``K`` by score, and the orders NMS walks.

Every NMS operator runs the same pipeline per image (a *problem*) over its ``M`` scored
elements — boxes, or (box, class) pairs:

1. **filter**: an element is a candidate when its score passes the threshold
   (:func:`score_candidates`; NaN never);
2. **cut**: when more than ``K`` (the candidate capacity) pass, the ``K`` best by priority
   stay (score, then the lower element index): the ``K``-th largest key found bit by bit,
   then a compaction; otherwise the compaction alone (:func:`select`). The number cut is returned, and since a cut
   candidate scores below every kept one, it can only be missing from the end of a result;
3. **orders** (:func:`orders`): the candidates by priority, and by group (class) then
   priority, the order :func:`~jaxops.ops.nms.bitmask.bitmask_nms` walks;
4. **limits** (:func:`apply_limits`): at most ``per_group`` kept per group, and at most
   ``total`` per problem by priority — torchvision's ``detections_per_img``, TensorRT's
   ``keepTopK``. Per-group greedy decisions never depend on other groups, so walking by
   group and then taking the best ``total`` is the global walk stopped after ``total``.

XLA:CPU sorts one int32 operand about 5x faster than several, so orders come from
one-operand sorts of packed keys where they fit (``K <= 2**15``): a priority order is an
LSD radix sort of the 32-bit keys in two 16-bit digits, each a sort of
``digit << 15 | position``; other sizes take one stable multi-operand sort.

>>> import jax.numpy as jnp
>>> keys = priority_keys(jnp.array([[0.5, 0.9, 0.5, 0.7]]))
>>> c = select(lambda: keys, jnp.array([[True, True, True, False]]), capacity=2)
>>> c.flat.tolist(), c.valid.tolist(), c.cut.tolist()   # 0.9 and the first 0.5 stay
([[0, 1]], [[True, True]], [1])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxops.core.float_bits import greater, ordered_bits
from jaxops.ops.compaction import compact_indices

__all__ = [
    "Candidates", "Orders", "apply_limits", "compacted", "group_order", "orders",
    "priority_keys", "score_candidates", "select",
]

_RADIX_MAX = 1 << 15  # positions that fit beside a 16-bit digit in an int32 sort key
i32 = jnp.int32


def score_candidates(scores: jax.Array, score_threshold=None, *,
                     inclusive: bool = False) -> jax.Array:
    """Which scores are candidates: not NaN and ``> score_threshold`` (``>=`` with
    ``inclusive``, TensorRT's filter); every non-NaN score when the threshold is None.
    The threshold may be a traced scalar."""
    if score_threshold is None:
        return ~jnp.isnan(scores)
    return greater(scores, score_threshold, inclusive)  # on the bits; NaN: never


def priority_keys(scores: jax.Array, n_boxes: int | None = None,
                  exact: bool = True) -> jax.Array:
    """Unsigned keys of the scores' width, larger = higher priority (``ordered_bits``:
    ``-0.0 == +0.0``, subnormals are values). ``exact=False`` (the high-performance mode)
    clears the low ``max(1, ceil(log2 n_boxes))`` bits of float32 keys when ``n_boxes <=
    2**15``: scores that agree above them rank by element index."""
    key = ordered_bits(scores)
    if exact or scores.dtype != jnp.float32 or n_boxes is None or n_boxes > _RADIX_MAX:
        return key
    return key & ~jnp.uint32((1 << max(1, (n_boxes - 1).bit_length())) - 1)


class Candidates(NamedTuple):
    """``K`` candidate slots of each problem: element indices ascending, ``valid`` where
    a slot holds a candidate; ``count`` candidates passed the filter, ``cut`` of them did
    not fit (int32 ``[P]``)."""

    flat: jax.Array
    valid: jax.Array
    count: jax.Array
    cut: jax.Array


def _kth_largest(keys: jax.Array, passing: jax.Array, k: jax.Array) -> jax.Array:
    """The ``k``-th largest key among the passing ones of each row (``k >= 1``), bit by bit
    from the top: the largest ``t`` with at least ``k`` passing keys ``>= t``. One count
    over the row per key bit, data-parallel (XLA:CPU's ``top_k`` of thousands was slower
    than this by far, measured here, and it would sort what only needs a threshold)."""
    bits = keys.dtype.itemsize * 8

    def step(i, t):
        trial = t | (jnp.ones((), keys.dtype) << (bits - 1 - i).astype(keys.dtype))
        enough = jnp.sum(passing & (keys >= trial[:, None]), axis=1, dtype=i32) >= k
        return jnp.where(enough, trial, t)
    return lax.fori_loop(0, bits, step, jnp.zeros(keys.shape[:1], keys.dtype))


def select(keys: Callable[[], jax.Array], passing: jax.Array, capacity: int) -> Candidates:
    """The candidates of each problem (``passing``: ``[P, M]``), at most ``capacity`` of
    them: the best by key, ties to the lower index, when more pass. ``keys()``: the
    ``[P, M]`` keys, computed only where more than ``capacity`` pass."""
    p, m = passing.shape
    count = jnp.sum(passing, axis=1, dtype=i32)
    if capacity >= m:
        flat = jnp.broadcast_to(jnp.arange(m, dtype=i32), (p, m))
        return Candidates(flat, passing, count, jnp.zeros((p,), i32))

    def best(_):
        every = keys()
        kth = _kth_largest(every, passing, jnp.minimum(count, capacity))
        above = passing & (every > kth[:, None])
        tied = passing & (every == kth[:, None])  # the lowest elements of the tie, as needed
        need = jnp.minimum(count, capacity) - jnp.sum(above, axis=1, dtype=i32)
        return above | (tied & (jnp.cumsum(tied, axis=1, dtype=i32) <= need[:, None]))

    # one compaction after the cond, not one in each branch: half the compile time
    chosen = lax.cond(jnp.any(count > capacity), best, lambda _: passing, None)
    return compacted(chosen, capacity)._replace(count=count,
                                                cut=jnp.maximum(count - capacity, 0))


def compacted(passing: jax.Array, size: int) -> Candidates:
    """The passing elements of each problem (at most ``size``) in their first ``size``
    slots, ascending; their count is the compaction's (a popcount of packed words: cheaper
    than XLA's sum of the mask, which it writes out as int32 first)."""
    flat, count = jax.vmap(lambda v: compact_indices(v, size, fill_value=0))(passing)
    valid = jnp.arange(size, dtype=i32)[None] < count[:, None]
    return Candidates(flat, valid, count, jnp.zeros_like(count))


def _radix_order(digits: list[jax.Array]) -> jax.Array:
    """Positions ``[P, K]`` sorted stably by the 16-bit ``digits`` (least significant
    first, values in ``[0, 2**16)``); ``K <= 2**15``. One int32 sort per digit."""
    p, k = digits[0].shape
    pos = jnp.broadcast_to(jnp.arange(k, dtype=i32), (p, k))
    order = pos
    for digit in digits:
        d = jnp.take_along_axis(digit, order, axis=1).astype(i32)
        order = jnp.take_along_axis(order, lax.sort((d << 15) | pos, dimension=1) & (_RADIX_MAX - 1),
                                    axis=1)
    return order


def _u16_digits(key: jax.Array) -> list[jax.Array]:
    """The 16-bit digits of unsigned keys, least significant first."""
    return [((key >> (16 * i)) & 0xFFFF).astype(i32) for i in range(key.dtype.itemsize // 2)]


class Orders(NamedTuple):
    """``by_priority[p, r]``: the slot of rank ``r`` (valid first, then by key, ties to the
    lower slot); ``by_group[p, s]``: the rank at position ``s`` of the group-major order
    (group ascending, then rank; invalid slots last)."""

    by_priority: jax.Array
    by_group: jax.Array


def orders(keys: jax.Array, cands: Candidates, groups: jax.Array,
           group_bound: int | None = None) -> Orders:
    """The two orders of the candidate slots.

    Args:
      keys: ``[P, K]`` keys of the slots (:func:`priority_keys`).
      cands: the slots (their element indices are ascending, so the lower slot is the
        lower element).
      groups: ``[P, K]`` int group of each slot.
      group_bound: a static bound ``G`` with ``0 <= groups < G``, when one is known.
    """
    p, k = cands.valid.shape
    descending = jnp.where(cands.valid, ~keys, ~jnp.zeros((), keys.dtype))  # invalid last
    if k <= _RADIX_MAX and keys.dtype == jnp.uint32:
        by_priority = _radix_order(_u16_digits(descending))
    else:
        by_priority = lax.sort((descending, jnp.broadcast_to(jnp.arange(k, dtype=i32), (p, k))),
                               dimension=1, num_keys=1, is_stable=True)[1]
    g = jnp.take_along_axis(jnp.where(cands.valid, groups, jnp.iinfo(i32).max).astype(i32),
                            by_priority, axis=1)
    return Orders(by_priority, group_order(g, group_bound))


def group_order(g: jax.Array, group_bound: int | None = None) -> jax.Array:
    """Ranks ``[P, R]`` sorted stably by their group ``g`` (``[P, R]``, by rank; invalid
    ones ``int32`` max); ``group_bound`` as for :func:`orders`."""
    p, k = g.shape
    if k <= _RADIX_MAX and group_bound is not None and group_bound < (1 << 16):
        rank = jnp.arange(k, dtype=i32)
        return lax.sort((jnp.minimum(g, group_bound) << 15) | rank, dimension=1) \
            & (_RADIX_MAX - 1)
    if k <= _RADIX_MAX:
        return _radix_order(_u16_digits(lax.bitcast_convert_type(g, jnp.uint32)
                                        ^ jnp.uint32(1 << 31)))
    ranks = jnp.broadcast_to(jnp.arange(k, dtype=i32), (p, k))
    return lax.sort((g, ranks), dimension=1, num_keys=1, is_stable=True)[1]


def apply_limits(kept: jax.Array, grouped: jax.Array, by_group: jax.Array,
                 per_group: int | None, total: int | None) -> jax.Array:
    """``kept`` (``[P, K]`` bool, in group-major order) limited to the first ``per_group``
    of each group and then to the best ``total`` of the problem by priority; returned in
    priority (rank) order. ``grouped`` is the group of each position (group-major)."""
    p, k = kept.shape
    if per_group is not None and per_group < k:
        ids = jnp.arange(k, dtype=i32)
        start = jnp.concatenate([jnp.ones((p, 1), bool), grouped[:, 1:] != grouped[:, :-1]],
                                axis=1)
        seen = jnp.cumsum(kept, axis=1, dtype=i32)
        first = lax.cummax(jnp.where(start, ids, 0), axis=1)
        before = jnp.where(first > 0, jnp.take_along_axis(seen, jnp.maximum(first - 1, 0), 1), 0)
        kept &= seen - before <= per_group
    rows = jnp.arange(p)[:, None]
    ranked = jnp.zeros((p, k), bool).at[rows, by_group].set(kept, unique_indices=True)
    if total is not None and total < k:
        ranked &= jnp.cumsum(ranked, axis=1, dtype=i32) <= total
    return ranked
