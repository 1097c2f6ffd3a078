"""The load policy of a sharded table: per shard, eagerly, before the insert.

Each shard has the limit of one table of its size (``max_live = max_load_factor *
shard_size``). As on one table (:mod:`~jaxops.ops.hashtable.load`), an eager insert whose
keys could pass it (some shard's ``live`` plus the call's keys it owns above ``max_live``)
first counts its new keys per owner shard (one routed O(batch) probe, at the full routing
capacity: keys a smaller ``route_capacity`` will not serve are counted too, so the count
errs high), and for every shard that would pass its limit the policy acts before anything
is inserted:

- ``"error"``: raises (the table is unchanged), naming the shard.
- ``"grow"``: every shard doubles (until each fits), as :func:`~.io.resize`; keys keep
  their owners, so entries and rows are those of the unsharded table.
- ``"evict"`` / ``"evict_lfu"``: each shard over its limit evicts its own
  ``live + new - max_live`` lowest-scored entries that the call does not touch.

What differs from one unsharded table of the same total size: the limit is per shard, so
the policy acts when the **fullest shard** passes it (with a skewed key set earlier than
one table would), and ``"evict"`` picks the lowest scores of that shard, not of the whole
table. Between policy actions a sharded table stays exact (the issue's contract); a grow
keeps it exact; evictions make the two tables differ by design. Inside ``jit`` the call
runs as it is and ``info.over_limit`` reports a shard past its limit.

>>> import numpy as np, jax, jaxops.hashtable as ht
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> t = ht.init_sharded_table(8, 1, mesh, "d", initializer_mode="constant")
>>> t = ht.set_load_policy(t, policy="grow")
>>> t, _, _ = ht.lookup_or_insert(t, np.arange(10, dtype=np.int64))
>>> t.bucket_size, int(t.live), np.asarray(t.shards.clock).tolist()
(16, 10, [1])
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.load import count_new_keys
from jaxops.ops.hashtable.sharded import call
from jaxops.ops.hashtable.sharded.table import ShardedHashTable, owner_shard, to_host

__all__ = ["insert_under_policy"]

#: ``skip(statics, words) -> (words, skip)``: the keys an insert works on and those it
#: skips (``lookup_or_insert``'s ``filter_key``), or None for all of them.
Skip = Callable[[Any, Any], tuple[Any, jax.Array]]


@functools.partial(jax.jit, static_argnums=2)
def _owner_counts(lo: jax.Array, hi: jax.Array, shards: int) -> jax.Array:
    """Keys per owner shard (int32 ``[shards]``)."""
    return jnp.zeros(shards, jnp.int32).at[owner_shard(lo, hi, shards)].add(1)


def insert_under_policy(op: str, table: ShardedHashTable, words, skip: tuple | None,
                        run: Callable[[ShardedHashTable], Any]) -> Any:
    """``run(table)``, an insert of ``words`` (flat Words64), after the table's load
    policy (see the module docstring). ``skip``: ``(function, statics)`` giving the keys
    the call really inserts (lookup_or_insert's ``filter_key``), or None."""
    shards = table.shards
    n = int(words.lo.shape[0])
    if isinstance(shards.live, jax.core.Tracer):
        return run(table)
    live = to_host(table, shards.live)
    if int(live.max()) + n <= shards.max_live or np.all(
            live + np.asarray(_owner_counts(words.lo, words.hi, table.num_shards))
            <= shards.max_live):  # no shard could pass its limit, even if every key were new
        return run(table)
    new, present = _count(op, table, words, skip)
    needed = live + new
    over = np.minimum(needed, table.shard_size) > shards.max_live
    if over.any():
        table = _act(op, table, live, needed, over, present)
    return run(table)


def _count(op: str, table: ShardedHashTable, words, skip) -> tuple[np.ndarray, np.ndarray]:
    """New keys per shard ([shards]) and the global slot of every key already live (-1)."""
    from jaxops.ops.hashtable.sharded.lookup import where_of

    n = int(words.lo.shape[0])
    _, present, new = call.run(_count_local, (where_of(table), skip), table, table.shards,
                               words, None, call.check_capacity(op, table, n, None))
    return to_host(table, new), to_host(table, present)


def _count_local(statics, shard, words, active, replicated, capacity):
    from jaxops.ops.hashtable.sharded.lookup import global_slots, route_keys
    from jaxops.ops.hashtable.sharded.route import receive

    where, skip = statics
    ex = route_keys(where, words, active, capacity)
    received, _ = ex.received
    use = ex.active
    if skip is not None:
        received, skipped = skip[0](skip[1], received)
        use = use & ~skipped
    new, present = count_new_keys(shard, received, use)
    me = jax.lax.axis_index(where.axis)
    every = jax.lax.psum(jnp.zeros(where.shards, jnp.int32).at[me].set(new), where.axis)
    return None, receive(global_slots(where, present), ex, -1), every


def _act(op: str, table: ShardedHashTable, live, needed, over, present) -> ShardedHashTable:
    shards = table.shards
    policy = shards.load_policy
    if policy == "grow":
        from jaxops.ops.hashtable.sharded.io import resize

        size = 2 * table.shard_size
        while int(shards.max_load_factor * size) < int(needed.max()):
            size *= 2
        return resize(table, size * table.num_shards)
    if policy in ("evict", "evict_lfu"):
        from jaxops.ops.hashtable.sharded.scored import evict_lowest_per_shard

        touched = np.unique(present[present >= 0]) // table.shard_size
        spare = np.bincount(touched, minlength=table.num_shards)
        counts = np.where(over, needed - shards.max_live, 0)
        if not np.any(counts > live - spare):
            return evict_lowest_per_shard(table, counts, present,
                                          "lru" if policy == "evict" else "lfu")
        over = counts > live - spare  # shards the policy cannot make room in
    s = int(np.flatnonzero(over)[0])
    raise OpArgumentError(op, "table", f"at most {shards.max_live} live keys per shard "
                          f"(max_load_factor {shards.max_load_factor:g} of "
                          f"{table.shard_size} slots)", f"{int(needed[s])} in shard {s} "
                          "after this call", "Grow the table with resize(), reclaim "
                          "tombstones with compact(), or set_load_policy(table, "
                          "policy='grow' or 'evict').")
