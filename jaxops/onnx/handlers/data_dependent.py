"""The data-dependent ops are jaxops' own operators, called as a Python program would:
``NonZero`` is :func:`jaxops.nonzero`, ``NonMaxSuppression``
:func:`jaxops.non_max_suppression`, ``Unique`` :func:`jaxops.unique`, ``Compress``
:func:`jaxops.masked_select` (or the kept indices of :func:`jaxops.nonzero` with an axis).
Their inputs go in as DynArrays (read in their valid region, an upstream loss carried on);
a user capacity (``load(..., capacities=)``, or a calibrated plan) becomes their ``size=``,
and each records the size its output needed against its bound (:meth:`Context.sized`)."""

from __future__ import annotations

import math
import warnings

import numpy as np

from jaxops.dynamic import rules
from jaxops.dynamic.tensor import Tensor
from jaxops.onnx.handlers.common import jax_dtype, scalar
from jaxops.onnx.registry import handler
from jaxops.ops.masked_select import masked_select
from jaxops.ops.nms import non_max_suppression
from jaxops.ops.nonzero import nonzero
from jaxops.ops.unique import unique


def _capacity(ctx, bound: int) -> int | None:
    """The capacity the user or plan gives the node, never above its bound (``None``: the
    bound)."""
    cap = ctx.capacity()
    return None if cap is None or cap >= bound else int(cap)


def _public(t: Tensor):
    return t.to_public(0)


def _of(d, static_axes=()):
    return Tensor.of(d, static_axes)


@handler("NonZero")
def _nonzero(ctx, x):
    out = nonzero(_public(x), size=_capacity(ctx, math.prod(x.shape)), overflow="truncate")
    ctx.sized(out, 1, math.prod(x.shape))
    t = _of(out, static_axes=(0,))
    t.lo, t.hi = np.asarray(-1.0), np.asarray(float(max(x.shape, default=1)))
    return t


@handler("NonMaxSuppression")
def _nms(ctx, boxes, scores, max_out=None, iou=None, score_threshold=None):
    limit = 0 if max_out is None else scalar(max_out)
    if not isinstance(limit, (int, np.integer)):
        raise ctx.error("max_output_boxes_per_class", "a value known at trace time",
                        "a traced value")
    limit = int(min(max(limit, 0), scores.shape[2]))
    bound = scores.shape[0] * scores.shape[1] * limit  # every class's limit, every batch
    iou_t = 0.0 if iou is None else scalar(iou)
    st = None if score_threshold is None else scalar(score_threshold)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ONNX's default of 0 boxes is the model's choice
        out = non_max_suppression(_public(boxes), _public(scores), limit,
                                  float(iou_t) if isinstance(iou_t, float) else iou_t,
                                  float(st) if isinstance(st, float) else st,
                                  center_point_box=ctx.attr("center_point_box", 0),
                                  size=_capacity(ctx, bound), overflow="truncate")
    ctx.sized(out, 0, bound)
    t = _of(out, static_axes=(1,))
    t.lo, t.hi = np.asarray(-1.0), np.asarray(float(max(scores.shape)))
    return t


@handler("Unique")
def _unique(ctx, x):
    axis = ctx.attr("axis")
    bound = math.prod(x.shape) if axis is None else x.shape[axis]
    y, idx, inv, cnt = unique(_public(x) if axis is None else x.jax(),
                              size=_capacity(ctx, bound), sorted=bool(ctx.attr("sorted", 1)),
                              axis=axis, return_index=True, return_inverse=True,
                              return_counts=True, overflow="truncate")
    ctx.sized(y, 0 if axis is None else axis % x.ndim, bound, idx, cnt)
    y = _of(y, static_axes=tuple(k for k in range(x.ndim) if k != (axis or 0) % max(x.ndim, 1))
            if axis is not None else ())
    itype = jax_dtype(7)  # ONNX's int64, as JAX holds it
    return (y, *(rules.elementwise(lambda v: v.astype(itype), _of(d)) for d in (idx, inv, cnt)))


@handler("Compress")
def _compress(ctx, x, condition):
    axis = ctx.attr("axis")
    if axis is None:
        flat = rules.flatten(x, 0) if x.ndim else x
        flat = rules.squeeze(flat, (0,)) if flat.ndim == 2 else flat
        n = min(flat.shape[0], condition.shape[0])
        cond = rules.slice_axis(condition, 0, 0, n, 1)
        data = rules.slice_axis(flat, 0, 0, n, 1)
        out = masked_select(_public(data), _public(cond), size=_capacity(ctx, n),
                            overflow="truncate")
        ctx.sized(out, 0, n)
        return _of(out)
    axis %= x.ndim
    n = min(x.shape[axis], condition.shape[0])
    cond = rules.slice_axis(condition, 0, 0, n, 1)
    kept = nonzero(_public(cond), size=_capacity(ctx, n), overflow="truncate")
    row = math.prod(x.shape) // max(x.shape[axis], 1) * x.dtype.itemsize
    ctx.sized(kept, 1, n)
    if ctx.sizes is not None and ctx.node.output[0] in ctx.sizes:  # the gathered rows' bytes
        ctx.sizes[ctx.node.output[0]] = ctx.sizes[ctx.node.output[0]]._replace(row_bytes=row)
    idx = rules.squeeze(_of(kept, static_axes=(0,)), (0,))
    return rules.gather(x, idx, axis)
