"""Routers: how a batch reaches the shards that own its keys, and the answers come back.

Every table operation is written once, as a function of **one shard**: its local table and a
:class:`Router`. The router moves what the operation routes (keys, or slots, with a
payload) to the shards that hold them, and the answers back to the lanes they came from;
it also sums and maximises across shards. On one device nothing moves
(:class:`LocalRouter`: every call is the identity); along a mesh axis
(:class:`AxisRouter`, inside ``shard_map``) each device sorts its lanes by destination
shard into ``num_shards`` buffers of ``capacity`` lanes and one ``all_to_all`` exchanges
them.

A key belongs to exactly one shard, its **owner shard** (:func:`owner_shard`): MurmurHash3
of the key with seed :data:`SHARD_SEED`, modulo the number of shards; the slot inside the
shard uses the seed-0 hash (an independent one), so the keys of one shard spread over all
its slots. Slots are **global**: ``shard * shard_size + local slot`` (the identity on one
device).

Source ``0``'s lanes arrive first, each source's in batch order, so when the global batch is
split across the devices in order a shard sees its keys in global batch order: the order
one table sees them in. A lane whose buffer is full is **not served**: it is not sent, its
answer is the fill value, and the count is reported, never dropped silently: the exchange
returns what it did (:class:`Sent`, in :attr:`Exchange.sent`), the shard function returns
that, and the placement's frame makes it the call's :class:`RouteInfo`.

>>> plan = _plan(jnp.array([1, 0, 1, 1], jnp.int32), jnp.array([True] * 4), 2, 2)
>>> plan.position.tolist(), plan.served.tolist(), int(plan.needed)
([2, 0, 3, 4], [True, True, True, False], 3)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.hashtable._table.murmur import murmur3_x86_32
from jaxops.hashtable._table.words64 import Words64
from jaxops.hashtable._walks.batch import group_prefix
from jaxops.hashtable._walks.probe import first_occurrences, take

__all__ = ["SHARD_SEED", "AxisRouter", "Exchange", "LocalRouter", "RouteInfo", "Router", "Sent",
           "owner_shard"]

#: Seed of the hash that picks a key's owner shard (slots use seed 0: independent bits).
SHARD_SEED = np.uint32(0x9E3779B9)


def owner_shard(lo: jax.Array, hi: jax.Array, num_shards: int) -> jax.Array:
    """The shard that holds each key (int32): ``murmur3(key, SHARD_SEED) % num_shards``."""
    return (murmur3_x86_32(lo, hi, SHARD_SEED) % np.uint32(num_shards)).astype(jnp.int32)


class RouteInfo(NamedTuple):
    """What the exchange of one call did (a pytree of arrays; counts are global).

    Attributes:
        served: bool, keys' shape: False where the key did not fit its routing buffer (its
            answer is the default; nothing was done for it). All True on one device.
        needed: int32: the routing capacity this call needed (the largest buffer).
        lost: int32: keys not served (``served`` False), over all devices.
        capacity: int32: the routing capacity used (lanes per destination buffer).
    """

    served: jax.Array
    needed: jax.Array
    lost: jax.Array
    capacity: jax.Array


class Sent(NamedTuple):
    """What one exchange did, as the shard function returns it (the first three fields of
    its :class:`RouteInfo`; ``served`` is this device's lanes', the counts are global)."""

    served: jax.Array
    needed: jax.Array
    lost: jax.Array


class Exchange(NamedTuple):
    """What one shard received, and how its answers go back.

    Attributes:
        received: the routed payload (a tree of arrays, one entry per lane).
        active: bool, one per lane: the lanes holding something (the rest are padding).
        plan: where each of this device's lanes went (None: nothing moved).
        weights: int32, one per lane: how many of the sender's lanes a lane stands for
            (a deduplicated send); None: one each.
        fan: int32, one per sender lane: the lane whose answer it takes (a deduplicated
            send: the first lane of its key); None: its own.
        sent: what the exchange did (:class:`Sent`): the shard function returns it, so the
            report travels with the values, never beside them.
    """

    received: Any
    active: jax.Array
    plan: Any = None
    weights: jax.Array | None = None
    fan: jax.Array | None = None
    sent: Sent | None = None


class Router:
    """One shard's view of an operation (see the module docstring). ``num_shards`` and
    ``shard_size`` are static; :meth:`index` is this shard's (traced) number."""

    num_shards: int = 1
    shard_size: int = 0
    #: Whether lanes move between shards (False: one device, every call the identity).
    moves: bool = False

    def keys(self, words: Words64, active: jax.Array, extra: Any = (),
             dedup: bool = False) -> Exchange:
        """Sends each key (and its ``extra`` payload) to its owner shard. With ``dedup``
        each distinct key is sent once (as TorchRec's input distribution does), standing for
        its copies (``Exchange.weights``), with the ``extra`` of its first copy; answers fan
        back out to every copy. Sum the copies' payload first where it adds up
        (:func:`~jaxops.hashtable._walks.batch.group_sum`)."""
        raise NotImplementedError

    def slots(self, slots: jax.Array, active: jax.Array, extra: Any = (),
              dedup: bool = False) -> Exchange:
        """Sends each global slot (and ``extra``) to its shard as a local slot; -1 (absent)
        stays -1 (it lands on shard 0, which counts it like any absent entry). ``dedup`` as
        in :meth:`keys`."""
        raise NotImplementedError

    def copy_rank(self, exchange: Exchange, active: jax.Array) -> jax.Array:
        """For each sender lane, how many copies of its key come before it in the batch
        (0 without deduplication): the occurrence it is among those its sent lane stood
        for."""
        return jnp.zeros(active.shape, jnp.int32)

    def back(self, exchange: Exchange, answer: Any, fill: Any = 0) -> Any:
        """Answers (one per received lane; an array, or a tuple of arrays) back to the lanes
        they came from; ``fill`` (one, or a tuple: one per answer) where a lane was not
        served."""
        raise NotImplementedError

    def index(self) -> jax.Array:
        return jnp.int32(0)

    def global_slots(self, slots: jax.Array) -> jax.Array:
        """Local slots (-1: none) as global slots."""
        return slots

    def total(self, x: Any) -> Any:
        """Sums over the shards (every shard gets the total)."""
        return x

    def most(self, x: Any) -> Any:
        """Maximum over the shards."""
        return x

    def before(self, x: jax.Array) -> jax.Array:
        """Sum of ``x`` over the shards before this one (the order of ties across shards)."""
        return jnp.zeros_like(x)

    def every(self, x: jax.Array) -> jax.Array:
        """``[num_shards, ...]``: each shard's ``x``, on every shard."""
        return jnp.expand_dims(x, 0)


class LocalRouter(Router):
    """One device: the whole table is the shard, nothing moves."""

    def __init__(self, shard_size: int = 0):
        self.shard_size = shard_size

    def keys(self, words, active, extra=(), dedup=False):
        # nothing moves: nothing to deduplicate, every lane served
        return Exchange((words, extra), active, sent=_all_served(active))

    def slots(self, slots, active, extra=(), dedup=False):
        return Exchange((jnp.where(active, slots, -1), extra), active, sent=_all_served(active))

    def back(self, exchange, answer, fill=0):
        return answer


def _all_served(active: jax.Array) -> Sent:
    return Sent(active, jnp.int32(active.shape[0]), jnp.int32(0))


class _Plan(NamedTuple):
    position: jax.Array  # int32 [n]: lane in the send buffer (num_shards * capacity = none)
    served: jax.Array  # bool [n]
    needed: jax.Array  # int32: the fullest buffer (this device)


def _plan(shard: jax.Array, active: jax.Array, num_shards: int, capacity: int) -> _Plan:
    """Lane of each key in the send buffer: buffer ``shard``, in batch order (O(n log n))."""
    n = shard.shape[0]
    dest = jnp.where(active, shard, num_shards)  # inactive keys sort last, go nowhere
    order = jnp.argsort(dest, stable=True)
    counts = jnp.zeros(num_shards + 1, jnp.int32).at[dest].add(1)
    starts = jnp.cumsum(counts) - counts
    sorted_dest = dest[order]
    rank = jnp.zeros(n, jnp.int32).at[order].set(
        jnp.arange(n, dtype=jnp.int32) - starts[sorted_dest], unique_indices=True)
    served = active & (rank < capacity)
    position = jnp.where(served, dest * capacity + rank, num_shards * capacity)
    return _Plan(position, served, jnp.max(counts[:num_shards]))


class AxisRouter(Router):
    """One shard of a table laid along the mesh axis ``axis`` (inside ``shard_map``), with
    routing buffers of ``capacity`` lanes per destination."""

    moves = True

    def __init__(self, axis: str, num_shards: int, shard_size: int, capacity: int):
        self.axis, self.num_shards, self.shard_size = axis, num_shards, shard_size
        self.capacity = capacity

    def _send(self, payload: Any, shard: jax.Array, active: jax.Array,
              words: Words64 | None = None) -> Exchange:
        """``payload`` to ``shard``; with ``words`` (the lanes' keys) each distinct key once."""
        first, weights, send = None, None, active
        if words is not None:
            first = first_occurrences(words, active)
            send = active & (first == jnp.arange(first.shape[0], dtype=jnp.int32))
            weights = jnp.zeros(first.shape[0], jnp.int32).at[
                jnp.where(active, first, first.shape[0])].add(1, mode="drop")
            payload = (payload, weights)
        plan = _plan(shard, send, self.num_shards, self.capacity)
        lanes = self.num_shards * self.capacity

        def scatter(x):
            buf = jnp.zeros((lanes,) + x.shape[1:], x.dtype)
            return buf.at[plan.position].set(x, mode="drop", unique_indices=True)

        arrived = jnp.ones(shard.shape[0], bool)
        received, arrived = _exchange_tree(jax.tree.map(scatter, (payload, arrived)), self.axis)
        if first is not None:
            received, weights = received
        served = plan.served if first is None else take(plan.served, first) & active
        # One psum for both counts: the fullest buffer anywhere, the lanes lost everywhere.
        counts = self.every(jnp.stack([plan.needed, jnp.sum(active & ~served,
                                                            dtype=jnp.int32)]))
        sent = Sent(served, jnp.max(counts[:, 0]), jnp.sum(counts[:, 1]))
        return Exchange(received, arrived, plan, weights, first, sent)

    def keys(self, words, active, extra=(), dedup=False):
        return self._send((words, extra), owner_shard(words.lo, words.hi, self.num_shards),
                          active, words if dedup else None)

    def slots(self, slots, active, extra=(), dedup=False):
        shard = jnp.where(slots >= 0, slots // self.shard_size, 0)
        local = jnp.where(slots >= 0, slots % self.shard_size, -1)
        as_key = Words64(slots.astype(jnp.uint32), jnp.zeros(slots.shape, jnp.uint32))
        return self._send((local, extra), shard, active, as_key if dedup else None)

    def copy_rank(self, exchange, active):
        if exchange.fan is None:
            return jnp.zeros(active.shape, jnp.int32)
        return group_prefix(exchange.fan, active, jnp.ones(active.shape, jnp.int32))

    def back(self, exchange, answer, fill=0):
        lanes = self.num_shards * self.capacity
        position = exchange.plan.position
        if exchange.fan is not None:  # every copy takes its first's answer
            position = take(position, exchange.fan)
        home = _exchange_tree(answer, self.axis)
        served = position < lanes

        def pick(x, fill):
            got = jnp.take(x, jnp.minimum(position, lanes - 1), axis=0)
            return jnp.where(served.reshape(-1, *([1] * (x.ndim - 1))), got,
                             jnp.asarray(fill, x.dtype))

        fills = fill if isinstance(fill, tuple) else jax.tree.map(lambda _: fill, answer)
        return jax.tree.map(pick, home, fills)

    def index(self):
        return jax.lax.axis_index(self.axis).astype(jnp.int32)

    def global_slots(self, slots):
        return jnp.where(slots >= 0, self.index() * np.int32(self.shard_size) + slots, -1)

    def total(self, x):
        return jax.lax.psum(x, self.axis)

    def most(self, x):
        return jax.lax.pmax(x, self.axis)

    def before(self, x):
        every = jax.lax.all_gather(x, self.axis)
        return jnp.sum(jnp.where(jnp.arange(self.num_shards) < self.index(), every, 0),
                       dtype=x.dtype)

    def every(self, x):
        return jax.lax.psum(jnp.zeros((self.num_shards, *x.shape), x.dtype).at[
            self.index()].set(x), self.axis)


def _exchange(x: jax.Array, axis: str) -> jax.Array:
    """Block ``d`` of ``x`` (split along axis 0) goes to device ``d``; received blocks are
    stacked by source. Its own transpose, so gradients flow back the same way."""
    return jax.lax.all_to_all(x, axis, 0, 0, tiled=True)


def _exchange_tree(tree: Any, axis: str) -> Any:
    """:func:`_exchange` of every leaf (all ``[lanes, ...]``) in at most two collectives:
    the float32 leaves side by side in one (differentiable), every other leaf as uint32
    columns in the other. On a few host cores each collective is a rendezvous of every
    device's thread, which costs more than the bytes it moves."""
    leaves, tree_def = jax.tree.flatten(tree)
    if not leaves:
        return tree
    lanes = leaves[0].shape[0]
    out = list(leaves)
    for floats in (True, False):
        group = [i for i, x in enumerate(leaves) if (x.dtype == jnp.float32) == floats]
        if not group:
            continue
        cols = [leaves[i].reshape(lanes, -1) for i in group]
        if not floats:
            cols = [_as_words32(c) for c in cols]
        joined = _exchange(jnp.concatenate(cols, axis=1), axis)
        at = 0
        for i, c in zip(group, cols):
            part = joined[:, at:at + c.shape[1]]
            at += c.shape[1]
            out[i] = (part if floats else _from_words32(part, leaves[i].dtype)).reshape(
                leaves[i].shape)
    return tree_def.unflatten(out)


def _as_words32(x: jax.Array) -> jax.Array:
    if x.dtype.itemsize == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    return x.astype(jnp.uint32)  # bool and small integers: their values fit


def _from_words32(x: jax.Array, dtype) -> jax.Array:
    if np.dtype(dtype).itemsize == 4:
        return jax.lax.bitcast_convert_type(x, dtype)
    return x.astype(dtype)
