"""The three parallel walks every table operation is built from.

- :func:`find_slots`: each key walks linear probing from its home slot until it meets its
  key, an empty slot or the end of its window (:data:`PROBE_LIMIT` slots, fewer in a
  smaller table); tombstones (EVICTED) of other keys are walked past, so a key is proved
  absent at an empty slot or its window's end.
- :func:`first_occurrences`: in-batch deduplication; every key learns the index of the
  first occurrence of the same key in the batch.
- :func:`place_new_keys`: inserts distinct absent keys so that the table is exactly the one
  a sequential loop inserting them **in ascending index order** would build.

The sequential loop: key ``k`` walks its window to its own key (live, or its own
tombstone, which it revives in place) or, proved absent, takes the **first reusable slot**
on that walk — an empty slot or another key's tombstone (tombstone reuse is beyond CANN,
where a tombstone is reusable only by its own key and evicted slots are never reclaimed).

How the insertion reproduces the sequential order: every pending key walks its reusable
slots in probe order, from the first one its probe met; at a slot that is reusable in the
table it proposes itself, and the slot keeps the lowest index that ever proposed (a
scatter-min). A key that finds the slot owned by a lower index walks on; a key that takes a
slot from a higher index displaces it, and the displaced key walks on from the next slot. A
key reviving its own tombstone proposes only there first; if a lower index takes the
tombstone (in the loop that key came first and reused it), the key is absent by its turn
and walks from the first reusable slot its probe met. When nothing moves any more, every
key sits at the first slot of its sequence not taken by a lower index — which, by induction
over the indices, is exactly where the sequential loop puts it. A key that walked its whole
window without a place is reported unplaced (the table is full for it).

>>> import jax.numpy as jnp
>>> flags = jnp.array([0, 1, 0, 0], jnp.uint8)   # slot 1 is in use
>>> home = jnp.array([1, 1, 2], jnp.int32)
>>> slots, _, _ = place_new_keys(jnp.zeros(4, jnp.uint32), flags, home, jnp.zeros(3, jnp.int32),
...                              jnp.ones(3, bool))
>>> slots.tolist()
[2, 3, 0]
>>> tomb = jnp.array([0, 1 | 8, 0, 0], jnp.uint8)  # slot 1 is another key's tombstone
>>> place_new_keys(jnp.zeros(4, jnp.uint32), tomb, home, jnp.zeros(3, jnp.int32),
...                jnp.ones(3, bool))[0].tolist()
[1, 2, 3]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.walk_table import walk_kernel
from jaxops.hashtable._table.murmur import home_slot, murmur3_x86_32
from jaxops.hashtable._table.table import EVICTED, HashTable
from jaxops.hashtable._table.words64 import Words64
from jaxops.hashtable._walks.lanes import drain, retired_values

_NOBODY = np.int32(np.iinfo(np.int32).max)  # holder of a slot no pending key holds
_NOBODY_WORD = np.uint32(_NOBODY)
#: Flag bit of a slot held by a key being placed; it never outlives one operation.
PENDING = np.uint8(0x80)
WINDOW = 8  # slots a key reads in the first round of find_slots
WIDE_WINDOW = 32  # slots a key reads per later round at the batch's full width
#: A key's window, as HierarchicalKV's bucket: the slots from the key's home slot on
#: (wrapping past the table's end, CANN's linear probing). A key is placed only in its
#: window and every walk stops at the window's end, so a key absent from a full table is
#: proved absent, and counted unplaced (``info.unplaced``, ``table.dropped``), after at most
#: this many slots: a step on a full table costs what one on an empty table does. A key
#: whose window holds no reusable slot is not placed even where the table has room
#: elsewhere; linear probing's runs make that happen past load 0.8 (see
#: ``docs/embeddings.md``, "Bounded windows"), where ``resize`` or the grow policy make room.
PROBE_LIMIT = 256


def probe_limit(bucket_size: int) -> int:
    """The longest walk in a table of ``bucket_size`` slots (its window's length)."""
    return min(int(bucket_size), PROBE_LIMIT)


#: Slots a key reads per round of place_new_keys: in a crowded table a key passes long runs
#: of used slots, one round per window.
PLACE_WINDOW = 32


def take(a: jax.Array, i: jax.Array) -> jax.Array:
    """``a[i]`` along axis 0 for indices known to be in range (no clamping or fill)."""
    return a.at[i].get(mode="promise_in_bounds", indices_are_sorted=False)


def probe_slot(home: jax.Array, dist: jax.Array, bucket_size: int) -> jax.Array:
    """``(home + dist) % bucket_size`` without int32 overflow (both are < bucket_size)."""
    s = home.astype(jnp.uint32) + dist.astype(jnp.uint32)
    return jnp.where(s >= np.uint32(bucket_size), s - np.uint32(bucket_size), s).astype(jnp.int32)


def find_slots(table: HashTable, words: Words64, active: jax.Array, track_reuse: bool = False
               ) -> tuple[jax.Array, ...]:
    """Walks each active key from its home slot to its key or the first empty slot.

    The walk moves a window of :data:`WINDOW` slots per round (see :func:`_window_step`):
    at load 0.5 the first round, one fused pass over the batch, settles all but about
    0.5% of the keys, and the rest go on in lanes compacted 16 to 1. Lanes carry only the
    key words and the walk's state: each round rehashes the home slot (MurmurHash3 costs
    less than carrying one more full-width array through the loop), and lane ids come
    with the first compaction.

    Returns:
        ``(slot, dist, flags)``: int32 ``[N]`` ``slot`` holds the key (tombstones included)
        or is -1; int32 ``dist`` is the number of slots passed before the walk stopped,
        :func:`probe_limit` when it passed them all (the key is absent and no slot within
        the bound is empty); uint8 ``flags`` are the flags of ``slot`` (0 where -1). With
        ``track_reuse`` also int32 ``reuse``: the distance of the first tombstone of another
        key the walk passed (``bucket_size``: none).

    A registered native kernel (:mod:`jaxops.core.walk_table`) runs instead where the walks
    take the native path; it returns the same values.
    """
    native = walk_kernel("find_slots")
    if native is not None:
        found = native(table.key_lo, table.key_hi, table.flags, words.lo, words.hi, active,
                       probe_limit(table.bucket_size))
        return tuple(found) if track_reuse else tuple(found[:3])
    n = active.shape[0]
    slot, dist, flags = jnp.full(n, -1, jnp.int32), jnp.zeros(n, jnp.int32), jnp.zeros(n, jnp.uint8)
    lanes = {"lo": words.lo, "hi": words.hi, "dist": dist, "slot": slot, "flags": flags}
    names = ("slot", "dist", "flags")
    if track_reuse:
        lanes["reuse"] = jnp.full(n, table.bucket_size, jnp.int32)
        names += ("reuse",)
    # Few keys walk long (runs of used slots in a crowded table): the later, narrower
    # stages read wider windows, so the long walks take few rounds.
    step = functools.partial(_window_step, table, n)
    _, stages = drain(lanes, active, functools.partial(step, first=False), None, shrink=16,
                      min_lanes=64, peel=functools.partial(step, first=True))
    return tuple(retired_values(stages, name) for name in names)


def _window_step(table: HashTable, n: int, lanes, active, carry, first: bool = False):
    """One round of the walk: each lane reads the low key words and the flags of ``w``
    slots from where it stands (one gather each, no wrap-around), stops at the first empty
    slot or its key, and otherwise moves past them. The ``first`` round reads the ``WINDOW``
    slots from the multiple of ``WINDOW`` at or before the lane's slot (one cache line each);
    later rounds at the batch's width read :data:`WIDE_WINDOW` slots (a lane still walking
    is in a crowded stretch), and narrower stages ``WINDOW`` times their shrink factor (at
    most 8).

    A window slot matching the low word is checked on the high word (one more gather); a
    key that only shares the low word is walked past. Windows are clamped to end at the
    table's end (their slots before the lane's are ignored), so a lane near the end sees
    fewer slots and goes on from slot 0 in the next round; slots past ``bucket_size``
    probes are ignored too.
    """
    size = table.bucket_size
    limit = probe_limit(size)
    shrunk = n // max(1, lanes["lo"].shape[0])  # the stage's shrink factor (1: full width)
    w = min(WINDOW if first else WIDE_WINDOW if shrunk <= 1 else WINDOW * min(8, shrunk), size)
    dist = lanes["dist"]
    at = probe_slot(home_slot(lanes["lo"], lanes["hi"], size), dist, size)
    # The first round's windows start at a multiple of the window (the lane's slot and
    # up to w - 1 after it): the keys and flags read then lie in one cache line each.
    start = jnp.minimum(at - at % w if first else at, size - w)
    skip = at - start  # window slots before the lane's slot
    seen = skip + jnp.minimum(w - skip, limit - dist)  # window slots [skip, seen): probes to make

    k = jnp.arange(w, dtype=jnp.int32)
    flags = _window(table.flags, start, w)
    stop = ((flags == 0) | (_window(table.key_lo, start, w) == lanes["lo"][:, None])) \
        & (k >= skip[:, None]) & (k < seen[:, None])
    # One reduction gives the first stop and its flags: (k << 8) | flags orders by k.
    first = jnp.min(jnp.where(stop, (k << 8) | flags.astype(jnp.int32), w << 8), axis=1)
    stop_at, flag = first >> 8, (first & 0xFF).astype(jnp.uint8)
    stopped = stop_at < w
    pos = start + jnp.minimum(stop_at, w - 1)
    empty = stopped & (flag == 0)
    found = stopped & ~empty & (take(table.key_hi, pos) == lanes["hi"])
    # Slots passed: up to the stop, past a key sharing only the low word, or the window.
    passed = jnp.where(stopped, stop_at - skip, seen - skip) + (stopped & ~empty & ~found)
    settled = active & (empty | found)
    new_lanes = {"dist": jnp.where(active, jnp.minimum(dist + passed, limit), dist),
                 "slot": jnp.where(active & found, pos, lanes["slot"]),
                 "flags": jnp.where(active & found, flag, lanes["flags"])}
    if "reuse" in lanes:  # the first tombstone passed (it is another key's: ours stops)
        tomb = ((flags & EVICTED) != 0) & (k >= skip[:, None]) & (k < seen[:, None])
        first_tomb = jnp.min(jnp.where(tomb, k, w), axis=1)
        passed_tomb = (first_tomb < stop_at) | ((first_tomb == stop_at) & stopped & ~empty & ~found)
        new_lanes["reuse"] = jnp.where(active & passed_tomb & (lanes["reuse"] == size),
                                       dist + first_tomb - skip, lanes["reuse"])
    lanes = {**lanes, **new_lanes}
    return lanes, active & ~settled & (lanes["dist"] < limit), carry


def _window(a: jax.Array, start: jax.Array, w: int) -> jax.Array:
    """``a[start[i]:start[i] + w]`` for each lane (``[N, w]``; every window is in range)."""
    return jax.vmap(lambda s: jax.lax.dynamic_slice(a, (s,), (w,)))(start)


def first_occurrences(words: Words64, pending: jax.Array) -> jax.Array:
    """For each pending key, the index of the first pending key equal to it (int32 [N]);
    other entries get their own index.

    Each round every unresolved key proposes its index at a fresh random position of a
    scratch array (MurmurHash3 with the round as seed); the position keeps the lowest
    index. All copies of a key share position and fate, so when the lowest index holds
    the same key it is the key's first occurrence and all its copies resolve to it. (A
    native kernel runs instead where the walks take the native path: one pass with a hash
    set over the batch.)
    """
    native = walk_kernel("first_occurrences")
    if native is not None:
        return native(words.lo, words.hi, pending)
    n = pending.shape[0]

    def step(lanes, active, rnd):
        scratch_size = 2 * lanes["id"].shape[0]
        pos = (murmur3_x86_32(lanes["lo"], lanes["hi"], rnd + np.uint32(1))
               % np.uint32(scratch_size)).astype(jnp.int32)
        scratch = jnp.full(scratch_size, _NOBODY).at[jnp.where(active, pos, scratch_size)].min(
            lanes["id"], mode="drop")
        lowest = jnp.minimum(take(scratch, pos), n - 1)  # inactive lanes may read _NOBODY
        same = active & (take(words.lo, lowest) == lanes["lo"]) \
            & (take(words.hi, lowest) == lanes["hi"])
        first = jnp.where(same, lowest, lanes["first"])
        return {**lanes, "first": first}, active & ~same, rnd + np.uint32(1)

    ids = jnp.arange(n, dtype=jnp.int32)
    lanes = {"id": ids, "lo": words.lo, "hi": words.hi, "first": ids}
    _, stages = drain(lanes, pending, step, jnp.uint32(0))
    return retired_values(stages, "first")


def place_new_keys(key_lo: jax.Array, flags: jax.Array, home: jax.Array, start: jax.Array,
                   pending: jax.Array, own: jax.Array | None = None
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Slots for distinct keys absent from the table, as sequential insertion in index order.

    A slot is reusable when it is empty or holds a tombstone (EVICTED): the keys placed here
    are absent from the table or revive their own tombstone, so every tombstone they meet
    is another key's.

    The holder of each contested slot is kept in the table's own arrays, so the cost is
    O(batch) and nothing of the table's size is allocated (with the table donated, XLA
    updates them in place): a slot some key holds carries :data:`PENDING` in its flags and
    the holder's index in its low key word. Every slot that ever gets a holder keeps one to
    the end, so the caller, which writes the placed keys' words and flags, erases all of it.

    Args:
        key_lo: uint32 ``[bucket_size]``, the table's low key words.
        flags: uint8 ``[bucket_size]``, the table's flags (0: the slot is free).
        home: int32 ``[N]``, each key's home slot.
        start: int32 ``[N]``, where each key's walk starts (distance from home): the first
            reusable slot its probe met; the slots before it are known to be in use.
        pending: bool ``[N]``, the keys to place (all distinct).
        own: int32 ``[N]`` or None: for a key with a tombstone in the table, its distance
            from home (the key tries it first, alone); -1 for the others.

    Returns:
        ``(slot_of, key_lo, flags)``: int32 ``[N]`` slot of each placed key (-1: not placed,
        the table is full); the two table arrays with the scratch described above, which the
        caller must overwrite at every placed slot.

    Where the walks take the native path a C++ loop places the keys in index order (the
    loop this walk reproduces): it marks the slots it hands out with PENDING in ``flags``,
    in place, and leaves ``key_lo`` as it is; the caller's writes erase the marks alike.
    """
    n, size = home.shape[0], flags.shape[0]
    own = jnp.full(n, -1, jnp.int32) if own is None else own
    native = walk_kernel("place_new_keys")
    if native is not None:
        slot_of, flags = native(flags, home, start, pending, own, probe_limit(size))
        return slot_of, key_lo, flags

    w = min(PLACE_WINDOW, size)
    limit = probe_limit(size)
    k = jnp.arange(w, dtype=jnp.int32)

    def step(lanes, active, carry):
        key_lo, flags, slot_of = carry
        me, dist, reviving = lanes["id"], lanes["dist"], lanes["own"]
        mine = me.astype(jnp.uint32)
        # Each lane reads a window of slots from where it stands (as in _window_step) and
        # goes to the first one it may claim: slots the table uses, or a lower index holds,
        # stay so (a holder only ever gets lower), so passing them is what single steps do.
        # A lane reviving its tombstone reads that one slot.
        at = probe_slot(lanes["home"], dist, size)
        wstart = jnp.minimum(at, size - w)
        skip = at - wstart
        seen = skip + jnp.where(reviving, 1, jnp.minimum(w - skip, limit - dist))

        wflags = _window(flags, wstart, w)
        wheld = (wflags & PENDING) != 0
        wheld_by = jnp.where(wheld, _window(key_lo, wstart, w), _NOBODY_WORD)
        base = wflags & ~PENDING
        reusable = (base == 0) | ((base & EVICTED) != 0)
        open_ = reusable & (wheld_by > mine[:, None]) & (k >= skip[:, None]) & (k < seen[:, None])
        stop_at = jnp.min(jnp.where(open_, k, w), axis=1)
        stopped = stop_at < w
        pick = jnp.minimum(stop_at, w - 1)
        pos = wstart + pick
        flag = jnp.take_along_axis(wflags, pick[:, None], axis=1)[:, 0]
        held = jnp.take_along_axis(wheld, pick[:, None], axis=1)[:, 0]
        held_by = jnp.take_along_axis(wheld_by, pick[:, None], axis=1)[:, 0]
        free = active & stopped
        dist = jnp.where(active, dist + jnp.where(stopped, stop_at, seen) - skip, dist)
        first_claim = jnp.where(free & ~held, pos, size)
        key_lo = key_lo.at[first_claim].set(_NOBODY_WORD, mode="drop")
        flags = flags.at[first_claim].set(flag | PENDING, mode="drop")
        key_lo = key_lo.at[jnp.where(free, pos, size)].min(mine, mode="drop")
        won = free & (take(key_lo, pos) == mine)
        ousted = won & held
        slot_of = slot_of.at[jnp.where(won, me, n)].set(pos, mode="drop")
        ousted_id = jnp.where(ousted, held_by, 0).astype(jnp.int32)
        slot_of = slot_of.at[jnp.where(ousted, ousted_id, n)].set(-1, mode="drop")
        # A winner's lane carries on with the key it ousted, from the slot after; a key
        # ousted from its own tombstone (or not getting it) walks from its start instead.
        ousted_home = take(home, ousted_id)
        back = pos - ousted_home
        ousted_own = take(own, ousted_id)
        ousted_dist = jnp.where(ousted_own == jnp.where(back < 0, back + size, back),
                                take(start, ousted_id), jnp.where(back < 0, back + size, back) + 1)
        lost = active & ~won
        dist = jnp.where(lost & reviving, take(start, me),
                         jnp.where(lost & stopped, dist + 1, dist))
        dist = jnp.where(ousted, ousted_dist, dist)
        lanes = {"id": jnp.where(ousted, ousted_id, me), "dist": dist,
                 "home": jnp.where(ousted, ousted_home, lanes["home"]),
                 "own": jnp.where(ousted, False, reviving & ~lost)}
        active = ((active & ~won) | ousted) & (dist < limit)
        return lanes, active, (key_lo, flags, slot_of)

    lanes = {"id": jnp.arange(n, dtype=jnp.int32), "dist": jnp.where(own >= 0, own, start),
             "home": home, "own": own >= 0}
    carry = (key_lo, flags, jnp.full(n, -1, jnp.int32))
    pending = pending & (lanes["dist"] < limit)
    (key_lo, flags, slot_of), _ = drain(lanes, pending, step, carry)
    return slot_of, key_lo, flags
