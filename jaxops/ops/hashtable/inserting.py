"""``lookup_or_insert``: rows of keys, inserting absent ones (CANN
EmbeddingHashTableLookupOrInsert), on any placement.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(16, 2, initializer_mode="constant", constant_value=1.0)
>>> t, rows, info = ht.lookup_or_insert(t, np.array([7, 9, 7], np.int64))
>>> rows.shape, int(info.inserted), int(t.live)
((3, 2), 2, 2)

**Batch order.** A batch behaves exactly like a loop over its keys in index order: new keys
are inserted in the order of their first occurrence (that decides their slots when probe
sequences meet and which keys miss out when the table fills up), every occurrence adds 1 to
its key's counter, and with counter filtering occurrence ``r`` of a key (1-based) sees the
counter ``before + r``. A new key takes the first reusable slot of its probe walk (empty, or
another key's tombstone — beyond CANN), so a key reviving its tombstone finds it taken when
an earlier key of the batch reused it, and is then inserted anew (see
:mod:`~jaxops.ops.hashtable.probe`). On a mesh each owner shard sees its keys in global
batch order, so a sharded table answers exactly as one table does.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.batch import (effective_keys, find_or_place, flat_words, group_first,
                                        group_prefix, group_weight, is_first, key_batch,
                                        set_rows, shaped)
from jaxops.ops.hashtable.load_policy import under_load_policy
from jaxops.ops.hashtable.opdefs import LOOKUP_OR_INSERT_OP
from jaxops.ops.hashtable.owner import advance_epochs
from jaxops.ops.hashtable.placement import placement_of, run_routed
from jaxops.ops.hashtable.probe import take
from jaxops.ops.hashtable.route import RouteInfo
from jaxops.ops.hashtable.row_gather import gather_rows
from jaxops.ops.hashtable.table import EVICTED, FILTER, VALID, HashTable
from jaxops.ops.hashtable.words import Words64, add_to_words, as_counter

__all__ = ["LookupInfo", "checked_attrs", "insert_keys", "insert_lanes", "lookup_or_insert"]

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
        route: the :class:`~.route.RouteInfo` of the call (keys not routed are in none of
            the counts; on one device every key is served).
    """

    slots: jax.Array
    admitted: jax.Array
    inserted: jax.Array
    unplaced: jax.Array
    not_admitted: jax.Array
    filtered: jax.Array
    over_limit: jax.Array
    route: RouteInfo | None = None


def lookup_or_insert(table: Any, keys: Any, *, filter_mode: str = "no_filter",
                     filter_freq: int = 0, default_key_or_value: bool = False,
                     default_key: int = 0, default_value: float = 0.0,
                     filter_key_flag: bool = False, filter_key: int = -1,
                     step: Any = None, donate: bool = False, route_capacity: int | None = None,
                     overflow: str = "expand") -> tuple[Any, jax.Array, LookupInfo]:
    """Rows of ``keys``, inserting absent keys (CANN EmbeddingHashTableLookupOrInsert).

    Every occurrence adds 1 to its key's counter. A new key takes the first reusable slot
    its probe met (an empty slot, or — beyond CANN — another key's tombstone) with the row
    already there (from :func:`init_table` or an eviction) and counter 0, and counts as an
    insert (live and not-exported counts +1); so does a tombstone of the same key, which
    comes back as new (EVICTED, EXPORT and FILTER cleared). See the module docstring for
    the batch order.

    Beyond CANN each call is a step of the table's clock: ``table.clock`` (every shard's)
    becomes ``step`` (default: the old clock + 1) and every slot the call touches (keys
    that got a slot, admitted or not) gets ``last_access = table.clock``, the score of LRU
    eviction (:func:`~jaxops.ops.hashtable.scored.evict_lowest`).

    Args:
        table: the table (any placement).
        keys: int64 keys in any accepted form (any shape).
        filter_mode: ``"no_filter"``, or ``"counter"``: admission, which CANN declares but
            does not implement — an occurrence whose counter (this one included) is below
            ``filter_freq`` gets ``default_value`` and the key no FILTER bit; from
            ``filter_freq`` on FILTER is set and the real row returned. A key with FILTER
            already set is admitted. With ``"no_filter"`` FILTER is never set (as CANN).
        filter_freq: the admission threshold (``0 <= filter_freq < 2**31``).
        default_key_or_value: with ``filter_key_flag``, replace ``filter_key`` by
            ``default_key`` (True) instead of answering ``default_value`` (False).
        default_key: the replacement key.
        default_value: the value of rows not read from the table (filtered, not admitted,
            table full, not routed).
        filter_key_flag: whether ``filter_key`` is special.
        filter_key: the special key.
        step: the clock value of this call, an int in ``[0, 2**32)`` or a uint32-castable
            scalar array (e.g. the training step); it should not decrease (ages are
            ``clock - last_access`` modulo 2**32). Default: ``table.clock + 1``.
        donate: eagerly, hand the table's buffers to the call so that the new table is
            written in place — no copy of the table, which a table larger than half the
            memory needs. ``table`` is consumed: its arrays are deleted, and only the
            returned table may be used. Inside ``jit`` donation is the outer jit's
            (``donate_argnums``) and this flag changes nothing.
        route_capacity: on a mesh, lanes per destination buffer on each device (static).
            ``None``: the device's batch slice, which nothing can overflow; smaller buffers
            move less data but may leave keys unserved (reported in ``info.route``).
        overflow: what an eager call does when keys did not fit their routing buffer:
            ``"expand"`` (rerun at the next power of two that fits), ``"error"`` or
            ``"truncate"`` (keys not served get ``default_value``; warns). Inside ``jit``,
            ``info.route`` reports it. One device routes nothing.

    Returns:
        ``(table, values, info)``: the new table, float32 ``keys.shape + (dim,)`` rows
        (differentiable w.r.t. ``table.values``) and a :class:`LookupInfo`. Keys that find
        no free slot get ``default_value``, are counted in ``info.unplaced`` and in
        ``table.dropped`` — never dropped silently. A call that would leave more than
        ``max_live`` live keys in a shard applies the table's load policy
        (:mod:`~jaxops.ops.hashtable.load_policy`: raise, grow the table or evict by score,
        eagerly and before the insert; inside ``jit`` ``info.over_limit``).

    >>> import numpy as np, jaxops.hashtable as ht
    >>> t = ht.init_table(16, 2, initializer_mode="constant")
    >>> t, rows, info = ht.lookup_or_insert(t, np.array([3, 4], np.int64), step=7, donate=True)
    >>> int(t.clock), np.asarray(t.last_access)[np.asarray(info.slots)].tolist()
    (7, [7, 7])
    """
    op = LOOKUP_OR_INSERT_OP.name
    place = placement_of(op, table)
    attrs = checked_attrs(dict(filter_mode=filter_mode, filter_freq=filter_freq,
                               default_key_or_value=default_key_or_value,
                               default_key=default_key, default_value=default_value,
                               filter_key_flag=filter_key_flag, filter_key=filter_key))
    if isinstance(step, (int, np.integer)):
        if not 0 <= int(step) < 2**32:
            raise OpArgumentError(op, "step", "an int in [0, 2**32)", repr(step))
        step = np.uint32(step)
    step = None if step is None else jnp.asarray(step)
    words, shape = flat_words(op, keys, place.storage(table).key_dtype)
    n = int(words.lo.shape[0])
    donate = donate and not isinstance(place.storage(table).live, jax.core.Tracer)
    if donate and place.routes and route_capacity is not None and overflow == "expand":
        raise OpArgumentError(op, "donate", "False when route_capacity is given with "
                              "overflow='expand' (a rerun needs the table the first try "
                              "consumed)", "True", "Pass route_capacity=None (never "
                              "overflows) or overflow='error'/'truncate'.")
    statics = tuple(sorted(attrs.items()))

    def insert(table):
        def attempt(capacity):
            new, (rows, slots, admitted), (counts, over), route = place.call(
                _insert_on_shard, statics, place.storage(table), words, step,
                capacity=capacity, donate=donate)
            info = LookupInfo(shaped(slots, shape), shaped(admitted, shape), *counts, over,
                              route._replace(served=shaped(route.served, shape)))
            return (place.rebuild(table, new, route.lost),
                    shaped(rows, (*shape, place.storage(table).embedding_dim)), info)

        return run_routed(op, place, attempt, lambda r: r[2].route, n, route_capacity, overflow,
                          table)

    skip = (filter_key_flag, filter_key, default_key_or_value, default_key)
    return under_load_policy(op, table, words, insert, skip=skip, donate=donate)


def checked_attrs(attrs: dict) -> dict:
    """The attributes checked (a bad name or value raises, naming it)."""
    out = LOOKUP_OR_INSERT_OP.check_attrs(attrs)
    if not 0 <= int(out["filter_freq"]) < 2**31:
        raise OpArgumentError(LOOKUP_OR_INSERT_OP.name, "filter_freq", "an int in [0, 2**31)",
                              repr(out["filter_freq"]))
    return out


def _insert_on_shard(router, statics, table, words, active, step):
    attrs = dict(statics)
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
        info.over_limit.astype(jnp.int32)) > 0)


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
    place = find_or_place(table, batch, valid, first)
    slot, old_flags = place.slot, place.old_flags
    placed = slot >= 0

    # One writer per slot: the slot's first occurrence, carrying the slot's totals.
    lead = is_first(first, placed)
    at = jnp.maximum(slot, 0)
    fresh = (old_flags & VALID) == 0  # an empty slot or another key's tombstone: counter 0
    zero = jnp.zeros_like(at, dtype=jnp.uint32)
    before_lo = jnp.where(fresh, zero, take(table.counter_lo, at))
    low = add_to_words(Words64(before_lo, zero), group_weight(first, placed, w))  # .hi: carry
    # The high word is read and written only where it changes (a carry, or a slot new to
    # its key) unless admission needs it: a present key's step then touches one counter
    # word, one random memory access fewer in a table larger than the caches.
    hi_changes = fresh | (low.hi != 0)
    read_hi = ~fresh if filter_mode == "counter" else ~fresh & hi_changes
    before = Words64(before_lo, jnp.where(read_hi, take(table.counter_hi, jnp.where(
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
    new_key = lead & place.placed
    new_table = table.replace(
        key_lo=set_rows(place.key_lo, slot, batch.words.lo, new_key),
        key_hi=set_rows(table.key_hi, slot, batch.words.hi, new_key),
        counter_lo=set_rows(table.counter_lo, slot, after.lo, lead),
        counter_hi=set_rows(table.counter_hi, slot, after.hi, lead & hi_changes),
        flags=set_rows(place.flags, slot, flags, lead & (flags != old_flags)),
        last_access=set_rows(table.last_access, slot, jnp.broadcast_to(table.clock, slot.shape),
                             lead),
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
