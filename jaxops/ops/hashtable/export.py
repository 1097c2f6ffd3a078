"""``export``: the live entries of one or several tables (CANN EmbeddingHashTableExport).

>>> import numpy as np, jaxops, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([5, 6], np.int64))
>>> t, keys, counters, flags, values = ht.export(t, export_mode="new")
>>> sorted(ht.to_host_int64(jaxops.refresh(keys)).tolist()), int(t.not_exported)
([5, 6], 0)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError
from jaxops.ops.compaction import compact_indices
from jaxops.ops.hashtable.opdefs import EXPORT as EXPORT_OP
from jaxops.ops.hashtable.probe import take
from jaxops.ops.hashtable.table import (EVICTED, EXPORT, FILTER, VALID, HashTable, Words64,
                                        check_table, join_words)


def export_mask(flags: jax.Array, export_mode: str, filtered_export_flag: bool) -> jax.Array:
    """Slots an export emits: VALID, not EVICTED; for ``"new"`` not yet EXPORT; with
    ``filtered_export_flag`` only admitted (FILTER) entries."""
    mask = ((flags & VALID) != 0) & ((flags & EVICTED) == 0)
    if export_mode == "new":
        mask = mask & ((flags & EXPORT) == 0)
    if filtered_export_flag:
        mask = mask & ((flags & FILTER) != 0)
    return mask


def export(tables: HashTable | Sequence[HashTable], *, export_mode: str = "all",
           filtered_export_flag: bool = False):
    """Exports entries in ascending slot order and marks them exported.

    Args:
        tables: a table, or a sequence of tables (one launch, as CANN's table list).
        export_mode: ``"all"`` (every live entry) or ``"new"`` (never exported before).
        filtered_export_flag: export only admitted entries (FILTER set, by counter
            filtering or import). CANN reads this flag but ignores it; this is our meaning.

    Returns:
        ``(tables, keys, counters, filter_flags, values)``; for a single table each is one
        item, for a sequence each is a list. Every output is a :class:`DynArray` with max
        shape ``[bucket_size]`` (values ``[bucket_size, dim]``) and actual size the number
        exported: keys int64 and counters uint64 with x64 on; with x64 off both are uint32
        ``[bucket_size, 2]`` word pairs (:func:`to_host_int64` joins them); filter_flags
        uint8 (1 where FILTER is set); values float32. The returned tables have EXPORT set
        on the exported entries and the not-exported count lowered by the newly exported.
    """
    single = isinstance(tables, HashTable)
    tables = [tables] if single else list(tables)
    if not tables:
        raise OpArgumentError(EXPORT_OP.name, "tables", "at least one HashTable", "none")
    tables = [check_table(EXPORT_OP.name, t, "tables") for t in tables]
    outs = EXPORT_OP(tables, export_mode=export_mode, filtered_export_flag=filtered_export_flag)
    n = len(tables)
    groups = [list(outs[k * n:(k + 1) * n]) for k in range(4)]
    marked = [_mark_exported(t, export_mode, filtered_export_flag) for t in tables]
    if single:
        return (marked[0], *(g[0] for g in groups))
    return (marked, *groups)


@EXPORT_OP.kernel("xla")
def _export_kernel(tables, *, export_mode, filtered_export_flag):
    per_table = [_export_one(t, export_mode, filtered_export_flag) for t in tables]
    return tuple(out for kind in range(4) for out in (p[kind] for p in per_table))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _export_one(table: HashTable, export_mode: str, filtered_export_flag: bool):
    size = table.bucket_size
    idx, count = compact_indices(export_mask(table.flags, export_mode, filtered_export_flag), size)
    pick = jnp.maximum(idx, 0)
    inside = idx >= 0
    keys = join_words(Words64(take(table.key_lo, pick), take(table.key_hi, pick)))
    counters = join_words(Words64(take(table.counter_lo, pick), take(table.counter_hi, pick)),
                          signed=False)
    wide = keys.ndim == 2  # x64 off: uint32 word pairs
    key_fill = np.uint32(0xFFFFFFFF) if wide else -1
    grow = (lambda m: m[:, None]) if wide else (lambda m: m)
    keys = jnp.where(grow(inside), keys, jnp.asarray(key_fill, keys.dtype))
    counters = jnp.where(grow(inside), counters, jnp.zeros((), counters.dtype))
    admitted = ((take(table.flags, pick) & FILTER) != 0).astype(jnp.uint8)
    filter_flags = jnp.where(inside, admitted, jnp.uint8(0))
    values = jnp.where(inside[:, None], take(table.values, pick), 0.0)
    rows = jnp.stack([count])
    words = jnp.stack([count, jnp.int32(2)]) if wide else rows
    return (DynArray(keys, words, fill_value=int(key_fill)),
            DynArray(counters, words, fill_value=0),
            DynArray(filter_flags, rows, fill_value=0),
            DynArray(values, jnp.stack([count, jnp.int32(table.embedding_dim)]), fill_value=0.0))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _mark_exported(table: HashTable, export_mode: str, filtered_export_flag: bool) -> HashTable:
    mask = export_mask(table.flags, export_mode, filtered_export_flag)
    first_time = mask & ((table.flags & EXPORT) == 0)
    return table.replace(flags=jnp.where(mask, table.flags | jnp.uint8(EXPORT), table.flags),
                         not_exported=table.not_exported - jnp.sum(first_time, dtype=jnp.int32))
