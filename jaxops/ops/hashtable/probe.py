"""The three parallel walks every table operation is built from.

- :func:`find_slots`: each key walks linear probing from its home slot until it meets its
  key or an empty slot (at most ``bucket_size`` probes).
- :func:`first_occurrences`: in-batch deduplication; every key learns the index of the
  first occurrence of the same key in the batch.
- :func:`place_new_keys`: inserts distinct absent keys so that the table is exactly the one
  a sequential loop inserting them **in ascending index order** would build.

How the insertion reproduces the sequential order: every pending key walks its probe
sequence; at a slot that is free in the table it proposes itself, and the slot keeps the
lowest index that ever proposed (a scatter-min). A key that finds the slot owned by a lower
index walks on; a key that takes a slot from a higher index displaces it, and the displaced
key walks on from the next slot. When nothing moves any more, every key sits at the first
slot of its probe sequence not taken by the table or by a lower index — which, by induction
over the indices, is exactly where the sequential loop puts it. A key that walked all
``bucket_size`` slots without a place is reported unplaced (the table is full for it).

>>> import jax.numpy as jnp
>>> flags = jnp.array([0, 1, 0, 0], jnp.uint8)   # slot 1 is in use
>>> home = jnp.array([1, 1, 2], jnp.int32)
>>> place_new_keys(flags, home, jnp.zeros(3, jnp.int32), jnp.ones(3, bool)).tolist()
[2, 3, 0]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.ops.hashtable.lanes import drain, scatter_retired
from jaxops.ops.hashtable.murmur import murmur3_x86_32
from jaxops.ops.hashtable.table import HashTable, Words64

_NOBODY = np.int32(np.iinfo(np.int32).max)  # owner of a slot no pending key holds


def take(a: jax.Array, i: jax.Array) -> jax.Array:
    """``a[i]`` along axis 0 for indices known to be in range (no clamping or fill)."""
    return a.at[i].get(mode="promise_in_bounds", indices_are_sorted=False)


def probe_slot(home: jax.Array, dist: jax.Array, bucket_size: int) -> jax.Array:
    """``(home + dist) % bucket_size`` without int32 overflow (both are < bucket_size)."""
    s = home.astype(jnp.uint32) + dist.astype(jnp.uint32)
    return jnp.where(s >= np.uint32(bucket_size), s - np.uint32(bucket_size), s).astype(jnp.int32)


def find_slots(table: HashTable, words: Words64, home: jax.Array, active: jax.Array
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Walks each active key from ``home`` to its key or the first empty slot.

    The walk compares only the low key word (fewer gathers per probe, fewer lane arrays);
    the high word is checked once where the walk stopped, and the rare keys that met
    another key with the same low word walk on from there.

    Returns:
        ``(slot, dist, flags)``: int32 ``[N]`` ``slot`` holds the key (tombstones included)
        or is -1; int32 ``dist`` is the number of slots passed before the walk stopped,
        ``bucket_size`` when it passed them all (the key is absent and the table has no
        empty slot); uint8 ``flags`` are the flags of ``slot`` (0 where -1).
    """
    size = table.bucket_size

    def impostor(slot):
        return (slot >= 0) & (take(table.key_hi, jnp.maximum(slot, 0)) != words.hi)

    def walk_on(state):
        slot, dist, wrong = state
        resume = wrong & (dist + 1 < size)
        slot2, dist2 = _walk_low_word(table, words, home, jnp.where(resume, dist + 1, dist), resume)
        slot = jnp.where(wrong, jnp.where(resume, slot2, -1), slot)
        dist = jnp.where(wrong, jnp.where(resume, dist2, size), dist)
        return slot, dist, impostor(slot)

    slot, dist = _walk_low_word(table, words, home, jnp.zeros_like(home), active)
    slot, dist, _ = jax.lax.while_loop(lambda s: jnp.any(s[2]), walk_on,
                                       (slot, dist, impostor(slot)))
    flags = jnp.where(slot >= 0, take(table.flags, jnp.maximum(slot, 0)), jnp.uint8(0))
    return slot, dist, flags


def _walk_low_word(table: HashTable, words: Words64, home: jax.Array, dist: jax.Array,
                   active: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Walks to the first slot that is empty (slot -1) or holds a key with the same low
    word (its slot); ``dist`` as in :func:`find_slots`."""
    n, size = home.shape[0], table.bucket_size

    def step(lanes, active, carry):
        pos = probe_slot(lanes["home"], lanes["dist"], size)
        used = take(table.flags, pos) != 0
        same = active & used & (take(table.key_lo, pos) == lanes["lo"])
        go = active & used & ~same
        dist = jnp.where(go, lanes["dist"] + 1, lanes["dist"])
        slot = jnp.where(same, pos, lanes["slot"])
        return {**lanes, "dist": dist, "slot": slot}, go & (dist < size), carry

    lanes = {"id": jnp.arange(n, dtype=jnp.int32), "lo": words.lo, "home": home, "dist": dist,
             "slot": jnp.full(n, -1, jnp.int32)}
    _, stages = drain(lanes, active, step, None)
    return scatter_retired(lanes["slot"], stages, "slot"), scatter_retired(dist, stages, "dist")


def first_occurrences(words: Words64, pending: jax.Array) -> jax.Array:
    """For each pending key, the index of the first pending key equal to it (int32 [N]);
    other entries get their own index.

    Each round every unresolved key proposes its index at a fresh random position of a
    scratch array (MurmurHash3 with the round as seed); the position keeps the lowest
    index. All copies of a key share position and fate, so when the lowest index holds
    the same key it is the key's first occurrence and all its copies resolve to it.
    """
    n = pending.shape[0]

    def step(lanes, active, rnd):
        scratch_size = 2 * lanes["id"].shape[0]
        pos = (murmur3_x86_32(lanes["lo"], lanes["hi"], rnd + np.uint32(1))
               % np.uint32(scratch_size)).astype(jnp.int32)
        scratch = jnp.full(scratch_size, _NOBODY).at[jnp.where(active, pos, scratch_size)].min(
            lanes["id"], mode="drop")
        owner = jnp.minimum(take(scratch, pos), n - 1)  # inactive lanes may read _NOBODY
        same = active & (take(words.lo, owner) == lanes["lo"]) \
            & (take(words.hi, owner) == lanes["hi"])
        first = jnp.where(same, owner, lanes["first"])
        return {**lanes, "first": first}, active & ~same, rnd + np.uint32(1)

    ids = jnp.arange(n, dtype=jnp.int32)
    lanes = {"id": ids, "lo": words.lo, "hi": words.hi, "first": ids}
    _, stages = drain(lanes, pending, step, jnp.uint32(0))
    return scatter_retired(ids, stages, "first")


def place_new_keys(flags: jax.Array, home: jax.Array, start: jax.Array, pending: jax.Array
                   ) -> jax.Array:
    """Slots for distinct keys absent from the table, as sequential insertion in index order.

    Args:
        flags: uint8 ``[bucket_size]``, the table's flags (non-zero: the slot is in use).
        home: int32 ``[N]``, each key's home slot.
        start: int32 ``[N]``, slots each key may skip (they are known to be occupied).
        pending: bool ``[N]``, the keys to place (all distinct and absent from the table).

    Returns:
        int32 ``[N]``: the slot of each placed key, -1 for keys not placed (table full).
    """
    n, size = home.shape[0], flags.shape[0]

    def step(lanes, active, carry):
        owner, slot_of = carry
        me, dist = lanes["id"], lanes["dist"]
        pos = probe_slot(lanes["home"], dist, size)
        held_by = take(owner, pos)
        free = active & (take(flags, pos) == 0) & (held_by > me)
        owner = owner.at[jnp.where(free, pos, size)].min(me, mode="drop")
        won = free & (take(owner, pos) == me)
        ousted = won & (held_by != _NOBODY)
        slot_of = slot_of.at[jnp.where(won, me, n)].set(pos, mode="drop")
        slot_of = slot_of.at[jnp.where(ousted, held_by, n)].set(-1, mode="drop")
        # A winner's lane carries on with the key it ousted, from the slot after.
        ousted_id = jnp.where(ousted, held_by, 0)
        ousted_home = take(home, ousted_id)
        back = pos - ousted_home
        ousted_dist = jnp.where(back < 0, back + size, back) + 1
        dist = jnp.where(ousted, ousted_dist, jnp.where(active & ~won, dist + 1, dist))
        lanes = {"id": jnp.where(ousted, ousted_id, me), "dist": dist,
                 "home": jnp.where(ousted, ousted_home, lanes["home"])}
        active = ((active & ~won) | ousted) & (dist < size)
        return lanes, active, (owner, slot_of)

    lanes = {"id": jnp.arange(n, dtype=jnp.int32), "dist": start, "home": home}
    carry = (jnp.full(size, _NOBODY), jnp.full(n, -1, jnp.int32))
    pending = pending & (start < size)
    (_, slot_of), _ = drain(lanes, pending, step, carry)
    return slot_of
