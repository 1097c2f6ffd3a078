"""Writes to a sharded table: ``apply_adam_w``, the row optimizers, ``evict``, ``import_``.

Each routes its keys (or global slots) with their payload (gradients, rows, counters) to the
owner shards and runs the single-table kernel there. Optimizer state lies beside the table,
sharded the same way (every per-slot leaf gets the leading shard axis; global scalars such
as AdamW's beta powers are kept per shard, all equal). Counts of skipped entries are the
single table's, per shard: ``state.skipped`` is a 64-bit count with one entry per shard
(the total: ``int(ht.to_host_int64(state.skipped, signed=False).sum())``).

>>> import numpy as np, jax, jax.numpy as jnp, jaxops.hashtable as ht
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> t = ht.init_sharded_table(16, 2, mesh, "d", initializer_mode="constant", constant_value=1.0)
>>> t, _, info = ht.lookup_or_insert(t, np.array([5], np.int64))
>>> state = ht.adam_w_init(t)
>>> t, state = ht.apply_adam_w(t, state, np.array([5, 6], np.int64), jnp.ones((2, 2)),
...                            lr=0.1, weight_decay=0.0)
>>> round(float(ht.find(t, np.array([5], np.int64))[0][0, 0]), 4)
0.9
>>> int(ht.to_host_int64(state.skipped, signed=False).sum())  # key 6 is absent
1
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.adamw import GRADS, _adam_w_kernel, adam_w_init as _adam_w_init
from jaxops.ops.hashtable.batch import key_batch, live_slots
from jaxops.ops.hashtable.evict import _evict_kernel
from jaxops.ops.hashtable.import_ import FLAGS, ROWS, ImportInfo, _import_kernel
from jaxops.ops.hashtable.opdefs import APPLY_ADAM_W, EVICT, IMPORT
from jaxops.ops.hashtable.optim.rows import (GRADS as ROW_GRADS, SLOTS, _apply, add_skipped,
                                             check_update_args)
from jaxops.ops.hashtable.sharded import call
from jaxops.ops.hashtable.sharded.lookup import (flat_words, global_slots, route_keys,
                                                 route_slots, total, where_of)
from jaxops.ops.hashtable.sharded.policy import insert_under_policy
from jaxops.ops.hashtable.sharded.route import RouteInfo, receive
from jaxops.ops.hashtable.sharded.table import ShardedHashTable, check_sharded, expand, squeeze
from jaxops.ops.hashtable.table import Words64, as_words, check_numeric

__all__ = ["adam_w_init", "apply_adam_w", "evict", "import_", "per_shard_state",
           "row_optimizer_update"]


def per_shard_state(table: ShardedHashTable, init: Callable, *args) -> Any:
    """``init(local_table, *args)`` run on every shard: a pytree whose leaves have the
    leading shard axis, laid out like the table (built on the devices, never gathered)."""
    return _state_builder(init, args, table.mesh, table.axis)(table.shards)


@functools.lru_cache(maxsize=64)
def _state_builder(init, args, mesh, axis):
    spec = P(axis)
    return jax.jit(jax.shard_map(lambda shards: expand(init(squeeze(shards), *args)), mesh=mesh,
                                 in_specs=spec, out_specs=spec))


def adam_w_init(table: ShardedHashTable, amsgrad: bool = False):
    """:func:`~jaxops.ops.hashtable.adamw.adam_w_init` for every shard."""
    return per_shard_state(check_sharded(APPLY_ADAM_W.name, table), _adam_w_init, bool(amsgrad))


def _adam_local(statics, state, batch, active, hyper, capacity):
    where, by_slots, amsgrad, maximize = statics
    table, opt = state
    keys_or_slots, grads = batch
    if by_slots:
        ex = route_slots(where, keys_or_slots, active, capacity, grads)
        slots, grads = ex.received
    else:
        ex = route_keys(where, keys_or_slots, active, capacity, grads)
        words, grads = ex.received
        slots = live_slots(table, key_batch(APPLY_ADAM_W.name, words, table.bucket_size),
                           ex.active)
    slots = jnp.where(ex.active, slots, -1)
    placeholder = Words64(slots.astype(jnp.uint32), slots.astype(jnp.uint32))
    new_table, new_opt = _adam_w_kernel(table, opt, placeholder, grads, *hyper, slots,
                                        amsgrad=amsgrad, maximize=maximize)
    real = jnp.sum(ex.active & (slots < 0), dtype=jnp.int32)  # padding lanes are no keys
    new_opt = new_opt._replace(skipped=add_skipped(opt.skipped, real))
    return (new_table, new_opt), (ex.info.served,), (ex.info.needed, ex.info.lost)


def apply_adam_w(table: ShardedHashTable, state: Any, keys: Any, grads: jax.Array, *, lr,
                 weight_decay, beta1=0.9, beta2=0.999, epsilon=1e-8, amsgrad: bool = False,
                 maximize: bool = False, slots: jax.Array | None = None,
                 route_capacity: int | None = None, overflow: str = "expand"):
    """:func:`~jaxops.ops.hashtable.adamw.apply_adam_w` on a sharded table (``slots``:
    global slots, e.g. ``info.slots``; ``route_capacity`` / ``overflow`` as in
    :func:`~.lookup.lookup_or_insert`)."""
    op = APPLY_ADAM_W.name
    table = check_sharded(op, table)
    if slots is not None:
        first = jnp.asarray(slots).reshape(-1).astype(jnp.int32)
    elif keys is None:
        raise OpArgumentError(op, "keys", "int64 keys, or slots=", "None")
    else:
        first = flat_words(op, keys, table.key_dtype)[0]
    n = int(jax.tree.leaves(first)[0].shape[0])
    grads = jnp.asarray(check_numeric(op, "grads", grads, GRADS), jnp.float32)
    if grads.size != n * table.embedding_dim:
        raise OpArgumentError(op, "grads", f"[{n}, {table.embedding_dim}] float32 (one row per "
                              "key)", f"shape {tuple(grads.shape)}")
    statics = (where_of(table), slots is not None, bool(amsgrad), bool(maximize))
    hyper = tuple(jnp.asarray(x, jnp.float32) for x in (lr, weight_decay, beta1, beta2, epsilon))
    batch = (first, grads.reshape(n, table.embedding_dim))

    def attempt(capacity):
        capacity = call.check_capacity(op, table, n, capacity)
        (new, opt), _, route = call.run(_adam_local, statics, table, (table.shards, state),
                                        batch, hyper, capacity)
        return table.after_call(new, route[1]), opt, RouteInfo(None, *route, jnp.int32(capacity))

    new, opt, _ = call.with_route_policy(op, overflow, route_capacity, attempt, lambda r: r[2],
                                         call.local_batch(table, n))
    return new, opt


def _optim_local(statics, state, batch, active, step, capacity):
    where, rule = statics
    table, opt = state
    slots, grads = batch
    ex = route_slots(where, slots, active, capacity, grads)
    local, grads = ex.received
    local = jnp.where(ex.active, local, -1)
    new_table, new_opt = _apply(rule, table, opt, local, grads, step)
    real = jnp.sum(ex.active & (local < 0), dtype=jnp.int32)
    new_opt = new_opt._replace(skipped=add_skipped(opt.skipped, real))
    return (new_table, new_opt), (ex.info.served,), (ex.info.needed, ex.info.lost)


def row_optimizer_update(op: str, rule: Callable, table: ShardedHashTable, state: Any,
                         slots: Any, grads: Any, step: Any = None, *,
                         route_capacity: int | None = None, overflow: str = "expand"):
    """A row optimizer's ``update`` on a sharded table, by global slots."""
    slots = jnp.asarray(check_numeric(op, "slots", slots, SLOTS, integer=True))
    grads = jnp.asarray(check_numeric(op, "grads", grads, ROW_GRADS))
    dim = table.embedding_dim
    if grads.size != slots.size * dim:
        raise OpArgumentError(op, "grads", f"shape slots.shape + ({dim},) = "
                              f"{tuple(slots.shape) + (dim,)}", f"shape {tuple(grads.shape)}")
    check_update_args(op, table.shards, slots, grads.reshape(*slots.shape, dim))
    flat = slots.reshape(-1).astype(jnp.int32)
    n = int(flat.shape[0])
    grads = jnp.asarray(grads).reshape(n, table.embedding_dim).astype(table.values.dtype)

    def attempt(capacity):
        capacity = call.check_capacity(op, table, n, capacity)
        (new, opt), _, route = call.run(_optim_local, (where_of(table), rule), table,
                                        (table.shards, state), (flat, grads), step, capacity)
        return table.after_call(new, route[1]), opt, RouteInfo(None, *route, jnp.int32(capacity))

    new, opt, _ = call.with_route_policy(op, overflow, route_capacity, attempt, lambda r: r[2],
                                         call.local_batch(table, n))
    return new, opt


def _evict_local(statics, table, batch, active, replicated, capacity):
    where, init_mode, const_val = statics
    words, sampled = batch
    ex = route_keys(where, words, active, capacity, sampled)
    received, sampled = ex.received
    (new,) = _evict_kernel(table, received, sampled, ex.active, init_mode=init_mode,
                           const_val=const_val)
    return new, (ex.info.served,), (ex.info.needed, ex.info.lost)


def evict(table: ShardedHashTable, keys: Any, *, init_mode: str = "constant",
          const_val: float = 0.0, sampled_values: jax.Array | None = None,
          route_capacity: int | None = None, overflow: str = "expand") -> ShardedHashTable:
    """:func:`~jaxops.ops.hashtable.evict.evict` on a sharded table."""
    op = EVICT.name
    table = check_sharded(op, table)
    words, _ = flat_words(op, keys, table.key_dtype)
    n = int(words.lo.shape[0])
    if init_mode == "random":
        if sampled_values is None or jnp.size(sampled_values) != n * table.embedding_dim:
            raise OpArgumentError(op, "sampled_values", f"[{n}, {table.embedding_dim}] float32 "
                                  "rows in random mode", "None" if sampled_values is None
                                  else f"shape {jnp.shape(sampled_values)}")
        sampled_values = jnp.asarray(sampled_values, jnp.float32).reshape(n, -1)
    else:
        sampled_values = None
    statics = (where_of(table), init_mode, float(const_val))

    def attempt(capacity):
        capacity = call.check_capacity(op, table, n, capacity)
        new, _, route = call.run(_evict_local, statics, table, table.shards,
                                 (words, sampled_values), None, capacity)
        return table.after_call(new, route[1]), RouteInfo(None, *route, jnp.int32(capacity))

    return call.with_route_policy(op, overflow, route_capacity, attempt, lambda r: r[1],
                                  call.local_batch(table, n))[0]


def _import_local(statics, table, batch, active, replicated, capacity):
    (where,) = statics
    words, payload = batch
    ex = route_keys(where, words, active, capacity, payload)
    received, (counters, flags, values) = ex.received
    new, info = _import_kernel(table, received, counters, flags, values, ex.active)
    over = jax.lax.pmax(info.over_limit.astype(jnp.int32), where.axis) > 0
    return new, (receive(global_slots(where, info.slots), ex, -1), ex.info.served), (
        total(info.inserted, where.axis), total(info.unplaced, where.axis), over,
        ex.info.needed, ex.info.lost)


def import_(table: ShardedHashTable, keys: Any, counters: Any, filter_flags: Any, values: Any,
            *, route_capacity: int | None = None, overflow: str = "expand"):
    """:func:`~jaxops.ops.hashtable.import_.import_` on a sharded table: every entry goes
    to its owner shard. Returns ``(table, info)``; ``info.slots`` are global slots."""
    op = IMPORT.name
    table = check_sharded(op, table)
    words, _ = flat_words(op, keys, table.key_dtype)
    n = int(words.lo.shape[0])
    count_words = as_words(counters, op, "counters")
    counters = Words64(count_words.lo.reshape(-1), count_words.hi.reshape(-1))
    flags = jnp.asarray(check_numeric(op, "filter_flags", filter_flags, FLAGS, integer=True)
                        ).reshape(-1)
    rows = jnp.asarray(check_numeric(op, "values", values, ROWS), jnp.float32)
    for arg, got in (("counters", counters.lo.size), ("filter_flags", flags.size),
                     ("values", rows.size // max(table.embedding_dim, 1))):
        if got != n:
            raise OpArgumentError(op, arg, f"{n} entries (one per key)", f"{got}")
    batch = (words, (counters, flags, rows.reshape(n, table.embedding_dim)))

    def insert(table):
        def attempt(capacity):
            capacity = call.check_capacity(op, table, n, capacity)
            new, (slots, _), (inserted, unplaced, over, needed, lost) = call.run(
                _import_local, (where_of(table),), table, table.shards, batch, None, capacity)
            return (table.after_call(new, lost), ImportInfo(slots, inserted, unplaced, over),
                    RouteInfo(None, needed, lost, jnp.int32(capacity)))

        new, info, _ = call.with_route_policy(op, overflow, route_capacity, attempt,
                                              lambda r: r[2], call.local_batch(table, n))
        return new, info

    return insert_under_policy(op, table, words, None, insert)
