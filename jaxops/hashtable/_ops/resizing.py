"""``resize`` and ``compact``: the same live entries in a rebuilt table, on any placement
(on a mesh every shard is rebuilt where it lives; each key stays on its shard).

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(4, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([1, 2, 3], np.int64))
>>> big = ht.resize(t, 64)
>>> big.bucket_size, int(big.live), ht.find(big, np.array([1, 2, 3], np.int64))[1].tolist()
(64, 3, [True, True, True])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._kernels.rehash_kernel import rehash_on_shard
from jaxops.hashtable._ops.create import init_table, initializer_rows
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._table.table import check_bucket_size

__all__ = ["compact", "resize"]


def resize(table: Any, new_bucket_size: int, *, initializer_mode: str | None = None,
           constant_value: float = 0.0, sampled_values: jax.Array | None = None,
           key: jax.Array | None = None, states: Sequence[tuple[Any, Callable]] = ()) -> Any:
    """Rehashes every live entry into a table of ``new_bucket_size`` slots.

    Keys, counters, flags (export state included), rows, ``last_access`` (and the table's
    ``clock``) and the live / not-exported counts are kept; entries are reinserted in ascending
    old-slot order (at the same size, :func:`compact`, from the slot after the first one that
    the fewest live keys pass on their way from home, wrapping: every key then lands at its old
    slot or before it, within its window, so none is lost). Tombstones are dropped (beyond
    CANN, which has no resize: they only kept evicted keys' slots, and their keys are gone
    either way), so a table may shrink to its live keys. The
    new table's free slots get rows as in :func:`init_table` (the initializer arguments are passed
    on); the load limit and policy and the rows' dtype are kept. On a mesh ``new_bucket_size``
    is the slots in all (each shard gets ``ceil(new_bucket_size / num_shards)``) and shard
    ``i``'s free rows are drawn with ``fold_in(key, i)``.

    ``states``: optimizer states beside the table, each as ``(state, init)`` with ``init``
    the function that makes that state for a table (``opt.init``, ``adam_w_init``). They are
    rebuilt with the table: each key's state rows move with its row (a slot whose state
    belonged to another key starts from ``init``'s rows), every other slot holds ``init``'s
    rows, and counts and scalars are kept. Then ``(table, [state, ...])`` is returned.

    Raises:
        OpArgumentError: when the live entries do not fit a shard (checked when the table
            is concrete; inside ``jit`` the entries that find no slot are counted in
            ``table.dropped``).
    """
    op = "resize"
    placement = placement_of(op, table)
    storage = placement.storage(table)
    new_bucket_size = check_bucket_size(op, new_bucket_size, "new_bucket_size")
    per = -(-new_bucket_size // placement.num_shards)
    if not isinstance(storage.live, jax.core.Tracer):
        most = int(np.max(placement.per_shard(storage.live)))
        if most > per:
            where = " per shard (the live keys of the fullest shard)" if placement.routes else \
                " (the live keys)"
            raise OpArgumentError(op, "new_bucket_size", f"at least {most}{where}",
                                  f"{new_bucket_size}" + (f" ({per} per shard)"
                                                          if placement.routes else ""))
    slots = per * placement.num_shards
    rows = initializer_rows(storage.initializer, slots, storage.embedding_dim) \
        if initializer_mode is None else dict(initializer_mode=initializer_mode,
                                              constant_value=constant_value,
                                              sampled_values=sampled_values, key=key)
    fresh = placement.storage(init_table(slots, storage.embedding_dim, placement=placement,
                                         dtype=storage.values.dtype, **rows))
    fresh = fresh.replace(max_load_factor=storage.max_load_factor,
                          load_policy=storage.load_policy, key_dtype=storage.key_dtype,
                          initializer=storage.initializer)
    if not states:
        new, _ = placement.map(rehash_on_shard, None, (storage, fresh))
        return placement.with_storage(table, new)
    grown = placement.with_storage(None, fresh)
    fresh_states = tuple(init(grown) for _, init in states)
    old_states = tuple(state for state, _ in states)
    new, moved = placement.map(rehash_on_shard, None, (storage, fresh, old_states, fresh_states))
    return placement.with_storage(table, new), list(moved)


def compact(table: Any, **init) -> Any:
    """The table rebuilt at its size without tombstones (every live entry's key, counter,
    flags and row kept): probe chains shorten and the slots are free again.

    Costs a second table while it runs (a rehash); ``init`` are :func:`resize`'s
    initializer arguments for the freed slots' rows. Beyond CANN. Keys may move: an
    optimizer state kept from before starts a moved key from the initial state at its next
    update (it never takes the state left in its new slot; see
    :mod:`~jaxops.hashtable._walks.slot_owner`).

    >>> import numpy as np, jaxops.hashtable as ht
    >>> t = ht.init_table(8, 1, initializer_mode="constant")
    >>> t, _, _ = ht.lookup_or_insert(t, np.arange(6, dtype=np.int64))
    >>> t = ht.compact(ht.evict(t, np.arange(4, dtype=np.int64)))
    >>> int(t.live), int((np.asarray(t.flags) != 0).sum())
    (2, 2)
    """
    placement_of("compact", table)
    return resize(table, table.bucket_size, **init)
