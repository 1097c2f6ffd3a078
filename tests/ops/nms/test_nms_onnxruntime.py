"""NonMaxSuppression against ONNX Runtime's CPU kernel (opset 11), on many random problems.

Each configuration is one call with 48 images x 3 classes (144 independent problems), so a
few compilations cover more than a thousand problems: both box encodings, flipped corners,
coordinates on a grid (IoU exactly at the threshold), tied scores, several thresholds and
per-class limits.
"""

import chex
import numpy as np
import pytest

import jaxops
from tests.helpers.cases.nms import (clear_low_bits, random_boxes, random_scores,
                                     ref_non_max_suppression, run_ort)
from tests.helpers.util import seed_of

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


CONFIGS = [
    # center_point_box, flip, grid, iou, score_threshold, max_out, n, score levels
    (0, False, None, 0.5, None, 20, 20, None),
    (0, True, 0.5, 0.5, None, 20, 20, 6),        # exact-threshold IoUs and tied scores
    (0, False, 1.0, 0.0, 0.3, 4, 16, 5),
    (0, True, None, 0.7, 0.5, 100, 24, None),
    (0, False, None, 1.0, None, 20, 20, 4),      # IoU > 1 never: everything kept
    (1, False, 0.5, 0.4, 0.2, 8, 20, 6),
    (1, False, None, 0.0, None, 3, 12, None),
    (1, False, 1.0, 0.6, None, 20, 20, 3),
]


@pytest.mark.parametrize("config", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
def test_matches_onnxruntime(config):
    center, flip, grid, iou, score_thr, max_out, n, levels = config
    rng = np.random.default_rng(seed_of(*config))
    boxes = random_boxes(rng, (48, n), flip=flip, center=center == 1, grid=grid)
    scores = random_scores(rng, (48, 3, n), levels=levels)
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
    with pytest.warns(UserWarning, match="max_output_boxes_per_class is 0"):
        out = jaxops.non_max_suppression(boxes, scores, 0, 0.5)
    assert out.max_shape == (0, 3)
    assert jaxops.refresh(out).shape == (0, 3)


def test_high_performance_mode_equals_onnxruntime_on_scores_with_low_bits_cleared():
    rng = np.random.default_rng(1)
    boxes = random_boxes(rng, (4, 600), extent=30.0, flip=True)
    scores = random_scores(rng, (4, 3, 600))        # 10 low bits ignored: ties appear
    want = run_ort(boxes, clear_low_bits(scores), 600, 0.45)
    got = jaxops.refresh(jaxops.non_max_suppression(boxes, scores, 600, 0.45,
                                                    impl_mode="high_performance"))
    chex.assert_trees_all_equal(got.astype(np.int64), want)
    assert not np.array_equal(want, run_ort(boxes, scores, 600, 0.45))  # the mode matters


def test_many_boxes_over_several_tiles_match_onnxruntime():
    rng = np.random.default_rng(5)
    boxes = random_boxes(rng, (2, 700), extent=40.0, flip=True)
    scores = random_scores(rng, (2, 2, 700), levels=50)
    want = run_ort(boxes, scores, 400, 0.5, 0.1)
    got = jaxops.refresh(jaxops.non_max_suppression(boxes, scores, 400, 0.5, 0.1))
    chex.assert_trees_all_equal(got.astype(np.int64), want)
    assert len(want) > 2 * 128  # more than one tile kept per problem on average
