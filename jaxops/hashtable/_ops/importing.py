"""``import_``: insert or overwrite entries (CANN EmbeddingHashTableImport), on any placement:
every entry goes to the shard that holds its key.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> t, info = ht.import_(t, np.array([4], np.int64), np.array([9], np.uint64),
...                      np.array([1], np.uint8), np.ones((1, 2), np.float32))
>>> int(t.live), int(t.not_exported), int(t.flags[info.slots[0]])
(1, 0, 7)
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._kernels.import_kernel import ImportInfo, import_on_shard
from jaxops.hashtable._kernels.opdefs import IMPORT_OP
from jaxops.hashtable._placement.load_policy import Inserting
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._placement.run import run_batch
from jaxops.hashtable._table.checks import check_numeric
from jaxops.hashtable._table.row_dtype import rounded_count
from jaxops.hashtable._walks.batch import flat_words

__all__ = ["ImportInfo", "import_"]


FLAGS = "an integer array [N] of filter flags (0 or 1 per entry)"
ROWS = "a float array [N, embedding_dim] of rows"


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
    as in :func:`~jaxops.hashtable._ops.inserting.lookup_or_insert`). Each written slot's
    ``last_access`` becomes the table's ``clock`` (not advanced: an import is not a step).

    Args:
        table: the table (any placement).
        keys: int64 keys ``[N]`` in any accepted form.
        counters: uint64 ``[N]`` (numpy uint64, JAX uint64 with x64, uint32, or Words64).
        filter_flags: uint8-like ``[N]``.
        values: float32 ``[N, embedding_dim]``. A table of half rows rounds them to
            nearest and counts the values that changed (``info.rounded``): float32 values
            that the half dtype holds (e.g. ``export``'s of such a table) come back exact.
        route_capacity, overflow: on a mesh, as in ``lookup_or_insert``.

    Returns:
        ``(table, info)`` — unlike CANN, which drops entries silently when the table is
        full, the :class:`ImportInfo` says how many found no slot.
    """
    op = IMPORT_OP.name
    storage = placement_of(op, table).storage(table)
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
    rounded = rounded_count(rows, storage.values.dtype)
    batch = (words, (count_words, flags, rows.reshape(n, dim)))
    ran = run_batch(op, table, import_on_shard, None, batch, inserting=Inserting(words),
                    route_capacity=route_capacity, overflow=overflow)
    inserted, unplaced, over = ran.totals
    return ran.table, ImportInfo(ran.per_key, inserted, unplaced, over, rounded)
