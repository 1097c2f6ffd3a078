"""``Resize`` and ``Upsample``: nearest, linear and cubic modes, antialiasing, every
coordinate transformation, ``keep_aspect_ratio_policy`` and ``tf_crop_and_resize``'s
extrapolation value, as ONNX's reference (``onnx/reference/ops/op_resize.py``) says.

Sizes are static, so where each output position samples the input (its source coordinate,
its neighbours and their weights) is worked out on the host in float64, once per axis at
trace time (float32 would round a 0.5 the wrong way); the device only gathers and weighs.
The axes that keep their size run per row (:func:`jaxops.dynamic.rules.per_row`): a
dynamic batch or channel axis stays dynamic.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxops.dynamic import rules
from jaxops.onnx.registry import handler

_MODES = ("nearest", "linear", "cubic")
_TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_crop_and_resize")
_ROUNDINGS = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_POLICIES = ("stretch", "not_larger", "not_smaller")


def _check(node) -> None:
    """Refuses at load an attribute value ONNX does not define for Resize."""
    for name, default, allowed in (("mode", "nearest", _MODES),
                                   ("coordinate_transformation_mode", "half_pixel", _TRANSFORMS),
                                   ("nearest_mode", "round_prefer_floor", _ROUNDINGS),
                                   ("keep_aspect_ratio_policy", "stretch", _POLICIES)):
        value = node.attr(name, default)
        if value not in allowed:
            raise node.error(name, "one of " + ", ".join(allowed), repr(value))
    if node.attr("antialias", 0) and node.attr("mode", "nearest") == "nearest":
        raise node.error("antialias", "0 with mode 'nearest' (ONNX antialiases linear and "
                         "cubic only)", node.attr("antialias"))


def _source(transform, n_out, n_in, scale, roi):
    """Where each output position samples the input, and (``tf_crop_and_resize``) which
    fall outside it; ``width`` is the unrounded output length, as ONNX divides by it."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in
    outside = None
    if transform == "align_corners":
        x = np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    elif transform == "asymmetric":
        x = y / scale
    elif transform == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if width == 1 else \
            y * (hi - lo) * (n_in - 1) / (width - 1)
        x = x + lo * (n_in - 1)
        outside = (x < 0) | (x > n_in - 1)
    elif transform == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif transform == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        x = offset + (y + 0.5) / scale - 0.5
    else:  # half_pixel
        x = (y + 0.5) / scale - 0.5
    return x, outside


def _nearest(x, rounding):
    if rounding == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if rounding == "floor":
        return np.floor(x)
    if rounding == "ceil":
        return np.ceil(x)
    return np.ceil(x - 0.5)  # round_prefer_floor


def _cubic(x, a):
    """The cubic convolution kernel with coefficient ``a``, at distances ``x``."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _weights(mode, ratio, scale, a, antialias):
    """Each output position's weights of its neighbours (``[n_out, taps]``): ONNX's linear
    and cubic coefficients, or with ``antialias`` their kernels stretched by 1 / scale
    when downsampling, normalised."""
    r = ratio[:, None]
    if not antialias:
        if mode == "linear":
            return np.concatenate([1 - r, r], axis=1)
        return _cubic(np.concatenate([r + 1, r, 1 - r, 2 - r], axis=1), a)
    s = min(scale, 1.0)
    start = int(np.floor(-(1 if mode == "linear" else 2) / s) + 1)
    args = (np.arange(start, 2 - start)[None, :] - r) * s
    w = np.clip(1 - np.abs(args), 0, 1) if mode == "linear" else _cubic(args, a)
    return w / w.sum(axis=1, keepdims=True)


def _neighbours(x, taps, n_in):
    """The ``taps`` input positions nearest each source coordinate (ties to the lower),
    as ONNX picks them over an edge-padded axis: unclamped."""
    pad = int(math.ceil(taps / 2))
    xp = x + pad
    p = np.floor(xp)
    frac = xp - p
    if taps % 2 == 0:
        offset = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        base = -((taps - 1) // 2)
        offset = np.where(frac <= 0.5, base, base + 1)
    return (p + offset).astype(np.int64)[:, None] + np.arange(taps)[None, :] - pad


def _resample(v, axis, n_out, mode, transform, scale, roi, attrs):
    """``v`` resized along ``axis`` to ``n_out``."""
    n_in = v.shape[axis]
    x, outside = _source(transform, n_out, n_in, scale, roi)
    shape = [1] * v.ndim
    shape[axis] = n_out
    if mode == "nearest":
        idx = np.clip(_nearest(x, attrs["nearest_mode"]), 0, n_in - 1).astype(np.int32)
        v = jnp.take(v, idx, axis=axis)
    elif mode == "linear" and not attrs["antialias"]:
        src = np.clip(x, 0, n_in - 1)
        lo = np.floor(src).astype(np.int32)
        hi = np.minimum(lo + 1, n_in - 1)
        w = jnp.asarray(src - lo, v.dtype).reshape(shape)
        v = jnp.take(v, lo, axis=axis) * (1 - w) + jnp.take(v, hi, axis=axis) * w
    else:
        floor = np.floor(x)
        ratio = np.where(x == floor, 1.0, x - floor)  # ONNX prefers the left pixel
        w = _weights(mode, ratio, scale, attrs["cubic_coeff_a"], attrs["antialias"])
        idx = _neighbours(x, w.shape[1], n_in)
        if attrs["exclude_outside"]:
            w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
        idx = np.clip(idx, 0, n_in - 1).astype(np.int32)
        out = None
        for j in range(w.shape[1]):
            term = jnp.take(v, idx[:, j], axis=axis) * jnp.asarray(w[:, j], v.dtype).reshape(shape)
            out = term if out is None else out + term
        v = out
    if outside is not None and outside.any():
        v = jnp.where(jnp.asarray(outside).reshape(shape),
                      jnp.asarray(attrs["extrapolation_value"], v.dtype), v)
    return v


def _plan(ctx, x, scales, sizes, axes):
    """``{axis: (output size, scale)}`` of the resized axes, from ``sizes`` (with
    ``keep_aspect_ratio_policy``) or ``scales``."""
    if sizes is not None and sizes.shape and sizes.shape[0]:
        want = dict(zip(axes, ctx.known_ints(sizes, "sizes")))
        scale = {a: want[a] / x.shape[a] for a in axes}
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            s = (min if policy == "not_larger" else max)(scale.values())
            return {a: (int(s * x.shape[a] + 0.5), s) for a in axes}
        return {a: (want[a], scale[a]) for a in axes}
    if scales is None:  # Upsample-7: an attribute
        s = np.asarray(ctx.attr("scales"), np.float64)
    else:
        s = np.asarray(scales.np(), np.float64).reshape(-1)
    return {a: (int(math.floor(x.shape[a] * f)), f) for a, f in zip(axes, s.tolist())}


@handler("Resize", "Upsample", check=_check)
def _resize(ctx, x, roi=None, scales=None, sizes=None):
    if ctx.op_type == "Upsample" or ctx.opset < 11:  # (X, scales): no roi, no sizes
        scales, roi = roi, None
    old = ctx.op_type == "Upsample" or ctx.opset < 11
    mode = ctx.attr("mode", "nearest")
    transform = "asymmetric" if old else ctx.attr("coordinate_transformation_mode", "half_pixel")
    attrs = {"nearest_mode": "floor" if old else ctx.attr("nearest_mode", "round_prefer_floor"),
             "antialias": bool(ctx.attr("antialias", 0)),
             "cubic_coeff_a": ctx.attr("cubic_coeff_a", -0.75),
             "exclude_outside": bool(ctx.attr("exclude_outside", 0)),
             "extrapolation_value": ctx.attr("extrapolation_value", 0.0)}
    axes = [a % x.ndim for a in (ctx.attr("axes") or range(x.ndim))]
    plan = _plan(ctx, x, scales, sizes, axes)
    r = None if roi is None or not roi.shape or not roi.shape[0] else \
        np.asarray(roi.np(), np.float64).reshape(-1)
    rois = {a: (r[j], r[j + len(axes)]) if r is not None else (0.0, 1.0)
            for j, a in enumerate(axes)}
    moved = [a for a in axes if not (math.isclose(plan[a][1], 1.0) and plan[a][0] == x.shape[a]
                                     and (transform != "tf_crop_and_resize" or rois[a] == (0, 1)))]
    for a in moved:
        if not isinstance(x.dims[a], int):
            raise ctx.error("X", "static sizes on the resized axes", f"a dynamic axis {a}")

    def resize(v):
        for a in moved:
            v = _resample(v, a, plan[a][0], mode, transform, plan[a][1], rois[a], attrs)
        return v
    return rules.per_row(resize, x, free_axes=tuple(k for k in range(x.ndim) if k not in moved),
                         op=ctx.where)
