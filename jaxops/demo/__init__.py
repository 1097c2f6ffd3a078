"""``jaxops demo``: the main job, on embedded synthetic data (no downloads).

1. a jitted detection post-processing pipeline over a batch of images
   (:mod:`jaxops.demo.detection`);
2. a hash-embedding click model: users and items on one hash table (an
   ``EmbeddingCollection`` with feature-salted keys), rows trained by AdamW by slot
   (:mod:`jaxops.demo.embedding`);
3. a short summary table.
"""

from __future__ import annotations

import time

__all__ = [
    "main",
]


def main() -> int:
    from jaxops.demo import detection, embedding

    t0 = time.perf_counter()
    print("== 1. Detection post-processing: decode → score filter → NonMaxSuppression → refresh ==")
    det = detection.run(images=8, verbose=True)
    print()
    print("== 2. Hash-embedding click model: EmbeddingCollection, row AdamW by slot ==")
    print("  user and item ids (random 64-bit, no vocabulary) share one hash table; a click's "
          "logit is user row · item row; each jitted step (table and optimizer state donated) "
          "inserts new ids, and trains the looked-up rows")
    emb = embedding.run(steps=300, verbose=True)
    print()
    print("== 3. Summary ==")
    rows = [
        ("images processed", f"{det['images']}"),
        ("detections kept (all images)", f"{det['kept_total']}"),
        ("NMS output memory: max-shape plan", f"{det['plan_bytes']:,} B"),
        ("NMS output memory: actual", f"{det['actual_bytes']:,} B "
                                      f"({det['actual_bytes'] / max(det['plan_bytes'], 1):.1%} of plan)"),
        ("training steps", f"{emb['steps']}"),
        ("loss first → last epoch", f"{emb['loss_first']:.4f} → {emb['loss_last']:.4f}"),
        ("table occupancy", f"{emb['live']:,} / {emb['bucket_size']:,} slots "
                            f"({emb['live'] / emb['bucket_size']:.1%})"),
        ("rows exported incrementally", f"{emb['exported_total']:,}"),
        ("wall time", f"{time.perf_counter() - t0:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    return 0
