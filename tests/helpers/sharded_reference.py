"""The reference of a table on any placement: one plain-Python ``RefTable`` per shard.

A table of ``N`` shards holds each key in shard ``murmur3(key, SHARD_SEED) % N`` (as
``jaxops.hashtable.owner_shard`` routes it), and every shard is a table of its own with the
hash, probing and slot layout of :class:`~tests.helpers.hashtable_reference.RefTable`. So
the reference of a sharded table is ``N`` RefTables, each fed the keys it owns in batch
order, and slot ``s`` of shard ``i`` is the global slot ``i * shard_size + s``. One shard
(``ONE_DEVICE``, or a mesh of one device) is the single RefTable itself. What a call does
across shards (the clock every shard steps, ``evict_lowest``'s one order over all slots,
counts summed) is written here once.
"""

from __future__ import annotations

import struct

import numpy as np

from tests.helpers.hashtable_reference import EVICTED, VALID, RefAdamW, RefTable, murmur3_32

SHARD_SEED = 0x9E3779B9  # jaxops/hashtable/_placement/route.py


def owner(key: int, shards: int) -> int:
    """The shard that holds ``key``."""
    return murmur3_32(struct.pack("<q", int(key)), SHARD_SEED) % shards


class ShardedRef:
    """``shards`` RefTables of ``len(values) // shards`` slots, ``values`` their rows."""

    def __init__(self, shards: int, values: np.ndarray):
        self.per = len(values) // shards
        self.shards = [RefTable(values[i * self.per:(i + 1) * self.per]) for i in range(shards)]
        self.dim = self.shards[0].dim

    @classmethod
    def of(cls, snap: dict, shards: int) -> "ShardedRef":
        """A reference holding the slots of a :func:`placed_snapshot`."""
        ref = cls(shards, snap["values"])
        for i, shard in enumerate(ref.shards):
            part = slice(i * ref.per, (i + 1) * ref.per)
            shard.keys = snap["keys"][part].tolist()
            shard.counters = [int(c) for c in snap["counters"][part]]
            shard.flags = snap["flags"][part].tolist()
            shard.last_access = snap["last_access"][part].tolist()
            shard.epoch = snap["epoch"][part].tolist()
            used = shard.flags
            shard.live = sum(1 for f in used if f & VALID and not f & EVICTED)
            shard.not_exported = sum(1 for f in used if f & VALID and not f & (EVICTED | 4))
            shard.clock = snap["clock"]
        ref.shards[0].dropped = snap["dropped"]
        return ref

    def _route(self, keys) -> list[list[int]]:
        """The batch positions each shard gets, in batch order."""
        lanes = [[] for _ in self.shards]
        for i, k in enumerate(keys):
            lanes[owner(k, len(self.shards))].append(i)
        return lanes

    def global_slot(self, shard: int, slot: int) -> int:
        return -1 if slot < 0 else shard * self.per + slot

    # -- operations (RefTable's, across the shards) ----------------------------------------
    def lookup_or_insert(self, keys, *, filter_mode="no_filter", filter_freq=0,
                         default_key_or_value=False, default_key=0, default_value=0.0,
                         filter_key_flag=False, filter_key=-1, step=None):
        keys = [int(k) for k in keys]
        n = len(keys)
        rows = np.full((n, self.dim), default_value, np.float32)
        info = {"slots": np.full(n, -1), "admitted": np.zeros(n, bool), "inserted": 0,
                "unplaced": 0, "not_admitted": 0, "filtered": 0}
        # The special key is answered (filtered) or replaced before routing.
        routed = [not (filter_key_flag and k == filter_key and not default_key_or_value)
                  for k in keys]
        info["filtered"] = routed.count(False)
        if filter_key_flag and default_key_or_value:
            keys = [default_key if k == filter_key else k for k in keys]
        for s, lanes in enumerate(self._route(keys)):
            lanes = [i for i in lanes if routed[i]]
            got, part = self.shards[s].lookup_or_insert(
                [keys[i] for i in lanes], filter_mode=filter_mode, filter_freq=filter_freq,
                default_value=default_value, step=step)
            for j, i in enumerate(lanes):
                rows[i] = got[j]
                info["slots"][i] = self.global_slot(s, part["slots"][j])
                info["admitted"][i] = part["admitted"][j]
            for name in ("inserted", "unplaced", "not_admitted"):
                info[name] += part[name]
        return rows, info

    def locate(self, keys) -> np.ndarray:
        n = len(self.shards)
        return np.array([self.global_slot(owner(k, n), self.shards[owner(k, n)].live_slot(int(k)))
                         for k in keys], np.int64)

    def find(self, keys, default_value=0.0):
        return self.gather(self.locate(keys), default_value), self.locate(keys) >= 0

    def gather(self, slots, default_value=0.0) -> np.ndarray:
        rows = np.full((len(slots), self.dim), default_value, np.float32)
        for i, s in enumerate(slots):
            if s >= 0:
                rows[i] = self.shards[s // self.per].values[s % self.per]
        return rows

    def export(self, export_mode="all", filtered_export_flag=False) -> dict:
        parts = [s.export(export_mode, filtered_export_flag) for s in self.shards]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def exported_slots(self, export_mode="all", filtered_export_flag=False) -> np.ndarray:
        """The global slots :meth:`export` would export, in its order (nothing marked)."""
        out = []
        for i, shard in enumerate(self.shards):
            for s, f in enumerate(shard.flags):
                if f & VALID and not f & EVICTED and not (export_mode == "new" and f & 4) \
                        and not (filtered_export_flag and not f & 2):
                    out.append(i * self.per + s)
        return np.array(out, np.int64)

    def import_(self, keys, counters, filter_flags, values) -> dict:
        info = {"inserted": 0, "unplaced": 0}
        for s, lanes in enumerate(self._route(keys)):
            part = self.shards[s].import_([keys[i] for i in lanes], [counters[i] for i in lanes],
                                          [filter_flags[i] for i in lanes],
                                          [values[i] for i in lanes])
            info = {k: info[k] + part[k] for k in info}
        return info

    def evict(self, keys, const_val=0.0) -> None:
        for s, lanes in enumerate(self._route(keys)):
            self.shards[s].evict([keys[i] for i in lanes], const_val=const_val)

    def evict_if(self, predicate, const_val=0.0) -> None:
        for shard in self.shards:
            shard.evict_if(predicate, const_val)

    def evict_lowest(self, n: int, by: str = "lru", keep=(), const_val: float = 0.0) -> None:
        """The ``n`` live entries of lowest score over all shards: lru by (age descending,
        counter, global slot), lfu by (counter, age descending, global slot)."""
        keep = set(int(k) for k in keep)
        candidates = []
        for i, shard in enumerate(self.shards):
            for s in shard.live_slots():
                g = i * self.per + s
                if g not in keep:
                    age, counter = shard.age(s), shard.counters[s]
                    candidates.append(((-age, counter, g) if by == "lru" else (counter, -age, g),
                                       i, s))
        for _, i, s in sorted(candidates)[:max(n, 0)]:
            self.shards[i]._tombstone(s, const_val)

    def resize(self, total: int, fill: float) -> "ShardedRef":
        """The table rebuilt at ``total`` slots (each shard ``ceil(total / shards)``), free
        rows ``fill``."""
        per = -(-total // len(self.shards))
        new = ShardedRef(len(self.shards), np.full((per * len(self.shards), self.dim), fill,
                                                   np.float32))
        new.shards = [s.resize(np.full((per, self.dim), fill, np.float32)) for s in self.shards]
        return new

    @property
    def live(self) -> int:
        return sum(s.live for s in self.shards)

    def snapshot(self) -> dict:
        """The shards' :meth:`RefTable.snapshot` joined, in the shape of
        :func:`placed_snapshot`."""
        parts = [s.snapshot() for s in self.shards]
        out = {k: np.concatenate([p[k] for p in parts]) for k in
               ("keys", "counters", "flags", "values", "last_access", "epoch")}
        out.update({k: sum(p[k] for p in parts) for k in ("live", "not_exported", "dropped")})
        clocks = {p["clock"] for p in parts}
        out["clock"] = clocks.pop() if len(clocks) == 1 else sorted(clocks)
        return out


class ShardedAdamW:
    """CANN's in-table AdamW on a :class:`ShardedRef`: one RefAdamW per shard (each shard
    steps its beta powers on every call)."""

    def __init__(self, ref: ShardedRef):
        self.ref, self.parts = ref, [RefAdamW(s) for s in ref.shards]

    def apply(self, keys, grads, **hyper) -> None:
        for s, lanes in enumerate(self.ref._route(keys)):
            self.parts[s].apply(self.ref.shards[s], [keys[i] for i in lanes],
                                np.asarray(grads)[lanes].reshape(len(lanes), -1), **hyper)

    @property
    def skipped(self) -> int:
        return sum(p.skipped for p in self.parts)

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.concatenate([p.m for p in self.parts]),
                np.concatenate([p.v for p in self.parts]))


def placed_snapshot(table) -> dict:
    """A table on any placement in the shape of :meth:`ShardedRef.snapshot`: every slot in
    global order, the counts summed, the clock (every shard's, when they agree)."""
    import jax

    from jaxops.hashtable.words import Words64, to_host_int64

    t = getattr(table, "shards", table)
    get = lambda x: np.asarray(jax.device_get(x)).reshape(-1)  # noqa: E731
    clocks = sorted(set(get(t.clock).tolist()))
    return {"keys": to_host_int64(Words64(get(t.key_lo), get(t.key_hi))),
            "counters": to_host_int64(Words64(get(t.counter_lo), get(t.counter_hi)),
                                      signed=False),
            "flags": get(t.flags), "values": np.asarray(jax.device_get(t.values)).reshape(
                -1, t.values.shape[-1]),
            "last_access": get(t.last_access), "epoch": get(t.epoch),
            "live": int(get(t.live).sum()), "not_exported": int(get(t.not_exported).sum()),
            "dropped": int(np.sum(to_host_int64(t.dropped, signed=False), dtype=np.uint64)),
            "clock": clocks[0] if len(clocks) == 1 else clocks}


def live_entries(snap: dict) -> dict:
    """``{key: (counter, flags, last_access, row bytes)}`` of a snapshot's live slots: what a
    table holds whatever its layout."""
    live = ((snap["flags"] & VALID) != 0) & ((snap["flags"] & EVICTED) == 0)
    return {int(k): (int(c), int(f), int(a), v.tobytes()) for k, c, f, a, v in
            zip(snap["keys"][live], snap["counters"][live], snap["flags"][live],
                snap["last_access"][live], snap["values"][live])}
