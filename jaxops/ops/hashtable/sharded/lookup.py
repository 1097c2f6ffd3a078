"""``lookup_or_insert``, ``locate``, ``find``, ``lookup`` and ``gather`` on a sharded table.

Each device routes its slice of the batch to the owner shards (:mod:`.route`), runs the
single-table kernel there on what it received (in global batch order, so inserts, counters
and admission follow the batch-order rule of one table), and gets rows and slots back.
Slots are **global**: ``shard * shard_size + local slot`` (int32), -1 for none.

>>> import numpy as np, jax, jaxops.hashtable as ht
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> t = ht.init_sharded_table(32, 2, mesh, "d", initializer_mode="constant", constant_value=1.0)
>>> t, rows, info = ht.lookup_or_insert(t, np.array([7, 9, 7], np.int64))
>>> rows.shape, int(info.inserted), int(t.live), int(info.route.lost)
((3, 2), 2, 2, 0)
>>> ht.find(t, np.array([9, 8], np.int64))[1].tolist()
[True, False]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.batch import key_batch, live_slots
from jaxops.ops.hashtable.gather import SLOTS, check_slots, gather as gather_rows
from jaxops.ops.hashtable.lookup import LookupInfo, _effective_keys, _lookup_or_insert
from jaxops.ops.hashtable.opdefs import LOOKUP_OR_INSERT
from jaxops.ops.hashtable.sharded import call
from jaxops.ops.hashtable.sharded.policy import insert_under_policy
from jaxops.ops.hashtable.sharded.route import RouteInfo, receive, send
from jaxops.ops.hashtable.sharded.table import (ShardedHashTable, check_sharded, owner_shard,
                                                refuse_donate)
from jaxops.ops.hashtable.table import Words64, as_words, check_numeric

__all__ = ["ShardedLookupInfo", "find", "gather", "locate", "lookup", "lookup_or_insert"]


# LookupInfo's fields (one list: a field added there is here too), then ``route``.
ShardedLookupInfo = NamedTuple("ShardedLookupInfo",
                               [*LookupInfo.__annotations__.items(), ("route", RouteInfo)])
ShardedLookupInfo.__doc__ = """:class:`~jaxops.ops.hashtable.lookup.LookupInfo`'s fields (slots
global, counts summed over the shards, ``over_limit``: some shard passed its limit) and
``route``, a :class:`~.route.RouteInfo` (keys not routed are in none of the counts)."""


class Where(NamedTuple):
    """The static facts a shard's function needs: the axis, shard count and shard size."""

    axis: str
    shards: int
    size: int


def where_of(table: ShardedHashTable) -> Where:
    return Where(table.axis, table.num_shards, table.shard_size)


def route_keys(where: Where, words: Words64, active: jax.Array, capacity: int, extra: Any = ()):
    """Sends each key (and its ``extra`` payload) to its owner shard."""
    owner = owner_shard(words.lo, words.hi, where.shards)
    return send((words, extra), owner, active, axis=where.axis, num_shards=where.shards,
                capacity=capacity)


def route_slots(where: Where, slots: jax.Array, active: jax.Array, capacity: int,
                extra: Any = ()):
    """Sends each global slot (and ``extra``) to its shard as a local slot; slot -1 goes to
    shard 0 as -1 (an absent entry the kernels count)."""
    owner = jnp.where(slots >= 0, slots // where.size, 0)
    local = jnp.where(slots >= 0, slots % where.size, -1)
    return send((local, extra), owner, active, axis=where.axis, num_shards=where.shards,
                capacity=capacity)


def global_slots(where: Where, slots: jax.Array) -> jax.Array:
    base = jax.lax.axis_index(where.axis).astype(jnp.int32) * np.int32(where.size)
    return jnp.where(slots >= 0, base + slots, -1)


def flat_words(op: str, keys: Any, key_dtype: str | None = None
               ) -> tuple[Words64, tuple[int, ...]]:
    words = as_words(keys, op, "keys", key_dtype)
    return Words64(words.lo.reshape(-1), words.hi.reshape(-1)), words.shape


def total(x: jax.Array, axis: str) -> jax.Array:
    return jax.lax.psum(x, axis)


def _lookup_or_insert_local(statics, table, words, active, replicated, capacity):
    where, attrs = statics
    attrs = dict(attrs)
    ex = route_keys(where, words, active, capacity)
    received, _ = ex.received
    new, rows, info = _lookup_or_insert(table, received, ex.active, **attrs)
    per_key = (receive(rows, ex, attrs["default_value"]),
               receive(global_slots(where, info.slots), ex, -1),
               receive(info.admitted, ex, False), ex.info.served)
    counts = tuple(total(c, where.axis) for c in (info.inserted, info.unplaced,
                                                  info.not_admitted, info.filtered))
    over = jax.lax.pmax(info.over_limit.astype(jnp.int32), where.axis) > 0
    return new, per_key, (counts, over, ex.info.needed, ex.info.lost)


def lookup_or_insert(table: ShardedHashTable, keys: Any, *, route_capacity: int | None = None,
                     overflow: str = "expand", **attrs) -> tuple[ShardedHashTable, jax.Array,
                                                                 ShardedLookupInfo]:
    """:func:`~jaxops.ops.hashtable.lookup.lookup_or_insert` on a sharded table.

    Args:
        table, keys, attrs: as for one table (``filter_mode``, ``default_value``, ...);
            ``step`` sets every shard's clock (default: +1), so LRU scores match one
            table's; ``donate=True`` is refused: donate a sharded table to a jitted step.
        route_capacity: lanes per destination buffer on each device (static). ``None``:
            the device's batch slice, which nothing can overflow; smaller buffers move less
            data but may leave keys unserved (reported in ``info.route``).
        overflow: what an eager call does when keys did not fit: ``"expand"`` (rerun at the
            next power of two that fits), ``"error"`` or ``"truncate"`` (keys not served get
            ``default_value``; warns). Inside ``jit``, ``info.route`` reports it.

    Returns:
        ``(table, rows, info)`` like one table's, with a :class:`ShardedLookupInfo`. The
        table's load policy acts per shard, eagerly and before the insert (see
        :mod:`~jaxops.ops.hashtable.sharded.policy`).
    """
    op = LOOKUP_OR_INSERT.name
    table = check_sharded(op, table)
    step = attrs.pop("step", None)
    refuse_donate(op, attrs.pop("donate", False))
    words, shape = flat_words(op, keys, table.key_dtype)
    attrs = _defaults(attrs)
    n = int(words.lo.shape[0])

    def insert(table):
        table = _advance_clock(op, table, step)
        statics = (where_of(table), tuple(sorted(attrs.items())))

        def attempt(capacity):
            capacity = call.check_capacity(op, table, n, capacity)
            new, (rows, slots, admitted, served), (counts, over, needed, lost) = call.run(
                _lookup_or_insert_local, statics, table, table.shards, words, None, capacity)
            info = ShardedLookupInfo(slots.reshape(shape), admitted.reshape(shape), *counts,
                                     over, RouteInfo(served.reshape(shape), needed, lost,
                                                     jnp.int32(capacity)))
            return (table.after_call(new, lost), rows.reshape(*shape, table.embedding_dim),
                    info)

        return call.with_route_policy(op, overflow, route_capacity, attempt,
                                      lambda r: r[2].route, call.local_batch(table, n))

    skip = (_filter_keys, tuple(attrs[k] for k in ("filter_key_flag", "filter_key",
                                                   "default_key_or_value", "default_key")))
    return insert_under_policy(op, table, words, skip, insert)


def _filter_keys(statics, words: Words64) -> tuple[Words64, jax.Array]:
    """The keys ``lookup_or_insert`` inserts, and those it skips (``filter_key``)."""
    return _effective_keys(words, *statics)


def _advance_clock(op: str, table: ShardedHashTable, step) -> ShardedHashTable:
    """Every shard's clock becomes ``step`` (default: its clock + 1), as one table's does:
    the slots the call touches get it as their ``last_access``."""
    clock = table.shards.clock
    if step is None:
        return table.replace(clock=clock + np.uint32(1))
    if isinstance(step, (int, np.integer)) and not 0 <= int(step) < 2**32:
        raise OpArgumentError(op, "step", "an int in [0, 2**32)", repr(step))
    step = np.uint32(step) if isinstance(step, (int, np.integer)) else step
    return table.replace(clock=clock * np.uint32(0) + jnp.asarray(step).astype(jnp.uint32))


def _defaults(attrs: dict) -> dict:
    """The attributes checked (a bad name or value raises, naming it) and completed."""
    out = LOOKUP_OR_INSERT.check_attrs(attrs)
    if not 0 <= int(out["filter_freq"]) < 2**31:
        raise OpArgumentError(LOOKUP_OR_INSERT.name, "filter_freq", "an int in [0, 2**31)",
                              repr(out["filter_freq"]))
    return out


def _find_local(statics, table, words, active, replicated, capacity):
    (where, default_value) = statics
    ex = route_keys(where, words, active, capacity)
    received, _ = ex.received
    slots = live_slots(table, key_batch("find", received, table.bucket_size), ex.active)
    rows = gather_rows(table.values, slots, default_value)
    return None, (receive(rows, ex, default_value), receive(global_slots(where, slots), ex, -1),
                  ex.info.served), (ex.info.needed, ex.info.lost)


def _read(op: str, table: ShardedHashTable, keys: Any, default_value: float,
          route_capacity, overflow) -> tuple[jax.Array, jax.Array, RouteInfo]:
    table = check_sharded(op, table)
    words, shape = flat_words(op, keys, table.key_dtype)
    n = int(words.lo.shape[0])
    statics = (where_of(table), float(default_value))

    def attempt(capacity):
        capacity = call.check_capacity(op, table, n, capacity)
        _, (rows, slots, served), (needed, lost) = call.run(
            _find_local, statics, table, table.shards, words, None, capacity)
        return (rows.reshape(*shape, table.embedding_dim), slots.reshape(shape),
                RouteInfo(served.reshape(shape), needed, lost, jnp.int32(capacity)))

    return call.with_route_policy(op, overflow, route_capacity, attempt, lambda r: r[2],
                                  call.local_batch(table, n))


def with_route_info(op: str, result: tuple, route: RouteInfo, route_capacity, with_route: bool):
    """``result`` (plus ``route`` when asked). A read returns no table to count unserved
    keys in, so inside ``jit`` a given ``route_capacity`` needs ``with_route=True``."""
    if with_route:
        return (*result, route)
    if route_capacity is not None and isinstance(route.lost, jax.core.Tracer):
        raise OpArgumentError(op, "with_route", "True when route_capacity is given inside jit "
                              "(the RouteInfo is the only report of keys that did not fit)",
                              "False", f"Call {op}(..., with_route=True) and check info.lost.")
    return result[0] if len(result) == 1 else result


def locate(table: ShardedHashTable, keys: Any, *, route_capacity=None, overflow="expand",
           with_route: bool = False) -> jax.Array:
    """Global slot of each key (int32, keys' shape), -1 for absent and evicted keys.

    ``with_route=True`` returns ``(slots, route)`` with the :class:`~.route.RouteInfo`
    (as ``find``, ``lookup`` and ``gather`` do).
    """
    _, slots, route = _read("locate", table, keys, 0.0, route_capacity, overflow)
    return with_route_info("locate", (slots,), route, route_capacity, with_route)


def find(table: ShardedHashTable, keys: Any, *, default_value: float = 0.0,
         route_capacity=None, overflow="expand", with_route: bool = False):
    """``(values, found)`` for ``keys`` without changing the table (as for one table)."""
    rows, slots, route = _read("find", table, keys, default_value, route_capacity, overflow)
    return with_route_info("find", (rows, slots >= 0), route, route_capacity, with_route)


def lookup(table: ShardedHashTable, keys: Any, *, route_capacity=None, overflow="expand",
           with_route: bool = False):
    """Rows of ``keys`` (zeros for absent keys), differentiable w.r.t. ``table.values``:
    the cotangents travel back to the owner shards through the exchange's transpose."""
    rows, _, route = _read("lookup", table, keys, 0.0, route_capacity, overflow)
    return with_route_info("lookup", (rows,), route, route_capacity, with_route)


def _gather_local(statics, values, slots, active, replicated, capacity):
    where, default_value = statics
    ex = route_slots(where, slots, active, capacity)
    local, _ = ex.received
    rows = gather_rows(values, jnp.where(ex.active, local, -1), default_value)
    return None, (receive(rows, ex, default_value), ex.info.served), (ex.info.needed,
                                                                       ex.info.lost)


def gather(table: ShardedHashTable, slots: jax.Array, default_value: float = 0.0, *,
           route_capacity=None, overflow="expand", with_route: bool = False):
    """Rows at global ``slots`` (e.g. ``info.slots``; -1 gives ``default_value``),
    differentiable w.r.t. ``table.values``."""
    op = "gather"
    table = check_sharded(op, table)
    slots = check_numeric(op, "slots", slots, SLOTS, integer=True)
    if not isinstance(slots, jax.core.Tracer):  # global slots, as for one table
        check_slots(np.asarray(slots), table.bucket_size)
    slots = jnp.asarray(slots)
    shape = slots.shape
    flat = slots.reshape(-1).astype(jnp.int32)
    n = int(flat.shape[0])
    statics = (where_of(table), float(default_value))

    def attempt(capacity):
        capacity = call.check_capacity(op, table, n, capacity)
        _, (rows, served), (needed, lost) = call.run(_gather_local, statics, table, table.values,
                                              flat, None, capacity)
        return rows.reshape(*shape, table.embedding_dim), RouteInfo(
            served.reshape(shape), needed, lost, jnp.int32(capacity))

    rows, route = call.with_route_policy(op, overflow, route_capacity, attempt, lambda r: r[1],
                                         call.local_batch(table, n))
    return with_route_info(op, (rows,), route, route_capacity, with_route)
