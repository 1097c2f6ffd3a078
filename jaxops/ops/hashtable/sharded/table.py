"""``ShardedHashTable``: one local :class:`HashTable` per device along a mesh axis.

Every array of the local tables gets a leading shard axis laid out with
``NamedSharding(mesh, P(axis))``: shard ``i`` (slots, rows, counts) lives on the ``i``-th
device of the axis and nowhere else. A key belongs to exactly one shard, its **owner**:
MurmurHash3 of the key with seed :data:`OWNER_SEED`, modulo the number of shards. The slot
inside the owner uses the seed-0 hash (:func:`~jaxops.ops.hashtable.murmur.home_slot`), an
independent hash, so the keys of one shard spread over all its slots.

>>> import numpy as np, jax, jaxops.hashtable as ht
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> t = ht.init_sharded_table(64, 4, mesh, "d", initializer_mode="constant")
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
from jaxops.ops.hashtable.create import init_table
from jaxops.ops.hashtable.murmur import murmur3_x86_32
from jaxops.ops.hashtable.table import HashTable, check_bucket_size

__all__ = ["OWNER_SEED", "ShardedHashTable", "init_sharded_table", "owner_shard"]

#: Seed of the hash that picks a key's owner shard (slots use seed 0: independent bits).
OWNER_SEED = np.uint32(0x9E3779B9)


def owner_shard(lo: jax.Array, hi: jax.Array, num_shards: int) -> jax.Array:
    """The shard that owns each key (int32): ``murmur3(key, OWNER_SEED) % num_shards``."""
    return (murmur3_x86_32(lo, hi, OWNER_SEED) % np.uint32(num_shards)).astype(jnp.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ShardedHashTable:
    """A hash table sharded by key over the mesh axis ``axis`` (see the module docstring).

    Attributes:
        shards: a :class:`HashTable` whose every leaf has a leading axis of ``num_shards``
            (``values``: ``[num_shards, shard_size, dim]``; ``live``: ``[num_shards]``).
        unrouted: int32 scalar (replicated): keys so far that did not fit a routing buffer
            (``route_capacity``) in a call that returned this table, so were not served
            (each call's info also reports its own); never lost silently.
        mesh, axis: static; the mesh and the name of the axis the shards lie along.
    """

    shards: HashTable
    unrouted: jax.Array
    mesh: Mesh = dataclasses.field(metadata={"static": True})
    axis: str = dataclasses.field(metadata={"static": True})

    @property
    def num_shards(self) -> int:
        return int(self.mesh.shape[self.axis])

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
        """The keys' dtype, ``"int64"`` or ``"uint64"`` (``init_sharded_table(...,
        key_dtype=)``)."""
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
    def dropped(self) -> int:
        """Insertions that found no free slot, summed over the shards (host int)."""
        lo, hi = to_host(self, (self.shards.dropped.lo, self.shards.dropped.hi))
        return int(np.sum(np.asarray(hi, np.uint64) << np.uint64(32)
                          | np.asarray(lo, np.uint64), dtype=np.uint64))

    @property
    def sharding(self) -> NamedSharding:
        """The sharding of every per-shard array (leading axis along ``axis``)."""
        return NamedSharding(self.mesh, P(self.axis))

    def replace(self, **changes) -> "ShardedHashTable":
        """A copy with fields of the local tables replaced (``values=...``), or ``shards=``
        (and ``unrouted=``)."""
        if "shards" in changes or "unrouted" in changes:
            return dataclasses.replace(self, **changes)
        return dataclasses.replace(self, shards=self.shards.replace(**changes))

    def after_call(self, shards: HashTable, lost: jax.Array) -> "ShardedHashTable":
        """The table a call returns: new ``shards``, ``lost`` keys added to ``unrouted``."""
        return dataclasses.replace(self, shards=shards, unrouted=self.unrouted + lost)

    def __repr__(self) -> str:
        return (f"ShardedHashTable(num_shards={self.num_shards}, shard_size={self.shard_size}, "
                f"embedding_dim={self.embedding_dim}, axis={self.axis!r})")


def to_host(table: ShardedHashTable, tree: Any) -> Any:
    """Arrays on ``table``'s mesh (sharded or not) on the host, in every process (a
    sharded array of several processes is replicated first)."""
    return jax.tree.map(np.asarray, jax.device_get(_replicator(table.mesh)(tree)))


@functools.lru_cache(maxsize=16)
def _replicator(mesh: Mesh):
    return jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P()))


def check_sharded(op: str, table: Any, arg: str = "table") -> ShardedHashTable:
    if not isinstance(table, ShardedHashTable):
        raise OpArgumentError(op, arg, "a jaxops.hashtable.ShardedHashTable "
                              "(from init_sharded_table)", type(table).__name__)
    return table


def refuse_donate(op: str, donate: bool) -> None:
    """``donate=True`` is for one table's eager calls; a sharded table is donated to a jitted
    step instead (refused by name)."""
    if donate:
        raise OpArgumentError(op, "donate", "False for a ShardedHashTable (donate it to a "
                              "jitted step with donate_argnums)", "True")


def check_mesh_axis(op: str, mesh: Any, axis: Any) -> int:
    """The size of ``axis`` in ``mesh`` (errors name what was given)."""
    if not isinstance(mesh, Mesh):
        raise OpArgumentError(op, "mesh", "a jax.sharding.Mesh", type(mesh).__name__)
    if axis not in mesh.shape:
        raise OpArgumentError(op, "axis", f"one of the mesh's axes {tuple(mesh.axis_names)}",
                              repr(axis))
    return int(mesh.shape[axis])


def init_sharded_table(num_slots: int, embedding_dim: int, mesh: Mesh, axis: str,
                       **init_kwargs) -> ShardedHashTable:
    """A new sharded table of ``num_slots`` slots in all, created on its devices.

    Each of the ``n = mesh.shape[axis]`` shards gets ``ceil(num_slots / n)`` slots and is
    built on its own device (no full table on one device).

    Args:
        num_slots: slots in all (rounded up to a multiple of the shard count).
        embedding_dim: floats per row.
        mesh, axis: the mesh and the axis to shard along (other mesh axes replicate).
        init_kwargs: :func:`~jaxops.ops.hashtable.create.init_table`'s keywords. With
            ``initializer_mode="random"`` and a PRNG ``key``, shard ``i`` draws with
            ``fold_in(key, i)``; ``sampled_values`` (``[num_slots, dim]``) are split by shard.
    """
    op = "init_sharded_table"
    shards = check_mesh_axis(op, mesh, axis)
    num_slots = check_bucket_size(op, num_slots, "num_slots")
    per = -(-num_slots // shards)
    key, sampled = init_kwargs.pop("key", None), init_kwargs.pop("sampled_values", None)
    if sampled is not None:
        sampled = jnp.asarray(sampled, jnp.float32)
        if sampled.size != per * shards * embedding_dim:
            raise OpArgumentError(op, "sampled_values", f"{per * shards} x {embedding_dim} "
                                  "values (the rounded-up num_slots x embedding_dim)",
                                  f"shape {tuple(sampled.shape)}")
        sampled = sampled.reshape(shards, per, embedding_dim)
    make = _initializer(mesh, axis, per, int(embedding_dim), tuple(sorted(init_kwargs.items())),
                        key is not None, sampled is not None)
    return ShardedHashTable(make(key, sampled), unrouted_count(mesh, 0), mesh, axis)


@functools.lru_cache(maxsize=32)
def _initializer(mesh, axis, per, dim, kwargs, has_key, has_sampled):
    def local(key, sampled):
        if has_key:
            key = jax.random.fold_in(key, jax.lax.axis_index(axis))
        table = init_table(per, dim, key=key if has_key else None,
                           sampled_values=sampled[0] if has_sampled else None, **dict(kwargs))
        return expand(table)

    spec = P(axis)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), spec), out_specs=spec))


def unrouted_count(mesh: Mesh, value: int) -> jax.Array:
    """A replicated int32 scalar on ``mesh`` (the :attr:`ShardedHashTable.unrouted` count)."""
    return jax.device_put(np.int32(value), NamedSharding(mesh, P()))


def squeeze(tree: Any) -> Any:
    """A shard's view inside ``shard_map``: drop the leading shard axis of every leaf."""
    return jax.tree.map(lambda x: x[0], tree)


def expand(tree: Any) -> Any:
    """The inverse of :func:`squeeze`."""
    return jax.tree.map(lambda x: jnp.expand_dims(x, 0), tree)
