"""Conventions every dynamic-shape operator shares: index dtype, capacity attribute, fill
values, shape checks, NMS thresholds and limits.

One home, so no operator file imports another for them.

>>> index_dtype() in (np.dtype(np.int32), np.dtype(np.int64))
True
>>> capacity_attr("max results").validate("Doc", 3)
3
"""

from __future__ import annotations

import math

import jax
import numpy as np

from jaxops.core.dtypes import ALL_NUMERIC, DataType
from jaxops.core.errors import OpArgumentError
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.numerics import INDEX_FILL
from jaxops.core.registry import AttrDef

__all__ = [
    "ELEMENT_DTYPES", "INDEX_FILL", "IOU_THRESHOLD", "MAX_DETECTIONS", "NMS_INDEX_OUTPUT",
    "NMS_MODES", "PRE_NMS_TOP_K", "SCORE_THRESHOLD", "VALUE_FILL", "capacity_attr",
    "check_shape", "index_datatype", "index_dtype", "iou_threshold_attr",
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
