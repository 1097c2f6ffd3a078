"""A jitted detection post-processing pipeline, two ways.

1. ONNX NonMaxSuppression per image under ``jax.vmap``: the output is a batched DynArray;
   one ``jaxops.refresh`` at the end gives each image's exact [M, 3] rows.
2. The same pipeline with TensorRT-style ``efficient_nms``: fixed-size outputs plus a
   ``num_detections`` count port, for consumers that want no dynamic shapes at all.

Both run on the synthetic detector outputs of the demo (``jaxops.demo.detection``).

    python examples/detection_pipeline.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import jaxops
from jaxops.demo.detection import MAX_PER_CLASS, decode, make_anchors, synthetic_outputs


def main(images: int = 6) -> dict:
    anchors = jnp.asarray(make_anchors())
    deltas, logits, objects = synthetic_outputs(images, seed=1)
    deltas, logits = jnp.asarray(deltas), jnp.asarray(logits)

    # 1. DynArray route: vmap over the batch, one refresh at the end.
    @jax.jit
    def onnx_pipeline(deltas, logits):
        def one(d, l):
            boxes = decode(anchors, d)[None]                    # [1, A, 4] corners
            return jaxops.non_max_suppression(boxes, jax.nn.sigmoid(l)[None],
                                              MAX_PER_CLASS, 0.45, 0.5)
        return jax.vmap(one)(deltas, logits)

    rows = jaxops.refresh(onnx_pipeline(deltas, logits))       # list of [M_b, 3] arrays
    print("ONNX NonMaxSuppression + refresh:")
    for b, r in enumerate(rows):
        print(f"  image {b}: {objects[b]} objects, {len(r)} detections, classes {sorted(r[:, 1].tolist())}")

    # 2. Count-port route: EfficientNMS wants boxes [B, N, 4] (x1, y1, x2, y2) and scores
    #    [B, N, C]; our decoded boxes are (y1, x1, y2, x2), which it accepts as well since it
    #    only needs a consistent corner order for IoU.
    @jax.jit
    def trt_pipeline(deltas, logits):
        boxes = jax.vmap(lambda d: decode(anchors, d))(deltas)
        scores = jnp.swapaxes(jax.nn.sigmoid(logits), 1, 2)
        return jaxops.efficient_nms(boxes, scores, max_output_boxes=32, iou_threshold=0.45,
                                    score_threshold=0.5)

    out = trt_pipeline(deltas, logits)
    counts = np.asarray(out.num_detections)[:, 0]
    print("EfficientNMS count ports:")
    for b, n in enumerate(counts):
        print(f"  image {b}: num_detections {n}, top score {float(out.detection_scores[b, 0]):.3f}")
    return {"onnx_counts": [len(r) for r in rows], "trt_counts": counts.tolist(), "objects": objects}


if __name__ == "__main__":
    main()
