"""Ops whose rows are independent (a dynamic batch axis, a contraction's rows, RoIAlign's
boxes): they run at the max shape, or at the smallest capacity of a ladder that holds the
actual rows (cost follows the data); and matmul, the contracted padding read as 0."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxops.core.errors import OpArgumentError
from jaxops.dynamic.rules._common import lost_of, rule
from jaxops.dynamic.rules._layout import squeeze, unsqueeze
from jaxops.dynamic.rules._pointwise import broadcast_dims
from jaxops.dynamic.tensor import Dim, Tensor

__all__ = ["LADDER_START", "by_rows", "matmul", "per_row"]


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
    res = Tensor(out, dims, lost=lost_of(a, b))
    if vb:
        res = squeeze(res, (res.ndim - 1,))
    if va:
        res = squeeze(res, (res.ndim - 2,))
    return res
