"""Axis-aligned boxes for NMS: decoding the box encodings and the pairwise overlap test.

The one implementation of box decoding and intersection-over-union that NonMaxSuppression,
:func:`jaxops.nms`, :func:`jaxops.batched_nms` and :func:`jaxops.efficient_nms` share.

The two coordinate axes are interchangeable for IoU, so one decoder serves ONNX
``[y1, x1, y2, x2]``, torchvision / TensorRT ``[x1, y1, x2, y2]`` and the centre encodings
``[xc, yc, w, h]`` alike: a decoded box is its low and high edge on each axis plus its area.

>>> import jax.numpy as jnp
>>> a = decode_boxes(jnp.array([[0.0, 0.0, 2.0, 2.0]]))
>>> b = decode_boxes(jnp.array([[3.0, 2.0, 1.0, 0.0]]))      # flipped corners
>>> float(iou(a, b)[0]), bool(suppresses(a, b, 0.3)[0])
(0.3333333432674408, True)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxops.core.numerics import compute_dtype
from jaxops.core.tensorrt_boxes import tensorrt_area, tensorrt_iou, tensorrt_reorder

__all__ = [
    "Boxes", "decode_boxes", "iou", "suppresses",
]


class Boxes(NamedTuple):
    """Decoded boxes: low and high edge on axis 0 and axis 1, and the area (arrays ``[...]``)."""

    lo0: jax.Array
    lo1: jax.Array
    hi0: jax.Array
    hi1: jax.Array
    area: jax.Array

    def map(self, fn) -> "Boxes":
        """Applies ``fn`` to every field (gather, slice, broadcast)."""
        return Boxes(*(fn(f) for f in self))

    def corners(self) -> jax.Array:
        """``[..., 4]`` as ``[lo0, lo1, hi0, hi1]``."""
        return jnp.stack([self.lo0, self.lo1, self.hi0, self.hi1], axis=-1)


def decode_boxes(boxes: jax.Array, center: bool = False, reorder: bool | str = True,
                 dtype=None) -> Boxes:
    """Decodes ``[..., 4]`` boxes.

    Args:
      boxes: corner boxes ``[a1, b1, a2, b2]`` (any diagonal pair of corners), or with
        ``center=True`` centre boxes ``[ac, bc, size_a, size_b]``.
      center: whether the boxes are centre-size encoded.
      reorder: sort each axis' two edges so that ``lo <= hi``. ONNX Runtime does this for
        corner boxes but not for centre boxes (a negative size then makes a box that
        overlaps nothing); TensorRT does it for both, as ``reorder="tensorrt"``: its
        arithmetic swap and its area (:mod:`jaxops.core.tensorrt_boxes`).
      dtype: arithmetic dtype (default :func:`compute_dtype` of ``boxes``).

    Returns:
      :class:`Boxes`; the area is ``(hi0 - lo0) * (hi1 - lo1)``, as ONNX Runtime computes it
      (TensorRT's ``area`` with ``reorder="tensorrt"``).
    """
    boxes = jnp.asarray(boxes)
    boxes = boxes.astype(dtype or compute_dtype(boxes.dtype))
    p0, p1, q0, q1 = (boxes[..., k] for k in range(4))
    if center:
        # half = size / 2 then centre -/+ half: the exact float ops ONNX Runtime uses.
        h0, h1 = q0 / 2, q1 / 2
        p0, p1, q0, q1 = p0 - h0, p1 - h1, p0 + h0, p1 + h1
    if reorder == "tensorrt":
        (p0, q0), (p1, q1) = tensorrt_reorder(jnp, p0, q0), tensorrt_reorder(jnp, p1, q1)
        return Boxes(p0, p1, q0, q1, tensorrt_area(jnp, p0, p1, q0, q1))
    if reorder:
        p0, q0 = jnp.minimum(p0, q0), jnp.maximum(p0, q0)
        p1, q1 = jnp.minimum(p1, q1), jnp.maximum(p1, q1)
    return Boxes(p0, p1, q0, q1, (q0 - p0) * (q1 - p1))


def _intersection(a: Boxes, b: Boxes) -> jax.Array:
    """Intersection area (0 for disjoint boxes); ``a`` and ``b`` broadcast."""
    d0 = jnp.minimum(a.hi0, b.hi0) - jnp.maximum(a.lo0, b.lo0)
    d1 = jnp.minimum(a.hi1, b.hi1) - jnp.maximum(a.lo1, b.lo1)
    return jnp.maximum(d0, 0) * jnp.maximum(d1, 0)


def iou(kept: Boxes, later: Boxes) -> jax.Array:
    """TensorRT's intersection over union of broadcasting boxes (see
    :mod:`jaxops.core.tensorrt_boxes`): 0 where the boxes do not overlap or the union is not
    positive, NaN where a NaN coordinate reaches the division."""
    return tensorrt_iou(jnp, tuple(later[:4]), tuple(kept[:4]), later.area, kept.area)


def suppresses(kept: Boxes, later: Boxes, iou_threshold: float, *,
               inclusive: bool = False) -> jax.Array:
    """Whether a kept box suppresses a later candidate (``kept`` and ``later`` broadcast).

    Args:
      kept, later: decoded boxes.
      iou_threshold: in ``[0, 1]``.
      inclusive: ``False``: suppress when ``IoU > t`` (ONNX, torchvision), with IoU
        computed as ``inter / union`` in float32 exactly as ONNX Runtime does, so decisions
        match it bit for bit; disjoint and zero-area boxes never suppress (``0 / union`` is
        0 or NaN). ``True``: TensorRT EfficientNMS's ``IoU >= t`` (:func:`iou`; boxes
        decoded with ``reorder="tensorrt"``): IoU 0 for disjoint boxes, so ``t = 0``
        suppresses every later finite box, and NaN (never suppresses) where a NaN
        coordinate reaches the division.
    """
    if inclusive:
        return iou(kept, later) >= iou_threshold
    inter = _intersection(kept, later)
    return inter / (kept.area + later.area - inter) > jnp.asarray(iou_threshold, inter.dtype)
