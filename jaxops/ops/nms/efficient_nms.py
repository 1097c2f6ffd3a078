"""TensorRT ``EfficientNMS_TRT``-style NMS: fixed-size outputs with a count port.

For pipelines that want ``num_detections`` plus zero-padded ``[B, K, ...]`` tensors rather
than a DynArray. The semantics follow TensorRT's plugin (efficientNMSInference.cu):

- ``scores`` is ``[B, N, C]`` (TensorRT's layout, not ONNX's ``[B, C, N]``); ``boxes`` is
  ``[B, N, 4]`` (shared by all classes) or ``[B, N, C, 4]`` (one box per class);
- a (box, class) pair is a candidate when its score is ``>= score_threshold`` (NaN never);
  the best ``pre_nms_top_k`` candidates (TensorRT: 4096) by decreasing score, ties to the
  lower ``box * C + class``, go through one greedy pass in that order; how many were cut
  is the ``candidates_cut`` port (a cut candidate scores below every kept one, so it can
  only be missing from the end of the detections);
- a candidate is suppressed when its IoU with a kept box of the same class (any class with
  ``class_agnostic``) is ``>= iou_threshold``, IoU being 0 for disjoint boxes — so a
  threshold of 0 keeps one finite box per class, as in TensorRT;
- the IoU is TensorRT's operation for operation (:mod:`jaxops.core.tensorrt_boxes`: its
  arithmetic corner swap, its comparisons): a box with a NaN coordinate mostly gets a NaN
  IoU, which suppresses nothing and is never ``>= iou_threshold``, even at 0 (ONNX and
  torchvision's rule for NaN boxes is :func:`~jaxops.nms`'s);
- the first ``max_output_boxes`` kept are returned, boxes always as corners
  ``[x1, y1, x2, y2]`` (centre boxes are converted; corner boxes are returned as given).

The xla kernel is the family's (:mod:`jaxops.ops.nms.pipeline`): the candidates by class,
then score, through the blocked IoU bitmask, and the first ``max_output_boxes`` kept by
score — the same detections as TensorRT's single pass, since a box's fate depends only on
the higher-scoring boxes of its class. Thresholds may be traced (see
:mod:`jaxops.ops.nms.suppression`).

Not modelled: ``background_class``, ``score_activation``, the fused box decoder, and
float16 arithmetic (TensorRT computes half boxes in half; here in float32).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxops.core.dtypes import FLOATING, DataType
from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.numerics import compute_dtype
from jaxops.core.registry import REQUIRED, AttrDef, Input, OpDef, Output, register_op
from jaxops.ops._conventions import SCORE_THRESHOLD, check_shape, iou_threshold_attr
from jaxops.ops.nms.candidates import score_candidates
from jaxops.ops.nms.iou import decode_boxes
from jaxops.ops.nms.pipeline import detect, priority_keys

__all__ = [
    "EFFICIENT_NMS", "EfficientNMSOutput", "efficient_nms",
]


class EfficientNMSOutput(NamedTuple):
    """TensorRT's four ports, then ``candidates_cut``; rows past ``num_detections`` are
    zero."""

    num_detections: jax.Array     # [B, 1] int32
    detection_boxes: jax.Array    # [B, K, 4] corners, dtype of boxes
    detection_scores: jax.Array   # [B, K], dtype of scores
    detection_classes: jax.Array  # [B, K] int32
    candidates_cut: jax.Array     # [B, 1] int32: candidates pre_nms_top_k left out


def _shapes(boxes_shape: tuple, scores_shape: tuple) -> tuple[int, int, int]:
    op = "EfficientNMS"
    boxes_shape, scores_shape = tuple(boxes_shape), tuple(scores_shape)
    check_shape(op, "boxes", boxes_shape, "[batch_size, number_boxes, 4] or [batch_size, "
                 "number_boxes, number_classes, 4]",
                 len(boxes_shape) in (3, 4) and boxes_shape[-1] == 4)
    b, n = boxes_shape[:2]
    c = boxes_shape[2] if len(boxes_shape) == 4 else None
    if len(scores_shape) == 3 and scores_shape[0] == b and scores_shape[2] == n \
            and scores_shape[1] != n and c in (None, scores_shape[1]):
        raise OpArgumentError(op, "scores", f"shape [{b}, {n}, number_classes] (TensorRT's "
                              "[batch_size, number_boxes, number_classes])",
                              f"shape {list(scores_shape)}, ONNX's [batch, classes, boxes] "
                              "layout", "Pass scores.transpose(0, 2, 1), or use "
                              "jaxops.non_max_suppression, which takes ONNX's layout.")
    check_shape(op, "scores", scores_shape, f"[{b}, {n}, " + ("number_classes" if c is None
                else str(c)) + "] (matching boxes)",
                 len(scores_shape) == 3 and scores_shape[:2] == (b, n)
                 and c in (None, scores_shape[2]))
    return b, n, scores_shape[2]


def _infer_shape(ctx) -> list[tuple[int, ...]]:
    b, _, _ = _shapes(ctx.inputs[0].shape, ctx.inputs[1].shape)
    k = ctx.attrs["max_output_boxes"]
    return [(b, 1), (b, k, 4), (b, k), (b, k), (b, 1)]


EFFICIENT_NMS = register_op(OpDef(
    name="EfficientNMS",
    inputs=[Input("boxes", FLOATING), Input("scores", FLOATING)],
    outputs=[Output("num_detections", {DataType.INT32}), Output("detection_boxes", FLOATING),
             Output("detection_scores", FLOATING), Output("detection_classes", {DataType.INT32}),
             Output("candidates_cut", {DataType.INT32},
                    doc="candidates per image that pre_nms_top_k left out")],
    attrs=[AttrDef("max_output_boxes", "int", check=lambda k: k >= 0, expected="an int >= 0"),
           iou_threshold_attr(default=REQUIRED),
           dataclasses.replace(SCORE_THRESHOLD, default=REQUIRED, optional=False,
                               expected="a float (not NaN) or a float JAX scalar"),
           AttrDef("class_agnostic", "bool", False),
           AttrDef("box_coding", "int", 0, choices=(0, 1)),
           AttrDef("pre_nms_top_k", "int", 4096, check=lambda k: k >= 1, expected="an int >= 1")],
    infer_shape=_infer_shape,
    infer_dtype=lambda ctx: [DataType.INT32, ctx.inputs[0].dtype, ctx.inputs[1].dtype,
                             DataType.INT32, DataType.INT32],
    # Candidates are ranked on the exact scores (TensorRT's order); no faster variant: a
    # request for high_performance runs this one (select_impl_mode falls back).
    impl_modes=OpImplMode.HIGH_PRECISION,
    doc="TensorRT EfficientNMS: per-image count plus zero-padded boxes, scores, classes",
))


@EFFICIENT_NMS.kernel("xla")
def _kernel(boxes, scores, *, max_output_boxes, iou_threshold, score_threshold, class_agnostic,
            box_coding, pre_nms_top_k):
    b, n, c = _shapes(boxes.shape, scores.shape)
    k = max_output_boxes
    dtype = compute_dtype(boxes.dtype, scores.dtype)
    flat = scores.reshape(b, n * c).astype(dtype)                        # element box * C + class
    passing = score_candidates(flat, score_threshold, inclusive=True)
    if k == 0 or n * c == 0:
        cut = jnp.maximum(jnp.sum(passing, axis=1, dtype=jnp.int32) - pre_nms_top_k, 0)
        return (jnp.zeros((b, 1), jnp.int32), jnp.zeros((b, k, 4), boxes.dtype),
                jnp.zeros((b, k), scores.dtype), jnp.zeros((b, k), jnp.int32), cut[:, None])
    center = box_coding == 1

    def raw(f):  # [B, K, 4]: the box of each element
        if boxes.ndim == 3:
            return jnp.take_along_axis(boxes, (f // c)[..., None], axis=1)
        return jnp.take_along_axis(boxes.reshape(b, n * c, 4), f[..., None], axis=1)

    kept = detect(lambda f: decode_boxes(raw(f), center=center, reorder="tensorrt", dtype=dtype),
                  flat, priority_keys, passing,
                  (lambda f: f * 0) if class_agnostic else (lambda f: f % c),
                  capacity=pre_nms_top_k, slots=k, iou_threshold=iou_threshold, inclusive=True,
                  group_bound=1 if class_agnostic else c, total=k)
    element, count = kept.element, kept.found                            # [B, K] by score
    slot = jnp.arange(k) < count[:, None]
    corners = decode_boxes(raw(element), center=center, reorder=False, dtype=dtype).corners()
    return (  # the ports in order (every backend's kernel returns a tuple)
        count[:, None],
        jnp.where(slot[..., None], corners, 0).astype(boxes.dtype),
        jnp.where(slot, jnp.take_along_axis(flat, element, axis=1), 0).astype(scores.dtype),
        jnp.where(slot, element % c, 0).astype(jnp.int32),
        kept.cut[:, None])


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
      iou_threshold: in ``[0, 1]``; suppress when IoU ``>=`` it (TensorRT's comparison). A
        float JAX scalar (traced or not) is an operand: one compile serves every value.
      score_threshold: candidates have score ``>=`` it (a float or a float JAX scalar).
      class_agnostic: one NMS over all classes instead of one per class.
      box_coding: 0 (corners) or 1 (centre-size).
      pre_nms_top_k: candidates that enter NMS per image (TensorRT fixes 4096): the best
        by score; how many were left out is ``candidates_cut``.
      impl_mode: accepted for uniformity; only ``high_precision`` exists (a
        ``high_performance`` request runs it).
      backend: ``"xla"``, ``"native"`` or ``"host"`` (default: automatic).

    Returns:
      :class:`EfficientNMSOutput` ``(num_detections [B, 1] int32, detection_boxes [B, K, 4],
      detection_scores [B, K], detection_classes [B, K] int32, candidates_cut [B, 1]
      int32)``, zero past the count; detections by decreasing score. TensorRT's four ports
      are the first four fields.

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
      >>> jaxops.efficient_nms(boxes, scores, max_output_boxes=4, iou_threshold=0.5,
      ...                      score_threshold=0.2, pre_nms_top_k=2).candidates_cut.tolist()
      [[2]]
    """
    for arg, x in (("boxes", boxes), ("scores", scores)):
        if isinstance(x, DynArray):
            raise OpArgumentError("EfficientNMS", arg, "an array (TensorRT's fixed-size ports)",
                                  "a DynArray", "Pass x.valid_data(fill) with a fill that is "
                                  "never a candidate (a score below score_threshold), or use "
                                  "jaxops.non_max_suppression, which takes DynArrays.")
    return EfficientNMSOutput(*EFFICIENT_NMS(
        boxes, scores, max_output_boxes=max_output_boxes, iou_threshold=iou_threshold,
        score_threshold=score_threshold, class_agnostic=class_agnostic, box_coding=box_coding,
        pre_nms_top_k=pre_nms_top_k, impl_mode=impl_mode, backend=backend))
