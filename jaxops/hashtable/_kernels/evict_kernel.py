"""One shard's ``evict``: the shard function and its kernel (the EmbeddingHashTableEvict
OpDef's xla kernel).

>>> import numpy as np, jaxops.hashtable as ht
>>> t, _, info = ht.lookup_or_insert(ht.init_table(4, 1, initializer_mode="constant"),
...                                  np.array([7], np.int64))
>>> (t,) = evict_keys(t, ht.words.as_words(np.array([7, 7], np.int64)), None,
...                   init_mode="constant", const_val=0.0)
>>> int(t.live), int(t.flags[info.slots[0]]) == ht.cann.VALID | ht.cann.EVICTED
(0, True)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxops.hashtable._kernels.opdefs import EVICT_OP
from jaxops.hashtable._table.table import EVICTED, EXPORT, HashTable
from jaxops.hashtable._table.words64 import Words64
from jaxops.hashtable._walks.batch import (group_first, is_first, key_batch, live_slots_and_flags,
                                           set_rows)

__all__ = ["evict_keys", "evict_on_shard"]


def evict_on_shard(router, statics, table, batch, active, replicated):
    """``evict`` on one shard: every key (and its new row) to its shard, evicted there."""
    init_mode, const_val = statics
    words, sampled = batch
    ex = router.keys(words, active, sampled)
    received, sampled = ex.received
    return evict_keys(table, received, sampled, ex.active, init_mode=init_mode,
                      const_val=const_val)[0], (), (), ex.sent


@EVICT_OP.kernel("xla")
def _evict_kernel(table: HashTable, words: Words64, sampled_values, **attrs):
    flat = Words64(words.lo.reshape(-1), words.hi.reshape(-1))
    return evict_keys(table, flat, sampled_values, None, **attrs)


@functools.partial(jax.jit, inline=True, static_argnames=("init_mode", "const_val"))
def evict_keys(table: HashTable, words: Words64, sampled_values, active=None, *, init_mode,
               const_val) -> tuple[HashTable]:
    """One shard's ``evict`` (``active``: False on padding lanes)."""
    size = table.bucket_size
    batch = key_batch(EVICT_OP.name, words, size)
    slot, old = live_slots_and_flags(table, batch, active)  # active: False on padding lanes
    lead = is_first(group_first(batch.words, slot >= 0), slot >= 0)  # repeats see a tombstone
    rows = sampled_values if init_mode == "random" else \
        jnp.full((slot.shape[0], table.embedding_dim), const_val, jnp.float32)
    zero = jnp.zeros_like(batch.words.lo)
    return (table.replace(
        flags=set_rows(table.flags, slot, old | jnp.uint8(EVICTED), lead),
        counter_lo=set_rows(table.counter_lo, slot, zero, lead),
        counter_hi=set_rows(table.counter_hi, slot, zero, lead),
        last_access=set_rows(table.last_access, slot, zero, lead),
        values=set_rows(table.values, slot, rows, lead),
        live=table.live - jnp.sum(lead, dtype=jnp.int32),
        not_exported=table.not_exported - jnp.sum(lead & ((old & EXPORT) == 0), dtype=jnp.int32)),)
