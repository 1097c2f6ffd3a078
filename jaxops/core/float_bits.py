"""Float predicates and order keys decided on the bits, not on float compares.

XLA:CPU runs with flush-to-zero / denormals-are-zero, and so can the thread a host
callback runs on; there ``1e-45 != 0`` is False and ``1e-45 > 0`` is False, while numpy,
torch and ONNX Runtime treat a subnormal as the value it is. Every "is it zero", "which is
larger" and "are they equal" the operators decide on floats therefore goes through the
integer bit pattern here, in JAX (:func:`is_nonzero`, :func:`ordered_bits`,
:func:`greater`) and in numpy for the host kernels (:func:`np_is_nonzero`,
:func:`np_ordered_bits`, :func:`np_greater`).

The order of :func:`ordered_bits` is the float order with ``-0.0 == 0.0`` and every NaN
(any sign or payload) one value above ``+inf``; it is an unsigned integer of the float's
own width, so widening it (``astype(uint32)``) keeps the order.

>>> import jax.numpy as jnp, numpy as np
>>> x = np.array([0.0, 1e-45, -1e-45, -0.0, np.nan], np.float32)
>>> is_nonzero(jnp.asarray(x)).tolist(), np_is_nonzero(x).tolist()
([False, True, True, False, True], [False, True, True, False, True])
>>> [int(i) for i in np.argsort(np_ordered_bits(x), kind="stable")]
[2, 0, 3, 1, 4]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["is_nonzero", "ordered_bits", "greater", "np_is_nonzero", "np_ordered_bits",
           "np_greater", "largest_at_most"]

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def _masks(dtype):
    """(unsigned dtype, sign bit, exponent-all-ones pattern) of a float dtype."""
    info = jnp.finfo(dtype)
    udt = np.dtype(_UINT[np.dtype(dtype).itemsize])
    nbits = udt.itemsize * 8
    sign = udt.type(1 << (nbits - 1))
    inf = udt.type(((1 << info.nexp) - 1) << info.nmant)
    return udt, sign, inf


def is_nonzero(x: jax.Array) -> jax.Array:
    """``x != 0`` exactly: subnormals are non-zero, ``-0.0`` is zero, NaN is non-zero."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return is_nonzero(jnp.real(x)) | is_nonzero(jnp.imag(x))
    if not _is_float(x.dtype):
        return x != 0
    udt, sign, _ = _masks(x.dtype)
    return (jax.lax.bitcast_convert_type(x, udt) & ~sign) != 0


def ordered_bits(x: jax.Array) -> jax.Array:
    """Unsigned keys of a float array (its own width): ``key(a) < key(b)`` iff ``a < b``,
    ``-0.0`` and ``0.0`` one key, every NaN one key above ``+inf``."""
    x = jnp.asarray(x)
    udt, sign, inf = _masks(x.dtype)
    raw = jax.lax.bitcast_convert_type(x, udt)
    mag = raw & ~sign
    raw = jnp.where(mag == 0, udt.type(0), raw)  # -0.0 -> +0.0
    key = jnp.where((raw & sign) != 0, ~raw, raw | sign)  # negatives order backwards
    return jnp.where(mag > inf, ~udt.type(0), key)  # every NaN: the largest key


def greater(x: jax.Array, threshold: float, inclusive: bool = False) -> jax.Array:
    """``x > threshold`` (``>=`` with ``inclusive``) on the bits; NaN is never greater.
    ``threshold`` is rounded to ``x``'s dtype as ``jnp.asarray`` would; it may be a JAX
    scalar (traced: then XLA rounds it, in XLA's float mode)."""
    x = jnp.asarray(x)
    if not _is_float(x.dtype):
        t = jnp.asarray(threshold).astype(x.dtype)
        return x >= t if inclusive else x > t
    if isinstance(threshold, jax.Array):
        t = ordered_bits(threshold.astype(x.dtype))
    else:
        t = jnp.asarray(np_ordered_bits(np.asarray(threshold, x.dtype)))
    k = ordered_bits(x)
    nan = ~jnp.zeros((), k.dtype)
    return (k != nan) & (k >= t if inclusive else k > t)


def np_is_nonzero(x: np.ndarray) -> np.ndarray:
    """numpy :func:`is_nonzero` (immune to the calling thread's FTZ/DAZ state)."""
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.complexfloating):
        return np_is_nonzero(x.real) | np_is_nonzero(x.imag)
    if not _is_float(x.dtype):
        return x != 0
    udt, sign, _ = _masks(x.dtype)
    return (x.view(udt) & ~sign) != 0


def np_ordered_bits(x: np.ndarray) -> np.ndarray:
    """numpy :func:`ordered_bits`."""
    x = np.asarray(x)
    udt, sign, inf = _masks(x.dtype)
    raw = np.ascontiguousarray(x).view(udt)
    mag = raw & ~sign
    raw = np.where(mag == 0, udt.type(0), raw)
    key = np.where((raw & sign) != 0, ~raw, raw | sign).astype(udt)
    return np.where(mag > inf, ~udt.type(0), key).astype(udt)


def np_greater(x: np.ndarray, threshold: float, inclusive: bool = False) -> np.ndarray:
    """numpy :func:`greater`."""
    x = np.asarray(x)
    if not _is_float(x.dtype):
        t = np.asarray(threshold, x.dtype)
        return x >= t if inclusive else x > t
    t = np_ordered_bits(np.asarray(threshold, x.dtype))
    k = np_ordered_bits(x)
    return (k != ~k.dtype.type(0)) & (k >= t if inclusive else k > t)


def largest_at_most(t, dtype):
    """The largest value of float ``dtype`` that is ``<= t``: a Python float for a Python
    ``t``; for a JAX scalar ``t`` (traced or not), a JAX scalar of ``dtype``.

    For a value ``v`` of that dtype, ``v > t`` computed in double (torchvision compares its
    float IoU with a double threshold) equals ``v > largest_at_most(t, dtype)`` computed in
    the dtype, because no value of the dtype lies strictly between the two.

    >>> largest_at_most(0.6, np.float32) < 0.6 < float(np.float32(0.6))
    True
    >>> float(largest_at_most(jnp.float32(0.6), np.float32)) == float(np.float32(0.6))
    True
    """
    if isinstance(t, jax.Array):
        r = t.astype(dtype)
        wide = jnp.promote_types(t.dtype, dtype)
        return jnp.where(r.astype(wide) > t.astype(wide), jnp.nextafter(r, jnp.asarray(-jnp.inf, dtype)), r)
    r = np.asarray(t, dtype)
    if float(r) > t:
        r = np.nextafter(r, np.asarray(-np.inf, dtype))
    return float(r)
