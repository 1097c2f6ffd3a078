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
from jaxops.golden import table_references  # noqa: F401  (and the hash-table operators')
from jaxops.golden.files import load
from jaxops.golden.references import reference, takes_names

__all__ = ["check_case"]


def check_case(path: str | os.PathLike) -> bool:
    """Checks a golden case against the independent reference of its contract.

    Outputs are compared bit for bit, in the reference's dtype (the contract's: values in
    their input's dtype, indices int64 or, for aclnnNonMaxSuppression, int32); the float
    outputs of ApplyAdamW within the few roundings a fused evaluation may change
    (:mod:`jaxops.golden.table_references`).

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
    if takes_names(case["op"], contract):
        return _check_named(path, case, reference(case["op"], contract, mode))
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


def _check_named(path, case: dict, ref) -> bool:
    """A case whose reference takes its inputs by name (the hash-table operators): every
    output bit for bit, floats the reference gives a tolerance within it."""
    arrays = case["arrays"]
    inputs = {d["name"]: arrays[f"input_{d['name']}"] for d in case["inputs"]}
    want = ref(inputs, case["attrs"])
    names = [d["name"] for d in case["outputs"]]
    if sorted(names) != sorted(want.outputs):
        raise AssertionError(f"golden case {os.fspath(path)}: outputs {sorted(names)}, the "
                             f"reference's {sorted(want.outputs)}")
    for d in case["outputs"]:
        where = f"golden case {os.fspath(path)}: output {d['name']}"
        got, expected = arrays[f"output_{d['name']}"], np.asarray(want.outputs[d["name"]])
        tol = (want.tolerances or {}).get(d["name"])
        if tol is None:
            _same_values(where, got, expected)
        elif got.dtype == np.uint8:
            _same_buckets(where, got, expected, tol)
        else:
            _within(where, got, expected, tol)
        _same(where, "shape", got.shape, d["max_shape"])
    return True


def _same_buckets(where: str, got: np.ndarray, want: np.ndarray, tol: np.ndarray) -> None:
    """Bucket bytes: every byte equal but the rows', which are float32 within ``tol``."""
    _same(where, "shape", got.shape, want.shape)
    rows = slice(24, 24 + 4 * tol.shape[1])
    rest = np.ones(got.shape[1], bool)
    rest[rows] = False
    _same_values(where + " (bytes outside the rows)", got[:, rest], want[:, rest])
    as_rows = lambda a: np.ascontiguousarray(a[:, rows]).view("<f4")  # noqa: E731
    _within(where + " (rows)", as_rows(got), as_rows(want), tol)


def _within(where: str, got: np.ndarray, want: np.ndarray, tol: np.ndarray) -> None:
    """Same dtype and shape; each element within its tolerance (NaN where NaN)."""
    if got.dtype != want.dtype:
        raise AssertionError(f"{where}: dtype {got.dtype}, the reference's {want.dtype}")
    _same(where, "shape", got.shape, want.shape)
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~((g == w) | (np.abs(g - w) <= tol) | (np.isnan(g) & np.isnan(w)))
    if bad.any():
        at = tuple(int(i[0]) for i in np.nonzero(bad))
        raise AssertionError(f"{where}: element {at} is {got[at]!r}, the reference's "
                             f"{want[at]!r} (tolerance {float(tol[at]):.3g}; "
                             f"{int(bad.sum())} of {bad.size} differ)")


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
