"""``evict``: turn keys into tombstones (CANN EmbeddingHashTableEvict), on any placement.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant", constant_value=1.0)
>>> t, _, _ = ht.lookup_or_insert(t, np.array([3, 4], np.int64))
>>> t = ht.evict(t, np.array([3, 3, 99], np.int64), const_val=-1.0)
>>> int(t.live), ht.find(t, np.array([3, 4], np.int64))[1].tolist()
(1, [False, True])
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.batch import (flat_words, group_first, is_first, key_batch,
                                        live_slots_and_flags, set_rows)
from jaxops.ops.hashtable.opdefs import EVICT_OP
from jaxops.ops.hashtable.placement import placement_of, run_routed
from jaxops.ops.hashtable.table import EVICTED, EXPORT, HashTable
from jaxops.ops.hashtable.words import Words64

__all__ = ["evict", "evict_keys"]


def evict(table: Any, keys: Any, *, init_mode: str = "constant", const_val: float = 0.0,
          sampled_values: jax.Array | None = None, route_capacity: int | None = None,
          overflow: str = "expand") -> Any:
    """Present, non-evicted keys become tombstones: EVICTED set, counter and ``last_access``
    0, row reset.

    The key stays in its slot (probe chains stay intact); the same key revives it as a new
    key (:func:`lookup_or_insert`), and, beyond CANN, a new key whose probe proved it absent
    may take the slot (CANN reuses it only for the same key). Absent keys and repeats
    are no-ops. The live count drops by one per tombstone, the not-exported count only for
    keys never exported (CANN lowers it unconditionally and keeps EVICTED in byte 20 of the
    bucket while export tests byte 23; here the flag byte is one).

    Args:
        table: the table (any placement).
        keys: int64 keys ``[N]`` in any accepted form.
        init_mode: ``"constant"`` (rows become ``const_val``) or ``"random"`` (row of key
            ``i`` becomes ``sampled_values[i]``).
        const_val: the constant row value.
        sampled_values: float32 ``[N, embedding_dim]`` for ``"random"``.
        route_capacity, overflow: on a mesh, as in ``lookup_or_insert``.

    Returns:
        The new table.
    """
    op = EVICT_OP.name
    place = placement_of(op, table)
    storage = place.storage(table)
    words, _ = flat_words(op, keys, storage.key_dtype)
    n = int(words.lo.size)
    dim = storage.embedding_dim
    if init_mode == "random":
        if sampled_values is None or jnp.size(sampled_values) != n * dim:
            raise OpArgumentError(op, "sampled_values", f"[{n}, {dim}] float32 rows in random "
                                  "mode", "None" if sampled_values is None
                                  else f"shape {jnp.shape(sampled_values)}")
        sampled_values = jnp.asarray(sampled_values, jnp.float32).reshape(n, dim)
    else:
        sampled_values = None
    attrs = EVICT_OP.check_attrs(dict(init_mode=init_mode, const_val=const_val))

    def attempt(capacity):
        new, _, _, route = place.call(_evict_on_shard, (attrs["init_mode"], attrs["const_val"]),
                                      storage,
                                      (words, sampled_values), capacity=capacity)
        return place.rebuild(table, new, route.lost), route

    return run_routed(op, place, attempt, lambda r: r[1], n, route_capacity, overflow,
                      table)[0]


def _evict_on_shard(router, statics, table, batch, active, replicated):
    init_mode, const_val = statics
    words, sampled = batch
    ex = router.keys(words, active, sampled)
    received, sampled = ex.received
    return evict_keys(table, received, sampled, ex.active, init_mode=init_mode,
                      const_val=const_val)[0], (), ()


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
