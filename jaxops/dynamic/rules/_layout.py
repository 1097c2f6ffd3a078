"""Layout rules: transpose, (un)squeeze, reshape and flatten (re-laying the valid elements
in row-major order where a dynamic axis moves) and tile."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.dynamic.rules._common import rule, same_dim
from jaxops.dynamic.tensor import Dim, Tensor, dims_product, plan_shape

__all__ = ["flatten", "reshape", "squeeze", "tile", "transpose", "unsqueeze"]


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
    if j <= len(dims) and all(same_dim(a, b) for a, b in zip(t.dims[:j], dims[:j])) \
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
