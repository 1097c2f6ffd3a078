"""The NMS family against its numpy references, on random problems and edge cases.

ONNX Runtime itself is the oracle in ``test_nms_onnxruntime.py``; the references used here
(``tests/helpers/cases/nms.py``) agree with it there. Random problems run as one vmapped batch per
configuration so that few compilations cover many problems.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.core.impl_mode import OpImplMode
from tests.helpers.cases.nms import (by_score, random_boxes, random_scores, ref_batched_nms,
                                     ref_efficient_nms, ref_nms, ref_non_max_suppression)

F32 = np.float32


def assert_rows(got, want):
    chex.assert_trees_all_equal(np.asarray(got, np.int64), np.asarray(want, np.int64))


# -- NonMaxSuppression: hand-made edge cases ------------------------------------------------

def _edge_images():
    """Eight 4-box images (ONNX [y1, x1, y2, x2]), their scores and expected box order."""
    disjoint = [[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5], [6, 6, 7, 7]]
    at_threshold = [[0, 0, 2, 2], [0, 0, 2, 1], [0, 0, 2, 0.9], [10, 10, 11, 11]]
    images = [
        (disjoint, [0.1, 0.4, 0.3, 0.2], [1, 2, 3, 0]),                 # all kept, by score
        ([[0, 0, 2, 2]] * 4, [0.2, 0.9, 0.5, 0.7], [1]),                 # duplicates: one
        (disjoint, [0.5, 0.5, 0.7, 0.5], [2, 0, 1, 3]),                 # ties: lower index
        (disjoint, [np.nan, 0.3, np.nan, 0.1], [1, 3]),                 # NaN never selected
        ([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 4, 0], [0, 0, 4, 4]],      # zero-area boxes
         [0.9, 0.8, 0.7, 0.6], [0, 1, 2, 3]),                           # suppress nothing
        (at_threshold, [0.9, 0.8, 0.7, 0.6], [0, 1, 3]),                # IoU == 0.5 kept
        (disjoint, [-0.0, 0.0, 0.1, 0.0], [2, 0, 1, 3]),                # -0.0 ties +0.0
        ([[2, 2, 0, 0], [2, 0, 0, 1], [0, 0.9, 2, 0], [11, 10, 10, 11]],  # flipped corners
         [0.9, 0.8, 0.7, 0.6], [0, 1, 3]),
    ]
    boxes = np.asarray([b for b, _, _ in images], F32)
    scores = np.asarray([[s] for _, s, _ in images], F32)
    rows = [[b, 0, k] for b, (_, _, keep) in enumerate(images) for k in keep]
    return boxes, scores, rows


def test_edge_cases_by_hand_and_reference():
    boxes, scores, rows = _edge_images()
    got = jaxops.refresh(jaxops.non_max_suppression(boxes, scores, 4, 0.5))
    assert_rows(got, rows)
    assert_rows(ref_non_max_suppression(boxes, scores, 4, 0.5), rows)


def test_capacity_equal_to_true_size_and_overflow_in_jit():
    boxes, scores, rows = _edge_images()
    m = len(rows)
    run = jax.jit(lambda b, s, size: jaxops.non_max_suppression(b, s, 4, 0.5, size=size),
                  static_argnums=2)
    exact = run(boxes, scores, m)
    assert exact.max_shape == (m, 3) and not bool(exact.overflowed())
    assert_rows(jaxops.refresh(exact), rows)
    cut = run(boxes, scores, 5)
    assert cut.max_shape == (5, 3)
    assert bool(cut.overflowed()) and int(cut.lost()) == 3 * (m - 5)
    assert cut.true_shape.tolist() == [m, 3]
    # the 5 best scores over all images survive, still in batch/class/score order
    row_scores = [scores[b, c, k] for b, c, k in rows]
    best = sorted(range(m), key=lambda r: (-row_scores[r], r))[:5]
    kept = jaxops.refresh(cut, allow_truncated=True)
    assert_rows(kept, [rows[r] for r in sorted(best)])
    assert_rows(kept, ref_non_max_suppression(boxes, scores, 4, 0.5, size=5))
    uncapped = jaxops.non_max_suppression(boxes, scores, 4, 0.5)
    assert uncapped.max_shape == (8 * 4, 3) and not bool(uncapped.overflowed())


@pytest.mark.parametrize("shape", [(1, 0, 1), (0, 5, 2), (2, 5, 0)])  # (B, N, C)
def test_empty_inputs(shape):
    b, n, c = shape
    out = jaxops.non_max_suppression(np.zeros((b, n, 4), F32), np.zeros((b, c, n), F32), 10, 0.5)
    assert out.max_shape == (0, 3)
    assert jaxops.refresh(out).shape == (0, 3)


def test_none_selected():
    boxes, scores, _ = _edge_images()
    above = jaxops.non_max_suppression(boxes, scores, 4, 0.5, score_threshold=0.95)
    assert jaxops.refresh(above).shape == (0, 3)
    nan = jaxops.non_max_suppression(boxes, np.full_like(scores, np.nan), 4, 0.5)
    assert jaxops.refresh(nan).shape == (0, 3)
    assert_rows(np.asarray(nan.data), np.full((32, 3), -1))


def test_center_encoding_equals_corners_and_low_precision_inputs():
    rng = np.random.default_rng(3)
    corners = random_boxes(rng, (3, 30), grid=0.25)  # halves exact in float32
    center = np.concatenate([(corners[..., :2] + corners[..., 2:]) / 2,
                             corners[..., 2:] - corners[..., :2]], -1)
    scores = random_scores(rng, (3, 2, 30))
    want = jaxops.refresh(jaxops.non_max_suppression(corners, scores, 30, 0.4))
    got = jaxops.refresh(jaxops.non_max_suppression(center, scores, 30, 0.4, center_point_box=1))
    assert_rows(got, want)
    half = jaxops.non_max_suppression(corners.astype(np.float16), scores.astype(jnp.bfloat16),
                                      30, 0.4)
    assert_rows(jaxops.refresh(half), ref_non_max_suppression(
        corners.astype(np.float16), scores.astype(jnp.bfloat16).astype(F32), 30, 0.4))


def test_x64_gives_int64_rows():
    boxes, scores, rows = _edge_images()
    with jax.enable_x64(True):
        out = jaxops.non_max_suppression(boxes, scores, 4, 0.5)
        assert out.dtype == jnp.int64
        assert jaxops.get_op("NonMaxSuppression").infer([boxes, scores], dict(
            max_output_boxes_per_class=4, iou_threshold=0.5))[0].dtype.name == "INT64"
        assert_rows(jaxops.refresh(out), rows)
    with jax.enable_x64(False):
        assert jaxops.non_max_suppression(boxes, scores, 4, 0.5).dtype == jnp.int32


def test_impl_modes_differ_only_in_score_ranking():
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 1, 1.05]]], F32)        # IoU 0.95
    scores = np.array([[[0.5, np.nextafter(F32(0.5), F32(1))]]], F32)  # box 1 is 1 ulp higher
    assert_rows(jaxops.refresh(jaxops.non_max_suppression(boxes, scores, 2, 0.5)), [[0, 0, 1]])
    fast = jaxops.non_max_suppression(boxes, scores, 2, 0.5, impl_mode="high_performance")
    assert_rows(jaxops.refresh(fast), [[0, 0, 0]])  # equal leading bits: lower index wins
    with jaxops.impl_mode("high_performance"):
        assert_rows(jaxops.refresh(jaxops.nms(boxes[0], scores[0, 0], 0.5)), [0])
    assert jaxops.get_op("EfficientNMS").select_mode("high_performance") \
        == OpImplMode.HIGH_PRECISION  # no fast variant: falls back


# -- errors ---------------------------------------------------------------------------------

B4, S4 = np.zeros((1, 3, 4), F32), np.zeros((1, 2, 3), F32)


@pytest.mark.parametrize("call,op,arg", [
    (lambda: jaxops.non_max_suppression(np.zeros((1, 3, 5), F32), S4, 3), "NonMaxSuppression", "boxes"),
    (lambda: jaxops.non_max_suppression(B4, np.zeros((1, 2, 4), F32), 3), "NonMaxSuppression", "scores"),
    (lambda: jaxops.non_max_suppression(B4, S4, -1), "NonMaxSuppression", "max_output_boxes_per_class"),
    (lambda: jaxops.non_max_suppression(B4, S4, 3, 1.5), "NonMaxSuppression", "iou_threshold"),
    (lambda: jaxops.non_max_suppression(B4, S4, 3, 0.5, np.nan), "NonMaxSuppression", "score_threshold"),
    (lambda: jaxops.non_max_suppression(B4, S4, 3, center_point_box=2), "NonMaxSuppression", "center_point_box"),
    (lambda: jaxops.non_max_suppression(B4, S4, 3, size=-2), "NonMaxSuppression", "size"),
    (lambda: jaxops.nms(np.zeros((3, 5), F32), np.zeros(3, F32), 0.5), "nms", "boxes"),
    (lambda: jaxops.nms(np.zeros((3, 4), F32), np.zeros(4, F32), 0.5), "nms", "scores"),
    (lambda: jaxops.nms(np.zeros((3, 4), F32), np.zeros(3, F32), 0.5, max_output_size=-1), "nms", "max_output_size"),
    (lambda: jaxops.batched_nms(np.zeros((3, 4), F32), np.zeros(3, F32), np.zeros(2, np.int32), 0.5), "batched_nms", "idxs"),
    (lambda: jaxops.efficient_nms(np.zeros((1, 3, 5), F32), np.zeros((1, 3, 2), F32), max_output_boxes=2, iou_threshold=0.5, score_threshold=0.1), "EfficientNMS", "boxes"),
    (lambda: jaxops.efficient_nms(np.zeros((1, 3, 4), F32), np.zeros((1, 3, 2), F32), max_output_boxes=2, iou_threshold=0.5, score_threshold=0.1, box_coding=2), "EfficientNMS", "box_coding"),
])
def test_bad_arguments_name_operator_and_argument(call, op, arg):
    with pytest.raises(OpArgumentError) as err:
        call()
    assert err.value.op == op and err.value.arg == arg
    assert f"{op}: argument '{arg}': expected" in str(err.value)


def test_bad_dtypes():
    with pytest.raises(OpDTypeError, match="NonMaxSuppression: argument 'boxes'"):
        jaxops.non_max_suppression(np.zeros((1, 3, 4), np.int32), S4, 3)
    with pytest.raises(OpDTypeError, match="BatchedNMS: argument 'idxs'"):
        jaxops.batched_nms(np.zeros((3, 4), F32), np.zeros(3, F32), np.zeros(3, F32), 0.5)
    with pytest.raises(OpDTypeError, match=r"nms: argument 'boxes': expected a float array.*"
                                           r"got int(32|64)"):
        jaxops.nms([[0, 0, 1, 1]], [0.9], 0.5)  # Python ints: torchvision refuses them too


# -- torchvision-style nms / batched_nms ----------------------------------------------------

@pytest.mark.parametrize("iou,max_output_size,score_threshold", [
    (0.5, None, None), (0.3, 7, 0.4)])
def test_nms_matches_torchvision_algorithm(iou, max_output_size, score_threshold):
    rng = np.random.default_rng(int(iou * 10))
    boxes = random_boxes(rng, (16, 40), flip=True)
    scores = random_scores(rng, (16, 40), levels=10)
    scores[:, ::9] = np.nan
    run = jax.jit(jax.vmap(functools.partial(jaxops.nms, iou_threshold=iou,
                                             max_output_size=max_output_size,
                                             score_threshold=score_threshold)))
    got = jaxops.refresh(run(boxes, scores))
    for p in range(16):
        assert_rows(got[p], ref_nms(boxes[p], scores[p], iou, max_output_size, score_threshold))


def test_nms_empty_and_all_kept():
    assert jaxops.refresh(jaxops.nms(np.zeros((0, 4), F32), np.zeros(0, F32), 0.5)).shape == (0,)
    boxes = np.array([[0, 0, 1, 1], [2, 2, 3, 3], [0, 0, 1, 1]], F32)
    assert_rows(jaxops.refresh(jaxops.nms(boxes, np.array([0.1, 0.3, 0.2], F32), 1.0)), [1, 2, 0])


def test_batched_nms_matches_per_class_torchvision():
    rng = np.random.default_rng(7)
    boxes = random_boxes(rng, (12, 36))
    scores = random_scores(rng, (12, 36), levels=12)
    idxs = rng.choice(np.array([-3, 0, 7, 1000]), (12, 36))  # any integer ids
    run = jax.jit(jax.vmap(functools.partial(jaxops.batched_nms, iou_threshold=0.4)))
    got = jaxops.refresh(run(boxes, scores, idxs))
    for p in range(12):
        assert_rows(got[p], ref_batched_nms(boxes[p], scores[p], idxs[p], 0.4))


def test_batched_nms_classes_do_not_suppress_each_other():
    boxes = np.array([[0, 0, 2, 2]] * 3, F32)
    kept = jaxops.batched_nms(boxes, np.array([0.5, 0.9, 0.7], F32), np.array([1, 1, 2]), 0.5)
    assert_rows(jaxops.refresh(kept), [1, 2])


# -- efficient_nms --------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [  # the op matrix adds per-class boxes, centre coding
    dict(class_agnostic=False, box_coding=0),
    dict(class_agnostic=True, box_coding=1, pre_nms_top_k=12),
])
def test_efficient_nms_matches_tensorrt_algorithm(attrs):
    attrs = dict(attrs)
    per_class = attrs.pop("per_class_boxes", False)
    rng = np.random.default_rng(len(attrs) + per_class)
    boxes = random_boxes(rng, (4, 15, 3) if per_class else (4, 15),
                         center=attrs["box_coding"] == 1)
    scores = random_scores(rng, (4, 15, 3), levels=20)
    scores[0, 3] = np.nan
    kw = dict(max_output_boxes=10, iou_threshold=0.45, score_threshold=0.25, **attrs)
    got = jaxops.efficient_nms(boxes, scores, **kw)
    want = ref_efficient_nms(boxes, scores, **kw)
    chex.assert_trees_all_equal(tuple(np.asarray(x) for x in got), tuple(want))
    assert int(want.num_detections.min()) > 0


def test_efficient_nms_tensorrt_edge_semantics():
    disjoint = np.array([[[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5]]], F32)
    scores = np.array([[[0.9], [0.5], [0.7]]], F32)
    # IoU >= 0 holds for every pair: a zero threshold keeps one box per class.
    zero = jaxops.efficient_nms(disjoint, scores, max_output_boxes=3, iou_threshold=0.0,
                                score_threshold=0.0)
    assert zero.num_detections.tolist() == [[1]] and zero.detection_boxes[0, 1].tolist() == [0] * 4
    # Image 0: scores equal to the threshold are candidates (>=), below it and NaN are not.
    # Image 1: IoU exactly at the threshold suppresses (>=).
    boxes = np.concatenate([disjoint, [[[0, 0, 2, 2], [0, 0, 2, 1], [9, 9, 9.5, 9.5]]]])
    out = jaxops.efficient_nms(boxes, np.array([[[0.5], [np.nan], [0.4]], [[0.9], [0.8], [0.1]]],
                                               F32),
                               max_output_boxes=3, iou_threshold=0.5, score_threshold=0.5)
    assert out.num_detections.tolist() == [[1], [1]]
    assert out.detection_scores[0].tolist() == [0.5, 0, 0]
    assert out.detection_boxes[1, 0].tolist() == [0, 0, 2, 2]
    # No output slots, no boxes.
    none = jaxops.efficient_nms(disjoint, scores, max_output_boxes=0, iou_threshold=0.5,
                                score_threshold=0.1)
    assert none.detection_boxes.shape == (1, 0, 4) and none.num_detections.tolist() == [[0]]
    empty = jaxops.efficient_nms(np.zeros((2, 0, 4), F32), np.zeros((2, 0, 3), F32),
                                 max_output_boxes=4, iou_threshold=0.5, score_threshold=0.1)
    assert empty.num_detections.tolist() == [[0], [0]] and empty.detection_scores.shape == (2, 4)


def test_reference_orders_ties_by_index():
    # The references' own tie rule, which the comparisons above rely on.
    assert by_score(np.array([0.5, 0.7, 0.5, -0.0, 0.0], F32), range(5)) == [1, 0, 2, 3, 4]
