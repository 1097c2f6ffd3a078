"""The valid-region rules: one rule per kind of op, saying how the dynamic dims flow and
how the op reads only the valid region (masking with each reduction's identity).

This is XLA's dynamic-dimension inference (``dynamic_dimension_inference.cc``: a visitor
with a rule per op, and a padder that masks with the identity of each reduction) written
for :class:`~jaxops.dynamic.Tensor`. The ONNX front end (:mod:`jaxops.onnx`) calls these
rules, one per handler, and so can a Python program (:mod:`jaxops.dynamic` re-exports them,
taking and returning DynArrays). :data:`RULES` lists them by name.

The invariant: the padding of a Tensor is unspecified. Elementwise rules keep it so (no
work); a rule that reads across a dynamic axis masks first; a rule that moves elements
between positions (concat, reshape, gather) places the valid blocks where the leading-block
layout wants them.

>>> import jax.numpy as jnp
>>> from jaxops.dynamic.tensor import Tensor
>>> t = Tensor(jnp.array([[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]]), [2, jnp.int32(2)])
>>> reduce(t, "max", axes=(1,), keepdims=False).data.tolist()
[2.0, 4.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.dynamic.tensor import Dim, Tensor, dims_product, is_traced, plan_shape

__all__ = [
    "IDENTITIES", "LADDER_START", "RULES", "arg_reduce", "broadcast_dims", "by_rows",
    "concat", "elementwise", "expand", "flatten", "gather", "gather_elements", "gather_nd",
    "matmul", "per_row", "reduce", "reshape", "rule", "scatter_elements", "slice_axis",
    "softmax", "squeeze", "tile", "top_k", "transpose", "unsqueeze",
]

RULES: dict[str, Callable] = {}


def rule(fn: Callable) -> Callable:
    """Registers ``fn`` in :data:`RULES` under its name (a name registered twice is an error)."""
    if fn.__name__ in RULES:
        raise ValueError(f"rule {fn.__name__!r} registered twice")
    RULES[fn.__name__] = fn
    return fn


def _lost(*ts: Tensor) -> Any:
    found = [t.lost for t in ts if t.lost is not None]
    return None if not found else found[0] if len(found) == 1 else sum(found[1:], found[0])


def _same(a: Dim, b: Dim) -> bool:
    return a is b or (isinstance(a, int) and isinstance(b, int) and a == b)


def _imax(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return jnp.maximum(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))


def _imin(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return jnp.minimum(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))


# -- elementwise ---------------------------------------------------------------------------
def broadcast_dims(op: str, ts: Sequence[Tensor]) -> tuple[tuple[int, ...], list[Dim]]:
    """Numpy broadcasting of max shapes and dims: a static 1 stretches; two dynamic dims of
    one axis are equal in a valid program (the larger is taken)."""
    rank = max(t.ndim for t in ts)
    shape, dims = [1] * rank, [1] * rank
    for t in ts:
        off = rank - t.ndim
        for k, (m, d) in enumerate(zip(t.shape, t.dims)):
            if isinstance(d, int) and d == 1:
                continue
            j = off + k
            if isinstance(dims[j], int) and dims[j] == 1:
                shape[j], dims[j] = m, d
            elif isinstance(d, int) and isinstance(dims[j], int):
                if d != dims[j]:
                    raise OpArgumentError(op, "inputs", "shapes that broadcast",
                                          [list(x.shape) for x in ts])
            else:
                shape[j], dims[j] = max(shape[j], m), (dims[j] if _same(dims[j], d)
                                                       else _imax(dims[j], d))
    return tuple(shape), dims


def _stretch(t: Tensor, shape: tuple[int, ...], dims: list[Dim]) -> jax.Array:
    """``t``'s buffer broadcast to ``shape``; a dynamic axis whose actual size is 1 where the
    result's is not stretches its first element (numpy broadcasting, at run time)."""
    data = t.jax()
    off = len(shape) - t.ndim
    for k, d in enumerate(t.dims):
        if not isinstance(d, int) and not _same(d, dims[off + k]) and shape[off + k] > 1:
            first = jax.lax.slice_in_dim(data, 0, 1, axis=k)
            data = jnp.where(d == 1, first, data) if data.shape[k] > 0 else data
    data = data.reshape((1,) * off + data.shape)
    return jnp.broadcast_to(data, shape) if data.shape != shape else data


@rule
def elementwise(fn: Callable, *ts: Tensor, op: str = "elementwise") -> Tensor:
    """``fn`` over the broadcast buffers; the padding stays padding (nothing to mask)."""
    if all(t.is_static for t in ts):
        return Tensor(fn(*[t.jax(op) for t in ts]), lost=_lost(*ts))
    shape, dims = broadcast_dims(op, ts)
    return Tensor(fn(*[_stretch(t, shape, dims) for t in ts]), dims, lost=_lost(*ts))


# -- reductions ----------------------------------------------------------------------------
def _lowest(dtype) -> Any:
    dtype = np.dtype(dtype)
    return -np.inf if dtype.kind == "f" else False if dtype.kind == "b" else np.iinfo(dtype).min


def _highest(dtype) -> Any:
    dtype = np.dtype(dtype)
    return np.inf if dtype.kind == "f" else True if dtype.kind == "b" else np.iinfo(dtype).max


#: What each reduction reads in the padding: its identity.
IDENTITIES: dict[str, Callable[[Any], Any]] = {
    "sum": lambda dt: 0, "mean": lambda dt: 0, "prod": lambda dt: 1, "max": _lowest,
    "min": _highest, "sum_square": lambda dt: 0, "l1": lambda dt: 0, "l2": lambda dt: 0,
    "log_sum": lambda dt: 0, "log_sum_exp": lambda dt: -np.inf, "all": lambda dt: True,
    "any": lambda dt: False,
}

_REDUCERS: dict[str, Callable] = {
    "sum": jnp.sum, "prod": jnp.prod, "max": jnp.max, "min": jnp.min, "all": jnp.all,
    "any": jnp.any, "sum_square": lambda x, **k: jnp.sum(x * x, **k),
    "l1": lambda x, **k: jnp.sum(jnp.abs(x), **k),
    "l2": lambda x, **k: jnp.sqrt(jnp.sum(x * x, **k)),
    "log_sum": lambda x, **k: jnp.log(jnp.sum(x, **k)),
    "log_sum_exp": lambda x, **k: jax.nn.logsumexp(x, **k) if x.size else
    jnp.full(jnp.sum(x, **k).shape, -jnp.inf, x.dtype),
}


def _keep(t: Tensor, axes: Sequence[int], keepdims: bool) -> list[Dim]:
    return [1 if k in axes else d for k, d in enumerate(t.dims) if keepdims or k not in axes]


@rule
def reduce(t: Tensor, kind: str, axes: Sequence[int], keepdims: bool) -> Tensor:
    """A reduction over ``axes``: the padding along the reduced axes reads as the
    reduction's identity; the other axes keep their dims. ``mean`` divides by the actual
    count."""
    axes = tuple(sorted(a % t.ndim for a in axes)) if t.ndim else ()
    if kind == "mean":
        total = reduce(t, "sum", axes, keepdims)
        count = 1
        for a in axes:
            count = count * t.dims[a]
        return total.with_data(total.data / jnp.asarray(count, total.data.dtype))
    identity = IDENTITIES[kind](jax.dtypes.canonicalize_dtype(t.dtype))  # what JAX holds
    x = t.masked(identity, axes)
    extra = {"initial": identity} if kind in ("max", "min") else {}  # an empty set: identity
    return Tensor(_REDUCERS[kind](x, axis=axes, keepdims=keepdims, **extra),
                  _keep(t, axes, keepdims), lost=t.lost)


@rule
def arg_reduce(t: Tensor, kind: str, axis: int, keepdims: bool, select_last: bool) -> Tensor:
    """ArgMax / ArgMin along ``axis`` over the valid region (ties: the first, or with
    ``select_last`` the last valid position; never a padding position)."""
    axis %= t.ndim
    d = t.dims[axis]
    x = t.masked(IDENTITIES["max" if kind == "max" else "min"](t.dtype), (axis,))
    n = t.shape[axis]
    if select_last:  # reverse the valid part only: the padding stays behind it
        rev = jnp.clip(jnp.asarray(d, jnp.int32) - 1 - jnp.arange(n, dtype=jnp.int32), 0, n - 1)
        x = jnp.take(x, rev, axis=axis)
    idx = (jnp.argmax if kind == "max" else jnp.argmin)(x, axis=axis, keepdims=keepdims)
    if select_last:
        idx = jnp.asarray(d, idx.dtype) - 1 - idx
    return Tensor(idx, _keep(t, (axis,), keepdims), lost=t.lost)


@rule
def softmax(t: Tensor, axis: int, kind: str = "softmax") -> Tensor:
    """Softmax, LogSoftmax or Hardmax along ``axis`` over the valid region."""
    axis %= t.ndim
    x = t.masked(-jnp.inf, (axis,))
    if kind == "softmax":
        out = jax.nn.softmax(x, axis=axis)
    elif kind == "log_softmax":
        out = jax.nn.log_softmax(x, axis=axis)
    else:
        first = jnp.argmax(x, axis=axis, keepdims=True)
        out = (jnp.arange(x.shape[axis]).reshape([-1 if k == axis else 1
                                                  for k in range(x.ndim)]) == first)
        out = out.astype(t.dtype)
    return t.with_data(out)


@rule
def per_row(fn: Callable, t: Tensor, *, free_axes: Sequence[int] = (0,), op: str,
            out_free_axes: Sequence[int] | None = None) -> Tensor:
    """An op whose output rows along ``free_axes`` depend only on the input rows there
    (Conv, pools, normalizations over a dynamic batch axis; Resize over batch and channel):
    it runs at the max shape, and those axes keep their dims. A dynamic axis elsewhere is
    refused, naming the op."""
    for k in t.dynamic_axes():
        if k not in free_axes:
            raise OpArgumentError(op, "X", f"a dynamic size only on axes {list(free_axes)}",
                                  f"a dynamic axis {k} (max shape {list(t.shape)})")
    data = t.jax(op)
    if 0 in free_axes and (out_free_axes or free_axes)[list(free_axes).index(0)] == 0:
        out = by_rows(fn, t.dims[0], t.shape[0], data)  # rows along axis 0: cost follows them
    else:
        out = fn(data)
    dims = list(out.shape)
    for k, j in zip(free_axes, out_free_axes or free_axes):
        if not isinstance(t.dims[k], int):
            dims[j] = t.dims[k]
    return Tensor(out, dims, lost=t.lost)


# -- cost follows the data ---------------------------------------------------------------
#: The smallest rung of the capacity ladder (below it a row-wise op is cheap at any size).
LADDER_START = 64


@rule
def by_rows(fn: Callable, n: Dim, size: int, *arrays: jax.Array) -> Any:
    """``fn`` over the first rows (axis 0) of ``arrays``, at the smallest capacity of the
    geometric ladder ``64, 128, ..., size`` that holds the actual row count ``n``, chosen
    inside jit (``lax.switch``: one compile), the results padded back to ``size`` rows.
    For ops whose rows are independent and whose cost grows with the rows (a contraction,
    RoIAlign): the cost follows the data, not the capacity."""
    rungs = [c for c in (LADDER_START << k for k in range(32)) if c < size] + [size]
    if isinstance(n, int) or len(rungs) == 1:
        return fn(*arrays)

    def at(cap):
        def run(xs):
            out = fn(*[x[:cap] for x in xs])
            return jax.tree.map(lambda o: jnp.pad(o, [(0, size - cap)] + [(0, 0)] * (o.ndim - 1)),
                                out)
        return run
    index = jnp.searchsorted(jnp.asarray(rungs, jnp.int32), jnp.asarray(n, jnp.int32))
    return jax.lax.switch(jnp.clip(index, 0, len(rungs) - 1), [at(c) for c in rungs],
                          tuple(arrays))


# -- contraction ---------------------------------------------------------------------------
@rule
def matmul(a: Tensor, b: Tensor, op: str = "MatMul") -> Tensor:
    """numpy ``matmul``: the contracted axis is masked with 0 on both sides (the padding may
    hold anything, NaN included); rows, columns and batch axes keep their dims."""
    va, vb = a.ndim == 1, b.ndim == 1
    a2 = a if not va else unsqueeze(a, (0,))
    b2 = b if not vb else unsqueeze(b, (1,))
    x = a2.masked(0, (a2.ndim - 1,))
    y = b2.masked(0, (b2.ndim - 2,))
    if a2.ndim == 2 and b2.ndim == 2 and b2.is_static:  # rows of a: cost follows them
        out = by_rows(lambda r: jnp.matmul(r, y), a2.dims[0], a2.shape[0], x)
    else:
        out = jnp.matmul(x, y)
    ba = Tensor(jnp.zeros(a2.shape[:-2], bool), a2.dims[:-2])
    bb = Tensor(jnp.zeros(b2.shape[:-2], bool), b2.dims[:-2])
    _, batch = broadcast_dims(op, [ba, bb]) if a2.ndim > 2 or b2.ndim > 2 else ((), [])
    dims = list(batch) + [a2.dims[-2], b2.dims[-1]]
    res = Tensor(out, dims, lost=_lost(a, b))
    if vb:
        res = squeeze(res, (res.ndim - 1,))
    if va:
        res = squeeze(res, (res.ndim - 2,))
    return res


# -- layout --------------------------------------------------------------------------------
@rule
def transpose(t: Tensor, perm: Sequence[int]) -> Tensor:
    """A permutation keeps the leading block a block: data and dims permute together."""
    return Tensor(jnp.transpose(t.jax(), perm) if not isinstance(t.data, np.ndarray)
                  else np.transpose(t.data, perm), [t.dims[p] for p in perm], lost=t.lost)


@rule
def unsqueeze(t: Tensor, axes: Sequence[int]) -> Tensor:
    rank = t.ndim + len(axes)
    axes = sorted(a % rank for a in axes)
    dims = list(t.dims)
    for a in axes:
        dims.insert(a, 1)
    data = t.data.reshape([d if isinstance(d, int) else m for d, m in
                           zip(dims, _insert_max(t.shape, axes))])
    return Tensor(data, dims, lost=t.lost)


def _insert_max(shape, axes):
    out = list(shape)
    for a in axes:
        out.insert(a, 1)
    return out


@rule
def squeeze(t: Tensor, axes: Sequence[int] | None) -> Tensor:
    """Removes size-1 axes (a dynamic axis of max size 1 too: its actual size must be 1)."""
    if axes is None:
        axes = [k for k, m in enumerate(t.shape) if m == 1]
    axes = {a % t.ndim for a in axes}
    for a in axes:
        if t.shape[a] != 1:
            raise OpArgumentError("Squeeze", "axes", "axes of size 1",
                                  f"axis {a} of max size {t.shape[a]}")
    keep = [k for k in range(t.ndim) if k not in axes]
    return Tensor(t.data.reshape([t.shape[k] for k in keep]), [t.dims[k] for k in keep],
                  lost=t.lost)


def _wire(t: Tensor) -> jax.Array:
    """The valid elements in row-major order of the actual shape, then padding (a flat
    buffer of max numel): what a reshape of a dynamic tensor reads."""
    dims = [jnp.maximum(jnp.asarray(d, jnp.int32), 1) for d in t.dims]
    n = math.prod(t.shape)
    pos = jnp.arange(n, dtype=jnp.int32)
    idx, rem = [], pos
    for k in range(t.ndim - 1, -1, -1):
        idx.append(jnp.clip(rem % dims[k], 0, max(t.shape[k] - 1, 0)))
        rem = rem // dims[k]
    return t.jax()[tuple(reversed(idx))] if n else t.jax().reshape(0)


def _unwire(flat: jax.Array, shape: tuple[int, ...], dims: Sequence[Dim]) -> jax.Array:
    """Inverse of :func:`_wire`: a row-major prefix becomes a leading block of ``shape``."""
    if not shape:
        return flat.reshape(())
    grid = jnp.indices(shape, dtype=jnp.int32, sparse=True)
    strides, s = [], jnp.int32(1)
    for k in range(len(shape) - 1, -1, -1):
        strides.append(s)
        s = s * jnp.asarray(dims[k], jnp.int32)
    at = sum(g * st for g, st in zip(grid, reversed(strides)))
    n = flat.shape[0]
    return flat[jnp.clip(at, 0, max(n - 1, 0))] if n else jnp.zeros(shape, flat.dtype)


@rule
def reshape(t: Tensor, dims: Sequence[Dim], shape: Sequence[int], op: str = "Reshape") -> Tensor:
    """To ``dims`` (static ints or traced sizes) at max ``shape``. Where the dynamic axes
    stay in place (the same dims lead, the rest is a static regrouping) the buffer is
    reshaped as it is; otherwise the valid elements are re-laid in row-major order."""
    shape = plan_shape(op, "shape", tuple(shape), t.dtype)
    dims = [int(d) if isinstance(d, (int, np.integer)) else d for d in dims]
    if t.is_static and all(isinstance(d, int) for d in dims):
        if math.prod(dims) != math.prod(t.shape):
            raise OpArgumentError(op, "shape", f"{math.prod(t.shape)} elements "
                                  f"(input shape {list(t.shape)})", list(dims))
        data = np.reshape(t.data, dims) if isinstance(t.data, np.ndarray) else \
            jnp.reshape(t.data, dims)
        return Tensor(data, dims, lost=t.lost)
    last = max(t.dynamic_axes(), default=-1)
    j = last + 1
    if j <= len(dims) and all(_same(a, b) for a, b in zip(t.dims[:j], dims[:j])) \
            and tuple(t.shape[:j]) == tuple(shape[:j]) \
            and all(isinstance(d, int) for d in dims[j:]) \
            and math.prod(t.shape[j:]) == math.prod(shape[j:]):
        return Tensor(jnp.reshape(t.jax(op), shape), dims, lost=t.lost)
    return Tensor(_unwire(_wire(t), shape, dims), dims, lost=t.lost)


@rule
def flatten(t: Tensor, axis: int) -> Tensor:
    axis = axis + t.ndim if axis < 0 else axis
    return reshape(t, [dims_product(t.dims[:axis]), dims_product(t.dims[axis:])],
                   [math.prod(t.shape[:axis]), math.prod(t.shape[axis:])], "Flatten")


@rule
def expand(t: Tensor, dims: Sequence[Dim], shape: Sequence[int]) -> Tensor:
    """numpy broadcasting of ``t`` to ``dims`` (max ``shape``)."""
    shape_t = _ShapeOnly(tuple(shape), list(dims))
    out_shape, out_dims = broadcast_dims("Expand", [t, shape_t])
    plan_shape("Expand", "shape", out_shape, t.dtype)
    return Tensor(_stretch(t, out_shape, out_dims), out_dims, lost=t.lost,
                  broadcast_of=t if t.ndim == len(out_shape) else None)


class _ShapeOnly:
    """A stand-in with a max shape and dims, for :func:`broadcast_dims`."""

    def __init__(self, shape, dims):
        self.shape, self.dims, self.ndim = shape, dims, len(shape)


@rule
def tile(t: Tensor, reps: Sequence[Dim], rep_max: Sequence[int]) -> Tensor:
    """``t`` repeated ``reps`` times along each axis: element ``p`` of an axis is the
    valid element ``p mod d``."""
    if t.is_static and all(isinstance(r, int) for r in reps):
        return Tensor(jnp.tile(t.jax("Tile"), reps), lost=t.lost)
    shape = plan_shape("Tile", "repeats", tuple(m * r for m, r in zip(t.shape, rep_max)),
                       t.dtype)
    data = t.jax("Tile")
    dims = []
    for k, (d, r) in enumerate(zip(t.dims, reps)):
        n = shape[k]
        src = jnp.arange(n, dtype=jnp.int32) % jnp.maximum(jnp.asarray(d, jnp.int32), 1)
        data = jnp.take(data, jnp.clip(src, 0, max(t.shape[k] - 1, 0)), axis=k) if n else \
            jnp.zeros(data.shape[:k] + (0,) + data.shape[k + 1:], data.dtype)
        dims.append(d * r if not (isinstance(d, int) and isinstance(r, int)) else d * r)
    return Tensor(data, dims, lost=t.lost)


# -- moving valid blocks -------------------------------------------------------------------
@rule
def concat(ts: Sequence[Tensor], axis: int) -> Tensor:
    """Concatenation along ``axis``; where a part's size there is dynamic, the valid blocks
    are compacted (each starts where the previous one's valid part ends)."""
    axis %= ts[0].ndim
    datas = [t.jax("Concat") for t in ts]
    data = jnp.concatenate(datas, axis=axis)
    dims = []
    for k in range(ts[0].ndim):
        if k == axis:
            static = sum(t.dims[axis] for t in ts if isinstance(t.dims[axis], int))
            traced = [t.dims[axis] for t in ts if not isinstance(t.dims[axis], int)]
            size = static if not traced else sum(traced[1:], traced[0]) + static \
                if static or len(traced) > 1 else traced[0]  # one part: its own dim
            dims.append(size)
        else:  # equal in a valid program: a static size if one is, else the first's dim
            ds = [t.dims[k] for t in ts]
            dims.append(next((d for d in ds if isinstance(d, int)), ds[0]))
    if all(isinstance(t.dims[axis], int) for t in ts):
        return Tensor(data, dims, lost=_lost(*ts))
    pos = jnp.arange(data.shape[axis], dtype=jnp.int32)
    src = pos  # position in the static concatenation each output position reads
    start_dyn, start_max = jnp.int32(0), 0
    for t in ts:
        inside = pos >= start_dyn
        src = jnp.where(inside, start_max + (pos - start_dyn), src)
        start_dyn = start_dyn + jnp.asarray(t.dims[axis], jnp.int32)
        start_max += t.shape[axis]
    src = jnp.clip(src, 0, max(data.shape[axis] - 1, 0))
    return Tensor(jnp.take(data, src, axis=axis), dims, lost=_lost(*ts))


@rule
def slice_axis(t: Tensor, axis: int, start: Any, end: Any, step: int,
               size_max: int | None = None) -> Tensor:
    """ONNX Slice along one axis: ``start``/``end`` (ints or traced scalars) clamp against
    the actual size as ONNX says; ``size_max`` bounds the result (default: what the axis
    allows)."""
    d = t.dims[axis]
    m = t.shape[axis]
    static = isinstance(d, int) and not is_traced(start) and not is_traced(end)
    if static:
        s, e, _ = slice(int(start), int(end), step).indices(d)
        idx = range(s, e, step)
        if step == 1:
            data = jax.lax.slice_in_dim(t.jax(), s, max(e, s), axis=axis) \
                if not isinstance(t.data, np.ndarray) else \
                np.take(t.data, np.arange(s, max(e, s)), axis=axis)
        else:
            data = jnp.take(t.jax(), jnp.asarray(list(idx), jnp.int32), axis=axis) if len(idx) \
                else jnp.zeros(t.shape[:axis] + (0,) + t.shape[axis + 1:], t.dtype)
        dims = list(t.dims)
        dims[axis] = len(idx)
        return Tensor(data, dims, lost=t.lost)
    dd = jnp.asarray(d, jnp.int32)
    big = jnp.int32(np.iinfo(np.int32).max)

    def norm(v, lo, hi):
        v = jnp.asarray(jnp.clip(v, -big, big), jnp.int32) if is_traced(v) else \
            jnp.int32(int(np.clip(int(v), -2**31 + 1, 2**31 - 1)))
        v = jnp.where(v < 0, v + dd, v)
        return jnp.clip(v, lo, hi)
    if step > 0:
        s, e = norm(start, 0, dd), norm(end, 0, dd)
        n = jnp.maximum((e - s + step - 1) // step, 0)
    else:
        s, e = norm(start, -1, dd - 1), norm(end, -1, dd - 1)
        n = jnp.maximum((s - e + (-step) - 1) // (-step), 0)
    cap = -(-m // abs(step))
    cap = cap if size_max is None else max(0, min(cap, size_max))
    pos = s + jnp.arange(cap, dtype=jnp.int32) * step
    data = jnp.take(t.jax(), jnp.clip(pos, 0, max(m - 1, 0)), axis=axis) if m else \
        jnp.zeros(t.shape[:axis] + (cap,) + t.shape[axis + 1:], t.dtype)
    dims = list(t.dims)
    dims[axis] = jnp.minimum(n, cap)
    return Tensor(data, dims, lost=t.lost)


# -- gathers and scatters ------------------------------------------------------------------
def _index(idx: Tensor, size: Dim, max_size: int) -> jax.Array:
    """Indices into an axis of (actual) ``size``: negative ones count from its actual end;
    clipped into the buffer, so padding indices read something harmless."""
    i = idx.jax().astype(jnp.int32) if np.dtype(idx.dtype).kind != "i" or \
        idx.dtype.itemsize > 4 else idx.jax()
    i = jnp.where(i < 0, i + jnp.asarray(size, i.dtype), i)
    return jnp.clip(i, 0, max(max_size - 1, 0))


@rule
def gather(t: Tensor, idx: Tensor, axis: int) -> Tensor:
    """ONNX Gather: the result's dims are ``t``'s with ``idx``'s in place of ``axis``."""
    axis %= t.ndim
    out = jnp.take(t.jax("Gather"), _index(idx, t.dims[axis], t.shape[axis]), axis=axis)
    dims = list(t.dims[:axis]) + list(idx.dims) + list(t.dims[axis + 1:])
    return Tensor(out, dims, lost=_lost(t, idx))


@rule
def gather_elements(t: Tensor, idx: Tensor, axis: int) -> Tensor:
    axis %= t.ndim
    i = _index(idx, t.dims[axis], t.shape[axis])
    data = t.jax("GatherElements")
    sl = [slice(0, n) for n in idx.shape]
    sl[axis] = slice(None)
    out = jnp.take_along_axis(data[tuple(sl)] if data.shape != idx.shape else data, i, axis=axis)
    return Tensor(out, idx.dims, lost=_lost(t, idx))


@rule
def gather_nd(t: Tensor, idx: Tensor, batch_dims: int = 0) -> Tensor:
    """ONNX GatherND: index tuples along the last axis of ``idx``; the result has ``idx``'s
    leading dims then ``t``'s remaining ones."""
    k = idx.shape[-1]
    if any(not isinstance(d, int) for d in t.dims[:batch_dims]) or not isinstance(idx.dims[-1], int):
        raise OpArgumentError("GatherND", "indices", "static batch axes and tuple length",
                              "a dynamic one")
    data = t.jax("GatherND")
    ii = idx.jax().astype(jnp.int32)
    cols = []
    for j in range(k):
        ax = batch_dims + j
        c = ii[..., j]
        c = jnp.where(c < 0, c + jnp.asarray(t.dims[ax], jnp.int32), c)
        cols.append(jnp.clip(c, 0, max(t.shape[ax] - 1, 0)))

    def one(x, cs):
        return x[tuple(cs[..., j] for j in range(k))]
    stacked = jnp.stack(cols, axis=-1) if cols else ii
    fn = one
    for _ in range(batch_dims):
        fn = jax.vmap(fn)
    out = fn(data, stacked)
    dims = list(idx.dims[:-1]) + list(t.dims[batch_dims + k:])
    return Tensor(out, dims, lost=_lost(t, idx))


@rule
def scatter_elements(t: Tensor, idx: Tensor, updates: Tensor, axis: int,
                     reduction: str = "none") -> Tensor:
    """ONNX ScatterElements: only the valid region of ``idx`` / ``updates`` writes (their
    padding is dropped), into ``t``'s buffer; ``t``'s dims stay."""
    axis %= t.ndim
    rows = _row_scatter(t, idx, updates, axis, reduction)
    if rows is not None:
        return rows
    i = idx.jax().astype(jnp.int32)
    i = jnp.where(i < 0, i + jnp.asarray(t.dims[axis], jnp.int32), i)
    valid = idx.axis_mask()
    uvalid = updates.axis_mask()
    keep = valid if uvalid is None else uvalid if valid is None else valid & uvalid
    if keep is not None:
        i = jnp.where(keep, i, t.shape[axis])  # out of bounds: dropped
    grid = list(jnp.indices(idx.shape, dtype=jnp.int32, sparse=True))
    grid[axis] = i
    at = t.jax("ScatterElements").at[tuple(grid)]
    u = updates.jax()
    out = {"none": lambda: at.set(u, mode="drop"), "add": lambda: at.add(u, mode="drop"),
           "mul": lambda: at.multiply(u, mode="drop"), "max": lambda: at.max(u, mode="drop"),
           "min": lambda: at.min(u, mode="drop")}[reduction]()
    return t.with_data(out, lost=_lost(t, idx, updates))


def _row_scatter(t: Tensor, idx: Tensor, updates: Tensor, axis: int, reduction: str):
    """ScatterElements whose indices are one index per row, broadcast over the other axes
    (``index.view(-1, 1, 1, 1).expand(...)``, how torchvision merges RoIAlign levels), and
    whose updates cover whole rows: the same writes as whole-row slices, far cheaper than
    one scatter per element. ``None`` where the pattern does not hold."""
    src = idx.broadcast_of
    if src is None or reduction != "none" or src.ndim != t.ndim or \
            any(src.shape[k] != 1 for k in range(t.ndim) if k != axis) or \
            tuple(updates.shape) != tuple(idx.shape) or \
            any(idx.shape[k] != t.shape[k] or not isinstance(idx.dims[k], int) or
                not isinstance(updates.dims[k], int) for k in range(t.ndim) if k != axis):
        return None
    n = idx.shape[axis]
    i = jnp.moveaxis(src.jax(), axis, 0).reshape(n).astype(jnp.int32)
    i = jnp.where(i < 0, i + jnp.asarray(t.dims[axis], jnp.int32), i)
    keep = jnp.arange(n) < jnp.minimum(jnp.asarray(idx.dims[axis], jnp.int32),
                                       jnp.asarray(updates.dims[axis], jnp.int32))
    i = jnp.where(keep, i, t.shape[axis])  # padding rows: dropped
    out = jnp.moveaxis(t.jax(), axis, 0).at[i].set(jnp.moveaxis(updates.jax(), axis, 0),
                                                  mode="drop")
    return t.with_data(jnp.moveaxis(out, 0, axis), lost=_lost(t, idx, updates))


# -- selection -----------------------------------------------------------------------------
@rule
def top_k(t: Tensor, k: Dim, k_max: int, axis: int, largest: bool = True) -> tuple[Tensor, Tensor]:
    """The ``k`` largest (smallest) along ``axis``, sorted, ties to the lower index, read
    from the valid region only; ``k`` may be traced (max ``k_max``): the result's size there
    is ``min(k, actual size)``."""
    axis %= t.ndim
    x = t.masked(_lowest(t.dtype) if largest else _highest(t.dtype), (axis,))
    if not largest:
        x = -x if t.dtype.kind == "f" else ~x if t.dtype.kind in "iu" else ~x
    x = jnp.moveaxis(x, axis, -1)
    k_max = max(0, min(int(k_max), t.shape[axis]))
    values, indices = jax.lax.top_k(x, k_max)
    if not largest:
        values = -values if t.dtype.kind == "f" else ~values
    values, indices = jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices, -1, axis)
    dims = list(t.dims)
    dims[axis] = k if isinstance(k, int) and isinstance(t.dims[axis], int) else \
        _imin(k, t.dims[axis])
    if isinstance(dims[axis], int):
        dims[axis] = min(dims[axis], k_max)
    return Tensor(values, dims, lost=t.lost), Tensor(indices, dims, lost=t.lost)
