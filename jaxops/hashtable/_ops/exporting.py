"""``export`` and ``export_chunks``: the live entries of tables on any placement (CANN
EmbeddingHashTableExport).

Each shard exports its entries in ascending slot order and marks them exported; a table on
a mesh joins its shards' outputs, shard 0's entries first. ``export_chunks`` brings them to
the host chunk by chunk instead, for tables bigger than what fits twice.

>>> import numpy as np, jaxops, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([5, 6], np.int64))
>>> t, keys, counters, flags, values = ht.export(t, export_mode="new")
>>> sorted(ht.host_keys(t, jaxops.refresh(keys)).tolist()), int(t.not_exported)
([5, 6], 0)
>>> t, chunks = ht.export_chunks(t, chunk_slots=4)
>>> sorted(k for c in chunks for k in c.keys.tolist())
[5, 6]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._kernels.export_kernel import export_mask, export_on_shard, mark_on_shard
from jaxops.hashtable._kernels.opdefs import EXPORT_OP
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._table.checks import check_int
from jaxops.hashtable._table.host_chunks import chunk_slots_for, iter_host_chunks
from jaxops.hashtable._table.table import FILTER
from jaxops.ops.compaction import compact_indices

__all__ = ["ExportChunk", "export", "export_chunks"]


def export(tables: Any, *, export_mode: str = "all", filtered_export_flag: bool = False,
           size: int | None = None):
    """Exports entries in ascending slot order and marks them exported.

    Args:
        tables: a table (any placement), or a sequence of tables (one launch, as CANN's
            table list).
        export_mode: ``"all"`` (every live entry) or ``"new"`` (never exported before).
        filtered_export_flag: export only admitted entries (FILTER set, by counter
            filtering or import). CANN reads this flag but ignores it; this is our meaning.
        size: capacity of each table's outputs per shard (static), as
            ``jnp.nonzero(size=)``: the outputs are allocated at ``size`` entries per shard
            instead of ``shard_size`` (not in CANN). When more entries qualify, the first
            ``size`` in slot order are exported and only those are marked; the outputs'
            ``true_shape`` holds the full count, so ``.overflowed()`` / ``.lost()`` report
            the cut, and the rest are exported by the next ``export_mode="new"`` call. For
            tables too big to export at once, see :func:`export_chunks`.

    Returns:
        ``(tables, keys, counters, filter_flags, values)``; for a single table each is one
        item, for a sequence each is a list. Every output is a :class:`DynArray` with max
        shape ``[num_shards * size]`` (values ``[..., dim]``; ``size`` defaults to the
        shard size) and actual size the number exported (shard 0's entries first): keys in
        the table's ``key_dtype`` (int64 or uint64) and counters uint64 with x64 on; with
        x64 off both are uint32 ``[n, 2]`` word pairs
        (:func:`~jaxops.hashtable._table.table.host_keys` and
        :func:`~jaxops.hashtable._table.words64.to_host_int64` join them); filter_flags uint8 (1
        where FILTER is set); values float32 (half rows widened, exactly). The returned
        tables have EXPORT set on the exported entries and the not-exported count lowered by
        the newly exported.
    """
    op = EXPORT_OP.name
    single = not isinstance(tables, (list, tuple))
    tables = [tables] if single else list(tables)
    if not tables:
        raise OpArgumentError(op, "tables", "at least one table", "none")
    placements = [placement_of(op, t, "tables") for t in tables]
    attrs = EXPORT_OP.check_attrs(dict(export_mode=export_mode,
                                       filtered_export_flag=filtered_export_flag, size=size))
    marked, groups = [], [[], [], [], []]
    for table, placement in zip(tables, placements):
        storage = placement.storage(table)
        cap = storage.bucket_size if attrs["size"] is None else attrs["size"]
        statics = (attrs["export_mode"], attrs["filtered_export_flag"], cap)
        new, outs = placement.map(export_on_shard, statics, storage)
        marked.append(placement.with_storage(table, new))
        for group, out in zip(groups, _joined(outs, placement.num_shards, placement.routes)):
            group.append(out)
    if single:
        return (marked[0], *(g[0] for g in groups))
    return (marked, *groups)


def _joined(outs: tuple, shards: int, stacked: bool) -> list[DynArray]:
    """The shards' export outputs as one DynArray each: shard 0's entries first."""
    return _join(*outs) if stacked else _join(*jax.tree.map(lambda x: x[None], outs))


@jax.jit
def _join(data: tuple, kept: jax.Array, count: jax.Array) -> list[DynArray]:
    shards, cap = data[0].shape[:2]
    count = count.reshape(-1)[0]  # the same total on every shard
    if shards == 1:  # nothing to join
        idx, total = jnp.arange(cap, dtype=jnp.int32), kept[0]
        idx = jnp.where(idx < total, idx, -1)
    else:
        mask = (jnp.arange(cap)[None, :] < kept[:, None]).reshape(-1)
        idx, total = compact_indices(mask, shards * cap)
    pick = jnp.maximum(idx, 0)
    outs = []
    for d, fill in zip(data, (-1, 0, 0, 0)):
        flat = d.reshape(shards * cap, *d.shape[2:])
        fill = np.uint32(0xFFFFFFFF) if (fill == -1 and flat.ndim == 2
                                         and flat.dtype == jnp.uint32) else fill
        if fill == -1 and flat.dtype == jnp.uint64:
            fill = np.uint64(2**64 - 1)  # the bits of the empty key -1
        joined = jnp.where((idx >= 0).reshape(-1, *([1] * (flat.ndim - 1))), flat[pick],
                           jnp.asarray(fill, flat.dtype))
        tail = [jnp.int32(x) for x in flat.shape[1:]]
        outs.append(DynArray(joined, jnp.stack([total, *tail]),
                             true_shape=jnp.stack([count, *tail]),
                             fill_value=int(fill) if flat.dtype != jnp.float32 else 0.0))
    return outs


class ExportChunk(NamedTuple):
    """The entries one chunk of slots exports, as host arrays of the same length ``n``."""

    slots: np.ndarray  #: int64 ``[n]``, where each entry is held (global slots)
    keys: np.ndarray  #: ``[n]``, in the table's ``key_dtype`` (int64 or uint64)
    counters: np.ndarray  #: uint64 ``[n]``
    filter_flags: np.ndarray  #: uint8 ``[n]``, 1 where FILTER is set
    values: np.ndarray  #: float32 ``[n, embedding_dim]``


def export_chunks(table: Any, chunk_slots: int | None = None, *, export_mode: str = "all",
                  filtered_export_flag: bool = False) -> tuple[Any, Iterator[ExportChunk]]:
    """Exports as :func:`export` does, chunk of slots by chunk of slots, onto the host.

    Args:
        table: the table (any placement; with several processes each process streams the
            shards it holds, together the table).
        chunk_slots: slots read per chunk (default: ~16 MiB of table per chunk); the peak
            extra memory is about three chunks, whatever the table's size.
        export_mode, filtered_export_flag: as in :func:`export`.

    Returns:
        ``(table, chunks)``: the table with every exported entry marked (as :func:`export`
        returns it), and an iterator of :class:`ExportChunk` in ascending (global) slot
        order (empty chunks are skipped). The iterator reads the table as it was before the
        marking, so keep it going before donating the returned table elsewhere; rows are
        shared between the two, never copied.
    """
    op = "export_chunks"
    placement = placement_of(op, table)
    storage = placement.storage(table)
    if export_mode not in ("all", "new"):
        raise OpArgumentError(op, "export_mode", "'all' or 'new'", repr(export_mode))
    chunk_slots = chunk_slots_for(storage.embedding_dim) if chunk_slots is None else \
        check_int(op, "chunk_slots", chunk_slots, 1, 2**31 - 1, "an int >= 1")
    filtered = bool(filtered_export_flag)
    marked, _ = placement.map(mark_on_shard, (export_mode, filtered), storage)
    chunks = _chunks(placement.local_shards(storage), chunk_slots, export_mode, filtered)
    return placement.with_storage(table, marked), chunks


def _chunks(shards: dict, chunk_slots: int, export_mode: str, filtered: bool
            ) -> Iterator[ExportChunk]:
    for i, table in shards.items():
        base = i * table.bucket_size
        for start, rows in iter_host_chunks(table, chunk_slots):
            pick = np.flatnonzero(export_mask(rows.flags, export_mode, filtered))
            if not pick.size:
                continue
            keys = _join_host(rows.key_lo[pick], rows.key_hi[pick]).view(
                np.int64 if table.key_dtype in ("int64", "int32") else np.uint64
            ).astype(table.key_dtype)
            yield ExportChunk(pick + start + base, keys,
                              _join_host(rows.counter_lo[pick], rows.counter_hi[pick]),
                              ((rows.flags[pick] & FILTER) != 0).astype(np.uint8),
                              rows.values[pick].astype(np.float32))  # half rows: exact


def _join_host(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (hi.astype(np.uint64) << np.uint64(32)) | lo.astype(np.uint64)
