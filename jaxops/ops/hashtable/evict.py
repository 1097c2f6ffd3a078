"""``evict``: turn keys into tombstones (CANN EmbeddingHashTableEvict).

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
from jaxops.ops.hashtable.batch import (group_first, is_first, key_batch, live_slots_and_flags,
                                        set_rows)
from jaxops.ops.hashtable.opdefs import EVICT
from jaxops.ops.hashtable.table import EVICTED, EXPORT, HashTable, Words64, as_words, check_table


def evict(table: HashTable, keys: Any, *, init_mode: str = "constant", const_val: float = 0.0,
          sampled_values: jax.Array | None = None) -> HashTable:
    """Present, non-evicted keys become tombstones: EVICTED set, counter and ``last_access``
    0, row reset.

    The key stays in its slot (probe chains stay intact); the same key revives it as a new
    key (:func:`lookup_or_insert`), and, beyond CANN, a new key whose probe proved it absent
    may take the slot (CANN reuses it only for the same key). Absent keys and repeats
    are no-ops. The live count drops by one per tombstone, the not-exported count only for
    keys never exported (CANN lowers it unconditionally and keeps EVICTED in byte 20 of the
    bucket while export tests byte 23; here the flag byte is one).

    Args:
        table: the table.
        keys: int64 keys ``[N]`` in any accepted form.
        init_mode: ``"constant"`` (rows become ``const_val``) or ``"random"`` (row of key
            ``i`` becomes ``sampled_values[i]``).
        const_val: the constant row value.
        sampled_values: float32 ``[N, embedding_dim]`` for ``"random"``.

    Returns:
        The new table.
    """
    op = EVICT.name
    table = check_table(op, table)
    words = as_words(keys, op, "keys", table.key_dtype)
    n = int(words.lo.size)
    if init_mode == "random":
        if sampled_values is None or jnp.size(sampled_values) != n * table.embedding_dim:
            raise OpArgumentError(op, "sampled_values", f"[{n}, {table.embedding_dim}] float32 "
                                  "rows in random mode", "None" if sampled_values is None
                                  else f"shape {jnp.shape(sampled_values)}")
        sampled_values = jnp.asarray(sampled_values, jnp.float32).reshape(n, table.embedding_dim)
    else:
        sampled_values = None
    flat = Words64(words.lo.reshape(-1), words.hi.reshape(-1))
    (table,) = EVICT(table, flat, sampled_values, init_mode=init_mode, const_val=const_val)
    return table


@EVICT.kernel("xla")
@functools.partial(jax.jit, static_argnames=("init_mode", "const_val"))
def _evict_kernel(table: HashTable, words: Words64, sampled_values, active=None, *, init_mode,
                  const_val):
    size = table.bucket_size
    batch = key_batch(EVICT.name, words, size)
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
