"""NonZero: the indices of the non-zero elements of a tensor (ONNX / CANN ``NonZero``).

>>> import jax.numpy as jnp, jaxops
>>> x = jnp.array([[0, 3], [5, 0]])
>>> jaxops.refresh(jaxops.nonzero(x)).tolist()          # ONNX layout [rank, n]
[[0, 1], [1, 0]]
>>> jaxops.refresh(jaxops.argwhere(x)).tolist()         # CANN / torch layout [n, rank]
[[0, 1], [1, 0]]
>>> import jax
>>> d = jax.jit(lambda x: jaxops.flatnonzero(x, size=1))(x)  # capacity 1, two results
>>> jaxops.refresh(d, allow_truncated=True).tolist(), bool(d.overflowed()), int(d.lost())
([1], True, 1)
>>> v = jnp.array([1.0, 2.0, 3.0, 4.0])   # an overflow upstream flows into the result
>>> r = jax.jit(lambda v: jaxops.nonzero(jaxops.masked_select(v, v > 0, size=2) > 2.5))(v)
>>> r.actual_shape.tolist(), bool(r.overflowed()), r.true_shape.tolist()
([1, 0], True, [1, 2])
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.capacity import documents_policy_args, run_with_policy
from jaxops.core.dtypes import DataType
from jaxops.core.dynarray import DynArray
from jaxops.core.float_bits import is_nonzero, np_is_nonzero
from jaxops.core.registry import AttrDef, Input, OpDef, Output, register_op
from jaxops.ops._conventions import (ELEMENT_DTYPES, INDEX_FILL, capacity_attr, index_datatype,
                                     index_dtype, read_input, with_upstream_loss)
from jaxops.ops.compaction import compact_map

__all__ = ["NONZERO", "argwhere", "flatnonzero", "nonzero"]


def _index_shape(ctx) -> list[tuple[int, ...]]:
    shape = ctx.inputs[0].shape
    capacity = math.prod(shape) if ctx.attrs["size"] is None else ctx.attrs["size"]
    rank = max(len(shape), 1)
    return [(capacity, rank) if ctx.attrs["transpose"] else (rank, capacity)]


NONZERO = register_op(OpDef(
    name="NonZero",
    inputs=[Input("x", ELEMENT_DTYPES, doc="any shape; NaN counts as non-zero, -0.0 as zero")],
    outputs=[Output("y", {DataType.INT32, DataType.INT64},
                    doc="indices [rank, n] (transpose: [n, rank]); padding -1")],
    attrs=[capacity_attr("max number of results; None: x.size"),
           AttrDef("transpose", "bool", False, doc="[n, rank] layout (CANN, torch) instead of ONNX's")],
    infer_shape=_index_shape,
    infer_dtype=lambda ctx: [index_datatype()],
    data_dependent=True,
    fill_values=[INDEX_FILL],
    doc="Indices of the non-zero elements in row-major order (ONNX NonZero).",
))


@NONZERO.kernel("xla")
def _nonzero_xla(x, *, size, transpose):
    shape = x.shape or (1,)  # a scalar is a 1-element vector (as ONNX Runtime treats it)
    capacity = math.prod(shape) if size is None else size

    def coordinates(flat):  # row-major unravel, fused into the compaction loop
        coords, rest = [], flat
        for dim in reversed(shape[1:]):
            coords.append(rest % dim)
            rest = rest // dim
        return [rest] + coords[::-1]

    coords, count = compact_map(is_nonzero(x), capacity, coordinates, [INDEX_FILL] * len(shape))
    data = jnp.stack(coords).astype(index_dtype())
    found = jnp.minimum(count, capacity)
    rank = len(shape)
    actual, true = ([found, rank], [count, rank]) if transpose else ([rank, found], [rank, count])
    return (DynArray(data.T if transpose else data, jnp.stack(actual),
                     true_shape=None if size is None else jnp.stack(true), fill_value=INDEX_FILL),)


@documents_policy_args
def nonzero(x: jax.Array, *, size: int | None = None, transpose: bool = False,
            overflow: str = "expand", record: bool | str = False,
            backend: str | None = None) -> DynArray:
    """Indices of the non-zero elements of ``x``, in row-major order (op "NonZero").

    Args:
      x: array of any shape and a bool, integer, float or complex dtype. NaN counts as
        non-zero and -0.0 as zero (as ``x != 0``). A 0-d ``x`` is read as a 1-element
        vector, as ONNX Runtime does: the result has one index row. A :class:`DynArray`
        is read in its valid region only (indices are those of its exact array); when it
        overflowed upstream, the result's ``true_shape`` also counts its lost elements
        (each could have been one more index), so ``overflowed()`` reports it.
      size: capacity, the max number of results (``jnp.nonzero``'s ``size``). ``None``
        means ``x.size``, which can never overflow. With a smaller capacity the first
        ``size`` results are kept and the DynArray's ``true_shape`` holds the full count,
        so ``.overflowed()`` and ``.lost()`` report the cut inside ``jit``.
      transpose: ``False`` gives ONNX's layout ``[rank, n]``; ``True`` gives ``[n, rank]``
        (CANN, ``torch.nonzero``, :func:`argwhere`).
      {policy_args}

    Returns:
      A :class:`DynArray` of max shape ``[rank, size]`` (or ``[size, rank]``), actual shape
      ``[rank, n]``, dtype int32 (int64 with ``jax_enable_x64``, ONNX's dtype). Padding
      entries hold -1.

    Examples:
      >>> import jax.numpy as jnp, jaxops
      >>> jaxops.refresh(jaxops.nonzero(jnp.array([0.0, jnp.nan, -0.0, 2.0]))).tolist()
      [[1, 3]]
    """
    if isinstance(x, np.ndarray) and x.dtype.itemsize >= 8 and not jax.config.jax_enable_x64:
        x = np_is_nonzero(x)  # exact: only zero-ness counts, and x64 off would narrow values
    given = read_input("NonZero", "x", x)
    if given.valid is not None:  # only the valid region: the padding reads as zero
        x = jnp.where(given.valid, given.data, jnp.zeros((), given.data.dtype))
    elif isinstance(x, DynArray):
        x = given.data

    def run(capacity: int | None, rerun_backend: str | None) -> DynArray:
        out = NONZERO(x, size=capacity, transpose=transpose, backend=rerun_backend or backend)[0]
        return with_upstream_loss(out, given.lost, 0 if transpose else 1)

    return run_with_policy(run, op="NonZero", size=size, theoretical_max=math.prod(np.shape(x)),
                           policy=overflow, record=record, input_shapes=[np.shape(x)],
                           capacity_axis=0 if transpose else 1)


def argwhere(x: jax.Array, *, size: int | None = None, overflow: str = "expand",
             record: bool | str = False, backend: str | None = None) -> DynArray:
    """:func:`nonzero` in the ``[n, rank]`` layout (``np.argwhere``, CANN, torch); the
    arguments are :func:`nonzero`'s (``record`` records the rows this call needed).

    >>> import jax.numpy as jnp, jaxops
    >>> jaxops.refresh(jaxops.argwhere(jnp.array([[1, 0], [0, 1]]), size=3)).tolist()
    [[0, 0], [1, 1]]
    """
    return nonzero(x, size=size, transpose=True, overflow=overflow, record=record,
                   backend=backend)


def flatnonzero(x: jax.Array, *, size: int | None = None, overflow: str = "expand",
                record: bool | str = False, backend: str | None = None) -> DynArray:
    """Flat (row-major) indices of the non-zero elements: a 1-D DynArray, padding -1; the
    arguments are :func:`nonzero`'s.

    >>> import jax.numpy as jnp, jaxops
    >>> jaxops.refresh(jaxops.flatnonzero(jnp.array([[1, 0], [0, 1]]))).tolist()
    [0, 3]
    """
    flat = x.ravel() if isinstance(x, DynArray) else x.reshape(-1) if hasattr(x, "reshape") else x
    rows = nonzero(flat, size=size, overflow=overflow, record=record, backend=backend)
    true = None if rows.true_shape is None else rows.true_shape[..., 1:]
    return DynArray.tree_unflatten(rows.fill_value, (rows.data[..., 0, :], rows.actual_shape[..., 1:], true))
