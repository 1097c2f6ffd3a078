"""The sequential reference of the embedding hash table: plain Python, one key at a time.

Same hash (a byte-level MurmurHash3 x86_32 written from the algorithm, checked against the
published vectors), same linear probing, same slot layout as ``jaxops.hashtable``; every
batch is a loop in index order. The JAX operations must reproduce it exactly.
"""

from __future__ import annotations

import struct

import numpy as np

VALID, FILTER, EXPORT, EVICTED = 0x1, 0x2, 0x4, 0x8
_M32 = 0xFFFFFFFF


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86_32 of any byte string (Austin Appleby's algorithm)."""
    c1, c2 = 0xCC9E2D51, 0x1B873593

    def scramble(k):
        k = (k * c1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        return (k * c2) & _M32

    h = seed & _M32
    nblocks = len(data) // 4
    for i in range(nblocks):
        h ^= scramble(struct.unpack_from("<I", data, 4 * i)[0])
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    tail = data[4 * nblocks:]
    if tail:
        h ^= scramble(int.from_bytes(tail, "little"))
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def key_hash(key: int) -> int:
    return murmur3_32(struct.pack("<q", int(key)))


class RefTable:
    """A table as Python lists; every method mirrors one ``jaxops.hashtable`` operation."""

    def __init__(self, values: np.ndarray):
        self.values = np.array(values, np.float32)
        self.size, self.dim = self.values.shape
        self.keys = [-1] * self.size
        self.counters = [0] * self.size
        self.flags = [0] * self.size
        self.last_access = [0] * self.size
        self.epoch = [0] * self.size  # how many times a key was placed in each slot
        self.live = self.not_exported = self.dropped = self.clock = 0

    # -- probing --------------------------------------------------------------------------
    def probe(self, key: int) -> tuple[str, int]:
        """('hit', slot) for the key (live or its tombstone); ('new', slot) for an absent key:
        the first reusable slot (empty, or another key's tombstone) on its walk, which goes
        on to the first empty slot to prove the key absent; ('full', -1) when no slot is
        reusable. At most size probes."""
        home = key_hash(key) % self.size
        reuse = -1
        for d in range(self.size):
            s = (home + d) % self.size
            if self.flags[s] == 0:
                return "new", s if reuse < 0 else reuse
            if self.keys[s] == key:
                return "hit", s
            if self.flags[s] & EVICTED and reuse < 0:
                reuse = s
        return ("new", reuse) if reuse >= 0 else ("full", -1)

    def live_slot(self, key: int) -> int:
        kind, s = self.probe(key)
        return s if kind == "hit" and not self.flags[s] & EVICTED else -1

    def _take(self, s: int, key: int) -> None:
        """A new key in slot ``s`` (empty or a tombstone): counter 0, row kept."""
        self.keys[s], self.counters[s], self.flags[s] = key, 0, VALID

    # -- operations -----------------------------------------------------------------------
    def find(self, keys, default_value=0.0):
        rows = np.full((len(keys), self.dim), default_value, np.float32)
        found = np.zeros(len(keys), bool)
        for i, k in enumerate(keys):
            s = self.live_slot(int(k))
            if s >= 0:
                rows[i], found[i] = self.values[s], True
        return rows, found

    def lookup_or_insert(self, keys, filter_mode="no_filter", filter_freq=0,
                         default_key_or_value=False, default_key=0, default_value=0.0,
                         filter_key_flag=False, filter_key=-1, step=None):
        self.clock = (self.clock + 1 if step is None else int(step)) % 2**32
        n = len(keys)
        rows = np.full((n, self.dim), default_value, np.float32)
        info = {"slots": np.full(n, -1), "admitted": np.zeros(n, bool), "inserted": 0,
                "unplaced": 0, "not_admitted": 0, "filtered": 0}
        for i, k in enumerate(int(k) for k in keys):
            if filter_key_flag and k == filter_key:
                if not default_key_or_value:
                    info["filtered"] += 1
                    continue
                k = default_key
            kind, s = self.probe(k)
            if kind == "full":
                info["unplaced"] += 1
                self.dropped += 1
                continue
            if kind == "new" or self.flags[s] & EVICTED:
                if kind == "new":
                    self._take(s, k)
                self.flags[s] = VALID
                self.epoch[s] += 1
                info["inserted"] += 1
                self.live += 1
                self.not_exported += 1
            self.counters[s] += 1
            self.last_access[s] = self.clock
            info["slots"][i] = s
            if filter_mode == "counter":
                if self.flags[s] & FILTER or self.counters[s] >= filter_freq:
                    self.flags[s] |= FILTER
                else:
                    info["not_admitted"] += 1
                    continue
            rows[i] = self.values[s]
            info["admitted"][i] = True
        return rows, info

    def export(self, export_mode="all", filtered_export_flag=False):
        out = {"keys": [], "counters": [], "filter_flags": [], "values": []}
        for s in range(self.size):
            f = self.flags[s]
            if not f & VALID or f & EVICTED or (export_mode == "new" and f & EXPORT) \
                    or (filtered_export_flag and not f & FILTER):
                continue
            out["keys"].append(self.keys[s])
            out["counters"].append(self.counters[s])
            out["filter_flags"].append(1 if f & FILTER else 0)
            out["values"].append(self.values[s].copy())
            if not f & EXPORT:
                self.flags[s] |= EXPORT
                self.not_exported -= 1
        return {"keys": np.array(out["keys"], np.int64),
                "counters": np.array(out["counters"], np.uint64),
                "filter_flags": np.array(out["filter_flags"], np.uint8),
                "values": np.array(out["values"], np.float32).reshape(-1, self.dim)}

    def import_(self, keys, counters, filter_flags, values):
        info = {"inserted": 0, "unplaced": 0}
        for i, k in enumerate(int(k) for k in keys):
            kind, s = self.probe(k)
            if kind == "full":
                info["unplaced"] += 1
                self.dropped += 1
                continue
            if kind == "new":
                self._take(s, k)
                self.live += 1
                info["inserted"] += 1
                self.epoch[s] += 1
            elif self.flags[s] & EVICTED:
                self.live += 1
                info["inserted"] += 1
                self.epoch[s] += 1
            elif not self.flags[s] & EXPORT:
                self.not_exported -= 1
            self.counters[s] = int(counters[i])
            self.flags[s] = VALID | EXPORT | (FILTER if filter_flags[i] else 0)
            self.values[s] = values[i]
            self.last_access[s] = self.clock
        return info

    def evict(self, keys, init_mode="constant", const_val=0.0, sampled_values=None):
        for i, k in enumerate(int(k) for k in keys):
            s = self.live_slot(k)
            if s < 0:
                continue
            self._tombstone(s, const_val if init_mode == "constant" else sampled_values[i])

    def _tombstone(self, s: int, row) -> None:
        if not self.flags[s] & EXPORT:
            self.not_exported -= 1
        self.flags[s] |= EVICTED
        self.counters[s] = self.last_access[s] = 0
        self.live -= 1
        self.values[s] = row

    def age(self, s: int) -> int:
        """Steps since a lookup last touched slot ``s`` (modulo 2**32, as uint32)."""
        return (self.clock - self.last_access[s]) % 2**32

    def live_slots(self) -> list[int]:
        return [s for s in range(self.size) if self.flags[s] & VALID
                and not self.flags[s] & EVICTED]

    def evict_lowest(self, n: int, by: str = "lru", keep=(), const_val: float = 0.0) -> None:
        """The n live entries of lowest score become tombstones: lru orders by (age
        descending, counter, slot), lfu by (counter, age descending, slot)."""
        def score(s):
            return (-self.age(s), self.counters[s], s) if by == "lru" else \
                (self.counters[s], -self.age(s), s)

        candidates = [s for s in self.live_slots() if s not in set(keep)]
        for s in sorted(candidates, key=score)[:max(n, 0)]:
            self._tombstone(s, const_val)

    def evict_if(self, predicate, const_val: float = 0.0) -> None:
        """``predicate(key, counter, last_access, age) -> bool`` per live slot."""
        for s in self.live_slots():
            if predicate(self.keys[s], self.counters[s], self.last_access[s], self.age(s)):
                self._tombstone(s, const_val)

    def resize(self, new_values: np.ndarray) -> "RefTable":
        new = RefTable(new_values)
        for s in range(self.size):
            if not self.flags[s] & VALID or self.flags[s] & EVICTED:
                continue  # tombstones are not carried over
            kind, t = new.probe(self.keys[s])
            if kind != "new":
                new.dropped += 1
                continue
            new.keys[t], new.counters[t] = self.keys[s], self.counters[s]
            new.flags[t], new.last_access[t] = self.flags[s], self.last_access[s]
            new.values[t], new.epoch[t] = self.values[s], self.epoch[s]
        new.live, new.not_exported = self.live, self.not_exported
        new.dropped += self.dropped
        new.clock = self.clock
        return new

    @classmethod
    def from_table(cls, table) -> "RefTable":
        """A reference holding the same slots and counts as a ``HashTable``."""
        snap = table_snapshot(table)
        ref = cls(snap["values"])
        ref.keys, ref.counters = snap["keys"].tolist(), [int(c) for c in snap["counters"]]
        ref.flags, ref.last_access = snap["flags"].tolist(), snap["last_access"].tolist()
        ref.epoch = snap["epoch"].tolist()
        ref.live, ref.not_exported, ref.dropped = snap["live"], snap["not_exported"], snap["dropped"]
        ref.clock = snap["clock"]
        return ref

    def snapshot(self) -> dict:
        return {"keys": np.array(self.keys, np.int64),
                "counters": np.array(self.counters, np.uint64),
                "flags": np.array(self.flags, np.uint8), "values": self.values.copy(),
                "last_access": np.array(self.last_access, np.uint32),
                "epoch": np.array(self.epoch, np.uint32), "live": self.live, "not_exported": self.not_exported, "dropped": self.dropped,
                "clock": self.clock}


class RefAdamW:
    """CANN's in-table AdamW, sequential, in float32 (the formula of the Ascend kernel)."""

    def __init__(self, table: RefTable, amsgrad: bool = False):
        shape = table.values.shape
        self.m, self.v, self.max_v = (np.zeros(shape, np.float32) for _ in range(3))
        self.beta1_power = self.beta2_power = np.float32(1.0)
        self.amsgrad, self.skipped = amsgrad, 0
        # the key (and the slot's epoch) each slot's moments belong to
        self.owner = list(zip(table.keys, table.epoch))

    def apply(self, table: RefTable, keys, grads, lr, weight_decay, beta1=0.9, beta2=0.999,
              epsilon=1e-8, maximize=False):
        f32 = np.float32
        lr, wd, b1, b2, eps = (f32(x) for x in (lr, weight_decay, beta1, beta2, epsilon))
        self.beta1_power = f32(self.beta1_power * b1)
        self.beta2_power = f32(self.beta2_power * b2)
        summed: dict[int, np.ndarray] = {}
        for k, g in zip((int(k) for k in keys), np.asarray(grads, f32)):
            s = table.live_slot(k)  # -1 is a key like any other
            if s < 0:
                self.skipped += 1
                continue
            summed[s] = summed[s] + g if s in summed else g.copy()
        for s, g in summed.items():  # the Ascend kernel's expressions, term by term
            if self.owner[s] != (table.keys[s], table.epoch[s]):  # another key's moments, or
                self.m[s] = self.v[s] = self.max_v[s] = 0     # its earlier life: from zero
                self.owner[s] = (table.keys[s], table.epoch[s])
            g = -g if maximize else g
            w = table.values[s] * (f32(1) + (-lr * wd))
            m = self.m[s] * b1 - (b1 + f32(-1)) * g
            v = self.v[s] * b2 - (b2 + f32(-1)) * g * g
            self.m[s], self.v[s] = m, v
            if self.amsgrad:
                self.max_v[s] = np.maximum(self.max_v[s], v)
                v = self.max_v[s]
            denom = np.sqrt(-v / (self.beta2_power + f32(-1))) + eps
            table.values[s] = w + (lr * m / (self.beta1_power + f32(-1))) / denom


def table_snapshot(table) -> dict:
    """A ``jaxops.hashtable.HashTable`` in the shape of :meth:`RefTable.snapshot`."""
    from jaxops.hashtable.words import Words64, to_host_int64

    return {"keys": to_host_int64(Words64(table.key_lo, table.key_hi)),
            "counters": to_host_int64(Words64(table.counter_lo, table.counter_hi), signed=False),
            "flags": np.asarray(table.flags), "values": np.asarray(table.values),
            "last_access": np.asarray(table.last_access), "epoch": np.asarray(table.epoch),
            "live": int(table.live), "not_exported": int(table.not_exported),
            "dropped": int(table.dropped), "clock": int(table.clock)}


def assert_same_table(table, ref: RefTable, rtol: float = 0.0) -> None:
    """Every slot's key, counter, flags, last access and row, the three counts and the
    clock agree exactly
    (rows within ``rtol`` when float arithmetic such as AdamW has touched them)."""
    import chex

    got, want = table_snapshot(table), ref.snapshot()
    got_values, want_values = got.pop("values"), want.pop("values")
    chex.assert_trees_all_equal(got, want)
    if rtol:
        chex.assert_trees_all_close(got_values, want_values, rtol=rtol, atol=rtol)
    else:
        chex.assert_trees_all_equal(got_values, want_values)
