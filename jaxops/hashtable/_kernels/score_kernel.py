"""One shard's scored eviction: what a predicate sees (:class:`SlotScores`), the selection of
the ``n`` lowest scores (:func:`lowest`, a bisection whose counts may span the shards), the
tombstones it makes, and the shard functions of ``evict_lowest`` and ``evict_if``.

>>> import jax.numpy as jnp
>>> lowest([jnp.uint32([5, 1, 5, 3])], jnp.array([True, True, True, False]),
...        jnp.int32(2)).tolist()
[True, True, False, False]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._table.table import EVICTED, EXPORT, VALID, HashTable
from jaxops.hashtable._table.words64 import Words64
from jaxops.hashtable._walks.slot_owner import reset_rows

__all__ = ["SlotScores", "evict_lowest_kernel", "if_on_shard", "lowest", "lowest_on_shard",
           "reset_on_shard"]


class SlotScores(NamedTuple):
    """What an :func:`evict_if` predicate sees: one entry per slot (``[bucket_size]``).

    Attributes:
        key: the keys (:class:`~jaxops.hashtable._table.words64.Words64`).
        counter: the access counters (Words64; ``join_words(counter, signed=False)`` is
            uint64 with x64 on).
        last_access: uint32, the clock of the last lookup that touched the slot.
        age: uint32, ``clock - last_access`` modulo 2**32 (steps since then).
        clock: uint32 scalar, the table's clock.
    """

    key: Words64
    counter: Words64
    last_access: jax.Array
    age: jax.Array
    clock: jax.Array


def reset_on_shard(router, inits, state, replicated):
    """The optimizer states' rows of the slots an eviction made tombstones, reset to
    ``inits``' rows (a ``Placement.map`` function)."""
    old_flags, new_flags, states = state
    evicted = ((new_flags & EVICTED) != 0) & ((old_flags & EVICTED) == 0)
    return None, tuple(reset_rows(s, init, evicted) for s, init in zip(states, inits))


def lowest_on_shard(router, statics, table, replicated):
    """``evict_lowest`` on one shard: ``n`` over all shards (``across``), or its own count
    (the ``"evict"`` load policy), sparing the global slots ``keep``."""
    by, const_val, across = statics
    n, keep = replicated
    base = router.index() * np.int32(table.bucket_size)
    mine = (keep >= base) & (keep < base + table.bucket_size)
    local_keep = jnp.where(mine, keep - base, -1)
    if not across:  # n: every shard's count
        return evict_lowest_kernel(table, n[router.index()], local_keep, by=by,
                                   const_val=const_val), ()
    return evict_lowest_kernel(table, n, local_keep, by=by, const_val=const_val,
                               total=router.total, before=router.before), ()


def if_on_shard(router, statics, table, params):
    """``evict_if`` on one shard: the slots ``rule(scores, params)`` picks."""
    rule, const_val = statics
    picked = jnp.asarray(rule(_scores(table), params))
    if picked.shape != (table.bucket_size,) or picked.dtype != jnp.bool_:
        raise OpArgumentError("evict_if", "predicate", f"a bool [{table.bucket_size}] result",
                              f"{picked.dtype} of shape {picked.shape}")
    return _tombstones(table, picked, const_val), ()


def _live(table: HashTable) -> jax.Array:
    return (table.flags & (VALID | EVICTED)) == VALID


def _scores(table: HashTable) -> SlotScores:
    return SlotScores(table.keys, table.counters, table.last_access,
                      table.clock - table.last_access, table.clock)


def _tombstones(table: HashTable, evicted: jax.Array, const_val: float) -> HashTable:
    """``table`` with the live slots in ``evicted`` made tombstones (as ``evict`` does)."""
    evicted = evicted & _live(table)
    zero = jnp.uint32(0)
    return table.replace(
        flags=jnp.where(evicted, table.flags | jnp.uint8(EVICTED), table.flags),
        counter_lo=jnp.where(evicted, zero, table.counter_lo),
        counter_hi=jnp.where(evicted, zero, table.counter_hi),
        last_access=jnp.where(evicted, zero, table.last_access),
        values=jnp.where(evicted[:, None], jnp.asarray(const_val, table.values.dtype),
                         table.values),
        live=table.live - jnp.sum(evicted, dtype=jnp.int32),
        not_exported=table.not_exported - jnp.sum(evicted & ((table.flags & EXPORT) == 0),
                                                  dtype=jnp.int32))


def _score_words(table: HashTable, by: str) -> list[jax.Array]:
    """The score as uint32 words, most significant first (lower evicts first)."""
    recency = ~(table.clock - table.last_access)  # the older, the lower
    counter = [table.counter_hi, table.counter_lo]
    return [recency, *counter] if by == "lru" else [*counter, recency]


def lowest(words: list[jax.Array], candidate: jax.Array, n: jax.Array,
           total: Callable = lambda c: c, before: Callable = lambda c: 0) -> jax.Array:
    """The mask of the ``n`` candidates of lowest score (``words`` most significant first;
    ties to the lower index). A bisection, one bit a step: ``below`` gathers the candidates
    known to be lower than the ``n``-th score, ``tied`` those still equal to it so far.
    ``total`` and ``before`` let the candidates span several devices (a sharded table):
    ``total(count)`` sums a count over all of them, ``before(count)`` over those before
    this one (the order of the ties).

    """
    k = jnp.minimum(n, total(jnp.sum(candidate, dtype=jnp.int32)))
    below = jnp.zeros_like(candidate)
    tied = candidate

    for word in words:
        def bit_step(i, state, word=word):
            below, tied, k = state
            zero = tied & (((word >> (31 - i).astype(jnp.uint32)) & 1) == 0)
            c0 = total(jnp.sum(zero, dtype=jnp.int32))
            one = c0 < k  # the n-th lowest has a 1 here: every 0 among the tied is lower
            return (jnp.where(one, below | zero, below), jnp.where(one, tied & ~zero, zero),
                    jnp.where(one, k - c0, k))

        below, tied, k = jax.lax.fori_loop(0, 32, bit_step, (below, tied, k))
    rank = before(jnp.sum(tied, dtype=jnp.int32)) + jnp.cumsum(tied, dtype=jnp.int32)
    return below | (tied & (rank <= k))


def evict_lowest_kernel(table: HashTable, n, keep, *, by, const_val, total=lambda c: c,
                        before=lambda c: 0) -> HashTable:
    """One shard's part of :func:`evict_lowest` (``total``/``before``: sums over all shards
    and over those before this one, see :func:`lowest`)."""
    size = table.bucket_size
    spared = jnp.zeros(size, bool).at[jnp.where(keep >= 0, keep, size)].set(True, mode="drop")
    picked = lowest(_score_words(table, by), _live(table) & ~spared, jnp.maximum(n, 0), total,
                    before)
    return _tombstones(table, picked, const_val)
