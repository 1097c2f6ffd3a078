"""Input generators of the golden cases, one per operator (see :mod:`jaxops.golden`).

Shapes are small and fixed so a case is easy to inspect; values come from the seed.
"""

from __future__ import annotations

import numpy as np

from jaxops.golden import GoldenSpec, register_golden


def _sparse_ints(rng: np.random.Generator, shape, density: float = 0.3) -> np.ndarray:
    values = rng.integers(1, 10, shape).astype(np.int32)
    return np.where(rng.random(shape) < density, values, 0).astype(np.int32)


def _boxes(rng: np.random.Generator, batches: int, n: int) -> np.ndarray:
    """Corner boxes [y1, x1, y2, x2] in a 100×100 image, crowded enough to suppress."""
    centre = rng.uniform(10, 90, (batches, n, 2))
    half = rng.uniform(3, 15, (batches, n, 2))
    return np.concatenate([centre - half, centre + half], axis=-1).astype(np.float32)


register_golden(GoldenSpec(
    "NonZero", "indices of the non-zero elements of an int32 [4, 5, 6] tensor (30% set)",
    lambda rng, attrs: [_sparse_ints(rng, (4, 5, 6))]))

register_golden(GoldenSpec(
    "Unique", "unique values of 64 int32 in [0, 20) with first indices, inverse and counts",
    lambda rng, attrs: [rng.integers(0, 20, 64).astype(np.int32)]))

register_golden(GoldenSpec(
    "UniqueConsecutive", "runs of equal values in 64 int32 drawn from a few values",
    lambda rng, attrs: [np.repeat(rng.integers(0, 5, 24), rng.integers(1, 4, 24))[:64].astype(np.int32)]))

register_golden(GoldenSpec(
    "MaskedSelect", "float32 [8, 8] elements where a random mask (40%) is set",
    lambda rng, attrs: [rng.standard_normal((8, 8)).astype(np.float32), rng.random((8, 8)) < 0.4]))

register_golden(GoldenSpec(
    "NonMaxSuppression", "ONNX NMS: 2 batches × 3 classes × 40 crowded boxes",
    lambda rng, attrs: [_boxes(rng, 2, 40), rng.random((2, 3, 40)).astype(np.float32)],
    default_attrs={"max_output_boxes_per_class": 10, "iou_threshold": 0.5, "score_threshold": 0.1}))
