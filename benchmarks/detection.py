"""Detection post-processing (issue 29): score filter, class-aware NMS, 300 per image.

Two workloads, each at IoU 0.45 and 0.7, score threshold 0.25, at most 300 boxes per class
and 300 detections per image:

- **A**, a YOLOv8-style head: batch 8, 8,400 boxes, 80 classes;
- **B**: batch 32, 1,000 boxes, 20 classes.

Boxes are jittered copies of a few objects per image (one object per 150 boxes, each with a
class); a box's score for its object's class falls with its jitter, the other classes get
low noise, and the scores are scaled so that about 1 % of the (box, class) pairs are above
0.25 (about 6,700 candidates per image in A, 200 in B).

Routes, each checked against its peer's detections before it is timed:

- **plain**: ``jaxops.non_max_suppression(boxes, scores, 300, iou, 0.25)``, the ONNX call
  exactly as ONNX Runtime takes it (no ``max_detections``, no ``pre_nms_top_k``: every
  (box, class) pair a candidate, 20,000 an image in B), equal to ONNX Runtime's rows; on
  the default backend (the native kernel on the CPU) against ONNX Runtime (target <= 0.8)
  and on ``backend="xla"`` (what a GPU or TPU runs, at the capacity ladder's tier that
  holds the candidates) against torchvision (target <= 3);
- **tuned**: ``non_max_suppression(..., max_detections=300, pre_nms_top_k=K)`` — the
  recommended route of docs/detection.md — on the default backend against ONNX Runtime's
  ``NonMaxSuppression`` (the op alone, without the per-image cap, which ORT does not have;
  target <= 0.8) and on ``backend="xla"`` against torchvision (target <= 3);
- torchvision is ``batched_nms`` per image after the score filter, then ``keep[:300]``,
  torch on one thread, checked against ONNX Runtime's rows capped per image; its rows are
  skipped when torchvision is not installed;
- ``efficient_nms`` (TensorRT's layout: scores transposed to ``[B, N, C]``) on both
  backends against ONNX Runtime (informative).

Each row's ``spread`` is the interquartile range of the per-pair ratios (ours / peer,
timed interleaved). ``--quick`` runs small sizes without targets (fixed per-call costs
dominate there).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import jaxops
from benchmarks.common import Check, Result, against, all_of, compare
from tests.helpers.cases.nms import ort_feeds, ort_session

THRESHOLD, PER_CLASS, PER_IMAGE = 0.25, 300, 300
#: (batch, boxes, classes, pre_nms_top_k) of each workload (full size, then --quick)
WORKLOADS = {"A": ((8, 8400, 80, 8192), (2, 2100, 20, 2048)),
             "B": ((32, 1000, 20, 1024), (8, 500, 10, 512))}


def detector_outputs(rng, batch: int, n: int, classes: int, above: float = 0.01,
                     extent: float = 640.0) -> tuple[np.ndarray, np.ndarray]:
    """``boxes [B, N, 4]`` ``[x1, y1, x2, y2]`` and ``scores [B, C, N]`` (see the module
    docstring): clustered, jittered boxes; ``above`` of the pairs score above 0.25."""
    n_obj = max(4, n // 150)
    boxes = np.empty((batch, n, 4), np.float32)
    scores = np.empty((batch, classes, n), np.float32)
    for b in range(batch):
        centre = rng.uniform(0.1 * extent, 0.9 * extent, (n_obj, 2))
        size = rng.uniform(0.03, 0.3, (n_obj, 2)) * extent
        cls = rng.integers(0, classes, n_obj)
        pick = rng.integers(0, n_obj, n)
        jitter = rng.standard_normal((n, 4)) * 0.12
        c = centre[pick] + jitter[:, :2] * size[pick]
        s = size[pick] * np.exp(jitter[:, 2:])
        boxes[b] = np.concatenate([c - s / 2, c + s / 2], 1)
        noise = rng.random((classes, n)) ** 8 * THRESHOLD
        near = np.exp(-0.5 * (jitter ** 2).sum(1) / (4 * 0.12 ** 2))  # 1 at the centre
        noise[cls[pick], np.arange(n)] = near * rng.uniform(0.0, 1.0, n)
        scores[b] = noise
    scores *= THRESHOLD / np.quantile(scores, 1 - above)
    return boxes, np.minimum(scores, 1.0).astype(np.float32)


def capped(rows: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """ONNX rows limited to the best ``PER_IMAGE`` of each image (ties: earlier row)."""
    row_scores = scores[rows[:, 0], rows[:, 1], rows[:, 2]]
    keep = []
    for b in np.unique(rows[:, 0]):
        at = np.flatnonzero(rows[:, 0] == b)
        order = np.lexsort((at, -row_scores[at].astype(np.float64)))[:PER_IMAGE]
        keep += sorted(at[order].tolist())
    return rows[keep]


def _torchvision_route():
    """torchvision's per-image pipeline on one thread, or None without torchvision."""
    try:
        import torch
        import torchvision
    except ImportError:
        return None
    torch.set_num_threads(1)

    def route(boxes, scores, iou):
        out = []
        for b in range(boxes.shape[0]):
            cls, idx = (scores[b] > THRESHOLD).nonzero(as_tuple=True)
            keep = torchvision.ops.batched_nms(boxes[b][idx], scores[b][cls, idx], cls, iou)
            out.append((cls[keep[:PER_IMAGE]], idx[keep[:PER_IMAGE]]))
        return out
    return torch, route


def _as_sets(per_image) -> list[set]:
    return [set(zip(np.asarray(c).tolist(), np.asarray(i).tolist())) for c, i in per_image]


def _route_check(want: np.ndarray) -> Check:
    """ours (a route) gives ``want`` (ONNX Runtime's rows, capped per image for the tuned
    route) and was not cut by a capacity."""
    def check(got, peer):
        if bool(got.overflowed()):
            raise AssertionError("the output overflowed its capacity")
        against(want)(got, peer)
    return check


def _torchvision_check(want: np.ndarray, batch: int) -> Check:
    """The peer (torchvision) keeps the same (class, box) pairs per image as ``want``."""
    def check(ours, got):
        if _as_sets(got) != [{(int(r[1]), int(r[2])) for r in want if r[0] == i}
                             for i in range(batch)]:
            raise AssertionError("torchvision and onnxruntime disagree")
    return check


def _efficient_check(want: np.ndarray, boxes: np.ndarray, scores: np.ndarray) -> Check:
    """ours (efficient_nms) gives, per image, ONNX Runtime's detections as (class, score,
    box) sets, with no candidate cut."""
    def check(out, peer):
        got = jax.device_get(out)
        for i in range(boxes.shape[0]):
            k = int(got.num_detections[i, 0])
            mine = {(int(cl), float(sc), *map(float, bx)) for cl, sc, bx in zip(
                got.detection_classes[i, :k], got.detection_scores[i, :k],
                got.detection_boxes[i, :k])}
            theirs = {(int(r[1]), float(scores[i, r[1], r[2]]), *map(float, boxes[i, r[2]]))
                      for r in want if r[0] == i}
            if mine != theirs or int(got.candidates_cut[i, 0]):
                raise AssertionError(f"image {i}: not onnxruntime's detections")
    return check


def workload(name: str, shape: tuple, iou: float, rng, repeats: int,
             targets: bool = True) -> list[Result]:
    b, n, c, top_k = shape
    boxes, scores = detector_outputs(rng, b, n, c)
    tag = f"{name} {b}x{n}x{c} IoU{iou}"
    session, feeds = ort_session(0, True), ort_feeds(boxes, scores, PER_CLASS, iou, THRESHOLD)
    rows = session.run(None, feeds)[0]
    want = capped(rows, scores)
    dev = jax.device_put(boxes), jax.device_put(scores)
    efficient_ok = _efficient_check(want, boxes, scores)
    routes = {"plain": ({}, _route_check(rows)),
              "tuned": (dict(max_detections=PER_IMAGE, pre_nms_top_k=top_k), _route_check(want))}

    def route(backend, options):
        fn = jax.jit(functools.partial(
            jaxops.non_max_suppression, max_output_boxes_per_class=PER_CLASS, iou_threshold=iou,
            score_threshold=THRESHOLD, backend=backend, **options))
        return lambda: fn(*dev)

    def efficient(backend):  # >= the next float above 0.25 is ONNX's > 0.25
        fn = jax.jit(lambda bx, sc: jaxops.efficient_nms(
            bx, jnp.swapaxes(sc, 1, 2), max_output_boxes=PER_IMAGE, iou_threshold=iou,
            score_threshold=float(np.nextafter(np.float32(THRESHOLD), np.float32(1))),
            pre_nms_top_k=top_k, backend=backend))
        return lambda: fn(*dev)

    ort = (lambda: session.run(None, feeds))
    tv = _torchvision_route()
    if tv is None:
        print("torchvision not installed: the xla routes are timed against onnxruntime only")
    else:
        torch, tv_route = tv
        tb, ts = torch.from_numpy(boxes), torch.from_numpy(scores)
        torchvision = lambda: tv_route(tb, ts, iou)  # noqa: E731
    target = (lambda t: t) if targets else (lambda t: None)
    results = []
    for label, (options, check) in routes.items():
        default, xla = route(None, options), route("xla", options)
        results.append(compare(f"{tag} {label} [default]", default, "onnxruntime NMS", ort,
                               target(0.8), repeats, check=check))
        if tv is not None:
            both = all_of(check, _torchvision_check(want, b))
            results.append(compare(f"{tag} {label} [xla]", xla, "torchvision 1 thread",
                                   torchvision, target(3.0), repeats, check=both))
        results.append(compare(f"{tag} {label} [xla]", xla, "onnxruntime NMS", ort, None,
                               repeats, check=check))
    from jaxops import native

    for backend in ("native", "xla") if native.available() else ("xla",):
        results.append(compare(f"{tag} efficient_nms [{backend}]", efficient(backend),
                               "onnxruntime NMS", ort, None, repeats, check=efficient_ok))
    return results


def run(quick: bool = False) -> list[Result]:
    rng = np.random.default_rng(0)
    repeats = 5 if quick else 21
    return [r for name, shapes in WORKLOADS.items() for iou in (0.45, 0.7)
            for r in workload(name, shapes[quick], iou, rng, repeats, targets=not quick)]
