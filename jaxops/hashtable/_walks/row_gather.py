"""Reading one shard's rows by slot, differentiably: ``gather_rows`` with a scatter-add VJP.

>>> import jax, jax.numpy as jnp
>>> values = jnp.arange(6.0).reshape(3, 2)
>>> gather_rows(values, jnp.array([2, -1, 2])).tolist()
[[4.0, 5.0], [0.0, 0.0], [4.0, 5.0]]
>>> jax.grad(lambda v: gather_rows(v, jnp.array([2, -1, 2])).sum())(values).tolist()
[[0.0, 0.0], [0.0, 0.0], [2.0, 2.0]]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.core.walk_table import walk_kernel

__all__ = ["SLOTS", "check_slots", "gather_rows", "probed_rows", "put_each", "put_rows",
           "take_each", "take_rows"]

SLOTS = "an integer array of slots (e.g. lookup_or_insert's info.slots; -1 = absent)"


def gather_rows(values: jax.Array, slots: jax.Array, default_value: float = 0.0) -> jax.Array:
    """Rows ``values[slots]`` (shape ``slots.shape + (dim,)``); slot -1 gives
    ``default_value``; slots must be in ``[0, rows)`` or -1 (unchecked).

    The VJP w.r.t. ``values`` scatter-adds each row's cotangent into its slot (rows of slot
    -1 send nothing), so ``jax.grad`` of a loss over looked-up rows reaches the table rows;
    duplicate slots accumulate.
    """
    return _gather(values, slots, default_value)


def take_rows(a: jax.Array, at: jax.Array) -> jax.Array:
    """``a[at]`` along axis 0 for int32 slots ``at`` in range (a per-slot array of a table:
    keys, counters, rows, optimizer state); see :func:`take_each`."""
    return take_each([a], at)[0]


def take_each(arrays: list[jax.Array], at: jax.Array) -> list[jax.Array]:
    """``[a[at] for a in arrays]`` (per-slot arrays of one length, ``at`` int32 in range).
    Where the walks take the native path, one C++ pass copies every array's row of a lane
    together, with prefetches ahead: the random misses of all the arrays overlap (XLA's
    gathers, one per array and fused into their consumers, stall on each in turn); the
    same values either way."""
    native = walk_kernel("take_rows")
    at = at.astype(jnp.int32)
    if native is not None and at.ndim == 1 and arrays:
        return list(native(arrays, at))
    return [a.at[at].get(mode="promise_in_bounds", indices_are_sorted=False) for a in arrays]


def put_rows(a: jax.Array, at: jax.Array, rows: jax.Array) -> jax.Array:
    """``a`` with ``a[at[i]] = rows[i]`` where ``at[i]`` is in range; see :func:`put_each`."""
    return put_each([a], at, [rows])[0]


def put_each(arrays: list[jax.Array], at: jax.Array, rows: list[jax.Array]) -> list[jax.Array]:
    """Each ``a`` with ``a[at[i]] = r[i]`` where ``at[i]`` is in range (distinct slots; an
    index past the end writes nothing), updated in place where the arrays are donated: on
    the native path one C++ pass with prefetches for all of them, else XLA's scatters."""
    native = walk_kernel("put_rows")
    at = at.astype(jnp.int32)
    if native is not None and at.ndim == 1 and arrays:
        return list(native(arrays, at, rows))
    return [a.at[at].set(r.astype(a.dtype), mode="drop", unique_indices=True)
            for a, r in zip(arrays, rows)]


def check_slots(slots: np.ndarray, rows: int) -> None:
    """Only -1 means "absent": any other slot outside ``[0, rows)`` is refused by name."""
    bad = (slots != -1) & ((slots < 0) | (slots >= rows))
    if bad.any():
        where = [int(i) for i in np.argwhere(bad)[0]]
        raise OpArgumentError("gather", "slots", f"slots in [0, {rows}) or -1 (absent)",
                              f"{slots[tuple(where)].item()} at index {where}")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gather(values: jax.Array, slots: jax.Array, default_value: float = 0.0) -> jax.Array:
    flat = slots.reshape(-1)
    native = walk_kernel("gather_rows") if values.dtype == jnp.float32 else None
    if native is not None and flat.dtype == jnp.int32:
        rows = native(values, flat, default_value)  # one C++ loop with prefetching
    else:
        outside = jnp.where(flat >= 0, flat, values.shape[0])  # -1 would wrap around
        rows = jnp.take(values, outside, axis=0, mode="fill", fill_value=default_value)
    return rows.reshape(*slots.shape, values.shape[-1])


def _gather_fwd(values, slots, default_value):
    return _gather(values, slots, default_value), (slots, values)  # values: for shape/dtype


def _gather_bwd(default_value, res, cotangent):
    slots, values = res
    shape, dtype = values.shape, values.dtype
    flat = slots.reshape(-1)
    where = jnp.where(flat >= 0, flat, shape[0])
    grad = jnp.zeros(shape, dtype).at[where].add(cotangent.reshape(-1, shape[-1]), mode="drop")
    return grad, None


_gather.defvjp(_gather_fwd, _gather_bwd)


def probed_rows(kernel, values: jax.Array, probe: tuple, default_value: float = 0.0
                ) -> tuple[jax.Array, jax.Array]:
    """``(rows, slots)`` from a kernel that finds slots and reads their rows in one pass
    (``kernel(values, *probe, default_value)``, the ``find_rows`` walk), differentiable
    w.r.t. ``values`` as :func:`gather` is (the integer ``probe`` arrays get no cotangent)."""
    return _probed(kernel, default_value, values, *probe)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _probed(kernel, default_value, values, *probe):
    return kernel(values, *probe, default_value)


def _probed_fwd(kernel, default_value, values, *probe):
    rows, slots = kernel(values, *probe, default_value)
    return (rows, slots), (slots, values)


def _probed_bwd(kernel, default_value, res, cotangents):
    grad = _gather_bwd(default_value, res, cotangents[0])[0]
    return (grad,) + (None,) * _PROBE_ARGS


_PROBE_ARGS = 5  # the find_rows walk's probe: key_lo, key_hi, flags, lo, hi
_probed.defvjp(_probed_fwd, _probed_bwd)
