"""TensorRT EfficientNMS's box overlap test, operation for operation, for jax.numpy and numpy.

TensorRT (``plugin/efficientNMSPlugin/efficientNMSInference.cuh`` and ``.cu``: ``BoxCorner``'s
``reorder``, ``intersect`` and ``area``, and ``IOU``) decides with comparisons, so NaN takes
whichever branch a false comparison takes:

- reorder: a pair with ``lo > hi`` is swapped arithmetically (``d = lo - hi; hi = d + hi;
  lo = hi - d``), which may round, and turns an infinite swapped pair into NaN; a pair with
  a NaN is left as given;
- intersect: each low edge is ``a if a > b else b``, each high edge ``a if a < b else b``,
  ``a`` being the later (lower-scoring) box: a NaN edge takes the kept box's edge;
- area: 0 when ``h <= 0`` or ``w <= 0``, else ``h * w`` (NaN when an edge is NaN and the
  other side is not <= 0);
- IoU: 0 when the intersection area ``<= 0`` or the union ``<= 0``, else ``inter / union``;
  suppression is ``IoU >= iou_threshold``, false for a NaN IoU. So a box with a NaN edge
  mostly yields NaN (never suppresses, is never suppressed, even at threshold 0), but 0
  where the comparisons say so (e.g. its intersection has a side <= 0).

``xp`` is ``jax.numpy`` or ``numpy``; the arrays broadcast.

>>> import numpy as np
>>> f = lambda *v: tuple(np.float32(x) for x in v)
>>> kept, nan = f(0, 0, 8, 8), np.float32("nan")
>>> float(tensorrt_iou(np, f(2, 0, 10, 8), kept, np.float32(64), np.float32(64)))  # 48 / 80
0.6000000238418579
>>> later = f(nan, 0, 8, 8)
>>> float(tensorrt_iou(np, later, kept, tensorrt_area(np, *later), np.float32(64)))
nan
"""

from __future__ import annotations

from typing import Any

__all__ = ["tensorrt_area", "tensorrt_iou", "tensorrt_reorder"]


def tensorrt_reorder(xp: Any, lo: Any, hi: Any) -> tuple[Any, Any]:
    """``BoxCorner::reorder`` on one axis: ``(lo, hi)`` swapped arithmetically where
    ``lo > hi``."""
    swap = lo > hi
    d = lo - hi
    new_hi = d + hi
    return xp.where(swap, new_hi - d, lo), xp.where(swap, new_hi, hi)


def tensorrt_area(xp: Any, lo0: Any, lo1: Any, hi0: Any, hi1: Any) -> Any:
    """``BoxCorner::area``: 0 when a side is ``<= 0``, else the product of the sides."""
    h, w = hi0 - lo0, hi1 - lo1
    return xp.where((h <= 0) | (w <= 0), xp.zeros_like(h), h * w)


def tensorrt_iou(xp: Any, later: tuple, kept: tuple, later_area: Any, kept_area: Any) -> Any:
    """TensorRT's ``IOU(later, kept)`` of reordered corners ``(lo0, lo1, hi0, hi1)`` and
    their :func:`tensorrt_area`."""
    inter = tensorrt_area(xp, *(xp.where(a > b, a, b) for a, b in zip(later[:2], kept[:2])),
                          *(xp.where(a < b, a, b) for a, b in zip(later[2:], kept[2:])))
    union = later_area + kept_area - inter
    zero = (inter <= 0) | (union <= 0)
    return xp.where(zero, xp.zeros_like(inter), inter / xp.where(zero, xp.ones_like(union), union))
