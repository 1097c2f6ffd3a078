"""Host (numpy) kernels of the NMS family: NonMaxSuppression, BatchedNMS, EfficientNMS.

Plain sequential greedy NMS, vectorised per kept box, in the exact float arithmetic of
:mod:`jaxops.ops.nms.iou` (the same IEEE operations in the same order, so every keep/suppress
decision — and hence every integer output — equals the ``xla`` kernel's). The host
kernels implement ``high_precision`` in every impl mode: they rank by exact scores, where
the ``xla`` kernel's ``high_performance`` ranks on leading score bits and may then keep a
different one of two overlapping, nearly tied boxes.
"""

from __future__ import annotations

import numpy as np

from jaxops.backends.callback import Exact, host_kernel_for
from jaxops.core.float_bits import largest_at_most, np_greater, np_ordered_bits
from jaxops.core.numerics import compute_dtype
from jaxops.core.tensorrt_boxes import tensorrt_area, tensorrt_iou, tensorrt_reorder

__all__ = [
    "Boxes", "batched_nms", "best_rows", "by_priority", "candidates", "decode", "efficient_nms",
    "greedy", "limited_candidates", "nms_indices", "non_max_suppression",
]

Boxes = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # lo0 lo1 hi0 hi1 area


def decode(boxes: np.ndarray, dtype, center: bool = False, reorder: bool | str = True) -> Boxes:
    """numpy twin of :func:`jaxops.ops.nms.iou.decode_boxes`."""
    b = np.asarray(boxes).astype(dtype)
    p0, p1, q0, q1 = (b[..., k] for k in range(4))
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / inf boxes: see suppression.py
        if center:
            h0, h1 = q0 / dtype.type(2), q1 / dtype.type(2)
            p0, p1, q0, q1 = p0 - h0, p1 - h1, p0 + h0, p1 + h1
        if reorder == "tensorrt":
            (p0, q0), (p1, q1) = tensorrt_reorder(np, p0, q0), tensorrt_reorder(np, p1, q1)
            return p0, p1, q0, q1, tensorrt_area(np, p0, p1, q0, q1)
        if reorder:
            p0, q0 = np.minimum(p0, q0), np.maximum(p0, q0)
            p1, q1 = np.minimum(p1, q1), np.maximum(p1, q1)
        return p0, p1, q0, q1, (q0 - p0) * (q1 - p1)


def _suppresses(boxes: Boxes, i: int, later: slice, t, inclusive: bool) -> np.ndarray:
    """Does kept box ``i`` suppress the boxes ``later`` (exact mode of iou.suppresses)?"""
    lo0, lo1, hi0, hi1, area = boxes
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if inclusive:  # TensorRT's IOU(later, kept)
            later_box = tuple(f[later] for f in (lo0, lo1, hi0, hi1))
            kept_box = (lo0[i], lo1[i], hi0[i], hi1[i])
            return tensorrt_iou(np, later_box, kept_box, area[later], area[i]) >= \
                np.asarray(t, area.dtype)
        d0 = np.minimum(hi0[i], hi0[later]) - np.maximum(lo0[i], lo0[later])
        d1 = np.minimum(hi1[i], hi1[later]) - np.maximum(lo1[i], lo1[later])
        inter = np.maximum(d0, 0) * np.maximum(d1, 0)
        union = area[i] + area[later] - inter
        return inter / union > np.asarray(t, inter.dtype)


def greedy(boxes: Boxes, valid: np.ndarray, t: float, max_output: int,
           groups: np.ndarray | None = None, inclusive: bool = False) -> np.ndarray:
    """Sequential greedy NMS over candidates in priority order; the kept mask."""
    n = valid.shape[0]
    keep, suppressed, count = np.zeros(n, bool), ~valid, 0
    for i in range(n):
        if count >= max_output:
            break
        if suppressed[i]:
            continue
        keep[i] = True
        count += 1
        later = slice(i + 1, None)
        hit = _suppresses(boxes, i, later, t, inclusive)
        if groups is not None:
            hit &= groups[later] == groups[i]
        suppressed[later] |= hit
    return keep


def candidates(scores: np.ndarray, threshold: float | None, inclusive: bool = False) -> np.ndarray:
    if threshold is None:
        return ~np.isnan(scores)
    return np_greater(scores, threshold, inclusive)


def by_priority(keys: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Valid first, by decreasing key, ties (+0.0 / -0.0 included) to the lower index."""
    ids = np.arange(keys.shape[0])
    return np.lexsort((ids, np.where(valid, ~np_ordered_bits(keys), 0), ~valid))


def nms_indices(boxes: Boxes, scores: np.ndarray, valid: np.ndarray, t: float,
                max_output: int, groups: np.ndarray | None = None) -> np.ndarray:
    """Kept box indices by decreasing score (at most ``max_output``)."""
    order = by_priority(scores, valid)
    ordered = tuple(f[order] for f in boxes)
    keep = greedy(ordered, valid[order], t, max_output,
                  None if groups is None else groups[order])
    return order[keep]


def limited_candidates(keys: np.ndarray, valid: np.ndarray, capacity: int | None
                       ) -> tuple[np.ndarray, int]:
    """``valid`` restricted to the ``capacity`` best by priority (ties to the lower index)
    when more pass, and how many that cut."""
    count = int(valid.sum())
    if capacity is None or count <= capacity:
        return valid, 0
    kept = np.zeros_like(valid)
    kept[by_priority(keys, valid)[:capacity]] = True
    return kept, count - capacity


def best_rows(row_keys: np.ndarray, limit: int | None) -> np.ndarray:
    """Positions of the ``limit`` best rows by key (ties to the earlier row), in row order."""
    if limit is None or len(row_keys) <= limit:
        return np.arange(len(row_keys))
    return np.sort(by_priority(row_keys, np.ones(len(row_keys), bool))[:limit])


@host_kernel_for("NonMaxSuppression")
def non_max_suppression(boxes, scores, *, max_output_boxes_per_class, iou_threshold,
                        score_threshold, center_point_box, size, max_detections, pre_nms_top_k):
    b, n, _ = boxes.shape
    c = scores.shape[1]
    per_class = min(n, max_output_boxes_per_class)
    per_image = c * per_class if max_detections is None else min(c * per_class, max_detections)
    dtype = np.dtype(compute_dtype(boxes.dtype, scores.dtype))
    rows, bound = [], 0
    for bi in range(b if per_image else 0):
        decoded = decode(boxes[bi], dtype, center=center_point_box == 1,
                         reorder=center_point_box == 0)
        s = scores[bi].astype(dtype)
        valid, cut = limited_candidates(s.reshape(-1), candidates(s, score_threshold).reshape(-1),
                                        pre_nms_top_k)
        valid = valid.reshape(c, n)
        image = [(bi, ci, int(k)) for ci in range(c)
                 for k in nms_indices(decoded, s[ci], valid[ci], iou_threshold, per_class)]
        image = [image[r] for r in best_rows(np.array([s[r[1], r[2]] for r in image], dtype),
                                             per_image)]
        rows += image
        bound += min(len(image) + cut, per_image)
    total = len(rows)
    if size is not None and total > size:
        # Over capacity the xla kernel keeps the `size` best scores (in row order). The
        # callback keeps the leading `size` rows and reports the full length as the true
        # size, so those rows go first and the lost ones after them.
        best = best_rows(np.array([scores[r].astype(dtype) for r in rows], dtype), size)
        rest = np.setdiff1d(np.arange(total), best)
        rows = [rows[r] for r in best] + [rows[r] for r in rest]
    return (Exact(np.asarray(rows, np.int64).reshape(-1, 3), (max(total, bound), 3)),)


@host_kernel_for("BatchedNMS")
def batched_nms(boxes, scores, idxs, *, iou_threshold, max_output_size, score_threshold,
                pre_nms_top_k):
    n = boxes.shape[0]
    limit = n if max_output_size is None else min(n, max_output_size)
    dtype = np.dtype(compute_dtype(boxes.dtype, scores.dtype))
    s = scores.astype(dtype)
    t = largest_at_most(float(iou_threshold), dtype)  # torchvision: float IoU > double threshold
    valid, cut = limited_candidates(s, candidates(s, score_threshold), pre_nms_top_k)
    kept = nms_indices(decode(boxes, dtype), s, valid, t, limit, groups=np.asarray(idxs))
    return (Exact(kept, (min(len(kept) + cut, limit),)),)


@host_kernel_for("EfficientNMS")
def efficient_nms(boxes, scores, *, max_output_boxes, iou_threshold, score_threshold,
                  class_agnostic, box_coding, pre_nms_top_k):
    b, n, c = scores.shape
    k = max_output_boxes
    num, cut = np.zeros((b, 1), np.int32), np.zeros((b, 1), np.int32)
    out_boxes = np.zeros((b, k, 4), boxes.dtype)
    out_scores = np.zeros((b, k), scores.dtype)
    out_classes = np.zeros((b, k), np.int32)
    dtype = np.dtype(compute_dtype(boxes.dtype, scores.dtype))
    for bi in range(b):
        flat = scores[bi].reshape(-1).astype(dtype)      # element box * C + class
        valid = candidates(flat, score_threshold, inclusive=True)
        cut[bi, 0] = max(int(valid.sum()) - pre_nms_top_k, 0)
        if not k or not n * c:
            continue
        cand = by_priority(np.where(valid, flat, -np.inf), np.ones_like(valid))
        cand = cand[:min(pre_nms_top_k, n * c)]
        box_id, cls = cand // c, cand % c
        raw = boxes[bi][box_id] if boxes.ndim == 3 else boxes[bi][box_id, cls]
        center = box_coding == 1
        keep = greedy(decode(raw, dtype, center=center, reorder="tensorrt"), valid[cand],
                      iou_threshold, k, None if class_agnostic else cls, inclusive=True)
        pos = np.flatnonzero(keep)
        corners = np.stack(decode(raw, dtype, center=center, reorder=False)[:4], axis=-1)
        num[bi, 0] = len(pos)
        out_boxes[bi, :len(pos)] = corners[pos]
        out_scores[bi, :len(pos)] = flat[cand][pos]
        out_classes[bi, :len(pos)] = cls[pos]
    return num, out_boxes, out_scores, out_classes, cut
