"""Placements: where a table lives, as a value every table operation runs through.

A table operation is written once, as a function of one shard (see
:mod:`~jaxops.hashtable._placement.route`); the table's placement runs it.
:class:`OneDevice` is the trivial placement: the table is one shard and nothing moves.
:class:`~jaxops.hashtable._placement.on_mesh.MeshAxis` lays one shard per device along a
mesh axis, each key held by one shard, and runs the same function inside ``shard_map``. A
placement offers three frames:

- :meth:`Placement.map`: ``local(router, statics, state, replicated) -> (state, out)`` on
  every shard (whole-table operations: export, resize, scored eviction, new states);
- :meth:`Placement.call`: ``local(router, statics, state, batch, active, replicated) ->
  (state, per_key, totals, sent)`` on a batch split over the shards (lookups, inserts,
  updates), returning the per-key answers in the batch's order and a
  :class:`~jaxops.hashtable._placement.route.RouteInfo` made from ``sent``, what the shard
  function's exchange returned (:class:`~jaxops.hashtable._placement.route.Sent`);
- :meth:`Placement.build`: ``make(router, statics, replicated) -> state``, new storage.

A batched operation never calls :meth:`Placement.call` itself: it goes through
:func:`~jaxops.hashtable._placement.run.run_batch`, which applies the load policy and the
routing capacity around it.

``state`` is the table's storage (a :class:`HashTable`; on a mesh every leaf has a leading
shard axis) and anything laid out like it (optimizer states). ``out`` is laid out like the
state. ``replicated`` and ``totals`` are the same on every shard. Each frame is jitted once
per operation and static configuration, and inlines into an enclosing ``jit``.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> placement_of("doc", t)
OneDevice()
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._placement.forwarding import forward_unchanged
from jaxops.hashtable._placement.route import LocalRouter, RouteInfo
from jaxops.hashtable._table.table import HashTable

__all__ = ["ONE_DEVICE", "OneDevice", "Placement", "placement_of", "shard_size_of"]

#: ``local(router, statics, state, replicated) -> (state, out)``
MapLocal = Callable[..., tuple[Any, Any]]
#: ``local(router, statics, state, batch, active, replicated) -> (state, per_key, totals,
#: sent)``
CallLocal = Callable[..., tuple[Any, Any, Any, Any]]


class Placement:
    """Where a table lives (see the module docstring). Subclasses are frozen, hashable
    values: a placement is part of a table's static structure."""

    #: Whether batches are routed between shards (routing capacities can overflow).
    routes: bool = False

    @property
    def num_shards(self) -> int:
        return 1

    def storage(self, table: Any) -> HashTable:
        """The table's slots: the table itself, or its shards (leading shard axis)."""
        raise NotImplementedError

    def with_storage(self, table: Any, storage: HashTable, unrouted: Any = None) -> Any:
        """The table of this placement holding ``storage``, with ``table``'s other fields
        (None: a new table); ``unrouted``: keys a call did not route, added to its count."""
        raise NotImplementedError

    def map(self, local: MapLocal, statics: Any, state: Any, replicated: Any = None, *,
            donate: bool = False) -> tuple[Any, Any]:
        raise NotImplementedError

    def call(self, local: CallLocal, statics: Any, state: Any, batch: Any,
             replicated: Any = None, *, capacity: int | None = None, donate: bool = False
             ) -> tuple[Any, Any, Any, RouteInfo]:
        raise NotImplementedError

    def build(self, make: Callable, statics: Any, replicated: Any = None) -> Any:
        """``make(router, statics, replicated) -> state`` on every shard: new storage."""
        raise NotImplementedError

    def per_shard(self, x: Any) -> np.ndarray:
        """A per-shard scalar of the storage (``live``, ...) on the host: ``[num_shards]``."""
        return self.to_host(x).reshape(-1)

    def to_host(self, x: Any) -> np.ndarray:
        """``x`` (a result of this placement's calls) whole on the host of every process."""
        return np.asarray(jax.device_get(x))

    def batch_capacity(self, op: str, n: int, capacity: Any) -> int:
        """The routing capacity for ``n`` keys: ``capacity`` checked (None: the most a
        device can send to one shard, which nothing overflows)."""
        return max(1, n)

    def local_shards(self, storage: HashTable) -> dict[int, HashTable]:
        """``{shard index: one shard's HashTable}`` for the shards this process holds."""
        return {0: storage}


class OneDevice(Placement):
    """The trivial placement: one table on one device (or replicated by ``jit``)."""

    def __repr__(self) -> str:
        return "OneDevice()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, OneDevice)

    def __hash__(self) -> int:
        return hash(OneDevice)

    def storage(self, table):
        return table

    def with_storage(self, table, storage, unrouted=None):
        return storage

    def map(self, local, statics, state, replicated=None, *, donate=False):
        return _one_map(local, statics, donate)(state, replicated)

    def call(self, local, statics, state, batch, replicated=None, *, capacity=None,
             donate=False):
        return _one_call(local, statics, donate)(state, batch, replicated)

    def build(self, make, statics, replicated=None):
        return _one_build(make, statics)(replicated)


ONE_DEVICE = OneDevice()


def _jit(fn: Callable, donate: bool) -> Callable:
    """``jax.jit(fn)`` of a frame's ``fn(state, *rest) -> (new_state, *outs)``, unchanged
    state leaves forwarded (see :mod:`~jaxops.hashtable._placement.forwarding`)."""
    traced, bind = forward_unchanged(fn, donate)
    return bind(jax.jit(traced, donate_argnums=(0,) if donate else ()))


@functools.lru_cache(maxsize=256)
def _one_map(local, statics, donate):
    def run(state, replicated):
        return local(LocalRouter(shard_size_of(state)), statics, state, replicated)

    return _jit(run, donate)


@functools.lru_cache(maxsize=256)
def _one_call(local, statics, donate):
    def run(state, batch, replicated):
        n = int(jax.tree.leaves(batch)[0].shape[0])
        new, per_key, totals, sent = local(LocalRouter(shard_size_of(state)), statics, state,
                                           batch, jnp.ones(n, bool), replicated)
        return new, per_key, totals, RouteInfo(*sent, jnp.int32(n))

    return _jit(run, donate)


@functools.lru_cache(maxsize=64)
def _one_build(make, statics):
    return jax.jit(lambda replicated: make(LocalRouter(), statics, replicated))


def shard_size_of(state: Any) -> int:
    """Slots per shard of the first table in ``state`` (0 when it holds none)."""
    for leaf in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, HashTable)):
        if isinstance(leaf, HashTable):
            return leaf.bucket_size
    return 0


def placement_of(op: str, table: Any, arg: str = "table") -> Placement:
    """The placement of ``table`` (a :class:`HashTable`: :data:`ONE_DEVICE`; a sharded
    table: its own), or an error naming ``op`` and ``arg``."""
    if isinstance(table, HashTable):
        return ONE_DEVICE
    placement = getattr(table, "placement", None)
    if isinstance(placement, Placement):
        return placement
    raise OpArgumentError(op, arg, "a jaxops.hashtable.HashTable or ShardedHashTable (from "
                          "init_table / init_sharded_table)", type(table).__name__)
