"""A saved table (and the optimizer states that belong to it) read back one chunk of slots
at a time, and checked as it is read.

Every chunk is checked: its checksum (against the metadata's, per shard; a shard's sums are
compared at its end), its flags (known bits; an empty slot is blank), each used slot's key
on its probe path and no key twice (:class:`~jaxops.hashtable._walks.probe_check.ProbeCheck`), each
key in the shard that owns it, and the shard's counts against its flags. A content fault found
mid-shard is raised after the shard's checksums, so that a damaged file is reported as a
checksum mismatch (its cause) rather than as what the damage looks like. Every chunk has
one shape (compiled once): the last one ends at the shard's end and repeats some slots of
the one before, which are not summed or checked twice.

>>> import os, tempfile, numpy as np, jaxops.hashtable as ht
>>> from jaxops.hashtable.checkpoint._meta import read_meta
>>> from jaxops.hashtable.checkpoint._read import StoredArrays
>>> t = ht.init_table(16, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.arange(5, dtype=np.int64))
>>> path = os.path.join(tempfile.mkdtemp(), "t")
>>> ht.save(t, path)
>>> body = read_meta(path)
>>> from jaxops.hashtable.checkpoint._tree import parts
>>> saved = SavedTable(StoredArrays(path, body["leaves"]), body, "~root",
...                    body["tables"]["~root"], [], parts(t).tables["~root"])
>>> sum(int((rows["~root.flags"][skip:] != 0).sum()) for _, skip, rows, _ in
...     saved.chunks(0, lambda rows: rows))
5
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxops.core.errors import CheckpointError
from jaxops.hashtable._placement.route import owner_shard
from jaxops.hashtable._table.murmur import home_slot
from jaxops.hashtable._table.table import EVICTED, EXPORT, FILTER, VALID
from jaxops.hashtable._table.words64 import EMPTY_WORD
from jaxops.hashtable._walks.probe_check import BeyondWindow, ProbeCheck
from jaxops.hashtable.checkpoint._checksums import (add_sums, chunk_sums, hex_sums, host_sums,
                                                    words_per_element)
from jaxops.hashtable.checkpoint._read import CHUNK_BYTES, release_freed
from jaxops.hashtable.checkpoint._tree import (SHARD_FIELDS, SLOT_FIELDS, StatePart, TablePart,
                                               initializer_from_json, leaf_name)

__all__ = ["SavedTable", "check_state_shapes", "put_small", "state_from", "state_names"]

_KNOWN_FLAGS = VALID | FILTER | EXPORT | EVICTED


def check_state_shapes(body: dict, saved: dict, target: TablePart, state: StatePart) -> None:
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


class SavedTable:
    """The saved arrays of one table (``name``) and its ``states``, read and checked by
    chunks (see the module docstring)."""

    def __init__(self, stored, body, name, saved, states, target: TablePart):
        self.stored, self.body, self.name = stored, body, name
        self.sharded, self.n, self.per = saved["sharded"], saved["num_shards"], saved["shard_size"]
        where = f"{stored.directory!r}: table {name!r}"
        self.statics = {k: saved[k] for k in ("max_load_factor", "load_policy", "key_dtype")}
        self.statics["initializer"] = initializer_from_json(saved["initializer"],
                                                            target.storage.initializer, where)
        # A routing capacity is per destination shard: kept on as many shards, else the
        # target's.
        same = saved["sharded"] and saved["num_shards"] == target.num_shards
        self.route_capacity = saved["route_capacity"] if same else getattr(
            target.table, "route_capacity", None)
        self.dim = saved["embedding_dim"]
        self.slot_names = [f"{name}.{f}" for f in SLOT_FIELDS] + [
            n for s in states for n in body["states"][s.name]["slot"]]
        #: bytes a slot of the table and its states' per-slot arrays take
        self.slot_bytes = sum(int(np.prod(body["leaves"][n]["shape"][2 if self.sharded else 1:]))
                              * np.dtype(body["leaves"][n]["dtype"]).itemsize
                              for n in self.slot_names)
        self.step = min(self.per, max(1, CHUNK_BYTES // max(1, self.slot_bytes)))
        for n in self.slot_names:  # stored as listed: checked before anything is allocated
            stored.open(n)
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

    def chunks(self, i: int, put, window: bool = True):
        """``(start, skip, {name: host rows}, on_device)`` for saved shard ``i``, chunk by
        chunk (``on_device = put(host rows)``, a tuple of arrays holding the same words):
        every chunk has ``step`` slots (one shape, compiled once); the last ends at the
        shard's end, so its first ``skip`` slots are the chunk before's again. Each chunk is
        checked (see the module docstring; keys beyond their window pass with ``window=False``,
        for a reader that places every key again); the shard's sums are compared at its end."""
        acc = {n: np.zeros(2, np.uint32) for n in self.slot_names}
        probe, seen, fault = ProbeCheck(self.per, window), [0, 0], None
        for a in range(0, self.per, self.step):
            start = min(a, self.per - self.step)
            skip = a - start
            rows = self.stored.read_many(self.slot_names, ((i,) if self.sharded else ()) + (
                slice(start, start + self.step),))
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
        home, shard = (np.asarray(x) for x in _homes(lo, hi, self.per, self.n))
        if self.sharded and np.any((shard != i) & ~empty):
            s = a + int(np.argmax((shard != i) & ~empty))
            raise CheckpointError(self._content(i, f"the key at slot {s} belongs to shard "
                                                f"{int(shard[s - a])}"))
        try:
            probe.feed(a, lo, hi, flags, home)
        except BeyondWindow as e:
            shard = f" shard {i}" if self.sharded else ""
            raise CheckpointError(
                f"{self.stored.directory!r}: table {self.name!r}{shard}: {e}. It was saved "
                "before keys were kept to a window (jaxops then placed a key up to 4,096 "
                "slots from its home): load it onto a table of another size (load(path, "
                "shard_size=...) or a target with more slots), which places every key "
                "again in its window") from None
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


def put_small(host: np.ndarray, target: TablePart, where: Any) -> jax.Array:
    """A small host array on the target's placement (``where``: its device, or its shards'
    sharding; a scalar is replicated on a mesh)."""
    host = np.asarray(host)
    if not target.sharded:
        return jax.device_put(host, where)
    sharding = where if host.ndim else NamedSharding(where.mesh, P())
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def state_names(part: StatePart) -> list[str]:
    """The names of a state's leaves, in its leaves' order."""
    return [f"{part.name}.{leaf_name(p)}" for p, _ in
            jax.tree_util.tree_flatten_with_path(part.state)[0]]


def state_from(part: StatePart, leaves: dict) -> Any:
    """``part.state``'s structure holding ``leaves`` (name → array)."""
    return jax.tree.structure(part.state).unflatten([leaves[n] for n in state_names(part)])
