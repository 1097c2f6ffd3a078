"""Rules that read across an axis: reductions masked with their identity, arg-reductions,
softmax and top-k with a traced ``k``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.dynamic.rules._common import dim_min, highest, is_float, lowest, rule
from jaxops.dynamic.tensor import Dim, Tensor

__all__ = ["IDENTITIES", "arg_reduce", "reduce", "softmax", "top_k"]


#: What each reduction reads in the padding: its identity.
IDENTITIES: dict[str, Callable[[Any], Any]] = {
    "sum": lambda dt: 0, "mean": lambda dt: 0, "prod": lambda dt: 1, "max": lowest,
    "min": highest, "sum_square": lambda dt: 0, "l1": lambda dt: 0, "l2": lambda dt: 0,
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




# -- selection -----------------------------------------------------------------------------
@rule
def top_k(t: Tensor, k: Dim, k_max: int, axis: int, largest: bool = True) -> tuple[Tensor, Tensor]:
    """The ``k`` largest (smallest) along ``axis``, sorted, ties to the lower index, read
    from the valid region only; ``k`` may be traced (max ``k_max``): the result's size there
    is ``min(k, actual size)``."""
    axis %= t.ndim
    x = t.masked(lowest(t.dtype) if largest else highest(t.dtype), (axis,))
    if not largest:
        x = -x if is_float(t.dtype) else ~x
    x = jnp.moveaxis(x, axis, -1)
    k_max = max(0, min(int(k_max), t.shape[axis]))
    values, indices = jax.lax.top_k(x, k_max)
    if not largest:
        values = -values if is_float(t.dtype) else ~values
    values, indices = jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices, -1, axis)
    dims = list(t.dims)
    dims[axis] = k if isinstance(k, int) and isinstance(t.dims[axis], int) else \
        dim_min(k, t.dims[axis])
    if isinstance(dims[axis], int):
        dims[axis] = min(dims[axis], k_max)
    return Tensor(values, dims, lost=t.lost), Tensor(indices, dims, lost=t.lost)
