"""One shard's reads: the shard functions of ``find`` / ``locate`` / ``lookup`` and of
``gather``, and :func:`read_rows`, their kernel (one native pass, probe and read, where the
walks are native).

>>> import jax.numpy as jnp, numpy as np
>>> from jaxops.hashtable._table.table import HashTable
>>> from jaxops.hashtable._table.words64 import as_words
>>> t = HashTable.empty(4, 1, jnp.full((4, 1), 2.0))
>>> rows, slots = read_rows(t, as_words(np.array([9], np.int64)), jnp.ones(1, bool), -1.0)
>>> rows.tolist(), slots.tolist()   # absent: the default row, slot -1
([[-1.0]], [-1])
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxops.core.walk_table import walk_kernel
from jaxops.hashtable._table.row_dtype import is_half
from jaxops.hashtable._table.table import HashTable
from jaxops.hashtable._walks.batch import key_batch, live_slots
from jaxops.hashtable._walks.probe import probe_limit
from jaxops.hashtable._walks.row_gather import gather_rows, probed_rows

__all__ = ["find_on_shard", "gather_on_shard", "read_rows"]


def find_on_shard(router, statics, table, words, active, replicated):
    """A read by key on one shard: each distinct key to its shard, read there (its row when
    ``statics = (default_value, want_rows)`` wants it, and its global slot), back to every
    copy."""
    default_value, want_rows = statics
    ex = router.keys(words, active, dedup=True)
    received, _ = ex.received
    rows, slots = read_rows(table, received, ex.active, default_value, want_rows)
    if not want_rows:
        return None, (None, router.back(ex, router.global_slots(slots), -1)), (), ex.sent
    answer = router.back(ex, (rows, router.global_slots(slots)), (default_value, -1))
    return None, answer, (), ex.sent


def read_rows(table: HashTable, words, active: jax.Array, default_value: float,
              want_rows: bool = True) -> tuple[jax.Array | None, jax.Array]:
    """One shard's ``(rows, live slots)`` of ``words`` (``rows`` None unless wanted): one
    native pass (probe and read) where the walks are native and every lane is a key."""
    # The fused walk reads float32 rows; half rows take the probe, then the row move.
    fused = walk_kernel("find_rows") if want_rows and not is_half(table.values) else None
    if fused is not None:
        fused = functools.partial(fused, limit=probe_limit(table.bucket_size))
        rows, slots = probed_rows(fused, table.values, (table.key_lo, table.key_hi, table.flags,
                                                        words.lo, words.hi), default_value)
        slots = jnp.where(active, slots, -1)  # padding lanes hold no key
        return jnp.where(active[:, None], rows, jnp.float32(default_value)), slots
    slots = live_slots(table, key_batch("find", words, table.bucket_size), active)
    return (gather_rows(table.values, slots, default_value) if want_rows else None), slots


def gather_on_shard(router, default_value, table, slots, active, replicated):
    """A read by slot on one shard: each distinct global slot to its shard, its row back."""
    ex = router.slots(slots, active, dedup=True)
    local, _ = ex.received
    rows = gather_rows(table.values, jnp.where(ex.active, local, -1), default_value)
    return None, router.back(ex, rows, default_value), (), ex.sent
