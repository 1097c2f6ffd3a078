"""Golden specs of the data-dependent-shape operators: their input generators.

Shapes are small by default so a case is easy to inspect (``--shape``/``--dtype`` choose
others); values come from the seed.

>>> import numpy as np
>>> [x.shape for x in get_spec("NonMaxSuppression").make_inputs(
...     np.random.default_rng(0), {}, (1, 2, 5), np.float32)]
[(1, 5, 4), (1, 2, 5)]
"""

from __future__ import annotations

import numpy as np

from jaxops.golden.specs import get_spec, golden_case

__all__: list[str] = []  # registers specs; nothing to import from here


def _sparse_ints(rng: np.random.Generator, shape, density: float = 0.3) -> np.ndarray:
    values = rng.integers(1, 10, shape).astype(np.int32)
    return np.where(rng.random(shape) < density, values, 0).astype(np.int32)


def _values(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Normal values in ``dtype``: scaled by 10 for integers (so not all 0 and ±1), their
    sign for bool."""
    values = rng.standard_normal(shape)
    kind = np.dtype(dtype).kind
    if kind == "b":
        return values > 0
    if kind in "iu":
        values = np.abs(values * 10) if kind == "u" else values * 10
    return values.astype(dtype)


def _boxes(rng: np.random.Generator, batches: int, n: int) -> np.ndarray:
    """Corner boxes [y1, x1, y2, x2] in a 100×100 image, crowded enough to suppress."""
    centre = rng.uniform(10, 90, (batches, n, 2))
    half = rng.uniform(3, 15, (batches, n, 2))
    return np.concatenate([centre - half, centre + half], axis=-1).astype(np.float32)


@golden_case("NonZero", "indices of the non-zero elements of an int32 [4, 5, 6] tensor (30% set)",
             shape=(4, 5, 6), dtype="int32", shape_doc="x, any shape", any_rank=True)
def _nonzero(rng, attrs, shape, dtype):
    return [_sparse_ints(rng, shape).astype(dtype)]


@golden_case("Unique", "unique values of 64 int32 in [0, 20) with first indices, inverse and counts",
             shape=(64,), dtype="int32", shape_doc="x, any shape", any_rank=True)
def _unique(rng, attrs, shape, dtype):
    return [rng.integers(0, 20, shape).astype(dtype)]


@golden_case("UniqueConsecutive", "runs of equal values: 24 runs of 1-3 int32 from 5 values "
             "(about 48 values)", shape=(64,), dtype="int32",
             shape_doc="x [n] holds 3n/8 runs of 1-3 equal values, cut at n values")
def _unique_consecutive(rng, attrs, shape, dtype):
    runs = shape[0] * 3 // 8
    return [np.repeat(rng.integers(0, 5, runs), rng.integers(1, 4, runs))[:shape[0]].astype(dtype)]


@golden_case("MaskedSelect", "float32 [8, 8] elements where a random mask (40%) is set",
             shape=(8, 8), dtype="float32", shape_doc="x and mask, any shape", any_rank=True)
def _masked_select(rng, attrs, shape, dtype):
    return [_values(rng, shape, dtype), rng.random(shape) < 0.4]


@golden_case("NonMaxSuppression", "ONNX NMS: 2 batches × 3 classes × 40 crowded boxes",
             default_attrs={"max_output_boxes_per_class": 10, "iou_threshold": 0.5,
                            "score_threshold": 0.1},
             shape=(2, 3, 40), dtype="float32",
             shape_doc="scores [batches, classes, boxes]; boxes follow; dtype of both")
def _non_max_suppression(rng, attrs, shape, dtype):
    batches, _, n = shape
    return [_boxes(rng, batches, n).astype(dtype), rng.random(shape).astype(dtype)]


@golden_case("BatchedNMS", "torchvision batched_nms: 60 boxes in 3 class groups, IoU threshold "
             "0.1 (about 24 suppressed)", default_attrs={"iou_threshold": 0.1},
             shape=(60,), dtype="float32",
             shape_doc="scores [boxes]; boxes and 3 class groups follow; dtype of boxes, scores")
def _batched_nms(rng, attrs, shape, dtype):
    (n,) = shape
    return [_boxes(rng, 1, n)[0].astype(dtype), rng.random(n).astype(dtype),
            rng.integers(0, 3, n).astype(np.int32)]


@golden_case("EfficientNMS", "TensorRT EfficientNMS: 2 images × 40 crowded boxes × 3 classes",
             default_attrs={"max_output_boxes": 16, "iou_threshold": 0.5, "score_threshold": 0.2},
             shape=(2, 40, 3), dtype="float32",
             shape_doc="scores [images, boxes, classes]; boxes follow; dtype of both")
def _efficient_nms(rng, attrs, shape, dtype):
    images, n, _ = shape
    return [_boxes(rng, images, n).astype(dtype), rng.random(shape).astype(dtype)]
