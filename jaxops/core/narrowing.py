"""Refuse 64-bit host inputs that JAX with x64 off (the default) would silently change.

With x64 off, JAX converts an int64 / uint64 / float64 / complex128 numpy array to its
32-bit type on the way to the device: ``2**40`` becomes ``0`` and ``1e-50`` becomes ``0.0``.
An operator must not answer for values the user did not give, so :func:`check_fits` (run by
the registry on every concrete numpy input) raises when any value changes in that
conversion, and lets through 64-bit arrays whose values all survive it (``np.arange``,
small integers, floats that are float32 values).

>>> import numpy as np
>>> check_fits("NonZero", "x", np.array([0, 5]))          # fits int32: fine
>>> check_fits("NonZero", "x", np.array([0, 2**40]))       # doctest: +ELLIPSIS
Traceback (most recent call last):
...
jaxops.core.errors.OpDTypeError: NonZero: argument 'x': expected values that fit int32 ...
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxops.core.errors import OpDTypeError

__all__ = ["check_fits"]

# The user's fix, in their program; the library never flips the flag itself.
_HINT = ('Enable 64-bit mode with jax.config.update('
         '"jax_enable_x64", True) at the start of '
         'your program, or convert the input to a 32-bit dtype yourself.')


def check_fits(op: str, arg: str, value: Any) -> None:
    """Raises :class:`~jaxops.errors.OpDTypeError` if ``value`` (a numpy array or scalar)
    is 64-bit, x64 is off, and some value would change when JAX narrows it."""
    if not isinstance(value, (np.ndarray, np.generic)) or jax.config.jax_enable_x64:
        return
    dtype = value.dtype
    if dtype.kind not in "iufc":
        return
    narrow = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if narrow == dtype:
        return
    value = np.asarray(value)
    with np.errstate(over="ignore", invalid="ignore"):
        back = value.astype(narrow).astype(dtype)
        same = (back == value) | (np.isnan(back) & np.isnan(value) if dtype.kind in "fc"
                                  else False)
        if dtype.kind in "fc":  # a value that becomes a zero of the other sign is kept
            same &= np.signbit(back.real) == np.signbit(value.real)
    if np.all(same):
        return
    where = tuple(int(i) for i in np.argwhere(~np.asarray(same))[0])
    bad = value[where] if where else value
    raise OpDTypeError(op, arg, f"values that fit {narrow} (jax_enable_x64 is off)",
                       f"{dtype} value {np.asarray(bad).item()!r} at index {list(where)}, which "
                       f"would become {np.asarray(bad).astype(narrow).item()!r}", _HINT)
