"""NMS on boxes with NaN / ±inf coordinates and scores, against ONNX Runtime and torchvision.

The rule (``jaxops/ops/nms/suppression.py``): a box with a non-finite coordinate neither
suppresses nor is suppressed; ``+inf`` scores rank first, ``-inf`` last; NaN scores are
never selected. ONNX Runtime is run itself; torchvision's CPU kernel is
``tests.helpers.cases.nms.torchvision_nms``, a literal transcription (torch is not a test
dependency). EfficientNMS follows TensorRT's own rule instead (its IoU, operation for
operation: ``jaxops/core/tensorrt_boxes.py``), checked on a case derived by hand from
efficientNMSInference.cu/.cuh. NaN scores are compared with ONNX Runtime only under a ``score_threshold``:
without one its heap orders them arbitrarily.
"""

import chex
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops import native
from tests.helpers.cases.nms import (random_boxes, random_scores, ref_efficient_nms, run_ort,
                                     torchvision_nms)

BACKENDS = ["xla", "host"] + (["native"] if native.available() else [])
NON_FINITE = np.array([np.nan, np.inf, -np.inf], np.float32)


def poison(rng, values, fraction, choices=NON_FINITE):
    """``values`` with about ``fraction`` of its entries replaced by one of ``choices``."""
    out = values.copy()
    hit = rng.random(out.shape) < fraction
    out[hit] = rng.choice(choices, int(hit.sum()))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("center,iou,score_threshold", [
    (0, 0.5, None), (0, 0.0, 0.2), (1, 0.4, None), (1, 0.0, 0.2)])
def test_non_max_suppression_matches_onnxruntime(backend, center, iou, score_threshold):
    rng = np.random.default_rng(center * 7 + int(iou * 10) + (score_threshold is not None))
    boxes = poison(rng, random_boxes(rng, (24, 12), flip=center == 0, center=center == 1), 0.08)
    boxes[0, :4] = [[np.nan] * 4, [np.inf] * 4, [-np.inf, 0, np.inf, 5], [0, 0, 5, 5]]
    scores_choice = NON_FINITE if score_threshold is not None else NON_FINITE[1:]
    scores = poison(rng, random_scores(rng, (24, 2, 12), levels=5), 0.1, scores_choice)
    want = run_ort(boxes, scores, 12, iou, score_threshold, center)
    got = jaxops.refresh(jaxops.non_max_suppression(boxes, scores, 12, iou, score_threshold,
                                                    center_point_box=center, backend=backend))
    chex.assert_trees_all_equal(got.astype(np.int64), want)
    assert (~np.isfinite(boxes[want[:, 0], want[:, 2]])).any()  # non-finite boxes were kept


def test_non_finite_box_neither_suppresses_nor_is_suppressed():
    """By hand: each non-finite box overlaps box 0 and box 1 (identical to 0) completely,
    yet only box 1 is suppressed (by box 0)."""
    boxes = np.array([[[0, 0, 4, 4], [0, 0, 4, 4], [0, 0, 4, np.nan], [0, 0, np.inf, 4],
                       [-np.inf, -np.inf, np.inf, np.inf], [np.inf, 0, np.inf, 4]]], np.float32)
    scores = np.array([[[0.2, 0.1, 0.9, 0.8, 0.7, 0.6]]], np.float32)
    want = run_ort(boxes, scores, 6, 0.0)
    chex.assert_trees_all_equal(want[:, 2], np.array([2, 3, 4, 5, 0]))
    for backend in BACKENDS:
        got = jaxops.non_max_suppression(boxes, scores, 6, 0.0, backend=backend)
        chex.assert_trees_all_equal(jaxops.refresh(got).astype(np.int64), want)
    kept = jaxops.nms(boxes[0], scores[0, 0], 0.0)
    chex.assert_trees_all_equal(jaxops.refresh(kept).astype(np.int64),
                                np.array(torchvision_nms(boxes[0], scores[0, 0], 0.0)))


def torchvision_batched(boxes, scores, idxs, iou):
    """torchvision's batched_nms: its nms per class id, merged by decreasing score."""
    keep = []
    for k in np.unique(idxs):
        members = np.flatnonzero(idxs == k)
        keep += list(members[torchvision_nms(boxes[members], scores[members], iou)])
    return np.asarray(sorted(keep, key=lambda i: (-float(scores[i]), i)), np.int64)


@pytest.mark.parametrize("backend,impl_mode", [(b, "high_precision") for b in BACKENDS] +
                         [("xla", "high_performance")])
def test_nms_and_batched_nms_match_torchvision(backend, impl_mode):
    """Corners as torchvision takes them (x1 <= x2 where finite), finite and ±inf scores."""
    rng = np.random.default_rng(11)
    for trial in range(2):
        boxes = poison(rng, random_boxes(rng, (40,)), 0.08)
        scores = poison(rng, random_scores(rng, (40,), levels=8), 0.1, NON_FINITE[1:])
        idxs = rng.integers(0, 3, 40)
        for iou in (0.0, 0.5):
            # a JAX scalar threshold is an operand: one compile for both thresholds and trials
            # (both exact in float32, so torchvision's double comparison gives the same)
            t = jnp.asarray(iou, jnp.float32)
            got = jaxops.nms(boxes, scores, t, impl_mode=impl_mode, backend=backend)
            chex.assert_trees_all_equal(jaxops.refresh(got).astype(np.int64),
                                        np.asarray(torchvision_nms(boxes, scores, iou), np.int64))
            got = jaxops.batched_nms(boxes, scores, idxs, t, impl_mode=impl_mode,
                                     backend=backend)
            chex.assert_trees_all_equal(jaxops.refresh(got).astype(np.int64),
                                        torchvision_batched(boxes, scores, idxs, iou))


# Derived by hand from TensorRT's IOU(candidate, kept) (efficientNMSInference.cu/.cuh):
#   1 vs 0: intersect takes 0's edge where 1's is NaN -> inter 64; area(1) = NaN * 8 ->
#     union NaN -> IoU NaN: never >= t, so 1 is kept even at t = 0.
#   2 vs 0: the same box, IoU 1: suppressed.
#   3 vs 0: intersect [0, 20, 8, 8] has a side -12 <= 0 -> inter 0 -> IoU 0 >= 0:
#     suppressed at t = 0 despite its NaNs; kept at t = 0.5 (IoU 0 / NaN against 0, 1).
#   4: reorder swaps (inf, 0) arithmetically: d = inf, hi = inf, lo = inf - inf = NaN;
#     then as 1: IoU NaN against every kept box -> kept (min/max decoding would give the
#     finite-area box [0, 0, inf, 8], IoU 64 / inf = 0, suppressed at t = 0).
TRT_BOXES = np.array([[[0, 0, 8, 8], [np.nan, 0, 8, 8], [0, 0, 8, 8],
                       [np.nan, 20, np.nan, 30], [np.inf, 0, 0, 8]]], np.float32)
TRT_SCORES = np.array([[[0.9], [0.8], [0.7], [0.6], [0.5]]], np.float32)


@pytest.mark.parametrize("backend", ["xla", "host"])
@pytest.mark.parametrize("iou,kept", [(0.0, [0, 1, 4]), (0.5, [0, 1, 3, 4])])
def test_efficient_nms_follows_tensorrt_on_nan_and_inf_boxes(backend, iou, kept):
    out = jaxops.efficient_nms(TRT_BOXES, TRT_SCORES, max_output_boxes=5, iou_threshold=iou,
                               score_threshold=0.0, backend=backend)
    n = len(kept)
    assert int(out.num_detections[0, 0]) == n
    chex.assert_trees_all_equal(np.asarray(out.detection_scores[0, :n]),
                                TRT_SCORES[0, kept, 0])
    np.testing.assert_array_equal(np.asarray(out.detection_boxes[0, :n]), TRT_BOXES[0, kept])
    want = ref_efficient_nms(TRT_BOXES, TRT_SCORES, 5, iou, 0.0)  # the literal transcription
    assert int(want.num_detections[0, 0]) == n
