"""ONNX NonMaxSuppression (opset 11), with a per-image cap and a candidate capacity.

Every NMS operator runs the one xla pipeline of :mod:`jaxops.ops.nms.pipeline` (score filter
and candidate cut, then the blocked IoU bitmask of :mod:`jaxops.ops.nms.bitmask`) on the
box decoding and overlap test of :mod:`jaxops.ops.nms.iou`; torchvision-style ``nms`` /
``batched_nms`` live in :mod:`jaxops.ops.nms.batched`, TensorRT-style ``efficient_nms`` in
:mod:`jaxops.ops.nms.efficient_nms`.

Semantics shared by the family (ONNX Runtime's CPU kernel is the oracle of the tests):

- candidates are visited by decreasing score, ties to the lower box index (+0.0 and -0.0
  tie); a candidate is kept unless a kept box of its problem has IoU *strictly greater*
  than ``iou_threshold`` with it;
- corner boxes may give either diagonal pair of corners; disjoint and zero-area boxes never
  suppress anything (their IoU is 0, or 0/0);
- with ``score_threshold``, only scores strictly greater than it are candidates;
- **non-finite scores**: ``+inf`` ranks first, ``-inf`` last (a candidate unless a
  ``score_threshold`` is given); **NaN scores are never selected** (ONNX leaves this
  undefined; ONNX Runtime's heap then orders them arbitrarily, and drops them when a
  ``score_threshold`` is given, as we do; torchvision sorts them first);
- **non-finite coordinates**: a box with a NaN or infinite coordinate (or an area that
  overflows to inf) never suppresses another box and is never suppressed; it is selected on
  its score alone, like any box. That is what ONNX Runtime's ``SuppressByIOU`` and
  torchvision's CPU ``nms`` compute: such a box's IoU with any box is NaN (NaN area, or
  ``inf - inf`` in the union) or 0 (an infinite union), never above a threshold in
  ``[0, 1]``; :func:`~jaxops.ops.nms.iou.suppresses` reproduces their float operations;
- **thresholds** may be Python floats (compile-time constants, checked) or float JAX
  scalars, traced or not (operands: a jitted caller compiles once for every value; a
  traced value is not range-checked: an IoU threshold above 1 suppresses nothing);
- **capacities cut by score**: ``pre_nms_top_k`` keeps an image's best candidates (score,
  then lower element), never the first by index; the output's ``true_shape`` then bounds
  what the cut candidates could have added (see :func:`non_max_suppression`).

Precision modes (``impl_mode=`` or :func:`jaxops.impl_mode`); both compute the IoU as
``inter / union`` in float32 exactly as ONNX Runtime does. ``high_precision`` (the default)
ranks the candidates by their exact scores. ``high_performance`` ranks on the leading bits
of the float32 scores only: scores whose bit patterns agree except in the low
``b = ceil(log2 N)`` bits (for 5000 boxes, 13 of the 23 mantissa bits) are ranked by box
index — for non-negative scores exactly the high-precision result on the scores with those
bits cleared — which can change which of two overlapping boxes survives. Float64 scores and
more than 2**15 boxes are always ranked exactly.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.capacity import run_with_policy
from jaxops.core.dtypes import FLOATING, INDEX
from jaxops.core.dynarray import DynArray
from jaxops.core.float_bits import ordered_bits
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.numerics import compute_dtype
from jaxops.core.registry import AttrDef, Input, OpDef, Output, register_op
from jaxops.ops._conventions import (INDEX_FILL, MAX_DETECTIONS, NMS_INDEX_OUTPUT, PRE_NMS_TOP_K,
                                     SCORE_THRESHOLD, check_shape, index_dtype,
                                     iou_threshold_attr, with_upstream_loss)
from jaxops.ops.compaction import compact_indices
from jaxops.ops.nms.candidates import score_candidates
from jaxops.ops.nms.iou import decode_boxes
from jaxops.ops.nms.pipeline import (detect, priority_keys, tracks_true_shape, valid_candidates,
                                     warn_if_cut)

__all__ = ["NON_MAX_SUPPRESSION", "non_max_suppression"]


def _onnx_shapes(boxes_shape: tuple, scores_shape: tuple) -> tuple[int, int, int]:
    op = "NonMaxSuppression"
    check_shape(op, "boxes", boxes_shape, "[num_batches, spatial_dimension, 4]",
                 len(boxes_shape) == 3 and boxes_shape[2] == 4)
    b, n = boxes_shape[:2]
    check_shape(op, "scores", scores_shape, f"[num_batches={b}, num_classes, "
                 f"spatial_dimension={n}] (matching boxes)",
                 len(scores_shape) == 3 and scores_shape[0] == b and scores_shape[2] == n)
    return b, scores_shape[1], n


def _onnx_capacity(b: int, c: int, n: int, max_output: int, max_detections: int | None,
                   size: int | None) -> tuple[int, int, int]:
    """Per-class limit, per-image limit and output rows (``size`` or the maximum)."""
    per_class = min(n, max_output)
    per_image = c * per_class if max_detections is None else min(c * per_class, max_detections)
    return per_class, per_image, b * per_image if size is None else size


def _onnx_infer_shape(ctx) -> list[tuple[int, ...]]:
    b, c, n = _onnx_shapes(ctx.inputs[0].shape, ctx.inputs[1].shape)
    a = ctx.attrs
    return [(_onnx_capacity(b, c, n, a["max_output_boxes_per_class"], a["max_detections"],
                            a["size"])[2], 3)]


NON_MAX_SUPPRESSION = register_op(OpDef(
    name="NonMaxSuppression",
    inputs=[Input("boxes", FLOATING), Input("scores", FLOATING)],
    outputs=[Output("selected_indices", INDEX)],
    attrs=[
        AttrDef("max_output_boxes_per_class", "int", 0, check=lambda k: k >= 0,
                expected="an int >= 0 (0 selects nothing, as in ONNX; ONNX Runtime also treats "
                         "negative values as 0 — pass 0 for that, or the box count for no limit)"),
        iou_threshold_attr("as ONNX Runtime requires"),
        SCORE_THRESHOLD,
        AttrDef("center_point_box", "int", 0, choices=(0, 1)),
        AttrDef("size", "int", None, optional=True, check=lambda s: s >= 0,
                expected="an int >= 0 or None (output capacity in rows)"),
        MAX_DETECTIONS,
        PRE_NMS_TOP_K,
    ],
    infer_shape=_onnx_infer_shape,
    **NMS_INDEX_OUTPUT,
    doc="ONNX NonMaxSuppression (opset 11): [batch, class, box] rows of the selected boxes",
))


def _onnx_kernel(boxes, scores, *, max_output_boxes_per_class, iou_threshold, score_threshold,
                 center_point_box, size, max_detections, pre_nms_top_k, exact_ranking=True):
    b, c, n = _onnx_shapes(boxes.shape, scores.shape)
    per_class, per_image, rows = _onnx_capacity(b, c, n, max_output_boxes_per_class,
                                                max_detections, size)
    track = tracks_true_shape(size, pre_nms_top_k, c * n)
    itype = index_dtype()
    if rows == 0 or per_image == 0:
        zero = jnp.zeros((), jnp.int32)
        return (_rows_dynarray(jnp.full((rows, 3), -1, itype), zero, zero, rows, track),)

    dtype = compute_dtype(boxes.dtype, scores.dtype)
    decoded = decode_boxes(boxes, center=center_point_box == 1, reorder=center_point_box == 0,
                           dtype=dtype)                                  # fields [B, N]
    flat_scores = scores.astype(dtype).reshape(b, c * n)                 # element c * N + n

    def finish(kept):  # at a tier of t slots: kept.element [B, min(per_image, t)]
        total = jnp.sum(kept.found)
        bound = jnp.sum(jnp.minimum(kept.found + kept.cut, per_image))  # what cut ones add
        width = kept.element.shape[1]
        if rows >= b * width:  # every row found fits
            return (_rows_dynarray(_rows_one_after_another(kept, n, rows).astype(itype), total,
                                   bound, rows, track),)
        # a capacity below the rows found: overflow keeps the best
        image = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], kept.element.shape)
        candidates = jnp.stack([image, kept.element // n, kept.element % n], -1).reshape(-1, 3)
        valid = (jnp.arange(width) < kept.found[:, None]).reshape(-1)
        ranked = jnp.take_along_axis(flat_scores, kept.element, axis=1).reshape(-1)
        idx, _ = compact_indices(_keep_top_scoring(valid, ranked, rows, total), size=rows,
                                 fill_value=0)
        return (_rows_dynarray(candidates[idx].astype(itype), total, bound, rows, track),)

    return detect(lambda f: decoded.map(lambda x: jnp.take_along_axis(x, f % n, axis=1)),
                  flat_scores, lambda s: priority_keys(s, n, exact_ranking),
                  score_candidates(flat_scores, score_threshold), lambda f: f // n,
                  capacity=c * n if pre_nms_top_k is None else pre_nms_top_k,
                  slots=per_image, by_group=True,  # class, then score: ONNX's order
                  iou_threshold=iou_threshold, group_bound=c, per_group=per_class,
                  total=None if per_image == c * per_class else per_image, finish=finish)


def _rows_one_after_another(kept, n: int, rows: int) -> jax.Array:
    """``[rows, 3]``: the images' rows one after another (-1 past them): row ``j`` of image
    ``i`` lands at row ``start[i] + j``, one scatter from the tier's ``B x t`` slots, no
    compaction of ``B x per_image`` slots (ONNX's plain call on detection case B has
    192,000 of them for about 200 rows; compacting them was a third of its xla time)."""
    b, per_image = kept.element.shape
    start = jnp.cumsum(kept.found) - kept.found
    j = jnp.arange(per_image, dtype=jnp.int32)
    at = jnp.where(j < kept.found[:, None], start[:, None] + j, rows)       # [B, per_image]
    image = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], at.shape)
    found = jnp.stack([image, kept.element // n, kept.element % n], axis=-1)
    return jnp.full((rows, 3), -1, jnp.int32).at[at.reshape(-1)].set(
        found.reshape(-1, 3), mode="drop")


def _keep_top_scoring(keep: jax.Array, ranked_scores: jax.Array, rows: int,
                      total: jax.Array) -> jax.Array:
    """``keep`` limited to its ``rows`` highest scores when it holds more (ties to the earlier
    output row), so a truncated NMS output keeps the best detections over all batches and
    classes; they stay in the usual batch, class, score order. Ranked on ``ordered_bits``
    (float compares under XLA:CPU's DAZ would rank a subnormal score as a zero)."""
    def restrict(keep):
        key = ordered_bits(ranked_scores)  # unsigned; kept scores are never NaN
        bits = key.dtype.itemsize * 8  # flipping the top bit: the same order as signed ints
        signed = jax.lax.bitcast_convert_type(key ^ np.asarray(1 << (bits - 1), key.dtype),
                                              jnp.dtype(f"int{bits}"))
        # no kept score has the smallest key (it lies below -inf's)
        _, best = jax.lax.top_k(jnp.where(keep, signed, jnp.iinfo(signed.dtype).min), rows)
        return keep & jnp.zeros_like(keep).at[best].set(True)
    return jax.lax.cond(total > rows, restrict, lambda k: k, keep)


def _rows_dynarray(out, total, bound, rows: int, track: bool) -> DynArray:
    """Rows ``[rows, 3]``, the first ``min(total, rows)`` valid; the true shape (when
    tracked) counts ``max(total, bound)`` rows."""
    actual = jnp.minimum(total, rows)
    out = jnp.where((jnp.arange(rows) < actual)[:, None], out, jnp.asarray(-1, out.dtype))
    three = jnp.int32(3)
    true_shape = jnp.stack([jnp.maximum(total, bound), three]) if track else None
    return DynArray(out, jnp.stack([actual, three]), true_shape=true_shape, fill_value=INDEX_FILL)


NON_MAX_SUPPRESSION.kernel("xla")(_onnx_kernel)
NON_MAX_SUPPRESSION.kernel("xla", modes=OpImplMode.HIGH_PERFORMANCE)(
    functools.partial(_onnx_kernel, exact_ranking=False))


def non_max_suppression(boxes: jax.Array, scores: jax.Array, max_output_boxes_per_class: int = 0,
                        iou_threshold: float | jax.Array = 0.0,
                        score_threshold: float | jax.Array | None = None, *,
                        center_point_box: int = 0, max_detections: int | None = None,
                        pre_nms_top_k: int | None = None, size: int | None = None,
                        overflow: str = "truncate", record: bool | str = False,
                        impl_mode: str | OpImplMode | None = None,
                        backend: str | None = None) -> DynArray:
    """ONNX NonMaxSuppression (opset 11), as ONNX Runtime's CPU kernel computes it.

    Args:
      boxes: ``[num_batches, N, 4]`` float; ``[y1, x1, y2, x2]`` (any diagonal corner pair),
        or ``[x_center, y_center, width, height]`` with ``center_point_box=1``.
      scores: ``[num_batches, num_classes, N]`` float (a YOLOv8 head's layout). Either may
        be a :class:`DynArray`: only boxes and scores in its valid region are candidates,
        and the candidates it lost upstream count in the result's ``true_shape`` (an upper
        bound then), so ``overflowed()`` reports them.
      max_output_boxes_per_class: most boxes kept per batch and class; **0 selects nothing**
        (the ONNX default; ONNX Runtime agrees).
      iou_threshold: in ``[0, 1]``; a box is suppressed when its IoU with a kept box of the
        same batch and class is strictly greater. A box with a NaN or infinite coordinate
        neither suppresses nor is suppressed, and a NaN score is never selected (as ONNX
        Runtime; see the module docstring). A float JAX scalar (traced or not) is an
        operand: one compile serves every value.
      score_threshold: when given, only scores strictly greater are candidates (a float, a
        float JAX scalar, or ``None``).
      center_point_box: 0 (corners) or 1 (centre and size).
      max_detections: the most rows per batch image over all its classes, the best by score
        (ties to the earlier row) — torchvision's ``detections_per_img``, TensorRT's
        ``keepTopK``; they stay in batch, class, score order. ``None``: no cap.
      pre_nms_top_k: the most candidates (``(box, class)`` pairs passing the score filter)
        per image; when more pass, the best by score stay (ties to the lower class, then
        box) — a cut candidate scores below every kept one, so it can only be missing from
        the end of the result. Then ``true_shape`` counts, per image, the rows found plus
        the candidates cut (at most the image's limit), and ``overflowed()`` says whether
        anything may be missing. ``None``: every candidate (exact; the xla kernel's time
        grows with this capacity, the native kernel's does not).
      size: capacity in rows; ``None`` is the maximum, ``num_batches`` times the per-image
        limit (``max_detections``, else ``num_classes * min(N, max_output_...)``). When more
        rows are selected than fit, the ``size`` highest-scoring ones over all batches and
        classes are kept (ties to the earlier row), still in batch, class, score order, and
        the rest is reported as lost (``true_shape``, :meth:`DynArray.overflowed`), also
        inside jit.
      overflow: what an eager call does when the rows exceed ``size``
        (:mod:`jaxops.capacity.policy`): ``"truncate"`` (default: keep the best, warn once per
        call site), ``"error"``, ``"expand"`` (rerun at the next power-of-two capacity) or
        ``"host"``. Inside jit the flag travels with the result instead.
      record: record the number of rows this call needed in :mod:`jaxops.capacity.stats`
        (``True``: under the operator and input shapes; a string: under that call-site
        name), on the host or, inside jit, through an unordered ``io_callback``.
      impl_mode: ``"high_precision"`` (default) or ``"high_performance"``.
      backend: ``"xla"``, ``"native"``, ``"host"`` or ``"ascend"`` (default: automatic).

    Returns:
      A :class:`DynArray` of max shape ``[size, 3]``, actual shape ``[M, 3]``: rows
      ``[batch, class, box]`` ordered by batch, class, then decreasing score (ties to the
      lower box index), padded with ``-1`` rows. int64 with ``jax_enable_x64``, else int32.

    Examples:
      >>> import jax, jax.numpy as jnp, jaxops
      >>> boxes = jnp.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3.]]])
      >>> scores = jnp.array([[[0.9, 0.8, 0.7]]])
      >>> jaxops.refresh(jaxops.non_max_suppression(boxes, scores, 3, 0.5)).tolist()
      [[0, 0, 0], [0, 0, 2]]
      >>> f = jax.jit(lambda t: jaxops.non_max_suppression(boxes, scores, 3, t,
      ...                                                  max_detections=1))
      >>> jaxops.refresh(f(jnp.float32(0.95))).tolist()   # traced threshold, capped at 1
      [[0, 0, 0]]
    """
    b, c, n = _onnx_shapes(np.shape(boxes), np.shape(scores))
    limit = max_output_boxes_per_class if isinstance(max_output_boxes_per_class,
                                                     (int, np.integer)) else n
    cap = max_detections if isinstance(max_detections, (int, np.integer)) else None
    # what boxes lost upstream could add: up to the limits, not to this buffer's N
    scores, boxes, _, lost = valid_candidates("NonMaxSuppression", scores, boxes, per_box=c)

    def run(capacity: int | None, rerun_backend: str | None) -> DynArray:
        out = NON_MAX_SUPPRESSION(
            boxes, scores, max_output_boxes_per_class=max_output_boxes_per_class,
            iou_threshold=iou_threshold, score_threshold=score_threshold,
            center_point_box=center_point_box, size=capacity, max_detections=max_detections,
            pre_nms_top_k=pre_nms_top_k, impl_mode=impl_mode,
            backend=rerun_backend or backend)[0]
        return with_upstream_loss(out, lost, 0, limit=b * (c * limit if cap is None else cap))

    if isinstance(max_output_boxes_per_class, (int, np.integer)) and \
            max_output_boxes_per_class == 0 and b * c * n:
        # ONNX's default, kept for conformance; a silent empty result surprises users.
        warnings.warn("NonMaxSuppression: max_output_boxes_per_class is 0 (ONNX's default), so "
                      "no box is selected; pass the number of boxes to keep per class.",
                      UserWarning, stacklevel=2)
    result = run_with_policy(run, op="NonMaxSuppression", size=size,
                             theoretical_max=_onnx_capacity(b, c, n, limit, cap, None)[2],
                             policy=overflow, record=record,
                             input_shapes=[np.shape(boxes), np.shape(scores)])
    warn_if_cut(result, "NonMaxSuppression", size)
    return result
