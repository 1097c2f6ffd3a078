"""Reading and inserting keys: ``find``, ``locate``, ``lookup`` and ``lookup_or_insert``.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(16, 2, initializer_mode="constant", constant_value=1.0)
>>> t, rows, info = ht.lookup_or_insert(t, np.array([7, 9, 7], np.int64))
>>> rows.shape, int(info.inserted), int(t.live)
((3, 2), 2, 2)
>>> rows, found = ht.find(t, np.array([9, 8], np.int64))
>>> found.tolist()
[True, False]

**Batch order.** A batch behaves exactly like a loop over its keys in index order: new keys
are inserted in the order of their first occurrence (that decides their slots when probe
sequences meet and which keys miss out when the table fills up), every occurrence adds 1 to
its key's counter, and with counter filtering occurrence ``r`` of a key (1-based) sees the
counter ``before + r``. A new key takes the first reusable slot of its probe walk (empty, or
another key's tombstone — beyond CANN), so a key reviving its tombstone finds it taken when
an earlier key of the batch reused it, and is then inserted anew (see
:mod:`~jaxops.ops.hashtable.probe`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.core.walk_table import walk_kernel
from jaxops.ops.hashtable.batch import (find_or_place, group_count, group_first, is_first,
                                        key_batch, live_slots, set_rows)
from jaxops.ops.hashtable.gather import gather, probed_rows
from jaxops.ops.hashtable.lanes import while_loop
from jaxops.ops.hashtable.load import count_new_keys, insert_under_policy
from jaxops.ops.hashtable.opdefs import LOOKUP_OR_INSERT
from jaxops.ops.hashtable.probe import take
from jaxops.ops.hashtable.table import (EVICTED, FILTER, VALID, HashTable, Words64,
                                        add_to_words, as_counter, as_words, check_table)

_NOBODY = np.int32(np.iinfo(np.int32).max)


class LookupInfo(NamedTuple):
    """What one ``lookup_or_insert`` did (a pytree of arrays).

    Attributes:
        slots: int32, keys' shape: the slot of each key, -1 where it got no slot (table
            full) or was a filtered ``filter_key``.
        admitted: bool, keys' shape: True where the real row was returned (False: the
            ``default_value`` row, for filter_key, admission or a full table).
        inserted: int32: keys newly inserted (a revived tombstone counts).
        unplaced: int32: keys (occurrences) that found no free slot — lost to a full table.
        not_admitted: int32: occurrences refused by counter filtering.
        filtered: int32: occurrences equal to ``filter_key`` given ``default_value``.
        over_limit: bool: the call left more than ``table.max_live`` live keys (only seen
            inside ``jit``: eagerly the table's load policy acts instead).
    """

    slots: jax.Array
    admitted: jax.Array
    inserted: jax.Array
    unplaced: jax.Array
    not_admitted: jax.Array
    filtered: jax.Array
    over_limit: jax.Array


def locate(table: HashTable, keys: Any) -> jax.Array:
    """The slot of each key (int32, keys' shape): -1 for absent and evicted keys.

    Args:
        table: the table.
        keys: int64 keys — numpy int64, JAX int64 (x64), JAX int32/uint32, or ``Words64``.
    """
    return _slots_of("locate", table, keys)


def _slots_of(op: str, table: Any, keys: Any) -> jax.Array:
    """:func:`locate` on behalf of ``op`` (the public function the user called, which its
    argument errors name)."""
    table = check_table(op, table)
    batch = key_batch(op, keys, table.bucket_size, key_dtype=table.key_dtype)
    return _locate(table, batch).reshape(batch.shape)


@jax.jit
def _locate(table, batch):
    return live_slots(table, batch)


def lookup(table: HashTable, keys: Any) -> jax.Array:
    """Rows of ``keys`` (zeros for absent keys), differentiable w.r.t. ``table.values``.

    ``jax.grad(lambda v: loss(lookup(table.replace(values=v), keys)))(table.values)``
    scatter-adds each row's gradient into its slot (see :func:`gather`).
    """
    table = check_table("lookup", table)
    return gather(table.values, _slots_of("lookup", table, keys))


def find(table: HashTable, keys: Any, *, default_value: float = 0.0
         ) -> tuple[jax.Array, jax.Array]:
    """``(values, found)`` for ``keys`` without changing the table.

    Returns:
        float32 ``keys.shape + (dim,)`` rows (``default_value`` where absent or evicted) and
        bool ``keys.shape``.
    """
    table = check_table("find", table)
    batch = key_batch("find", keys, table.bucket_size, key_dtype=table.key_dtype)
    rows, slots = _find(table, batch, float(default_value))
    return rows.reshape(*batch.shape, table.embedding_dim), (slots >= 0).reshape(batch.shape)


@functools.partial(jax.jit, static_argnums=2)
def _find(table, batch, default_value):
    """Rows and live slots; one native pass (probe and read) where the walks are native."""
    fused = walk_kernel("find_rows")
    if fused is not None:
        return probed_rows(fused, table.values, (table.key_lo, table.key_hi, table.flags,
                                                 batch.words.lo, batch.words.hi), default_value)
    slots = live_slots(table, batch)
    return gather(table.values, slots, default_value), slots


def lookup_or_insert(table: HashTable, keys: Any, *, filter_mode: str = "no_filter",
                     filter_freq: int = 0, default_key_or_value: bool = False,
                     default_key: int = 0, default_value: float = 0.0,
                     filter_key_flag: bool = False, filter_key: int = -1,
                     step: Any = None, donate: bool = False
                     ) -> tuple[HashTable, jax.Array, LookupInfo]:
    """Rows of ``keys``, inserting absent keys (CANN EmbeddingHashTableLookupOrInsert).

    Every occurrence adds 1 to its key's counter. A new key takes the first reusable slot
    its probe met (an empty slot, or — beyond CANN — another key's tombstone) with the row
    already there (from :func:`init_table` or an eviction) and counter 0, and counts as an
    insert (live and not-exported counts +1); so does a tombstone of the same key, which
    comes back as new (EVICTED, EXPORT and FILTER cleared). See the module docstring for
    the batch order.

    Beyond CANN each call is a step of the table's clock: ``table.clock`` becomes ``step``
    (default: the old clock + 1) and every slot the call touches (keys that got a slot,
    admitted or not) gets ``last_access = table.clock``, the score of LRU eviction
    (:func:`~jaxops.ops.hashtable.scored.evict_lowest`).

    Args:
        table: the table.
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
            table full).
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

    Returns:
        ``(table, values, info)``: the new table, float32 ``keys.shape + (dim,)`` rows
        (differentiable w.r.t. ``table.values``) and a :class:`LookupInfo`. Keys that find
        no free slot get ``default_value``, are counted in ``info.unplaced`` and in
        ``table.dropped`` — never dropped silently. A call that would leave more than
        ``table.max_live`` live keys applies the table's load policy
        (:mod:`~jaxops.ops.hashtable.load`: raise, grow the table or evict by score,
        eagerly and before the insert; inside ``jit`` ``info.over_limit``).

    >>> import numpy as np, jaxops.hashtable as ht
    >>> t = ht.init_table(16, 2, initializer_mode="constant")
    >>> t, rows, info = ht.lookup_or_insert(t, np.array([3, 4], np.int64), step=7, donate=True)
    >>> int(t.clock), np.asarray(t.last_access)[np.asarray(info.slots)].tolist()
    (7, [7, 7])
    """
    op = LOOKUP_OR_INSERT.name
    table = check_table(op, table)
    if not 0 <= int(filter_freq) < 2**31:
        raise OpArgumentError(op, "filter_freq", "an int in [0, 2**31)", repr(filter_freq))
    if isinstance(step, (int, np.integer)) and not 0 <= int(step) < 2**32:
        raise OpArgumentError(op, "step", "an int in [0, 2**32)", repr(step))
    words = as_words(keys, op, "keys", table.key_dtype)
    attrs = tuple(dict(filter_mode=filter_mode, filter_freq=filter_freq,
                       default_key_or_value=default_key_or_value, default_key=default_key,
                       default_value=default_value, filter_key_flag=filter_key_flag,
                       filter_key=filter_key).items())
    if isinstance(step, (int, np.integer)):
        step = np.uint32(step)
    step = None if step is None else jnp.asarray(step)
    tracing = isinstance(table.live, jax.core.Tracer)
    insert = _insert_donated if donate and not tracing else _insert
    new_table, rows, info = insert_under_policy(
        op, table, int(np.prod(words.shape)),
        lambda t: _count_new(t, words, attrs=attrs),
        lambda t: insert(t, words, step, attrs=attrs), donate=donate and not tracing)
    shape = words.shape
    return (new_table, rows.reshape(*shape, table.embedding_dim),
            info._replace(slots=info.slots.reshape(shape), admitted=info.admitted.reshape(shape)))


def _insert_fn(table: HashTable, words: Words64, step, *, attrs):
    clock = table.clock + np.uint32(1) if step is None else step.astype(jnp.uint32)
    return LOOKUP_OR_INSERT(table.replace(clock=clock), words, **dict(attrs))


_insert = jax.jit(_insert_fn, static_argnames="attrs")
_insert_donated = jax.jit(_insert_fn, static_argnames="attrs", donate_argnums=0)


@functools.partial(jax.jit, static_argnames="attrs")
def _count_new(table: HashTable, words: Words64, *, attrs):
    attrs = dict(attrs)
    flat = Words64(words.lo.reshape(-1), words.hi.reshape(-1))
    flat, skip = _effective_keys(flat, attrs["filter_key_flag"], attrs["filter_key"],
                                 attrs["default_key_or_value"], attrs["default_key"])
    return count_new_keys(table, flat, ~skip)


def _effective_keys(words: Words64, filter_key_flag, filter_key, default_key_or_value,
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


@LOOKUP_OR_INSERT.kernel("xla")
def _lookup_or_insert_kernel(table, words, **attrs):
    flat = Words64(words.lo.reshape(-1), words.hi.reshape(-1))
    return _lookup_or_insert(table, flat, **attrs)


@functools.partial(jax.jit, static_argnames=("filter_mode", "filter_freq", "default_key_or_value",
                                             "default_key", "default_value", "filter_key_flag",
                                             "filter_key"))
def _lookup_or_insert(table: HashTable, words: Words64, active=None, *, filter_mode,
                      filter_freq, default_key_or_value, default_key, default_value,
                      filter_key_flag, filter_key):
    # ``active``: bool [N], False for padding lanes (a sharded table's routing buffers),
    # which do nothing and count nowhere.
    size = table.bucket_size
    words, skip = _effective_keys(words, filter_key_flag, filter_key, default_key_or_value,
                                  default_key)
    padding = jnp.zeros(words.lo.shape[0], bool) if active is None else ~active
    skip = skip | padding
    batch = key_batch(LOOKUP_OR_INSERT.name, words, size)
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
    low = add_to_words(Words64(before_lo, zero), group_count(first, placed))  # .hi: the carry
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
    admitted = placed
    not_admitted = jnp.zeros((), jnp.int32)
    if filter_mode == "counter":
        was_admitted = ((old_flags & FILTER) != 0) & ~fresh
        refused = _refused_by_counter(first, placed, before, was_admitted, filter_freq)
        admitted = admitted & ~refused
        not_admitted = jnp.sum(refused, dtype=jnp.int32)
        reached = (after.hi > 0) | (after.lo >= np.uint32(filter_freq))
        flags = jnp.where(was_admitted | reached, flags | jnp.uint8(FILTER), flags)
    inserted = jnp.sum(lead & fresh, dtype=jnp.int32)
    unplaced = jnp.sum(valid & (slot < 0), dtype=jnp.int32)
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
        live=table.live + inserted, not_exported=table.not_exported + inserted,
        dropped=add_to_words(as_counter(table.dropped), unplaced))
    rows = gather(table.values, jnp.where(admitted, slot, -1), default_value)
    info = LookupInfo(slot, admitted, inserted, unplaced, not_admitted,
                      jnp.sum(skip & ~padding, dtype=jnp.int32), new_table.live > table.max_live)
    return new_table, rows, info


def _refused_by_counter(first, member, before: Words64, was_admitted, filter_freq: int):
    """Occurrences whose counter, this occurrence included, stays below ``filter_freq``.

    Occurrence ``r`` of a slot (1-based, batch order) is refused when ``before + r <
    filter_freq``, i.e. the first ``need - 1`` occurrences with ``need = filter_freq -
    before``. They are peeled off one round per rank (at most ``filter_freq - 1`` rounds,
    and no more than the largest multiplicity) instead of sorting the batch; a group is
    named by its first member (``first``), so the rounds cost O(batch).
    """
    n = first.shape[0]
    idx = jnp.arange(n, dtype=jnp.int32)
    low = (before.hi == 0) & (before.lo < np.uint32(filter_freq)) & ~was_admitted
    need = jnp.where(low, np.int32(filter_freq) - before.lo.astype(jnp.int32), 0)

    def peel(state):
        rank, remaining, refused = state
        best = jnp.full(n, _NOBODY).at[jnp.where(remaining, first, n)].min(idx, mode="drop")
        next_up = remaining & (take(best, first) == idx)
        refused = refused | (next_up & (rank < need))
        return rank + 1, remaining & ~next_up & (rank + 1 < need), refused

    start = member & (need > 1)
    _, _, refused = while_loop(lambda s: jnp.any(s[1]), peel,
                               (jnp.int32(1), start, jnp.zeros(n, bool)))
    return refused
