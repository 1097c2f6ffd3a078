"""What the handlers share: ONNX dtypes as the dtypes JAX computes in, known ints, dims
from a shape tensor."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.dynamic.tensor import Dim, Tensor, is_traced

__all__ = ["dims_from", "jax_dtype", "scalar"]


def jax_dtype(elem_type: int) -> np.dtype:
    """An ONNX element type as the dtype JAX computes it in (int64 is int32 with x64 off)."""
    from onnx import helper

    return np.dtype(jax.dtypes.canonicalize_dtype(helper.tensor_dtype_to_np_dtype(elem_type)))


def scalar(t: Tensor | None, default: Any = None) -> Any:
    """A 0-d or 1-element tensor as a Python number (known) or a traced scalar."""
    if t is None:
        return default
    if t.concrete:
        return np.asarray(t.data).reshape(-1)[0].item()
    return t.jax().reshape(-1)[0]


def dims_from(ctx: Any, shape: Tensor, arg: str = "shape") -> tuple[list[Dim], list[int]]:
    """A 1-D shape tensor as (dims, max dims): a known element is a static dim; an element
    that *is* a traced dim of another tensor (``Shape`` then copies) is that dim; any other
    traced element is a dynamic dim whose max is its upper bound."""
    if shape.ndim != 1 or not shape.is_static:
        raise ctx.error(arg, "a 1-D shape tensor of static length", list(shape.shape))
    if shape.concrete:
        vals = [int(v) for v in np.asarray(shape.data).reshape(-1)]
        return list(vals), list(vals)
    lo, hi = (np.broadcast_to(b, shape.shape) for b in shape.bounds())
    syms = shape.syms
    data = shape.jax().astype(jnp.int32)
    dims, maxes = [], []
    for k in range(shape.shape[0]):
        if syms is not None and syms[k] is not None:
            dims.append(syms[k])
            maxes.append(int(hi[k]))
        elif lo[k] == hi[k]:
            dims.append(int(lo[k]))
            maxes.append(int(lo[k]))
        elif not np.isfinite(hi[k]) or hi[k] >= 2 ** 31:
            raise ctx.error(arg, "elements with a static upper bound",
                            f"element {k} of unbounded value",
                            "Where does it come from? A capacity on the data-dependent op "
                            "upstream bounds it.")
        else:
            dims.append(data[k])
            maxes.append(int(max(hi[k], 0)))
    return dims, maxes


def is_known(t: Tensor | None) -> bool:
    return t is None or (t.concrete and not is_traced(t.data))
