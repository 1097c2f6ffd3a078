"""Which key a slot's optimizer state belongs to (``owner``), so that a key never inherits
another key's optimizer state.

Optimizer state lies beside the table, one row per slot. A slot changes hands when a new
key takes another key's tombstone (:func:`~jaxops.ops.hashtable.inserting.lookup_or_insert`,
:func:`~jaxops.ops.hashtable.importing.import_`; after ``evict``, ``evict_lowest`` or
``evict_if``) and when ``compact`` moves keys. So every optimizer state with per-slot rows
records, per slot, the key words of the slot's key when its row was last written: 8 bytes
a slot, whatever the row's width. An update reads the owner of each touched slot with the
slot's key (O(batch)); where they differ it starts the slot's state rows from the
optimizer's initial value and records the new owner.

The same key coming back to its own tombstone keeps its state (the key is the same: as in
CANN, whose state tensors are indexed by slot and where only the same key reuses a slot);
a key whose tombstone another key took starts fresh wherever it lands.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(4, 1, initializer_mode="constant")
>>> t, _, info = ht.lookup_or_insert(t, np.array([7], np.int64))
>>> owner = slot_owners(t)
>>> changed, _ = changed_hands(owner, t, info.slots)
>>> changed.tolist()
[False]
>>> t = ht.evict(t, np.array([7], np.int64))
>>> t = t.replace(key_lo=t.key_lo.at[info.slots].set(8))  # as if key 8 took the tombstone
>>> changed_hands(owner, t, info.slots)[0].tolist()
[True]
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxops.ops.hashtable.batch import set_rows
from jaxops.ops.hashtable.probe import take
from jaxops.ops.hashtable.table import HashTable
from jaxops.ops.hashtable.words import Words64

__all__ = ["changed_hands", "move_state_rows", "record_owners", "reset_rows", "slot_owners"]


def slot_owners(table: HashTable) -> Words64:
    """The owner record of a new optimizer state: the table's key words now (each its own
    buffer, so that the state can be donated beside the table)."""
    return Words64(jnp.array(table.key_lo, copy=True), jnp.array(table.key_hi, copy=True))


def changed_hands(owner: Words64, table: HashTable, read: jax.Array
                  ) -> tuple[jax.Array, Words64]:
    """For in-range slots ``read`` ``[K]``: whether each slot's key differs from the owner of
    its state rows (bool ``[K]``), and the slots' keys (to record with :func:`record_owners`)."""
    keys = Words64(take(table.key_lo, read), take(table.key_hi, read))
    return (take(owner.lo, read) != keys.lo) | (take(owner.hi, read) != keys.hi), keys


def record_owners(owner: Words64, at: jax.Array, keys: Words64, write: jax.Array) -> Words64:
    """``owner`` with ``keys`` recorded at slots ``at`` where ``write`` (distinct slots)."""
    return Words64(set_rows(owner.lo, at, keys.lo, write), set_rows(owner.hi, at, keys.hi, write))


def move_state_rows(old: Any, fresh: Any, table: HashTable, slot: jax.Array) -> Any:
    """An optimizer state moved with its table's entries (one shard): ``fresh`` (the state
    ``init`` makes for the rebuilt table) with the rows of every old slot ``i`` whose key
    went to ``slot[i]`` (-1: nowhere), when the state rows there belonged to that key (its
    ``owner``); a key whose rows were another key's keeps ``fresh``'s rows, which is where
    its first update would start. Leaves that are not per slot (counts, scalars such as
    AdamW's beta powers) are taken from ``old``.
    """
    size = table.bucket_size
    if "owner" in getattr(old, "_fields", ()):
        write = (slot >= 0) & ~changed_hands(old.owner, table, jnp.arange(size))[0]
    else:
        write = slot >= 0

    def move(o, f):
        per_slot = jnp.ndim(o) >= 1 and jnp.shape(o)[0] == size and jnp.ndim(f) >= 1 \
            and jnp.shape(f)[0] != 0 and jnp.shape(f)[1:] == jnp.shape(o)[1:]
        return set_rows(f, slot, o, write) if per_slot else o

    return jax.tree.map(move, old, fresh)


def reset_rows(state: Any, init: Any, slots: jax.Array) -> Any:
    """``state`` (one shard's) with the per-slot rows at ``slots`` (a bool mask) set to the
    rows ``init`` (the optimizer's ``init``) gives a new table, owner record included: an
    evicted key's state is gone, so the key starts fresh if it comes back."""
    size = slots.shape[0]
    width = _row_width(state, size)
    fresh = init(HashTable.empty(1, width, jnp.zeros((1, width), jnp.float32)))

    def reset(o, f):
        if jnp.ndim(o) >= 1 and jnp.shape(o)[0] == size and jnp.shape(f)[:1] == (1,):
            mask = slots.reshape(-1, *([1] * (jnp.ndim(o) - 1)))
            return jnp.where(mask, f.astype(o.dtype), o)
        return o

    return jax.tree.map(reset, state, fresh)


def _row_width(state: Any, size: int) -> int:
    """The embedding width a state's per-slot rows have (1 when none is 2-D)."""
    for leaf in jax.tree.leaves(state):
        if jnp.ndim(leaf) == 2 and jnp.shape(leaf)[0] == size:
            return int(jnp.shape(leaf)[1])
    return 1
