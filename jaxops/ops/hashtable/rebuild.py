"""``resize`` and ``compact``: the same live entries in a rebuilt table, on any placement
(on a mesh every shard is rebuilt where it lives; each key stays with its owner).

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(4, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([1, 2, 3], np.int64))
>>> big = ht.resize(t, 64)
>>> big.bucket_size, int(big.live), ht.find(big, np.array([1, 2, 3], np.int64))[1].tolist()
(64, 3, [True, True, True])
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.batch import set_rows
from jaxops.ops.hashtable.create import init_table, initializer_rows
from jaxops.ops.hashtable.murmur import home_slot
from jaxops.ops.hashtable.owner import move_state_rows
from jaxops.ops.hashtable.placement import placement_of
from jaxops.ops.hashtable.probe import place_new_keys
from jaxops.ops.hashtable.table import EVICTED, EXPORT, VALID, HashTable, check_bucket_size
from jaxops.ops.hashtable.words import add_to_words, as_counter

__all__ = ["compact", "rehash", "rehash_slots", "resize"]


def resize(table: Any, new_bucket_size: int, *, initializer_mode: str | None = None,
           constant_value: float = 0.0, sampled_values: jax.Array | None = None,
           key: jax.Array | None = None, states: Sequence[tuple[Any, Callable]] = ()) -> Any:
    """Rehashes every live entry into a table of ``new_bucket_size`` slots.

    Keys, counters, flags (export state included), rows, ``last_access`` (and the table's
    ``clock``) and the live / not-exported counts are kept; entries are reinserted in ascending old-slot order. Tombstones are dropped
    (beyond CANN, which has no resize: they only kept evicted keys' slots, and their keys are
    gone either way), so a table may shrink to its live keys. The new table's free slots get
    rows as in :func:`init_table` (the initializer arguments are passed on); the load limit
    and policy are kept. On a mesh ``new_bucket_size`` is the slots in all (each shard gets
    ``ceil(new_bucket_size / num_shards)``) and shard ``i``'s free rows are drawn with
    ``fold_in(key, i)``.

    ``states``: optimizer states beside the table, each as ``(state, init)`` with ``init``
    the function that makes that state for a table (``opt.init``, ``adam_w_init``). They are
    rebuilt with the table: each key's state rows move with its row (a slot whose state
    belonged to another key starts from ``init``'s rows), every other slot holds ``init``'s
    rows, and counts and scalars are kept. Then ``(table, [state, ...])`` is returned.

    Raises:
        OpArgumentError: when the live entries do not fit a shard (checked when the table
            is concrete; inside ``jit`` the entries that find no slot are counted in
            ``table.dropped``).
    """
    op = "resize"
    place = placement_of(op, table)
    storage = place.storage(table)
    new_bucket_size = check_bucket_size(op, new_bucket_size, "new_bucket_size")
    per = -(-new_bucket_size // place.num_shards)
    if not isinstance(storage.live, jax.core.Tracer):
        most = int(np.max(place.per_shard(storage.live)))
        if most > per:
            where = " per shard (the live keys of the fullest shard)" if place.routes else \
                " (the live keys)"
            raise OpArgumentError(op, "new_bucket_size", f"at least {most}{where}",
                                  f"{new_bucket_size}" + (f" ({per} per shard)"
                                                          if place.routes else ""))
    rows = initializer_rows(storage.initializer, per * place.num_shards, storage.embedding_dim) \
        if initializer_mode is None else dict(initializer_mode=initializer_mode,
                                              constant_value=constant_value,
                                              sampled_values=sampled_values, key=key)
    fresh = place.storage(init_table(per * place.num_shards, storage.embedding_dim,
                                     placement=place, **rows))
    fresh = fresh.replace(max_load_factor=storage.max_load_factor,
                          load_policy=storage.load_policy, key_dtype=storage.key_dtype,
                          initializer=storage.initializer)
    if not states:
        new, _ = place.map(_rehash_on_shard, None, (storage, fresh))
        return place.rebuild(table, new)
    grown = place.rebuild(None, fresh)
    fresh_states = tuple(init(grown) for _, init in states)
    old_states = tuple(state for state, _ in states)
    new, moved = place.map(_rehash_on_shard, None, (storage, fresh, old_states, fresh_states))
    return place.rebuild(table, new), list(moved)


def _rehash_on_shard(router, statics, state, replicated):
    if len(state) == 2:
        old, new = state
        return rehash(old, new), ()
    old, new, old_states, fresh_states = state
    new, slot = rehash_slots(old, new)
    return new, tuple(move_state_rows(o, f, old, slot) for o, f in zip(old_states, fresh_states))


def compact(table: Any, **init) -> Any:
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
    placement_of("compact", table)
    return resize(table, table.bucket_size, **init)


def rehash(old: HashTable, new: HashTable) -> HashTable:
    """``new`` (an empty shard) holding every live entry of ``old`` (one shard), in
    ascending old-slot order, with their counters, flags, rows and ``last_access``."""
    return rehash_slots(old, new)[0]


@functools.partial(jax.jit, inline=True)
def rehash_slots(old: HashTable, new: HashTable, used: jax.Array | None = None
                 ) -> tuple[HashTable, jax.Array]:
    """:func:`rehash`, and where each old slot's entry went (int32 ``[old slots]``, -1:
    none): the map that moves optimizer state rows along (:func:`~.owner.move_state_rows`).
    ``used``: the old slots to move (default: the live ones)."""
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
