"""A table laid along a mesh axis: the :class:`MeshAxis` placement and its table type.

Every array of the local tables gets a leading shard axis laid out with
``NamedSharding(mesh, P(axis))``: shard ``i`` (slots, rows, counts) lives on the ``i``-th
device of the axis and nowhere else (other mesh axes replicate). Each key is held by one
shard (:func:`~jaxops.hashtable._placement.route.owner_shard`); operations run one shard's
function on every device inside ``shard_map`` and route keys with ``all_to_all``
(:class:`~jaxops.hashtable._placement.route.AxisRouter`).

>>> import numpy as np, jax, jaxops.hashtable as ht
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> t = ht.init_table(64, 4, initializer_mode="constant", placement=ht.MeshAxis(mesh, "d"))
>>> t.num_shards, t.shard_size, t.bucket_size, t.values.shape
(1, 64, 64, (1, 64, 4))
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._placement.forwarding import forward_unchanged
from jaxops.hashtable._placement.placement import Placement, shard_size_of
from jaxops.hashtable._placement.route import AxisRouter, RouteInfo, Sent
from jaxops.hashtable._table.table import HashTable
from jaxops.hashtable._table.words64 import Counter64, sum_counters

__all__ = ["MeshAxis", "ShardedHashTable", "expand", "global_replicated", "squeeze"]


@dataclasses.dataclass(frozen=True)
class MeshAxis(Placement):
    """One shard per device along ``mesh``'s axis ``axis``, each key held by one shard.

    Attributes:
        mesh: the ``jax.sharding.Mesh``.
        axis: the name of the axis the shards lie along.
    """

    mesh: Mesh
    axis: str
    routes = True

    def __post_init__(self):
        if not isinstance(self.mesh, Mesh):
            raise OpArgumentError("MeshAxis", "mesh", "a jax.sharding.Mesh",
                                  type(self.mesh).__name__)
        if self.axis not in self.mesh.shape:
            raise OpArgumentError("MeshAxis", "axis", "one of the mesh's axes "
                                  f"{tuple(self.mesh.axis_names)}", repr(self.axis))

    def __repr__(self) -> str:
        return f"MeshAxis(axis={self.axis!r}, num_shards={self.num_shards})"

    @property
    def num_shards(self) -> int:
        return int(self.mesh.shape[self.axis])

    @property
    def sharding(self) -> NamedSharding:
        """The sharding of every per-shard array (leading axis along ``axis``)."""
        return NamedSharding(self.mesh, P(self.axis))

    def storage(self, table):
        return table.shards

    def with_storage(self, table, storage, unrouted=None):
        if isinstance(table, ShardedHashTable):
            count = table.unrouted if unrouted is None else (  # int32 with x64 on too
                table.unrouted + jnp.asarray(unrouted, jnp.int32))
            return ShardedHashTable(storage, count, self, table.route_capacity)
        return ShardedHashTable(storage, replicated_int(self.mesh, 0), self)

    def map(self, local, statics, state, replicated=None, *, donate=False):
        fn = _mesh_map(local, statics, self.mesh, self.axis, shard_size_of(state), donate)
        return fn(state, global_replicated(self.mesh, replicated))

    def call(self, local, statics, state, batch, replicated=None, *, capacity=None,
             donate=False):
        n = int(jax.tree.leaves(batch)[0].shape[0])
        capacity = self.batch_capacity("call", n, capacity)
        fn = _mesh_call(local, statics, self.mesh, self.axis, shard_size_of(state), n,
                        self.local_batch(n), capacity, donate)
        new, per_key, totals, sent = fn(
            state, global_replicated(self.mesh, batch), global_replicated(self.mesh, replicated))
        return new, per_key, totals, RouteInfo(*sent, jnp.int32(capacity))

    def build(self, make, statics, replicated=None):
        return _mesh_build(make, statics, self.mesh, self.axis)(
            global_replicated(self.mesh, replicated))

    def to_host(self, x):
        # replicated first: a process can read only the devices it holds
        return np.asarray(jax.device_get(_replicator(self.mesh)(x)))

    def local_shards(self, storage: HashTable) -> dict[int, HashTable]:
        """``{shard index: HashTable}`` for the shards this process holds (one device's copy
        each), without moving them: the local tables live on their devices."""
        leaves, tree = jax.tree.flatten(storage)
        out: dict[int, list] = {}
        for leaf_no, leaf in enumerate(leaves):
            for piece in leaf.addressable_shards:
                row = out.setdefault(piece.index[0].start or 0, [None] * len(leaves))
                if row[leaf_no] is None:  # else a replica along another mesh axis
                    row[leaf_no] = piece.data[0]
        return {i: tree.unflatten(row) for i, row in sorted(out.items())}

    def local_batch(self, n: int) -> int:
        """Keys per device for a batch of ``n`` keys (padded to a multiple of the shards)."""
        return max(1, -(-n // self.num_shards))

    def batch_capacity(self, op, n, capacity):
        most = self.local_batch(n)
        if capacity is None:
            return most
        if isinstance(capacity, (bool, np.bool_)) or not isinstance(
                capacity, (int, np.integer)) or int(capacity) < 1:
            raise OpArgumentError(op, "route_capacity", "None or an int >= 1 (keys per "
                                  "destination buffer)", repr(capacity))
        return min(int(capacity), most)


def squeeze(tree: Any) -> Any:
    """A shard's view inside ``shard_map``: drop the leading shard axis of every leaf."""
    return jax.tree.map(lambda x: x[0], tree)


def expand(tree: Any) -> Any:
    """The inverse of :func:`squeeze`."""
    return jax.tree.map(lambda x: jnp.expand_dims(x, 0), tree)


@functools.lru_cache(maxsize=256)
def _mesh_map(local, statics, mesh, axis, shard_size, donate):
    shards = int(mesh.shape[axis])

    def shard(state, replicated):  # one shard's view: unchanged leaves are forwarded
        return local(AxisRouter(axis, shards, shard_size, 0), statics, state, replicated)

    shard, bind = forward_unchanged(shard, donate)

    def body(state, replicated):
        new, out = shard(squeeze(state), replicated)
        return expand(new), expand(out)

    spec = P(axis)
    return bind(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, P()),
                                      out_specs=(spec, spec)),
                        donate_argnums=(0,) if donate else ()))


@functools.lru_cache(maxsize=256)
def _mesh_call(local, statics, mesh, axis, shard_size, n, per_device, capacity, donate):
    shards = int(mesh.shape[axis])
    padded = per_device * shards

    def shard(state, batch, active, replicated):  # one shard's view, as _mesh_map's
        return local(AxisRouter(axis, shards, shard_size, capacity), statics, state, batch,
                     active, replicated)

    shard, bind = forward_unchanged(shard, donate)

    def body(state, batch, active, replicated):
        new, per_key, totals, sent = shard(squeeze(state), batch, active, replicated)
        return expand(new), per_key, totals, sent

    spec = P(axis)
    mapped = jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec, P()),
                           out_specs=(spec, spec, P(), Sent(spec, P(), P())))
    # The answers leave replicated (one all-gather each): the code around a lookup slices
    # and reshapes them freely, which on lane-sharded arrays costs XLA a collective permute
    # per unaligned piece (342 in a DLRM step, measured).
    whole = NamedSharding(mesh, P())

    def run(state, batch, replicated):
        # A replicated batch too: each device slices its part locally, and no lane sharding
        # spreads back into the code that built the batch.
        batch = jax.lax.with_sharding_constraint(batch, whole)
        pad = lambda x: jnp.pad(x, [(0, padded - n)] + [(0, 0)] * (x.ndim - 1))  # noqa: E731
        active = jnp.arange(padded) < n
        new, per_key, totals, (served, needed, lost) = mapped(
            state, jax.tree.map(pad, batch), active, replicated)
        cut = lambda x: jax.lax.with_sharding_constraint(x, whole)[:n]  # noqa: E731
        return new, jax.tree.map(cut, per_key), totals, (cut(served), needed, lost)

    return bind(jax.jit(run, donate_argnums=(0,) if donate else ()))


@functools.lru_cache(maxsize=64)
def _mesh_build(make, statics, mesh, axis):
    shards = int(mesh.shape[axis])

    def body(replicated):
        return expand(make(AxisRouter(axis, shards, 0, 0), statics, replicated))

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(axis)))


def global_replicated(mesh: Mesh, tree: Any) -> Any:
    """With several processes, host-local inputs become global arrays replicated on
    ``mesh`` (every process passes the same values); with one process, and for arrays that
    are already global or traced inside ``jit``, nothing changes."""
    if jax.process_count() == 1:
        return tree
    sharding = NamedSharding(mesh, P())

    def put(x):
        if isinstance(x, jax.core.Tracer) or (isinstance(x, jax.Array)
                                               and not x.is_fully_addressable):
            return x
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(put, tree)


@functools.lru_cache(maxsize=16)
def _replicator(mesh: Mesh):
    return jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P()))


def replicated_int(mesh: Mesh, value: int) -> jax.Array:
    """A replicated int32 scalar on ``mesh`` (the :attr:`ShardedHashTable.unrouted` count)."""
    return jax.device_put(np.int32(value), NamedSharding(mesh, P()))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ShardedHashTable:
    """A hash table sharded by key over a mesh axis (see the module docstring).

    Attributes:
        shards: a :class:`HashTable` whose every leaf has a leading axis of ``num_shards``
            (``values``: ``[num_shards, shard_size, dim]``; ``live``: ``[num_shards]``).
        unrouted: int32 scalar (replicated): keys so far that did not fit a routing buffer
            (``route_capacity``) in a call that returned this table, so were not served
            (each call's info also reports its own); never lost silently.
        placement: static; the :class:`MeshAxis` the shards lie along.
        route_capacity: static; the routing buffers' lanes per destination of every call
            that does not give one (None: each device's batch slice, which nothing
            overflows). :func:`~jaxops.hashtable._ops.maintaining.maintain` sets it from what steps
            needed.
    """

    shards: HashTable
    unrouted: jax.Array
    placement: MeshAxis = dataclasses.field(metadata={"static": True})
    route_capacity: int | None = dataclasses.field(default=None, metadata={"static": True})

    @property
    def mesh(self) -> Mesh:
        return self.placement.mesh

    @property
    def axis(self) -> str:
        return self.placement.axis

    @property
    def num_shards(self) -> int:
        return self.placement.num_shards

    @property
    def shard_size(self) -> int:
        """Slots per shard."""
        return self.shards.bucket_size

    @property
    def bucket_size(self) -> int:
        """Slots in all (``num_shards * shard_size``)."""
        return self.num_shards * self.shard_size

    @property
    def embedding_dim(self) -> int:
        return self.shards.embedding_dim

    @property
    def key_dtype(self) -> str:
        """The keys' dtype, ``"int64"`` or ``"uint64"``."""
        return self.shards.key_dtype

    @property
    def values(self) -> jax.Array:
        """float32 ``[num_shards, shard_size, dim]``: differentiate through ``replace``."""
        return self.shards.values

    @property
    def live(self) -> jax.Array:
        """Live keys of all shards (int32 scalar)."""
        return jnp.sum(self.shards.live)

    @property
    def not_exported(self) -> jax.Array:
        return jnp.sum(self.shards.not_exported)

    @property
    def dropped(self) -> Counter64:
        """Insertions that found no free slot, over all shards (a :class:`Counter64`, as one
        table's; ``int(table.dropped)`` reads it, and it works inside ``jit``)."""
        return sum_counters(self.shards.dropped)

    @property
    def max_live(self) -> int:
        """The most live keys an insert may leave in one shard."""
        return self.shards.max_live

    @property
    def sharding(self) -> NamedSharding:
        return self.placement.sharding

    def replace(self, **changes) -> "ShardedHashTable":
        """A copy with fields of the local tables replaced (``values=...``), or ``shards=``
        (``unrouted=``, ``route_capacity=``)."""
        if {"shards", "unrouted", "route_capacity"} & set(changes):
            return dataclasses.replace(self, **changes)
        return dataclasses.replace(self, shards=self.shards.replace(**changes))

    def __repr__(self) -> str:
        return (f"ShardedHashTable(num_shards={self.num_shards}, shard_size={self.shard_size}, "
                f"embedding_dim={self.embedding_dim}, axis={self.axis!r})")
