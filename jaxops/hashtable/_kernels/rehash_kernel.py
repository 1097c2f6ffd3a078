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
    ascending old-slot order, with their counters, flags, rows and ``last_access``. At the
    same size the order starts after :func:`_first_uncrossed` (wrapping past the end)."""
    return rehash_slots(old, new)[0]


def _first_uncrossed(home: jax.Array, used: jax.Array) -> jax.Array:
    """The first slot that the fewest used slots' probe paths (``[home, slot)``) pass: one
    none passes when there is one (an empty slot is one).

    Rebuilt at the same size in ascending slot order from the slot after it, no path wraps
    past the order's start, so each key lands at its old slot or earlier on its path (by
    induction: a key placed before it has an earlier old slot, and its path ends there) and
    keeps within its window; from slot 0 a key whose path wraps past the table's end could
    take a slot a later key needs, and push keys out of their windows."""
    size = home.shape[0]
    pos = jnp.arange(size, dtype=jnp.int32)
    edges = jnp.zeros(size + 1, jnp.int32).at[jnp.where(used, home, size)].add(1)
    edges = edges.at[jnp.where(used, pos, size)].add(-1)
    cover = jnp.cumsum(edges[:size]) + jnp.sum(used & (home > pos), dtype=jnp.int32)
    return jnp.argmin(cover).astype(jnp.int32)


def _rolled(a: jax.Array, by) -> jax.Array:
    """``a`` read from index ``by`` on, wrapping (``jnp.roll(a, -by)``; ``by=0``: ``a``)."""
    return a if isinstance(by, int) and by == 0 else jnp.roll(a, -by)


@functools.partial(jax.jit, inline=True)
def rehash_slots(old: HashTable, new: HashTable, used: jax.Array | None = None
                 ) -> tuple[HashTable, jax.Array]:
    """:func:`rehash`, and where each old slot's entry went (int32 ``[old slots]``, -1:
    none): the map that moves optimizer state rows along
    (:func:`~jaxops.hashtable._walks.slot_owner.move_state_rows`). ``used``: the old slots to move
    (default: the live ones)."""
    rotate = used is None and old.bucket_size == new.bucket_size  # compact: keys keep windows
    if used is None:
        used = (old.flags & (VALID | EVICTED)) == VALID
    home = home_slot(old.key_lo, old.key_hi, new.bucket_size)
    first = _first_uncrossed(home, used) + 1 if rotate else 0  # the old slot inserted first
    slot, key_lo, flags = place_new_keys(new.key_lo, new.flags, _rolled(home, first),
                                         jnp.zeros_like(home), _rolled(used, first))
    slot = _rolled(slot, -first)
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
