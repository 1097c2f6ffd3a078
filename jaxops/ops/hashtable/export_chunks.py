"""``export_chunks``: :func:`~jaxops.ops.hashtable.export.export` for tables bigger than
what fits twice: the exported entries come to the host chunk by chunk.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([5, 6, 7], np.int64))
>>> t, chunks = ht.export_chunks(t, chunk_slots=4, export_mode="new")
>>> sorted(k for c in chunks for k in c.keys.tolist()), int(t.not_exported)
([5, 6, 7], 0)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.export import mark_exported, export_mask
from jaxops.ops.hashtable.host_chunks import chunk_slots_for, iter_host_chunks
from jaxops.ops.hashtable.table import FILTER, HashTable, check_table

__all__ = ["ExportChunk", "export_chunks"]


class ExportChunk(NamedTuple):
    """The entries one chunk of slots exports, as host arrays of the same length ``n``."""

    slots: np.ndarray  #: int64 ``[n]``, where each entry is held
    keys: np.ndarray  #: ``[n]``, in the table's ``key_dtype`` (int64 or uint64)
    counters: np.ndarray  #: uint64 ``[n]``
    filter_flags: np.ndarray  #: uint8 ``[n]``, 1 where FILTER is set
    values: np.ndarray  #: float32 ``[n, embedding_dim]``


def export_chunks(table: HashTable, chunk_slots: int | None = None, *,
                  export_mode: str = "all", filtered_export_flag: bool = False
                  ) -> tuple[HashTable, Iterator[ExportChunk]]:
    """Exports as :func:`export` does, chunk of slots by chunk of slots, onto the host.

    Args:
        table: the table.
        chunk_slots: slots read per chunk (default: ~16 MiB of table per chunk); the peak
            extra memory is about three chunks, whatever the table's size.
        export_mode, filtered_export_flag: as in :func:`export`.

    Returns:
        ``(table, chunks)``: the table with every exported entry marked (as :func:`export`
        returns it), and an iterator of :class:`ExportChunk` in ascending slot order (empty
        chunks are skipped). The iterator reads the table as it was before the marking, so
        keep it going before donating the returned table elsewhere; rows are shared
        between the two, never copied.
    """
    table = check_table("export_chunks", table)
    chunk_slots = check_chunk_args(table.embedding_dim, chunk_slots, export_mode)
    filtered = bool(filtered_export_flag)
    marked = mark_exported(table, export_mode, filtered, table.bucket_size)
    return marked, _chunks(table, chunk_slots, export_mode, filtered)


def check_chunk_args(embedding_dim: int, chunk_slots: int | None, export_mode: str) -> int:
    """``export_chunks``' arguments checked; returns the chunk size in slots."""
    op = "export_chunks"
    if export_mode not in ("all", "new"):
        raise OpArgumentError(op, "export_mode", "'all' or 'new'", repr(export_mode))
    if chunk_slots is None:
        chunk_slots = chunk_slots_for(embedding_dim)
    if isinstance(chunk_slots, bool) or not isinstance(chunk_slots, (int, np.integer)) \
            or chunk_slots < 1:
        raise OpArgumentError(op, "chunk_slots", "an int >= 1", repr(chunk_slots))
    return int(chunk_slots)


def _chunks(table: HashTable, chunk_slots: int, export_mode: str, filtered: bool
            ) -> Iterator[ExportChunk]:
    for start, rows in iter_host_chunks(table, chunk_slots):
        pick = np.flatnonzero(export_mask(rows.flags, export_mode, filtered))
        if not pick.size:
            continue
        keys = _join(rows.key_lo[pick], rows.key_hi[pick]).view(table.key_dtype)
        yield ExportChunk(pick + start, keys, _join(rows.counter_lo[pick], rows.counter_hi[pick]),
                          ((rows.flags[pick] & FILTER) != 0).astype(np.uint8), rows.values[pick])


def _join(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (hi.astype(np.uint64) << np.uint64(32)) | lo.astype(np.uint64)
