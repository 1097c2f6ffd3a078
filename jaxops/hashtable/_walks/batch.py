"""Pieces every batched table operation shares: key batches and grouping of a batch.

Duplicates in a batch are grouped by the batch alone (each entry learns the index of the
first entry of its group), never with a scratch array of the table's size: a call costs
O(batch) whatever the table holds.

>>> import jax.numpy as jnp
>>> slot = jnp.array([4, -1, 4, 2], jnp.int32)
>>> first = group_first(slot_words(slot), slot >= 0)
>>> is_first(first, slot >= 0).tolist(), is_last(first, slot >= 0).tolist()
([True, False, False, True], [False, False, True, True])
>>> group_count(first, slot >= 0).tolist()
[2, 0, 2, 1]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.hashtable._table.murmur import home_slot
from jaxops.hashtable._table.table import EVICTED, HashTable
from jaxops.hashtable._table.words64 import Words64, as_words
from jaxops.hashtable._walks.probe import find_slots, first_occurrences, place_new_keys, take
from jaxops.hashtable._walks.row_gather import put_rows


class KeyBatch(NamedTuple):
    """A flattened batch of keys: words ``[N]``, home slots ``[N]`` and the input shape."""

    words: Words64
    home: jax.Array
    shape: tuple[int, ...]


def key_batch(op: str, keys: Any, bucket_size: int, arg: str = "keys",
              key_dtype: str | None = None) -> KeyBatch:
    """Keys in any accepted form (see :func:`~jaxops.hashtable._table.words64.as_words`), flat."""
    words = as_words(keys, op, arg, key_dtype)
    shape = words.shape
    words = Words64(words.lo.reshape(-1), words.hi.reshape(-1))
    return KeyBatch(words, home_slot(words.lo, words.hi, bucket_size), shape)


def flat_words(op: str, keys: Any, key_dtype: str | None = None, arg: str = "keys"
               ) -> tuple[Words64, tuple[int, ...]]:
    """Keys in any accepted form as flat :class:`Words64`, and the keys' shape (host keys
    are flattened on the host: an eager reshape is a dispatch of its own)."""
    if isinstance(keys, np.ndarray) and keys.ndim != 1:
        return as_words(keys, op, arg, key_dtype, flat=True), keys.shape
    words = as_words(keys, op, arg, key_dtype)
    if words.lo.ndim == 1:
        return words, words.shape
    return Words64(words.lo.reshape(-1), words.hi.reshape(-1)), words.shape


def shaped(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``x.reshape(shape)``, skipping the (dispatched) reshape when it is one already."""
    return x if tuple(x.shape) == tuple(shape) else x.reshape(shape)


def effective_keys(words: Words64, filter_key_flag, filter_key, default_key_or_value,
                   default_key) -> tuple[Words64, jax.Array]:
    """The keys a call works on (``filter_key`` replaced by ``default_key`` where asked) and
    the mask of the occurrences it skips (``filter_key`` answered with the default value)."""
    skip = jnp.zeros(words.lo.shape, bool)
    if filter_key_flag:
        f_lo, f_hi = _const_words(filter_key)
        is_filter_key = (words.lo == f_lo) & (words.hi == f_hi)
        if default_key_or_value:
            d_lo, d_hi = _const_words(default_key)
            words = Words64(jnp.where(is_filter_key, d_lo, words.lo),
                            jnp.where(is_filter_key, d_hi, words.hi))
        else:
            skip = is_filter_key
    return words, skip


def _const_words(value: int) -> tuple[np.uint32, np.uint32]:
    pair = np.array([value % 2**64], np.uint64).view(np.uint32)  # uint64 keys: their bits
    return pair[0], pair[1]


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


class Placed(NamedTuple):
    """Where :func:`find_or_place` put a batch, and the table arrays it used as scratch.

    Attributes:
        slot: int32 ``[N]``: each key's slot (tombstones included), -1 where it has none.
        old_flags: uint8 ``[N]``: the flags the slot had before when it held the key (its
            own tombstone included); 0 for a key placed in an empty slot or another key's
            tombstone.
        placed: bool ``[N]``: the slot was decided by
            :func:`~jaxops.hashtable._walks.probe.place_new_keys`; the caller must write the
            key's words and flags there.
        key_lo, flags: the table's arrays with placement scratch in every placed slot: write
            the placed keys' words and flags into these, never into the table's originals
            (that would cost XLA a full copy of each).
    """

    slot: jax.Array
    old_flags: jax.Array
    placed: jax.Array
    key_lo: jax.Array
    flags: jax.Array


def find_or_place(table: HashTable, batch: KeyBatch, active: jax.Array, first: jax.Array
                  ) -> Placed:
    """The slot of each active key: where it is, else where it is inserted — absent keys in
    order of first occurrence, each in the first reusable slot (empty, or another key's
    tombstone) its probe met; -1 where the table is full. A key finding its own tombstone
    revives it in place unless an earlier key of the batch reused that tombstone (see
    :mod:`~jaxops.hashtable._walks.probe`).

    ``first`` is :func:`first_occurrences` of the batch over (at least) the active keys.
    Only slots are decided; writing the keys into them is the caller's job.
    """
    n = batch.home.shape[0]
    found, dist, found_flags, reuse = find_slots(table, batch.words, active, track_reuse=True)
    tomb = (found >= 0) & ((found_flags & EVICTED) != 0)
    start = jnp.minimum(reuse, dist)  # the first reusable slot the walk met
    to_place = active & ((found < 0) | tomb)
    lead = to_place & (first == jnp.arange(n, dtype=jnp.int32))
    placed_at, key_lo, flags = place_new_keys(table.key_lo, table.flags, batch.home, start, lead,
                                              jnp.where(tomb, dist, -1))
    slot = jnp.where(to_place, take(placed_at, first), jnp.where(active, found, -1))
    kept = (found >= 0) & (slot == found)  # live, or a tombstone revived in place
    return Placed(slot, jnp.where(kept, found_flags, jnp.uint8(0)), to_place & (slot >= 0),
                  key_lo, flags)


def group_first(words: Words64, member: jax.Array) -> jax.Array:
    """For each member, the index of the first member with the same key (int32 ``[N]``);
    non-members get their own index. O(batch): no array of the table's size."""
    return first_occurrences(words, member)


def is_first(first: jax.Array, member: jax.Array) -> jax.Array:
    """True at the first member of each group."""
    return member & (first == jnp.arange(first.shape[0], dtype=jnp.int32))


def is_last(first: jax.Array, member: jax.Array) -> jax.Array:
    """True at the last member of each group."""
    n = first.shape[0]
    idx = jnp.arange(n, dtype=jnp.int32)
    last = jnp.full(n, -1, jnp.int32).at[jnp.where(member, first, n)].max(idx, mode="drop")
    return member & (take(last, first) == idx)


def group_count(first: jax.Array, member: jax.Array) -> jax.Array:
    """For each member, the size of its group (0 for non-members)."""
    n = first.shape[0]
    counts = jnp.zeros(n, jnp.int32).at[jnp.where(member, first, n)].add(1, mode="drop")
    return jnp.where(member, take(counts, first), 0)


def group_weight(first: jax.Array, member: jax.Array, weights: jax.Array) -> jax.Array:
    """For each member, the sum of its group's ``weights`` (0 for non-members)."""
    n = first.shape[0]
    totals = jnp.zeros(n, weights.dtype).at[jnp.where(member, first, n)].add(weights,
                                                                              mode="drop")
    return jnp.where(member, take(totals, first), 0)


def group_prefix(first: jax.Array, member: jax.Array, weights: jax.Array) -> jax.Array:
    """For each member, the sum of ``weights`` over the members of its group before it (in
    index order): the occurrences of its key that come first. O(n log n) (one sort).

    >>> group_prefix(jnp.array([0, 1, 0, 0]), jnp.ones(4, bool), jnp.array([2, 1, 3, 1])).tolist()
    [0, 0, 2, 5]
    """
    n = first.shape[0]
    group = jnp.where(member, first, n)
    order = jnp.argsort(group, stable=True)  # groups together, each in index order
    w = jnp.where(member, weights, 0)[order]
    before = jnp.cumsum(w) - w
    g = group[order]
    starts = jnp.concatenate([jnp.ones(1, bool), g[1:] != g[:-1]])
    base = jax.lax.cummax(jnp.where(starts, before, 0))  # the prefix at the group's start
    return jnp.zeros(n, weights.dtype).at[order].set(before - base, unique_indices=True)


def group_sum(first: jax.Array, member: jax.Array, rows: jax.Array) -> jax.Array:
    """Rows summed per group, found at each group's first member (``[N, ...]``)."""
    n = first.shape[0]
    return jnp.zeros_like(rows).at[jnp.where(member, first, n)].add(rows, mode="drop")


def slot_words(slot: jax.Array) -> Words64:
    """Slots as 64-bit words, to group entries by slot with :func:`group_first`."""
    return Words64(slot.astype(jnp.uint32), jnp.zeros(slot.shape, jnp.uint32))


def set_rows(a: jax.Array, slot: jax.Array, rows: jax.Array, write: jax.Array) -> jax.Array:
    """``a`` with ``a[slot[i]] = rows[i]`` where ``write[i]`` (written slots are distinct)."""
    return put_rows(a, jnp.where(write, slot, a.shape[0]).astype(jnp.int32), rows)
