"""NonMaxSuppression against ONNX Runtime's CPU kernel (opset 11), on many random problems.

Each configuration is one call with 40 images x 3 classes (120 independent problems), so a
few compilations cover more than a thousand problems: both box encodings, flipped corners,
coordinates on a grid (IoU exactly at the threshold), tied scores, several thresholds and
per-class limits.
"""

import functools

import chex
import numpy as np
import pytest

import jaxops
from tests.cases.nms import random_boxes, random_scores, ref_non_max_suppression

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


@functools.lru_cache(maxsize=None)
def ort_session(center_point_box: int, with_score_threshold: bool):
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


def run_ort(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold=None,
            center_point_box=0):
    feeds = {"boxes": boxes, "scores": scores,
             "max_output_boxes_per_class": np.array([max_output_boxes_per_class], np.int64),
             "iou_threshold": np.array([iou_threshold], np.float32)}
    if score_threshold is not None:
        feeds["score_threshold"] = np.array([score_threshold], np.float32)
    return ort_session(center_point_box, score_threshold is not None).run(None, feeds)[0]


CONFIGS = [
    # center_point_box, flip, grid, iou, score_threshold, max_out, n, score levels
    (0, False, None, 0.5, None, 20, 20, None),
    (0, True, None, 0.3, None, 10, 20, None),
    (0, True, 0.5, 0.5, None, 20, 20, 6),        # exact-threshold IoUs and tied scores
    (0, False, 1.0, 0.0, 0.3, 4, 16, 5),
    (0, True, None, 0.7, 0.5, 100, 24, None),
    (0, False, None, 1.0, None, 20, 20, 4),      # IoU > 1 never: everything kept
    (1, False, None, 0.5, None, 20, 20, None),
    (1, False, 0.5, 0.4, 0.2, 8, 20, 6),
    (1, False, None, 0.0, None, 3, 12, None),
    (1, False, 1.0, 0.6, None, 20, 20, 3),
]


@pytest.mark.parametrize("config", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
def test_matches_onnxruntime(config):
    center, flip, grid, iou, score_thr, max_out, n, levels = config
    rng = np.random.default_rng(hash(config) % 2**32)
    boxes = random_boxes(rng, (40, n), flip=flip, center=center == 1, grid=grid)
    scores = random_scores(rng, (40, 3, n), levels=levels)
    want = run_ort(boxes, scores, max_out, iou, score_thr, center)
    got = jaxops.refresh(jaxops.non_max_suppression(
        boxes, scores, max_out, iou, score_thr, center_point_box=center))
    chex.assert_trees_all_equal(got.astype(np.int64), want)
    # The numpy reference agrees with the oracle too, so it can stand in where ORT cannot.
    chex.assert_trees_all_equal(ref_non_max_suppression(boxes, scores, max_out, iou, score_thr,
                                                        center), want)


def test_zero_max_output_means_no_output_as_in_onnxruntime():
    rng = np.random.default_rng(0)
    boxes, scores = random_boxes(rng, (2, 5)), random_scores(rng, (2, 2, 5))
    assert run_ort(boxes, scores, 0, 0.5).shape == (0, 3)
    out = jaxops.non_max_suppression(boxes, scores, 0, 0.5)
    assert out.max_shape == (0, 3)
    assert jaxops.refresh(out).shape == (0, 3)


def test_high_performance_mode_agrees_on_random_problems():
    # Continuous scores: two of them agreeing in their leading 27 bits is unlikely.
    rng = np.random.default_rng(1)
    boxes = random_boxes(rng, (40, 20), flip=True)
    scores = random_scores(rng, (40, 3, 20))
    want = run_ort(boxes, scores, 20, 0.45)
    got = jaxops.refresh(jaxops.non_max_suppression(boxes, scores, 20, 0.45,
                                                    impl_mode="high_performance"))
    chex.assert_trees_all_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("center_point_box", [0, 1])
def test_many_boxes_over_several_tiles_match_onnxruntime(center_point_box):
    rng = np.random.default_rng(5 + center_point_box)
    boxes = random_boxes(rng, (2, 700), extent=40.0, flip=center_point_box == 0,
                         center=center_point_box == 1)
    scores = random_scores(rng, (2, 2, 700), levels=50)
    want = run_ort(boxes, scores, 400, 0.5, 0.1, center_point_box)
    got = jaxops.refresh(jaxops.non_max_suppression(boxes, scores, 400, 0.5, 0.1,
                                                    center_point_box=center_point_box))
    chex.assert_trees_all_equal(got.astype(np.int64), want)
    assert len(want) > 2 * 128  # more than one tile kept per problem on average
