"""Independent references of the golden operators: plain numpy, written from each contract.

``golden check`` compares a case with these, never with the kernel that wrote it: a kernel
checked against itself passes its own bugs (issue 35: a 16M NonZero case held a wrong
index, and the recomputing check passed it). So this module imports no jaxops kernel and
no shared piece of one; each reference reads the contract it follows (ONNX, torchvision,
TensorRT) and states it in a few lines of numpy.

A reference takes the case's inputs (numpy, in OpDef order) and its attrs and returns
:class:`Expected`: each output at its exact shape (after the ``size`` attr's cut, as the
kernel must return it) and, per output that a capacity can cut, its true shape.

>>> want = reference("NonZero")([np.array([0, 3, 0, 5])], {"size": None, "transpose": False})
>>> want.outputs[0].tolist(), want.true_shapes
([[1, 3]], [(1, 2)])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from jaxops.core.errors import OpArgumentError

__all__ = ["Expected", "has_reference", "reference"]


class Expected(NamedTuple):
    """What a kernel must return: exact-shape outputs and (``None`` where no capacity can
    cut it) each output's true shape."""

    outputs: list
    true_shapes: list


_REFERENCES: dict[str, Callable[[list, dict], Expected]] = {}


def _reference_of(op: str):
    def register(fn):
        _REFERENCES[op] = fn
        return fn
    return register


def has_reference(op: str) -> bool:
    """Whether ``op`` has an independent reference here.

    >>> has_reference("NonZero"), has_reference("EmbeddingHashTableExport")
    (True, False)
    """
    return op in _REFERENCES


def reference(op: str) -> Callable[[list, dict], Expected]:
    """The reference of ``op``: ``fn(inputs, attrs) -> Expected``; an operator without one
    raises :class:`~jaxops.core.errors.OpArgumentError` naming those that have one."""
    if op not in _REFERENCES:
        raise OpArgumentError("golden check", "op", f"one of {sorted(_REFERENCES)}", repr(op),
                              "Its cases have no independent reference yet.")
    return _REFERENCES[op]


def _refuse(op: str, attrs: dict, **defaults) -> None:
    """The references model the contract at these attrs' defaults only: say so."""
    for name, default in defaults.items():
        if attrs.get(name, default) != default:
            raise OpArgumentError(f"golden check {op}", name, f"{default!r} (the reference "
                                  "models no other value)", repr(attrs[name]))


def _is_nonzero(x: np.ndarray) -> np.ndarray:
    """``x != 0`` (-0.0 is zero, NaN and subnormals are not); bfloat16 (kind "V") widened
    to float32 first, exactly."""
    return x.astype(np.float32) != 0 if x.dtype.kind == "V" else x != 0


def _cut(a: np.ndarray, size, axis: int = 0) -> np.ndarray:
    return a if size is None else np.take(a, np.arange(min(size, a.shape[axis])), axis=axis)


@_reference_of("NonZero")
def _nonzero(inputs, attrs):
    """ONNX NonZero: the coordinates of ``x != 0`` in row-major order, ``[rank, n]`` (a
    0-d x is a 1-element vector); ``transpose``: ``[n, rank]``; ``size`` keeps the first."""
    x = np.atleast_1d(inputs[0])
    coords = np.stack(np.nonzero(_is_nonzero(x))).astype(np.int64)
    if attrs.get("transpose"):
        coords = coords.T
    axis = 0 if attrs.get("transpose") else 1
    return Expected([_cut(coords, attrs.get("size"), axis)], [coords.shape])


def _float_key(v: np.ndarray):
    """Equality and order of ONNX Unique on floats: -0.0 == 0.0, NaN after +inf."""
    v = v.astype(np.float64)
    return [(1, 0.0) if np.isnan(f) else (0, f + 0.0) for f in v.reshape(-1)]


def _groups(items: np.ndarray, equal_nan: bool) -> list:
    """A key per item (a value or a flattened slice): its value's (floats: -0.0 as 0.0,
    NaN equal to NaN), plus its position where it holds a NaN and NaNs are distinct."""
    keys = []
    for i, item in enumerate(items):
        flat = np.asarray(item).reshape(-1)
        if flat.dtype.kind in "fV":
            k = tuple(_float_key(flat))
            keys.append(k + ((i + 1,) if not equal_nan and any(n for n, _ in k) else (0,)))
        else:
            keys.append(tuple(int(v) for v in flat))
    return keys


def _items(x: np.ndarray, axis):
    """The items Unique compares (elements, or slices along ``axis``) and how to put the
    chosen ones back into ``x``'s layout."""
    if axis is None:
        return x.reshape(-1), lambda picked: picked
    moved = np.moveaxis(x, axis, 0)
    return moved, lambda picked: np.moveaxis(picked, 0, axis % x.ndim)


@_reference_of("Unique")
def _unique(inputs, attrs):
    """ONNX Unique: the distinct items (ascending with ``sorted``, else in order of first
    occurrence), each as its first occurrence; first indices, the inverse (-1 where the
    item's id is cut by ``size``) and counts."""
    x, size, axis = np.asarray(inputs[0]), attrs.get("size"), attrs.get("axis")
    items, put_back = _items(x, axis)
    keys = _groups(items, attrs.get("equal_nan", True))
    members: dict = {}
    for i, k in enumerate(keys):
        members.setdefault(k, []).append(i)
    order = sorted(members) if attrs.get("sorted", True) else list(members)
    first = np.array([members[k][0] for k in order], np.int64)
    counts = np.array([len(members[k]) for k in order], np.int64)
    ids = {k: j for j, k in enumerate(order)}
    kept = len(order) if size is None else min(size, len(order))
    inverse = np.array([ids[k] if ids[k] < kept else -1 for k in keys], np.int64)
    y = put_back(items[first[:kept]])
    true_y = list(y.shape)
    true_y[0 if axis is None else axis % x.ndim] = len(order)
    return Expected([y, first[:kept], inverse, counts[:kept]],
                    [tuple(true_y), (len(order),), None, (len(order),)])


@_reference_of("UniqueConsecutive")
def _unique_consecutive(inputs, attrs):
    """torch.unique_consecutive: the first item of each run of equal items (Unique's
    equality), the run of every item (-1 where cut by ``size``) and the run lengths."""
    x, size, axis = np.asarray(inputs[0]), attrs.get("size"), attrs.get("axis")
    items, put_back = _items(x, axis)
    keys = _groups(items, attrs.get("equal_nan", True))
    starts = [i for i in range(len(keys)) if i == 0 or keys[i] != keys[i - 1]]
    runs = len(starts)
    kept = runs if size is None else min(size, runs)
    run_of = np.cumsum([i in set(starts) for i in range(len(keys))]) - 1 if keys else np.zeros(0)
    inverse = np.where(run_of < kept, run_of, -1).astype(np.int64)
    counts = np.diff(starts + [len(keys)]).astype(np.int64)
    y = put_back(items[np.array(starts[:kept], np.int64)])
    true_y = list(y.shape)
    true_y[0 if axis is None else axis % x.ndim] = runs
    return Expected([y, inverse, counts[:kept]], [tuple(true_y), None, (runs,)])


@_reference_of("MaskedSelect")
def _masked_select(inputs, attrs):
    """torch.masked_select: ``x`` and ``mask`` broadcast, the selected elements in
    row-major order; ``size`` keeps the first."""
    x, mask = np.broadcast_arrays(*(np.asarray(a) for a in inputs))
    y = x[mask.astype(bool)]
    return Expected([_cut(y, attrs.get("size"))], [y.shape])


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


def _by_score(scores: np.ndarray, passing: np.ndarray) -> list:
    """Indices of the passing scores, highest first, ties to the lower index."""
    idx = np.flatnonzero(passing)
    return [int(i) for i in idx[np.argsort(-scores[idx].astype(np.float64), kind="stable")]]


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


@_reference_of("NonMaxSuppression")
def _onnx_nms(inputs, attrs):
    """ONNX NonMaxSuppression as ONNX Runtime runs it: per image and class, the scores
    above ``score_threshold`` from the highest, a box kept unless a kept box of its class
    overlaps it by IoU > ``iou_threshold``, at most ``max_output_boxes_per_class``; rows
    ``[batch, class, box]`` by image, class, then selection. ``size``: the best ``size``
    rows by score, in row order."""
    _refuse("NonMaxSuppression", attrs, max_detections=None, pre_nms_top_k=None)
    boxes, scores = (np.asarray(a) for a in inputs)
    corners = _corners(boxes, bool(attrs.get("center_point_box", 0)))
    rows, row_scores = [], []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            for i in _greedy(_by_score(s, _passing(s, attrs.get("score_threshold"))), corners[b],
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


@_reference_of("BatchedNMS")
def _batched_nms(inputs, attrs):
    """torchvision batched_nms: NMS within each ``idxs`` group, scores from the highest
    (above ``score_threshold`` when given), IoU > ``iou_threshold`` suppresses; the kept
    indices by decreasing score, at most ``max_output_size``."""
    _refuse("BatchedNMS", attrs, pre_nms_top_k=None)
    boxes, scores, idxs = (np.asarray(a) for a in inputs)
    most = attrs.get("max_output_size")
    order = _by_score(scores, _passing(scores, attrs.get("score_threshold")))
    keep = _greedy(order, _corners(boxes, False), idxs, attrs["iou_threshold"],
                   len(order) if most is None else most)
    keep = np.array(keep, np.int64)
    return Expected([keep], [keep.shape])


@_reference_of("EfficientNMS")
def _efficient_nms(inputs, attrs):
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
