"""64-bit integers as pairs of uint32 words: how keys and counters live inside JAX.

Every 64-bit quantity of a table (keys, access counters, the ``dropped`` count) is stored as
two uint32 words ``(lo, hi)``, so that every operation runs the same with ``jax_enable_x64``
off and on; they become int64 / uint64 only at the host boundary (or as JAX arrays when x64
is on). Host keys (numpy arrays, Python ints) are values and must fit the table's
``key_dtype``; JAX arrays and :class:`Words64` are taken as bit patterns whatever their
dtype. With x64 off pass 64-bit ids to a jitted step as ``as_words(ids)``: JAX itself
narrows a numpy int64 argument to int32 before any jaxops code sees it.

>>> import jax.numpy as jnp
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

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError, OpDTypeError

__all__ = ["Counter64", "EMPTY_WORD", "Words64", "add_to_words", "as_counter", "as_words",
           "join_words", "sum_counters", "to_host_int64"]

EMPTY_WORD = np.uint32(0xFFFFFFFF)  # both words of the empty key -1

_KEY_RANGE = {"int64": "[-2**63, 2**63)", "uint64": "[0, 2**64)",
              "int32": "[-2**31, 2**31)", "uint32": "[0, 2**32)"}
_KEY_LIMITS = {"int64": (-2**63, 2**63), "uint64": (0, 2**64), "int32": (-2**31, 2**31),
               "uint32": (0, 2**32)}
_KEY_FIX = {
    "int64": "Create the table with init_table(..., key_dtype=np.uint64) to keep uint64 keys, "
             "or pass their int64 bit patterns (keys.view(np.int64)).",
    "uint64": "A uint64 table takes keys >= 0; pass the uint64 bit patterns "
              "(keys.view(np.uint64)) if that is what the negative keys are.",
    "int32": "A table made with key_dtype=np.int32 takes 32-bit ids; make it with "
             "key_dtype=np.int64 for wider ones.",
    "uint32": "A table made with key_dtype=np.uint32 takes 32-bit ids; make it with "
              "key_dtype=np.uint64 for wider ones.",
}
_NARROWED = ("Pass 64-bit ids to a jitted step as ht.words.as_words(ids) (word pairs, made on "
             "the host), or make the table with key_dtype=np.int32 (or np.uint32) if the ids "
             "are 32-bit.")


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


def _check_fit(values: np.ndarray, op: str, arg: str, key_dtype: str | None) -> None:
    """Refuses host keys whose values the table's ``key_dtype`` cannot hold, and word pairs
    (``export``'s keys with x64 off) given as keys."""
    if key_dtype is None:
        return
    if values.dtype == np.uint32 and values.ndim >= 2 and values.shape[-1] == 2 \
            and key_dtype in ("int64", "uint64"):
        raise OpArgumentError(op, arg, f"{key_dtype} keys (or Words64)",
                              f"uint32 {list(values.shape)}: word pairs, as export gives keys "
                              "with x64 off", "Join them first: ht.host_keys(table, keys).")
    low, high = _KEY_LIMITS[key_dtype]
    if values.dtype.kind == "O":
        bad = np.array([not low <= int(v) < high for v in values.reshape(-1)], bool)
    else:
        info = np.iinfo(values.dtype)
        if low <= info.min and info.max < high:
            return
        bad = (values < low) if low > info.min else np.zeros(values.shape, bool)
        if info.max >= high:
            bad = bad | (values >= high)
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


def as_words(x: Any, op: str = "as_words", arg: str = "x", key_dtype: str | None = None,
             flat: bool = False) -> Words64:
    """64-bit integers in any accepted form → :class:`Words64` (uint32 JAX arrays).

    Accepted: a ``Words64``; a numpy integer array of any width (uint64 as bit patterns),
    split on the host so int64 survives with x64 off; Python ints and (nested) lists of
    them in ``[-2**63, 2**64)``; a JAX int64/uint64 array (x64 on); a JAX int8..int32 array
    (sign-extended) or uint8..uint32 array (zero-extended).

    With ``key_dtype`` (a table's) host values (numpy arrays, Python ints) must fit it and
    word pairs (``[..., 2]`` uint32, export's keys with x64 off) are refused, naming
    ``host_keys``; JAX arrays and ``Words64`` stay bit patterns, except that with x64 off a
    64-bit table refuses JAX arrays of 32 bits or less, traced or not: JAX narrows int64 ids
    to int32 at a jit boundary, so they may be ids already cut (make the table with
    ``key_dtype=np.int32`` when the ids are 32-bit). ``flat``: host keys come back flattened
    (split on the host: no reshape on the device).
    """
    if isinstance(x, Words64):
        return Words64(jnp.asarray(x.lo).astype(jnp.uint32), jnp.asarray(x.hi).astype(jnp.uint32))
    if not isinstance(x, jax.Array):
        if isinstance(x, np.ndarray) and x.dtype != object:
            if x.dtype.kind not in "iu":
                raise OpDTypeError(op, arg, _INTEGERS, str(x.dtype))
            _check_fit(x, op, arg, key_dtype)
            return _host_words(x.reshape(-1) if flat else x)
        try:
            arr = np.asarray(x)  # fast and exact when every int fits int64, or every uint64
        except (ValueError, OverflowError):
            arr = None
        if arr is None or arr.dtype.kind not in "iu":
            arr = _python_integers(x, op, arg, key_dtype)
        else:
            _check_fit(arr, op, arg, key_dtype)
        return _host_words(arr.reshape(-1) if flat else arr)
    dtype = np.dtype(x.dtype)
    if dtype.kind not in "iu":
        raise OpDTypeError(op, arg, _INTEGERS, str(dtype))
    if key_dtype in ("int64", "uint64") and dtype.itemsize < 8 and not _x64():
        raise OpArgumentError(op, arg, f"{key_dtype} ids as Words64 (or numpy int64) with "
                              "jax_enable_x64 off", f"a JAX {dtype} array{' ' + str(list(x.shape)) if x.ndim else ''}: "
                              "JAX may have narrowed 64-bit ids to it", _NARROWED)
    if key_dtype in ("int64", "uint64") and dtype == np.uint32 and x.ndim >= 2 \
            and x.shape[-1] == 2:
        raise OpArgumentError(op, arg, f"{key_dtype} keys (or Words64)",
                              f"uint32 {list(x.shape)}: word pairs", "Join them first: "
                              "ht.host_keys(table, keys).")
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




def sum_counters(counters: Words64) -> Counter64:
    """The sum of 64-bit counts laid along the leading axis (e.g. one per shard), as one
    :class:`Counter64`, with every carry: traceable, no host transfer.

    >>> c = Words64(np.uint32([2**32 - 1, 2**32 - 1, 3]), np.uint32([0, 1, 0]))
    >>> int(sum_counters(c))
    12884901889
    """
    lo = jnp.asarray(counters.lo).reshape(-1)
    hi = jnp.asarray(counters.hi).reshape(-1)
    # Halves of the low words sum without overflow for up to 2**16 terms.
    low16 = jnp.sum(lo & np.uint32(0xFFFF), dtype=jnp.uint32)
    high16 = jnp.sum(lo >> np.uint32(16), dtype=jnp.uint32) + (low16 >> np.uint32(16))
    new_lo = (low16 & np.uint32(0xFFFF)) | (high16 << np.uint32(16))
    return Counter64(new_lo, jnp.sum(hi, dtype=jnp.uint32) + (high16 >> np.uint32(16)))
