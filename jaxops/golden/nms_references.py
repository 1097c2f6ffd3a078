"""Independent references of the NMS family (see :mod:`jaxops.golden.references`).

Plain numpy, from each contract: aclnnNonMaxSuppression as its docs and TBE kernel state
it, ONNX NonMaxSuppression as ONNX Runtime runs it, torchvision's batched_nms, TensorRT's
EfficientNMS_TRT. No jaxops kernel or shared piece of one is imported.

``high_performance`` (ONNX NMS, BatchedNMS) is modelled as jaxops documents it: float32
scores of at most 2**15 boxes are ranked on their order-preserving bit keys with the low
``b = max(1, ceil(log2 n))`` bits cleared, equal keys by box index.

>>> boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [2, 2, 3, 3]]], np.float32)
>>> scores = np.array([[[0.9, 0.8, 0.7]]], np.float32)
>>> attrs = {"max_output_boxes_per_class": 2, "iou_threshold": 0.5, "score_threshold": 0.0}
>>> reference("NonMaxSuppression", "aclnnNonMaxSuppression")([boxes, scores], attrs)[0][0].tolist()
[[0, 0, 0], [0, 0, 2]]
"""

from __future__ import annotations

import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.golden.references import Expected, reference, register_reference

__all__: list[str] = []  # registers references; use jaxops.golden.references.reference

_HP = ("high_precision", "high_performance")
_RADIX_MAX = 2**15


def _refuse(op: str, attrs: dict, **defaults) -> None:
    """The references model the contract at these attrs' defaults only: say so."""
    for name, default in defaults.items():
        if attrs.get(name, default) != default:
            raise OpArgumentError(f"golden check {op}", name, f"{default!r} (the reference "
                                  "models no other value)", repr(attrs[name]))


def _overlap_iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two corner boxes ``[lo0, lo1, hi0, hi1]`` (edges ordered), float32 as ONNX
    Runtime computes it; 0 when they do not overlap or the union is not positive."""
    f = np.float32
    inter = max(f(min(a[2], b[2]) - max(a[0], b[0])), f(0)) * max(f(min(a[3], b[3]) - max(a[1], b[1])), f(0))
    union = f((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)
    return f(inter / union) if inter > 0 and union > 0 else f(0)


def _greedy(order, boxes, groups, iou_threshold, keep_most, *, inclusive=False) -> list:
    """Walks candidates in ``order``; keeps one unless a kept box of its group overlaps it
    by more than the threshold (``>=`` with ``inclusive``); stops at ``keep_most``."""
    kept: list = []
    t = np.float32(iou_threshold)
    for i in order:
        if len(kept) == keep_most:
            break
        if not any(groups[k] == groups[i] and (
                _overlap_iou(boxes[k], boxes[i]) >= t if inclusive else
                _overlap_iou(boxes[k], boxes[i]) > t) for k in kept):
            kept.append(i)
    return kept


def _ranking_keys(scores: np.ndarray, n_boxes: int, mode: str) -> np.ndarray:
    """Keys that order the scores (larger first): the scores themselves, or in
    high_performance their order-preserving uint32 bits (-0.0 as +0.0) with the low
    ``max(1, ceil(log2 n))`` bits cleared (float32 scores of at most 2**15 boxes)."""
    if mode != "high_performance" or scores.dtype != np.float32 or n_boxes > _RADIX_MAX:
        return scores.astype(np.float64)
    bits = np.where(scores == 0, np.float32(0), scores).view(np.uint32)
    key = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000))
    return (key & ~np.uint32((1 << max(1, (n_boxes - 1).bit_length())) - 1)).astype(np.int64)


def _by_score(scores: np.ndarray, passing: np.ndarray, keys: np.ndarray | None = None) -> list:
    """Indices of the passing scores, highest (key) first, ties to the lower index."""
    idx = np.flatnonzero(passing)
    keys = scores.astype(np.float64) if keys is None else keys
    return [int(i) for i in idx[np.argsort(-keys[idx], kind="stable")]]


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """``[..., 4]`` boxes as ``[lo0, lo1, hi0, hi1]``: corners with each axis' edges
    ordered, or centre-size boxes (``c -/+ size / 2``, not reordered)."""
    b = boxes.astype(np.float32)
    if center:
        half0, half1 = b[..., 2] / np.float32(2), b[..., 3] / np.float32(2)
        return np.stack([b[..., 0] - half0, b[..., 1] - half1, b[..., 0] + half0, b[..., 1] + half1], -1)
    return np.stack([np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
                     np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3])], -1)


def _passing(scores: np.ndarray, threshold, inclusive: bool = False) -> np.ndarray:
    if threshold is None:
        return ~np.isnan(scores)
    t = scores.dtype.type(threshold)
    return scores >= t if inclusive else scores > t  # NaN: never


@register_reference("NonMaxSuppression", modes=_HP)
def _onnx_nms(inputs, attrs, mode):
    """ONNX NonMaxSuppression as ONNX Runtime runs it: per image and class, the scores
    above ``score_threshold`` from the highest, a box kept unless a kept box of its class
    overlaps it by IoU > ``iou_threshold``, at most ``max_output_boxes_per_class``; rows
    ``[batch, class, box]`` by image, class, then selection. ``size``: the best ``size``
    rows by score, in row order."""
    _refuse("NonMaxSuppression", attrs, max_detections=None, pre_nms_top_k=None)
    if mode == "high_performance":
        _refuse("NonMaxSuppression", attrs, size=None)
    boxes, scores = (np.asarray(a) for a in inputs)
    corners = _corners(boxes, bool(attrs.get("center_point_box", 0)))
    rows, row_scores = [], []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            keys = _ranking_keys(s, len(s), mode)
            for i in _greedy(_by_score(s, _passing(s, attrs.get("score_threshold")), keys), corners[b],
                             np.zeros(len(s)), attrs["iou_threshold"],
                             attrs["max_output_boxes_per_class"]):
                rows.append([b, c, i])
                row_scores.append(s[i])
    rows = np.array(rows, np.int64).reshape(-1, 3)
    size = attrs.get("size")
    if size is not None and len(rows) > size:  # the best by score, ties to the earlier row
        best = np.sort(np.argsort(-np.asarray(row_scores, np.float64), kind="stable")[:size])
        return Expected([rows[best]], [rows.shape])
    return Expected([rows], [rows.shape])


@register_reference("NonMaxSuppression", "aclnnNonMaxSuppression")
def _aclnn_nms(inputs, attrs, mode):
    """aclnnNonMaxSuppression: per batch ``b`` and class ``c``, the boxes whose score
    (as float32) is above ``scoreThreshold``, from the highest (ties: lower box first), a
    box kept unless a kept box overlaps it by IoU > ``iouThreshold``, at most ``M =
    maxOutputBoxesPerClass``; block ``b*C + c`` of ``M`` INT32 rows holds the kept ``[b,
    c, box]`` rows, then -1 rows. Corner boxes are read as given, (y1, x1, y2, x2)."""
    boxes, scores = (np.asarray(a) for a in inputs)
    b_count, c_count = scores.shape[:2]
    most = attrs["max_output_boxes_per_class"]
    center = bool(attrs.get("center_point_box", 0))
    corners = _corners(boxes, True) if center else boxes.astype(np.float32)
    out = np.full((b_count * c_count * most, 3), -1, np.int32)
    for b in range(b_count):
        for c in range(c_count):
            s = scores[b, c].astype(np.float32)
            passing = s > np.float32(attrs["score_threshold"])
            kept = _greedy(_by_score(s, passing), corners[b], np.zeros(len(s)),
                           attrs["iou_threshold"], most)
            for r, i in enumerate(kept):
                out[(b * c_count + c) * most + r] = (b, c, i)
    return Expected([out], [None])


@register_reference("BatchedNMS", modes=_HP)
def _batched_nms(inputs, attrs, mode):
    """torchvision batched_nms: NMS within each ``idxs`` group, scores from the highest
    (above ``score_threshold`` when given), IoU > ``iou_threshold`` suppresses; the kept
    indices by decreasing score, at most ``max_output_size``."""
    _refuse("BatchedNMS", attrs, pre_nms_top_k=None)
    boxes, scores, idxs = (np.asarray(a) for a in inputs)
    most = attrs.get("max_output_size")
    order = _by_score(scores, _passing(scores, attrs.get("score_threshold")),
                      _ranking_keys(scores, len(scores), mode))
    keep = _greedy(order, _corners(boxes, False), idxs, attrs["iou_threshold"],
                   len(order) if most is None else most)
    keep = np.array(keep, np.int64)
    return Expected([keep], [keep.shape])


@register_reference("EfficientNMS")
def _efficient_nms(inputs, attrs, mode):
    """TensorRT EfficientNMS_TRT: per image the (box, class) pairs scoring at least
    ``score_threshold``, the best ``pre_nms_top_k`` by score (ties to the lower
    ``box * C + class``), one greedy pass where IoU >= ``iou_threshold`` with a kept box of
    the same class (any, ``class_agnostic``) suppresses; the first ``max_output_boxes``
    kept, zero-padded, boxes as corners (corner boxes as given)."""
    boxes, scores = (np.asarray(a) for a in inputs)
    images, n, classes = scores.shape
    k_most, center = attrs["max_output_boxes"], attrs.get("box_coding", 0) == 1
    per_class = boxes.ndim == 4
    outs = [np.zeros((images, 1), np.int32), np.zeros((images, k_most, 4), boxes.dtype),
            np.zeros((images, k_most), scores.dtype), np.zeros((images, k_most), np.int32),
            np.zeros((images, 1), np.int32)]
    for b in range(images):
        flat = scores[b].reshape(-1)  # pair e = box * C + class
        order = _by_score(flat, _passing(flat, attrs["score_threshold"], inclusive=True))
        outs[4][b, 0] = max(len(order) - attrs.get("pre_nms_top_k", 4096), 0)
        order = order[:attrs.get("pre_nms_top_k", 4096)]
        given = boxes[b].reshape(-1, 4) if per_class else np.repeat(boxes[b], classes, axis=0)
        groups = np.zeros(n * classes, np.int64) if attrs.get("class_agnostic") else np.arange(n * classes) % classes
        kept = _greedy(order, _corners(given, center), groups, attrs["iou_threshold"], k_most,
                       inclusive=True)
        outs[0][b, 0] = len(kept)
        for j, e in enumerate(kept):
            corners = given[e].astype(np.float32)
            if center:
                half = corners[2:] / np.float32(2)
                corners = np.concatenate([corners[:2] - half, corners[:2] + half])
            outs[1][b, j], outs[2][b, j], outs[3][b, j] = corners, flat[e], e % classes
    return Expected(outs, [None] * 5)
