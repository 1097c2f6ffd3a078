"""Restoring a table and its optimizer states from a checkpoint, one chunk of slots at a
time, onto the target's placement.

**Same layout** (as many shards of as many slots as saved): every shard the process holds
is preallocated on its device(s) and filled chunk by chunk in place, so a restore needs the
new table plus one chunk. **Another layout** (another shard count, or another size): the
target's tables must be concrete (``init_table``): their rows are the rows free slots keep
(the initializer). Each saved shard is read chunk by chunk, every new shard takes the live
entries it owns (:func:`~.route.owner_shard`), rehashed in ascending saved slot order
(:func:`~.rebuild.rehash_slots`), and each optimizer state's rows move with their keys
(:func:`~.owner.move_state_rows`: a row that another key had taken over starts from the
target's initial row). Tombstones are not carried over (as ``resize``). Per-shard values
of a state that are not rows: 64-bit counts (``skipped``) are summed onto shard 0, the rest
(AdamW's beta powers, optax's ``count``) taken from saved shard 0; the table's ``dropped``
is summed onto shard 0 and its ``clock`` is the latest saved one.

Every chunk is checked as it is read: its checksum (against the metadata's, per shard),
its flags (known bits; an empty slot is blank), each used slot's key on its probe path and
no key twice (:class:`~.probe_check.ProbeCheck`), each key in the shard that owns it, and
the shard's counts against its flags.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxops.core.errors import CheckpointError, OpArgumentError
from jaxops.ops.hashtable.checkpoint_read import CHUNK_BYTES, StoredArrays, release_freed
from jaxops.ops.hashtable.checkpoint_tree import (SHARD_FIELDS, SLOT_FIELDS, StatePart,
                                                  TablePart, leaf_name)
from jaxops.ops.hashtable.checksums import (add_sums, chunk_sums, hex_sums, host_sums,
                                            words_per_element)
from jaxops.ops.hashtable.murmur import home_slot
from jaxops.ops.hashtable.on_mesh import ShardedHashTable, global_replicated
from jaxops.ops.hashtable.owner import move_state_rows
from jaxops.ops.hashtable.placement import placement_of
from jaxops.ops.hashtable.probe_check import ProbeCheck
from jaxops.ops.hashtable.rebuild import rehash_slots
from jaxops.ops.hashtable.route import owner_shard
from jaxops.ops.hashtable.table import EVICTED, EXPORT, FILTER, VALID, HashTable
from jaxops.ops.hashtable.words import EMPTY_WORD, Counter64

__all__ = ["restore_table"]

_KNOWN_FLAGS = VALID | FILTER | EXPORT | EVICTED


def restore_table(stored: StoredArrays, body: dict, target: TablePart,
                  states: list[StatePart]) -> tuple[Any, dict[str, Any]]:
    """``(table, {state name: state})``: the saved table ``target.name`` and its states,
    on ``target``'s placement (see the module docstring).

    Raises:
        CheckpointError: a checksum mismatch or content that is not a valid table.
        OpArgumentError: another layout with an abstract target, a target of another row
            width, or entries that do not fit the target's shards.
    """
    saved = body["tables"][target.name]
    if saved["embedding_dim"] != target.storage.embedding_dim:
        raise OpArgumentError("restore", f"target {target.where}", f"a table of embedding_dim "
                              f"{saved['embedding_dim']} (as saved)",
                              f"embedding_dim {target.storage.embedding_dim}")
    for s in states:
        _check_state_shapes(body, saved, target, s)
    reader = _Saved(stored, body, target.name, saved, states)
    if (saved["num_shards"], saved["shard_size"]) == (target.num_shards, target.shard_size):
        return _same_layout(reader, target, states)
    for what, x in [(target.where, target.storage.values)] + [
            (s.where, leaf) for s in states for leaf in jax.tree.leaves(s.state)]:
        if not isinstance(x, jax.Array):
            raise OpArgumentError(
                "restore", f"target {what}", "concrete arrays (init_table / opt.init) to "
                f"restore {saved['num_shards']} x {saved['shard_size']} slots onto "
                f"{target.num_shards} x {target.shard_size}: their rows are what free slots "
                "keep", f"{type(x).__name__} leaves")
    return _reown(reader, target, states)


def _check_state_shapes(body: dict, saved: dict, target: TablePart, state: StatePart) -> None:
    """The saved state's leaves are the target's, but for the shard and slot axes (checked
    before anything is read: what is read is then bounded by the target's sizes)."""
    names = body["states"][state.name]
    if set(names["slot"]) != set(state.slot) or set(names["shard"]) != set(state.leaves) - set(
            state.slot):
        raise CheckpointError(f"restore: the optimizer state {state.where} has other arrays "
                              f"than the one saved (saved per-slot {sorted(names['slot'])}, "
                              f"per-shard {sorted(names['shard'])})")
    for name, leaf in state.leaves.items():
        got = body["leaves"][name]
        axes = (1 if saved["sharded"] else 0) + (name in state.slot)
        mine = (1 if target.sharded else 0) + (name in state.slot)
        want_tail, want_dtype = list(np.shape(leaf))[mine:], str(leaf.dtype)
        if got["shape"][axes:] != want_tail or got["dtype"] != want_dtype:
            raise CheckpointError(f"restore: the optimizer state {state.where}: array {name!r} "
                                  f"is saved as {got['shape']} {got['dtype']}, the target "
                                  f"holds {list(np.shape(leaf))} {want_dtype}")


class _Saved:
    """The saved arrays of one table and its states, read and checked by chunks."""

    def __init__(self, stored, body, name, saved, states):
        self.stored, self.body, self.name = stored, body, name
        self.sharded, self.n, self.per = saved["sharded"], saved["num_shards"], saved["shard_size"]
        self.statics = {k: saved[k] for k in ("max_load_factor", "load_policy", "key_dtype")}
        self.dim = saved["embedding_dim"]
        self.slot_names = [f"{name}.{f}" for f in SLOT_FIELDS] + [
            n for s in states for n in body["states"][s.name]["slot"]]
        per_slot = sum(int(np.prod(body["leaves"][n]["shape"][2 if self.sharded else 1:]))
                       * np.dtype(body["leaves"][n]["dtype"]).itemsize for n in self.slot_names)
        self.step = min(self.per, max(1, CHUNK_BYTES // max(1, per_slot)))
        self.counts = {f: self.whole(f"{name}.{f}") for f in SHARD_FIELDS}

    def whole(self, name: str) -> np.ndarray:
        """A small (per-shard) array, read whole and checked."""
        data = self.stored.read(name, ())
        sums = self.body["leaves"][name]["sums"]
        if len(sums) == 1:
            self._check(name, None, host_sums(data), sums[0])
        else:
            stride = int(np.prod(data.shape[1:])) * words_per_element(data.dtype)
            for i, want in enumerate(sums):
                self._check(name, i, host_sums(data[i], i * stride), want)
        return data

    def _check(self, name: str, shard: int | None, got, want: str) -> None:
        if hex_sums(got) != want:
            where = "" if shard is None else f", shard {shard}"
            raise CheckpointError(f"{self.stored.directory!r}: array {name!r}{where}: checksum "
                                  "mismatch: the stored data is not what was saved")

    def chunks(self, i: int, put):
        """``(start, skip, {name: host rows}, on_device)`` for saved shard ``i``, chunk by
        chunk (``on_device = put(host rows)``, a tuple of arrays holding the same words):
        every chunk has ``step`` slots (one shape, compiled once); the last ends at the
        shard's end, so its first ``skip`` slots are the chunk before's again. Each chunk is
        checked (see the module docstring); the shard's sums are compared at its end."""
        acc = {n: np.zeros(2, np.uint32) for n in self.slot_names}
        probe, seen, fault = ProbeCheck(self.per), [0, 0], None
        for a in range(0, self.per, self.step):
            start = min(a, self.per - self.step)
            skip = a - start
            rows = {n: self.stored.read(n, ((i,) if self.sharded else ()) + (
                slice(start, start + self.step),)) for n in self.slot_names}
            moved = put(tuple(rows.values()))
            sums = _sums_of(moved, tuple(self._base(n, i, start) for n in rows),
                            tuple(np.uint32(skip * self._row_words(n)) for n in rows))
            for n, s in zip(rows, np.asarray(sums)):
                acc[n] = add_sums(acc[n], s)
            if fault is None:  # after a fault, only the sums: a damaged shard is reported as
                try:           # a checksum mismatch (its cause), not as what the damage looks like
                    self._check_slots(i, a, {n: r[skip:] for n, r in rows.items()}, probe, seen)
                except CheckpointError as e:
                    fault = e
            yield start, skip, rows, moved
            del rows, moved
            release_freed()
        for n in self.slot_names:
            self._check(n, i if self.sharded else None, acc[n],
                        self.body["leaves"][n]["sums"][i if self.sharded else 0])
        if fault is not None:
            raise fault
        try:
            probe.finish()
        except ValueError as e:
            raise CheckpointError(self._content(i, str(e))) from None
        live, fresh = (int(np.asarray(self.counts[f]).reshape(-1)[i]) for f in
                       ("live", "not_exported"))
        if (live, fresh) != tuple(seen):
            raise CheckpointError(self._content(i, f"counts live {live}, not exported {fresh} "
                                                f"disagree with the flags ({seen[0]}, {seen[1]})"))

    def _row_words(self, name: str) -> int:
        """Words per slot of the stored array ``name``."""
        shape = self.body["leaves"][name]["shape"]
        tail = shape[2:] if self.sharded else shape[1:]
        return int(np.prod(tail)) * words_per_element(self.body["leaves"][name]["dtype"])

    def _base(self, name: str, i: int, a: int) -> np.uint32:
        words = ((i * self.per if self.sharded else 0) + a) * self._row_words(name)
        return np.uint32(words % 2**32)

    def _check_slots(self, i, a, rows, probe, seen) -> None:
        f = lambda x: rows[f"{self.name}.{x}"]  # noqa: E731
        flags, lo, hi = f("flags"), f("key_lo"), f("key_hi")
        empty = flags == 0
        bad = ((flags & ~np.uint8(_KNOWN_FLAGS)) != 0) | (empty & (
            (lo != EMPTY_WORD) | (hi != EMPTY_WORD) | (f("counter_lo") != 0) | (f("counter_hi") != 0)))
        if bad.any():
            s = a + int(np.argmax(bad))
            raise CheckpointError(self._content(i, f"slot {s}: flags {int(flags[s - a]):#x} "
                                                "(known bits 0x1-0x8; an empty slot is blank)"))
        home, owner = (np.asarray(x) for x in _homes(lo, hi, self.per, self.n))
        if self.sharded and np.any((owner != i) & ~empty):
            s = a + int(np.argmax((owner != i) & ~empty))
            raise CheckpointError(self._content(i, f"the key at slot {s} belongs to shard "
                                                f"{int(owner[s - a])}"))
        try:
            probe.feed(a, lo, hi, flags, home)
        except ValueError as e:
            raise CheckpointError(self._content(i, str(e))) from None
        live = ((flags & VALID) != 0) & ((flags & EVICTED) == 0)
        seen[0] += int(live.sum())
        seen[1] += int((live & ((flags & EXPORT) == 0)).sum())

    def _content(self, i: int, what: str) -> str:
        shard = f" shard {i}" if self.sharded else ""
        return (f"{self.stored.directory!r}: table {self.name!r}{shard}: corrupt content "
                f"(valid checksums): {what}")


@jax.jit
def _sums_of(rows: tuple, bases: tuple, skips: tuple) -> jax.Array:
    return jnp.stack([chunk_sums(r, b, k) for r, b, k in zip(rows, bases, skips)])


@functools.partial(jax.jit, static_argnums=(2, 3))
def _homes(lo, hi, size: int, shards: int):
    return home_slot(lo, hi, size), owner_shard(lo, hi, shards)


# -- same layout ------------------------------------------------------------------------

def _holders(target: TablePart) -> tuple[Any, dict[int, list]]:
    """``(sharding or device, {shard: [local devices holding it]})``."""
    if not target.sharded:
        sharding = getattr(target.storage.values, "sharding", None)
        device = next(iter(sharding.device_set)) if sharding is not None else jax.local_devices()[0]
        return device, {0: [device]}
    place = target.table.placement
    held: dict[int, list] = {}
    for device, idx in place.sharding.addressable_devices_indices_map(
            (target.num_shards,)).items():
        held.setdefault(idx[0].start or 0, []).append(device)
    return place.sharding, held


@functools.partial(jax.jit, static_argnums=2, donate_argnums=0)
def _write(bufs: tuple, rows: tuple, axis: int, start) -> tuple:
    return tuple(lax.dynamic_update_slice_in_dim(b, r.astype(b.dtype), start, axis)
                 for b, r in zip(bufs, rows))


def _same_layout(saved: _Saved, target: TablePart, states: list[StatePart]):
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
        return _put(host.reshape((target.num_shards,) * lead + tail), target, where)

    table = _table(saved, target, {f: full[f"{saved.name}.{f}"] for f in SLOT_FIELDS},
                   {f: small(f"{saved.name}.{f}") for f in SHARD_FIELDS}, where)
    out = {}
    for s in states:
        names = saved.body["states"][s.name]
        leaves = {n: full[n] for n in names["slot"]}
        leaves.update({n: small(n) for n in names["shard"]})
        out[s.name] = _state_from(s, leaves)
    return table, out


def _assemble(sharding: NamedSharding, shape: tuple, pieces: dict) -> jax.Array:
    index = sharding.addressable_devices_indices_map(shape)
    return jax.make_array_from_single_device_arrays(shape, sharding,
                                                    [pieces[d] for d in index])


def _put(host: np.ndarray, target: TablePart, where: Any) -> jax.Array:
    """A small host array on the target's placement (a scalar replicated on a mesh)."""
    host = np.asarray(host)
    if not target.sharded:
        return jax.device_put(host, where)
    sharding = where if host.ndim else NamedSharding(where.mesh, P())
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def _table(saved: _Saved, target: TablePart, slots: dict, counts: dict, where) -> Any:
    storage = HashTable(**slots, live=counts["live"], not_exported=counts["not_exported"],
                        dropped=Counter64(counts["dropped.lo"], counts["dropped.hi"]),
                        clock=counts["clock"], **saved.statics)
    if not target.sharded:
        return storage
    unrouted = saved.whole(f"{saved.name}.unrouted") if saved.sharded else np.int32(0)
    return ShardedHashTable(storage, _put(np.asarray(unrouted, np.int32), target, where),
                            target.table.placement)


def _state_from(part: StatePart, leaves: dict) -> Any:
    """``part.state``'s structure holding ``leaves`` (name → array)."""
    return jax.tree.structure(part.state).unflatten([leaves[n] for n in _names(part)])


def _on_default(rows: tuple) -> tuple:
    return tuple(jax.device_put(r, jax.local_devices()[0]) for r in rows)


def _names(part: StatePart) -> list[str]:
    return [f"{part.name}.{leaf_name(p)}" for p, _ in
            jax.tree_util.tree_flatten_with_path(part.state)[0]]


# -- another layout -----------------------------------------------------------------------

def _reown(saved: _Saved, target: TablePart, states: list[StatePart]):
    place = placement_of("restore", target.table)
    storage = target.storage
    counts = saved.counts
    clock = np.uint32(np.max(counts["clock"]))
    dropped = sum(int(lo) | int(hi) << 32 for lo, hi in zip(
        np.reshape(counts["dropped.lo"], -1), np.reshape(counts["dropped.hi"], -1))) % 2**64
    masks = tuple(tuple(n in saved.body["states"][s.name]["slot"] for n in _names(s))
                  for s in states)
    trees = tuple(jax.tree.structure(s.state) for s in states)
    fresh, _ = place.map(_fresh_on_shard, None, (storage, tuple(s.state for s in states)),
                         np.uint32(clock))
    state = (*fresh, place.map(_zeros_on_shard, None, storage)[1])
    statics = (place.num_shards, trees, masks)
    expected = np.zeros(place.num_shards, np.int64)
    for i in range(saved.n):
        for _, skip, rows, _ in saved.chunks(i, _on_default):
            table_rows = tuple(rows[f"{saved.name}.{f}"] for f in SLOT_FIELDS)
            state_rows = tuple(tuple(rows[n] for n, slot in zip(_names(s), m) if slot)
                               for s, m in zip(states, masks))
            state, _ = place.map(_reown_on_shard, statics, state,
                                 (table_rows, state_rows, np.int32(skip)), donate=True)
            live = (rows[f"{saved.name}.flags"][skip:] & (VALID | EVICTED)) == VALID
            if live.any():
                key = (rows[f"{saved.name}.key_lo"][skip:][live],
                       rows[f"{saved.name}.key_hi"][skip:][live])
                expected += np.bincount(np.asarray(owner_shard(*key, place.num_shards)),
                                        minlength=place.num_shards)
    new, new_states, placed = state
    placed = place.per_shard(placed)
    for j in np.flatnonzero(placed != expected):
        raise OpArgumentError("restore", f"target {target.where}", f"room for {expected[j]} "
                              f"entries in shard {j}", f"{target.shard_size} slots took "
                              f"{placed[j]}", "Restore into a larger table (init_table).")
    words = np.array([dropped], np.uint64).view(np.uint32)
    new, _ = place.map(_counts_on_shard, None, new, (words[0], words[1]), donate=True)
    new = new.replace(**saved.statics)
    table = place.rebuild(None, new)
    if target.sharded and saved.sharded:
        table = table.replace(unrouted=_put(saved.whole(f"{saved.name}.unrouted"), target,
                                            table.placement.sharding))
    out = {}
    for s, st in zip(states, new_states):
        leaves = dict(zip(_names(s), jax.tree.leaves(st)))
        for n in saved.body["states"][s.name]["shard"]:
            leaves[n] = _combined(saved, s, n, leaves[n], target)
        out[s.name] = _state_from(s, leaves)
    return table, out


def _combined(saved: _Saved, part: StatePart, name: str, like: jax.Array,
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
                          last_access=jnp.array(zero, copy=True), live=jnp.int32(0),
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
