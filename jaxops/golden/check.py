"""Checking a golden case against an independent reference (:mod:`jaxops.golden.references`).

The case's own inputs go through the numpy reference of the contract the case follows, in
the impl mode it records, never through the kernel that wrote it: every output (its
dtype, its values, its actual and true shapes) and the OP_OUTSHAPE words must agree with
it. ``jaxops golden check FILE`` runs it from the command line.

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
from jaxops.golden import nms_references  # noqa: F401  (registers the NMS family's references)
from jaxops.golden.files import load
from jaxops.golden.references import reference

__all__ = ["check_case"]


def check_case(path: str | os.PathLike) -> bool:
    """Checks a golden case against the independent reference of its contract.

    Outputs are compared bit for bit, in the reference's dtype (the contract's: values in
    their input's dtype, indices int64 or, for aclnnNonMaxSuppression, int32).

    Args:
      path: the case's ``.npz`` file.

    Returns:
      ``True``; a difference raises ``AssertionError`` naming the output and the first
      element that differs. An operator without a reference, or an impl mode its
      reference does not model, raises :class:`~jaxops.core.errors.OpArgumentError`.

    Examples:
      >>> import tempfile
      >>> from jaxops.golden.cases import write_case
      >>> check_case(write_case("NonZero", 1, out=tempfile.mkdtemp(), shape=(5,), dtype="int8"))
      True
    """
    case = load(path)
    opdef = get_op(case["op"])
    arrays = case["arrays"]
    inputs = [arrays.get(f"input_{p.name}") for p in opdef.inputs]
    contract = (case.get("contract") or {}).get("name")
    mode = case.get("impl_mode", {}).get("name", "high_precision")
    want = reference(case["op"], contract, mode)(inputs, case["attrs"])
    words = arrays.get("outshape")
    announced = decode(words) if words is not None else None
    for k, desc in enumerate(case["outputs"]):
        where = f"golden case {os.fspath(path)}: output {desc['name']}"
        got, expected = arrays[f"output_{desc['name']}"], np.asarray(want.outputs[k])
        _same_values(where, got, expected)
        if "actual_shape" not in desc:  # a fixed-shape output: the whole buffer
            _same(where, "shape", got.shape, desc["max_shape"])
            continue
        _same(where, "actual shape", desc["actual_shape"], expected.shape)
        if announced is not None:
            _same(where, "OP_OUTSHAPE shape", announced[k], expected.shape)
        if math.prod(expected.shape) > math.prod(desc["max_shape"]):
            raise AssertionError(f"{where}: actual shape {expected.shape} does not fit the max "
                                 f"shape {tuple(desc['max_shape'])}")
        true = want.true_shapes[k]
        if true is not None and "true_shape" in desc:
            _same(where, "true shape", desc["true_shape"], true)
    return True


def _same(where: str, what: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise AssertionError(f"{where}: {what} {tuple(got)}, the reference's {tuple(want)}")


def _same_values(where: str, got: np.ndarray, want: np.ndarray) -> None:
    """Same dtype, shape and bits (so NaN payloads, -0.0 and subnormals count)."""
    if got.dtype != want.dtype:
        raise AssertionError(f"{where}: dtype {got.dtype}, the reference's {want.dtype}")
    _same(where, "shape", got.shape, want.shape)
    if not got.size:
        return
    as_bytes = lambda a: np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (-1,))
    differs = (as_bytes(got) != as_bytes(want)).any(axis=-1)
    if differs.any():
        at = tuple(int(i[0]) for i in np.nonzero(differs))
        raise AssertionError(f"{where}: element {at} is {got[at]!r}, the reference's "
                             f"{want[at]!r} ({int(differs.sum())} of {differs.size} differ)")
