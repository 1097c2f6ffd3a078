"""Restoring a table onto another layout (another shard count, or another size): the keys
are re-owned, and each optimizer state's rows move with their keys.

The target's tables must be concrete (``init_table``): their rows are the rows free slots
keep (the initializer), and the target's states give the rows a slot starts from. Each
saved shard is read chunk by chunk (:class:`~jaxops.hashtable.checkpoint._saved.SavedTable`) and
handed to every new shard, which takes the live entries it owns
(:func:`~jaxops.hashtable._placement.route.owner_shard`), rehashed in ascending saved slot order
(:func:`~jaxops.hashtable._kernels.rehash_kernel.rehash_slots`, in a ``placement.map`` frame: the
same code on one device and on a mesh); each state's rows move with their keys
(:func:`~jaxops.hashtable._walks.slot_owner.move_state_rows`: rows another key had taken over start
from the target's initial rows). Tombstones are not carried over (as ``resize``). Keys
beyond their window pass the read (a table saved before keys were kept to a window): every
key is placed again in its window. Per-shard values
of a state that are not rows: 64-bit counts (``skipped``) are summed onto shard 0, the rest (AdamW's
beta powers, optax's ``count``) taken from saved shard 0; the table's ``dropped`` is summed onto
shard 0 and its ``clock`` is the latest saved one.
Memory: the new table and its states (the target's copied), plus a chunk on each device.

>>> import os, tempfile, jax.numpy as jnp, numpy as np, jaxops.hashtable as ht
>>> opt = ht.optim.adagrad(0.1)
>>> t = ht.init_table(16, 2, initializer_mode="constant")
>>> t, _, info = ht.lookup_or_insert(t, np.arange(5, dtype=np.int64))
>>> t, s = opt.update(t, opt.init(t), info.slots, jnp.ones((5, 2)))
>>> path = os.path.join(tempfile.mkdtemp(), "t")
>>> ht.save({"t": t, "s": s}, path)
>>> big = ht.init_table(64, 2, initializer_mode="constant")
>>> back = ht.load(path, {"t": big, "s": opt.init(big)})  # 16 -> 64 slots: keys re-owned
>>> slots = ht.locate(back["t"], np.arange(5, dtype=np.int64))
>>> back["t"].bucket_size, np.asarray(back["s"].sum_of_squares)[slots, 0].tolist()
(64, [1.100000023841858, 1.100000023841858, 1.100000023841858, 1.100000023841858, 1.100000023841858])
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import CheckpointError, OpArgumentError
from jaxops.hashtable._kernels.rehash_kernel import rehash_slots
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._placement.route import owner_shard
from jaxops.hashtable._table.table import EVICTED, EXPORT, VALID, HashTable
from jaxops.hashtable._table.words64 import EMPTY_WORD, Counter64
from jaxops.hashtable._walks.slot_owner import move_state_rows
from jaxops.hashtable.checkpoint._saved import SavedTable, put_small, state_from, state_names
from jaxops.hashtable.checkpoint._tree import SLOT_FIELDS, StatePart, TablePart, leaf_name

__all__ = ["reown"]


def _on_first_device(rows: tuple) -> tuple:
    return tuple(jax.device_put(r, jax.local_devices()[0]) for r in rows)


def reown(saved: SavedTable, target: TablePart, states: list[StatePart]):
    placement = placement_of("restore", target.table)
    storage = target.storage
    counts = saved.counts
    clock = np.uint32(np.max(counts["clock"]))
    dropped = sum(int(lo) | int(hi) << 32 for lo, hi in zip(
        np.reshape(counts["dropped.lo"], -1), np.reshape(counts["dropped.hi"], -1))) % 2**64
    masks = tuple(tuple(n in saved.body["states"][s.name]["slot"] for n in state_names(s))
                  for s in states)
    trees = tuple(jax.tree.structure(s.state) for s in states)
    fresh, _ = placement.map(_fresh_on_shard, None, (storage, tuple(s.state for s in states)),
                             np.uint32(clock))
    state = (*fresh, placement.map(_zeros_on_shard, None, storage)[1])
    statics = (placement.num_shards, trees, masks)
    expected = np.zeros(placement.num_shards, np.int64)
    for i in range(saved.n):
        for _, skip, rows, _ in saved.chunks(i, _on_first_device, window=False):
            table_rows = tuple(rows[f"{saved.name}.{f}"] for f in SLOT_FIELDS)
            state_rows = tuple(tuple(rows[n] for n, slot in zip(state_names(s), m) if slot)
                               for s, m in zip(states, masks))
            state, _ = placement.map(_reown_on_shard, statics, state,
                                     (table_rows, state_rows, np.int32(skip)), donate=True)
            jax.block_until_ready(state)  # before the next chunk (see checkpoint_tables)
            live = (rows[f"{saved.name}.flags"][skip:] & (VALID | EVICTED)) == VALID
            if live.any():
                key = (rows[f"{saved.name}.key_lo"][skip:][live],
                       rows[f"{saved.name}.key_hi"][skip:][live])
                expected += np.bincount(np.asarray(owner_shard(*key, placement.num_shards)),
                                        minlength=placement.num_shards)
    new, new_states, placed = state
    placed = placement.per_shard(placed)
    for j in np.flatnonzero(placed != expected):
        raise OpArgumentError("restore", f"target {target.where}", f"room for {expected[j]} "
                              f"entries in shard {j}", f"{target.shard_size} slots took "
                              f"{placed[j]}", "Restore into a larger table (init_table).")
    words = np.array([dropped], np.uint64).view(np.uint32)
    new, _ = placement.map(_counts_on_shard, None, new, (words[0], words[1]), donate=True)
    new = new.replace(**saved.statics)
    table = placement.with_storage(None, new)
    if target.sharded:
        table = table.replace(route_capacity=saved.route_capacity)
    if target.sharded and saved.sharded:
        table = table.replace(unrouted=put_small(saved.whole(f"{saved.name}.unrouted"), target,
                                                 table.placement.sharding))
    out = {}
    for s, st in zip(states, new_states):
        leaves = dict(zip(state_names(s), jax.tree.leaves(st)))
        for n in saved.body["states"][s.name]["shard"]:
            leaves[n] = _combined(saved, s, n, leaves[n], target)
        out[s.name] = state_from(s, leaves)
    return table, out


def _combined(saved: SavedTable, part: StatePart, name: str, like: jax.Array,
              target: TablePart) -> jax.Array:
    """A per-shard value of a state on the new shards (see the module docstring)."""
    data = saved.whole(name)
    data = data if saved.sharded else data[None]
    tail = tuple(like.shape[1:] if target.sharded else like.shape)
    if data.shape[1:] != tail:
        raise CheckpointError(f"restore: state {part.where}: array {name!r} of shape "
                              f"{tuple(data.shape[1:])} per shard does not fit the target's "
                              f"{tail}")
    pair = _count_words(part, name)
    if pair is None:
        new = np.broadcast_to(data[0], like.shape).copy()
    else:  # a 64-bit count: the total, on the first shard
        lo, hi = (np.reshape(saved.whole(n), -1) for n in pair)
        total = sum(int(a) | int(b) << 32 for a, b in zip(lo, hi)) % 2**64
        new = np.zeros(like.shape, data.dtype)
        new.reshape(-1)[:1] = (total if name == pair[0] else total >> 32) & 0xFFFFFFFF
    if not target.sharded:
        return jax.device_put(new, like.sharding)
    return jax.make_array_from_callback(new.shape, like.sharding, lambda idx: new[idx])


def _count_words(part: StatePart, name: str) -> tuple[str, str] | None:
    """The names of the two words of the :class:`Counter64` of the state ``name`` is a
    word of (a count), or None."""
    flat = jax.tree_util.tree_flatten_with_path(
        part.state, is_leaf=lambda x: isinstance(x, Counter64))[0]
    for p, x in flat:
        if isinstance(x, Counter64):
            base = f"{part.name}.{leaf_name(p)}"
            if name in (f"{base}.lo", f"{base}.hi"):
                return f"{base}.lo", f"{base}.hi"
    return None


def _fresh_on_shard(router, statics, state, clock):
    """A copy of the target's shard emptied (its rows kept) and of its states."""
    table, states = state
    full = jnp.full(table.key_lo.shape, EMPTY_WORD, jnp.uint32)
    zero = jnp.zeros(table.key_lo.shape, jnp.uint32)
    table = table.replace(key_lo=full, key_hi=jnp.array(full, copy=True), counter_lo=zero,
                          counter_hi=jnp.array(zero, copy=True),
                          flags=jnp.zeros(table.flags.shape, jnp.uint8),
                          values=jnp.array(table.values, copy=True),
                          last_access=jnp.array(zero, copy=True),
                          epoch=jnp.array(zero, copy=True), live=jnp.int32(0),
                          not_exported=jnp.int32(0), dropped=Counter64.zero(),
                          clock=jnp.asarray(clock, jnp.uint32))
    return (table, jax.tree.map(lambda x: jnp.array(x, copy=True), states)), ()


def _zeros_on_shard(router, statics, table, replicated):
    return None, jnp.int32(0)


def _reown_on_shard(router, statics, state, replicated):
    shards, trees, masks = statics
    table, states, placed = state
    rows, state_rows, skip = replicated
    old = HashTable(*rows, live=table.live, not_exported=table.not_exported,
                    dropped=table.dropped, clock=table.clock)
    live = (old.flags & (VALID | EVICTED)) == VALID
    new_rows = jnp.arange(old.bucket_size) >= skip  # the rows before were in the last chunk
    mine = live & new_rows & (owner_shard(old.key_lo, old.key_hi, shards) == router.index())
    new, slot = rehash_slots(old, table, mine)
    moved = []
    for fresh, tree, mask, chunk in zip(states, trees, masks, state_rows):
        chunk = iter(chunk)
        leaves = [next(chunk) if m else x for x, m in zip(jax.tree.leaves(fresh), mask)]
        moved.append(move_state_rows(tree.unflatten(leaves), fresh, old, slot))
    return (new, tuple(moved), placed + jnp.sum(mine & (slot >= 0), dtype=jnp.int32)), ()


def _counts_on_shard(router, statics, table, dropped):
    live = (table.flags & (VALID | EVICTED)) == VALID
    first = router.index() == 0
    lo, hi = dropped
    return table.replace(live=jnp.sum(live, dtype=jnp.int32),
                         not_exported=jnp.sum(live & ((table.flags & EXPORT) == 0),
                                              dtype=jnp.int32),
                         dropped=Counter64(jnp.where(first, lo, np.uint32(0)),
                                           jnp.where(first, hi, np.uint32(0)))), ()
