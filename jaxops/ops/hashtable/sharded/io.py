"""Whole-table operations on a sharded table: ``export``, ``resize``, and moving shards.

``export`` runs the single-table export on every shard and joins the results into one
DynArray per output: shard 0's entries first, each shard's in ascending slot order.
``resize`` resizes every shard (each key stays with its owner). :func:`local_shards` and
:func:`assemble` move whole shards between the devices and the host, for checkpoints.

>>> import numpy as np, jax, jaxops, jaxops.hashtable as ht
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> t = ht.init_sharded_table(16, 2, mesh, "d", initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([5, 6], np.int64))
>>> t, keys, counters, flags, values = ht.export(t)
>>> sorted(ht.to_host_int64(jaxops.refresh(keys)).tolist()), ht.resize(t, 64).shard_size
([5, 6], 64)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError
from jaxops.ops.compaction import compact_indices
from jaxops.ops.hashtable.export import _export_one, mark_exported
from jaxops.ops.hashtable.export_chunks import _chunks as host_chunks
from jaxops.ops.hashtable.export_chunks import check_chunk_args
from jaxops.ops.hashtable.load import set_load_policy as set_load_policy_one
from jaxops.ops.hashtable.opdefs import EXPORT as EXPORT_OP
from jaxops.ops.hashtable.resize import resize as resize_one
from jaxops.ops.hashtable.sharded.table import (ShardedHashTable, check_sharded, expand, squeeze,
                                                to_host)
from jaxops.ops.hashtable.table import HashTable, check_bucket_size

__all__ = ["assemble", "compact", "export", "export_chunks", "local_shards", "resize",
           "set_load_policy"]


def export(table: ShardedHashTable, *, export_mode: str = "all",
           filtered_export_flag: bool = False, size: int | None = None):
    """:func:`~jaxops.ops.hashtable.export.export` of every shard, joined.

    Args:
        size: capacity per shard (default ``shard_size``); the joined outputs have max shape
            ``num_shards * size`` and their ``true_shape`` counts every qualifying entry.

    Returns:
        ``(table, keys, counters, filter_flags, values)``: the table with the exported
        entries marked, and four :class:`DynArray`\\ s (formats as for one table).
    """
    op = EXPORT_OP.name
    table = check_sharded(op, table)
    if export_mode not in ("all", "new"):
        raise OpArgumentError(op, "export_mode", "'all' or 'new'", repr(export_mode))
    cap = table.shard_size if size is None else check_bucket_size(op, size, "size")
    fn = _exporter(table.mesh, table.axis, export_mode, bool(filtered_export_flag), cap)
    shards, outs = fn(table.shards)
    return (table.replace(shards=shards), *outs)


@functools.lru_cache(maxsize=64)
def _exporter(mesh, axis, export_mode, filtered, cap):
    spec = P(axis)

    def local(shards):
        t = squeeze(shards)
        outs = _export_one(t, export_mode, filtered, cap)
        data = tuple(d.data for d in outs)
        kept, count = outs[2].actual_shape[0], outs[2].true_shape[0]
        marked = mark_exported(t, export_mode, filtered, cap)
        return expand(marked), expand(data), kept[None], jax.lax.psum(count, axis)

    mapped = jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=(spec, spec, spec, P()))

    def run(shards):
        marked, data, kept, count = mapped(shards)
        shards_n = kept.shape[0]
        mask = (jnp.arange(cap)[None, :] < kept[:, None]).reshape(-1)
        idx, total = compact_indices(mask, shards_n * cap)
        pick = jnp.maximum(idx, 0)
        outs = []
        for d, fill in zip(data, (-1, 0, 0, 0)):
            flat = d.reshape(shards_n * cap, *d.shape[2:])
            fill = np.uint32(0xFFFFFFFF) if (fill == -1 and flat.ndim == 2
                                             and flat.dtype == jnp.uint32) else fill
            joined = jnp.where((idx >= 0).reshape(-1, *([1] * (flat.ndim - 1))),
                               flat[pick], jnp.asarray(fill, flat.dtype))
            tail = list(flat.shape[1:])
            outs.append(DynArray(joined, jnp.stack([total, *map(jnp.int32, tail)]),
                                 true_shape=jnp.stack([count, *map(jnp.int32, tail)]),
                                 fill_value=int(fill) if flat.dtype != jnp.float32 else 0.0))
        return marked, tuple(outs)

    return jax.jit(run)


def export_chunks(table: ShardedHashTable, chunk_slots: int | None = None, *,
                  export_mode: str = "all", filtered_export_flag: bool = False):
    """:func:`~jaxops.ops.hashtable.export_chunks.export_chunks` of every shard this process
    holds, shard after shard: ``(table, chunks)`` with every shard's exported entries marked
    and chunks of **global** slots (``shard * shard_size + slot``), in ascending order.
    With several processes each process streams its own shards (together: the table)."""
    table = check_sharded("export_chunks", table)
    chunk_slots = check_chunk_args(table.embedding_dim, chunk_slots, export_mode)
    filtered = bool(filtered_export_flag)
    chunks = _global_chunks(local_shards(table), table.shard_size, chunk_slots, export_mode,
                            filtered)
    marked = _marker(table.mesh, table.axis, export_mode, filtered)
    return table.replace(shards=marked(table.shards)), chunks


def _global_chunks(local: dict, shard_size: int, chunk_slots: int, export_mode: str,
                   filtered: bool):
    for i, t in local.items():
        for chunk in host_chunks(t, chunk_slots, export_mode, filtered):
            yield chunk._replace(slots=chunk.slots + i * shard_size)


@functools.lru_cache(maxsize=16)
def _marker(mesh, axis, export_mode, filtered):
    def local(shards):
        t = squeeze(shards)
        return expand(mark_exported(t, export_mode, filtered, t.bucket_size))

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P(axis), out_specs=P(axis)))


def resize(table: ShardedHashTable, new_num_slots: int, *, initializer_mode: str = "constant",
           constant_value: float = 0.0, key: jax.Array | None = None) -> ShardedHashTable:
    """Every shard rehashed into ``ceil(new_num_slots / num_shards)`` slots (keys keep their
    owner; see :func:`~jaxops.ops.hashtable.resize.resize`). With a PRNG ``key``, shard
    ``i``'s free rows are drawn with ``fold_in(key, i)``.

    Raises:
        OpArgumentError: a shard's live keys do not fit its new size (checked eagerly).
    """
    op = "resize"
    table = check_sharded(op, table)
    new_num_slots = check_bucket_size(op, new_num_slots, "new_num_slots")
    per = -(-new_num_slots // table.num_shards)
    live = table.shards.live
    if not isinstance(live, jax.core.Tracer):
        most = int(np.max(to_host(table, live)))
        if most > per:
            raise OpArgumentError(op, "new_num_slots", f"at least {most} slots per shard (the "
                                  "live keys of the fullest shard)", f"{per} per shard")
    fn = _resizer(table.mesh, table.axis, per, initializer_mode, float(constant_value),
                  key is not None)
    return table.replace(shards=fn(table.shards, key))


def compact(table: ShardedHashTable, **init) -> ShardedHashTable:
    """Every shard rebuilt at its size without tombstones (see
    :func:`~jaxops.ops.hashtable.resize.compact`)."""
    return resize(check_sharded("compact", table), table.bucket_size, **init)


def set_load_policy(table: ShardedHashTable, **policy) -> ShardedHashTable:
    """Every shard's load limit and policy (see
    :func:`~jaxops.ops.hashtable.load.set_load_policy`); the limit applies per shard."""
    table = check_sharded("set_load_policy", table)
    return table.replace(shards=set_load_policy_one(table.shards, **policy))


@functools.lru_cache(maxsize=32)
def _resizer(mesh, axis, per, initializer_mode, constant_value, has_key):
    def local(shards, key):
        if has_key:
            key = jax.random.fold_in(key, jax.lax.axis_index(axis))
        return expand(resize_one(squeeze(shards), per, initializer_mode=initializer_mode,
                                 constant_value=constant_value, key=key if has_key else None))

    spec = P(axis)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec, P()), out_specs=spec))


def local_shards(table: ShardedHashTable) -> dict[int, HashTable]:
    """``{shard index: HashTable}`` for the shards this process holds (one device's copy
    each), without moving them: the local tables live on their devices."""
    leaves, tree = jax.tree.flatten(table.shards)
    out: dict[int, list] = {}
    for leaf_no, leaf in enumerate(leaves):
        for piece in leaf.addressable_shards:
            row = out.setdefault(piece.index[0].start or 0, [None] * len(leaves))
            if row[leaf_no] is None:  # else a replica along another mesh axis
                row[leaf_no] = piece.data[0]
    return {i: tree.unflatten(row) for i, row in sorted(out.items())}


def assemble(shards: dict[int, HashTable], mesh, axis: str, total: int) -> HashTable:
    """A sharded ``HashTable`` pytree (leading shard axis) from this process's local tables
    (``{shard index: table}``, one per shard its devices hold), without gathering."""
    sharding = NamedSharding(mesh, P(axis))
    some = next(iter(shards.values()))
    leaves = {i: jax.tree.leaves(t) for i, t in shards.items()}
    out = []
    for k, leaf in enumerate(jax.tree.leaves(some)):
        shape = (total,) + tuple(leaf.shape)
        index_map = sharding.addressable_devices_indices_map(shape)
        arrays = [jax.device_put(jnp.expand_dims(leaves[idx[0].start or 0][k], 0), device)
                  for device, idx in index_map.items()]
        out.append(jax.make_array_from_single_device_arrays(shape, sharding, arrays))
    return jax.tree.unflatten(jax.tree.structure(some), out)
