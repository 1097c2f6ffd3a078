"""Golden specs of the data-dependent-shape operators: their input generators.

Shapes are small by default so a case is easy to inspect (``--shape``/``--dtype`` choose
others); values come from the seed, through :mod:`jaxops.golden.generators`
(``--density``, ``--special``). Which kernel contract each case follows is
:mod:`jaxops.golden.contracts`. Nothing here imports JAX (each spec's ``module``,
``jaxops.ops``, registers its operator when the spec is looked up).

>>> import numpy as np
>>> from jaxops.golden.generators import Generation
>>> [x.shape for x in get_spec("NonMaxSuppression").make_inputs(
...     np.random.default_rng(0), {}, (1, 2, 5), np.float32, Generation())]
[(1, 5, 4), (1, 2, 5)]
"""

from __future__ import annotations

import numpy as np

from jaxops.golden.generators import Generation, sprinkle, mask, special_kinds, values
from jaxops.golden.specs import get_spec, golden_case

__all__: list[str] = []  # registers specs; nothing to import from here


def _few(rng: np.random.Generator, shape, dtype, gen: Generation, distinct: int) -> np.ndarray:
    """Values from ``distinct`` choices (so many repeat), zeros at ``1 - density``, then the
    special values."""
    dtype = np.dtype(dtype)
    drawn = rng.integers(0, distinct, shape)
    if dtype.kind == "b":
        x = drawn > 0
    else:  # floats (bfloat16's kind is "V"): quarters, exact in every float dtype
        x = (drawn if dtype.kind in "iu" else drawn / 4).astype(dtype)
    if gen.density is not None:
        x = np.where(mask(rng, shape, gen.density), x, np.zeros((), dtype))
    return sprinkle(np.ascontiguousarray(x), rng, special_kinds(dtype, gen.special))


@golden_case("NonZero", "indices of the non-zero elements of an int32 [4, 5, 6] tensor (30% set)",
             shape=(4, 5, 6), dtype="int32", shape_doc="x, any shape", any_rank=True,
             takes=("density", "special"))
def _nonzero(rng, attrs, shape, dtype, gen):
    return [values(rng, shape, dtype, gen, default_density=0.3)]


@golden_case("Unique", "unique values of 64 int32 from 20 values with first indices, inverse "
             "and counts", shape=(64,), dtype="int32", shape_doc="x, any shape", any_rank=True,
             takes=("density", "special"))
def _unique(rng, attrs, shape, dtype, gen):
    return [_few(rng, shape, dtype, gen, 20)]


@golden_case("UniqueConsecutive", "runs of equal values: 24 runs of 1-3 int32 from 5 values "
             "(about 48 values)", shape=(64,), dtype="int32",
             shape_doc="x [n] holds 3n/8 runs of 1-3 equal values, cut at n values",
             takes=("density", "special"))
def _unique_consecutive(rng, attrs, shape, dtype, gen):
    runs = shape[0] * 3 // 8
    return [np.repeat(_few(rng, (runs,), dtype, gen, 5), rng.integers(1, 4, runs))[:shape[0]]]


@golden_case("MaskedSelect", "float32 [8, 8] elements where a random mask (40%) is set",
             shape=(8, 8), dtype="float32", shape_doc="x and mask, any shape (--density: "
             "the mask's)", any_rank=True, takes=("density", "special"))
def _masked_select(rng, attrs, shape, dtype, gen):
    x = values(rng, shape, dtype, Generation(special=gen.special))
    return [x, mask(rng, shape, 0.4 if gen.density is None else gen.density)]


def _boxes(rng: np.random.Generator, batches: int, n: int) -> np.ndarray:
    """Corner boxes [y1, x1, y2, x2] in a 100×100 image, crowded enough to suppress."""
    centre = rng.uniform(10, 90, (batches, n, 2))
    half = rng.uniform(3, 15, (batches, n, 2))
    return np.concatenate([centre - half, centre + half], axis=-1).astype(np.float32)


def _scores(rng: np.random.Generator, shape, dtype, gen: Generation) -> np.ndarray:
    scores = rng.random(shape).astype(dtype)
    return sprinkle(scores, rng, special_kinds(dtype, gen.special))


@golden_case("NonMaxSuppression", "NMS (aclnnNonMaxSuppression, or ONNX with --contract onnx): "
             "2 batches × 3 classes × 40 crowded boxes",
             default_attrs={"max_output_boxes_per_class": 10, "iou_threshold": 0.5,
                            "score_threshold": 0.1},
             shape=(2, 3, 40), dtype="float32",
             shape_doc="scores [batches, classes, boxes]; boxes follow; dtype of both "
             "(--special: the scores')", takes=("special",))
def _non_max_suppression(rng, attrs, shape, dtype, gen):
    batches, _, n = shape
    return [_boxes(rng, batches, n).astype(dtype), _scores(rng, shape, dtype, gen)]


@golden_case("BatchedNMS", "torchvision batched_nms: 60 boxes in 3 class groups, IoU threshold "
             "0.1 (about 24 suppressed)", default_attrs={"iou_threshold": 0.1},
             shape=(60,), dtype="float32",
             shape_doc="scores [boxes]; boxes and 3 class groups follow; dtype of boxes, "
             "scores (--special: the scores')", takes=("special",))
def _batched_nms(rng, attrs, shape, dtype, gen):
    (n,) = shape
    return [_boxes(rng, 1, n)[0].astype(dtype), _scores(rng, n, dtype, gen),
            rng.integers(0, 3, n).astype(np.int32)]


@golden_case("EfficientNMS", "TensorRT EfficientNMS: 2 images × 40 crowded boxes × 3 classes",
             default_attrs={"max_output_boxes": 16, "iou_threshold": 0.5, "score_threshold": 0.2},
             shape=(2, 40, 3), dtype="float32",
             shape_doc="scores [images, boxes, classes]; boxes follow; dtype of both")
def _efficient_nms(rng, attrs, shape, dtype, gen):
    images, n, _ = shape
    return [_boxes(rng, images, n).astype(dtype), rng.random(shape).astype(dtype)]
