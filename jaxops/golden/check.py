"""Checking a golden case against an independent reference (:mod:`jaxops.golden.references`).

The case's own inputs go through the operator's numpy reference, never through the kernel
that wrote the case: every output's valid block, its padding, its actual and true shapes
and the OP_OUTSHAPE words must agree with it.

>>> import tempfile
>>> from jaxops.golden.cases import write_case
>>> check_case(write_case("MaskedSelect", 2, out=tempfile.mkdtemp()))
True
"""

from __future__ import annotations

import math
import os

import numpy as np

from jaxops.core.outshape_format import decode
from jaxops.core.registry import get_op
from jaxops.golden.cases import load_case
from jaxops.golden.references import reference

__all__ = ["check_case"]


def check_case(path: str | os.PathLike) -> bool:
    """Checks a golden case against the independent reference of its operator.

    Integer outputs are compared by value (index outputs are written as int64), others bit
    for bit in the reference's dtype; the padding after each valid block must hold the
    output's fill value.

    Args:
      path: the case's ``.npz`` file.

    Returns:
      ``True``; a difference raises ``AssertionError`` naming the output and the first
      element that differs. An operator without a reference raises
      :class:`~jaxops.core.errors.OpArgumentError`.

    Examples:
      >>> import tempfile
      >>> from jaxops.golden.cases import write_case
      >>> check_case(write_case("NonZero", 1, out=tempfile.mkdtemp(), shape=(5,), dtype="int8"))
      True
    """
    case = load_case(path)
    opdef = get_op(case["op"])
    arrays = case["arrays"]
    inputs = [arrays.get(f"input_{p.name}") for p in opdef.inputs]
    want = reference(case["op"])(inputs, case["attrs"])
    words = arrays.get("outshape")
    announced = decode(words) if words is not None else None
    for k, (param, desc) in enumerate(zip(opdef.outputs, case["outputs"])):
        where = f"golden case {os.fspath(path)}: output {param.name}"
        buf, expected = arrays[f"output_{param.name}"], np.asarray(want.outputs[k])
        if "actual_shape" not in desc:  # a fixed-shape output: the whole buffer
            _same_values(where, buf, expected)
            continue
        actual = tuple(desc["actual_shape"])
        _same(where, "actual shape", actual, expected.shape)
        if announced is not None:
            _same(where, "OP_OUTSHAPE shape", announced[k], actual)
        true = want.true_shapes[k]
        if true is not None and "true_shape" in desc:
            _same(where, "true shape", tuple(desc["true_shape"]), tuple(true))
        flat, n = buf.reshape(-1), math.prod(actual)
        _same_values(where, flat[:n].reshape(actual), expected)
        padding = flat[n:]
        if padding.size and not np.all(padding == np.asarray(desc["fill_value"]).astype(buf.dtype)):
            at = int(np.flatnonzero(padding != desc["fill_value"])[0])
            raise AssertionError(f"{where}: padding element {n + at} is {padding[at]!r}, "
                                 f"not the fill value {desc['fill_value']!r}")
    return True


def _same(where: str, what: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise AssertionError(f"{where}: {what} {tuple(got)}, the reference's {tuple(want)}")


def _same_values(where: str, got: np.ndarray, want: np.ndarray) -> None:
    """Integers by value (same kind), anything else bit for bit in ``want``'s dtype."""
    _same(where, "shape", got.shape, want.shape)
    if want.dtype.kind in "biu":
        if got.dtype.kind not in "biu":
            raise AssertionError(f"{where}: dtype {got.dtype}, the reference's {want.dtype}")
        differs = got.astype(np.int64) != want.astype(np.int64)
    elif got.dtype != want.dtype:
        raise AssertionError(f"{where}: dtype {got.dtype}, the reference's {want.dtype}")
    else:
        as_bytes = lambda a: np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (-1,))
        differs = (as_bytes(got) != as_bytes(want)).any(axis=-1) if got.size else np.zeros(got.shape, bool)
    if differs.any():
        at = tuple(int(i[0]) for i in np.nonzero(differs))
        raise AssertionError(f"{where}: element {at} is {got[at]!r}, the reference's "
                             f"{want[at]!r} ({int(differs.sum())} of {differs.size} differ)")
