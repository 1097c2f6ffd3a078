"""The native kernels of the built-in operators, registered on their OpDefs as ``native``.

Each ``_forward`` below takes the shapes and dtypes of the operator's ``xla`` kernel output
(``struct``, from :func:`jax.eval_shape`), so the two backends give the same pytree: max
shapes, dtypes, fill values and, where the xla kernel keeps one, the true shape. A forward
returns ``None`` for the inputs it leaves to the xla kernel (an empty output).

:func:`native_kernel` wraps a forward into an operator kernel:

- **jit / eager**: one :func:`jax.ffi.ffi_call` per call to a C++ handler (no Python).
- **vmap**: ``vmap_method="broadcast_all"``: the handlers loop over leading batch axes.
- **grad**: a :func:`jax.custom_vjp` whose backward pass is the VJP of the ``xla`` kernel
  of the call's impl mode at the same inputs (the forward values are identical).

>>> import jax.numpy as jnp, jaxops
>>> x = jnp.array([[0, 3], [5, 0]])
>>> jaxops.refresh(jaxops.get_op("NonZero")(x, backend="xla")[0]).tolist()
[[0, 1], [1, 0]]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.dynarray import DynArray
from jaxops.core.float_bits import largest_at_most, np_ordered_bits
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.registry import KernelFn, OpDef, on_op

__all__ = ["KERNELS", "native_kernel", "register"]

i32 = jnp.int32
Forward = Callable[..., Any]


def _call(target: str, results: list[tuple[tuple[int, ...], Any]], *args, **attrs):
    """One FFI call; Python ints/floats become int64/float64 attributes."""
    attrs = {k: np.int64(v) if isinstance(v, int) and not isinstance(v, bool) else
             np.float64(v) if isinstance(v, float) else v for k, v in attrs.items()}
    shapes = [jax.ShapeDtypeStruct(s, d) for s, d in results]
    return jax.ffi.ffi_call(target, shapes, vmap_method="broadcast_all")(*args, **attrs)


def _dynarray(struct: DynArray, data, actual: list, true: list) -> DynArray:
    """The DynArray with ``struct``'s fill value and, when it has one, a true shape."""
    return DynArray(data, jnp.stack(actual).astype(i32),
                    true_shape=None if struct.true_shape is None else jnp.stack(true).astype(i32),
                    fill_value=struct.fill_value)


# -- stream compaction ----------------------------------------------------------------------
def _nonzero(mode, struct, x, *, size, transpose):
    shape = x.shape or (1,)
    n, rank = math.prod(shape), len(shape)
    if n >= 2**31 - 128:  # int32 positions: the xla kernel raises for these
        return None
    capacity = n if size is None else size
    data, count = _call("jaxops_nonzero", [(struct[0].data.shape, struct[0].data.dtype), ((), i32)],
                        jnp.reshape(x, shape), rank=rank, capacity=capacity,
                        transpose=bool(transpose))
    found = jnp.minimum(count, capacity)
    r = jnp.int32(rank)
    actual, true = ([found, r], [count, r]) if transpose else ([r, found], [r, count])
    return (_dynarray(struct[0], data, actual, true),)


def _masked_select(mode, struct, x, mask, *, size):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    if math.prod(shape) >= 2**31 - 128:
        return None
    capacity = struct[0].data.shape[0]
    flat = [jnp.broadcast_to(a, shape).reshape(-1) for a in (x, mask)]
    y, count = _call("jaxops_masked_select", [((capacity,), x.dtype), ((), i32)], *flat,
                     capacity=capacity)
    return (_dynarray(struct[0], y, [jnp.minimum(count, capacity)], [count]),)


# -- non-maximum suppression ----------------------------------------------------------------
def _nms_float(*arrays):
    """NMS arithmetic runs in float32, or float64 for float64 inputs (as the xla kernel)."""
    dtype = jnp.promote_types(jnp.result_type(*arrays), jnp.float32)
    return [a.astype(dtype) for a in arrays]


def _thresholds(iou_threshold, score_threshold, dtype) -> dict[str, Any]:
    """The kernels' threshold attributes. The score threshold goes as its ``ordered_bits``
    key in ``dtype`` (as int64 bits), rounded here exactly as the xla kernel's
    ``float_bits.greater`` rounds it: the C++ side then compares keys only."""
    key = int(np_ordered_bits(np.asarray([score_threshold or 0.0], dtype))[0])
    return dict(iou_threshold=float(iou_threshold), has_score_threshold=score_threshold is not None,
                score_key=key - (1 << 64) if key >= 1 << 63 else key)  # int64 of the same bits


def _onnx_nms(mode, struct, boxes, scores, *, max_output_boxes_per_class, iou_threshold,
              score_threshold, center_point_box, size):
    rows = struct[0].data.shape[0]
    if rows == 0 or min(boxes.shape[1], max_output_boxes_per_class) * scores.shape[1] == 0:
        return None
    boxes, scores = _nms_float(boxes, scores)
    out, total = _call("jaxops_onnx_nms", [((rows, 3), struct[0].data.dtype), ((), i32)],
                       boxes, scores, limit=min(boxes.shape[1], max_output_boxes_per_class),
                       center=center_point_box == 1, exact=mode != OpImplMode.HIGH_PERFORMANCE,
                       **_thresholds(iou_threshold, score_threshold, scores.dtype))
    three = jnp.int32(3)
    return (_dynarray(struct[0], out, [jnp.minimum(total, rows), three], [total, three]),)


def _batched_nms(mode, struct, boxes, scores, idxs, *, iou_threshold, max_output_size,
                 score_threshold):
    limit = struct[0].data.shape[0]
    if limit == 0:
        return None
    boxes, scores = _nms_float(boxes, scores)
    # torchvision compares its float IoU with a double threshold (see suppression.py).
    iou_threshold = largest_at_most(float(iou_threshold), scores.dtype)
    kept, count = _call("jaxops_batched_nms", [((limit,), struct[0].data.dtype), ((), i32)],
                        boxes, scores, idxs.astype(i32), exact=mode != OpImplMode.HIGH_PERFORMANCE,
                        **_thresholds(iou_threshold, score_threshold, scores.dtype))
    return (_dynarray(struct[0], kept, [count], [count]),)


# -- unique ---------------------------------------------------------------------------------
def _unique(mode, struct, x, *, size, sorted, axis, equal_nan=True):
    """Float arrays, axis None, NaNs as one value (the xla kernel's sort path); the rest
    (``equal_nan=False`` included) stays on xla."""
    n, cap = x.size, struct[0].data.shape[0]
    if not equal_nan or axis is not None or not jnp.issubdtype(x.dtype, jnp.floating) \
            or n == 0 or cap == 0 or n >= 2**31:
        return None
    idx = struct[1].data.dtype
    y, first, inverse, counts, total = _call(
        "jaxops_unique", [((cap,), x.dtype), ((cap,), idx), ((n,), idx), ((cap,), idx), ((), i32)],
        x.reshape(-1), sorted=bool(sorted))
    found = [jnp.minimum(total, cap)]
    y = _dynarray(struct[0], y, found, [total])
    if sorted:  # y from the values-only kernel: where y alone is used, XLA drops the other
        values, n_values = _call("jaxops_unique_values", [((cap,), x.dtype), ((), i32)],
                                 x.reshape(-1))
        y = _dynarray(struct[0], values, [jnp.minimum(n_values, cap)], [n_values])
    return (y, _dynarray(struct[1], first, found, [total]), inverse,
            _dynarray(struct[3], counts, found, [total]))


#: operator name -> forward(mode, xla output struct, *inputs, **attrs)
KERNELS: dict[str, Forward] = {
    "NonZero": _nonzero,
    "MaskedSelect": _masked_select,
    "NonMaxSuppression": _onnx_nms,
    "BatchedNMS": _batched_nms,
    "Unique": _unique,
}


# -- the kernel wrapper ---------------------------------------------------------------------
def native_kernel(op: OpDef, forward: Forward) -> KernelFn:
    """An operator kernel running ``forward`` (see the module docstring); its ``bind_mode``
    gives the kernel of one impl mode, whose backward pass is that mode's ``xla`` kernel."""
    bound: dict[OpImplMode, KernelFn] = {}

    def bind_mode(mode: OpImplMode) -> KernelFn:
        if mode not in bound:
            bound[mode] = _native_kernel(op, forward, mode)
        return bound[mode]

    kernel = _native_kernel(op, forward, None)
    kernel.bind_mode = bind_mode
    return kernel


def _native_kernel(op: OpDef, forward: Forward, mode: OpImplMode | None) -> KernelFn:
    def kernel(*inputs, **attrs):
        chosen = op.select_mode(mode)
        xla = op.get_kernel("xla", chosen)
        leaves, in_tree = jax.tree_util.tree_flatten(list(inputs))

        def unflat(args):
            return jax.tree_util.tree_unflatten(in_tree, list(args))

        struct = jax.eval_shape(lambda *a: tuple(xla(*unflat(a), **attrs)), *leaves)
        if jax.eval_shape(lambda *a: forward(chosen, struct, *unflat(a), **attrs), *leaves) is None:
            return xla(*inputs, **attrs)

        @jax.custom_vjp
        def run(*args):
            return jax.tree_util.tree_leaves(forward(chosen, struct, *unflat(args), **attrs))

        def backward(args, cotangents):
            _, vjp = jax.vjp(lambda *a: jax.tree_util.tree_leaves(tuple(xla(*unflat(a), **attrs))),
                             *args)
            return vjp(list(cotangents))

        run.defvjp(lambda *args: (run(*args), args), backward)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(struct), run(*leaves))

    kernel.__name__ = kernel.__qualname__ = f"{op.name}_native_kernel"
    return kernel


def register() -> None:
    """Registers the native kernel of each operator in :data:`KERNELS` by name (through
    :func:`~jaxops.core.registry.on_op`: a misspelt name fails ``import jaxops``)."""
    for name, forward in KERNELS.items():
        on_op(name, lambda op, forward=forward: op.kernel("native")(native_kernel(op, forward)),
              "native kernel")
