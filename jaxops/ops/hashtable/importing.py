"""``import_``: insert or overwrite entries (CANN EmbeddingHashTableImport), on any placement:
every entry goes to its owner shard.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> t, info = ht.import_(t, np.array([4], np.int64), np.array([9], np.uint64),
...                      np.array([1], np.uint8), np.ones((1, 2), np.float32))
>>> int(t.live), int(t.not_exported), int(t.flags[info.slots[0]])
(1, 0, 7)
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.batch import (find_or_place, flat_words, group_first, is_first,
                                        is_last, key_batch, set_rows)
from jaxops.ops.hashtable.checks import check_numeric
from jaxops.ops.hashtable.load_policy import under_load_policy
from jaxops.ops.hashtable.opdefs import IMPORT_OP
from jaxops.ops.hashtable.owner import advance_epochs
from jaxops.ops.hashtable.placement import placement_of, run_routed
from jaxops.ops.hashtable.table import EVICTED, EXPORT, FILTER, VALID, HashTable
from jaxops.ops.hashtable.words import Words64, add_to_words, as_counter

__all__ = ["ImportInfo", "import_", "import_entries"]


FLAGS = "an integer array [N] of filter flags (0 or 1 per entry)"
ROWS = "a float array [N, embedding_dim] of rows"

class ImportInfo(NamedTuple):
    """What one ``import_`` did.

    Attributes:
        slots: int32 ``[N]``: where each entry went (global slots), -1 if it found no free
            slot (or was not routed).
        inserted: int32: keys new to the table (a revived tombstone counts).
        unplaced: int32: entries lost to a full table (also added to ``table.dropped``).
        over_limit: bool: the call left more than ``table.max_live`` live keys (inside
            ``jit``; eagerly the table's load policy acts instead).
    """

    slots: jax.Array
    inserted: jax.Array
    unplaced: jax.Array
    over_limit: jax.Array


def import_(table: Any, keys: Any, counters: Any, filter_flags: Any, values: Any, *,
            route_capacity: int | None = None, overflow: str = "expand"
            ) -> tuple[Any, ImportInfo]:
    """Inserts or overwrites entries, e.g. the output of :func:`export` (refreshed).

    Each entry's slot gets its counter, its row and the flags VALID | EXPORT, plus FILTER
    where its filter flag is non-zero (CANN ignores that input and ORs VALID | EXPORT into
    the old flags; here the entry is overwritten, so a tombstone comes back live). A key
    new to the table (or a revived tombstone) adds 1 to the live count; an existing key not
    yet exported lowers the not-exported count. Duplicate keys: the last entry wins; new
    keys take slots in order of first occurrence (an empty slot or another key's tombstone,
    as in :func:`~jaxops.ops.hashtable.inserting.lookup_or_insert`). Each written slot's
    ``last_access`` becomes the table's ``clock`` (not advanced: an import is not a step).

    Args:
        table: the table (any placement).
        keys: int64 keys ``[N]`` in any accepted form.
        counters: uint64 ``[N]`` (numpy uint64, JAX uint64 with x64, uint32, or Words64).
        filter_flags: uint8-like ``[N]``.
        values: float32 ``[N, embedding_dim]``.
        route_capacity, overflow: on a mesh, as in ``lookup_or_insert``.

    Returns:
        ``(table, info)`` — unlike CANN, which drops entries silently when the table is
        full, the :class:`ImportInfo` says how many found no slot.
    """
    op = IMPORT_OP.name
    place = placement_of(op, table)
    storage = place.storage(table)
    words, _ = flat_words(op, keys, storage.key_dtype)
    count_words, _ = flat_words(op, counters, arg="counters")
    n, dim = int(words.lo.shape[0]), storage.embedding_dim
    flags = jnp.asarray(check_numeric(op, "filter_flags", filter_flags, FLAGS, integer=True)
                        ).reshape(-1)
    rows = jnp.asarray(check_numeric(op, "values", values, ROWS), jnp.float32)
    for arg, got in (("counters", int(count_words.lo.shape[0])), ("filter_flags", flags.size),
                     ("values", rows.size // max(dim, 1))):
        if got != n:
            raise OpArgumentError(op, arg, f"{n} entries (one per key)", f"{got}")
    if rows.size != n * dim:
        raise OpArgumentError(op, "values", f"[{n}, {dim}] float32 rows",
                              f"shape {tuple(rows.shape)}")
    batch = (words, (count_words, flags, rows.reshape(n, dim)))

    def insert(table):
        def attempt(capacity):
            new, slots, (inserted, unplaced, over), route = place.call(
                _import_on_shard, None, place.storage(table), batch, capacity=capacity)
            return (place.rebuild(table, new, route.lost),
                    ImportInfo(slots, inserted, unplaced, over), route)

        return run_routed(op, place, attempt, lambda r: r[2], n, route_capacity, overflow,
                          table)[:2]

    return under_load_policy(op, table, words, insert)


def _import_on_shard(router, statics, table, batch, active, replicated):
    words, payload = batch
    ex = router.keys(words, active, payload)
    received, (counters, flags, values) = ex.received
    new, info = import_entries(table, received, counters, flags, values, ex.active)
    totals = (router.total(info.inserted), router.total(info.unplaced),
              router.most(info.over_limit.astype(jnp.int32)) > 0)
    return new, router.back(ex, router.global_slots(info.slots), -1), totals


@IMPORT_OP.kernel("xla")
def _import_kernel(table: HashTable, words: Words64, counters: Words64, filter_flags, values):
    flat = lambda w: Words64(w.lo.reshape(-1), w.hi.reshape(-1))  # noqa: E731
    return import_entries(table, flat(words), flat(counters), filter_flags, values, None)


@functools.partial(jax.jit, inline=True)
def import_entries(table: HashTable, words: Words64, counters: Words64, filter_flags, values,
                   active=None) -> tuple[HashTable, ImportInfo]:
    """One shard's ``import_`` (``active``: False on padding lanes)."""
    size = table.bucket_size
    batch = key_batch(IMPORT_OP.name, words, size)
    # active: False on padding lanes (a sharded table's routing buffers)
    everyone = jnp.ones(words.lo.shape[0], bool) if active is None else active
    first = group_first(batch.words, everyone)
    place = find_or_place(table, batch, everyone, first)
    slot, old = place.slot, place.old_flags
    lead, last = is_first(first, slot >= 0), is_last(first, slot >= 0)
    revived = (old & EVICTED) != 0
    absent = (old & VALID) == 0
    inserted = jnp.sum(lead & (absent | revived), dtype=jnp.int32)
    first_export = jnp.sum(lead & ~absent & ~revived & ((old & EXPORT) == 0), dtype=jnp.int32)
    unplaced = jnp.sum(everyone & (slot < 0), dtype=jnp.int32)
    flags = jnp.where(filter_flags != 0, jnp.uint8(VALID | EXPORT | FILTER),
                      jnp.uint8(VALID | EXPORT))
    table = table.replace(
        key_lo=set_rows(place.key_lo, slot, batch.words.lo, last),
        key_hi=set_rows(table.key_hi, slot, batch.words.hi, last),
        counter_lo=set_rows(table.counter_lo, slot, counters.lo, last),
        counter_hi=set_rows(table.counter_hi, slot, counters.hi, last),
        flags=set_rows(place.flags, slot, flags, last),
        values=set_rows(table.values, slot, values, last),
        last_access=set_rows(table.last_access, slot, jnp.broadcast_to(table.clock, slot.shape),
                             last),
        epoch=advance_epochs(table.epoch, slot, lead & (absent | revived)),
        live=table.live + inserted, not_exported=table.not_exported - first_export,
        dropped=add_to_words(as_counter(table.dropped), unplaced))
    return table, ImportInfo(slot, inserted, unplaced, table.live > table.max_live)
