"""MaskedSelect: the elements of ``x`` where ``mask`` is set, as a 1-D tensor (CANN / torch).

>>> import jax, jax.numpy as jnp, jaxops
>>> x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
>>> jaxops.refresh(jaxops.masked_select(x, jnp.array([True, False]))).tolist()  # broadcast
[1.0, 3.0]
>>> g = jax.grad(lambda x: jaxops.masked_select(x, x > 2).valid_data().sum())(x)
>>> g.tolist()
[[0.0, 0.0], [1.0, 1.0]]
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.capacity import documents_policy_args, run_with_policy
from jaxops.core.dtypes import DataType
from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError
from jaxops.core.float_bits import is_nonzero
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.registry import Input, OpDef, Output, register_op
from jaxops.ops._conventions import (ELEMENT_DTYPES, VALUE_FILL, capacity_attr, read_input,
                                     with_upstream_loss)
from jaxops.ops.compaction import compact_map, gather_valid

__all__ = [
    "MASKED_SELECT", "masked_select",
]


def _broadcast_shape(x_shape, mask_shape) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(tuple(x_shape), tuple(mask_shape)))
    except ValueError:
        raise OpArgumentError("MaskedSelect", "mask", f"a shape that broadcasts with x's "
                              f"{tuple(x_shape)}", tuple(mask_shape)) from None


def _infer_shape(ctx) -> list[tuple[int, ...]]:
    shape = _broadcast_shape(ctx.inputs[0].shape, ctx.inputs[1].shape)
    return [(math.prod(shape) if ctx.attrs["size"] is None else ctx.attrs["size"],)]


MASKED_SELECT = register_op(OpDef(
    name="MaskedSelect",
    inputs=[Input("x", ELEMENT_DTYPES), Input("mask", {DataType.BOOL, DataType.UINT8},
                                               doc="broadcasts with x; uint8: non-zero selects")],
    outputs=[Output("y", ELEMENT_DTYPES, doc="selected elements, row-major; padding 0")],
    attrs=[capacity_attr("max number of selected elements; None: the broadcast size")],
    infer_shape=_infer_shape,
    impl_modes=OpImplMode.HIGH_PRECISION | OpImplMode.HIGH_PERFORMANCE,
    data_dependent=True,
    fill_values=[VALUE_FILL],
    doc="Elements of x where the (broadcast) mask is set, in row-major order.",
))


def _source_index(x_shape, shape):
    """Maps flat positions in the broadcast ``shape`` to flat positions in ``x``."""
    x_shape = (1,) * (len(shape) - len(x_shape)) + tuple(x_shape)
    if x_shape == tuple(shape):
        return lambda flat: (flat,)
    strides = [math.prod(x_shape[k + 1:]) if x_shape[k] != 1 else 0 for k in range(len(shape))]

    def source(flat):
        src, rest = jnp.zeros_like(flat), flat
        for k in range(len(shape) - 1, -1, -1):
            src = src + (rest % shape[k]) * strides[k]
            rest = rest // shape[k]
        return (src,)
    return source


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gather_f32_accumulate(values, index, valid, n):
    return jnp.where(valid, values[index], jnp.zeros((), values.dtype))


def _gather_fwd(values, index, valid, n):
    return _gather_f32_accumulate(values, index, valid, n), (index, valid)


def _gather_bwd(n, res, ct):
    index, valid = res
    acc = jnp.zeros((n,), jnp.float32).at[index].add(jnp.where(valid, ct, 0).astype(jnp.float32))
    return acc.astype(ct.dtype), None, None


_gather_f32_accumulate.defvjp(_gather_fwd, _gather_bwd)


def _masked_select(x, mask, *, size, f32_grad):
    shape = _broadcast_shape(x.shape, mask.shape)
    capacity = math.prod(shape) if size is None else size
    full_mask = jnp.broadcast_to(is_nonzero(mask), shape)  # fused into the mask packing
    (src,), count = compact_map(full_mask, capacity, _source_index(x.shape, shape), [0])
    flat = x.reshape(-1)
    if f32_grad and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize < 4 and flat.shape[0]:
        valid = jnp.arange(capacity, dtype=jnp.int32) < count
        y = _gather_f32_accumulate(flat, jnp.clip(src, 0, flat.shape[0] - 1), valid, flat.shape[0])
    else:
        y = gather_valid(flat, src, count, VALUE_FILL)
    found = jnp.minimum(count, capacity)
    return (DynArray(y, found[None], true_shape=None if size is None else count[None],
                     fill_value=VALUE_FILL),)


@MASKED_SELECT.kernel("xla", modes=OpImplMode.HIGH_PRECISION)
def _masked_select_precise(x, mask, *, size):
    return _masked_select(x, mask, size=size, f32_grad=True)


@MASKED_SELECT.kernel("xla", modes=OpImplMode.HIGH_PERFORMANCE)
def _masked_select_fast(x, mask, *, size):
    return _masked_select(x, mask, size=size, f32_grad=False)


@documents_policy_args
def masked_select(x: jax.Array, mask: jax.Array, *, size: int | None = None,
                  overflow: str = "expand", record: bool | str = False,
                  impl_mode: OpImplMode | str | None = None, backend: str | None = None) -> DynArray:
    """Elements of ``x`` where ``mask`` is set, in row-major order (op "MaskedSelect").

    Args:
      x: array of any shape and numeric or bool dtype.
      mask: bool (or uint8: non-zero selects) array that broadcasts with ``x``. Either
        may be a :class:`DynArray`: only its valid region is read (the order is the row-major
        order of its exact array), and what it lost upstream counts in the result's
        ``true_shape`` (each lost element could have been selected), so ``overflowed()``
        reports it.
      size: capacity (``jnp.nonzero``'s convention). ``None`` means the broadcast size and
        cannot overflow; a smaller capacity keeps the first ``size`` elements and sets
        ``true_shape`` so ``.overflowed()`` / ``.lost()`` report the cut inside ``jit``.
      impl_mode: ``"high_precision"`` (default) or ``"high_performance"``. The forward
        values are identical in both. They differ only in the gradient for float16 /
        bfloat16 ``x`` broadcast against ``mask``, where several outputs come from one
        element of ``x``: high precision sums their cotangents in float32 and rounds once,
        high performance sums in ``x``'s dtype (rounding at each addition).
      {policy_args}

    Returns:
      A 1-D :class:`DynArray` of ``x``'s dtype, max shape ``[size]``, actual shape
      ``[n selected]``; padding holds 0. Differentiable w.r.t. ``x``: the cotangent of each
      selected element flows back to its position (summed over broadcast copies), padding
      gets none.

    Examples:
      >>> import jax.numpy as jnp, jaxops
      >>> import jax
      >>> d = jax.jit(lambda x: jaxops.masked_select(x, x % 2 == 0, size=2))(jnp.arange(6))
      >>> jaxops.refresh(d, allow_truncated=True).tolist(), int(d.lost())  # inside jit: cut
      ([0, 2], 1)
    """
    vx, vm = read_input("MaskedSelect", "x", x), read_input("MaskedSelect", "mask", mask)
    x, mask = vx.data, vm.data
    shape = _broadcast_shape(np.shape(x), np.shape(mask))
    if vx.valid is not None or vm.valid is not None:  # only the valid regions select
        mask = jnp.broadcast_to(is_nonzero(mask), shape)
        for valid in (vx.valid, vm.valid):
            mask = mask if valid is None else mask & jnp.broadcast_to(valid, shape)
    lost = [v.lost for v in (vx, vm) if v.lost is not None]

    def run(capacity: int | None, rerun_backend: str | None) -> DynArray:
        out = MASKED_SELECT(x, mask, size=capacity, impl_mode=impl_mode,
                            backend=rerun_backend or backend)[0]
        # the most either lost: an x and a mask cut by one capacity lose the same elements
        return with_upstream_loss(out, jnp.max(jnp.stack(lost)) if lost else None, 0)

    total = math.prod(shape)
    return run_with_policy(run, op="MaskedSelect", size=size, theoretical_max=total, policy=overflow,
                           record=record, input_shapes=[np.shape(x), np.shape(mask)])
