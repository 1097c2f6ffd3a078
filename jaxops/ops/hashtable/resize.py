"""``resize`` and ``compact``: the same live entries in a rebuilt table.

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
from jaxops.ops.hashtable.table import (EVICTED, EXPORT, VALID, HashTable, check_bucket_size,
                                        add_to_words, as_counter, check_table)


def resize(table: HashTable, new_bucket_size: int, *, initializer_mode: str = "constant",
           constant_value: float = 0.0, sampled_values: jax.Array | None = None,
           key: jax.Array | None = None) -> HashTable:
    """Rehashes every live entry into a table of ``new_bucket_size`` slots.

    Keys, counters, flags (export state included), rows, ``last_access`` (and the table's
    ``clock``) and the live / not-exported counts are kept; entries are reinserted in ascending old-slot order. Tombstones are dropped
    (beyond CANN, which has no resize: they only kept evicted keys' slots, and their keys are
    gone either way), so a table may shrink to its live keys. The new table's free slots get
    rows as in :func:`init_table` (the initializer arguments are passed on); the load limit
    and policy are kept.

    Raises:
        OpArgumentError: when the live entries do not fit (checked when the table is
            concrete; inside ``jit`` the entries that find no slot are counted in
            ``table.dropped``).
    """
    op = "resize"
    table = check_table(op, table)
    new_bucket_size = check_bucket_size(op, new_bucket_size, "new_bucket_size")
    live = table.live
    if not isinstance(live, jax.core.Tracer) and int(live) > new_bucket_size:
        raise OpArgumentError(op, "new_bucket_size", f"at least {int(live)} (the live keys)",
                              str(new_bucket_size))
    fresh = init_table(new_bucket_size, table.embedding_dim, initializer_mode=initializer_mode,
                       constant_value=constant_value, sampled_values=sampled_values, key=key)
    fresh = fresh.replace(max_load_factor=table.max_load_factor, load_policy=table.load_policy,
                          key_dtype=table.key_dtype)
    return _rehash(table, fresh)


def compact(table: HashTable, **init) -> HashTable:
    """The table rebuilt at its size without tombstones (every live entry's key, counter,
    flags and row kept): probe chains shorten and the slots are free again.

    Costs a second table while it runs (a rehash); ``init`` are :func:`resize`'s
    initializer arguments for the freed slots' rows. Beyond CANN. Keys may move: an
    optimizer state kept from before starts a moved key from the initial state at its next
    update (it never takes the state left in its new slot; see
    :mod:`~jaxops.ops.hashtable.owner`).

    >>> import numpy as np, jaxops.hashtable as ht
    >>> t = ht.init_table(8, 1, initializer_mode="constant")
    >>> t, _, _ = ht.lookup_or_insert(t, np.arange(6, dtype=np.int64))
    >>> t = ht.compact(ht.evict(t, np.arange(4, dtype=np.int64)))
    >>> int(t.live), int((np.asarray(t.flags) != 0).sum())
    (2, 2)
    """
    table = check_table("compact", table)
    return resize(table, table.bucket_size, **init)


@jax.jit
def _rehash(old: HashTable, new: HashTable) -> HashTable:
    used = (old.flags & (VALID | EVICTED)) == VALID
    home = home_slot(old.key_lo, old.key_hi, new.bucket_size)
    slot, key_lo, flags = place_new_keys(new.key_lo, new.flags, home, jnp.zeros_like(home), used)
    put = functools.partial(set_rows, slot=slot, write=slot >= 0)
    lost_live = used & (slot < 0)  # only inside jit: eagerly, too small a size raises
    return new.replace(
        key_lo=put(key_lo, rows=old.key_lo), key_hi=put(new.key_hi, rows=old.key_hi),
        counter_lo=put(new.counter_lo, rows=old.counter_lo),
        counter_hi=put(new.counter_hi, rows=old.counter_hi),
        flags=put(flags, rows=old.flags), values=put(new.values, rows=old.values),
        last_access=put(new.last_access, rows=old.last_access), clock=old.clock,
        live=old.live - jnp.sum(lost_live, dtype=jnp.int32),
        not_exported=old.not_exported - jnp.sum(lost_live & ((old.flags & EXPORT) == 0),
                                                dtype=jnp.int32),
        dropped=add_to_words(as_counter(old.dropped), jnp.sum(lost_live, dtype=jnp.int32)))
