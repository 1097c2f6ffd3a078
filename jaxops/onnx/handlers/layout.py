"""Shape, layout and indexing ops: the shape arithmetic (``Shape``, ``Size``, ``Range``,
``ConstantOfShape``) gives bounded values, and the layout rules of
:mod:`jaxops.dynamic.rules` move valid blocks (reshape, concat, slice, gathers)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxops.dynamic import rules
from jaxops.dynamic.tensor import Tensor, dims_product, plan_shape
from jaxops.onnx.handlers.common import dims_from, jax_dtype, scalar
from jaxops.onnx.registry import handler


def _axes(ctx, t, name="axes"):
    """Axes from the attribute (older opsets) or the input (newer)."""
    if t is not None:
        return ctx.known_ints(t, name)
    return ctx.attr(name)


@handler("Constant")
def _constant(ctx):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in ctx.attrs:
            v = ctx.attrs[key]
            if key == "value":
                return Tensor(ctx.program.initializer(v))
            dt = np.float32 if "float" in key else np.int64
            return Tensor(np.asarray(v, dt))
    raise ctx.error("value", "a tensor, float(s) or int(s) value", sorted(ctx.attrs))


@handler("Shape")
def _shape(ctx, x):
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    dims = list(x.dims)[slice(start, end)]
    maxes = list(x.shape)[slice(start, end)]
    if all(isinstance(d, int) for d in dims):
        return Tensor(np.asarray(dims, np.int64))
    data = jnp.stack([jnp.asarray(d, jnp.int32) for d in dims]).astype(jax_dtype(7))
    out = Tensor(data)
    out.lo = np.array([d if isinstance(d, int) else 0 for d in dims], np.float64)
    out.hi = np.array(maxes, np.float64)
    out.syms = np.empty(len(dims), object)  # (np.array would try to read the tracers)
    for k, d in enumerate(dims):
        out.syms[k] = None if isinstance(d, int) else d
    return out


@handler("Size")
def _size(ctx, x):
    if x.is_static:
        return Tensor(np.asarray(int(np.prod(x.shape)), np.int64))
    out = Tensor(jnp.asarray(x.numel(), jax_dtype(7)))
    out.lo, out.hi = np.zeros(()), np.asarray(float(np.prod(x.shape)))
    return out


@handler("Reshape", bounds="copy")
def _reshape(ctx, x, shape):
    dims, maxes = dims_from(ctx, shape)
    allow_zero = ctx.attr("allowzero", 0)
    for k, d in enumerate(dims):
        if isinstance(d, int) and d == 0 and not allow_zero:
            dims[k], maxes[k] = x.dims[k], x.shape[k]
    minus = [k for k, d in enumerate(dims) if isinstance(d, int) and d == -1]
    if minus:
        k = minus[0]
        others = [d for j, d in enumerate(dims) if j != k]
        total = int(np.prod(x.shape))
        left, right = _cancel(list(x.dims), others)  # a dim that is on both sides
        if all(isinstance(d, int) for d in left + right):
            dims[k] = maxes[k] = int(np.prod(left)) // max(int(np.prod(right)), 1)
        else:
            known = dims_product(right)
            dims[k] = dims_product(left) // jnp.maximum(jnp.asarray(known, jnp.int32), 1)
            lo = int(np.prod([max(1, d) if isinstance(d, int) else 1 for d in others]))
            maxes[k] = total // lo
    return rules.reshape(x, dims, maxes, ctx.where)


def _cancel(left: list, right: list) -> tuple[list, list]:
    """Both lists of dims without the dims they share (the same traced dim, or equal ints)."""
    left, rest = list(left), []
    for d in right:
        hit = next((i for i, e in enumerate(left) if e is d or (
            isinstance(e, int) and isinstance(d, int) and e == d)), None)
        if hit is None:
            rest.append(d)
        else:
            left.pop(hit)
    return left, rest


@handler("Flatten", bounds="copy")
def _flatten(ctx, x):
    return rules.flatten(x, ctx.attr("axis", 1))


@handler("Squeeze", bounds="copy")
def _squeeze(ctx, x, axes=None):
    return rules.squeeze(x, _axes(ctx, axes))


@handler("Unsqueeze", bounds="copy")
def _unsqueeze(ctx, x, axes=None):
    return rules.unsqueeze(x, _axes(ctx, axes))


@handler("Transpose", bounds="copy")
def _transpose(ctx, x):
    perm = ctx.attr("perm") or list(range(x.ndim))[::-1]
    return rules.transpose(x, perm)


@handler("Expand", bounds="copy")
def _expand(ctx, x, shape):
    dims, maxes = dims_from(ctx, shape)
    return rules.expand(x, dims, maxes)


@handler("Tile", bounds="copy")
def _tile(ctx, x, reps):
    dims, maxes = dims_from(ctx, reps, "repeats")
    return rules.tile(x, dims, maxes)


@handler("Concat", bounds="copy", data=tuple(range(64)))
def _concat(ctx, *ts):
    ts = [t for t in ts if t is not None]
    return rules.concat(ts, ctx.attr("axis"))


@handler("Slice", bounds="copy")
def _slice(ctx, x, starts=None, ends=None, axes=None, steps=None):
    if ctx.opset < 10:
        starts, ends, axes = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes")
        starts, ends = [Tensor(np.asarray(v, np.int64)) for v in (starts, ends)]
        axes = None if axes is None else Tensor(np.asarray(axes, np.int64))
    n = starts.shape[0]
    axes = list(range(n)) if axes is None else [a % x.ndim for a in ctx.known_int(axes, "axes")]
    steps = [1] * n if steps is None else ctx.known_int(steps, "steps")
    out = x
    for j, (a, st) in enumerate(zip(axes, steps)):
        s = _element(starts, j)
        e = _element(ends, j)
        cap = None
        if not isinstance(e, int) and st > 0:  # a traced end: its bound caps the size
            lo_s = np.broadcast_to(starts.bounds()[0], starts.shape)[j]
            hi_e = np.broadcast_to(ends.bounds()[1], ends.shape)[j]
            if np.isfinite(hi_e) and np.isfinite(lo_s) and lo_s >= 0 and hi_e >= 0:
                cap = int(hi_e - lo_s)
        out = rules.slice_axis(out, a, s, e, st, cap)
    return out


def _element(t, j):
    if t.concrete:
        return int(np.asarray(t.data).reshape(-1)[j])
    return t.jax().reshape(-1)[j]


@handler("Split", bounds="copy")
def _split(ctx, x, split=None):
    axis = ctx.attr("axis", 0) % x.ndim
    sizes = ctx.known_int(split, "split") if split is not None else ctx.attr("split")
    n_out = len(ctx.node.output)
    if sizes is None:
        if not isinstance(x.dims[axis], int):
            raise ctx.error("input", "a static size along the split axis", "a dynamic one")
        m = x.shape[axis]
        chunk = -(-m // ctx.attr("num_outputs", n_out))
        sizes = [min(chunk, m - k * chunk) for k in range(n_out)]
    outs, start = [], 0
    for s in sizes:
        outs.append(rules.slice_axis(x, axis, start, start + s, 1))
        start += s
    return tuple(outs)


@handler("ConstantOfShape")
def _constant_of_shape(ctx, shape):
    value = ctx.attrs.get("value")
    v = ctx.program.initializer(value).reshape(-1)[0] if value is not None else np.float32(0)
    dims, maxes = dims_from(ctx, shape)
    maxes = plan_shape(ctx.where, "input", tuple(maxes), np.asarray(v).dtype)
    data = jnp.full(maxes, v) if not all(isinstance(d, int) for d in dims) else \
        np.full(maxes, v)
    out = Tensor(data, dims)
    out.lo = out.hi = np.asarray(float(v)) if np.asarray(v).dtype.kind in "biuf" else None
    return out


@handler("Range")
def _range(ctx, start, limit, delta):
    s, e, d = scalar(start), scalar(limit), scalar(delta)
    if all(t.concrete for t in (start, limit, delta)):
        return Tensor(np.arange(s, e, d, dtype=start.dtype))
    lo_s, hi_s = (float(np.min(b)) for b in start.bounds())
    lo_e, hi_e = (float(np.max(b)) for b in limit.bounds())
    if not delta.concrete:
        raise ctx.error("delta", "a value known at trace time", "a traced value")
    cap = int(np.ceil(max(hi_e - lo_s, 0) / d)) if d > 0 else int(np.ceil(max(hi_s - lo_e, 0) / -d))
    plan_shape(ctx.where, "limit", (cap,), start.dtype)
    st, en = jnp.asarray(s), jnp.asarray(e)
    n = jnp.maximum(jnp.ceil((en - st) / d), 0).astype(jnp.int32)
    data = (st + jnp.arange(cap, dtype=jnp.int32).astype(st.dtype) * jnp.asarray(d, st.dtype))
    out = Tensor(data.astype(jnp.asarray(s).dtype), [jnp.minimum(n, cap)])
    out.lo, out.hi = np.asarray(min(lo_s, lo_e)), np.asarray(max(hi_s, hi_e))
    return out


@handler("Gather", bounds="copy")
def _gather(ctx, x, idx):
    return rules.gather(x, idx, ctx.attr("axis", 0))


@handler("GatherElements", bounds="copy")
def _gather_elements(ctx, x, idx):
    return rules.gather_elements(x, idx, ctx.attr("axis", 0))


@handler("GatherND", bounds="copy")
def _gather_nd(ctx, x, idx):
    return rules.gather_nd(x, idx, ctx.attr("batch_dims", 0))


@handler("ScatterElements", "Scatter")
def _scatter_elements(ctx, x, idx, updates):
    return rules.scatter_elements(x, idx, updates, ctx.attr("axis", 0),
                                  ctx.attr("reduction", "none"))


@handler("ScatterND")
def _scatter_nd(ctx, x, idx, updates):
    if not (x.is_static and idx.is_static and updates.is_static):
        raise ctx.error("indices", "static shapes", "dynamic ones")
    data, i = x.jax(), idx.jax().astype(jnp.int32)
    k = i.shape[-1]
    at = data.at[tuple(i[..., j] for j in range(k))]
    red = ctx.attr("reduction", "none")
    u = updates.jax()
    out = {"none": at.set, "add": at.add, "mul": at.multiply, "max": at.max, "min": at.min}[red](u)
    return Tensor(out)


@handler("Pad")
def _pad(ctx, x, pads=None, value=None, axes=None):
    if not x.is_static:
        raise ctx.error("data", "a static shape (Pad of a dynamic tensor is not supported)",
                        repr(x))
    pads = ctx.known_int(pads, "pads") if pads is not None else ctx.attr("pads")
    axes = list(range(x.ndim)) if axes is None else [a % x.ndim for a in ctx.known_int(axes, "axes")]
    n = len(axes)
    widths = [(0, 0)] * x.ndim
    for j, a in enumerate(axes):
        widths[a] = (pads[j], pads[j + n])
    data = x.jax()
    # negative pads crop
    crop = tuple(slice(max(-b, 0), data.shape[k] - max(-e, 0)) for k, (b, e) in enumerate(widths))
    data = data[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    mode = ctx.attr("mode", "constant")
    if mode == "constant":
        v = scalar(value, ctx.attr("value", 0.0)) if value is not None or "value" in ctx.attrs else 0
        return Tensor(jnp.pad(data, widths, constant_values=jnp.asarray(v, data.dtype)))
    return Tensor(jnp.pad(data, widths, mode={"reflect": "reflect", "edge": "edge",
                                              "wrap": "wrap"}[mode]))


@handler("Trilu")
def _trilu(ctx, x, k=None):
    kk = int(scalar(k, 0))
    fn = jnp.triu if ctx.attr("upper", 1) else jnp.tril
    return rules.elementwise(lambda v: fn(v, kk), x, op=ctx.where)


@handler("EyeLike")
def _eye_like(ctx, x):
    dt = jax_dtype(ctx.attr("dtype")) if "dtype" in ctx.attrs else x.dtype
    return Tensor(jnp.eye(x.shape[0], x.shape[1], ctx.attr("k", 0), dtype=dt))


@handler("OneHot")
def _one_hot(ctx, idx, depth, values):
    d = int(scalar(depth))
    axis = ctx.attr("axis", -1)
    i = idx.jax()
    i = jnp.where(i < 0, i + d, i)
    v = values.jax()
    hot = jnp.arange(d) == jnp.expand_dims(i, -1)
    out = jnp.where(hot, v[1], v[0])
    return Tensor(jnp.moveaxis(out, -1, axis % out.ndim))


@handler("DepthToSpace", "SpaceToDepth")
def _depth_space(ctx, x):
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    data = x.jax()
    if ctx.op_type == "SpaceToDepth":
        t = data.reshape(n, c, h // b, b, w // b, b)
        t = t.transpose((0, 3, 5, 1, 2, 4) if ctx.attr("mode", "DCR") == "DCR" else
                        (0, 1, 3, 5, 2, 4))
        return Tensor(t.reshape(n, c * b * b, h // b, w // b))
    if ctx.attr("mode", "DCR") == "DCR":
        t = data.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = data.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return Tensor(t.reshape(n, c // (b * b), h * b, w * b))
