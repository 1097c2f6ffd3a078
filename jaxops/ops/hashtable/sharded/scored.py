"""Scored eviction on a sharded table: ``evict_lowest`` and ``evict_if``.

``evict_if`` runs the predicate on every shard's slots: an entry's scores (counter,
``last_access``, and its age against the clock, which every shard keeps in step) do not
depend on where it lives, so it evicts the same entries as on one table.

``evict_lowest`` selects the ``n`` lowest scores over **all** shards (the bisection's
counts are summed over the mesh axis), in the order of one table: by score, ties to the
lower slot, here the lower **global** slot (``shard * shard_size + slot``). With distinct
scores it evicts the same entries as one table fed the same batches; among equal scores
(keys touched in one batch with equal counters) it may pick others, since the slots
differ between the layouts. :func:`evict_lowest_per_shard` evicts a count per shard (the
``"evict"`` load policy, whose limit is per shard).

>>> import numpy as np, jax, jaxops.hashtable as ht
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> t = ht.init_sharded_table(16, 1, mesh, "d", initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([1, 2, 3, 1], np.int64))   # step 1
>>> t, _, _ = ht.lookup_or_insert(t, np.array([2], np.int64))            # step 2
>>> ht.find(ht.evict_lowest(t, 1, by="lfu"), np.array([1, 2, 3], np.int64))[1].tolist()
[True, True, False]
>>> int(ht.evict_if(t, ht.not_seen_for(1)).live)
1
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable import scored as one
from jaxops.ops.hashtable.sharded.call import global_replicated
from jaxops.ops.hashtable.sharded.table import (ShardedHashTable, check_sharded, expand,
                                                refuse_donate, squeeze)

__all__ = ["evict_if", "evict_lowest", "evict_lowest_per_shard"]


def evict_lowest(table: ShardedHashTable, n: Any = None, *, fraction: float | None = None,
                 by: str = "lru", keep: Any = None, const_val: float = 0.0,
                 donate: bool = False) -> ShardedHashTable:
    """:func:`~jaxops.ops.hashtable.scored.evict_lowest` over all shards (see the module
    docstring for ties); ``keep`` holds global slots (e.g. ``info.slots``)."""
    op = "evict_lowest"
    table = check_sharded(op, table)
    refuse_donate(op, donate)
    n, keep = one.eviction_count(table.live, n, fraction, by, keep)
    return _run(table, n, keep, by, const_val, across=True)


def evict_lowest_per_shard(table: ShardedHashTable, counts: np.ndarray, keep: Any, by: str
                           ) -> ShardedHashTable:
    """Evicts ``counts[i]`` entries of lowest score in shard ``i``, sparing the global slots
    ``keep``."""
    counts = np.asarray(counts, np.int32)
    counts = jax.make_array_from_callback(counts.shape, table.sharding, lambda i: counts[i])
    return _run(table, counts, np.asarray(keep, np.int32).reshape(-1), by, 0.0, across=False)


def _run(table, n, keep, by, const_val, across: bool) -> ShardedHashTable:
    fn = _lowest_evictor(table.mesh, table.axis, by, float(const_val), across)
    n, keep = global_replicated(table.mesh, (n, keep)) if across else \
        (n, global_replicated(table.mesh, keep))
    return table.replace(shards=fn(table.shards, n, keep))


@functools.lru_cache(maxsize=32)
def _lowest_evictor(mesh, axis: str, by: str, const_val: float, across: bool):
    shards = int(mesh.shape[axis])

    def local(tables, n, keep):
        t = squeeze(tables)
        me = jax.lax.axis_index(axis)
        base = me.astype(jnp.int32) * np.int32(t.bucket_size)
        mine = (keep >= base) & (keep < base + t.bucket_size)
        local_keep = jnp.where(mine, keep - base, -1)
        if not across:  # n: this shard's count
            return expand(one._evict_lowest_fn(t, n[0], local_keep, by=by, const_val=const_val))

        def before(count):
            every = jax.lax.all_gather(count, axis)
            return jnp.sum(jnp.where(jnp.arange(shards) < me, every, 0))

        return expand(one._evict_lowest_fn(t, n, local_keep, by=by, const_val=const_val,
                                           total=lambda c: jax.lax.psum(c, axis), before=before))

    n_spec = P() if across else P(axis)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(axis), n_spec, P()),
                                 out_specs=P(axis)))


def evict_if(table: ShardedHashTable, predicate: Callable, *, const_val: float = 0.0,
             donate: bool = False) -> ShardedHashTable:
    """:func:`~jaxops.ops.hashtable.scored.evict_if` on every shard (the predicate sees one
    shard's ``[shard_size]`` slots)."""
    op = "evict_if"
    table = check_sharded(op, table)
    refuse_donate(op, donate)
    if not callable(predicate):
        raise OpArgumentError(op, "predicate", "a function SlotScores -> bool[bucket_size]",
                              type(predicate).__name__)
    fn = _if_evictor(table.mesh, table.axis, predicate, float(const_val))
    return table.replace(shards=fn(table.shards))


@functools.lru_cache(maxsize=32)
def _if_evictor(mesh, axis: str, predicate: Callable, const_val: float):
    def local(tables):
        return expand(one._evict_if_fn(squeeze(tables), predicate=predicate,
                                       const_val=const_val))

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P(axis), out_specs=P(axis)))
