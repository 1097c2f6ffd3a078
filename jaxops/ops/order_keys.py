"""Order-preserving unsigned integer keys: the one place that says how values compare.

Unique and UniqueConsecutive sort and compare these keys instead of the values, because
XLA's CPU sort is fast for one unsigned-integer operand and slow for floats or several
operands, and because the keys fix the equality rules once:

- ``-0.0`` and ``0.0`` are one value;
- every NaN (any sign or payload) is one value, ordered after ``+inf`` (numpy's
  ``equal_nan=True``; ONNX leaves NaN unspecified); callers that keep NaNs apart
  (``equal_nan=False``) flag them with :func:`nan_rows`;
- subnormals are values (decided on the bits, see :mod:`jaxops.core.float_bits`);
- integers and bools keep their order; keys are uint32, or uint64 for 64-bit dtypes.

>>> import jax.numpy as jnp
>>> k = sortable_keys(jnp.array([1.0, -0.0, 0.0, jnp.nan, -jnp.inf, -jnp.nan]))
>>> [int(v) for v in jnp.argsort(k, stable=True)]
[4, 1, 2, 0, 3, 5]
>>> bool(k[1] == k[2]), bool(k[3] == k[5])
(True, True)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxops.core.errors import OpDTypeError
from jaxops.core.float_bits import ordered_bits

__all__ = [
    "key_dtype", "nan_rows", "rows_differ_from_previous", "sortable_keys", "values_from_keys",
]


def key_dtype(dtype) -> jnp.dtype:
    """uint64 for 64-bit dtypes (x64 on), uint32 for everything narrower."""
    return jnp.dtype(jnp.uint64 if jnp.dtype(dtype).itemsize == 8 else jnp.uint32)


def sortable_keys(x: jax.Array) -> jax.Array:
    """Unsigned keys with ``key(a) < key(b)`` iff ``a < b`` (NaN largest), equal iff equal."""
    x = jnp.asarray(x)
    kdt = key_dtype(x.dtype)
    bits = kdt.itemsize * 8
    sign = jnp.asarray(1 << (bits - 1), kdt)
    if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.unsignedinteger):
        return x.astype(kdt)
    if jnp.issubdtype(x.dtype, jnp.signedinteger):
        wide = x.astype(jnp.int64 if bits == 64 else jnp.int32)
        return jax.lax.bitcast_convert_type(wide, kdt) ^ sign
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise OpDTypeError("sortable_keys", "x", "a bool, integer or float array", x.dtype)
    # On the bits: XLA:CPU flushes subnormals in float compares and converts.
    return ordered_bits(x).astype(kdt)


def values_from_keys(keys: jax.Array, dtype) -> jax.Array:
    """Inverse of :func:`sortable_keys` for bool and integer dtypes (floats are not
    recovered: several values share a key, so callers gather them from the input)."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.signedinteger):
        sign = jnp.asarray(1 << (keys.dtype.itemsize * 8 - 1), keys.dtype)
        signed = jnp.int64 if keys.dtype.itemsize == 8 else jnp.int32
        return jax.lax.bitcast_convert_type(keys ^ sign, signed).astype(dtype)
    if dtype == jnp.bool_ or jnp.issubdtype(dtype, jnp.unsignedinteger):
        return keys.astype(dtype)
    raise OpDTypeError("values_from_keys", "dtype", "a bool or integer dtype", dtype)


def rows_differ_from_previous(keys: jax.Array) -> jax.Array:
    """bool ``[m]``: row ``i`` of ``keys`` (``[m]`` or ``[m, r]``) differs from row ``i-1``;
    row 0 always counts as different (it starts the first run)."""
    if keys.shape[0] == 0:
        return jnp.zeros((0,), bool)
    diff = keys[1:] != keys[:-1]
    if diff.ndim > 1:
        diff = jnp.any(diff, axis=tuple(range(1, diff.ndim)))
    return jnp.concatenate([jnp.ones((1,), bool), diff])


def nan_rows(rows: jax.Array) -> jax.Array:
    """bool ``[m]``: row ``i`` of ``rows`` (``[m]`` values or ``[m, r]`` slices) holds a NaN.
    All False for non-float dtypes. (A NaN is never flushed: FTZ touches subnormals only.)

    >>> nan_rows(jnp.array([[1.0, jnp.nan], [1.0, 2.0]])).tolist()
    [True, False]
    """
    if not jnp.issubdtype(rows.dtype, jnp.floating):
        return jnp.zeros(rows.shape[:1], bool)
    nan = jnp.isnan(rows)
    return jnp.any(nan, axis=tuple(range(1, nan.ndim))) if nan.ndim > 1 else nan
