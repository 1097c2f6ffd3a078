"""Numpy references of the NMS family and their rows in the shared op matrix.

The references are written from the specifications, one candidate at a time, in float32
numpy arithmetic: ONNX NonMaxSuppression as ONNX Runtime's CPU kernel computes it,
torchvision's ``nms`` / ``batched_nms`` algorithm, and TensorRT's EfficientNMS.
"""

from __future__ import annotations

import functools

import numpy as np

import jaxops
from jaxops.ops.nms.efficient_nms import EfficientNMSOutput
from tests.helpers.op_matrix import TRUNCATE, OpCase

F32 = np.float32


def np_decode(boxes: np.ndarray, center: bool = False, reorder: bool = True) -> np.ndarray:
    """``[..., 5]`` float32: lo0, lo1, hi0, hi1, area (ONNX Runtime's arithmetic)."""
    b = np.asarray(boxes, F32)
    p0, p1, q0, q1 = (b[..., k] for k in range(4))
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / inf coordinates are inputs too
        if center:
            h0, h1 = q0 / F32(2), q1 / F32(2)
            p0, p1, q0, q1 = p0 - h0, p1 - h1, p0 + h0, p1 + h1
        if reorder:
            p0, q0 = np.minimum(p0, q0), np.maximum(p0, q0)
            p1, q1 = np.minimum(p1, q1), np.maximum(p1, q1)
        return np.stack([p0, p1, q0, q1, (q0 - p0) * (q1 - p1)], axis=-1)


def onnx_suppresses(kept: np.ndarray, box: np.ndarray, t: float) -> np.ndarray:
    """ONNX Runtime's SuppressByIOU of one candidate against decoded kept boxes ``[K, 5]``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        d0 = np.minimum(kept[:, 2], box[2]) - np.maximum(kept[:, 0], box[0])
        d1 = np.minimum(kept[:, 3], box[3]) - np.maximum(kept[:, 1], box[1])
        inter = d0 * d1
        union = kept[:, 4] + box[4] - inter
        ok = (d0 > 0) & (d1 > 0) & (inter > 0) & (kept[:, 4] > 0) & (box[4] > 0) & (union > 0)
        return ok & (inter / union > F32(t))


def _trt_reorder(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """BoxCorner::reorder: ``if (lo > hi) { lo = lo - hi; hi = lo + hi; lo = hi - lo; }``."""
    swap = lo > hi
    d = lo - hi
    return np.where(swap, (d + hi) - d, lo), np.where(swap, d + hi, hi)


def _trt_area(y1, x1, y2, x2) -> np.ndarray:
    """BoxCorner::area: ``if (h <= 0) return 0; if (w <= 0) return 0; return h * w;``."""
    h, w = y2 - y1, x2 - x1
    return np.where(h <= 0, F32(0), np.where(w <= 0, F32(0), h * w))


def trt_suppresses(kept: np.ndarray, box: np.ndarray, t: float) -> np.ndarray:
    """TensorRT's ``IOU(box, kept) >= t`` (efficientNMSInference.cu/.cuh, read literally):
    both boxes reordered, ``intersect`` by ``a > b ? a : b`` / ``a < b ? a : b`` with ``a``
    the candidate, ``if (inter <= 0) return 0; if (union <= 0) return 0;``. Corners are the
    first four columns (unreordered rows are reordered here)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        y1, y2 = _trt_reorder(kept[:, 0], kept[:, 2])
        x1, x2 = _trt_reorder(kept[:, 1], kept[:, 3])
        b_y1, b_y2 = _trt_reorder(box[0], box[2])
        b_x1, b_x2 = _trt_reorder(box[1], box[3])
        inter = _trt_area(np.where(b_y1 > y1, b_y1, y1), np.where(b_x1 > x1, b_x1, x1),
                          np.where(b_y2 < y2, b_y2, y2), np.where(b_x2 < x2, b_x2, x2))
        union = _trt_area(b_y1, b_x1, b_y2, b_x2) + _trt_area(y1, x1, y2, x2) - inter
        iou = np.where(inter <= 0, F32(0), np.where(union <= 0, F32(0), inter / union))
        return iou >= F32(t)


def greedy(dec: np.ndarray, order, limit: int, suppress, groups=None) -> list[int]:
    """Sequential greedy NMS over candidate indices ``order`` (best first)."""
    kept: list[int] = []
    for i in order:
        if len(kept) >= limit:
            break
        mask = suppress(dec[kept], dec[i]) if kept else np.zeros(0, bool)
        if groups is not None:
            mask &= groups[kept] == groups[i]
        if not mask.any():
            kept.append(int(i))
    return kept


def by_score(scores: np.ndarray, candidates) -> list[int]:
    """Candidate indices by decreasing score, ties to the lower index (-0.0 == 0.0)."""
    return sorted(candidates, key=lambda i: (-float(scores[i]), i))


def best_of(row_scores, k) -> list[int]:
    """Positions of the ``k`` best rows by score (ties: earlier row), in row order: a
    capacity over the rows, torchvision's ``keep[:detections_per_img]`` (on rows sorted by
    score) and TensorRT's ``keepTopK``."""
    order = sorted(range(len(row_scores)), key=lambda r: (-float(row_scores[r]), r))
    return sorted(order[:k])


def top_candidates(flat_scores, passing, k) -> np.ndarray:
    """``passing`` restricted to the ``k`` best by score (ties: lower element), TensorRT
    EfficientNMS's pre-NMS top-k over one image's (box, class) pairs."""
    if k is None or passing.sum() <= k:
        return passing
    out = np.zeros_like(passing)
    out[by_score(flat_scores, np.flatnonzero(passing))[:k]] = True
    return out


def ref_non_max_suppression(boxes, scores, max_output_boxes_per_class=0, iou_threshold=0.0,
                            score_threshold=None, center_point_box=0, size=None,
                            max_detections=None, pre_nms_top_k=None):
    """ONNX NonMaxSuppression; NaN scores are never candidates. Rows ``[M, 3]``. With
    ``pre_nms_top_k`` an image's candidates are its best (box, class) pairs (TensorRT's
    pre-NMS top-k); with ``max_detections`` an image keeps its best rows (torchvision's
    ``detections_per_img``)."""
    boxes, scores = np.asarray(boxes, F32), np.asarray(scores, F32)
    rows = []
    for b in range(boxes.shape[0]):
        dec = np_decode(boxes[b], center=center_point_box == 1, reorder=center_point_box == 0)
        s = scores[b]
        passing = ~np.isnan(s)
        if score_threshold is not None:
            passing &= s > F32(score_threshold)
        passing = top_candidates(s.reshape(-1), passing.reshape(-1), pre_nms_top_k)
        passing = passing.reshape(s.shape)
        image = []
        for c in range(scores.shape[1]):
            kept = greedy(dec, by_score(s[c], np.flatnonzero(passing[c])),
                          max_output_boxes_per_class,
                          functools.partial(onnx_suppresses, t=iou_threshold))
            image += [[b, c, i] for i in kept]
        rows += [image[r] for r in best_of([s[c, i] for _, c, i in image],
                                           len(image) if max_detections is None
                                           else max_detections)]
    rows = np.asarray(rows, np.int64).reshape(-1, 3)
    if size is None or len(rows) <= size:
        return rows
    # Over capacity: the `size` best scores (ties: earlier row), kept in row order.
    return rows[best_of(scores[rows[:, 0], rows[:, 1], rows[:, 2]], size)]


@np.errstate(invalid="ignore", divide="ignore", over="ignore")  # NaN / inf boxes are inputs too
def torchvision_nms(boxes, scores, iou_threshold):
    """torchvision's CPU nms kernel, literally (``[x1, y1, x2, y2]`` with x1 <= x2). Python's
    ``max(a, b)`` / ``min(a, b)`` return ``a`` unless ``b`` is strictly beyond it, as
    ``std::max`` / ``std::min`` do, so NaN coordinates flow as in the C++ kernel."""
    x1, y1, x2, y2 = (np.asarray(boxes, F32)[:, k] for k in range(4))
    areas = (x2 - x1) * (y2 - y1)
    order = by_score(scores, range(len(scores)))
    suppressed = np.zeros(len(order), bool)
    keep = []
    for a, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        for j in order[a + 1:]:
            w = max(F32(0), min(x2[i], x2[j]) - max(x1[i], x1[j]))
            h = max(F32(0), min(y2[i], y2[j]) - max(y1[i], y1[j]))
            inter = w * h
            if float(inter / (areas[i] + areas[j] - inter)) > float(iou_threshold):  # float > double
                suppressed[j] = True
    return keep


def _torch_inputs(boxes, scores, score_threshold, pre_nms_top_k=None):
    """Corners reordered (our documented extension) and candidates filtered (the best
    ``pre_nms_top_k`` of them)."""
    b = np.asarray(boxes, F32)
    b = np.concatenate([np.minimum(b[:, :2], b[:, 2:]), np.maximum(b[:, :2], b[:, 2:])], 1)
    s = np.asarray(scores, F32)
    passing = np.array([not np.isnan(v) and (score_threshold is None or v > F32(score_threshold))
                        for v in s], bool)
    cand = np.flatnonzero(top_candidates(s, passing, pre_nms_top_k)).astype(np.int64)
    return b, s, cand


def ref_nms(boxes, scores, iou_threshold, max_output_size=None, score_threshold=None,
            pre_nms_top_k=None):
    b, s, cand = _torch_inputs(boxes, scores, score_threshold, pre_nms_top_k)
    keep = cand[torchvision_nms(b[cand], s[cand], iou_threshold)] if len(cand) else cand
    return np.asarray(keep[:max_output_size], np.int64)


def ref_batched_nms(boxes, scores, idxs, iou_threshold, max_output_size=None,
                    score_threshold=None, pre_nms_top_k=None):
    """torchvision batched_nms: nms per class id, merged by decreasing score; then
    ``keep[:detections_per_img]`` (``max_output_size``)."""
    b, s, cand = _torch_inputs(boxes, scores, score_threshold, pre_nms_top_k)
    idxs = np.asarray(idxs)
    keep = []
    for k in np.unique(idxs[cand]) if len(cand) else []:
        members = cand[idxs[cand] == k]
        keep += list(members[torchvision_nms(b[members], s[members], iou_threshold)])
    return np.asarray(by_score(s, keep)[:max_output_size], np.int64)


def ref_efficient_nms(boxes, scores, max_output_boxes, iou_threshold, score_threshold,
                      class_agnostic=False, box_coding=0, pre_nms_top_k=4096):
    """TensorRT EfficientNMS, one image at a time."""
    boxes, scores = np.asarray(boxes, F32), np.asarray(scores, F32)
    bsz, n, c = scores.shape
    k = max_output_boxes
    out = EfficientNMSOutput(np.zeros((bsz, 1), np.int32), np.zeros((bsz, k, 4), F32),
                             np.zeros((bsz, k), F32), np.zeros((bsz, k), np.int32),
                             np.zeros((bsz, 1), np.int32))
    for b in range(bsz):
        flat = scores[b].reshape(-1)
        cand = [e for e in range(n * c) if flat[e] >= F32(score_threshold)]
        out.candidates_cut[b, 0] = max(len(cand) - pre_nms_top_k, 0)
        cand = by_score(flat, cand)[:pre_nms_top_k]
        raw = np.stack([boxes[b, e // c] if boxes.ndim == 3 else boxes[b, e // c, e % c]
                        for e in range(n * c)]) if n * c else np.zeros((0, 4), F32)
        corners = np_decode(raw, center=box_coding == 1, reorder=False)[:, :4]
        classes = np.arange(n * c) % c
        kept = greedy(corners, cand, k, functools.partial(trt_suppresses, t=iou_threshold),
                      groups=None if class_agnostic else classes)
        out.num_detections[b, 0] = len(kept)
        for slot, e in enumerate(kept):
            out.detection_boxes[b, slot] = corners[e]
            out.detection_scores[b, slot] = flat[e]
            out.detection_classes[b, slot] = e % c
    return out


def clear_low_bits(scores: np.ndarray) -> np.ndarray:
    """Non-negative float32 scores with the low ``ceil(log2 N)`` bits cleared: the
    high-performance mode ranks exactly like the high-precision one on these."""
    bits = max(1, (scores.shape[-1] - 1).bit_length())
    mask = np.uint32(~((1 << bits) - 1) & 0xFFFFFFFF)
    return (np.asarray(scores, F32).view(np.uint32) & mask).view(F32)


# -- ONNX Runtime, the oracle of NonMaxSuppression --------------------------------------------

@functools.lru_cache(maxsize=None)
def ort_session(center_point_box: int = 0, with_score_threshold: bool = False):
    """An onnxruntime CPU session of one opset-11 NonMaxSuppression node."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    names = ["boxes", "scores", "max_output_boxes_per_class", "iou_threshold"]
    types = [TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.INT64, TensorProto.FLOAT]
    if with_score_threshold:
        names.append("score_threshold")
        types.append(TensorProto.FLOAT)
    node = helper.make_node("NonMaxSuppression", names, ["selected_indices"],
                            center_point_box=center_point_box)
    graph = helper.make_graph(
        [node], "nms", [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)],
        [helper.make_tensor_value_info("selected_indices", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def ort_feeds(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold=None):
    feeds = {"boxes": np.asarray(boxes, F32), "scores": np.asarray(scores, F32),
             "max_output_boxes_per_class": np.array([max_output_boxes_per_class], np.int64),
             "iou_threshold": np.array([iou_threshold], F32)}
    if score_threshold is not None:
        feeds["score_threshold"] = np.array([score_threshold], F32)
    return feeds


def run_ort(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold=None,
            center_point_box=0) -> np.ndarray:
    """ONNX Runtime's NonMaxSuppression rows ``[M, 3]`` (int64)."""
    session = ort_session(center_point_box, score_threshold is not None)
    return session.run(None, ort_feeds(boxes, scores, max_output_boxes_per_class,
                                       iou_threshold, score_threshold))[0]


# -- random inputs ---------------------------------------------------------------------------

def random_boxes(rng, shape, *, extent=10.0, size=(1.0, 4.0), jitter=0.2, flip=False,
                 center=False, grid=None) -> np.ndarray:
    """Boxes ``[*shape, 4]`` in clusters, like a detector's proposals, so IoUs cover [0, 1].

    Each box is one of ``shape[-1] // 4 + 1`` object boxes in ``[0, extent]^2`` moved and
    resized by ``jitter`` times its size. ``grid`` snaps coordinates to multiples of it
    (exact ties of IoU with thresholds); ``flip`` swaps the corners of random boxes;
    ``center`` returns ``[c0, c1, s0, s1]``.
    """
    n = shape[-1] if shape else 1
    objects = (*shape[:-1], n // 4 + 1)
    lo0, wh0 = rng.uniform(0, extent, (*objects, 2)), rng.uniform(*size, (*objects, 2))
    pick = rng.integers(0, objects[-1], shape)
    lo0 = np.take_along_axis(lo0, pick[..., None], axis=-2)
    wh0 = np.take_along_axis(wh0, pick[..., None], axis=-2)
    lo = lo0 + jitter * wh0 * rng.standard_normal((*shape, 2))
    wh = wh0 * np.exp(jitter * rng.standard_normal((*shape, 2)))
    if grid:
        lo, wh = np.round(lo / grid) * grid, np.maximum(np.round(wh / grid), 1) * grid
    if center:
        return np.concatenate([lo + wh / 2, wh], -1).astype(F32)
    b = np.concatenate([lo, lo + wh], -1)
    if flip:
        swap = rng.random((*shape, 2)) < 0.5
        b = np.where(np.concatenate([swap, swap], -1), b[..., [2, 3, 0, 1]], b)
    return b.astype(F32)


def random_scores(rng, shape, *, levels=None) -> np.ndarray:
    """Uniform scores; ``levels`` quantises them so that ties happen."""
    s = rng.random(shape)
    return (np.floor(s * levels) / levels if levels else s).astype(F32)


def _onnx_inputs(rng, b=2, c=3, n=12, **kw):
    return random_boxes(rng, (b, n), **kw), random_scores(rng, (b, c, n), levels=8)


def _single_inputs(rng, n=16, classes=None):
    boxes, scores = random_boxes(rng, (n,), flip=True), random_scores(rng, (n,), levels=8)
    return (boxes, scores) if classes is None else (boxes, scores, rng.integers(0, classes, n))


def _efficient_inputs(rng, b=2, n=10, c=3, per_class=False):
    return random_boxes(rng, (b, n, c) if per_class else (b, n)), random_scores(rng, (b, n, c))


CASES = [
    OpCase("nms_onnx_corners_capacity", "NonMaxSuppression", TRUNCATE(jaxops.non_max_suppression),
           functools.partial(_onnx_inputs, flip=True), ref_non_max_suppression,
           attrs=dict(max_output_boxes_per_class=5, iou_threshold=0.4, size=9)),
    OpCase("nms_torchvision", "NonMaxSuppression", jaxops.nms, _single_inputs, ref_nms,
           attrs=dict(iou_threshold=0.5, max_output_size=9), launch_outputs=None),
    OpCase("batched_nms", "BatchedNMS", jaxops.batched_nms,
           functools.partial(_single_inputs, classes=3), ref_batched_nms,
           attrs=dict(iou_threshold=0.3, score_threshold=0.2, max_output_size=6)),
    OpCase("efficient_nms_per_class_boxes", "EfficientNMS", jaxops.efficient_nms,
           functools.partial(_efficient_inputs, per_class=True), ref_efficient_nms,
           attrs=dict(max_output_boxes=6, iou_threshold=0.4, score_threshold=0.2, box_coding=1),
           launch_outputs=lambda outs: EfficientNMSOutput(*outs)),
]
