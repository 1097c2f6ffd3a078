"""Convolutions, pools, normalizations and RoiAlign: each runs at the max shape over the
axes whose rows are independent (:func:`jaxops.dynamic.rules.per_row`: a dynamic
batch axis; for RoiAlign a dynamic number of boxes)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxops.dynamic import rules
from jaxops.dynamic.tensor import Tensor
from jaxops.onnx.handlers.common import jax_dtype
from jaxops.onnx.registry import handler


def _pads(ctx, spatial, kernel, strides, dilations):
    """Explicit (lo, hi) padding per spatial axis, from ``pads`` or ``auto_pad``."""
    auto = ctx.attr("auto_pad", "NOTSET")
    n = len(spatial)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
        return out
    if auto == "VALID":
        return [(0, 0)] * n
    pads = ctx.attr("pads") or [0] * (2 * n)
    return [(pads[i], pads[i + n]) for i in range(n)]


def _window(ctx, w):
    """(kernel, rank, strides, dilations) of a convolution's attributes."""
    kernel = w.shape[2:]
    n = len(kernel)
    return kernel, n, ctx.attr("strides") or [1] * n, ctx.attr("dilations") or [1] * n


def _with_bias(y, b, n):
    return y if b is None else y + b.jax().astype(y.dtype).reshape((1, -1) + (1,) * n)


@handler("Conv")
def _conv(ctx, x, w, b=None):
    kernel, n, strides, dil = _window(ctx, w)
    pads = _pads(ctx, x.shape[2:], kernel, strides, dil)
    weight = w.jax()

    def conv(v):
        return _with_bias(lax.conv_general_dilated(
            v, weight.astype(v.dtype), strides, pads, rhs_dilation=dil,
            feature_group_count=ctx.attr("group", 1)), b, n)
    return rules.per_row(conv, x, op=ctx.where)


@handler("ConvTranspose")
def _conv_transpose(ctx, x, w, b=None):
    kernel, n, strides, dil = _window(ctx, w)
    group = ctx.attr("group", 1)
    out_pad = ctx.attr("output_padding") or [0] * n
    pads = ctx.attr("pads") or [0] * (2 * n)
    natural = [strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1
               for i in range(n)]
    want = ctx.attr("output_shape")
    if ctx.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        want = want or [s * st for s, st in zip(x.shape[2:], strides)]
        total = [natural[i] - want[i] for i in range(n)]  # negative: the output grows
        upper = ctx.attr("auto_pad") == "SAME_UPPER"
        pads = [t // 2 if upper else t - t // 2 for t in total] + \
            [t - t // 2 if upper else t // 2 for t in total]
        want = None
    # else an output_shape (ONNX's reference) keeps the pads and ends the output there:
    # the positions past the natural output are 0
    extra = [0] * n if want is None else \
        [want[i] - (natural[i] - pads[i] - pads[i + n]) for i in range(n)]
    c_in, c_out_g = w.shape[0], w.shape[1]
    weight = w.jax().reshape((group, c_in // group, c_out_g) + tuple(kernel))
    weight = jnp.swapaxes(weight, 1, 2).reshape((group * c_out_g, c_in // group) + tuple(kernel))
    weight = jnp.flip(weight, axis=tuple(range(2, 2 + n)))
    padding = [((kernel[i] - 1) * dil[i] - pads[i],
                (kernel[i] - 1) * dil[i] - pads[i + n] + out_pad[i] + extra[i]) for i in range(n)]

    def deconv(v):
        return _with_bias(lax.conv_general_dilated(
            v, weight.astype(v.dtype), [1] * n, padding, lhs_dilation=strides,
            rhs_dilation=dil, feature_group_count=group), b, n)
    return rules.per_row(deconv, x, op=ctx.where)


def _pool(ctx, x, kind):
    kernel = ctx.attr("kernel_shape")
    n = len(kernel)
    strides = ctx.attr("strides") or [1] * n
    dil = ctx.attr("dilations") or [1] * n
    pads = _pads(ctx, x.shape[2:], kernel, strides, dil)
    declared = list(pads)
    if ctx.attr("ceil_mode", 0):  # room for the last partial window
        for i in range(n):
            size = x.shape[2 + i] + pads[i][0] + pads[i][1]
            eff = (kernel[i] - 1) * dil[i] + 1
            out = math.ceil((size - eff) / strides[i]) + 1
            if (out - 1) * strides[i] >= x.shape[2 + i] + pads[i][0]:
                out -= 1
            extra = (out - 1) * strides[i] + eff - size
            pads[i] = (pads[i][0], pads[i][1] + max(extra, 0))
    win = (1, 1) + tuple(kernel)
    st = (1, 1) + tuple(strides)
    dl = (1, 1) + tuple(dil)
    pad = [(0, 0), (0, 0)] + list(pads)

    def pool(v):
        if kind == "argmax":
            return _argmax_pool(v, win, st, pad, dl, ctx.attr("storage_order", 0))
        if kind == "max":
            init = -jnp.inf if jnp.issubdtype(v.dtype, jnp.floating) else jnp.iinfo(v.dtype).min
            return lax.reduce_window(v, jnp.asarray(init, v.dtype), lax.max, win, st, pad,
                                     window_dilation=dl)
        total = lax.reduce_window(v, jnp.zeros((), v.dtype), lax.add, win, st, pad,
                                  window_dilation=dl)
        if ctx.attr("count_include_pad", 0):
            count = _include_count(v.shape[2:], kernel, strides, dil, pads, declared, v.dtype)
        else:
            count = lax.reduce_window(jnp.ones(v.shape[2:], v.dtype), jnp.zeros((), v.dtype),
                                      lax.add, tuple(kernel), tuple(strides), list(pads),
                                      window_dilation=tuple(dil))
        return total / count
    return rules.per_row(pool, x, op=ctx.where)


def _argmax_pool(v, win, st, pad, dl, storage_order):
    """MaxPool's indices: of each window's first largest element (row-major scan), flat over
    the whole input, row-major (``storage_order`` 0) or with the spatial axes reversed (1:
    ``h + w * H``); a variadic reduce_window on (value, index) pairs, ties to the lower
    index (the first scanned)."""
    flat = lax.broadcasted_iota(jnp.int32, v.shape, 0)
    for k in range(1, v.ndim):
        flat = flat * v.shape[k] + lax.broadcasted_iota(jnp.int32, v.shape, k)
    low = -jnp.inf if jnp.issubdtype(v.dtype, jnp.floating) else jnp.iinfo(v.dtype).min

    def pick(a, b):
        take = (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
        return jnp.where(take, b[0], a[0]), jnp.where(take, b[1], a[1])
    _, idx = lax.reduce_window((v, flat), (jnp.asarray(low, v.dtype),
                                           jnp.int32(np.iinfo(np.int32).max)),
                               pick, win, st, pad, window_dilation=dl)
    if storage_order:  # (n, c, h, w, ...) -> n*C + c, then the spatial axes reversed
        spatial = v.shape[2:]
        rest, coords = idx, []
        for size in reversed(spatial):
            coords.append(rest % size)
            rest = rest // size
        col, stride = jnp.zeros_like(idx), 1
        for c, size in zip(coords[::-1], spatial):  # h first: stride 1, then w: stride H...
            col, stride = col + c * stride, stride * size
        idx = rest * int(np.prod(spatial)) + col
    return idx.astype(jax_dtype(7))


def _include_count(spatial, kernel, strides, dil, pads, declared, dtype):
    """Window sizes counting the declared padding (not ceil_mode's extra) as elements."""
    padded = jnp.pad(jnp.ones(spatial, dtype), declared, constant_values=1)
    extra = [(p[0] - d[0], p[1] - d[1]) for p, d in zip(pads, declared)]
    return lax.reduce_window(padded, jnp.zeros((), dtype), lax.add, tuple(kernel), tuple(strides),
                             extra, window_dilation=tuple(dil))


@handler("MaxPool")
def _max_pool(ctx, x):
    y = _pool(ctx, x, "max")
    if len(ctx.node.output) < 2 or not ctx.node.output[1]:
        return y
    return y, _pool(ctx, x, "argmax")
handler("AveragePool")(lambda ctx, x: _pool(ctx, x, "avg"))


@handler("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx, x):
    axes = tuple(range(2, x.ndim))
    return rules.reduce(x, "mean" if ctx.op_type == "GlobalAveragePool" else "max", axes, True)


@handler("BatchNormalization")
def _batch_norm(ctx, x, scale, bias, mean, var, *rest):
    eps = ctx.attr("epsilon", 1e-5)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    s, b = scale.jax().reshape(shape), bias.jax().reshape(shape)
    training = ctx.attr("training_mode", 0) if ctx.opset >= 14 else \
        not ctx.attr("is_test", 0) if ctx.opset < 7 else 0
    if training:  # the batch's statistics, over every axis but the channels (valid region)
        axes = (0,) + tuple(range(2, x.ndim))
        batch_mean = rules.reduce(x, "mean", axes, True)
        centred = rules.elementwise(lambda d, mu: d - mu, x, batch_mean, op=ctx.where)
        batch_var = rules.reduce(rules.elementwise(jnp.square, centred), "mean", axes, True)
        m, v = batch_mean.jax(), batch_var.jax()
    else:
        m, v = mean.jax().reshape(shape), var.jax().reshape(shape)
    y = rules.elementwise(lambda d: ((d - m) / jnp.sqrt(v + eps) * s + b).astype(d.dtype), x,
                          op=ctx.where)
    if not training or len(ctx.node.output) == 1:
        return y
    momentum = ctx.attr("momentum", 0.9)
    running = [Tensor((old.jax() * momentum + new.reshape(-1) * (1 - momentum))
                      .astype(old.dtype)) for old, new in ((mean, m), (var, v))]
    return (y, *running)


@handler("InstanceNormalization")
def _instance_norm(ctx, x, scale, bias):
    eps = ctx.attr("epsilon", 1e-5)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    s, b = scale.jax().reshape(shape), bias.jax().reshape(shape)

    def norm(d):
        axes = tuple(range(2, d.ndim))
        mu = jnp.mean(d, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(d - mu), axis=axes, keepdims=True)
        return (d - mu) / jnp.sqrt(var + eps) * s + b
    return rules.per_row(norm, x, op=ctx.where)


@handler("LayerNormalization")
def _layer_norm(ctx, x, scale, bias=None):
    axis = ctx.attr("axis", -1) % x.ndim
    eps = ctx.attr("epsilon", 1e-5)
    axes = tuple(range(axis, x.ndim))
    d = x.jax()
    mu = jnp.mean(d, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(d - mu), axis=axes, keepdims=True)
    inv = 1 / jnp.sqrt(var + eps)
    y = (d - mu) * inv * scale.jax()
    if bias is not None:
        y = y + bias.jax()
    outs = [rules.per_row(lambda _: y, x, free_axes=tuple(range(axis)), op=ctx.where)]
    for extra in (mu, inv)[:len(ctx.node.output) - 1]:
        outs.append(Tensor(extra))
    return tuple(outs)


@handler("LRN")
def _lrn(ctx, x):
    size, alpha, beta, bias = ctx.attr("size"), ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), \
        ctx.attr("bias", 1.0)

    def lrn(d):
        sq = jnp.square(d)
        lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
        total = lax.reduce_window(sq, jnp.zeros((), d.dtype), lax.add, (1, size) + (1,) * (d.ndim - 2),
                                  (1,) * d.ndim, [(0, 0), (lo, hi)] + [(0, 0)] * (d.ndim - 2))
        return d / jnp.power(bias + alpha / size * total, beta)
    return rules.per_row(lrn, x, op=ctx.where)


# -- RoiAlign ------------------------------------------------------------------------------
@handler("RoiAlign")
def _roi_align(ctx, x, rois, batch_indices):
    """Over a dynamic number of boxes: each output row reads its own box only, so the
    boxes' dim is the output's (ONNX Runtime's bilinear sampling, avg or max)."""
    oh, ow = ctx.attr("output_height", 1), ctx.attr("output_width", 1)
    ratio, scale = ctx.attr("sampling_ratio", 0), ctx.attr("spatial_scale", 1.0)
    mode = ctx.attr("mode", "avg")
    half = 0.5 if ctx.attr("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16
                           else "output_half_pixel") == "half_pixel" else 0.0
    if not x.is_static:
        raise ctx.error("X", "a static feature map", repr(x))
    feat = x.jax()
    _, _, h, w = feat.shape
    gmax_h = ratio if ratio > 0 else max(int(math.ceil(h / oh)), 1)
    gmax_w = ratio if ratio > 0 else max(int(math.ceil(w / ow)), 1)
    boxes = rois.jax().astype(feat.dtype)
    bidx = jnp.clip(batch_indices.jax().astype(jnp.int32), 0, feat.shape[0] - 1)

    def one(box, b):
        x1, y1, x2, y2 = box[0] * scale - half, box[1] * scale - half, box[2] * scale - half, \
            box[3] * scale - half
        rw, rh = x2 - x1, y2 - y1
        if half == 0.0:
            rw, rh = jnp.maximum(rw, 1.0), jnp.maximum(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = jnp.asarray(ratio, jnp.int32) if ratio > 0 else jnp.clip(jnp.ceil(rh / oh), 1, gmax_h).astype(jnp.int32)
        gw = jnp.asarray(ratio, jnp.int32) if ratio > 0 else jnp.clip(jnp.ceil(rw / ow), 1, gmax_w).astype(jnp.int32)
        iy = jnp.arange(gmax_h)
        ix = jnp.arange(gmax_w)
        ys = y1 + jnp.arange(oh)[:, None] * bh + (iy[None, :] + 0.5) * bh / gh  # [oh, gy]
        xs = x1 + jnp.arange(ow)[:, None] * bw + (ix[None, :] + 0.5) * bw / gw  # [ow, gx]
        vy, vx = iy < gh, ix < gw
        img = feat[b]  # [C, H, W]
        (y0, y1_, ly, ok_y), (x0, x1_, lx, ok_x) = _corners(ys, h), _corners(xs, w)
        hy, hx = 1 - ly, 1 - lx
        # values [C, oh, gy, ow, gx]
        g = lambda yy, xx: img[:, yy[:, :, None, None], xx[None, None, :, :]]
        w00 = (hy[:, :, None, None] * hx[None, None])
        w01 = (hy[:, :, None, None] * lx[None, None])
        w10 = (ly[:, :, None, None] * hx[None, None])
        w11 = (ly[:, :, None, None] * lx[None, None])
        ok = (ok_y & vy[None, :])[:, :, None, None] & (ok_x & vx[None, :])[None, None]
        if mode == "avg":  # separable: rows first ([C, oh, W]), then columns
            wy0 = jnp.where(ok_y & vy[None, :], hy, 0)  # [oh, gy]
            wy1 = jnp.where(ok_y & vy[None, :], ly, 0)
            rows = img[:, y0, :] * wy0[None, :, :, None] + img[:, y1_, :] * wy1[None, :, :, None]
            rows = rows.sum(axis=2)  # [C, oh, W]
            wx0 = jnp.where(ok_x & vx[None, :], hx, 0)  # [ow, gx]
            wx1 = jnp.where(ok_x & vx[None, :], lx, 0)
            val = rows[:, :, x0] * wx0[None, None] + rows[:, :, x1_] * wx1[None, None]
            return val.sum(axis=3) / (gh * gw).astype(feat.dtype)
        parts = [w00 * g(y0, x0), w01 * g(y0, x1_), w10 * g(y1_, x0), w11 * g(y1_, x1_)]
        m = jnp.max(jnp.stack(parts), axis=0)
        m = jnp.where(ok, m, -jnp.inf)
        valid_any = (ok_y & vy[None, :])[:, :, None, None] & (vx[None, :])[None, None]
        m = jnp.max(jnp.where(valid_any, jnp.where(ok, m, 0), -jnp.inf), axis=(2, 4))
        return m
    # boxes in batches of 32: a vmap over all of them would hold every box's sampled rows
    # at once (1,000 boxes x 256 channels: hundreds of MB, each call's pages faulted in)
    def pool(bx, bi):
        return jax.lax.map(lambda a: one(*a), (bx, bi), batch_size=min(32, bx.shape[0]))
    out = rules.by_rows(pool, rois.dims[0], boxes.shape[0], boxes, bidx) if boxes.shape[0] \
        else jnp.zeros((0, feat.shape[1], oh, ow), feat.dtype)
    dims = [rois.dims[0], feat.shape[1], oh, ow]
    return Tensor(out, dims, lost=rois.lost)


def _corners(pos, size):
    """ONNX Runtime's bilinear corners of sample positions: low/high index, the weight of
    the high one, and whether the sample lies on the map (else it adds 0)."""
    ok = (pos >= -1.0) & (pos <= size)
    p = jnp.maximum(pos, 0.0)
    low = jnp.floor(p).astype(jnp.int32)
    at_end = low >= size - 1
    low = jnp.where(at_end, size - 1, low)
    high = jnp.where(at_end, size - 1, low + 1)
    p = jnp.where(at_end, low.astype(p.dtype), p)
    return low, high, p - low, ok
