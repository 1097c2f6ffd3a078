"""The native kernels of the built-in operators, registered on their OpDefs as ``native``.

Each ``_forward`` below takes the shapes and dtypes of the operator's ``xla`` kernel output
(``struct``, from :func:`jax.eval_shape`), so the two backends give the same pytree: max
shapes, dtypes, fill values and, where the xla kernel keeps one, the true shape.

Each operator's ``_declines`` says which calls its kernel does not serve, and why (an
``axis`` it has no code for, a dtype, a size past int32 counts); backend selection asks it
up front (:func:`supports`), so such calls run on ``xla`` and
``jaxops.backends.explain(op, inputs=..., attrs=...)`` says so. A forward may still return
``None`` where there is nothing to compute (no box to keep, an output of no rows): the
result is all padding, taken from the xla kernel's trace (XLA folds it to constants).

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
from jaxops.core.errors import BackendUnavailableError
from jaxops.core.float_bits import largest_at_most
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.registry import KernelFn, OpDef, on_op
from jaxops.core.shape_trace import shapes_only
from jaxops.native.pruned_call import pruned_ffi_call

__all__ = ["KERNELS", "declined", "native_kernel", "register", "supports"]

i32 = jnp.int32
Forward = Callable[..., Any]
Declines = Callable[..., "str | None"]


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
def _too_many(n: int) -> str | None:
    return (f"{n} elements: the kernels count in int32 (the xla kernel raises for this)"
            if n >= 2**31 - 128 else None)


def _nonzero_declines(x, *, size, transpose):
    return _too_many(math.prod(x.shape))


def _masked_select_declines(x, mask, *, size):
    return _too_many(math.prod(jnp.broadcast_shapes(x.shape, mask.shape)))


def _nonzero(mode, struct, x, *, size, transpose):
    shape = x.shape or (1,)
    n, rank = math.prod(shape), len(shape)
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


def _threshold(t, dtype):
    """A threshold operand of the kernels, rounded to ``dtype`` as the xla kernel rounds it
    (numpy for a Python value, XLA for a JAX scalar); 0 stands in for ``None``."""
    if isinstance(t, jax.Array):
        return t.astype(dtype)
    return jnp.asarray(np.asarray(0.0 if t is None else t, dtype))


def _onnx_nms(mode, struct, boxes, scores, *, max_output_boxes_per_class, iou_threshold,
              score_threshold, center_point_box, size, max_detections, pre_nms_top_k):
    rows = struct[0].data.shape[0]
    _, c, n = scores.shape
    per_class = min(n, max_output_boxes_per_class)
    per_image = c * per_class if max_detections is None else min(c * per_class, max_detections)
    if rows == 0 or per_image == 0:
        return None  # nothing to compute (see the module docstring)
    boxes, scores = _nms_float(boxes, scores)
    out, total, true = _call(
        "jaxops_onnx_nms", [((rows, 3), struct[0].data.dtype), ((), i32), ((), i32)],
        boxes, scores, _threshold(iou_threshold, scores.dtype),
        _threshold(score_threshold, scores.dtype), per_class=per_class, per_image=per_image,
        pre_nms_top_k=c * n if pre_nms_top_k is None else pre_nms_top_k,
        has_score_threshold=score_threshold is not None, center=center_point_box == 1,
        exact=mode != OpImplMode.HIGH_PERFORMANCE)
    three = jnp.int32(3)
    return (_dynarray(struct[0], out, [jnp.minimum(total, rows), three], [true, three]),)


def _batched_nms(mode, struct, boxes, scores, idxs, *, iou_threshold, max_output_size,
                 score_threshold, pre_nms_top_k):
    limit = struct[0].data.shape[0]
    if limit == 0:
        return None  # nothing to compute (see the module docstring)
    n = scores.shape[0]
    boxes, scores = _nms_float(boxes, scores)
    # torchvision compares its float IoU with a double threshold (see batched.py).
    iou = iou_threshold if isinstance(iou_threshold, jax.Array) else float(iou_threshold)
    iou = largest_at_most(iou, scores.dtype)
    groups = idxs.astype(i32) if idxs.dtype.itemsize <= 4 else \
        jnp.searchsorted(jnp.sort(idxs), idxs).astype(i32)  # the xla kernel's dense ids
    kept, count, true = _call(
        "jaxops_batched_nms", [((limit,), struct[0].data.dtype), ((), i32), ((), i32)],
        boxes, scores, groups, _threshold(iou, scores.dtype),
        _threshold(score_threshold, scores.dtype),
        pre_nms_top_k=n if pre_nms_top_k is None else pre_nms_top_k,
        has_score_threshold=score_threshold is not None,
        exact=mode != OpImplMode.HIGH_PERFORMANCE)
    return (_dynarray(struct[0], kept, [count], [true]),)


def _efficient_nms(mode, struct, boxes, scores, *, max_output_boxes, iou_threshold,
                   score_threshold, class_agnostic, box_coding, pre_nms_top_k):
    b, n, c = scores.shape
    k = max_output_boxes
    boxes_f, scores_f = _nms_float(boxes, scores)
    dtype = scores_f.dtype
    num, out_boxes, out_scores, classes, cut = _call(
        "jaxops_efficient_nms",
        [((b, 1), i32), ((b, k, 4), dtype), ((b, k), dtype), ((b, k), i32), ((b, 1), i32)],
        boxes_f, scores_f, _threshold(iou_threshold, dtype), _threshold(score_threshold, dtype),
        pre_nms_top_k=pre_nms_top_k, per_class_boxes=boxes.ndim == 4,
        agnostic=bool(class_agnostic), center=box_coding == 1)
    return (num, out_boxes.astype(boxes.dtype), out_scores.astype(scores.dtype), classes, cut)


# -- unique ---------------------------------------------------------------------------------
def _unique_declines(x, *, size, sorted, axis, equal_nan):
    """Float arrays, axis None (the xla kernel's sort path)."""
    if axis is not None:
        return "its Unique kernel flattens x (axis None); unique slices run on xla"
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return f"its Unique kernel takes floats; {np.dtype(x.dtype).name} runs on xla"
    return _too_many(math.prod(x.shape))


def _unique(mode, struct, x, *, size, sorted, axis, equal_nan):
    """One kernel: the full one (values and index outputs), or, sorted and with the index
    outputs unused inside jit, the values-only one (see :mod:`jaxops.native.pruned_call`)."""
    n, cap = x.size, struct[0].data.shape[0]
    idx = struct[1].data.dtype
    values_only = [("jaxops_unique_values", (0, 4), (("equal_nan", bool(equal_nan)),))]
    y, first, inverse, counts, total = pruned_ffi_call(
        "jaxops_unique", [((cap,), x.dtype), ((cap,), idx), ((n,), idx), ((cap,), idx), ((), i32)],
        x.reshape(-1), variants=values_only if sorted else (), sorted=bool(sorted),
        equal_nan=bool(equal_nan))
    found = [jnp.minimum(total, cap)]
    return (_dynarray(struct[0], y, found, [total]), _dynarray(struct[1], first, found, [total]),
            inverse, _dynarray(struct[3], counts, found, [total]))


def _serves_all(*inputs, **attrs) -> None:
    return None


#: operator name -> (forward(mode, xla output struct, *inputs, **attrs),
#: declines(*input shape/dtype structs, **attrs) -> why it does not serve the call, or None)
KERNELS: dict[str, tuple[Forward, Declines]] = {
    "NonZero": (_nonzero, _nonzero_declines),
    "MaskedSelect": (_masked_select, _masked_select_declines),
    "NonMaxSuppression": (_onnx_nms, _serves_all),
    "BatchedNMS": (_batched_nms, _serves_all),
    "EfficientNMS": (_efficient_nms, _serves_all),
    "Unique": (_unique, _unique_declines),
}


def _struct(x) -> jax.ShapeDtypeStruct | None:
    if x is None:
        return None
    dtype = getattr(x, "dtype", None)
    return jax.ShapeDtypeStruct(np.shape(x), dtype if dtype is not None else np.asarray(x).dtype)


def declined(op: OpDef, inputs, attrs) -> str | None:
    """Why the native kernel of ``op`` does not serve this call (``None``: it does)."""
    attrs = {a.name: a.default for a in op.attrs if a.name not in attrs} | dict(attrs)
    return KERNELS[op.name][1](*map(_struct, inputs), **attrs)


def supports(op, inputs=None, attrs=None) -> tuple[bool, str]:
    """The native backend's answer to backend selection (a ``BackendEntry.supports``):
    whether it serves this call of ``op`` (an op it has a kernel for). Without the inputs
    the answer is the kernel's existence; with them, its ``_declines`` decides.

    >>> import numpy as np, jaxops
    >>> supports(jaxops.get_op("Unique"), [np.zeros((2, 3), np.float32)], {"axis": 0})
    (False, 'its Unique kernel flattens x (axis None); unique slices run on xla')
    """
    if inputs is None:
        return True, "C++ kernel registered"
    why = declined(op, inputs, attrs or {})
    return (False, why) if why else (True, "C++ kernel")


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
        why = declined(op, inputs, attrs)
        if why:  # selection asks first (supports); this is a direct call of the kernel
            raise BackendUnavailableError(f"{op.name}: the native kernel does not serve this "
                                          f"call: {why}")
        chosen = op.select_mode(mode)
        xla = op.get_kernel("xla", chosen)
        leaves, in_tree = jax.tree_util.tree_flatten(list(inputs))

        def unflat(args):
            return jax.tree_util.tree_unflatten(in_tree, list(args))

        with shapes_only():  # the xla kernel's shapes, traced without its ladder's tiers
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
    for name, (forward, _) in KERNELS.items():
        on_op(name, lambda op, forward=forward: op.kernel("native")(native_kernel(op, forward)),
              "native kernel")
