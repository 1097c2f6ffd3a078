"""A jitted detection post-processing pipeline on synthetic network outputs.

decode anchor deltas → sigmoid scores → score filter → ONNX NonMaxSuppression per image
(vmap over the batch) → DynArray outputs → one :func:`jaxops.refresh` at the end.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import jaxops

__all__ = [
    "ANCHORS_PER_CELL", "GRID", "MAX_PER_CLASS", "NUM_CLASSES", "decode", "make_anchors",
    "postprocess", "run", "synthetic_outputs",
]

NUM_CLASSES = 4
GRID = 16            # 16 × 16 anchor centres
ANCHORS_PER_CELL = 3  # three aspect ratios → 768 anchors per image
MAX_PER_CLASS = 20


def make_anchors() -> np.ndarray:
    """Anchors [A, 4] as (cy, cx, h, w) on a 256 × 256 image."""
    c = (np.arange(GRID) + 0.5) * (256 / GRID)
    cy, cx = np.meshgrid(c, c, indexing="ij")
    sizes = [(24, 24), (32, 16), (16, 32)]
    rows = [np.stack([cy, cx, np.full_like(cy, h), np.full_like(cx, w)], -1).reshape(-1, 4)
            for h, w in sizes]
    return np.concatenate(rows).astype(np.float32)


def synthetic_outputs(images: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """What a detector head would emit: box deltas [B, A, 4], class logits [B, C, A], and
    the number of objects placed in each image.

    A few objects per image; the anchors near an object regress (with noise) to its box and
    get confident logits for its class, so each object is a cluster of overlapping
    candidates that NMS must reduce to one detection.
    """
    rng = np.random.default_rng(seed)
    anchors = make_anchors()
    a = anchors.shape[0]
    deltas = rng.normal(0, 0.1, (images, a, 4)).astype(np.float32)
    logits = rng.normal(-4.0, 1.0, (images, NUM_CLASSES, a)).astype(np.float32)
    objects = [int(rng.integers(2, 9)) for _ in range(images)]
    for b in range(images):
        for _ in range(objects[b]):
            centre, size = rng.uniform(30, 226, 2), rng.uniform(30, 70, 2)
            cls = rng.integers(NUM_CLASSES)
            near = np.linalg.norm(anchors[:, :2] - centre, axis=1) < 28
            target = np.concatenate([(centre - anchors[near, :2]) / anchors[near, 2:],
                                     np.log(size / anchors[near, 2:])], axis=1)
            deltas[b, near] = target + rng.normal(0, 0.05, target.shape)
            logits[b, cls, near] = rng.normal(2.5, 1.0, near.sum())
    return deltas, logits, objects


def decode(anchors: jax.Array, deltas: jax.Array) -> jax.Array:
    """SSD-style decoding to corner boxes [y1, x1, y2, x2]."""
    cy = anchors[:, 0] + deltas[:, 0] * anchors[:, 2]
    cx = anchors[:, 1] + deltas[:, 1] * anchors[:, 3]
    h = anchors[:, 2] * jnp.exp(deltas[:, 2])
    w = anchors[:, 3] * jnp.exp(deltas[:, 3])
    return jnp.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=-1)


@functools.partial(jax.jit, static_argnames=("score_threshold", "iou_threshold"))
def postprocess(anchors, deltas, logits, score_threshold: float = 0.5, iou_threshold: float = 0.45):
    """The whole pipeline for a batch, jitted: returns a batched DynArray of [class, box] rows."""
    def one_image(d, l):
        boxes = decode(anchors, d)[None]            # [1, A, 4]
        scores = jax.nn.sigmoid(l)[None]           # [1, C, A]
        return jaxops.non_max_suppression(boxes, scores, MAX_PER_CLASS, iou_threshold,
                                          score_threshold)
    return jax.vmap(one_image)(deltas, logits)


def run(images: int = 8, verbose: bool = True, seed: int = 0) -> dict:
    anchors = jnp.asarray(make_anchors())
    deltas, logits, objects = synthetic_outputs(images, seed)
    selected = postprocess(anchors, jnp.asarray(deltas), jnp.asarray(logits))
    per_image = jaxops.refresh(selected)            # one device→host transfer
    itemsize = selected.data.dtype.itemsize
    plan_rows = selected.max_shape[0]
    kept = [int(rows.shape[0]) for rows in per_image]
    if verbose:
        print(f"  {images} images × {anchors.shape[0]} anchors × {NUM_CLASSES} classes; "
              f"max-shape plan {plan_rows} rows/image ({plan_rows * 3 * itemsize} B)")
        for b, rows in enumerate(per_image):
            classes = np.bincount(rows[:, 1], minlength=NUM_CLASSES) if rows.size else np.zeros(NUM_CLASSES, int)
            print(f"  image {b}: {objects[b]} objects placed, kept {rows.shape[0]:3d} detections "
                  f"(per class {classes.tolist()}), {rows.shape[0] * 3 * itemsize:5d} B of "
                  f"{plan_rows * 3 * itemsize} B planned")
        print("  (detections may outnumber placed objects: where two objects' neighbourhoods "
              "overlap, an anchor keeps the first object's confident class with the second "
              "object's box, a detection NMS does not merge with either cluster; NMS "
              "suppresses each class separately)")
    return {"images": images, "kept": kept, "objects": objects, "kept_total": sum(kept),
            "plan_bytes": images * plan_rows * 3 * itemsize,
            "actual_bytes": sum(kept) * 3 * itemsize}
