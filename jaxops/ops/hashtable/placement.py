"""Placements: where a table lives, as a value every table operation runs through.

A table operation is written once, as a function of one shard (see :mod:`.route`); the
table's placement runs it. :class:`OneDevice` is the trivial placement: the table is one
shard and nothing moves. :class:`~.on_mesh.MeshAxis` lays one shard per device along a
mesh axis, each key owned by one shard, and runs the same function inside ``shard_map``.
A placement offers two frames:

- :meth:`Placement.map`: ``local(router, statics, state, replicated) -> (state, out)`` on
  every shard (whole-table operations: export, resize, scored eviction, new states);
- :meth:`Placement.call`: ``local(router, statics, state, batch, active, replicated) ->
  (state, per_key, totals)`` on a batch split over the shards (lookups, inserts, updates),
  returning the per-key answers in the batch's order and a :class:`~.route.RouteInfo`.

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

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.capacity.policy import KEEP, next_capacity, settle, warn_once
from jaxops.core.errors import OpArgumentError, RouteOverflowError
from jaxops.ops.hashtable.route import LocalRouter, RouteInfo
from jaxops.ops.hashtable.table import HashTable

__all__ = ["Forwarding", "ONE_DEVICE", "OneDevice", "Placement", "ROUTE_POLICIES",
           "forwarding_jit", "placement_of", "run_routed", "shard_size_of"]

#: What an eager call does when keys did not fit a routing buffer (see :func:`run_routed`).
ROUTE_POLICIES = ("error", "truncate", "expand")

#: ``local(router, statics, state, replicated) -> (state, out)``
MapLocal = Callable[..., tuple[Any, Any]]
#: ``local(router, statics, state, batch, active, replicated) -> (state, per_key, totals)``
CallLocal = Callable[..., tuple[Any, Any, Any]]


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

    def rebuild(self, table: Any, storage: HashTable, unrouted: Any = None) -> Any:
        """The table of this placement holding ``storage`` (``unrouted``: keys a call did
        not route, added to the table's count)."""
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

    def rebuild(self, table, storage, unrouted=None):
        return storage

    def map(self, local, statics, state, replicated=None, *, donate=False):
        return _one_map(local, statics, donate)(state, replicated)

    def call(self, local, statics, state, batch, replicated=None, *, capacity=None,
             donate=False):
        return _one_call(local, statics, donate)(state, batch, replicated)

    def build(self, make, statics, replicated=None):
        return _one_build(make, statics)(replicated)


ONE_DEVICE = OneDevice()


class Forwarding:
    """Keeps a frame from copying the state leaves an operation leaves unchanged.

    ``jax.jit`` copies an output that is one of its inputs, so an operation that changes a
    table's flags would copy its rows too (a second table in memory). A frame's traced
    function hands its new state to :meth:`split`, which drops the leaves that are input
    leaves (found by identity at trace time) and remembers where they came from; the caller
    gives the jitted result to :meth:`join`, which puts the input arrays back. The plan is
    kept per input signature (shapes and dtypes: an empty batch may forward more), set
    while the jitted call traces (:meth:`tracing`). With donation XLA aliases the buffers
    instead, so a donated frame keeps every leaf. The result shares those buffers with the
    input, as ``table.replace(...)`` does.

    >>> import jax, jax.numpy as jnp
    >>> fwd = Forwarding()
    >>> f = jax.jit(lambda s: fwd.split(list(s), {"a": s[0], "b": s[1] + 1}))
    >>> a, b = jnp.ones(3), jnp.zeros(3)
    >>> with fwd.tracing((a, b)) as key:
    ...     kept = f((a, b))
    >>> out = fwd.join(key, [a, b], kept)
    >>> out["a"] is a, out["b"].tolist()
    (True, [1.0, 1.0, 1.0])
    """

    def __init__(self):
        self._plans: dict = {}
        self._current = threading.local()

    @contextlib.contextmanager
    def tracing(self, args: Any):
        """The signature of ``args``, current while the jitted call (re)traces."""
        leaves, tree = jax.tree.flatten(args)
        key = (tree, tuple((np.shape(x), getattr(x, "dtype", None) or jnp.result_type(x))
                           for x in leaves))
        self._current.key = key
        try:
            yield key
        finally:
            self._current.key = None

    def split(self, inputs: list, new: Any) -> list:
        leaves, tree = jax.tree.flatten(new)
        where = {id(x): i for i, x in enumerate(inputs)}
        plan = (tree, tuple(where.get(id(x), -1) for x in leaves))
        self._plans[getattr(self._current, "key", None)] = plan
        return [x for x, i in zip(leaves, plan[1]) if i < 0]

    def join(self, key: Any, inputs: list, kept: list) -> Any:
        tree, plan = self._plans[key]
        kept = iter(kept)
        return tree.unflatten([inputs[i] if i >= 0 else next(kept) for i in plan])


def forwarding_jit(fn: Callable, donate: bool) -> Callable:
    """``jax.jit(fn)`` for ``fn(state, *rest) -> (new_state, *outs)`` that returns the state
    leaves ``fn`` did not change as the input arrays themselves (:class:`Forwarding`)."""
    if donate:
        return jax.jit(fn, donate_argnums=(0,))
    fwd = Forwarding()

    def traced(state, *rest):
        new, *outs = fn(state, *rest)
        return fwd.split(jax.tree.leaves(state), new), *outs

    jitted = jax.jit(traced)

    def call(state, *rest):
        with fwd.tracing((state, rest)) as key:
            kept, *outs = jitted(state, *rest)
        return fwd.join(key, jax.tree.leaves(state), kept), *outs

    return call


@functools.lru_cache(maxsize=256)
def _one_map(local, statics, donate):
    def run(state, replicated):
        return local(LocalRouter(shard_size_of(state)), statics, state, replicated)

    return forwarding_jit(run, donate)


@functools.lru_cache(maxsize=256)
def _one_call(local, statics, donate):
    def run(state, batch, replicated):
        n = int(jax.tree.leaves(batch)[0].shape[0])
        active = jnp.ones(n, bool)
        new, per_key, totals = local(LocalRouter(shard_size_of(state)), statics, state, batch,
                                     active, replicated)
        return new, per_key, totals, RouteInfo(active, jnp.int32(n), jnp.int32(0),
                                               jnp.int32(n))

    return forwarding_jit(run, donate)


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


def run_routed(op: str, placement: Placement, attempt: Callable[[int], Any],
               route_of: Callable[[Any], RouteInfo], n: int, capacity: Any = None,
               overflow: str = "expand", table: Any = None) -> Any:
    """``attempt(capacity)`` of a routed call, under the routing overflow policy (the
    shared rerun engine, :func:`~jaxops.capacity.policy.settle`).

    Eagerly, when keys did not fit their routing buffer: ``"error"`` raises
    :class:`CapacityOverflowError`; ``"truncate"`` keeps the result (the keys not served
    got the default) and warns once per call site; ``"expand"`` reruns at the next power
    of two that holds the largest buffer. Inside ``jit`` the result's ``RouteInfo``
    reports it. A placement that routes nothing never overflows (and is never synced).
    ``capacity`` None takes ``table``'s own ``route_capacity`` (a table on a mesh keeps
    one, which :func:`~.load_policy.maintain` sets from what the steps needed), else the
    most a device can send to one shard.
    """
    if capacity is None:
        capacity = getattr(table, "route_capacity", None)
    if overflow not in ROUTE_POLICIES:
        raise OpArgumentError(op, "overflow", f"one of {ROUTE_POLICIES}", repr(overflow))
    most = placement.batch_capacity(op, n, None)
    given = placement.batch_capacity(op, n, capacity)
    if not placement.routes:
        return attempt(given)

    def shortfall(result):
        info = route_of(result)
        return info if int(info.lost) else None

    def remedy(capacity: int, info: RouteInfo):
        needed, lost = int(info.needed), int(info.lost)
        if overflow == "error":
            raise RouteOverflowError(op, capacity, needed, lost)
        if overflow == "truncate":
            warn_once(f"{op}: {lost} keys did not fit route_capacity={capacity} (needed "
                      f"{needed}); they were not served (info.route.served).")
            return KEEP
        return next_capacity(needed, most)

    return settle(attempt, given, shortfall=shortfall, remedy=remedy, tries=1)


def flat_batch(batch: Any) -> int:
    """The number of lanes of a batch (the leading size of its first leaf)."""
    return int(jax.tree.leaves(batch)[0].shape[0])


def is_traced(x: Any) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(x))


