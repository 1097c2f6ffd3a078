"""The ``HashTable`` pytree and the 64-bit words it is made of.

A table is ``bucket_size`` slots of open addressing, one key per slot (CANN's bucket array).
Per slot it holds a key (int64, ``-1`` = empty), an access counter (uint64), a flag byte and
``embedding_dim`` float32 values. 64-bit quantities are stored as two uint32 words
``(lo, hi)`` so that every operation runs the same with ``jax_enable_x64`` off and on; they
become int64 / uint64 only at the host boundary (or as JAX arrays when x64 is on).

A key is a 64-bit pattern. A table's static ``key_dtype`` (``init_table(...,
key_dtype=np.uint64)``; default int64, CANN's dtype) says how its keys come back: ``export``
(int64 or uint64 JAX arrays with x64 on; word pairs that :func:`host_keys` joins with x64
off), ``export_chunks`` and checkpoints give them in that dtype. Host keys (numpy arrays,
Python ints) are values and must fit it: uint64 keys ``>= 2**63`` are refused by an int64
table and negative keys by a uint64 table, naming the fix. JAX arrays and :class:`Words64`
are taken as bit patterns whatever their dtype (inside ``jit`` nothing can be checked): with
x64 off pass 64-bit ids to a jitted step as ``as_words(ids, ...)``, since JAX itself narrows
a numpy int64 argument to int32 before any jaxops code sees it.

Flag bits (the byte CANN keeps at offset 23 of a bucket):

- ``VALID`` (0x1): the slot holds a key (CANN's "published" state is 1).
- ``FILTER`` (0x2): the key is admitted (counter filtering, or imported with flag 1).
- ``EXPORT`` (0x4): the entry has been exported (or imported) at least once.
- ``EVICTED`` (0x8): tombstone: the key stays (probe chains stay intact); the same key
  revives it, and a key whose probe proved it absent may take it (beyond CANN, where only
  the same key reuses the slot).

Beyond CANN, every slot also has a score for eviction: the access counter (LFU) and
``last_access`` (LRU), the table's ``clock`` when a lookup last touched the slot (see
:func:`~jaxops.ops.hashtable.lookup.lookup_or_insert` and :mod:`~jaxops.ops.hashtable.scored`).

>>> import jax.numpy as jnp
>>> t = HashTable.empty(4, 2, jnp.zeros((4, 2)))
>>> t.bucket_size, t.embedding_dim, int(t.live)
(4, 2, 0)
>>> words = as_words(jnp.array([-1, 7], jnp.int32), "Doc", "keys")
>>> [int(w) for w in words.lo], [int(w) for w in words.hi]
([4294967295, 7], [4294967295, 0])
>>> to_host_int64(as_words([2**64 - 1, -1], "Doc", "keys"), signed=False).tolist()
[18446744073709551615, 18446744073709551615]
>>> try:  # a host key that does not fit an int64 table
...     as_words([2**63], "Doc", "keys", key_dtype="int64")
... except OpArgumentError as e:
...     print(e.given, "|", e.hint[:44])
9223372036854775808 | Create the table with init_table(..., key_dt
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError, OpDTypeError

VALID = 0x1
FILTER = 0x2
EXPORT = 0x4
EVICTED = 0x8

EMPTY_WORD = np.uint32(0xFFFFFFFF)  # both words of the empty key -1
MAX_BUCKET_SIZE = 2**31 - 1  # slots are int32 indices


class Words64(NamedTuple):
    """A 64-bit integer array as its little-endian uint32 words (a pytree of two arrays)."""

    lo: jax.Array
    hi: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.lo.shape)


def _x64() -> bool:
    return bool(jax.config.jax_enable_x64)


def _host_words(x: np.ndarray) -> Words64:
    wide = x.astype(np.uint64 if x.dtype.kind == "u" else np.int64)
    pairs = np.ascontiguousarray(wide).view(np.uint32).reshape(*wide.shape, 2)
    return Words64(jnp.asarray(pairs[..., 0]), jnp.asarray(pairs[..., 1]))


_INTEGERS = "an integer array (int64 keys; int32/uint32 JAX arrays)"
_RANGE = "integers in [-2**63, 2**64) (int64, or uint64 bit patterns)"

#: The dtypes a table's keys may have (``HashTable.key_dtype``).
KEY_DTYPES = ("int64", "uint64")
_KEY_RANGE = {"int64": "[-2**63, 2**63)", "uint64": "[0, 2**64)"}
_KEY_FIX = {
    "int64": "Create the table with init_table(..., key_dtype=np.uint64) to keep uint64 keys, "
             "or pass their int64 bit patterns (keys.view(np.int64)).",
    "uint64": "A uint64 table takes keys >= 0; pass the uint64 bit patterns "
              "(keys.view(np.uint64)) if that is what the negative keys are.",
}


def check_key_dtype(op: str, key_dtype: Any, arg: str = "key_dtype") -> str:
    """``key_dtype`` (a dtype or its name) as ``"int64"`` or ``"uint64"``, else an error."""
    try:
        name = np.dtype(key_dtype).name if key_dtype is not None else None
    except TypeError:
        name = None
    if name not in KEY_DTYPES:
        raise OpArgumentError(op, arg, "np.int64 or np.uint64", repr(key_dtype))
    return name


def _check_fit(values: np.ndarray, op: str, arg: str, key_dtype: str | None) -> None:
    """Refuses host keys whose values the table's ``key_dtype`` cannot hold."""
    if key_dtype == "int64" and values.dtype.kind in "uO":
        bad = values >= 2**63
    elif key_dtype == "uint64" and values.dtype.kind in "iO":
        bad = values < 0
    else:
        return
    bad = np.asarray(bad, bool)
    if bad.any():
        wrong = values[bad].reshape(-1)
        more = f" (and {wrong.size - 1} more)" if wrong.size > 1 else ""
        raise OpArgumentError(op, arg, f"{key_dtype} keys in {_KEY_RANGE[key_dtype]} (the "
                              "table's key_dtype)", f"{int(wrong[0])}{more}", _KEY_FIX[key_dtype])


def _python_integers(x: Any, op: str, arg: str, key_dtype: str | None = None) -> np.ndarray:
    """Python ints (lists, nested lists) as uint64 bit patterns, each range-checked: numpy
    alone would turn ``[2**63, -1]`` into float64 and ``[2**64]`` into objects."""
    try:
        items = np.asarray(x, dtype=object)
    except ValueError as e:  # ragged nesting
        raise OpArgumentError(op, arg, _INTEGERS, f"a ragged sequence ({e})") from None
    flat = items.reshape(-1)
    for v in flat:
        if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
            raise OpDTypeError(op, arg, _INTEGERS, repr(v) if items.ndim == 0 else
                               f"a sequence holding {v!r}")
        if not -2**63 <= int(v) < 2**64:
            raise OpArgumentError(op, arg, _RANGE, repr(int(v)))
    _check_fit(flat, op, arg, key_dtype)
    return np.array([int(v) % 2**64 for v in flat], np.uint64).reshape(items.shape)


def as_words(x: Any, op: str, arg: str, key_dtype: str | None = None) -> Words64:
    """64-bit integers in any accepted form → :class:`Words64` (uint32 JAX arrays).

    Accepted: a ``Words64``; a numpy integer array of any width (uint64 as bit patterns),
    split on the host so int64 survives with x64 off; Python ints and (nested) lists of
    them in ``[-2**63, 2**64)``; a JAX int64/uint64 array (x64 on); a JAX int8..int32 array
    (sign-extended) or uint8..uint32 array (zero-extended).

    With ``key_dtype`` (a table's, ``"int64"`` or ``"uint64"``) host values (numpy arrays,
    Python ints) must fit it; JAX arrays and ``Words64`` stay bit patterns.
    """
    if isinstance(x, Words64):
        return Words64(jnp.asarray(x.lo).astype(jnp.uint32), jnp.asarray(x.hi).astype(jnp.uint32))
    if not isinstance(x, jax.Array):
        if isinstance(x, np.ndarray) and x.dtype != object:
            if x.dtype.kind not in "iu":
                raise OpDTypeError(op, arg, _INTEGERS, str(x.dtype))
            _check_fit(x, op, arg, key_dtype)
            return _host_words(x)
        try:
            arr = np.asarray(x)  # fast and exact when every int fits int64, or every uint64
        except (ValueError, OverflowError):
            arr = None
        if arr is None or arr.dtype.kind not in "iu":
            arr = _python_integers(x, op, arg, key_dtype)
        else:
            _check_fit(arr, op, arg, key_dtype)
        return _host_words(arr)
    dtype = np.dtype(x.dtype)
    if dtype.kind not in "iu":
        raise OpDTypeError(op, arg, _INTEGERS, str(dtype))
    if dtype.itemsize == 8:
        return Words64((x & 0xFFFFFFFF).astype(jnp.uint32), (x >> 32).astype(jnp.uint32))
    lo = x.astype(jnp.uint32)  # two's complement bits for signed inputs
    if dtype.kind == "i":
        return Words64(lo, jnp.where(x < 0, EMPTY_WORD, np.uint32(0)))
    return Words64(lo, jnp.zeros_like(lo))


def join_words(words: Words64, signed: bool = True) -> jax.Array:
    """The JAX form of 64-bit words: int64 (uint64 if not ``signed``) with x64 on; with x64
    off a uint32 array ``[..., 2]`` of ``(lo, hi)`` (see :func:`to_host_int64`)."""
    if _x64():
        dt = jnp.int64 if signed else jnp.uint64
        return (words.hi.astype(dt) << 32) | words.lo.astype(dt)
    return jnp.stack([words.lo, words.hi], axis=-1)


def to_host_int64(x: Any, signed: bool = True) -> np.ndarray:
    """Host numpy int64 (uint64 if not ``signed``) from :func:`join_words` output or Words64.

    >>> to_host_int64(np.array([[4294967295, 4294967295], [5, 0]], np.uint32)).tolist()
    [-1, 5]
    """
    dt = np.int64 if signed else np.uint64
    if isinstance(x, Words64):
        x = np.stack([np.asarray(x.lo), np.asarray(x.hi)], axis=-1)
    arr = np.asarray(jax.device_get(x))
    if arr.dtype == np.uint32 and arr.ndim and arr.shape[-1] == 2:
        return np.ascontiguousarray(arr).view(dt)[..., 0]
    return arr.astype(dt)


def host_keys(table: Any, keys: Any) -> np.ndarray:
    """Keys from ``table`` (``export``'s, refreshed; ``join_words`` output; ``Words64``) as
    host numpy in the table's ``key_dtype``.

    >>> t = HashTable.empty(4, 1, jnp.zeros((4, 1))).replace(key_dtype="uint64")
    >>> host_keys(t, as_words([2**64 - 1], "Doc", "keys")).tolist()
    [18446744073709551615]
    """
    key_dtype = getattr(table, "key_dtype", None)
    if key_dtype not in ("int64", "uint64"):
        raise OpArgumentError("host_keys", "table", "a HashTable or ShardedHashTable",
                              type(table).__name__)
    if not isinstance(keys, Words64):
        keys = check_numeric("host_keys", "keys", keys, "integer keys (export's keys, "
                             "join_words output) or Words64", integer=True)
    return to_host_int64(keys, signed=key_dtype == "int64")


def add_to_words(words: Words64, amount: jax.Array) -> Words64:
    """``words + amount`` (amount: non-negative uint32-range integers) with carry."""
    amount = jnp.asarray(amount).astype(jnp.uint32)
    lo = words.lo + amount
    return type(words)(lo, words.hi + (lo < words.lo).astype(jnp.uint32))


class Counter64(Words64):
    """A uint64 scalar counter as its two words; ``int(c)`` reads it on the host.

    >>> int(Counter64.zero()), int(add_to_words(Counter64.zero(), np.uint32(2**32 - 1)))
    (0, 4294967295)
    """

    __slots__ = ()

    def __int__(self) -> int:
        return int(to_host_int64(self, signed=False))

    @classmethod
    def zero(cls) -> "Counter64":
        return cls(jnp.zeros((), jnp.uint32), jnp.zeros((), jnp.uint32))


def as_counter(x: Any) -> Counter64:
    """A :class:`Counter64` from one, or from a plain non-negative integer scalar."""
    if isinstance(x, Counter64):
        return x
    w = as_words(x if isinstance(x, (Words64, jax.Array)) else np.uint64(x), "Counter64", "x")
    return Counter64(w.lo.reshape(()), w.hi.reshape(()))


def check_int(op: str, arg: str, x: Any, low: int, high: int, expected: str | None = None
              ) -> int:
    """``x`` as a Python int if it is an integer (not a bool) in ``[low, high]``; else an
    :class:`OpArgumentError` naming ``op`` and ``arg``.

    >>> check_int("doc", "n", np.int64(3), 0, 10)
    3
    """
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) \
            or not low <= int(x) <= high:
        raise OpArgumentError(op, arg, expected or f"an int in [{low}, {high}]", repr(x))
    return int(x)


def check_bucket_size(op: str, bucket_size: Any, arg: str = "bucket_size") -> int:
    return check_int(op, arg, bucket_size, 1, MAX_BUCKET_SIZE)


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
        live: int32 scalar, keys held and not evicted (CANN handle word 2).
        not_exported: int32 scalar, live keys never exported (CANN handle word 4).
        dropped: :class:`Counter64` (uint64), insertions so far that found no free slot
            (not in CANN); ``int(table.dropped)`` reads it.
        clock: uint32 scalar, the step of the last ``lookup_or_insert`` (each call advances
            it by one, or sets it to its ``step=``); wraps after 2**32 steps (not in CANN).
        max_load_factor, load_policy: static; the most live keys an insert may leave, as a
            fraction of the slots, and what happens beyond (see :func:`set_load_policy`).
        key_dtype: static, ``"int64"`` or ``"uint64"``: the dtype keys are checked against
            and given back in (see the module docstring).
    """

    key_lo: jax.Array
    key_hi: jax.Array
    counter_lo: jax.Array
    counter_hi: jax.Array
    flags: jax.Array
    values: jax.Array
    last_access: jax.Array
    live: jax.Array
    not_exported: jax.Array
    dropped: Counter64
    clock: jax.Array
    # Static (part of the pytree's structure): see jaxops.ops.hashtable.load. Not in CANN.
    max_load_factor: float = dataclasses.field(default=0.9, metadata={"static": True})
    load_policy: str = dataclasses.field(default="error", metadata={"static": True})
    key_dtype: str = dataclasses.field(default="int64", metadata={"static": True})

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
        full = lambda: jnp.full((bucket_size,), EMPTY_WORD, jnp.uint32)  # noqa: E731
        zero = lambda: jnp.zeros((bucket_size,), jnp.uint32)  # noqa: E731
        count = lambda: jnp.zeros((), jnp.int32)  # noqa: E731
        byte = jnp.zeros((bucket_size,), jnp.uint8)
        values = jnp.asarray(values, jnp.float32).reshape(bucket_size, embedding_dim)
        return cls(full(), full(), zero(), zero(), byte, values, zero(), count(), count(),
                   Counter64.zero(), jnp.zeros((), jnp.uint32))

    def __repr__(self) -> str:
        dtype = "" if self.key_dtype == "int64" else f", key_dtype={self.key_dtype!r}"
        return (f"HashTable(bucket_size={self.bucket_size}, embedding_dim={self.embedding_dim}"
                f"{dtype})")


def check_table(op: str, table: Any, arg: str = "table") -> HashTable:
    if not isinstance(table, HashTable):
        raise OpArgumentError(op, arg, "a jaxops.hashtable.HashTable (from init_table)",
                              type(table).__name__)
    return table


def check_numeric(op: str, arg: str, x: Any, expected: str, integer: bool = False) -> Any:
    """``x`` as an array (a JAX array, traced or not, stays one) if it holds numbers
    (``integer``: integers or bools); else an :class:`OpDTypeError` naming ``op`` and ``arg``.

    >>> check_numeric("doc", "values", [[1.0, 2.0]], "float rows").dtype
    dtype('float64')
    >>> check_numeric("doc", "values", [[1.0], [2.0, 3.0]], "float rows")
    Traceback (most recent call last):
    ...
    jaxops.core.errors.OpDTypeError: doc: argument 'values': expected float rows, got a ragged sequence.
    """
    try:
        arr = x if isinstance(x, jax.Array) else np.asarray(x)
    except (TypeError, ValueError):
        raise OpDTypeError(op, arg, expected, "a ragged sequence" if isinstance(
            x, (list, tuple)) else type(x).__name__) from None
    kinds = (jnp.integer, jnp.bool_) if integer else (jnp.number, jnp.bool_)
    if not any(jnp.issubdtype(arr.dtype, k) for k in kinds):
        given = repr(x) if x is None or isinstance(x, str) else (
            type(x).__name__ if arr.dtype == object else f"dtype {arr.dtype}")
        raise OpDTypeError(op, arg, expected, given)
    return arr
