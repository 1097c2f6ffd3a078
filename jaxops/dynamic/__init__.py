"""Whole-program valid-region rules: what jaxops' dual shape does in every downstream op.

An operator with a data-dependent output gives a :class:`~jaxops.DynArray`; the ops after
it must read only its valid region and pass an actual shape on. :mod:`jaxops.dynamic.rules`
holds one rule per kind of op (elementwise with broadcasting, reductions and arg-reductions
masked with their identity, softmax, matmul, concat that compacts the valid blocks,
reshape, slice, gathers, scatters, top-k with a traced ``k``, ops per row of a dynamic
batch axis), over :class:`~jaxops.dynamic.Tensor` (per-axis dims and value bounds). The
ONNX front end (:mod:`jaxops.onnx`) is built on them; the functions here are the same
rules for a Python program, taking DynArrays or arrays and returning DynArrays (or arrays
where nothing is dynamic).

>>> import jax, jax.numpy as jnp, jaxops
>>> from jaxops import dynamic
>>> x = jnp.array([3.0, -1.0, 7.0, 0.0, 5.0])
>>> kept = jaxops.masked_select(x, x > 0)            # [3, 7, 5]: a DynArray
>>> jaxops.refresh(dynamic.top_k(kept, 2)[0]).tolist()
[7.0, 5.0]
>>> float(dynamic.reduce(kept, "min", axes=(0,)))    # the padding never counts
3.0
>>> both = dynamic.concat([kept, kept], axis=0)      # valid blocks compacted
>>> jaxops.refresh(both).tolist()
[3.0, 7.0, 5.0, 3.0, 7.0, 5.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxops.core.dynarray import DynArray
from jaxops.dynamic import rules
from jaxops.dynamic.rules import IDENTITIES, RULES
from jaxops.dynamic.tensor import Tensor, plan_shape

__all__ = [
    "IDENTITIES", "RULES", "Tensor", "argmax", "concat", "elementwise", "gather", "matmul",
    "plan_shape", "reduce", "rules", "softmax", "top_k",
]

Array = jax.Array | DynArray


def _out(t: Tensor, fill: Any = 0) -> Array:
    return t.to_public(fill)


def elementwise(fn: Callable, *xs: Array) -> Array:
    """``fn`` over DynArrays / arrays with numpy broadcasting; the result's actual shape is
    the broadcast of theirs."""
    return _out(rules.elementwise(fn, *[Tensor.of(x) for x in xs]))


def reduce(x: Array, kind: str, axes: Sequence[int], keepdims: bool = False) -> Array:
    """A reduction (``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"``, ...; see
    :data:`IDENTITIES`) over the valid region only."""
    return _out(rules.reduce(Tensor.of(x), kind, axes, keepdims))


def argmax(x: Array, axis: int, keepdims: bool = False) -> Array:
    """Index of the largest valid element along ``axis`` (the first of ties)."""
    return _out(rules.arg_reduce(Tensor.of(x), "max", axis, keepdims, False))


def softmax(x: Array, axis: int = -1) -> Array:
    """Softmax along ``axis`` over the valid region (padding stays padding)."""
    return _out(rules.softmax(Tensor.of(x), axis))


def matmul(a: Array, b: Array) -> Array:
    """``a @ b`` with the padding of the contracted axis read as 0."""
    return _out(rules.matmul(Tensor.of(a), Tensor.of(b)))


def concat(xs: Sequence[Array], axis: int = 0) -> Array:
    """Concatenation with the valid blocks compacted along ``axis``."""
    return _out(rules.concat([Tensor.of(x) for x in xs], axis))


def gather(x: Array, indices: Array, axis: int = 0) -> Array:
    """``jnp.take`` with negative indices counted from the actual end; a DynArray of
    indices gives a DynArray."""
    return _out(rules.gather(Tensor.of(x), Tensor.of(indices), axis))


def top_k(x: Array, k: int | jax.Array, axis: int = -1, k_max: int | None = None,
          largest: bool = True) -> tuple[Array, Array]:
    """The ``k`` largest valid elements along ``axis`` and their indices, sorted; ``k`` may
    be traced (then ``k_max`` bounds it; default the axis' max size). The result's size
    there is ``min(k, actual size)``."""
    t = Tensor.of(x)
    m = t.shape[axis] if k_max is None else k_max
    values, indices = rules.top_k(t, k if isinstance(k, int) else k, m, axis, largest)
    return _out(values), _out(indices, -1)
