"""Rules that move valid blocks between positions: concat (compacting), slice with traced
bounds, gathers with DynArray indices, scatters that write only the valid region."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.dynamic.rules._common import lost_of, rule
from jaxops.dynamic.tensor import Dim, Tensor, is_traced

__all__ = ["concat", "gather", "gather_elements", "gather_nd", "scatter_elements", "slice_axis"]


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
        return Tensor(data, dims, lost=lost_of(*ts))
    pos = jnp.arange(data.shape[axis], dtype=jnp.int32)
    src = pos  # position in the static concatenation each output position reads
    start_dyn, start_max = jnp.int32(0), 0
    for t in ts:
        inside = pos >= start_dyn
        src = jnp.where(inside, start_max + (pos - start_dyn), src)
        start_dyn = start_dyn + jnp.asarray(t.dims[axis], jnp.int32)
        start_max += t.shape[axis]
    src = jnp.clip(src, 0, max(data.shape[axis] - 1, 0))
    return Tensor(jnp.take(data, src, axis=axis), dims, lost=lost_of(*ts))


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
    return Tensor(out, dims, lost=lost_of(t, idx))


@rule
def gather_elements(t: Tensor, idx: Tensor, axis: int) -> Tensor:
    axis %= t.ndim
    i = _index(idx, t.dims[axis], t.shape[axis])
    data = t.jax("GatherElements")
    sl = [slice(0, n) for n in idx.shape]
    sl[axis] = slice(None)
    out = jnp.take_along_axis(data[tuple(sl)] if data.shape != idx.shape else data, i, axis=axis)
    return Tensor(out, idx.dims, lost=lost_of(t, idx))


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
    return Tensor(out, dims, lost=lost_of(t, idx))


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
    return t.with_data(out, lost=lost_of(t, idx, updates))


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
    return t.with_data(jnp.moveaxis(out, 0, axis), lost=lost_of(t, idx, updates))
