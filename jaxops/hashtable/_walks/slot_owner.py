"""Which key a slot's optimizer state belongs to (``owner``), so that a key never inherits
another key's optimizer state.

Optimizer state lies beside the table, one row per slot. A slot changes hands when a new
key takes another key's tombstone or an evicted key comes back (it starts fresh, as a new
key does; :func:`~jaxops.hashtable._ops.inserting.lookup_or_insert`,
:func:`~jaxops.hashtable._ops.importing.import_`, after ``evict``, ``evict_lowest`` or
``evict_if``), and when ``compact`` moves keys. So every optimizer state with per-slot rows
records, per slot, the key words of the slot's key and the slot's ``epoch`` (how many times
a key was placed there) when its row was last written (:class:`SlotOwner`): 12 bytes a
slot, whatever the row's width. An update reads the owner of each touched slot with the
slot's key and epoch (O(batch)); where they differ it starts the slot's state rows from the
optimizer's initial value and records the new owner. A key evicted and placed again (in its
own tombstone or elsewhere) has a new epoch: its old state is gone, on every placement and
through every eviction (``evict``, ``evict_lowest``, ``evict_if``, the load policies).

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(4, 1, initializer_mode="constant")
>>> t, _, info = ht.lookup_or_insert(t, np.array([7], np.int64))
>>> owner = slot_owners(t)
>>> changed, _ = changed_hands(owner, t, info.slots)
>>> changed.tolist()
[False]
>>> t = ht.evict(t, np.array([7], np.int64))
>>> t, _, _ = ht.lookup_or_insert(t, np.array([7], np.int64))  # key 7 comes back
>>> changed_hands(owner, t, info.slots)[0].tolist()
[True]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.hashtable._table.table import HashTable
from jaxops.hashtable._walks.batch import set_rows
from jaxops.hashtable._walks.probe import take
from jaxops.hashtable._table.buffers import copied
from jaxops.hashtable._walks.row_gather import put_each, take_each, take_rows

__all__ = ["SlotOwner", "advance_epochs", "changed_hands", "move_state_rows", "owners_changed",
           "record_owners", "reset_rows", "slot_owners"]


class SlotOwner(NamedTuple):
    """Whose a slot's optimizer state rows are: the key's words and the slot's ``epoch``
    when they were last written (uint32 ``[bucket_size]`` each)."""

    lo: jax.Array
    hi: jax.Array
    epoch: jax.Array


def advance_epochs(epoch: jax.Array, slot: jax.Array, placed: jax.Array) -> jax.Array:
    """``epoch`` one higher at the slots ``slot`` where ``placed`` (a key was placed there:
    a new key, or an evicted key coming back; distinct slots). Only those slots are read, so
    a batch of present keys touches no epoch."""
    now = take_rows(epoch, jnp.where(placed, slot, 0).astype(jnp.int32))
    return set_rows(epoch, slot, now + np.uint32(1), placed)


def slot_owners(table: HashTable) -> SlotOwner:
    """The owner record of a new optimizer state: the table's keys and epochs now (each its
    own buffer, so that the state can be donated beside the table)."""
    return SlotOwner(copied(table.key_lo), copied(table.key_hi), copied(table.epoch))


def changed_hands(owner: SlotOwner, table: HashTable, read: jax.Array
                  ) -> tuple[jax.Array, SlotOwner]:
    """For in-range slots ``read`` ``[K]``: whether each slot's key or epoch differs from
    the owner of its state rows (bool ``[K]``), and the slots' owners now (to record with
    :func:`record_owners`)."""
    return owners_changed(take_each([*owner, table.key_lo, table.key_hi, table.epoch], read))


def owners_changed(rows: list[jax.Array]) -> tuple[jax.Array, SlotOwner]:
    """:func:`changed_hands` from the rows of ``[*owner, key_lo, key_hi, epoch]`` at the
    slots, read by the caller (with other rows of the same slots, in one pass)."""
    was, now = SlotOwner(*rows[:3]), SlotOwner(*rows[3:6])
    return (was.lo != now.lo) | (was.hi != now.hi) | (was.epoch != now.epoch), now


def record_owners(owner: SlotOwner, at: jax.Array, now: SlotOwner, write: jax.Array
                  ) -> SlotOwner:
    """``owner`` with ``now`` recorded at slots ``at`` where ``write`` (distinct slots; one
    pass for the three words)."""
    where = jnp.where(write, at, owner.lo.shape[0])
    return SlotOwner(*put_each(list(owner), where, list(now)))


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
