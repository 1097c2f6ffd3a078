"""Pieces every batched table operation shares: key batches and per-slot grouping.

>>> import jax.numpy as jnp
>>> slot = jnp.array([4, -1, 4, 2], jnp.int32)
>>> first_per_slot(slot, 8).tolist(), last_per_slot(slot, 8).tolist()
([True, False, False, True], [False, False, True, True])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.ops.hashtable.murmur import home_slot
from jaxops.ops.hashtable.probe import find_slots, first_occurrences, place_new_keys, take
from jaxops.ops.hashtable.table import EVICTED, HashTable, Words64, as_words

_NOBODY = np.int32(np.iinfo(np.int32).max)


class KeyBatch(NamedTuple):
    """A flattened batch of keys: words ``[N]``, home slots ``[N]`` and the input shape."""

    words: Words64
    home: jax.Array
    shape: tuple[int, ...]


def key_batch(op: str, keys: Any, bucket_size: int, arg: str = "keys") -> KeyBatch:
    """Keys in any accepted form (see :func:`~jaxops.ops.hashtable.table.as_words`), flat."""
    words = as_words(keys, op, arg)
    shape = words.shape
    words = Words64(words.lo.reshape(-1), words.hi.reshape(-1))
    return KeyBatch(words, home_slot(words.lo, words.hi, bucket_size), shape)


def live_slots(table: HashTable, batch: KeyBatch, active: jax.Array | None = None) -> jax.Array:
    """Slot of each key that is present and not evicted, -1 otherwise (int32 ``[N]``)."""
    return live_slots_and_flags(table, batch, active)[0]


def live_slots_and_flags(table: HashTable, batch: KeyBatch, active: jax.Array | None = None
                         ) -> tuple[jax.Array, jax.Array]:
    """:func:`live_slots` and the flags of those slots (uint8 ``[N]``, 0 where -1), read
    by the probe itself."""
    n = batch.home.shape[0]
    active = jnp.ones(n, bool) if active is None else active
    slot, _, flags = find_slots(table, batch.words, active)
    live = (flags & EVICTED) == 0
    return jnp.where(live, slot, -1), jnp.where(live, flags, jnp.uint8(0))


def find_or_place(table: HashTable, batch: KeyBatch, active: jax.Array) -> jax.Array:
    """The slot of each active key: where it is (tombstones included), else where it is
    inserted — absent keys in order of first occurrence; -1 where the table is full.

    Only slots are decided; writing the keys into them is the caller's job.
    """
    size, n = table.bucket_size, batch.home.shape[0]
    found, dist, _ = find_slots(table, batch.words, active)
    new = active & (found < 0) & (dist < size)
    first = first_occurrences(batch.words, new)
    placed = place_new_keys(table.flags, batch.home, dist,
                            new & (first == jnp.arange(n, dtype=jnp.int32)))
    return jnp.where(found >= 0, found, jnp.where(new, take(placed, first), -1))


def first_per_slot(slot: jax.Array, bucket_size: int) -> jax.Array:
    """True at the first batch entry of each slot (entries with slot -1 are never first)."""
    return (slot >= 0) & (slot_leader(slot, bucket_size) == jnp.arange(slot.shape[0]))


def slot_leader(slot: jax.Array, bucket_size: int) -> jax.Array:
    """For each entry, the index of the first entry with the same slot (itself for -1)."""
    idx = jnp.arange(slot.shape[0], dtype=jnp.int32)
    where = jnp.where(slot >= 0, slot, bucket_size)
    best = jnp.full(bucket_size, _NOBODY).at[where].min(idx, mode="drop")
    return jnp.where(slot >= 0, take(best, jnp.maximum(slot, 0)), idx)


def last_per_slot(slot: jax.Array, bucket_size: int) -> jax.Array:
    """True at the last batch entry of each slot (entries with slot -1 are never last)."""
    idx = jnp.arange(slot.shape[0], dtype=jnp.int32)
    where = jnp.where(slot >= 0, slot, bucket_size)
    best = jnp.full(bucket_size, -1, jnp.int32).at[where].max(idx, mode="drop")
    return (slot >= 0) & (take(best, jnp.maximum(slot, 0)) == idx)


def count_per_slot(slot: jax.Array, bucket_size: int) -> jax.Array:
    """For each entry, how many batch entries share its slot (0 for slot -1)."""
    where = jnp.where(slot >= 0, slot, bucket_size)
    counts = jnp.zeros(bucket_size, jnp.int32).at[where].add(1, mode="drop")
    return jnp.where(slot >= 0, take(counts, jnp.maximum(slot, 0)), 0)


def set_rows(a: jax.Array, slot: jax.Array, rows: jax.Array, write: jax.Array) -> jax.Array:
    """``a`` with ``a[slot[i]] = rows[i]`` where ``write[i]`` (written slots are distinct)."""
    where = jnp.where(write, slot, a.shape[0])
    return a.at[where].set(rows.astype(a.dtype), mode="drop", unique_indices=True)
