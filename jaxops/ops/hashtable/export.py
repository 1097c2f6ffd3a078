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

__all__ = ["export", "export_mask"]


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
           filtered_export_flag: bool = False, size: int | None = None):
    """Exports entries in ascending slot order and marks them exported.

    Args:
        tables: a table, or a sequence of tables (one launch, as CANN's table list).
        export_mode: ``"all"`` (every live entry) or ``"new"`` (never exported before).
        filtered_export_flag: export only admitted entries (FILTER set, by counter
            filtering or import). CANN reads this flag but ignores it; this is our meaning.
        size: capacity of each table's outputs (static), as ``jnp.nonzero(size=)``: the
            outputs are allocated at ``size`` entries instead of ``bucket_size`` (not in
            CANN). When more entries qualify, the first ``size`` in slot order are exported
            and only those are marked; the outputs' ``true_shape`` holds the full count, so
            ``.overflowed()`` / ``.lost()`` report the cut, and the rest are exported by the
            next ``export_mode="new"`` call. For tables too big to export at once, see
            :func:`~jaxops.ops.hashtable.export_chunks.export_chunks`.

    Returns:
        ``(tables, keys, counters, filter_flags, values)``; for a single table each is one
        item, for a sequence each is a list. Every output is a :class:`DynArray` with max
        shape ``[size]`` (values ``[size, dim]``; ``size`` defaults to ``bucket_size``) and
        actual size the number exported: keys in the table's ``key_dtype`` (int64 or
        uint64) and counters uint64 with x64 on; with x64 off both are uint32 ``[size, 2]``
        word pairs (:func:`~jaxops.ops.hashtable.table.host_keys` and
        :func:`~jaxops.ops.hashtable.table.to_host_int64` join them);
        filter_flags uint8 (1 where FILTER is set); values float32. The returned tables have
        EXPORT set on the exported entries and the not-exported count lowered by the newly
        exported.
    """
    single = isinstance(tables, HashTable)
    if not single and not isinstance(tables, (list, tuple)):
        raise OpArgumentError(EXPORT_OP.name, "tables", "a HashTable or a list of HashTables",
                              type(tables).__name__)
    tables = [tables] if single else list(tables)
    if not tables:
        raise OpArgumentError(EXPORT_OP.name, "tables", "at least one HashTable", "none")
    tables = [check_table(EXPORT_OP.name, t, "tables") for t in tables]
    outs = EXPORT_OP(tables, export_mode=export_mode, filtered_export_flag=filtered_export_flag,
                     size=size)
    n = len(tables)
    groups = [list(outs[k * n:(k + 1) * n]) for k in range(4)]
    marked = [mark_exported(t, export_mode, filtered_export_flag, _capacity(t, size))
              for t in tables]
    if single:
        return (marked[0], *(g[0] for g in groups))
    return (marked, *groups)


def _capacity(table: HashTable, size: int | None) -> int:
    return table.bucket_size if size is None else int(size)


@EXPORT_OP.kernel("xla")
def _export_kernel(tables, *, export_mode, filtered_export_flag, size):
    per_table = [_export_one(t, export_mode, filtered_export_flag, _capacity(t, size))
                 for t in tables]
    return tuple(out for kind in range(4) for out in (p[kind] for p in per_table))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _export_one(table: HashTable, export_mode: str, filtered_export_flag: bool, size: int):
    idx, count = compact_indices(export_mask(table.flags, export_mode, filtered_export_flag), size)
    pick = jnp.maximum(idx, 0)
    inside = idx >= 0
    signed = table.key_dtype == "int64"
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
    values = jnp.where(inside[:, None], take(table.values, pick), 0.0)
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
