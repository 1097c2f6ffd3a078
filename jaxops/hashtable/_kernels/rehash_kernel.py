"""One shard rebuilt: every live entry of an old shard rehashed into a new, empty one
(:func:`rehash_slots`, also how a restore re-owns keys chunk by chunk), and ``resize``'s
shard function, which moves optimizer state rows with their keys.

>>> import jax.numpy as jnp, numpy as np
>>> from jaxops.hashtable._table.table import VALID, HashTable
>>> old = HashTable.empty(4, 1, jnp.zeros((4, 1))).replace(
...     key_lo=jnp.array([9, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF], jnp.uint32),
...     key_hi=jnp.array([0, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF], jnp.uint32),
...     flags=jnp.array([VALID, 0, 0, 0], jnp.uint8), live=jnp.int32(1))
>>> new, moved_to = rehash_slots(old, HashTable.empty(16, 1, jnp.zeros((16, 1))))
>>> int(new.live), int(new.key_lo[moved_to[0]]), moved_to[1:].tolist()
(1, 9, [-1, -1, -1])
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxops.hashtable._table.murmur import home_slot
from jaxops.hashtable._table.table import EVICTED, EXPORT, VALID, HashTable
from jaxops.hashtable._table.words64 import add_to_words, as_counter
from jaxops.hashtable._walks.batch import set_rows
from jaxops.hashtable._walks.probe import place_new_keys
from jaxops.hashtable._walks.slot_owner import move_state_rows

__all__ = ["rehash", "rehash_on_shard", "rehash_slots"]


def rehash_on_shard(router, statics, state, replicated):
    """``resize`` on one shard (a ``Placement.map`` function): ``(old, new)`` shards, or
    ``(old, new, old_states, fresh_states)`` with the states' rows moved along."""
    if len(state) == 2:
        old, new = state
        return rehash(old, new), ()
    old, new, old_states, fresh_states = state
    new, slot = rehash_slots(old, new)
    return new, tuple(move_state_rows(o, f, old, slot) for o, f in zip(old_states, fresh_states))


def rehash(old: HashTable, new: HashTable) -> HashTable:
    """``new`` (an empty shard) holding every live entry of ``old`` (one shard), in
    ascending old-slot order, with their counters, flags, rows and ``last_access``."""
    return rehash_slots(old, new)[0]


@functools.partial(jax.jit, inline=True)
def rehash_slots(old: HashTable, new: HashTable, used: jax.Array | None = None
                 ) -> tuple[HashTable, jax.Array]:
    """:func:`rehash`, and where each old slot's entry went (int32 ``[old slots]``, -1:
    none): the map that moves optimizer state rows along
    (:func:`~jaxops.hashtable._walks.slot_owner.move_state_rows`). ``used``: the old slots to move
    (default: the live ones)."""
    if used is None:
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
        last_access=put(new.last_access, rows=old.last_access),
        epoch=put(new.epoch, rows=old.epoch), clock=old.clock,
        live=old.live - jnp.sum(lost_live, dtype=jnp.int32),
        not_exported=old.not_exported - jnp.sum(lost_live & ((old.flags & EXPORT) == 0),
                                                dtype=jnp.int32),
        dropped=add_to_words(as_counter(old.dropped), jnp.sum(lost_live, dtype=jnp.int32))), slot
