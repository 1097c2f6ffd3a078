"""One shard's ``import_``: the shard function and its kernel (the
EmbeddingHashTableImport OpDef's xla kernel).

>>> import jax.numpy as jnp, numpy as np
>>> from jaxops.hashtable._table.table import HashTable
>>> from jaxops.hashtable._table.words64 import as_words
>>> t = HashTable.empty(8, 1, jnp.zeros((8, 1)))
>>> t, info = import_entries(t, as_words(np.array([4, 4], np.int64)),
...                          as_words(np.array([2, 3], np.uint64)), jnp.array([0, 1]),
...                          jnp.ones((2, 1)))
>>> int(info.inserted), int(t.counter_lo[info.slots[0]])  # the last entry wins
(1, 3)
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxops.hashtable._kernels.opdefs import IMPORT_OP
from jaxops.hashtable._table.table import EVICTED, EXPORT, FILTER, VALID, HashTable
from jaxops.hashtable._table.words64 import Words64, add_to_words, as_counter
from jaxops.hashtable._walks.batch import (find_or_place, group_first, is_first, is_last, key_batch,
                                           set_rows)
from jaxops.hashtable._walks.slot_owner import advance_epochs

__all__ = ["ImportInfo", "import_entries", "import_on_shard"]


class ImportInfo(NamedTuple):
    """What one ``import_`` did.

    Attributes:
        slots: int32 ``[N]``: where each entry went (global slots), -1 if it found no free
            slot (or was not routed).
        inserted: int32: keys new to the table (a revived tombstone counts).
        unplaced: int32: entries lost to a full table (also added to ``table.dropped``).
        over_limit: bool: the call left more than ``table.max_live`` live keys (inside
            ``jit``; eagerly the table's load policy acts instead).
        rounded: int32: values that a table of half rows (bfloat16, float16) could not hold
            exactly, rounded to nearest (ties to even; past the dtype's range: infinite);
            0 for float32 rows.
    """

    slots: jax.Array
    inserted: jax.Array
    unplaced: jax.Array
    over_limit: jax.Array
    rounded: Any = None


def import_on_shard(router, statics, table, batch, active, replicated):
    """``import_`` on one shard: every entry to its key's shard, written there in batch
    order, its slot back."""
    words, payload = batch
    ex = router.keys(words, active, payload)
    received, (counters, flags, values) = ex.received
    new, info = import_entries(table, received, counters, flags, values, ex.active)
    totals = (router.total(info.inserted), router.total(info.unplaced),
              router.most(info.over_limit.astype(jnp.int32)) > 0)
    return new, router.back(ex, router.global_slots(info.slots), -1), totals, ex.sent


@IMPORT_OP.kernel("xla")
def _import_kernel(table: HashTable, words: Words64, counters: Words64, filter_flags, values):
    flat = lambda w: Words64(w.lo.reshape(-1), w.hi.reshape(-1))  # noqa: E731
    return import_entries(table, flat(words), flat(counters), filter_flags, values, None)


@functools.partial(jax.jit, inline=True)
def import_entries(table: HashTable, words: Words64, counters: Words64, filter_flags, values,
                   active=None) -> tuple[HashTable, ImportInfo]:
    """One shard's ``import_`` (``active``: False on padding lanes)."""
    size = table.bucket_size
    batch = key_batch(IMPORT_OP.name, words, size)
    # active: False on padding lanes (a sharded table's routing buffers)
    everyone = jnp.ones(words.lo.shape[0], bool) if active is None else active
    first = group_first(batch.words, everyone)
    placing = find_or_place(table, batch, everyone, first)
    slot, old = placing.slot, placing.old_flags
    lead, last = is_first(first, slot >= 0), is_last(first, slot >= 0)
    revived = (old & EVICTED) != 0
    absent = (old & VALID) == 0
    inserted = jnp.sum(lead & (absent | revived), dtype=jnp.int32)
    first_export = jnp.sum(lead & ~absent & ~revived & ((old & EXPORT) == 0), dtype=jnp.int32)
    unplaced = jnp.sum(everyone & (slot < 0), dtype=jnp.int32)
    flags = jnp.where(filter_flags != 0, jnp.uint8(VALID | EXPORT | FILTER),
                      jnp.uint8(VALID | EXPORT))
    table = table.replace(
        key_lo=set_rows(placing.key_lo, slot, batch.words.lo, last),
        key_hi=set_rows(table.key_hi, slot, batch.words.hi, last),
        counter_lo=set_rows(table.counter_lo, slot, counters.lo, last),
        counter_hi=set_rows(table.counter_hi, slot, counters.hi, last),
        flags=set_rows(placing.flags, slot, flags, last),
        values=set_rows(table.values, slot, values, last),
        last_access=set_rows(table.last_access, slot, jnp.broadcast_to(table.clock, slot.shape),
                             last),
        epoch=advance_epochs(table.epoch, slot, lead & (absent | revived)),
        live=table.live + inserted, not_exported=table.not_exported - first_export,
        dropped=add_to_words(as_counter(table.dropped), unplaced))
    return table, ImportInfo(slot, inserted, unplaced, table.live > table.max_live)
