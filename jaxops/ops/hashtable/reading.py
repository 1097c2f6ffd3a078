"""Reading a table without changing it: ``find``, ``locate``, ``lookup`` and ``gather``.

Each runs one shard's read on every shard of the table's placement: keys (or slots) go to
their owner, the owner reads, the rows come back. Slots are global (``shard * shard_size +
local slot``; the slot itself on one device). ``lookup`` and ``gather`` are differentiable
w.r.t. ``table.values``: the cotangents travel back to the owner shards through the
exchange's transpose.

Every read also takes ``route_capacity`` and ``overflow`` (on a mesh: the routing buffers'
lanes per destination, and what an eager call does when keys do not fit them; see
``lookup_or_insert``) and ``with_route`` (also return the call's
:class:`~.route.RouteInfo`, which inside ``jit`` with a ``route_capacity`` is the only report
of keys not served, so it is then required).

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(16, 2, initializer_mode="constant", constant_value=1.0)
>>> t, rows, info = ht.lookup_or_insert(t, np.array([7, 9], np.int64))
>>> rows, found = ht.find(t, np.array([9, 8], np.int64))
>>> found.tolist(), ht.gather(t, info.slots)[:, 0].tolist()
([True, False], [1.0, 1.0])
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.core.walk_table import walk_kernel
from jaxops.ops.hashtable.batch import flat_words, key_batch, live_slots, shaped
from jaxops.ops.hashtable.checks import check_numeric
from jaxops.ops.hashtable.placement import placement_of, run_routed
from jaxops.ops.hashtable.probe import probe_limit
from jaxops.ops.hashtable.route import RouteInfo
from jaxops.ops.hashtable.row_gather import SLOTS, check_slots, gather_rows, probed_rows
from jaxops.ops.hashtable.table import HashTable

__all__ = ["find", "gather", "locate", "lookup"]


def _find_on_shard(router, statics, table, words, active, replicated):
    default_value, want_rows = statics
    ex = router.keys(words, active, dedup=True)
    received, _ = ex.received
    rows, slots = read_rows(table, received, ex.active, default_value, want_rows)
    if not want_rows:
        return None, (None, router.back(ex, router.global_slots(slots), -1)), ()
    return None, router.back(ex, (rows, router.global_slots(slots)), (default_value, -1)), ()


def read_rows(table: HashTable, words, active: jax.Array, default_value: float,
              want_rows: bool = True) -> tuple[jax.Array | None, jax.Array]:
    """One shard's ``(rows, live slots)`` of ``words`` (``rows`` None unless wanted): one
    native pass (probe and read) where the walks are native and every lane is a key."""
    fused = walk_kernel("find_rows") if want_rows else None
    if fused is not None:
        fused = functools.partial(fused, limit=probe_limit(table.bucket_size))
        rows, slots = probed_rows(fused, table.values, (table.key_lo, table.key_hi, table.flags,
                                                        words.lo, words.hi), default_value)
        slots = jnp.where(active, slots, -1)  # padding lanes hold no key
        return jnp.where(active[:, None], rows, jnp.float32(default_value)), slots
    slots = live_slots(table, key_batch("find", words, table.bucket_size), active)
    return (gather_rows(table.values, slots, default_value) if want_rows else None), slots


def _read(op: str, table: Any, keys: Any, default_value: float, want_rows: bool,
          route_capacity: Any, overflow: str) -> tuple[jax.Array | None, jax.Array, RouteInfo]:
    place = placement_of(op, table)
    storage = place.storage(table)
    words, shape = flat_words(op, keys, storage.key_dtype)
    n = int(words.lo.shape[0])

    def attempt(capacity):
        _, (rows, slots), _, route = place.call(
            _find_on_shard, (float(default_value), want_rows), storage, words,
            capacity=capacity)
        rows = None if rows is None else shaped(rows, (*shape, storage.embedding_dim))
        return rows, shaped(slots, shape), route._replace(served=shaped(route.served, shape))

    return run_routed(op, place, attempt, lambda r: r[2], n, route_capacity, overflow, table)


def _with_route(op: str, result: tuple, route: RouteInfo, route_capacity: Any,
                with_route: bool) -> Any:
    """``result`` (plus ``route`` when asked). A read returns no table to count unserved
    keys in, so inside ``jit`` a given ``route_capacity`` needs ``with_route=True``."""
    if with_route:
        return (*result, route)
    if route_capacity is not None and isinstance(route.lost, jax.core.Tracer):  # given here
        raise OpArgumentError(op, "with_route", "True when route_capacity is given inside jit "
                              "(the RouteInfo is the only report of keys that did not fit)",
                              "False", f"Call {op}(..., with_route=True) and check info.lost.")
    return result[0] if len(result) == 1 else result


def locate(table: Any, keys: Any, *, route_capacity: int | None = None,
           overflow: str = "expand", with_route: bool = False) -> jax.Array:
    """The (global) slot of each key (int32, keys' shape): -1 for absent and evicted keys.

    Args:
        table: the table (any placement).
        keys: int64 keys — numpy int64, JAX int64 (x64), JAX int32/uint32, or ``Words64``.
    """
    _, slots, route = _read("locate", table, keys, 0.0, False, route_capacity, overflow)
    return _with_route("locate", (slots,), route, route_capacity, with_route)


def find(table: Any, keys: Any, *, default_value: float = 0.0,
         route_capacity: int | None = None, overflow: str = "expand",
         with_route: bool = False) -> tuple[jax.Array, jax.Array]:
    """``(values, found)`` for ``keys`` without changing the table.

    Returns:
        float32 ``keys.shape + (dim,)`` rows (``default_value`` where absent or evicted) and
        bool ``keys.shape``.
    """
    rows, slots, route = _read("find", table, keys, default_value, True, route_capacity,
                               overflow)
    return _with_route("find", (rows, slots >= 0), route, route_capacity, with_route)


def lookup(table: Any, keys: Any, *, route_capacity: int | None = None,
           overflow: str = "expand", with_route: bool = False) -> jax.Array:
    """Rows of ``keys`` (zeros for absent keys), differentiable w.r.t. ``table.values``.

    ``jax.grad(lambda v: loss(lookup(table.replace(values=v), keys)))(table.values)``
    scatter-adds each row's gradient into its slot (see :func:`gather`).
    """
    rows, _, route = _read("lookup", table, keys, 0.0, True, route_capacity, overflow)
    return _with_route("lookup", (rows,), route, route_capacity, with_route)


def _gather_on_shard(router, default_value, table, slots, active, replicated):
    ex = router.slots(slots, active, dedup=True)
    local, _ = ex.received
    rows = gather_rows(table.values, jnp.where(ex.active, local, -1), default_value)
    return None, router.back(ex, rows, default_value), ()


def gather(table: Any, slots: Any, default_value: float = 0.0, *,
           route_capacity: int | None = None, overflow: str = "expand",
           with_route: bool = False) -> jax.Array:
    """Rows at (global) ``slots`` (e.g. ``info.slots``; -1 gives ``default_value``),
    differentiable w.r.t. ``table.values``: the VJP scatter-adds each row's cotangent into
    its slot (duplicates accumulate), so ``jax.grad`` of a loss over looked-up rows reaches
    the table's rows.

    Only -1 means "absent": other slots outside ``[0, bucket_size)`` raise
    :class:`~jaxops.errors.OpArgumentError` when ``slots`` is concrete (under ``jit`` they
    cannot be checked and read as -1).
    """
    op = "gather"
    place = placement_of(op, table)
    storage = place.storage(table)
    slots = check_numeric(op, "slots", slots, SLOTS, integer=True)
    if not isinstance(slots, jax.core.Tracer):
        check_slots(np.asarray(slots), table.bucket_size)
    shape = tuple(np.shape(slots))
    flat = jnp.asarray(np.ravel(slots) if isinstance(slots, np.ndarray) else
                       shaped(jnp.asarray(slots), (-1,) if len(shape) != 1 else shape),
                       jnp.int32)

    def attempt(capacity):
        _, rows, _, route = place.call(_gather_on_shard, float(default_value), storage, flat,
                                       capacity=capacity)
        return (shaped(rows, (*shape, storage.embedding_dim)),
                route._replace(served=shaped(route.served, shape)))

    rows, route = run_routed(op, place, attempt, lambda r: r[1], int(flat.shape[0]),
                             route_capacity, overflow, table)
    return _with_route(op, (rows,), route, route_capacity, with_route)
