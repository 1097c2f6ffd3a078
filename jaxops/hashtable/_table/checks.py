"""Argument checks shared by the hash-table operations: every error names the operation,
the argument, what was expected and what was given.

>>> check_key_dtype("doc", np.uint64)
'uint64'
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError, OpDTypeError

__all__ = ["KEY_DTYPES", "check_int", "check_key_dtype", "check_numeric"]

#: The dtypes a table's keys may have (``HashTable.key_dtype``): 64-bit (CANN's int64, or
#: uint64 hashes), or 32-bit for ids that are 32-bit (JAX int32/uint32 arrays are then taken
#: as ids inside ``jit``, where a 64-bit table refuses them: they may be narrowed ids).
KEY_DTYPES = ("int64", "uint64", "int32", "uint32")


def check_key_dtype(op: str, key_dtype: Any, arg: str = "key_dtype") -> str:
    """``key_dtype`` (a dtype or its name) as ``"int64"`` or ``"uint64"``, else an error."""
    try:
        name = np.dtype(key_dtype).name if key_dtype is not None else None
    except TypeError:
        name = None
    if name not in KEY_DTYPES:
        raise OpArgumentError(op, arg, "np.int64, np.uint64, np.int32 or np.uint32",
                              repr(key_dtype))
    return name


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

