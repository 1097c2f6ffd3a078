"""TensorRT ``EfficientNMS_TRT``-style NMS: fixed-size outputs with a count port.

For pipelines that want ``num_detections`` plus zero-padded ``[B, K, ...]`` tensors rather
than a DynArray. The semantics follow TensorRT's plugin (efficientNMSInference.cu):

- ``scores`` is ``[B, N, C]`` (TensorRT's layout, not ONNX's ``[B, C, N]``); ``boxes`` is
  ``[B, N, 4]`` (shared by all classes) or ``[B, N, C, 4]`` (one box per class);
- a (box, class) pair is a candidate when its score is ``>= score_threshold`` (NaN never);
  the best ``pre_nms_top_k`` candidates (TensorRT: 4096) by decreasing score, ties to the
  lower ``box * C + class``, go through one greedy pass in that order;
- a candidate is suppressed when its IoU with a kept box of the same class (any class with
  ``class_agnostic``) is ``>= iou_threshold``, IoU being 0 for disjoint boxes — so a
  threshold of 0 keeps one finite box per class, as in TensorRT;
- the IoU is TensorRT's operation for operation (:mod:`jaxops.core.tensorrt_boxes`: its
  arithmetic corner swap, its comparisons): a box with a NaN coordinate mostly gets a NaN
  IoU, which suppresses nothing and is never ``>= iou_threshold``, even at 0 (ONNX and
  torchvision's rule for NaN boxes is :func:`~jaxops.nms`'s);
- the first ``max_output_boxes`` kept are returned, boxes always as corners
  ``[x1, y1, x2, y2]`` (centre boxes are converted; corner boxes are returned as given).

Not modelled: ``background_class``, ``score_activation``, the fused box decoder, and
float16 arithmetic (TensorRT computes half boxes in half; here in float32).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxops.core.dtypes import FLOATING, DataType
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.numerics import compute_dtype
from jaxops.core.registry import REQUIRED, AttrDef, Input, OpDef, Output, register_op
from jaxops.ops._conventions import IOU_THRESHOLD, SCORE_THRESHOLD, check_shape
from jaxops.ops.compaction import compact_indices
from jaxops.ops.nms.iou import decode_boxes
from jaxops.ops.nms.tiled import greedy_nms, score_candidates

__all__ = [
    "EFFICIENT_NMS", "EfficientNMSOutput", "efficient_nms",
]


class EfficientNMSOutput(NamedTuple):
    """The four TensorRT ports; rows past ``num_detections`` are zero."""

    num_detections: jax.Array     # [B, 1] int32
    detection_boxes: jax.Array    # [B, K, 4] corners, dtype of boxes
    detection_scores: jax.Array   # [B, K], dtype of scores
    detection_classes: jax.Array  # [B, K] int32


def _shapes(boxes_shape: tuple, scores_shape: tuple) -> tuple[int, int, int]:
    op = "EfficientNMS"
    check_shape(op, "scores", scores_shape, "[batch_size, number_boxes, number_classes]",
                 len(scores_shape) == 3)
    b, n, c = scores_shape
    check_shape(op, "boxes", boxes_shape, f"[{b}, {n}, 4] or [{b}, {n}, {c}, 4] (matching "
                 "scores)", tuple(boxes_shape) in ((b, n, 4), (b, n, c, 4)))
    return b, n, c


def _infer_shape(ctx) -> list[tuple[int, ...]]:
    b, _, _ = _shapes(ctx.inputs[0].shape, ctx.inputs[1].shape)
    k = ctx.attrs["max_output_boxes"]
    return [(b, 1), (b, k, 4), (b, k), (b, k)]


EFFICIENT_NMS = register_op(OpDef(
    name="EfficientNMS",
    inputs=[Input("boxes", FLOATING), Input("scores", FLOATING)],
    outputs=[Output("num_detections", {DataType.INT32}), Output("detection_boxes", FLOATING),
             Output("detection_scores", FLOATING), Output("detection_classes", {DataType.INT32})],
    attrs=[AttrDef("max_output_boxes", "int", check=lambda k: k >= 0, expected="an int >= 0"),
           dataclasses.replace(IOU_THRESHOLD, default=REQUIRED),
           dataclasses.replace(SCORE_THRESHOLD, default=REQUIRED, optional=False,
                               expected="a float (not NaN)"),
           AttrDef("class_agnostic", "bool", False),
           AttrDef("box_coding", "int", 0, choices=(0, 1)),
           AttrDef("pre_nms_top_k", "int", 4096, check=lambda k: k >= 1, expected="an int >= 1")],
    infer_shape=_infer_shape,
    infer_dtype=lambda ctx: [DataType.INT32, ctx.inputs[0].dtype, ctx.inputs[1].dtype,
                             DataType.INT32],
    # Candidates come from lax.top_k (TensorRT's order); no faster variant: a request for
    # high_performance runs this one (select_impl_mode falls back).
    impl_modes=OpImplMode.HIGH_PRECISION,
    doc="TensorRT EfficientNMS: per-image count plus zero-padded boxes, scores, classes",
))


def _one_image(boxes, scores, *, max_output_boxes, iou_threshold, score_threshold,
               class_agnostic, box_coding, pre_nms_top_k):
    n, c = scores.shape
    dtype = compute_dtype(boxes.dtype, scores.dtype)
    flat = scores.reshape(-1).astype(dtype)                  # element n * C + c
    valid = score_candidates(flat, score_threshold, inclusive=True)
    # top_k orders equal keys by lower index, which is TensorRT's dense ordering.
    _, cand = lax.top_k(jnp.where(valid, flat, -jnp.inf), min(pre_nms_top_k, n * c))
    box_id, cls = cand // c, cand % c
    raw = boxes[box_id] if boxes.ndim == 2 else boxes[box_id, cls]
    center = box_coding == 1
    keep, count = greedy_nms(decode_boxes(raw, center=center, reorder="tensorrt", dtype=dtype),
                             valid[cand],
                             iou_threshold, max_output_boxes,
                             groups=None if class_agnostic else cls, inclusive=True)
    pos, _ = compact_indices(keep, size=max_output_boxes, fill_value=0)
    slot = jnp.arange(max_output_boxes) < count
    corners = decode_boxes(raw, center=center, reorder=False, dtype=dtype).corners()
    return EfficientNMSOutput(
        count.reshape(1),
        jnp.where(slot[:, None], corners[pos], 0).astype(boxes.dtype),
        jnp.where(slot, flat[cand][pos], 0).astype(scores.dtype),
        jnp.where(slot, cls[pos], 0).astype(jnp.int32))


@EFFICIENT_NMS.kernel("xla")
def _kernel(boxes, scores, **attrs):
    b, n, c = _shapes(boxes.shape, scores.shape)
    k = attrs["max_output_boxes"]
    if k == 0 or n * c == 0:
        return EfficientNMSOutput(jnp.zeros((b, 1), jnp.int32),
                                  jnp.zeros((b, k, 4), boxes.dtype),
                                  jnp.zeros((b, k), scores.dtype), jnp.zeros((b, k), jnp.int32))
    return tuple(jax.vmap(functools.partial(_one_image, **attrs))(boxes, scores))


def efficient_nms(boxes: jax.Array, scores: jax.Array, *, max_output_boxes: int,
                  iou_threshold: float, score_threshold: float, class_agnostic: bool = False,
                  box_coding: int = 0, pre_nms_top_k: int = 4096,
                  impl_mode: str | OpImplMode | None = None,
                  backend: str | None = None) -> EfficientNMSOutput:
    """TensorRT EfficientNMS-style NMS with a count port (semantics: module docstring).

    Args:
      boxes: ``[B, N, 4]`` or ``[B, N, C, 4]`` float; ``box_coding`` 0: ``[x1, y1, x2, y2]``
        (either diagonal), 1: ``[x_center, y_center, w, h]``.
      scores: ``[B, N, C]`` float.
      max_output_boxes: ``K``, detections per image (over all classes).
      iou_threshold: in ``[0, 1]``; suppress when IoU ``>=`` it (TensorRT's comparison).
      score_threshold: candidates have score ``>=`` it.
      class_agnostic: one NMS over all classes instead of one per class.
      box_coding: 0 (corners) or 1 (centre-size).
      pre_nms_top_k: candidates that enter NMS (TensorRT fixes 4096).
      impl_mode: accepted for uniformity; only ``high_precision`` exists (a
        ``high_performance`` request runs it).
      backend: ``"xla"`` or ``"host"`` (default: automatic).

    Returns:
      :class:`EfficientNMSOutput` ``(num_detections [B, 1] int32, detection_boxes [B, K, 4],
      detection_scores [B, K], detection_classes [B, K] int32)``, zero past the count.

    Examples:
      >>> import jax.numpy as jnp, jaxops
      >>> boxes = jnp.array([[[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30.]]])
      >>> scores = jnp.array([[[0.9, 0.1], [0.8, 0.7], [0.3, 0.0]]])   # [B, N, C]
      >>> out = jaxops.efficient_nms(boxes, scores, max_output_boxes=4, iou_threshold=0.5,
      ...                            score_threshold=0.2)
      >>> out.num_detections.tolist(), out.detection_classes.tolist()
      ([[3]], [[0, 1, 0, 0]])
      >>> out.detection_boxes[0, :, 0].tolist()     # x1 of box 0, box 1 (class 1), box 2
      [0.0, 1.0, 20.0, 0.0]
    """
    return EfficientNMSOutput(*EFFICIENT_NMS(
        boxes, scores, max_output_boxes=max_output_boxes, iou_threshold=iou_threshold,
        score_threshold=score_threshold, class_agnostic=class_agnostic, box_coding=box_coding,
        pre_nms_top_k=pre_nms_top_k, impl_mode=impl_mode, backend=backend))
