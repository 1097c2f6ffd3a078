"""Reading a table without changing it: ``find``, ``locate``, ``lookup`` and ``gather``.

Each runs one shard's read on every shard of the table's placement
(:mod:`~jaxops.hashtable._kernels.read_kernel`): keys (or slots) go to the shard that holds
them, the shard reads, the rows come back. Slots are global (``shard * shard_size + local
slot``; the slot itself on one device). ``lookup`` and ``gather`` are differentiable w.r.t.
``table.values``: the cotangents travel back to the shards through the exchange's transpose.

Every read also takes ``route_capacity`` and ``overflow`` (on a mesh: the routing buffers'
lanes per destination, and what an eager call does when keys do not fit them; see
``lookup_or_insert``). A read returns no table to count the keys it did not serve in, so
:func:`with_route` gives a read that also returns the call's
:class:`~jaxops.hashtable._placement.route.RouteInfo`: ``with_route(find)(table, keys)`` is
``(find(table, keys), route)``. Inside ``jit`` with a ``route_capacity`` that report is the
only one of keys not served, so there a plain read refuses the capacity.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(16, 2, initializer_mode="constant", constant_value=1.0)
>>> t, rows, info = ht.lookup_or_insert(t, np.array([7, 9], np.int64))
>>> rows, found = ht.find(t, np.array([9, 8], np.int64))
>>> found.tolist(), ht.gather(t, info.slots)[:, 0].tolist()
([True, False], [1.0, 1.0])
>>> slots, route = ht.with_route(ht.locate)(t, np.array([9, 8], np.int64))
>>> slots.tolist() == [int(info.slots[1]), -1], int(route.lost)
(True, 0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._kernels.read_kernel import find_on_shard, gather_on_shard
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._placement.route import RouteInfo
from jaxops.hashtable._placement.run import run_batch
from jaxops.hashtable._table.checks import check_numeric
from jaxops.hashtable._walks.batch import flat_words, shaped
from jaxops.hashtable._walks.row_gather import SLOTS, check_slots

__all__ = ["find", "gather", "locate", "lookup", "with_route"]


def _read(op: str, table: Any, keys: Any, default_value: float, want_rows: bool,
          route_capacity: Any, overflow: str) -> tuple[jax.Array | None, jax.Array, RouteInfo]:
    storage = placement_of(op, table).storage(table)
    words, shape = flat_words(op, keys, storage.key_dtype)
    ran = run_batch(op, table, find_on_shard, (float(default_value), want_rows), words,
                    route_capacity=route_capacity, overflow=overflow)
    rows, slots = ran.per_key
    rows = None if rows is None else shaped(rows, (*shape, storage.embedding_dim))
    return rows, shaped(slots, shape), ran.route._replace(served=shaped(ran.route.served,
                                                                        shape))


def _unrouted(op: str, result: Any, route: RouteInfo, route_capacity: Any) -> Any:
    """``result`` alone; refused inside ``jit`` when a ``route_capacity`` was given (its
    route is then the only report of keys that did not fit)."""
    if route_capacity is not None and isinstance(route.lost, jax.core.Tracer):
        raise OpArgumentError(op, "route_capacity", "None inside jit, unless the read also "
                              "returns its RouteInfo (the only report of keys that did not "
                              "fit)", repr(route_capacity), f"Call ht.with_route(ht.{op})(...) "
                              "and check route.lost.")
    return result


def _locate_routed(table: Any, keys: Any, *, route_capacity: int | None = None,
                   overflow: str = "expand") -> tuple[jax.Array, RouteInfo]:
    _, slots, route = _read("locate", table, keys, 0.0, False, route_capacity, overflow)
    return slots, route


def locate(table: Any, keys: Any, *, route_capacity: int | None = None,
           overflow: str = "expand") -> jax.Array:
    """The (global) slot of each key (int32, keys' shape): -1 for absent and evicted keys.

    Args:
        table: the table (any placement).
        keys: int64 keys — numpy int64, JAX int64 (x64), JAX int32/uint32, or ``Words64``.
    """
    slots, route = _locate_routed(table, keys, route_capacity=route_capacity,
                                  overflow=overflow)
    return _unrouted("locate", slots, route, route_capacity)


def _find_routed(table: Any, keys: Any, *, default_value: float = 0.0,
                 route_capacity: int | None = None, overflow: str = "expand"
                 ) -> tuple[tuple[jax.Array, jax.Array], RouteInfo]:
    rows, slots, route = _read("find", table, keys, default_value, True, route_capacity,
                               overflow)
    return (rows, slots >= 0), route


def find(table: Any, keys: Any, *, default_value: float = 0.0,
         route_capacity: int | None = None, overflow: str = "expand"
         ) -> tuple[jax.Array, jax.Array]:
    """``(values, found)`` for ``keys`` without changing the table.

    Returns:
        float32 ``keys.shape + (dim,)`` rows (``default_value`` where absent or evicted) and
        bool ``keys.shape``.
    """
    found, route = _find_routed(table, keys, default_value=default_value,
                                route_capacity=route_capacity, overflow=overflow)
    return _unrouted("find", found, route, route_capacity)


def _lookup_routed(table: Any, keys: Any, *, route_capacity: int | None = None,
                   overflow: str = "expand") -> tuple[jax.Array, RouteInfo]:
    rows, _, route = _read("lookup", table, keys, 0.0, True, route_capacity, overflow)
    return rows, route


def lookup(table: Any, keys: Any, *, route_capacity: int | None = None,
           overflow: str = "expand") -> jax.Array:
    """Rows of ``keys`` (zeros for absent keys), differentiable w.r.t. ``table.values``;
    never inserts (``lookup_or_insert`` does).

    ``jax.grad(lambda v: loss(lookup(table.replace(values=v), keys)))(table.values)``
    scatter-adds each row's gradient into its slot (see :func:`gather`).
    """
    rows, route = _lookup_routed(table, keys, route_capacity=route_capacity,
                                 overflow=overflow)
    return _unrouted("lookup", rows, route, route_capacity)


def _gather_routed(table: Any, slots: Any, default_value: float = 0.0, *,
                   route_capacity: int | None = None, overflow: str = "expand"
                   ) -> tuple[jax.Array, RouteInfo]:
    op = "gather"
    storage = placement_of(op, table).storage(table)
    slots = check_numeric(op, "slots", slots, SLOTS, integer=True)
    if not isinstance(slots, jax.core.Tracer):
        check_slots(np.asarray(slots), table.bucket_size)
    shape = tuple(np.shape(slots))
    flat = jnp.asarray(np.ravel(slots) if isinstance(slots, np.ndarray) else
                       shaped(jnp.asarray(slots), (-1,) if len(shape) != 1 else shape),
                       jnp.int32)
    ran = run_batch(op, table, gather_on_shard, float(default_value), flat,
                    route_capacity=route_capacity, overflow=overflow)
    return (shaped(ran.per_key, (*shape, storage.embedding_dim)),
            ran.route._replace(served=shaped(ran.route.served, shape)))


def gather(table: Any, slots: Any, default_value: float = 0.0, *,
           route_capacity: int | None = None, overflow: str = "expand") -> jax.Array:
    """Rows at (global) ``slots`` (e.g. ``info.slots``; -1 gives ``default_value``),
    differentiable w.r.t. ``table.values``: the VJP scatter-adds each row's cotangent into
    its slot (duplicates accumulate), so ``jax.grad`` of a loss over looked-up rows reaches
    the table's rows.

    Only -1 means "absent": other slots outside ``[0, bucket_size)`` raise
    :class:`~jaxops.errors.OpArgumentError` when ``slots`` is concrete (under ``jit`` they
    cannot be checked and read as -1).
    """
    rows, route = _gather_routed(table, slots, default_value, route_capacity=route_capacity,
                                 overflow=overflow)
    return _unrouted("gather", rows, route, route_capacity)


_ROUTED = {find: _find_routed, locate: _locate_routed, lookup: _lookup_routed,
           gather: _gather_routed}


def with_route(read: Callable) -> Callable:
    """``read`` (:func:`find`, :func:`locate`, :func:`lookup` or :func:`gather`) as a
    function of the same arguments that returns ``(result, route)``: what ``read`` returns
    and the call's :class:`~jaxops.hashtable._placement.route.RouteInfo` (on a mesh, which
    keys did not fit their routing buffer: inside ``jit`` with a ``route_capacity`` the only
    report of them; on one device every key is served).

    >>> import numpy as np, jaxops.hashtable as ht
    >>> t = ht.init_table(8, 1, initializer_mode="constant")
    >>> (rows, found), route = ht.with_route(ht.find)(t, np.array([3], np.int64))
    >>> found.tolist(), route.served.tolist()
    ([False], [True])
    """
    routed = next((r for f, r in _ROUTED.items() if f is read), None)
    if routed is None:
        raise OpArgumentError("with_route", "read", "one of jaxops.hashtable's reads: find, "
                              "locate, lookup or gather", getattr(read, "__name__", repr(read)))
    return routed
