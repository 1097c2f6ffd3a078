"""Reductions, arg-reductions, softmax, cumulative sums, top-k and contractions: each reads
the valid region only (:mod:`jaxops.dynamic.rules` masks with the op's identity)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxops.dynamic import rules
from jaxops.dynamic.tensor import Tensor
from jaxops.onnx.handlers.common import jax_dtype, scalar
from jaxops.onnx.registry import handler

_KINDS = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
          "ReduceProd": "prod", "ReduceSumSquare": "sum_square", "ReduceL1": "l1",
          "ReduceL2": "l2", "ReduceLogSum": "log_sum", "ReduceLogSumExp": "log_sum_exp"}


def _reduce(ctx, x, axes=None):
    kind = _KINDS[ctx.op_type]
    if axes is not None:
        axes = ctx.known_ints(axes, "axes")
    elif "axes" in ctx.attrs:
        axes = ctx.attr("axes")
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return x
        axes = list(range(x.ndim))
    return rules.reduce(x, kind, axes, bool(ctx.attr("keepdims", 1)))


for _op, _kind in _KINDS.items():
    handler(_op, bounds="monotone" if _kind in ("max", "min") else None)(_reduce)


@handler("ArgMax", "ArgMin")
def _arg(ctx, x):
    out = rules.arg_reduce(x, "max" if ctx.op_type == "ArgMax" else "min", ctx.attr("axis", 0),
                           bool(ctx.attr("keepdims", 1)), bool(ctx.attr("select_last_index", 0)))
    return out.with_data(out.data.astype(jax_dtype(7)))


@handler("Softmax", "LogSoftmax", "Hardmax")
def _softmax(ctx, x):
    kind = {"Softmax": "softmax", "LogSoftmax": "log_softmax", "Hardmax": "hardmax"}[ctx.op_type]
    if ctx.opset < 13:  # the input is read as 2-D [prod(:axis), prod(axis:)]
        axis = ctx.attr("axis", 1) % max(x.ndim, 1)
        flat = rules.flatten(x, axis)
        return rules.reshape(rules.softmax(flat, 1, kind), list(x.dims), list(x.shape))
    return rules.softmax(x, ctx.attr("axis", -1), kind)


@handler("CumSum")
def _cumsum(ctx, x, axis):
    a = int(scalar(axis)) % x.ndim
    exclusive, reverse = ctx.attr("exclusive", 0), ctx.attr("reverse", 0)
    data = x.masked(0, (a,))
    if reverse:  # the valid part reversed in place, padding behind it
        d = x.dims[a]
        n = x.shape[a]
        rev = jnp.clip(jnp.asarray(d, jnp.int32) - 1 - jnp.arange(n), 0, max(n - 1, 0))
        data = jnp.take(data, rev, axis=a)
    out = jnp.cumsum(data, axis=a, dtype=data.dtype)
    if exclusive:
        out = out - data
    if reverse:
        out = jnp.take(out, rev, axis=a)
    return x.with_data(out)


@handler("TopK")
def _topk(ctx, x, k):
    axis = ctx.attr("axis", -1) % x.ndim
    largest = bool(ctx.attr("largest", 1))
    if ctx.opset < 10:
        kk, k_max = ctx.attr("k"), ctx.attr("k")
    elif k.concrete:
        kk = k_max = int(np.asarray(k.data).reshape(-1)[0])
    else:
        hi = float(np.max(k.bounds()[1]))
        k_max = int(min(hi, x.shape[axis])) if np.isfinite(hi) else x.shape[axis]
        kk = k.jax().reshape(-1)[0].astype(jnp.int32)
    if isinstance(kk, int) and kk > x.shape[axis]:
        raise ctx.error("K", f"at most the axis size {x.shape[axis]}", kk)
    values, indices = rules.top_k(x, kk, k_max, axis, largest)
    indices = indices.with_data(indices.data.astype(jax_dtype(7)))
    indices.lo, indices.hi = np.zeros(()), np.asarray(float(max(x.shape[axis] - 1, 0)))
    return values, indices


@handler("MatMul")
def _matmul(ctx, a, b):
    return rules.matmul(a, b, ctx.where)


@handler("Gemm")
def _gemm(ctx, a, b, c=None):
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if ctx.attr("transA", 0):
        a = rules.transpose(a, (1, 0))
    if ctx.attr("transB", 0):
        b = rules.transpose(b, (1, 0))
    y = rules.matmul(a, b, ctx.where)
    if alpha != 1.0:
        y = rules.elementwise(lambda v: v * jnp.asarray(alpha, v.dtype), y)
    if c is not None:
        y = rules.elementwise(lambda v, w: v + jnp.asarray(beta, v.dtype) * w.astype(v.dtype),
                              y, c, op=ctx.where)
    return y


@handler("Einsum")
def _einsum(ctx, *xs):
    if not all(x.is_static for x in xs):
        raise ctx.error("Inputs", "static shapes", "a dynamic one")
    return Tensor(jnp.einsum(ctx.attr("equation"), *[x.jax() for x in xs]))
