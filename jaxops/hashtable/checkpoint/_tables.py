"""Restoring a table and its optimizer states onto the target's placement, one chunk of
slots at a time (:class:`~jaxops.hashtable.checkpoint._saved.SavedTable` reads and checks them).

**Same layout** (as many shards of as many slots as saved, on any placement of that many
shards; or as many shards and an abstract target, which takes the saved size: a table that
grew while training comes back grown): every shard the process holds is preallocated on its
device(s) and filled chunk by chunk in place, so a restore needs the new table plus one
chunk. **Another layout**: the keys are re-owned (:mod:`~jaxops.hashtable.checkpoint._reown`).

>>> import os, tempfile, jax, numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(16, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.arange(5, dtype=np.int64))
>>> path = os.path.join(tempfile.mkdtemp(), "t")
>>> ht.save(t, path)
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> target = jax.eval_shape(lambda: ht.init_table(16, 2, initializer_mode="constant",
...                                               placement=ht.MeshAxis(mesh, "d")))
>>> back = ht.load(path, target)  # one shard of 16 slots: the same layout, on a mesh
>>> type(back).__name__, int(back.live)
('ShardedHashTable', 5)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding

from jaxops.core.errors import OpArgumentError
from jaxops.core.memory import refuse_unless_fits
from jaxops.hashtable._placement.on_mesh import ShardedHashTable
from jaxops.hashtable._table.table import HashTable
from jaxops.hashtable._table.words64 import Counter64
from jaxops.hashtable.checkpoint._read import StoredArrays
from jaxops.hashtable.checkpoint._reown import reown
from jaxops.hashtable.checkpoint._saved import SavedTable, check_state_shapes, put_small, state_from
from jaxops.hashtable.checkpoint._tree import SHARD_FIELDS, SLOT_FIELDS, StatePart, TablePart

__all__ = ["restore_table"]


def restore_table(stored: StoredArrays, body: dict, target: TablePart,
                  states: list[StatePart]) -> tuple[Any, dict[str, Any]]:
    """``(table, {state name: state})``: the saved table ``target.name`` and its states,
    on ``target``'s placement (see the module docstring).

    Raises:
        CheckpointError: a checksum mismatch or content that is not a valid table.
        OpArgumentError: another layout with an abstract target, a target of another row
            width or row dtype, or entries that do not fit the target's shards.
    """
    saved = body["tables"][target.name]
    if saved["embedding_dim"] != target.storage.embedding_dim:
        raise OpArgumentError("restore", f"target {target.where}", f"a table of embedding_dim "
                              f"{saved['embedding_dim']} (as saved)",
                              f"embedding_dim {target.storage.embedding_dim}")
    rows = body["leaves"][f"{target.name}.values"]["dtype"]
    if rows != str(target.storage.values.dtype):
        raise OpArgumentError("restore", f"target {target.where}", f"a table of {rows} rows "
                              "(as saved)", f"{target.storage.values.dtype} rows",
                              f"Make the target with init_table(..., dtype=jnp.{rows}); to "
                              "change a table's row dtype, export it and import_ it into a "
                              "new table.")
    for s in states:
        check_state_shapes(body, saved, target, s)
    reader = SavedTable(stored, body, target.name, saved, states, target)
    abstract = [(what, x) for what, x in [(target.where, target.storage.values)] + [
        (s.where, leaf) for s in states for leaf in jax.tree.leaves(s.state)]
        if not isinstance(x, jax.Array)]
    if saved["num_shards"] == target.num_shards and (
            saved["shard_size"] == target.shard_size or abstract):
        if saved["shard_size"] != target.shard_size:  # the saved size, checked it fits
            refuse_unless_fits("restore", f"target {target.where}",
                               reader.per * reader.slot_bytes,
                               f"{stored.directory!r} holds table {target.name!r} of "
                               f"{saved['num_shards']} x {saved['shard_size']} slots",
                               _devices(target))
        return _same_layout(reader, target, states)
    for what, x in abstract:
        raise OpArgumentError(
            "restore", f"target {what}", "concrete arrays (init_table / opt.init) to "
            f"restore {saved['num_shards']} x {saved['shard_size']} slots onto "
            f"{target.num_shards} x {target.shard_size}: their rows are what free slots "
            "keep (an abstract target takes the saved size with as many shards)",
            f"{type(x).__name__} leaves")
    return reown(reader, target, states)


def _devices(target: TablePart):
    return target.table.placement.mesh.devices.flat if target.sharded else None


def _holders(target: TablePart) -> tuple[Any, dict[int, list]]:
    """``(sharding or device, {shard: [local devices holding it]})``."""
    if not target.sharded:
        sharding = getattr(target.storage.values, "sharding", None)
        device = next(iter(sharding.device_set)) if sharding is not None else jax.local_devices()[0]
        return device, {0: [device]}
    placement = target.table.placement
    held: dict[int, list] = {}
    for device, idx in placement.sharding.addressable_devices_indices_map(
            (target.num_shards,)).items():
        held.setdefault(idx[0].start or 0, []).append(device)
    return placement.sharding, held


@functools.partial(jax.jit, static_argnums=2, donate_argnums=0)
def _write(bufs: tuple, rows: tuple, axis: int, start) -> tuple:
    return tuple(lax.dynamic_update_slice_in_dim(b, r.astype(b.dtype), start, axis)
                 for b, r in zip(bufs, rows))


def _same_layout(saved: SavedTable, target: TablePart, states: list[StatePart]):
    where, held = _holders(target)
    lead = 1 if target.sharded else 0
    shapes = {n: tuple(saved.stored.leaves[n]["shape"][2 if saved.sharded else 1:])
              for n in saved.slot_names}
    dtypes = {n: saved.stored.leaves[n]["dtype"] for n in saved.slot_names}
    pieces: dict[str, dict] = {n: {} for n in saved.slot_names}
    for i in sorted(held):
        first = held[i][0]
        bufs = {d: tuple(jnp.zeros((1,) * lead + (saved.per,) + shapes[n], dtypes[n], device=d)
                         for n in saved.slot_names) for d in held[i]}
        put = lambda rows: tuple(jax.device_put(r.reshape((1,) * lead + r.shape), first)  # noqa: E731
                                 for r in rows)
        for a, _, _, moved in saved.chunks(i, put):
            for d in held[i]:
                bufs[d] = _write(bufs[d], moved if d == first else jax.device_put(moved, d),
                                 lead, jnp.int32(a))
            # Written before the next chunk is read: chunks cannot queue up behind a busy
            # device, and the chunk's buffers are free when the reader trims the heap.
            jax.block_until_ready(bufs)
        for d, arrays in bufs.items():
            for n, x in zip(saved.slot_names, arrays):
                pieces[n][d] = x
    if target.sharded:
        full = {n: _assemble(where, (target.num_shards, saved.per) + shapes[n], pieces[n])
                for n in saved.slot_names}
    else:
        full = {n: pieces[n][where] for n in saved.slot_names}

    def small(name: str) -> jax.Array:  # a per-shard array, laid out as the target's
        host = saved.counts.get(name[len(saved.name) + 1:]) if name.startswith(
            saved.name + ".") else None
        host = saved.whole(name) if host is None else host
        tail = host.shape[1:] if saved.sharded else host.shape
        return put_small(host.reshape((target.num_shards,) * lead + tail), target, where)

    table = _table(saved, target, {f: full[f"{saved.name}.{f}"] for f in SLOT_FIELDS},
                   {f: small(f"{saved.name}.{f}") for f in SHARD_FIELDS}, where)
    out = {}
    for s in states:
        names = saved.body["states"][s.name]
        leaves = {n: full[n] for n in names["slot"]}
        leaves.update({n: small(n) for n in names["shard"]})
        out[s.name] = state_from(s, leaves)
    return table, out


def _assemble(sharding: NamedSharding, shape: tuple, pieces: dict) -> jax.Array:
    index = sharding.addressable_devices_indices_map(shape)
    return jax.make_array_from_single_device_arrays(shape, sharding,
                                                    [pieces[d] for d in index])


def _table(saved: SavedTable, target: TablePart, slots: dict, counts: dict, where) -> Any:
    storage = HashTable(**slots, live=counts["live"], not_exported=counts["not_exported"],
                        dropped=Counter64(counts["dropped.lo"], counts["dropped.hi"]),
                        clock=counts["clock"], **saved.statics)
    if not target.sharded:
        return storage
    unrouted = saved.whole(f"{saved.name}.unrouted") if saved.sharded else np.int32(0)
    return ShardedHashTable(storage, put_small(np.asarray(unrouted, np.int32), target, where),
                            target.table.placement, saved.route_capacity)
