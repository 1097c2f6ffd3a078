"""Checking a golden case: recompute it from its seed, attrs and inputs' shape, compare all.

>>> import tempfile
>>> from jaxops.golden.cases import write_case
>>> check_case(write_case("MaskedSelect", 2, out=tempfile.mkdtemp()))
True
"""

from __future__ import annotations

import os

import numpy as np

from jaxops.core.registry import get_op
from jaxops.golden.cases import build_case, load_case

__all__ = ["check_case"]


def check_case(path: str | os.PathLike) -> bool:
    """Recomputes a golden case and compares every array exactly (dtype, shape, bits).

    Args:
      path: the case's ``.npz`` file.

    Returns:
      ``True``; a difference raises ``AssertionError`` naming the array.

    Examples:
      >>> import tempfile
      >>> from jaxops.golden.cases import write_case
      >>> check_case(write_case("NonZero", 1, out=tempfile.mkdtemp(), shape=(5,), dtype="int8"))
      True
    """
    case = load_case(path)
    known = {a.name for a in get_op(case["op"]).attrs}
    attrs = {k: v for k, v in case["attrs"].items() if k in known}
    arrays, _ = build_case(case["op"], case["seed"], attrs, case.get("input_shape"),
                           case.get("input_dtype"))
    if sorted(arrays) != sorted(case["arrays"]):
        raise AssertionError(f"golden case {path}: arrays differ: {sorted(arrays)} vs "
                             f"{sorted(case['arrays'])}")
    for name, want in case["arrays"].items():
        got = arrays[name]
        if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(
                got, want, equal_nan=got.dtype.kind == "f"):
            raise AssertionError(f"golden case {path}: {name} differs")
    return True
