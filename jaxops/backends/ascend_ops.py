"""The operators jaxops maps onto Ascend aclnn kernels, registered as ``ascend`` kernels.

===========  =====================  ===========================================================
operator     aclnn kernel           mapping
===========  =====================  ===========================================================
NonZero      ``aclnnNonzero``       out ``[numel, rank]`` int64 (transposed for the ONNX layout)
MaskedSelect ``aclnnMaskedSelect``  out ``[broadcast numel]`` (the kernel broadcasts)
Unique       ``aclnnUnique2``       ``sorted=True, axis=None, equal_nan=True`` only; values,
                                    inverse and counts from the kernel, first indices from
                                    the inverse (``finish`` / ``traced_finish``)
===========  =====================  ===========================================================

Every other operator (UniqueConsecutive, the NMS family) and every configuration an aclnn
kernel does not serve (``Unique(axis=...)``, ``Unique(sorted=False)``,
``Unique(equal_nan=False)``, dtypes outside the kernel's list) runs on ``xla`` under automatic selection; :func:`jaxops.backends.explain`
gives the reason, and an explicit ``backend="ascend"`` raises it. Capacity (``size``) is
applied after the kernel: aclnn outputs are always allocated at the full max shape.
Each mapping has a numpy ``finish`` (eager :func:`~jaxops.backends.ascend.run` and the
callback route) and its jnp twin ``traced_finish`` (the XLA custom-call route,
:mod:`jaxops.backends.aclnn_call`).

Dtype lists are those the aclnn docs give for Atlas A2/A3 (the 950 series takes more).

>>> import jaxops
>>> "ascend" in jaxops.get_op("NonZero").backends()
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

import jax.numpy as jnp

from jaxops.backends import aclnn_call
from jaxops.backends.ascend import (SPECS, AclnnSpec, In, Out, Scalar, dispatch, problem,
                                    runtime)
from jaxops.backends.callback import host_kernel
from jaxops.core.dynarray import DynArray
from jaxops.core.dtypes import DataType as D
from jaxops.core.errors import BackendUnavailableError, DuplicateOpError
from jaxops.core.numerics import INDEX_FILL
from jaxops.core.registry import on_op

__all__ = ["INDEX_DTYPES", "UNIQUE2_DTYPES", "aclnn_kernel_for"]

I64 = np.dtype(np.int64)
#: aclnnNonzero / aclnnMaskedSelect on Atlas A2/A3
INDEX_DTYPES = frozenset({D.FLOAT, D.FLOAT16, D.DOUBLE, D.INT32, D.INT64, D.INT16, D.INT8,
                          D.UINT8, D.BOOL, D.BF16})
#: aclnnUnique2 on Atlas A2/A3
UNIQUE2_DTYPES = INDEX_DTYPES | {D.UINT16, D.UINT32, D.UINT64}


def _as_is(outs, *inputs, **attrs):
    return outs


def aclnn_kernel_for(op: str, aclnn: str, dtypes: frozenset[D],
                     finish: Callable[..., Sequence[np.ndarray]] = _as_is,
                     refuses: Callable[..., str | None] | None = None,
                     traced_finish: Callable[..., Sequence] | None = _as_is):
    """Decorator on an aclnn ``build`` function: maps operator ``op`` onto
    ``aclnn<aclnn>`` (an :class:`AclnnSpec`) and registers its ``ascend`` kernel; an unknown
    operator name raises :class:`~jaxops.errors.UnknownOpError` at import."""
    def register(build):
        spec = AclnnSpec(op, aclnn, dtypes, build, finish, traced_finish=traced_finish,
                         **({} if refuses is None else {"refuses": refuses}))
        if op in SPECS:
            raise DuplicateOpError(f"{op}: aclnn kernel registered twice")
        on_op(op, lambda opdef: opdef.kernel("ascend")(_ascend_kernel(opdef, spec)),
              "ascend kernel")
        SPECS[op] = spec
        return build
    return register


def _ascend_kernel(op, spec: AclnnSpec):
    def on_host(*inputs, **attrs):  # checked at trace time; per example under vmap
        return dispatch(spec, inputs, attrs)

    def check(*inputs, **attrs):  # at trace time, for calls that chose ascend without inputs
        why = problem(spec, inputs, attrs)
        if why:
            raise BackendUnavailableError(f"{spec.op}: the ascend kernel cannot run this call: "
                                          f"{why}. Use backend='xla'.")

    def traced(structs, *inputs, **attrs):  # the XLA custom call, where it serves
        return aclnn_call.forward(spec, runtime(), structs, inputs, attrs)

    return host_kernel(op, on_host, check=check, traced=traced)


def _nonzero_finish(outs, x, *, size, transpose):
    (rows,) = outs  # [n, rank]
    return (rows if transpose else rows.T,)


def _nonzero_traced(outs, x, *, size, transpose):
    (rows,) = outs  # [n, rank] of [numel, rank]
    return (rows if transpose else DynArray(rows.data.T, rows.actual_shape[::-1]),)


@aclnn_kernel_for("NonZero", "Nonzero", INDEX_DTYPES, finish=_nonzero_finish,
                  traced_finish=_nonzero_traced)
def _nonzero_build(x, *, size, transpose):
    x = x.reshape(1) if x.ndim == 0 else x  # a scalar is a 1-element vector (the xla rule)
    return [In(x), Out((x.size, x.ndim), I64)]


@aclnn_kernel_for("MaskedSelect", "MaskedSelect", INDEX_DTYPES)
def _masked_select_build(x, mask, *, size):
    shape = np.broadcast_shapes(x.shape, mask.shape)
    return [In(x), In(mask), Out((math.prod(shape),), x.dtype)]


def _unique_refuses(*, size, sorted, axis, equal_nan=True):
    if not equal_nan:
        return "aclnnUnique2 has no equal_nan (Unique(equal_nan=False) runs on xla)"
    if axis is not None:
        return "aclnnUnique2 has no axis (Unique with axis runs on xla)"
    if not sorted:
        return ("aclnnUnique2 sorted=False gives no defined order (Unique(sorted=False) runs "
                "on xla)")
    return None


def _unique_finish(outs, x, *, size, sorted, axis, equal_nan):
    values, inverse, counts = outs
    n = inverse.size
    first = np.full(values.shape[0], n, I64)
    np.minimum.at(first, inverse, np.arange(n))  # the kernel does not return first indices
    cap = n if size is None else size
    return values, first, np.where(inverse < cap, inverse, INDEX_FILL), counts


def _unique_traced(outs, x, *, size, sorted, axis, equal_nan):
    values, inverse, counts = outs  # the inverse is whole: its actual shape is x's
    n, inv = inverse.max_shape[0], inverse.data
    first = jnp.full(n, n, inv.dtype).at[inv].min(jnp.arange(n, dtype=inv.dtype))
    cap = n if size is None else size
    return (values, DynArray(first, values.actual_shape), jnp.where(inv < cap, inv, INDEX_FILL),
            counts)


@aclnn_kernel_for("Unique", "Unique2", UNIQUE2_DTYPES, finish=_unique_finish,
                  refuses=_unique_refuses, traced_finish=_unique_traced)
def _unique_build(x, *, size, sorted, axis, equal_nan):
    flat = x.reshape(-1)
    n = flat.size
    return [In(flat), Scalar("bool", True), Scalar("bool", True), Scalar("bool", True),
            Out((n,), x.dtype), Out((n,), I64), Out((n,), I64)]
