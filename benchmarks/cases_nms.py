"""NonMaxSuppression beside ONNX Runtime's CPU kernel, on the same inputs in one process.

The target case (issue 4): 1 batch x 1 class x 5000 random boxes, IoU 0.5, every box
allowed (``max_output_boxes_per_class = 5000``), jitted, default xla backend: at most
1.5x onnxruntime. The other rows are informative: the high-performance mode, boxes in
clusters as a detector proposes them, many classes, and an early stop at 100 boxes.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

import jaxops
from benchmarks.common import Result, against, compare
from tests.helpers.cases.nms import clear_low_bits, ort_feeds, ort_session  # the tests' oracle


def uniform_boxes(rng, n: int, extent: float = 1000.0) -> np.ndarray:
    """``[1, n, 4]`` ``[y1, x1, y2, x2]``: centres uniform in the image, sides 10–100."""
    centre = rng.uniform(0, extent, (n, 2))
    half = rng.uniform(10, 100, (n, 2)) / 2
    return np.concatenate([centre - half, centre + half], 1)[None].astype(np.float32)


def clustered_boxes(rng, n: int, extent: float = 1000.0) -> np.ndarray:
    """``[1, n, 4]``: jittered copies of n / 20 object boxes (detector-like proposals)."""
    objects = uniform_boxes(rng, max(n // 20, 1), extent)[0]
    pick = objects[rng.integers(0, len(objects), n)]
    size = pick[:, 2:] - pick[:, :2]
    jitter = 0.1 * np.concatenate([size, size], 1) * rng.standard_normal((n, 4))
    return (pick + jitter)[None].astype(np.float32)


def _case(name: str, boxes: np.ndarray, scores: np.ndarray, max_out: int, iou: float,
          repeats: int, target: float | None = None, mode: str | None = None) -> Result:
    session, feeds = ort_session(), ort_feeds(boxes, scores, max_out, iou)
    fn = jax.jit(functools.partial(jaxops.non_max_suppression, max_output_boxes_per_class=max_out,
                                   iou_threshold=iou, impl_mode=mode))
    dev_boxes, dev_scores = jax.device_put(boxes), jax.device_put(scores)
    oracle = feeds if mode != "high_performance" else {**feeds, "scores": clear_low_bits(scores)}
    # ours is checked against onnxruntime on the scores its mode compares (high_performance
    # drops low mantissa bits); the timed peer always runs on the original scores
    want = session.run(None, oracle)[0]
    return compare(name, lambda: fn(dev_boxes, dev_scores), "onnxruntime NMS",
                   lambda: session.run(None, feeds), target=target, repeats=repeats,
                   note=f"{len(want)} kept", check=against(want))


def run(quick: bool = False) -> list[Result]:
    rng = np.random.default_rng(0)
    n = 1000 if quick else 5000
    repeats = 5 if quick else 31
    boxes, scores = uniform_boxes(rng, n), rng.random((1, 1, n), dtype=np.float32)
    shape = f"1x1x{n}"
    results = [
        _case(f"NonMaxSuppression {shape} IoU0.5", boxes, scores, n, 0.5, repeats, target=1.5),
        _case(f"NonMaxSuppression {shape} IoU0.5 high_perf", boxes, scores, n, 0.5, repeats,
              mode="high_performance"),
    ]
    if not quick:
        clustered = clustered_boxes(rng, n)
        many = rng.random((1, 20, 1000), dtype=np.float32)
        results += [
            _case(f"NonMaxSuppression {shape} clustered", clustered, scores, n, 0.5, repeats),
            _case(f"NonMaxSuppression {shape} max_out=100", boxes, scores, 100, 0.5, repeats),
            _case("NonMaxSuppression 1x20x1000 IoU0.5", boxes[:, :1000], many, 1000, 0.5,
                  repeats),
        ]
    return results
