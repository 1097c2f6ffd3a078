"""Elementwise ops with numpy broadcasting of max shapes and dims (the padding stays
padding: nothing to mask), and ``expand``, broadcasting to a shape."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from jaxops.core.errors import OpArgumentError
from jaxops.dynamic.rules._common import dim_max, lost_of, rule, same_dim
from jaxops.dynamic.tensor import Dim, Tensor, plan_shape

__all__ = ["broadcast_dims", "elementwise", "expand"]


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
                shape[j], dims[j] = max(shape[j], m), (dims[j] if same_dim(dims[j], d)
                                                       else dim_max(dims[j], d))
    return tuple(shape), dims


def _stretch(t: Tensor, shape: tuple[int, ...], dims: list[Dim]) -> jax.Array:
    """``t``'s buffer broadcast to ``shape``; a dynamic axis whose actual size is 1 where the
    result's is not stretches its first element (numpy broadcasting, at run time)."""
    data = t.jax()
    off = len(shape) - t.ndim
    for k, d in enumerate(t.dims):
        if not isinstance(d, int) and not same_dim(d, dims[off + k]) and shape[off + k] > 1:
            first = jax.lax.slice_in_dim(data, 0, 1, axis=k)
            data = jnp.where(d == 1, first, data) if data.shape[k] > 0 else data
    data = data.reshape((1,) * off + data.shape)
    return jnp.broadcast_to(data, shape) if data.shape != shape else data


@rule
def elementwise(fn: Callable, *ts: Tensor, op: str = "elementwise") -> Tensor:
    """``fn`` over the broadcast buffers; the padding stays padding (nothing to mask)."""
    if all(t.is_static for t in ts):
        return Tensor(fn(*[t.jax(op) for t in ts]), lost=lost_of(*ts))
    shape, dims = broadcast_dims(op, ts)
    return Tensor(fn(*[_stretch(t, shape, dims) for t in ts]), dims, lost=lost_of(*ts))



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
