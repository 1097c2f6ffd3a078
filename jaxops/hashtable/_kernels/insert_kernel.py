"""One shard's ``lookup_or_insert``: the shard function and its kernel.

:func:`insert_on_shard` is what :func:`~jaxops.hashtable._ops.inserting.lookup_or_insert`
runs on every shard (input distribution: each device sends each distinct key once to its
shard; the local kernel :func:`insert_lanes`; output distribution: rows and slots back to
every copy). :func:`insert_lanes` inserts lanes that each stand for some occurrences of their
key, in lane order, as a loop over the occurrences would (see ``lookup_or_insert`` for the
batch order); :func:`insert_keys` is the same for one occurrence a lane, the
EmbeddingHashTableLookupOrInsert OpDef's xla kernel.

>>> import jax.numpy as jnp, numpy as np
>>> from jaxops.hashtable._table.table import HashTable
>>> from jaxops.hashtable._table.words64 import as_words
>>> t = HashTable.empty(8, 1, jnp.zeros((8, 1)))
>>> t, rows, info = insert_keys(t, as_words(np.array([5, 6, 5], np.int64)),
...     filter_mode="no_filter", filter_freq=0, default_key_or_value=False, default_key=0,
...     default_value=0.0, filter_key_flag=False, filter_key=-1)
>>> int(info.inserted), int(t.live), bool(info.slots[0] == info.slots[2])
(2, 2, True)
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.hashtable._kernels.opdefs import LOOKUP_OR_INSERT_OP
from jaxops.hashtable._table.table import EVICTED, FILTER, VALID, HashTable
from jaxops.hashtable._table.words64 import Words64, add_to_words, as_counter
from jaxops.hashtable._walks.batch import (effective_keys, find_or_place, group_first, group_prefix,
                                           group_weight, is_first, key_batch, set_rows)
from jaxops.hashtable._walks.probe import take
from jaxops.hashtable._walks.row_gather import gather_rows, put_each, take_rows
from jaxops.hashtable._walks.slot_owner import advance_epochs

__all__ = ["LookupInfo", "insert_keys", "insert_lanes", "insert_on_shard"]


class LookupInfo(NamedTuple):
    """What one ``lookup_or_insert`` did (a pytree of arrays; counts over all shards).

    Attributes:
        slots: int32, keys' shape: the (global) slot of each key, -1 where it got no slot
            (table full, not routed) or was a filtered ``filter_key``.
        admitted: bool, keys' shape: True where the real row was returned (False: the
            ``default_value`` row, for filter_key, admission or a full table).
        inserted: int32: keys newly inserted (a revived tombstone counts).
        unplaced: int32: keys (occurrences) that found no free slot — lost to a full table.
        not_admitted: int32: occurrences refused by counter filtering.
        filtered: int32: occurrences equal to ``filter_key`` given ``default_value``.
        over_limit: bool: the call left more than ``max_live`` live keys in some shard (only
            seen inside ``jit``: eagerly the table's load policy acts instead).
        route: the ``RouteInfo`` of the call (keys not routed are in none of
            the counts; on one device every key is served).
    """

    slots: jax.Array
    admitted: jax.Array
    inserted: jax.Array
    unplaced: jax.Array
    not_admitted: jax.Array
    filtered: jax.Array
    over_limit: jax.Array
    route: Any = None


def insert_on_shard(router, statics, table, words, active, step):
    """``lookup_or_insert`` on one shard: each distinct key of the device's lanes to its
    shard, inserted there in batch order, its row and slot back to every copy."""
    attrs = dict(statics)
    # filter_key replaced by default_key before routing: the key a lane inserts decides its
    # shard (on the shard the replacement finds nothing left to replace).
    words, _ = effective_keys(words, attrs["filter_key_flag"], attrs["filter_key"],
                              attrs["default_key_or_value"], attrs["default_key"])
    ex = router.keys(words, active, dedup=True)  # each device sends each distinct key once
    received, _ = ex.received
    table = table.replace(clock=table.clock + np.uint32(1) if step is None
                          else jnp.asarray(step).astype(jnp.uint32))
    new, rows, info, refused = insert_lanes(table, received, ex.active, ex.weights, **attrs)
    rows, slots, refused = router.back(ex, (rows, router.global_slots(info.slots), refused),
                                       (attrs["default_value"], -1, 0))
    # Occurrence by occurrence: the first ``refused`` copies of a key were not admitted.
    admitted = (slots >= 0) & (router.copy_rank(ex, active) >= refused)
    rows = jnp.where(admitted[:, None], rows, jnp.float32(attrs["default_value"]))
    counts = router.total((info.inserted, info.unplaced, info.not_admitted, info.filtered))
    return new, (rows, slots, admitted), (counts, router.most(
        info.over_limit.astype(jnp.int32)) > 0), ex.sent


@LOOKUP_OR_INSERT_OP.kernel("xla")
def _lookup_or_insert_kernel(table, words, **attrs):
    flat = Words64(words.lo.reshape(-1), words.hi.reshape(-1))
    return insert_keys(table, flat, None, **attrs)


_ATTRS = ("filter_mode", "filter_freq", "default_key_or_value", "default_key", "default_value",
          "filter_key_flag", "filter_key")


@functools.partial(jax.jit, inline=True, static_argnames=_ATTRS)
def insert_keys(table: HashTable, words: Words64, active=None, **attrs
                ) -> tuple[HashTable, jax.Array, LookupInfo]:
    """One shard's insert, one occurrence a lane: the kernel of :func:`lookup_or_insert`
    (clock already set). ``active``: bool [N], False for padding lanes."""
    new, rows, info, refused = insert_lanes(table, words, active, None, **attrs)
    admitted = info.admitted & (refused == 0)
    rows = jnp.where(admitted[:, None], rows, jnp.float32(attrs["default_value"]))
    return new, rows, info._replace(admitted=admitted)


@functools.partial(jax.jit, inline=True, static_argnames=_ATTRS)
def insert_lanes(table: HashTable, words: Words64, active=None, weights=None, *, filter_mode,
                 filter_freq, default_key_or_value, default_key, default_value,
                 filter_key_flag, filter_key
                 ) -> tuple[HashTable, jax.Array, LookupInfo, jax.Array]:
    """One shard's insert of lanes that each stand for ``weights`` occurrences of their key
    (None: one), in lane order (a deduplicated routed batch: see ``Router.keys``).

    ``active``: bool [N], False for padding lanes, which do nothing and count nowhere.
    Returns ``(table, rows, info, refused)``: the rows of placed lanes (``default_value``
    where no slot; admission not applied), ``info.admitted`` True where placed, and for each
    lane how many of its occurrences counter filtering refused (the first ones), which the
    counts in ``info`` already include.
    """
    size = table.bucket_size
    words, skip = effective_keys(words, filter_key_flag, filter_key, default_key_or_value,
                                 default_key)
    n = words.lo.shape[0]
    padding = jnp.zeros(n, bool) if active is None else ~active
    w = jnp.ones(n, jnp.int32) if weights is None else weights.astype(jnp.int32)
    w = jnp.where(padding, 0, w)
    skip = skip | padding
    batch = key_batch(LOOKUP_OR_INSERT_OP.name, words, size)
    valid = ~skip
    first = group_first(batch.words, valid)  # equal keys share a slot: this groups slots too
    placing = find_or_place(table, batch, valid, first)
    slot, old_flags = placing.slot, placing.old_flags
    placed = slot >= 0

    # One writer per slot: the slot's first occurrence, carrying the slot's totals.
    lead = is_first(first, placed)
    at = jnp.maximum(slot, 0)
    fresh = (old_flags & VALID) == 0  # an empty slot or another key's tombstone: counter 0
    zero = jnp.zeros_like(at, dtype=jnp.uint32)
    before_lo = jnp.where(fresh, zero, take_rows(table.counter_lo, at))
    low = add_to_words(Words64(before_lo, zero), group_weight(first, placed, w))  # .hi: carry
    # The high word is read and written only where it changes (a carry, or a slot new to
    # its key) unless admission needs it: a present key's step then touches one counter
    # word, one random memory access fewer in a table larger than the caches.
    hi_changes = fresh | (low.hi != 0)
    read_hi = ~fresh if filter_mode == "counter" else ~fresh & hi_changes
    before = Words64(before_lo, jnp.where(read_hi, take_rows(table.counter_hi, jnp.where(
        read_hi, at, 0)), zero))
    after = Words64(low.lo, before.hi + low.hi)
    fresh = fresh | ((old_flags & EVICTED) != 0)  # a revived tombstone is new again
    flags = jnp.where(fresh, jnp.uint8(VALID), old_flags)
    refused = jnp.zeros(n, jnp.int32)
    if filter_mode == "counter":
        was_admitted = ((old_flags & FILTER) != 0) & ~fresh
        refused = _refused_by_counter(first, placed, w, before, was_admitted, filter_freq)
        reached = (after.hi > 0) | (after.lo >= np.uint32(filter_freq))
        flags = jnp.where(was_admitted | reached, flags | jnp.uint8(FILTER), flags)
    inserted = jnp.sum(lead & fresh, dtype=jnp.int32)
    unplaced = jnp.sum(jnp.where(valid & (slot < 0), w, 0), dtype=jnp.int32)
    # Only what changes is written: a present key's words (and mostly its flags) stay, and
    # each skipped write is one random memory access fewer in a table larger than the caches.
    new_key = lead & placing.placed
    # Every slot's counter and score are written (one pass for both words on the native path).
    counter_lo, last_access = put_each(
        [table.counter_lo, table.last_access], jnp.where(lead, slot, size),
        [after.lo, jnp.broadcast_to(table.clock, slot.shape)])
    new_table = table.replace(
        key_lo=set_rows(placing.key_lo, slot, batch.words.lo, new_key),
        key_hi=set_rows(table.key_hi, slot, batch.words.hi, new_key),
        counter_lo=counter_lo,
        counter_hi=set_rows(table.counter_hi, slot, after.hi, lead & hi_changes),
        flags=set_rows(placing.flags, slot, flags, lead & (flags != old_flags)),
        last_access=last_access,
        epoch=advance_epochs(table.epoch, slot, lead & fresh),
        live=table.live + inserted, not_exported=table.not_exported + inserted,
        dropped=add_to_words(as_counter(table.dropped), unplaced))
    rows = gather_rows(table.values, slot, default_value)
    info = LookupInfo(slot, placed, inserted, unplaced, jnp.sum(refused, dtype=jnp.int32),
                      jnp.sum(jnp.where(skip & ~padding, w, 0), dtype=jnp.int32),
                      new_table.live > table.max_live)
    return new_table, rows, info, refused


def _refused_by_counter(first, member, weights, before: Words64, was_admitted,
                        filter_freq: int):
    """How many occurrences each lane stands for are refused: those whose counter, this
    occurrence included, stays below ``filter_freq``.

    Occurrence ``r`` of a slot (1-based, batch order) is refused when ``before + r <
    filter_freq``, i.e. the first ``need - 1`` occurrences with ``need = filter_freq -
    before``; a lane covers occurrences ``prefix + 1 .. prefix + weight`` (``prefix``: the
    weights of its group's lanes before it), so it refuses its first ``need - 1 - prefix``.
    """
    low = (before.hi == 0) & (before.lo < np.uint32(filter_freq)) & ~was_admitted
    need = jnp.where(low, np.int32(filter_freq) - before.lo.astype(jnp.int32), 0)
    prefix = group_prefix(first, member, weights)
    return jnp.where(member, jnp.clip(need - 1 - prefix, 0, weights), 0)
