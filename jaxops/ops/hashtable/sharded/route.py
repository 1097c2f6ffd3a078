"""Routing a device's batch to the owner shards and the answers back, inside ``shard_map``.

Each device sorts its keys by owner into ``num_shards`` buffers of ``capacity`` lanes (the
routing capacity: a max shape, as for any data-dependent output), one ``all_to_all`` sends
buffer ``d`` to device ``d``, which then holds ``num_shards * capacity`` lanes: source
``0``'s keys first, each source's in batch order. When the global batch is split across
the devices in order (``P(axis)``), an owner thus sees its keys in global batch order, the
order a single table would see them in. The answers (rows, slots, flags) go back with the
reverse ``all_to_all`` into the lanes they came from, and gradients with its transpose.

A key whose buffer is full is **not served**: it is not sent, its answer is the default,
and the count is reported (:class:`RouteInfo`), never dropped silently.

>>> plan = _plan(jnp.array([1, 0, 1, 1], jnp.int32), jnp.array([True] * 4), 2, 2)
>>> plan.position.tolist(), plan.served.tolist(), int(plan.needed)
([2, 0, 3, 4], [True, True, True, False], 3)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class RouteInfo(NamedTuple):
    """What the exchange of one call did (a pytree of arrays; counts are global).

    Attributes:
        served: bool, keys' shape: False where the key did not fit its routing buffer (its
            answer is the default; nothing was done for it).
        needed: int32: the routing capacity this call needed (the largest buffer).
        lost: int32: keys not served (``served`` False), over all devices.
        capacity: int32: the routing capacity used (lanes per destination buffer).
    """

    served: jax.Array
    needed: jax.Array
    lost: jax.Array
    capacity: jax.Array


class _Plan(NamedTuple):
    position: jax.Array  # int32 [n]: lane in the send buffer (num_shards * capacity = none)
    served: jax.Array  # bool [n]
    needed: jax.Array  # int32: the fullest buffer (this device)


def _plan(owner: jax.Array, active: jax.Array, num_shards: int, capacity: int) -> _Plan:
    """Lane of each key in the send buffer: buffer ``owner``, in batch order (O(n log n))."""
    n = owner.shape[0]
    dest = jnp.where(active, owner, num_shards)  # inactive keys sort last, go nowhere
    order = jnp.argsort(dest, stable=True)
    counts = jnp.zeros(num_shards + 1, jnp.int32).at[dest].add(1)
    starts = jnp.cumsum(counts) - counts
    sorted_dest = dest[order]
    rank = jnp.zeros(n, jnp.int32).at[order].set(
        jnp.arange(n, dtype=jnp.int32) - starts[sorted_dest], unique_indices=True)
    served = active & (rank < capacity)
    position = jnp.where(served, dest * capacity + rank, num_shards * capacity)
    return _Plan(position, served, jnp.max(counts[:num_shards]))


class Exchange(NamedTuple):
    """A device's routed batch: what it received, and how to send answers back."""

    plan: _Plan
    received: Any  # the payload tree, [num_shards * capacity, ...] per leaf
    active: jax.Array  # bool [num_shards * capacity]: lanes holding a key
    info: RouteInfo
    axis: str


def send(payload: Any, owner: jax.Array, active: jax.Array, *, axis: str, num_shards: int,
         capacity: int) -> Exchange:
    """Routes ``payload`` (a tree of ``[n, ...]`` arrays) lane by lane to ``owner``."""
    plan = _plan(owner, active, num_shards, capacity)
    lanes = num_shards * capacity

    def pack(x):
        buf = jnp.zeros((lanes,) + x.shape[1:], x.dtype)
        return _exchange(buf.at[plan.position].set(x, mode="drop", unique_indices=True), axis)

    received = jax.tree.map(pack, payload)
    arrived = pack(jnp.ones(owner.shape[0], bool))
    needed = jax.lax.pmax(plan.needed, axis)
    lost = jax.lax.psum(jnp.sum(active & ~plan.served, dtype=jnp.int32), axis)
    info = RouteInfo(plan.served, needed, lost, jnp.int32(capacity))
    return Exchange(plan, received, arrived, info, axis)


def receive(answer: Any, exchange: Exchange, fill: Any = 0) -> Any:
    """Answers (a tree of ``[num_shards * capacity, ...]`` arrays) back to the lanes their
    keys came from: ``[n, ...]`` per leaf, ``fill`` where a key was not served."""
    def back(x):
        home = _exchange(x, exchange.axis)
        return jnp.take(home, exchange.plan.position, axis=0, mode="fill", fill_value=fill)

    return jax.tree.map(back, answer)


def _exchange(x: jax.Array, axis: str) -> jax.Array:
    """Block ``d`` of ``x`` (split along axis 0) goes to device ``d``; received blocks are
    stacked by source. Its own transpose, so gradients flow back the same way."""
    return jax.lax.all_to_all(x, axis, 0, 0, tiled=True)
