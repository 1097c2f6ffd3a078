"""Running a per-shard function on a sharded table and a global batch, inside ``shard_map``.

Every batched operation of a :class:`ShardedHashTable` has the same frame: flatten the
batch, pad it to a multiple of the shard count (padding lanes are inactive), split it over
the mesh axis, run a local function on each device (which routes its keys to their owners
with :mod:`.route`), and put the answers back in the batch's shape. :func:`run` is that
frame, jitted once per operation and static configuration; the routing capacity's
overflow policy (eager calls) lives here too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxops.capacity.policy import next_capacity, warn_once
from jaxops.core.errors import CapacityOverflowError, OpArgumentError
from jaxops.ops.hashtable.sharded.table import ShardedHashTable
from jaxops.ops.hashtable.table import HashTable

#: ``local(statics, shard, batch, active, replicated) -> (shard', per_key, totals)``: one
#: device's work. ``shard`` is the local HashTable (or pytree of per-shard leaves, leading
#: axis removed); ``batch`` this device's ``[n, ...]`` slice; ``totals`` must be invariant
#: over the axis (psum'ed).
Local = Callable[..., tuple[Any, Any, Any]]

ROUTE_POLICIES = ("error", "truncate", "expand")


def local_batch(table: ShardedHashTable, n: int) -> int:
    """Keys per device for a batch of ``n`` keys (padded up to a multiple of the shards)."""
    return max(1, -(-n // table.num_shards))


def check_capacity(op: str, table: ShardedHashTable, n: int, capacity: Any) -> int:
    """The routing capacity: ``capacity`` checked, or the local batch size (never overflows)."""
    most = local_batch(table, n)
    if capacity is None:
        return most
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)) \
            or int(capacity) < 1:
        raise OpArgumentError(op, "route_capacity", "None or an int >= 1 (keys per destination "
                              "buffer)", repr(capacity))
    return min(int(capacity), most)


def run(local: Local, statics: tuple, table: ShardedHashTable, state: Any, batch: Any,
        replicated: Any, capacity: int) -> tuple[Any, Any, Any]:
    """``local`` on every shard; returns ``(new_state, per_key, totals)`` with ``per_key``
    leaves ``[n, ...]`` (the batch's flat length) and ``state`` (the table's shards, or
    any pytree of per-shard leaves) sharded like the table."""
    n = int(jax.tree.leaves(batch)[0].shape[0])
    fn = _compiled(local, statics, table.mesh, table.axis, n, local_batch(table, n), capacity)
    batch, replicated = global_replicated(table.mesh, batch), global_replicated(table.mesh,
                                                                                   replicated)
    policy = table.shards.load_policy
    new, per_key, totals = fn(_with_policy(state, "error"), batch, replicated)
    return _with_policy(new, policy), per_key, totals


def _with_policy(tree: Any, policy: str) -> Any:
    """``tree`` with its tables' load policy set: the policy acts eagerly, outside the
    programs, so one program serves every policy (no compile per policy)."""
    return jax.tree.map(lambda x: x.replace(load_policy=policy) if isinstance(x, HashTable)
                        else x, tree, is_leaf=lambda x: isinstance(x, HashTable))


@functools.lru_cache(maxsize=256)
def _compiled(local, statics, mesh, axis, n, per_device, capacity):
    shards = int(mesh.shape[axis])
    padded = per_device * shards

    def body(state, batch, active, replicated):
        squeeze = lambda x: x[0]  # noqa: E731
        new, per_key, totals = local(statics, jax.tree.map(squeeze, state), batch, active,
                                     replicated, capacity)
        return jax.tree.map(lambda x: jnp.expand_dims(x, 0), new), per_key, totals

    spec = P(axis)
    mapped = jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec, P()),
                           out_specs=(spec, spec, P()))

    def call(state, batch, replicated):
        pad = lambda x: jnp.pad(x, [(0, padded - n)] + [(0, 0)] * (x.ndim - 1))  # noqa: E731
        active = jnp.arange(padded) < n
        new, per_key, totals = mapped(state, jax.tree.map(pad, batch), active, replicated)
        return new, jax.tree.map(lambda x: x[:n], per_key), totals

    return jax.jit(call)


def global_replicated(mesh, tree: Any) -> Any:
    """With several processes, host-local inputs become global arrays replicated on
    ``mesh`` (every process passes the same values); with one process jit places them."""
    if jax.process_count() == 1:
        return tree
    sharding = NamedSharding(mesh, P())

    def put(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(put, tree)


def with_route_policy(op: str, overflow: str, capacity_given: Any, attempt: Callable[[Any], tuple],
                      route_of: Callable[[tuple], Any], most: int) -> tuple:
    """``attempt(capacity)``'s result, after the routing overflow policy (eager calls only;
    inside ``jit`` the result's ``RouteInfo`` reports the overflow).

    ``"error"`` raises :class:`CapacityOverflowError`; ``"truncate"`` keeps the result
    (keys not served got the default) and warns once per call site; ``"expand"`` reruns at
    the next power-of-two capacity that holds the largest buffer.
    """
    if overflow not in ROUTE_POLICIES:
        raise OpArgumentError(op, "overflow", f"one of {ROUTE_POLICIES}", repr(overflow))
    result = attempt(capacity_given)
    info = route_of(result)
    if isinstance(info.lost, jax.core.Tracer) or int(info.lost) == 0:
        return result
    needed, capacity = int(info.needed), int(info.capacity)
    if overflow == "error":
        raise CapacityOverflowError(op, capacity, needed, f"{int(info.lost)} keys were not "
                                    "routed to their shard. Pass a larger route_capacity, or "
                                    "overflow='expand'.")
    if overflow == "truncate":
        warn_once(f"{op}: {int(info.lost)} keys did not fit route_capacity={capacity} "
                  f"(needed {needed}); they were not served (info.route.served).")
        return result
    return attempt(next_capacity(needed, most))
