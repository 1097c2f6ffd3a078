"""``resize``: the same entries in a table of another size.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(4, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([1, 2, 3], np.int64))
>>> big = ht.resize(t, 64)
>>> big.bucket_size, int(big.live), ht.find(big, np.array([1, 2, 3], np.int64))[1].tolist()
(64, 3, [True, True, True])
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.batch import set_rows
from jaxops.ops.hashtable.create import init_table
from jaxops.ops.hashtable.murmur import home_slot
from jaxops.ops.hashtable.probe import place_new_keys
from jaxops.ops.hashtable.table import (EVICTED, EXPORT, HashTable, check_bucket_size,
                                        add_to_words, as_counter, check_table)


def resize(table: HashTable, new_bucket_size: int, *, initializer_mode: str = "constant",
           constant_value: float = 0.0, sampled_values: jax.Array | None = None,
           key: jax.Array | None = None) -> HashTable:
    """Rehashes every used slot (tombstones too) into a table of ``new_bucket_size`` slots.

    Keys, counters, flags, rows and the live / not-exported counts are kept; entries are
    reinserted in ascending old-slot order. The new table's free slots get rows as in
    :func:`init_table` (the initializer arguments are passed on).

    Raises:
        OpArgumentError: when the used slots do not fit (checked when the table is concrete;
            inside ``jit`` the entries that find no slot are counted in ``table.dropped``).
    """
    op = "resize"
    table = check_table(op, table)
    new_bucket_size = check_bucket_size(op, new_bucket_size, "new_bucket_size")
    used = jnp.sum(table.flags != 0)
    if not isinstance(used, jax.core.Tracer) and int(used) > new_bucket_size:
        raise OpArgumentError(op, "new_bucket_size", f"at least {int(used)} (the used slots, "
                              "tombstones included)", str(new_bucket_size))
    fresh = init_table(new_bucket_size, table.embedding_dim, initializer_mode=initializer_mode,
                       constant_value=constant_value, sampled_values=sampled_values, key=key)
    return _rehash(table, fresh)


@jax.jit
def _rehash(old: HashTable, new: HashTable) -> HashTable:
    used = old.flags != 0
    home = home_slot(old.key_lo, old.key_hi, new.bucket_size)
    slot, key_lo, flags = place_new_keys(new.key_lo, new.flags, home, jnp.zeros_like(home), used)
    put = functools.partial(set_rows, slot=slot, write=slot >= 0)
    lost = used & (slot < 0)  # only inside jit: eagerly, too small a size raises
    lost_live = lost & ((old.flags & EVICTED) == 0)
    return new.replace(
        key_lo=put(key_lo, rows=old.key_lo), key_hi=put(new.key_hi, rows=old.key_hi),
        counter_lo=put(new.counter_lo, rows=old.counter_lo),
        counter_hi=put(new.counter_hi, rows=old.counter_hi),
        flags=put(flags, rows=old.flags), values=put(new.values, rows=old.values),
        live=old.live - jnp.sum(lost_live, dtype=jnp.int32),
        not_exported=old.not_exported - jnp.sum(lost_live & ((old.flags & EXPORT) == 0),
                                                dtype=jnp.int32),
        dropped=add_to_words(as_counter(old.dropped), jnp.sum(lost, dtype=jnp.int32)))
