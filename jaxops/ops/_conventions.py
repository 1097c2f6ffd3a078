"""Conventions every dynamic-shape operator shares: index dtype, capacity attribute, fill
values, shape checks, NMS thresholds and limits, DynArray inputs.

One home, so no operator file imports another for them.

>>> index_dtype() in (np.dtype(np.int32), np.dtype(np.int64))
True
>>> capacity_attr("max results").validate("Doc", 3)
3
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.dtypes import ALL_NUMERIC, DataType
from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.numerics import INDEX_FILL
from jaxops.core.registry import AttrDef

__all__ = [
    "ELEMENT_DTYPES", "INDEX_FILL", "IOU_THRESHOLD", "MAX_DETECTIONS", "NMS_INDEX_OUTPUT",
    "NMS_MODES", "PRE_NMS_TOP_K", "SCORE_THRESHOLD", "VALUE_FILL", "ValidInput",
    "capacity_attr", "check_shape", "index_datatype", "index_dtype", "iou_threshold_attr",
    "read_input", "with_upstream_loss",
]

#: Padding of value outputs (selected elements, unique values) and of counts.
VALUE_FILL = 0
#: Elements NonZero and MaskedSelect take: bool, every integer and float dtype, complex.
ELEMENT_DTYPES = ALL_NUMERIC | {DataType.COMPLEX64, DataType.COMPLEX128}
#: Impl modes of the NMS family.
NMS_MODES = OpImplMode.HIGH_PRECISION | OpImplMode.HIGH_PERFORMANCE



def iou_threshold_attr(why: str = "", **changes) -> AttrDef:
    """The NMS IoU threshold: a float in ``[0, 1]`` or a traced scalar (an operand: one
    compile for every value). ``why`` says who requires the range, in the error."""
    expected = "a float in [0, 1]" + (f" ({why})" if why else "") + " or a float JAX scalar"
    return AttrDef("iou_threshold", "float", changes.pop("default", 0.0),
                   check=lambda t: 0.0 <= t <= 1.0, expected=expected, traced=True, **changes)


IOU_THRESHOLD = iou_threshold_attr()
SCORE_THRESHOLD = AttrDef("score_threshold", "float", None, optional=True, traced=True,
                          check=lambda t: not math.isnan(t),
                          expected="a float (not NaN), a float JAX scalar, or None")
MAX_DETECTIONS = AttrDef(
    "max_detections", "int", None, optional=True, check=lambda k: k >= 0,
    expected="an int >= 0 or None (the most detections per image, over all classes)",
    doc="per-image cap over all classes, the best by score (torchvision detections_per_img, "
        "TensorRT keepTopK)")
PRE_NMS_TOP_K = AttrDef(
    "pre_nms_top_k", "int", None, optional=True, check=lambda k: k >= 1,
    expected="an int >= 1 or None (the most candidates per image)",
    doc="candidate capacity per image: the best by score enter NMS, the number cut is reported")
#: What every NMS operator whose output is a DynArray of indices declares.
NMS_INDEX_OUTPUT = dict(infer_dtype=lambda ctx: [index_datatype()], impl_modes=NMS_MODES,
                        data_dependent=True, fill_values=[INDEX_FILL])


def index_dtype() -> np.dtype:
    """The dtype of index outputs: int64 with ``jax_enable_x64`` (ONNX's), int32 without."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.int64))


def index_datatype() -> DataType:
    """:func:`index_dtype` as a CANN DataType (what ``infer_dtype`` returns)."""
    return DataType.from_dtype(index_dtype())


def capacity_attr(doc: str) -> AttrDef:
    """The ``size`` attribute every data-dependent operator shares (jnp convention)."""
    # < 2**31: actual shapes are int32 (a larger size would overflow inside JAX).
    return AttrDef("size", "int", None, optional=True, check=lambda v: 0 <= v < 2**31,
                   expected="an int in [0, 2**31) or None", doc=doc)


def check_shape(op: str, arg: str, shape: tuple, expected: str, ok: bool) -> None:
    """Raises :class:`~jaxops.errors.OpArgumentError` naming ``op``, ``arg`` and the
    expected shape unless ``ok``.

    >>> check_shape("Doc", "boxes", (3, 5), "[N, 4]", False)
    Traceback (most recent call last):
    ...
    jaxops.core.errors.OpArgumentError: Doc: argument 'boxes': expected shape [N, 4], got shape [3, 5].
    """
    if not ok:
        raise OpArgumentError(op, arg, f"shape {expected}", f"shape {list(shape)}")


# -- DynArray inputs ------------------------------------------------------------------------
class ValidInput(NamedTuple):
    """An operator input read as an array plus where it is valid: ``data`` (a DynArray's
    max-shape buffer, or the array itself), ``valid`` (bool like ``data``, ``None`` when all
    of it is), ``lost`` (int32: elements an overflowed DynArray lost upstream; ``None`` when
    it cannot have lost any), ``rows``/``true_rows`` (int32: its valid and true length
    along axis 0; ``None`` for a plain array)."""

    data: Any
    valid: jax.Array | None
    lost: jax.Array | None
    rows: jax.Array | None
    true_rows: jax.Array | None


def read_input(op: str, arg: str, x: Any) -> ValidInput:
    """``x`` as an operator reads it: a DynArray's valid region only (its leading block),
    with what it lost upstream, so the operator can carry an overflow on; any other value
    as it is.

    >>> d = DynArray(jnp.array([5, 7, 0]), [2], true_shape=[4])
    >>> v = read_input("Doc", "x", d)
    >>> v.valid.tolist(), int(v.lost), int(v.rows), int(v.true_rows)
    ([True, True, False], 2, 2, 4)
    """
    if not isinstance(x, DynArray):
        return ValidInput(x, None, None, None, None)
    if x.batch_shape:
        raise OpArgumentError(op, arg, "an array or an unbatched DynArray",
                              f"a DynArray with batch shape {x.batch_shape}",
                              "Call the operator inside jax.vmap over the batch.")
    if x.ndim == 0:
        return ValidInput(x.data, None, None, None, None)
    true = x.true_shape
    return ValidInput(x.data, x.valid_mask(), None if true is None else x.lost(),
                      x.actual_shape[0], None if true is None else true[0])


def with_upstream_loss(result: DynArray, lost: jax.Array | None, axis: int,
                       limit: int | jax.Array | None = None) -> DynArray:
    """``result`` whose true shape also counts what an overflowed input lost: each lost
    input element could have added one result along ``axis`` (at most ``limit`` in all),
    so ``true_shape`` becomes an upper bound and ``overflowed()`` says the result may be
    incomplete. ``lost=None`` (nothing could be lost) returns ``result`` as it is.

    >>> r = DynArray(jnp.array([0, -1]), [1])
    >>> with_upstream_loss(r, jnp.int32(3), 0, limit=2).true_shape.tolist()
    [2]
    """
    if lost is None:
        return result
    true = result.actual_shape if result.true_shape is None else result.true_shape
    bound = true[..., axis] + jnp.asarray(lost, jnp.int32)
    if limit is not None:
        bound = jnp.maximum(jnp.minimum(bound, limit), true[..., axis])
    return DynArray(result.data, result.actual_shape, true_shape=true.at[..., axis].set(bound),
                    fill_value=result.fill_value)
