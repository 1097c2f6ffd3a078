"""The dtype a table keeps its rows in, and how float32 results go back into half rows.

A table's rows are float32 (the default), bfloat16 or float16 (``init_table(...,
dtype=jnp.bfloat16)``): half rows halve the rows' memory. Everything outside the table
stays float32: lookups give float32 rows (exact, a half value widens without change),
gradients and optimizer states are float32, and ``export`` gives float32 values.

Writing float32 into half rows rounds:

- an optimizer's update (``jaxops.hashtable.optim``, ``apply_adam_w``) rounds
  **stochastically** (:func:`stochastic_round`): up or down to the two nearest half values
  with the probabilities that make the expected row the float32 result, so updates smaller
  than half a unit in the last place still move a row on average (round-to-nearest would
  drop every one of them: a bf16 row near 1.0 ignores any step below 2**-9). The random bits
  are a hash of the slot, the column and a seed (:func:`rounding_seed`: the table's clock,
  the ``step`` and the optimizer state's update count), so a run is reproducible;
- every other write (``import_`` rows, ``evict``'s rows, new tables' rows) rounds to nearest
  (ties to even), as ``astype`` does; ``import_`` counts the values that changed.

>>> import jax.numpy as jnp
>>> check_row_dtype("doc", "bfloat16"), is_half(jnp.zeros(2, jnp.float16))
(dtype(bfloat16), True)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpDTypeError
from jaxops.hashtable._table.murmur import murmur3_x86_32

__all__ = ["ROW_DTYPES", "check_row_dtype", "is_half", "rounded_count", "rounding_seed",
           "row_bits", "stochastic_round", "widened"]

#: The dtypes a table's rows may have.
ROW_DTYPES = ("float32", "bfloat16", "float16")

_GOLDEN = np.uint32(0x9E3779B9)


def check_row_dtype(op: str, dtype: Any, arg: str = "dtype") -> np.dtype:
    """``dtype`` (a dtype or its name) as one of :data:`ROW_DTYPES`, else an
    :class:`~jaxops.core.errors.OpDTypeError` naming ``op`` and ``arg``."""
    try:
        name = jnp.dtype(dtype).name if dtype is not None and not isinstance(dtype, bool) \
            else None
    except TypeError:
        name = None
    if name not in ROW_DTYPES:
        given = f"{name} (rows are floats of 32 bits or fewer)" if name == "float64" else (
            name or repr(dtype))
        raise OpDTypeError(op, arg, "jnp.float32, jnp.bfloat16 or jnp.float16 (the rows' "
                           "dtype)", given)
    return jnp.dtype(name)


def is_half(values: Any) -> bool:
    """Whether ``values`` (rows, or a dtype) are bfloat16 or float16."""
    dtype = getattr(values, "dtype", values)
    return jnp.dtype(dtype).name in ROW_DTYPES[1:]


def widened(rows: jax.Array) -> jax.Array:
    """Half rows as float32 (exact); float32 rows as they are."""
    return rows.astype(jnp.float32) if is_half(rows) else rows


def rounded_count(rows: jax.Array, dtype: Any) -> jax.Array:
    """How many values of the float32 ``rows`` change when rounded to ``dtype`` (int32;
    NaN stays NaN and is not counted; a value beyond the dtype's range becomes infinite and
    is counted)."""
    if not is_half(dtype):
        return jnp.zeros((), jnp.int32)
    back = rows.astype(dtype).astype(rows.dtype)
    same = (back == rows) | (jnp.isnan(back) & jnp.isnan(rows))
    return jnp.sum(~same, dtype=jnp.int32)


def rounding_seed(clock: jax.Array, step: Any = None, count: Any = None) -> jax.Array:
    """The uint32 seed of one update's stochastic rounding: the table's ``clock``, the
    ``step`` (if given) and the update count kept in the optimizer state (if any)."""
    s = jnp.uint32(0) if step is None else jnp.asarray(step).astype(jnp.uint32)
    c = jnp.uint32(0) if count is None else jnp.asarray(count).astype(jnp.uint32)
    return murmur3_x86_32(jnp.asarray(clock, jnp.uint32) ^ (s * _GOLDEN), c)


def row_bits(seed: jax.Array, slots: jax.Array, dim: int) -> jax.Array:
    """uint32 ``[N, dim]`` random-looking bits for rows at ``slots`` (int ``[N]``): a hash
    of each element's (slot, column) and ``seed``."""
    cell = slots.astype(jnp.uint32)[:, None] * np.uint32(dim) + jnp.arange(dim, dtype=jnp.uint32)
    return murmur3_x86_32(cell, jnp.broadcast_to(seed, cell.shape))


def stochastic_round(x: jax.Array, dtype: Any, bits: jax.Array) -> jax.Array:
    """float32 ``x`` as ``dtype`` (bfloat16 or float16), rounded up or down at random so
    that the expected result is ``x``: the nearest value ``r`` (ties to even) is replaced by
    its neighbour ``n`` on ``x``'s side with probability ``|x - r| / |n - r|``, drawn from
    the top 24 of ``bits`` (uint32, ``x``'s shape). Exact values, infinities and NaN stay
    as the nearest rounding gives them; so does a value past the largest finite one.

    >>> x = jnp.full(4, 1.0 + 2.0 ** -10)    # a quarter of bf16's step above 1.0
    >>> bits = jnp.array([0, 2**30, 2**31, 3 * 2**30], jnp.uint32)
    >>> stochastic_round(x, jnp.bfloat16, bits).astype(jnp.float32).tolist()
    [1.0078125, 1.0, 1.0, 1.0]
    """
    r = x.astype(dtype)
    r32 = r.astype(jnp.float32)
    err = x - r32  # exact: x and r32 are float32 within one half-dtype step
    u = jax.lax.bitcast_convert_type(r, jnp.uint16)
    zero = (u & np.uint16(0x7FFF)) == 0
    up = (err > 0) == (r32 > 0)  # the neighbour on x's side is one step larger in magnitude
    smallest = jnp.where(err < 0, np.uint16(0x8001), np.uint16(0x0001))
    n = jnp.where(zero, smallest, jnp.where(up, u + np.uint16(1), u - np.uint16(1)))
    n32 = jax.lax.bitcast_convert_type(n, dtype).astype(jnp.float32)
    p = err / (n32 - r32)  # in [0, 1/2]; 0 when the neighbour is infinite
    draw = (bits >> np.uint32(8)).astype(jnp.float32) * np.float32(2.0 ** -24)
    take = jnp.isfinite(x) & (err != 0) & jnp.isfinite(n32) & (draw < p)
    return jnp.where(take, jax.lax.bitcast_convert_type(n, dtype), r)
