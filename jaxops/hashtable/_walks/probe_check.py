"""Checking a table's structure slot chunk by slot chunk: every used slot's key is where a
probe walk finds it (no empty slot between its home and it, and within its window,
:data:`~jaxops.hashtable._walks.probe.PROBE_LIMIT` slots), and no key is held twice.

A walk (:func:`~jaxops.hashtable._walks.probe.find_slots`) goes from the key's home slot
forward (wrapping) and stops at the first empty slot, so a key is reachable exactly when no
empty slot lies between its home and its slot. Tombstones are used slots: they never break
a chain (a walk passes them), and they are checked like live keys, since a key reviving an
unreachable tombstone would be inserted a second time. (A new key may take a tombstone's
slot — beyond CANN — but only after its walk proved it absent, so this invariant holds.) Two copies
of a key share a home, so once reachability holds they sit in the same *cluster* (maximal run of
used slots); duplicates are looked for within clusters. Both checks stream: the extra memory is one
chunk plus the cluster open at the chunk's end (and the one that wraps past the table's end), not a
copy of the table's keys. A table with no empty slot at all is one cluster (its keys are kept).

>>> import numpy as np
>>> check = ProbeCheck(4)
>>> flags = np.array([1, 1, 0, 0], np.uint8)
>>> keys = np.array([7, 7, -1, -1], np.int64).view(np.uint32).reshape(4, 2)
>>> check.feed(0, keys[:, 0], keys[:, 1], flags, home=np.array([0, 0, 2, 3]))
Traceback (most recent call last):
...
ValueError: key 7 is held twice (slots 0 and 1)
"""

from __future__ import annotations

import numpy as np

from jaxops.hashtable._walks.probe import probe_limit

__all__ = ["BeyondWindow", "ProbeCheck"]


class BeyondWindow(ValueError):
    """A key lies beyond its window: a table written where walks went farther (jaxops
    before the window kept keys up to 4,096 slots from home; CANN's walks go round the
    table), which this one cannot read in place."""


class ProbeCheck:
    """Feed consecutive chunks of slots with :meth:`feed`, then call :meth:`finish`; both
    raise ``ValueError`` (the caller words it for its file or buffer) at the first fault.
    With ``window=False`` keys beyond their window pass (a reader that places every key
    again); otherwise they raise :class:`BeyondWindow`."""

    def __init__(self, bucket_size: int, window: bool = True):
        self.size = int(bucket_size)
        self.limit = probe_limit(self.size) if window else self.size
        self.last_empty: int | None = None  # slot of the last empty slot fed so far
        self.head: list[tuple[np.ndarray, np.ndarray]] = []  # (slot, home) before any empty
        self.head_keys = (np.zeros(0, np.uint64), np.zeros(0, np.int64))  # first cluster
        self.open_keys = (np.zeros(0, np.uint64), np.zeros(0, np.int64))  # (key, slot)

    def feed(self, start: int, key_lo: np.ndarray, key_hi: np.ndarray, flags: np.ndarray,
             home: np.ndarray) -> None:
        """Checks slots ``[start, start + len(flags))`` (``home``: each slot's key's home)."""
        n = flags.shape[0]
        pos = np.arange(start, start + n, dtype=np.int64)
        used = flags != 0
        prev = np.maximum.accumulate(np.where(used, -1, pos))  # last empty slot at or before
        if self.last_empty is not None:
            prev = np.where(prev < 0, self.last_empty, prev)
        known = prev >= 0
        dist = (pos - np.asarray(home, np.int64)) % self.size
        far = np.flatnonzero(used & (dist >= self.limit))
        if far.size:
            s = int(pos[far[0]])
            raise BeyondWindow(f"the key at slot {s} lies {int(dist[far[0]])} slots past its "
                               f"home slot, beyond its window ({self.limit} slots): walks "
                               "would not find it")
        self._reachable(used & known, pos, dist, prev)
        self.head.append((pos[used & ~known], dist[used & ~known]))
        keys = (key_hi.astype(np.uint64) << np.uint64(32)) | key_lo.astype(np.uint64)
        cluster = np.cumsum(~used)[used]  # 0: the cluster still open from earlier chunks
        k, p = keys[used], pos[used]
        carried = np.concatenate([self.open_keys[0], k[cluster == 0]]), \
            np.concatenate([self.open_keys[1], p[cluster == 0]])
        _no_duplicates(*carried)
        rest = cluster > 0
        order = np.lexsort((k[rest], cluster[rest]))
        ks, cs, ps = k[rest][order], cluster[rest][order], p[rest][order]
        same = np.flatnonzero((ks[1:] == ks[:-1]) & (cs[1:] == cs[:-1]))
        if same.size:
            i = same[0]
            _raise_duplicate(ks[i], ps[i], ps[i + 1])
        if used.all():
            self.open_keys = carried
            return
        if self.last_empty is None:
            self.head_keys = carried
        tail = cluster == np.count_nonzero(~used) if used[-1] else np.zeros(cluster.shape, bool)
        self.open_keys = (k[tail], p[tail])
        self.last_empty = int(pos[~used][-1])

    def finish(self) -> None:
        """Checks what wraps around the table's end (call after the last chunk)."""
        if self.last_empty is None:  # no empty slot: every walk passes every slot
            return
        prev = self.last_empty - self.size  # the wrap: the last empty slot precedes slot 0
        for pos, dist in self.head:
            self._reachable(np.ones(pos.shape, bool), pos, dist, prev)
        _no_duplicates(np.concatenate([self.open_keys[0], self.head_keys[0]]),
                       np.concatenate([self.open_keys[1], self.head_keys[1]]))

    def _reachable(self, check, pos, dist, prev) -> None:
        bad = np.flatnonzero(check & (dist > pos - np.asarray(prev) - 1))
        if bad.size:
            s = int(pos[bad[0]])
            home = (s - int(dist[bad[0]])) % self.size
            raise ValueError(f"the key at slot {s} is unreachable: an empty slot lies between "
                             f"its home slot {home} and it")


def _no_duplicates(keys: np.ndarray, slots: np.ndarray) -> None:
    order = np.argsort(keys, kind="stable")
    same = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    if same.size:
        i = same[0]
        _raise_duplicate(keys[order][i], slots[order][i], slots[order][i + 1])


def _raise_duplicate(key, slot_a, slot_b) -> None:
    key = int(np.asarray(key, np.uint64).view(np.int64))
    a, b = sorted((int(slot_a), int(slot_b)))
    raise ValueError(f"key {key} is held twice (slots {a} and {b})")
