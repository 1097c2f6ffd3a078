"""One shard's export: which slots it emits (:func:`export_mask`), its outputs as DynArrays
(:func:`export_shard`, the EmbeddingHashTableExport OpDef's xla kernel), the marking of what
it exported, and the shard functions of ``export`` and ``export_chunks``.

>>> import jax.numpy as jnp
>>> from jaxops.hashtable._table.table import EXPORT, VALID
>>> export_mask(jnp.array([0, VALID, VALID | EXPORT], jnp.uint8), "new", False).tolist()
[False, True, False]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.dynarray import DynArray
from jaxops.hashtable._kernels.opdefs import EXPORT_OP
from jaxops.hashtable._table.row_dtype import widened
from jaxops.hashtable._table.table import EVICTED, EXPORT, FILTER, VALID, HashTable
from jaxops.hashtable._table.words64 import Words64, join_words
from jaxops.hashtable._walks.probe import take
from jaxops.ops.compaction import compact_indices

__all__ = ["export_mask", "export_on_shard", "export_shard", "mark_exported", "mark_on_shard"]


def export_mask(flags: jax.Array, export_mode: str, filtered_export_flag: bool) -> jax.Array:
    """Slots an export emits: VALID, not EVICTED; for ``"new"`` not yet EXPORT; with
    ``filtered_export_flag`` only admitted (FILTER) entries."""
    mask = ((flags & VALID) != 0) & ((flags & EVICTED) == 0)
    if export_mode == "new":
        mask = mask & ((flags & EXPORT) == 0)
    if filtered_export_flag:
        mask = mask & ((flags & FILTER) != 0)
    return mask


def export_on_shard(router, statics, table, replicated):
    """``export`` on one shard (a ``Placement.map`` function): the shard marked, and its
    outputs' data, its count and the total count over the shards."""
    export_mode, filtered, cap = statics
    outs = export_shard(table, export_mode, filtered, cap)
    return mark_exported(table, export_mode, filtered, cap), (
        tuple(d.data for d in outs), outs[2].actual_shape[0], router.total(outs[2].true_shape[0]))


@EXPORT_OP.kernel("xla")
def _export_kernel(tables, *, export_mode, filtered_export_flag, size):
    per_table = [export_shard(t, export_mode, filtered_export_flag,
                              t.bucket_size if size is None else int(size)) for t in tables]
    return tuple(out for kind in range(4) for out in (p[kind] for p in per_table))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def export_shard(table: HashTable, export_mode: str, filtered_export_flag: bool, size: int):
    """One shard's (or one table's) export outputs as four DynArrays of capacity ``size``."""
    idx, count = compact_indices(export_mask(table.flags, export_mode, filtered_export_flag), size)
    pick = jnp.maximum(idx, 0)
    inside = idx >= 0
    signed = table.key_dtype in ("int64", "int32")  # 32-bit keys export as 64-bit values
    keys = join_words(Words64(take(table.key_lo, pick), take(table.key_hi, pick)), signed)
    counters = join_words(Words64(take(table.counter_lo, pick), take(table.counter_hi, pick)),
                          signed=False)
    wide = keys.ndim == 2  # x64 off: uint32 word pairs
    key_fill = np.uint32(0xFFFFFFFF) if wide else -1 if signed else 2**64 - 1  # bits of -1
    grow = (lambda m: m[:, None]) if wide else (lambda m: m)
    keys = jnp.where(grow(inside), keys, jnp.asarray(key_fill, keys.dtype))
    counters = jnp.where(grow(inside), counters, jnp.zeros((), counters.dtype))
    admitted = ((take(table.flags, pick) & FILTER) != 0).astype(jnp.uint8)
    filter_flags = jnp.where(inside, admitted, jnp.uint8(0))
    values = jnp.where(inside[:, None], widened(take(table.values, pick)), 0.0)  # float32
    kept = jnp.minimum(count, size)
    rows, true_rows = jnp.stack([kept]), jnp.stack([count])
    words, true_words = (jnp.stack([kept, jnp.int32(2)]), jnp.stack([count, jnp.int32(2)])) \
        if wide else (rows, true_rows)
    dim = jnp.int32(table.embedding_dim)
    return (DynArray(keys, words, true_shape=true_words, fill_value=int(key_fill)),
            DynArray(counters, words, true_shape=true_words, fill_value=0),
            DynArray(filter_flags, rows, true_shape=true_rows, fill_value=0),
            DynArray(values, jnp.stack([kept, dim]), true_shape=jnp.stack([count, dim]),
                     fill_value=0.0))


def mark_exported(table: HashTable, export_mode: str, filtered_export_flag: bool,
                  size: int) -> HashTable:
    """The table with the first ``size`` exported entries marked. Only the flags and the
    count pass through jit, so the rows are shared, never copied."""
    flags, not_exported = _marked_flags(table.flags, table.not_exported, export_mode,
                                        filtered_export_flag, size)
    return table.replace(flags=flags, not_exported=not_exported)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _marked_flags(flags, not_exported, export_mode, filtered_export_flag, size):
    mask = export_mask(flags, export_mode, filtered_export_flag)
    if size < flags.shape[0]:  # only the exported ones: the first `size` in slot order
        idx, _ = compact_indices(mask, size, fill_value=flags.shape[0])
        mask = jnp.zeros_like(mask).at[idx].set(True, mode="drop")
    first_time = mask & ((flags & EXPORT) == 0)
    return (jnp.where(mask, flags | jnp.uint8(EXPORT), flags),
            not_exported - jnp.sum(first_time, dtype=not_exported.dtype))


def mark_on_shard(router, statics, table, replicated):
    """``export_chunks``' marking on one shard (a ``Placement.map`` function)."""
    export_mode, filtered = statics
    return mark_exported(table, export_mode, filtered, table.bucket_size), ()
