"""Byte-exact interop with the Ascend kernels' bucket array and table handle.

A bucket (row) is ``24 + round_up_8(4 * dim)`` bytes: key int64 LE at 0, counter uint64 at
8, int32 "published" state at 16 (1 for a written key, 0 for an empty slot), EVICTED (0x8)
in byte 20, VALID, FILTER and EXPORT in byte 23 (bytes 21-22 zero), float32 values from 24,
zero padding. Empty slots hold key -1, counter, state and flags 0, and the row a new key will
get (InitEmbeddingHashTable writes the initial values into every bucket).

**Where EVICTED lives.** CANN's kernels disagree: EmbeddingHashTableEvict sets it as bit 3
of the int32 at byte 20 (byte 20, bit 0x8) and LookupOrInsert reads and clears it there,
while the arch35 Export kernel tests bit 0x8 of byte 23, which no CANN kernel sets. The
bytes follow the kernel that writes the flag (and the one that revives it): a table that
went through CANN's Evict reads right here, and an evicted bucket written here is what
CANN's Evict leaves. Byte 23 with 0x8 set is refused, saying where the bit belongs.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(4, 3, initializer_mode="constant", constant_value=2.0)
>>> t, _, _ = ht.lookup_or_insert(t, np.array([7], np.int64))
>>> buf = ht.cann.to_cann_bytes(t)
>>> buf.shape, handle_counters(t).tolist()
((4, 40), [0, 0, 1, 0, 1])
>>> back = ht.cann.from_cann_bytes(buf, 3)
>>> bool((ht.cann.to_cann_bytes(back) == buf).all())
True
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._table.checks import check_int, check_key_dtype, check_numeric
from jaxops.hashtable._table.host_chunks import HostRows
from jaxops.hashtable._table.murmur import home_slot
from jaxops.hashtable._table.table import EVICTED, EXPORT, FILTER, VALID, HashTable
from jaxops.hashtable._table.words64 import as_counter
from jaxops.hashtable._walks.probe_check import ProbeCheck

__all__ = ["cann_rows", "from_cann_bytes", "handle_counters", "live_counts", "parse_cann_rows",
           "row_bytes", "to_cann_bytes"]

_FLAG_BYTE_BITS = VALID | FILTER | EXPORT  # byte 23
_home = jax.jit(home_slot, static_argnums=2)
_CANN_EVICTED_BYTE = 20  # CANN's evict kernel writes EVICTED (0x8) here, LookupOrInsert reads it


def row_bytes(embedding_dim: int) -> int:
    """Bytes per bucket: ``24 + round_up_8(4 * embedding_dim)``."""
    dim = check_int("row_bytes", "embedding_dim", embedding_dim, 1, 2**31 - 1, "an int >= 1")
    return 24 + -(-4 * dim // 8) * 8


def to_cann_bytes(table: HashTable) -> np.ndarray:
    """The table as the Ascend bucket array: uint8 ``[bucket_size, row_bytes(dim)]``. CANN's
    bucket array holds one table: a table on a mesh is converted shard by shard."""
    _one_shard("to_cann_bytes", table)
    host = jax.device_get(table)
    return cann_rows(HostRows(*(np.asarray(getattr(host, f)) for f in HostRows._fields)))


def cann_rows(rows: HostRows) -> np.ndarray:
    """Host slots (all of a table or one chunk) as CANN buckets: uint8 ``[n, row_bytes]``;
    :func:`parse_cann_rows` is its inverse.

    >>> rows = HostRows(*(np.array([w], np.uint32) for w in (5, 0, 2, 0)),
    ...                 np.array([VALID], np.uint8), np.ones((1, 1), np.float32))
    >>> buf = cann_rows(rows)
    >>> buf.shape, buf[0, :9].tolist(), parse_cann_rows(buf, 1, "doc").counter_lo.tolist()
    ((1, 32), [5, 0, 0, 0, 0, 0, 0, 0, 2], [2])
    """
    size, dim = rows.values.shape
    out = np.zeros((size, row_bytes(dim)), np.uint8)
    out[:, 0:8] = _pair(rows.key_lo, rows.key_hi)
    out[:, 8:16] = _pair(rows.counter_lo, rows.counter_hi)
    out[:, 16:20] = ((rows.flags & VALID) != 0).astype("<i4").view(np.uint8).reshape(size, 4)
    out[:, _CANN_EVICTED_BYTE] = rows.flags & EVICTED
    out[:, 23] = rows.flags & _FLAG_BYTE_BITS
    out[:, 24:24 + 4 * dim] = np.asarray(rows.values, "<f4").view(np.uint8).reshape(size, 4 * dim)
    return out


def _pair(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """uint32 words → the 8 little-endian bytes of each 64-bit value, ``[n, 8]``."""
    return np.stack([lo, hi], axis=-1).astype("<u4").view(np.uint8).reshape(-1, 8)


def from_cann_bytes(buffer: np.ndarray, embedding_dim: int, *, key_dtype: Any = np.int64
                    ) -> HashTable:
    """The exact inverse of :func:`to_cann_bytes` (a flat buffer is accepted too).

    The bytes hold each key's 64 bits; ``key_dtype`` (as in ``init_table``) says which
    dtype the new table's keys have (the table's own is not part of CANN's layout).

    EVICTED is read from byte 20, where CANN's evict kernel writes it (see the module
    docstring). The live / not-exported counts are recounted from the flags; ``dropped``,
    ``clock`` and every ``last_access`` (not in CANN's bucket) start at 0.

    Raises:
        OpArgumentError: wrong size or dtype, a state other than 0/1, a state that
            disagrees with VALID, an empty slot that is not blank, unknown flag bits or
            EVICTED in byte 23; or a structure the walks would not read right (a key
            unreachable from its home slot or beyond the probe bound, a key held twice).
    """
    op = "from_cann_bytes"
    key_dtype = check_key_dtype(op, key_dtype)
    embedding_dim = check_int(op, "embedding_dim", embedding_dim, 1, 2**31 - 1, "an int >= 1")
    width = row_bytes(embedding_dim)
    buf = np.asarray(check_numeric(op, "buffer", buffer, "a uint8 bucket array (to_cann_bytes)",
                                   integer=True))
    if buf.dtype != np.uint8 or buf.size % width or (buf.ndim == 2 and buf.shape[1] != width):
        raise OpArgumentError(op, "buffer", f"uint8 rows of {width} bytes (embedding_dim "
                              f"{embedding_dim})", f"{buf.dtype} of shape {buf.shape}")
    rows = parse_cann_rows(buf.reshape(-1, width), embedding_dim, op)
    check = ProbeCheck(rows.flags.shape[0])
    try:
        check.feed(0, rows.key_lo, rows.key_hi, rows.flags, np.asarray(
            _home(rows.key_lo, rows.key_hi, rows.flags.shape[0])))
        check.finish()
    except ValueError as e:
        raise OpArgumentError(op, "buffer", "buckets of a table the walks read right",
                              str(e)) from None
    live, not_exported = live_counts(rows.flags)
    return HashTable(*(jnp.asarray(f) for f in rows[:6]),
                     last_access=jnp.zeros(rows.flags.shape, jnp.uint32),
                     epoch=jnp.zeros(rows.flags.shape, jnp.uint32), live=jnp.int32(live),
                     not_exported=jnp.int32(not_exported), dropped=as_counter(0),
                     clock=jnp.zeros((), jnp.uint32), key_dtype=key_dtype)


def live_counts(flags: np.ndarray) -> tuple[int, int]:
    """``(live, not_exported)`` of host flags: VALID and not EVICTED; of those, not EXPORT.

    >>> live_counts(np.array([0, VALID, VALID | EXPORT, VALID | EVICTED], np.uint8))
    (2, 1)
    """
    live = ((flags & VALID) != 0) & ((flags & EVICTED) == 0)
    return int(live.sum()), int((live & ((flags & EXPORT) == 0)).sum())


def parse_cann_rows(rows: np.ndarray, embedding_dim: int, op: str, first_slot: int = 0
                    ) -> HostRows:
    """CANN buckets (uint8 ``[n, row_bytes(dim)]``) → host slots, each bucket checked.

    Raises:
        OpArgumentError: (naming ``op``) a state other than 0/1, a state that disagrees
            with VALID, an empty slot that is not blank, unknown flag bits or EVICTED in
            byte 23; the message gives the bucket's index counted from ``first_slot``.
    """
    rows = np.ascontiguousarray(rows)
    size = rows.shape[0]
    keys = rows[:, 0:8].copy().view("<i8").reshape(size)
    counters = rows[:, 8:16].copy().view("<u8").reshape(size)
    state = rows[:, 16:20].copy().view("<i4").reshape(size)
    flags = (rows[:, 23] & _FLAG_BYTE_BITS) | (rows[:, _CANN_EVICTED_BYTE] & EVICTED)
    stray = (rows[:, _CANN_EVICTED_BYTE] & ~np.uint8(EVICTED)) | rows[:, 21] | rows[:, 22]
    problems = [
        ("EVICTED (0x8) in byte 20, where CANN's evict kernel writes it (not in the flag byte "
         "23: move it with buf[:, 20] |= buf[:, 23] & 8; buf[:, 23] &= ~8)",
         (rows[:, 23] & EVICTED) != 0),
        ("a state word of 0 or 1", ~np.isin(state, (0, 1))),
        ("state 1 exactly where the VALID flag is set", (state == 1) != ((flags & VALID) != 0)),
        ("empty slots with key -1, counter 0 and no flags",
         (state == 0) & ((keys != -1) | (counters != 0) | (flags != 0))),
        ("only the flag bits 0x1, 0x2, 0x4 in byte 23, 0x8 in byte 20 and zero bytes 21-22",
         ((rows[:, 23] & ~np.uint8(_FLAG_BYTE_BITS | EVICTED)) != 0) | (stray != 0)),
    ]
    for expected, bad in problems:
        if bad.any():
            s = int(np.argmax(bad))
            raise OpArgumentError(op, "buffer", expected, f"bucket {first_slot + s}: key "
                                  f"{keys[s]}, state {state[s]}, byte 20 {int(rows[s, 20]):#x}, "
                                  f"byte 23 {int(rows[s, 23]):#x}")
    values = rows[:, 24:24 + 4 * embedding_dim].copy().view("<f4").reshape(size, embedding_dim)
    key_words = keys.view(np.uint32).reshape(size, 2)
    counter_words = counters.view(np.uint32).reshape(size, 2)
    return HostRows(key_words[:, 0].copy(), key_words[:, 1].copy(), counter_words[:, 0].copy(),
                    counter_words[:, 1].copy(), flags, values)


def handle_counters(table: HashTable) -> np.ndarray:
    """CANN's table-handle words as int64 ``[5]``: index 2 the live count, 4 the
    not-yet-exported count (index 0 is the bucket array's device address there: 0 here)."""
    _one_shard("handle_counters", table)
    out = np.zeros(5, np.int64)
    out[2], out[4] = int(table.live), int(table.not_exported)
    return out


def _one_shard(op: str, table: Any) -> None:
    """CANN's buffers hold one table: a table on a mesh is refused, saying what to do."""
    if placement_of(op, table).routes:
        raise OpArgumentError(op, "table", "a HashTable (CANN's bucket array holds one table; "
                              "a ShardedHashTable is one table per shard)",
                              f"a ShardedHashTable of {table.num_shards} shards",
                              f"Convert shard i alone: {op}(jax.tree.map(lambda x: x[i], "
                              "table.shards)); or save(table, dir) for a checkpoint of all "
                              "shards.")
