"""The ``HashTable`` pytree: one table's slots, as every kernel sees them.

A table is ``bucket_size`` slots of open addressing, one key per slot (CANN's bucket array).
Per slot it holds a key (int64, ``-1`` = empty), an access counter (uint64), a flag byte and
``embedding_dim`` float32 values. 64-bit quantities are stored as two uint32 words
``(lo, hi)`` so that every operation runs the same with ``jax_enable_x64`` off and on; they
become int64 / uint64 only at the host boundary (or as JAX arrays when x64 is on).

A key is a 64-bit pattern. A table's static ``key_dtype`` (``init_table(...,
key_dtype=np.uint64)``; default int64, CANN's dtype; int32 / uint32 for ids that are 32-bit)
says how its keys come back: ``export`` (64-bit JAX arrays with x64 on; word pairs that
:func:`host_keys` joins with x64 off), ``export_chunks`` and checkpoints give them in that
dtype. Host keys (numpy arrays, Python ints) are values and must fit it: uint64 keys
``>= 2**63`` are refused by an int64 table and negative keys by a uint64 table, naming the
fix; word pairs given as keys are refused, naming :func:`host_keys`. :class:`Words64` are
bit patterns. With x64 off a 64-bit table refuses JAX arrays of 32 bits or less, traced or
not: JAX narrows a numpy int64 argument of a jitted function to int32 before any jaxops code
sees it, so pass 64-bit ids to a jitted step as ``ht.words.as_words(ids)`` (and make a
table of 32-bit ids with ``key_dtype=np.int32``).

Flag bits (the byte CANN keeps at offset 23 of a bucket):

- ``VALID`` (0x1): the slot holds a key (CANN's "published" state is 1).
- ``FILTER`` (0x2): the key is admitted (counter filtering, or imported with flag 1).
- ``EXPORT`` (0x4): the entry has been exported (or imported) at least once.
- ``EVICTED`` (0x8): tombstone: the key stays (probe chains stay intact); the same key
  revives it, and a key whose probe proved it absent may take it (beyond CANN, where only
  the same key reuses the slot).

Beyond CANN, every slot also has a score for eviction: the access counter (LFU) and
``last_access`` (LRU), the table's ``clock`` when a lookup last touched the slot (see
:func:`~jaxops.hashtable._ops.inserting.lookup_or_insert` and :mod:`~jaxops.hashtable._ops.scored`).

>>> import jax.numpy as jnp
>>> t = HashTable.empty(4, 2, jnp.zeros((4, 2)))
>>> t.bucket_size, t.embedding_dim, int(t.live)
(4, 2, 0)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._table.buffers import filled
from jaxops.hashtable._table.checks import KEY_DTYPES, check_int, check_numeric
from jaxops.hashtable._table.words64 import EMPTY_WORD, Counter64, Words64, to_host_int64

__all__ = ["EVICTED", "EXPORT", "FILTER", "MAX_BUCKET_SIZE", "VALID", "HashTable",
           "check_bucket_size", "check_table", "host_keys", "slot_bytes"]

VALID = 0x1
FILTER = 0x2
EXPORT = 0x4
EVICTED = 0x8

MAX_BUCKET_SIZE = 2**31 - 1  # slots are int32 indices


def check_bucket_size(op: str, bucket_size: Any, arg: str = "bucket_size") -> int:
    return check_int(op, arg, bucket_size, 1, MAX_BUCKET_SIZE)


def slot_bytes(embedding_dim: int) -> int:
    """The device bytes one slot of a table takes: its float32 row, six uint32 words
    (key, counter, last access, epoch) and its flag byte. A table of ``bucket_size`` slots
    holds ``bucket_size * slot_bytes(embedding_dim)`` bytes (on a mesh, each device its
    shard's share); ``init_table`` refuses one that the devices cannot hold.

    >>> slot_bytes(8)
    57
    """
    return 4 * embedding_dim + 4 * 6 + 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HashTable:
    """An embedding hash table (see the module docstring). Every field is data; the sizes
    are the static shapes of the arrays.

    Attributes:
        key_lo, key_hi: uint32 ``[bucket_size]``, the key words (``-1`` = both 0xFFFFFFFF).
        counter_lo, counter_hi: uint32 ``[bucket_size]``, the uint64 access counter.
        flags: uint8 ``[bucket_size]``, VALID / FILTER / EXPORT / EVICTED bits.
        values: float32 ``[bucket_size, embedding_dim]``.
        last_access: uint32 ``[bucket_size]``, the ``clock`` of the last lookup that touched
            the slot (0: never, or a tombstone); the LRU score (not in CANN).
        epoch: uint32 ``[bucket_size]``, how many times a key was placed in the slot (a new
            key, or a key reviving its tombstone); optimizer states record it with the key,
            so a key evicted and coming back starts from a fresh state (not in CANN).
        live: int32 scalar, keys held and not evicted (CANN handle word 2).
        not_exported: int32 scalar, live keys never exported (CANN handle word 4).
        dropped: :class:`Counter64` (uint64), insertions so far that found no free slot
            (not in CANN); ``int(table.dropped)`` reads it.
        clock: uint32 scalar, the step of the last ``lookup_or_insert`` (each call advances
            it by one, or sets it to its ``step=``); wraps after 2**32 steps (not in CANN).
        max_load_factor, load_policy: static; the most live keys an insert may leave, as a
            fraction of the slots, and what happens beyond (see :func:`set_load_policy`).
        key_dtype: static, ``"int64"``, ``"uint64"``, ``"int32"`` or ``"uint32"``: the
            dtype keys are checked against and given back in (see the module docstring);
            with x64 off a 64-bit table refuses JAX 32-bit id arrays (they may be narrowed
            64-bit ids), a 32-bit one takes them.
        initializer: static, the rows slots get when the table grows (or is rebuilt):
            ``("constant", value)``, ``("uniform", low, high, seed)`` with ``seed`` the PRNG
            key's words (None: not known, e.g. a key traced inside ``jit``),
            ``("callable", f, seed)`` (rows ``f(key, shape, dtype)``, a JAX initializer), or
            ``("sampled",)`` (rows given by the caller; growth fills with 0.0 unless told).
    """

    key_lo: jax.Array
    key_hi: jax.Array
    counter_lo: jax.Array
    counter_hi: jax.Array
    flags: jax.Array
    values: jax.Array
    last_access: jax.Array
    epoch: jax.Array
    live: jax.Array
    not_exported: jax.Array
    dropped: Counter64
    clock: jax.Array
    # Static (part of the pytree's structure): see set_load_policy. Not in CANN.
    max_load_factor: float = dataclasses.field(default=0.9, metadata={"static": True})
    load_policy: str = dataclasses.field(default="error", metadata={"static": True})
    key_dtype: str = dataclasses.field(default="int64", metadata={"static": True})
    initializer: tuple = dataclasses.field(default=("constant", 0.0), metadata={"static": True})

    @property
    def bucket_size(self) -> int:
        return int(self.flags.shape[-1])

    @property
    def embedding_dim(self) -> int:
        return int(self.values.shape[-1])

    @property
    def keys(self) -> Words64:
        return Words64(self.key_lo, self.key_hi)

    @property
    def counters(self) -> Words64:
        return Words64(self.counter_lo, self.counter_hi)

    @property
    def max_live(self) -> int:
        """The most live keys an insert may leave (``max_load_factor * bucket_size``)."""
        return int(self.max_load_factor * self.bucket_size)

    def replace(self, **changes) -> "HashTable":
        """A copy with some fields replaced (e.g. ``values`` to differentiate through)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def empty(cls, bucket_size: int, embedding_dim: int, values: jax.Array) -> "HashTable":
        """A table with no keys whose slots hold ``values`` (the rows new keys start with)."""
        # Every field its own buffer: a jitted step may donate the whole table.
        full = lambda: filled((bucket_size,), jnp.uint32, EMPTY_WORD)  # noqa: E731
        zero = lambda: filled((bucket_size,), jnp.uint32, 0)  # noqa: E731
        count = lambda: jnp.zeros((), jnp.int32)  # noqa: E731
        byte = filled((bucket_size,), jnp.uint8, 0)
        values = jnp.asarray(values, jnp.float32).reshape(bucket_size, embedding_dim)
        return cls(full(), full(), zero(), zero(), byte, values, zero(), zero(), count(),
                   count(), Counter64.zero(), jnp.zeros((), jnp.uint32))

    def __repr__(self) -> str:
        dtype = "" if self.key_dtype == "int64" else f", key_dtype={self.key_dtype!r}"
        return (f"HashTable(bucket_size={self.bucket_size}, embedding_dim={self.embedding_dim}"
                f"{dtype})")


def check_table(op: str, table: Any, arg: str = "table") -> HashTable:
    if not isinstance(table, HashTable):
        raise OpArgumentError(op, arg, "a jaxops.hashtable.HashTable (from init_table)",
                              type(table).__name__)
    return table



def host_keys(table: Any, keys: Any) -> np.ndarray:
    """Keys from ``table`` (``export``'s, refreshed; ``join_words`` output; ``Words64``) as
    host numpy in the table's ``key_dtype``.

    >>> from jaxops.hashtable._table.words64 import as_words
    >>> t = HashTable.empty(4, 1, jnp.zeros((4, 1))).replace(key_dtype="uint64")
    >>> host_keys(t, as_words([2**64 - 1], "Doc", "keys")).tolist()
    [18446744073709551615]
    """
    key_dtype = getattr(table, "key_dtype", None)
    if key_dtype not in KEY_DTYPES:
        raise OpArgumentError("host_keys", "table", "a HashTable or ShardedHashTable",
                              type(table).__name__)
    if not isinstance(keys, Words64):
        keys = check_numeric("host_keys", "keys", keys, "integer keys (export's keys, "
                             "join_words output) or Words64", integer=True)
    return to_host_int64(keys, signed=key_dtype in ("int64", "int32")).astype(key_dtype)
